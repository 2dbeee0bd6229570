//! Calendar budgets of a resource in force (`budgets:` in a rule file, [`BudgetRule`]): each
//! rule's counts (weir-core's `budget`), what a call takes from them, and the counts as they
//! are kept across restarts ([`SavedCount`]).
//!
//! A budget is decided after every other rule of its resource, so a call another rule refuses
//! takes nothing from it. Its refusals are flow refusals (`RuleKind::Flow`: a 429 with the
//! period's end as `Retry-After`). A soft budget admits past its limit and marks the call
//! ([`crate::engine::Guard::over_budget`]). A threshold reached (80 %, 100 %) is logged once per
//! key and period and counted (`RuleStats::warnings`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use weir_core::budget::{BudgetSpec, CalendarBudget, CountOf, Mode, Taken};
use weir_core::calendar::Period;
use weir_core::clock::WallClock;

use crate::config::{BudgetMode, BudgetRule};
use crate::metrics::RuleStats;
use crate::shared::SharedStore;

/// A budget rule's counts and counters, kept across reloads while its id and periods stay.
pub(crate) struct BudgetState {
    pub(crate) budget: CalendarBudget,
    pub(crate) stats: Arc<RuleStats>,
    pub(crate) wall: Arc<dyn WallClock>,
}

/// A budget rule in force.
pub(crate) struct BudgetInForce {
    pub(crate) config: BudgetRule,
    pub(crate) id: Arc<str>,
    pub(crate) state: Arc<BudgetState>,
}

/// A key's count of one budget rule, as kept across a restart (`weir proxy` writes them to
/// `RULES.budgets.json` beside the rule file).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavedCount {
    /// The rule's id.
    pub rule: String,
    /// The key: a parameter's value, or `""` for all calls together.
    pub key: String,
    /// The start of the period counted (Unix seconds).
    pub period_start: i64,
    /// Units counted in it.
    pub used: u64,
}

impl BudgetInForce {
    /// Compiles `config`, keeping `old`'s counts when it had the same id: as they are when
    /// its periods and limit stay, else moved into the new rule (those of the current period).
    pub(crate) fn compile(
        config: &BudgetRule,
        old: Option<&BudgetInForce>,
        wall: &Arc<dyn WallClock>,
    ) -> Result<Self, String> {
        let calendar = config
            .resets
            .calendar()
            .map_err(|(field, reason)| format!("resets.{field}: {reason}"))?;
        let spec = BudgetSpec {
            limit: config.limit,
            calendar,
            mode: match config.mode {
                BudgetMode::Hard => Mode::Hard,
                BudgetMode::Soft => Mode::Soft,
            },
            warn_permille: config.warn.iter().map(|f| f.0).collect(),
            max_keys: if config.param.is_some() {
                config.max_values
            } else {
                1
            },
        };
        let state = match old {
            Some(o) if o.state.budget.spec() == &spec => o.state.clone(),
            _ => {
                let budget = CalendarBudget::new(spec);
                let stats = old.map(|o| o.state.stats.clone()).unwrap_or_default();
                if let Some(o) = old {
                    let now = wall.unix_nanos();
                    budget.restore(&o.state.budget.saved(now), now);
                }
                Arc::new(BudgetState {
                    budget,
                    stats,
                    wall: wall.clone(),
                })
            }
        };
        Ok(Self {
            config: config.clone(),
            id: Arc::from(config.id.as_str()),
            state,
        })
    }

    /// The key a call is counted under: `""` without `param`; `None` when the call lacks the
    /// parameter (not counted).
    pub(crate) fn key<'c>(&self, params: &[&'c str]) -> Option<&'c str> {
        match self.config.param {
            None => Some(""),
            Some(i) => params.get(i).copied().filter(|v| !v.is_empty()),
        }
    }

    /// Takes `n` units for `key` now, counting and logging what the take reached.
    pub(crate) fn take(&self, key: &str, n: u64) -> Option<Taken> {
        let now = self.state.wall.unix_nanos();
        let taken = self.state.budget.take(key, n, now).ok()?;
        self.record(key, &taken);
        Some(taken)
    }

    /// Takes `n` units for `key` in `store` (`shared: true`); counted on this instance when
    /// the store cannot answer. The take, and whether the store counted it.
    pub(crate) async fn take_shared(
        &self,
        store: &dyn SharedStore,
        key: &str,
        n: u64,
    ) -> Option<(Taken, bool)> {
        let now = self.state.wall.unix_nanos();
        let budget = &self.state.budget;
        let period = budget.period_at(now).ok()?;
        let secs = i64::try_from(now.div_euclid(1_000_000_000)).ok()?;
        let spec = budget.spec();
        let hard = spec.mode == Mode::Hard;
        let of = CountOf {
            rule: &self.config.id,
            key,
            period,
        };
        let answer = store.take_budget(of, secs, n, spec.limit, hard).await;
        let Some((admitted, used)) = answer else {
            return self.take(key, n).map(|t| (t, false));
        };
        let taken = budget.shared_take(admitted, used, n, period, now);
        self.record(key, &taken);
        Some((taken, true))
    }

    /// Counts a call admitted past a soft limit, and logs and counts a threshold reached.
    fn record(&self, key: &str, taken: &Taken) {
        if taken.over {
            self.state.stats.over.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t) = taken.crossed {
            warned(&self.state, &self.id, key, t, taken.used);
        }
    }

    /// How long its current period lasts, for `RateLimit-Policy` (`w=`).
    pub(crate) fn period_length(taken: &Taken) -> Duration {
        Duration::from_secs(u64::try_from(taken.period.end - taken.period.start).unwrap_or(0))
    }
}

/// Logs and counts a threshold reached.
pub(crate) fn warned(state: &BudgetState, id: &str, key: &str, permille: u32, used: u64) {
    state.stats.warnings.fetch_add(1, Ordering::Relaxed);
    let limit = state.budget.spec().limit;
    tracing::warn!(
        rule = id,
        key,
        used,
        limit,
        "budget {id}: {}{key} reached {}% of its limit ({used} of {limit})",
        if key.is_empty() { "" } else { "key " },
        permille / 10
    );
}

impl BudgetState {
    /// Corrects an estimate held in `store` for `key` in `period` to `actual`: in that period
    /// while it lasts, else an excess in the current one.
    pub(crate) fn settle_shared(
        &self,
        store: &dyn SharedStore,
        id: &str,
        key: &str,
        period: Period,
        estimate: u64,
        actual: u64,
    ) {
        let now = self.wall.unix_nanos();
        let Ok(secs) = i64::try_from(now.div_euclid(1_000_000_000)) else {
            return;
        };
        let delta = i64::try_from(i128::from(actual) - i128::from(estimate)).unwrap_or(0);
        let of = |period| CountOf {
            rule: id,
            key,
            period,
        };
        if secs < period.end {
            if delta != 0 {
                store.add_budget(of(period), secs, delta);
            }
        } else if delta > 0 {
            if let Ok(current) = self.budget.spec().calendar.period(secs) {
                store.add_budget(of(current), secs, delta);
            }
        }
    }

    /// Corrects an estimate held for `key` in the period starting `period_start` to `actual`.
    pub(crate) fn settle(
        &self,
        id: &str,
        key: &str,
        period_start: i64,
        estimate: u64,
        actual: u64,
    ) {
        let held = weir_core::budget::Held {
            period_start,
            estimate,
        };
        let now = self.wall.unix_nanos();
        if let Some(t) = self.budget.settle(key, held, actual, now) {
            let used = self.budget.used(key, now).map_or(0, |(u, _)| u);
            warned(self, id, key, t, used);
        }
    }
}
