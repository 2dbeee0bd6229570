//! Calendar budgets: at most `limit` units per calendar period ([`crate::calendar`]: a day,
//! week or month beginning at a local time in a time zone), one count per key (all calls
//! together, or one per user), reset when the period ends.
//!
//! - **Hard** budgets refuse a call that would pass the limit (retry at the period's end); a
//!   call larger than the limit can never pass ([`Decision::never`]).
//! - **Soft** budgets admit every call and count it; the caller marks what passed the limit.
//! - **Warnings**: each threshold (a fraction of the limit, e.g. 80 % and 100 %) is reported
//!   once per key and period, by the take or settlement that crossed it.
//! - **Costs**: a take holds an estimate ([`Held`]); [`CalendarBudget::settle`] corrects it to
//!   the actual cost in the period it was held in. A call that ends in a later period gives
//!   nothing back (its period's count is gone) and charges its excess to the current period,
//!   so nothing a call used is lost across a reset.
//! - **Memory**: at most `max_keys` keys. A new key past the cap evicts an entry of an ended
//!   period, else the smallest spender among a sample of [`EVICTION_SAMPLE`]: a flood of new
//!   keys evicts keys that spent little before one that spent much, and each eviction is
//!   counted ([`CalendarBudget::evicted`]).
//! - **Restarts**: [`CalendarBudget::saved`] lists the counts of current periods and
//!   [`CalendarBudget::restore`] takes them back; a count of a period that has ended is dropped.
//!
//! One mutex guards the counts: a budget is taken once per call of a costly resource (an LLM
//! call), not per packet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::calendar::{Calendar, OutOfRange, Period};
use crate::Decision;

/// Whether a budget refuses calls past its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Refuse a call that would pass the limit.
    #[default]
    Hard,
    /// Admit every call; report the ones past the limit.
    Soft,
}

/// A budget's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetSpec {
    /// Units per period.
    pub limit: u64,
    /// The periods.
    pub calendar: Calendar,
    /// Hard or soft.
    pub mode: Mode,
    /// Thresholds reported once per key and period, in thousandths of the limit, ascending
    /// (800 and 1000: 80 % and 100 %).
    pub warn_permille: Vec<u32>,
    /// Most keys counted at once (≥ 1).
    pub max_keys: usize,
}

/// Entries looked at to choose one to evict.
pub const EVICTION_SAMPLE: usize = 32;

/// One key's count in one period.
#[derive(Debug, Clone, Copy)]
struct Spend {
    period: Period,
    used: u64,
    /// How many thresholds this period's count has reached.
    warned: u8,
}

/// An estimate a budget holds for a call, to settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The period it was held in (its start).
    pub period_start: i64,
    /// The units held.
    pub estimate: u64,
}

/// What a take decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// Admitted or refused, with the limit, what is left and the period's end as reset.
    pub decision: Decision,
    /// A soft budget admitted the call past its limit.
    pub over: bool,
    /// The highest threshold (thousandths) this take reached first in the period.
    pub crossed: Option<u32>,
    /// What to settle, when admitted.
    pub held: Option<Held>,
    /// The key's count in the period, after the take.
    pub used: u64,
    /// The period.
    pub period: Period,
}

/// Which count a shared store updates: a budget rule's, for one key, in one period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountOf<'a> {
    /// The budget rule's id.
    pub rule: &'a str,
    /// The key ("" for all calls together).
    pub key: &'a str,
    /// The period.
    pub period: Period,
}

/// A key's count, as kept across a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The key ("" for all calls together).
    pub key: String,
    /// The start of the period counted (Unix seconds).
    pub period_start: i64,
    /// Units counted.
    pub used: u64,
}

/// Counts per key and calendar period (see the module's documentation).
#[derive(Debug)]
pub struct CalendarBudget {
    spec: BudgetSpec,
    keys: Mutex<HashMap<Box<str>, Spend, foldhash::fast::RandomState>>,
    evicted: AtomicU64,
    changes: AtomicU64,
}

const NANOS: i128 = 1_000_000_000;

/// Nanoseconds from `now` (Unix nanoseconds) until `end` (Unix seconds), at least 0.
fn until(end: i64, now: i128) -> u64 {
    u64::try_from((i128::from(end) * NANOS - now).max(0)).unwrap_or(u64::MAX)
}

impl CalendarBudget {
    /// A budget with no counts.
    pub fn new(mut spec: BudgetSpec) -> Self {
        spec.max_keys = spec.max_keys.max(1);
        spec.warn_permille.sort_unstable();
        spec.warn_permille.dedup();
        Self {
            spec,
            keys: Mutex::new(HashMap::default()),
            evicted: AtomicU64::new(0),
            changes: AtomicU64::new(0),
        }
    }

    /// Its parameters.
    pub fn spec(&self) -> &BudgetSpec {
        &self.spec
    }

    /// Keys evicted to make room for new ones.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Keys counted now.
    pub fn len(&self) -> usize {
        self.keys.lock().len()
    }

    /// Whether no key is counted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes `n` units for `key` at `now` (Unix nanoseconds).
    pub fn take(&self, key: &str, n: u64, now: i128) -> Result<Taken, OutOfRange> {
        let period = self.period_at(now)?;
        let mut keys = self.keys.lock();
        let used = keys
            .get(key)
            .filter(|s| s.period == period)
            .map_or(0, |s| s.used);
        let after = used.saturating_add(n);
        if self.spec.mode == Mode::Hard && after > self.spec.limit {
            return Ok(self.answer(None, used, n, period, now));
        }
        let spend = self.entry(&mut keys, key, period, now);
        spend.used = after;
        let crossed = self.crossed(spend);
        self.changes.fetch_add(1, Ordering::Relaxed);
        Ok(self.answer(Some(crossed), after, n, period, now))
    }

    /// What a count kept elsewhere (a store every instance shares) decided for a take of `n`
    /// units in `period`: admitted with the count `used` after it, or refused with the count
    /// `used` before it. A threshold is reported by the take that moved the count across it,
    /// so once over all instances.
    pub fn shared_take(
        &self,
        admitted: bool,
        used: u64,
        n: u64,
        period: Period,
        now: i128,
    ) -> Taken {
        let crossed = admitted.then(|| {
            let before = self.level(used.saturating_sub(n));
            let after = self.level(used);
            (after > before)
                .then(|| self.spec.warn_permille.get(usize::from(after) - 1).copied())
                .flatten()
        });
        self.answer(crossed, used, n, period, now)
    }

    /// The answer to a take of `n` in `period`: admitted (`Some(threshold crossed)`) with the
    /// count `used` after it, or refused (`None`) with the count before it.
    fn answer(
        &self,
        admitted: Option<Option<u32>>,
        used: u64,
        n: u64,
        period: Period,
        now: i128,
    ) -> Taken {
        let limit = self.spec.limit;
        let reset = until(period.end, now);
        let left = limit.saturating_sub(used);
        match admitted {
            Some(crossed) => Taken {
                decision: Decision::allow(limit, left, reset, 0),
                over: used > limit,
                crossed,
                held: Some(Held {
                    period_start: period.start,
                    estimate: n,
                }),
                used,
                period,
            },
            None => Taken {
                decision: if n > limit {
                    Decision::never(limit, left, reset)
                } else {
                    Decision::deny(limit, left, reset, reset)
                },
                over: false,
                crossed: None,
                held: None,
                used,
                period,
            },
        }
    }

    /// Takes, settlements and restores so far: what changed since a count was last saved.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// Corrects `held` to `actual` at `now`: in the period it was held in, the count becomes
    /// what the call used (never below 0); in a later period, an excess over the estimate is
    /// counted in the current period. Answers a threshold this reached first, if any.
    pub fn settle(&self, key: &str, held: Held, actual: u64, now: i128) -> Option<u32> {
        let period = self.period_at(now).ok()?;
        let mut keys = self.keys.lock();
        self.changes.fetch_add(1, Ordering::Relaxed);
        if held.period_start == period.start {
            let spend = self.entry(&mut keys, key, period, now);
            spend.used = spend
                .used
                .saturating_sub(held.estimate)
                .saturating_add(actual);
            return self.crossed(spend);
        }
        let excess = actual.saturating_sub(held.estimate);
        if excess == 0 {
            return None;
        }
        let spend = self.entry(&mut keys, key, period, now);
        spend.used = spend.used.saturating_add(excess);
        self.crossed(spend)
    }

    /// The count of `key` in the period of `now`.
    pub fn used(&self, key: &str, now: i128) -> Result<(u64, Period), OutOfRange> {
        let period = self.period_at(now)?;
        let used = self
            .keys
            .lock()
            .get(key)
            .filter(|s| s.period == period)
            .map_or(0, |s| s.used);
        Ok((used, period))
    }

    /// The counts of the period of `now` (those of ended periods are left out).
    pub fn saved(&self, now: i128) -> Vec<Saved> {
        let Ok(period) = self.period_at(now) else {
            return Vec::new();
        };
        self.keys
            .lock()
            .iter()
            .filter(|(_, s)| s.period == period && s.used > 0)
            .map(|(k, s)| Saved {
                key: k.to_string(),
                period_start: s.period.start,
                used: s.used,
            })
            .collect()
    }

    /// Takes back counts saved before a restart: those of the period of `now` are added to
    /// what is counted (a count of an ended period is dropped); at most `max_keys` keys.
    /// Answers how many were taken.
    pub fn restore(&self, saved: &[Saved], now: i128) -> usize {
        let Ok(period) = self.period_at(now) else {
            return 0;
        };
        let mut keys = self.keys.lock();
        let mut taken = 0;
        for s in saved.iter().filter(|s| s.period_start == period.start) {
            if keys.len() >= self.spec.max_keys && !keys.contains_key(s.key.as_str()) {
                continue;
            }
            let spend = self.entry(&mut keys, &s.key, period, now);
            spend.used = spend.used.saturating_add(s.used);
            // Thresholds already passed were reported before the restart.
            spend.warned = self.level(spend.used);
            taken += 1;
        }
        self.changes.fetch_add(1, Ordering::Relaxed);
        taken
    }

    /// The period of `now` (Unix nanoseconds).
    pub fn period_at(&self, now: i128) -> Result<Period, OutOfRange> {
        let secs = i64::try_from(now.div_euclid(NANOS)).map_err(|_| OutOfRange(i64::MAX))?;
        self.spec.calendar.period(secs)
    }

    /// The entry of `key` for `period`, made (or reset from an ended period) if needed.
    fn entry<'m>(
        &self,
        keys: &'m mut HashMap<Box<str>, Spend, foldhash::fast::RandomState>,
        key: &str,
        period: Period,
        now: i128,
    ) -> &'m mut Spend {
        if !keys.contains_key(key) && keys.len() >= self.spec.max_keys {
            self.evict(keys, now);
        }
        let fresh = Spend {
            period,
            used: 0,
            warned: 0,
        };
        let spend = keys.entry(key.into()).or_insert(fresh);
        if spend.period != period {
            *spend = fresh;
        }
        spend
    }

    /// Makes room for one key: an entry of an ended period, else the smallest spender of a
    /// sample.
    fn evict(&self, keys: &mut HashMap<Box<str>, Spend, foldhash::fast::RandomState>, now: i128) {
        let secs = now.div_euclid(NANOS);
        let mut victim: Option<(&Box<str>, u64)> = None;
        for (k, s) in keys.iter().take(EVICTION_SAMPLE) {
            if i128::from(s.period.end) <= secs {
                victim = Some((k, 0));
                break;
            }
            if victim.is_none_or(|(_, used)| s.used < used) {
                victim = Some((k, s.used));
            }
        }
        if let Some((k, _)) = victim {
            let k = k.clone();
            keys.remove(&k);
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Thresholds `used` reaches.
    fn level(&self, used: u64) -> u8 {
        let reached = self
            .spec
            .warn_permille
            .iter()
            .take_while(|t| {
                u128::from(used) * 1000 >= u128::from(**t) * u128::from(self.spec.limit)
            })
            .count();
        u8::try_from(reached).unwrap_or(u8::MAX)
    }

    /// The highest threshold `spend` reached that it had not before (and records it).
    fn crossed(&self, spend: &mut Spend) -> Option<u32> {
        let level = self.level(spend.used);
        if level <= spend.warned {
            return None;
        }
        spend.warned = level;
        self.spec.warn_permille.get(usize::from(level) - 1).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calendar::Every;
    use jiff::civil::Time;
    use jiff::tz::TimeZone;

    fn at(s: &str) -> i128 {
        s.parse::<jiff::Timestamp>().unwrap().as_nanosecond()
    }

    fn budget(limit: u64, mode: Mode, max_keys: usize) -> CalendarBudget {
        CalendarBudget::new(BudgetSpec {
            limit,
            calendar: Calendar::new(Every::Month, Time::midnight(), TimeZone::UTC),
            mode,
            warn_permille: vec![1000, 800],
            max_keys,
        })
    }

    #[test]
    fn a_hard_budget_refuses_until_the_month_ends_then_starts_again() {
        let b = budget(1_000, Mode::Hard, 10);
        let t = at("2026-11-30T23:00:00Z");
        let first = b.take("ann", 700, t).unwrap();
        assert!(first.decision.allowed());
        assert_eq!(first.decision.remaining(), 300);
        assert_eq!(first.decision.reset_after().as_secs(), 3_600);
        let refused = b.take("ann", 400, t).unwrap();
        assert!(!refused.decision.allowed());
        assert_eq!(refused.decision.retry_after().unwrap().as_secs(), 3_600);
        assert_eq!(refused.decision.remaining(), 300);
        // Another key has its own count; a call larger than the limit never fits.
        assert!(b.take("bob", 1_000, t).unwrap().decision.allowed());
        assert!(b.take("bob", 1_001, t).unwrap().decision.is_never());
        // December: a fresh count.
        let dec = b.take("ann", 400, at("2026-12-01T00:00:00Z")).unwrap();
        assert!(dec.decision.allowed());
        assert_eq!(dec.used, 400);
    }

    #[test]
    fn soft_budgets_admit_and_report_thresholds_once() {
        let b = budget(1_000, Mode::Soft, 10);
        let t = at("2026-11-10T00:00:00Z");
        let a = b.take("ann", 799, t).unwrap();
        assert_eq!((a.over, a.crossed), (false, None));
        let a = b.take("ann", 1, t).unwrap();
        assert_eq!((a.over, a.crossed), (false, Some(800)));
        let a = b.take("ann", 500, t).unwrap();
        assert!(a.decision.allowed());
        assert_eq!((a.over, a.crossed, a.used), (true, Some(1000), 1_300));
        assert_eq!(b.take("ann", 1, t).unwrap().crossed, None);
        // A settlement can cross one too; a refund below it does not report it again.
        let h = b.take("bob", 100, t).unwrap().held.unwrap();
        assert_eq!(b.settle("bob", h, 900, t), Some(800));
        let h = b.take("bob", 50, t).unwrap().held.unwrap();
        assert_eq!(b.settle("bob", h, 0, t), None);
        assert_eq!(b.used("bob", t).unwrap().0, 900);
    }

    #[test]
    fn a_shared_count_is_answered_as_a_local_one() {
        let b = budget(1_000, Mode::Hard, 10);
        let t = at("2026-11-30T23:00:00Z");
        let p = b.period_at(t).unwrap();
        // Another instance's takes moved the count from 700 to 850: 80 % crossed by this one.
        let a = b.shared_take(true, 850, 150, p, t);
        assert!(a.decision.allowed());
        assert_eq!(
            (a.crossed, a.decision.remaining(), a.held.unwrap().estimate),
            (Some(800), 150, 150)
        );
        assert_eq!(a.decision.reset_after().as_secs(), 3_600);
        assert_eq!(b.shared_take(true, 900, 50, p, t).crossed, None);
        let r = b.shared_take(false, 950, 100, p, t);
        assert_eq!(
            (r.decision.allowed(), r.decision.remaining(), r.held),
            (false, 50, None)
        );
        assert!(b.shared_take(false, 0, 1_001, p, t).decision.is_never());
        let changes = b.changes();
        b.take("ann", 1, t).unwrap();
        assert_eq!(b.changes(), changes + 1);
    }

    #[test]
    fn settlements_count_in_the_period_the_call_was_held_in() {
        let b = budget(1_000, Mode::Hard, 10);
        let nov = at("2026-11-30T23:59:00Z");
        let dec = at("2026-12-01T00:01:00Z");
        // Held in November, used less, ends in November: the rest comes back.
        let h = b.take("ann", 500, nov).unwrap().held.unwrap();
        b.settle("ann", h, 100, nov);
        assert_eq!(b.used("ann", nov).unwrap().0, 100);
        // Held in November, ends in December using more: the excess counts in December,
        // a refund gives nothing back to December.
        let h = b.take("ann", 500, nov).unwrap().held.unwrap();
        b.settle("ann", h, 800, dec);
        assert_eq!(b.used("ann", dec).unwrap().0, 300);
        let h = b.take("bob", 500, nov).unwrap().held.unwrap();
        b.settle("bob", h, 100, dec);
        assert_eq!(b.used("bob", dec).unwrap().0, 0);
    }

    #[test]
    fn counts_survive_a_restart_within_their_period_only() {
        let b = budget(1_000, Mode::Hard, 10);
        let t = at("2026-11-20T00:00:00Z");
        b.take("ann", 900, t).unwrap();
        b.take("", 10, t).unwrap();
        let saved = b.saved(t);
        assert_eq!(saved.len(), 2);
        let again = budget(1_000, Mode::Hard, 10);
        assert_eq!(again.restore(&saved, t), 2);
        assert!(!again.take("ann", 200, t).unwrap().decision.allowed());
        // The 80 % warning was given before the restart: not again.
        let w = again.take("ann", 100, t).unwrap();
        assert_eq!(w.crossed, Some(1000));
        let later = budget(1_000, Mode::Hard, 10);
        assert_eq!(later.restore(&saved, at("2026-12-01T00:00:00Z")), 0);
    }

    #[test]
    fn a_flood_of_new_keys_evicts_small_spenders_first_and_stays_bounded() {
        let b = budget(1_000_000, Mode::Hard, 100);
        let t = at("2026-11-20T00:00:00Z");
        b.take("big", 900_000, t).unwrap();
        for i in 0..10_000 {
            b.take(&format!("flood-{i}"), 1, t).unwrap();
            assert!(b.len() <= 100);
        }
        assert_eq!(b.used("big", t).unwrap().0, 900_000);
        assert_eq!(b.evicted(), 10_000 - 99);
    }
}
