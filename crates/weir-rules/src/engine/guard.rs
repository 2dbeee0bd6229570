//! What an admitted call holds until it ends ([`Guard`]): permits, breaker calls, the
//! estimates of `cost:` rules and their settlement, the decisions left to a shared store.

use std::sync::Arc;
use std::time::Duration;

use weir_core::breaker::Call;
use weir_core::learned::Quantiles;
use weir_core::stats::Outcome;
use weir_core::{Clock, Decision, MonotonicClock, Nanos, Permit};

use crate::config::CostSources;
use crate::metrics::RuleKind;
use crate::system::SystemPermits;
use weir_core::cost::Held;

use crate::budget::{BudgetInForce, BudgetState};
use crate::shared::{SharedHeld, SharedRule};

use super::call::{verdict, Block};
use super::state::{
    ClusterHandle, Flow, FlowState, HotState, Resource, Shared, StoreHandle, ONE_SECOND,
};

/// A call admitted to a resource. [`Guard::complete`] reports how it ended; dropping it
/// without that releases what it holds and records its response time with no outcome.
#[must_use = "complete the guard with the call's outcome"]
pub struct Guard<C: Clock = MonotonicClock> {
    pub(super) resource: Option<Arc<Resource<C>>>,
    pub(super) inbound: Option<Arc<Shared<C>>>,
    pub(super) permit: Option<Permit>,
    pub(super) call: Option<Call>,
    /// What few calls hold: BBR / adaptive permits, estimates of `cost:` rules (boxed: rare,
    /// and a small guard moves cheaply).
    pub(super) extra: Option<Box<Extra<C>>>,
    /// When the call may proceed (entry time + wait).
    pub(super) start: Nanos,
    pub(super) wait: Nanos,
}

impl<C: Clock> Guard<C> {
    /// A guard holding nothing: a call no rule applies to.
    #[inline]
    pub(super) fn unguarded() -> Self {
        Guard {
            resource: None,
            inbound: None,
            permit: None,
            call: None,
            extra: None,
            start: 0,
            wait: 0,
        }
    }
}

/// What a [`Guard`] holds for a few calls only.
pub(super) struct Extra<C: Clock> {
    pub(super) system: SystemPermits,
    /// Estimates held by rules with `cost:`, to settle.
    pub(super) costs: Vec<CostHold<C>>,
    /// Whom the call's cost is charged to in the resource's heaviest spenders: the value of
    /// its first hot-parameter rule with `cost:`, else its origin.
    pub(super) spender: Option<Box<str>>,
    /// Decisions of `shared: true` rules left to [`Guard::decide_shared`].
    pub(super) asks: Vec<SharedAsk<C>>,
    /// The first soft budget that admitted the call past its limit.
    pub(super) over_budget: Option<Arc<str>>,
    /// Calendar budgets with `shared: true` left to [`Guard::decide_shared`].
    pub(super) budget_asks: Vec<BudgetAsk>,
    /// The resource's learned costs once a `cost:` rule read them (see [`Guard::learned`]).
    pub(super) learned: Option<Option<Quantiles>>,
}

/// A `shared: true` calendar budget's take left to the caller.
pub(super) struct BudgetAsk {
    pub(super) store: Arc<StoreHandle>,
    /// The budget's place in its resource's `budgets`.
    pub(super) index: usize,
    pub(super) key: Box<str>,
    pub(super) n: u64,
}

/// An estimate a `cost:` rule holds for a call.
pub(super) struct CostHold<C: Clock> {
    pub(super) on: CostOn<C>,
    pub(super) held: Held,
    /// The most one call counts for (`cost.max`, else the rule's burst or limit).
    pub(super) cap: u64,
    /// The rule's budget left once the estimate was held.
    pub(super) budget: Budget,
}

/// What a `cost:` rule had left for the key of a call once it held the call's estimate: what
/// a response's `RateLimit` header tells the caller ([`Guard::budget`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The rule's id.
    pub rule: Arc<str>,
    /// Its limit: units per window.
    pub limit: u64,
    /// Its window.
    pub window: Duration,
    /// Units left now.
    pub remaining: u64,
    /// Until the rule is back to its full limit.
    pub reset_after: Duration,
}

/// Where a [`CostHold`] is held.
pub(super) enum CostOn<C: Clock> {
    /// A flow rule counting its calls together.
    Flow(Arc<FlowState<C>>),
    /// A flow rule counting per origin (`origin: other`), by that origin.
    FlowKey(Arc<FlowState<C>>, Box<str>),
    /// A hot-parameter rule, by the call's value.
    Hot(Arc<HotState<C>>, Box<str>),
    /// A cluster flow rule's lease, by its quota resource.
    Leased(Arc<ClusterHandle>, Box<str>),
    /// A `shared: true` rule, in the shared store.
    Shared(Box<SharedCost>),
    /// A calendar budget, by key, in the period it was held in.
    Budget(Box<BudgetCost>),
    /// A `shared: true` calendar budget counted in the shared store.
    SharedBudget(Box<SharedBudgetCost>),
}

/// An estimate a calendar budget holds in the shared store.
pub(super) struct SharedBudgetCost {
    pub(super) store: Arc<StoreHandle>,
    pub(super) state: Arc<BudgetState>,
    pub(super) id: Arc<str>,
    pub(super) key: Box<str>,
    pub(super) period: weir_core::calendar::Period,
}

/// An estimate a calendar budget holds for a call.
pub(super) struct BudgetCost {
    pub(super) state: Arc<BudgetState>,
    pub(super) id: Arc<str>,
    pub(super) key: Box<str>,
    pub(super) period_start: i64,
}

impl Budget {
    /// What rule `rule` (its window `window`) had left once `d` admitted a call.
    pub(super) fn after(rule: &Arc<str>, d: &Decision, window: Duration) -> Self {
        Self {
            rule: rule.clone(),
            limit: d.limit(),
            window,
            remaining: d.remaining(),
            reset_after: d.reset_after(),
        }
    }
}

/// A reservation a shared store holds for a call.
pub(super) struct SharedCost {
    pub(super) store: Arc<StoreHandle>,
    pub(super) rule: Arc<SharedRule>,
    pub(super) key: Box<str>,
    pub(super) held: SharedHeld,
}

/// A `shared: true` rule's decision left to the caller (see [`Guard::decide_shared`]).
pub(super) struct SharedAsk<C: Clock> {
    pub(super) store: Arc<StoreHandle>,
    pub(super) rule: Arc<SharedRule>,
    pub(super) key: Box<str>,
    pub(super) n: u64,
    /// With `cost:`: the most one call counts for.
    pub(super) cap: Option<u64>,
    pub(super) of: SharedOf<C>,
    pub(super) id: Arc<str>,
    pub(super) shadow: bool,
    pub(super) window: Duration,
}

/// Whose counters a shared decision updates.
pub(super) enum SharedOf<C: Clock> {
    Flow(Arc<FlowState<C>>),
    Hot(Arc<HotState<C>>),
}

impl<C: Clock + Clone> CostHold<C> {
    pub(super) fn settle(self, actual: u64, now: Nanos) {
        let actual = actual.min(self.cap);
        match self.on {
            CostOn::Flow(f) => {
                if let Some(s) = &f.single {
                    s.settle_at(self.held, actual, now);
                }
            }
            CostOn::FlowKey(f, key) => {
                if let Some(r) = &f.rate {
                    r.settle_at(&key, self.held, actual, now);
                }
            }
            CostOn::Hot(h, key) => h.rate.settle_at(&key, self.held, actual, now),
            CostOn::Leased(h, resource) => h.0.settle_at(&resource, self.held, actual, now),
            CostOn::Shared(c) => c.store.0.settle(&c.rule, &c.key, c.held, actual),
            CostOn::Budget(b) => {
                b.state
                    .settle(&b.id, &b.key, b.period_start, self.held.estimate, actual)
            }
            CostOn::SharedBudget(b) => b.state.settle_shared(
                &*b.store.0,
                &b.id,
                &b.key,
                b.period,
                self.held.estimate,
                actual,
            ),
        }
    }
}

impl<C: Clock + Clone> Guard<C> {
    /// Settles what the call cost on every rule with `cost:` that admitted it: the estimate
    /// each held is corrected to `actual` (at most the rule's `cost.max`): the rest given back,
    /// an excess charged as a debt. Once; a guard never settled keeps its estimates.
    pub fn settle_cost(&mut self, actual: u64) {
        self.settle_each(|_| actual, true);
    }

    /// Settles a call abandoned before its cost was known (the client went away mid-stream):
    /// each rule with `cost:` charges what bounds one call (its `cost.max`, else its burst or
    /// limit), so leaving early never costs less than finishing; a rule without a bound (a
    /// cluster rule without `max`) keeps the estimate.
    pub fn settle_abandoned(&mut self) {
        // Not a cost anything learns from: nobody knows what the call cost.
        self.settle_each(
            |c| {
                if c.cap == u64::MAX {
                    c.held.estimate
                } else {
                    c.cap
                }
            },
            false,
        );
    }

    /// Settles every held estimate to `actual(hold)` (capped at the hold's `max`), once; with
    /// `known`, the cost is what the call really cost (a learned estimate learns it).
    pub(super) fn settle_each(&mut self, actual: impl Fn(&CostHold<C>) -> u64, known: bool) {
        let Some(extra) = self.extra.as_mut().filter(|e| !e.costs.is_empty()) else {
            return;
        };
        let costs = std::mem::take(&mut extra.costs);
        let spender = extra.spender.take();
        let Some(res) = self.resource.as_ref() else {
            return;
        };
        let now = res.clock.now();
        let (estimate, first) = (costs[0].held.estimate, actual(&costs[0]).min(costs[0].cap));
        for c in costs {
            let a = actual(&c);
            c.settle(a, now);
        }
        res.stats
            .cost(spender.as_deref().unwrap_or(""), estimate, first, known);
        if known && res.learns {
            res.stats.learn(first);
        }
    }

    /// Counts the call, refused, as answered by a fallback on its resource (for a caller that
    /// serves a fallback after the guard's own decision, e.g. a `shared: true` rule's refusal).
    pub fn count_fallback(&self) {
        if let Some(r) = &self.resource {
            r.stats.fallback();
        }
    }

    /// The soft budget that admitted this call past its limit, if one did: a server marks the
    /// response (`weir-budget-exceeded`).
    pub fn over_budget(&self) -> Option<&str> {
        self.extra.as_ref().and_then(|e| e.over_budget.as_deref())
    }

    /// Whether the call holds estimates of `cost:` rules not yet settled.
    pub fn holds_cost(&self) -> bool {
        self.extra.as_ref().is_some_and(|e| !e.costs.is_empty())
    }

    /// The tightest budget among the `cost:` rules that admitted the call (the least left
    /// once its estimate was held); `None` without such rules.
    pub fn budget(&self) -> Option<&Budget> {
        let extra = self.extra.as_ref()?;
        extra
            .costs
            .iter()
            .map(|c| &c.budget)
            .min_by_key(|b| b.remaining)
    }

    /// Where HTTP calls to the resource state their costs (its `cost:` rules'
    /// `estimate_from` / `actual_from`); `None` when they state nothing.
    pub fn cost_sources(&self) -> Option<&CostSources> {
        self.resource.as_ref()?.cost_sources.as_deref()
    }

    #[cold]
    pub(super) fn hold(&mut self, hold: CostHold<C>, spender: Option<&str>) {
        let extra = self.extra_mut();
        if extra.spender.is_none() {
            extra.spender = spender.map(Into::into);
        }
        extra.costs.push(hold);
    }

    /// Records the estimate flow rule `f` (with `cost:`) holds for this call.
    #[cold]
    pub(super) fn hold_flow(
        &mut self,
        f: &Flow<C>,
        key: Option<&str>,
        d: &Decision,
        estimate: u64,
        now: Nanos,
    ) {
        let on = match key {
            None => CostOn::Flow(f.state.clone()),
            Some(k) => CostOn::FlowKey(f.state.clone(), k.into()),
        };
        let window = f.config.window.unwrap_or(ONE_SECOND);
        self.hold_rule(f, on, d, estimate, now, window);
    }

    /// Records the estimate `n` flow rule `f` (with `cost:`, its window `window`) holds on
    /// `on` for this call.
    #[cold]
    pub(super) fn hold_rule(
        &mut self,
        f: &Flow<C>,
        on: CostOn<C>,
        d: &Decision,
        n: u64,
        now: Nanos,
        window: Duration,
    ) {
        let hold = CostHold {
            on,
            held: Held {
                estimate: n,
                taken: now,
            },
            cap: f.cost_cap(),
            budget: Budget::after(&f.id, d, window),
        };
        self.hold(hold, None);
    }

    #[cold]
    pub(super) fn ask_shared(&mut self, ask: SharedAsk<C>) {
        self.extra_mut().asks.push(ask);
    }

    /// Whether `shared: true` rules are still to decide this call: await
    /// [`Guard::decide_shared`] before proceeding.
    #[inline]
    pub fn has_shared(&self) -> bool {
        self.extra
            .as_ref()
            .is_some_and(|e| !e.asks.is_empty() || !e.budget_asks.is_empty())
    }

    /// Decides the call's `shared: true` rules in the shared store, one after another (the
    /// estimates of those with `cost:` held there): `Ok` when all admit; otherwise the block,
    /// with everything the call held — locally and in the store — given back.
    pub async fn decide_shared(&mut self) -> Result<(), Block> {
        let (asks, budget_asks) = match self.extra.as_mut() {
            Some(e) => (
                std::mem::take(&mut e.asks),
                std::mem::take(&mut e.budget_asks),
            ),
            None => return Ok(()),
        };
        for ask in asks {
            let cost = ask.cap.is_some();
            let (d, held) = ask.store.0.acquire(&ask.rule, &ask.key, ask.n, cost).await;
            let (stats, kind) = match &ask.of {
                SharedOf::Flow(f) => (&*f.stats, RuleKind::Flow),
                SharedOf::Hot(h) => (&h.stats, RuleKind::HotParam),
            };
            if let (false, SharedOf::Hot(h)) = (d.allowed(), &ask.of) {
                if let Some(mut top) = h.top.try_lock() {
                    top.record(&ask.key);
                }
            }
            let decided = verdict(d.allowed(), ask.shadow, stats, || Block {
                rule: ask.id.clone(),
                kind,
                retry_after: d.retry_after(),
                rate: Some((d.limit(), ask.window)),
                remaining: Some(d.remaining_lazy()),
            });
            if let Err(block) = decided {
                let now = self.resource.as_ref().map_or(0, |r| r.clock.now());
                self.release_costs(now);
                return Err(block);
            }
            if let (Some(cap), Some(held)) = (ask.cap, held) {
                let spender = match ask.of {
                    SharedOf::Hot(_) => Some(&*ask.key),
                    SharedOf::Flow(_) => None,
                };
                let budget = Budget::after(&ask.id, &d, ask.window);
                let hold = CostHold {
                    on: CostOn::Shared(Box::new(SharedCost {
                        store: ask.store.clone(),
                        rule: ask.rule.clone(),
                        key: ask.key.clone(),
                        held,
                    })),
                    held: Held {
                        estimate: ask.n,
                        taken: 0,
                    },
                    cap,
                    budget,
                };
                self.hold(hold, spender);
            }
        }
        if budget_asks.is_empty() {
            return Ok(());
        }
        let Some(res) = self.resource.clone() else {
            return Ok(());
        };
        for ask in budget_asks {
            let Some(b) = res.budgets.get(ask.index) else {
                continue;
            };
            let Some((t, counted)) = b.take_shared(&*ask.store.0, &ask.key, ask.n).await else {
                continue;
            };
            let store = counted.then(|| ask.store.clone());
            if let Err(block) = self.budget_taken(b, &ask.key, ask.n, &t, store) {
                let now = res.clock.now();
                self.release_costs(now);
                return Err(block);
            }
        }
        Ok(())
    }

    /// Records what budget `b` decided for the call (`key`, `n` units): its block, or its
    /// mark past a soft limit and the estimate it holds (in `store` when counted there).
    pub(super) fn budget_taken(
        &mut self,
        b: &BudgetInForce,
        key: &str,
        n: u64,
        t: &weir_core::budget::Taken,
        store: Option<Arc<StoreHandle>>,
    ) -> Result<(), Block> {
        let d = t.decision;
        let window = BudgetInForce::period_length(t);
        verdict(d.allowed(), false, &b.state.stats, || Block {
            rule: b.id.clone(),
            kind: RuleKind::Flow,
            retry_after: d.retry_after(),
            rate: Some((b.config.limit, window)),
            remaining: Some(d.remaining_lazy()),
        })?;
        if t.over {
            let extra = self.extra_mut();
            extra.over_budget.get_or_insert_with(|| b.id.clone());
        }
        if let (Some(rule), Some(held)) = (&b.config.cost, t.held) {
            let on = match store {
                Some(store) => CostOn::SharedBudget(Box::new(SharedBudgetCost {
                    store,
                    state: b.state.clone(),
                    id: b.id.clone(),
                    key: key.into(),
                    period: t.period,
                })),
                None => CostOn::Budget(Box::new(BudgetCost {
                    state: b.state.clone(),
                    id: b.id.clone(),
                    key: key.into(),
                    period_start: held.period_start,
                })),
            };
            let hold = CostHold {
                on,
                held: Held {
                    estimate: n,
                    taken: 0,
                },
                cap: rule.max.unwrap_or(b.config.limit),
                budget: Budget::after(&b.id, &d, window),
            };
            let spender = b.config.param.map(|_| key);
            self.hold(hold, spender);
        }
        Ok(())
    }

    /// Gives every estimate back at `now`: a later rule blocked the call, which never ran.
    #[inline]
    pub(super) fn release_costs(&mut self, now: Nanos) {
        if let Some(extra) = self.extra.as_mut() {
            for c in std::mem::take(&mut extra.costs) {
                c.settle(0, now);
            }
            extra.spender = None;
        }
    }
}

impl<C: Clock> Guard<C> {
    #[inline]
    pub(super) fn extra_mut(&mut self) -> &mut Extra<C> {
        self.extra.get_or_insert_with(|| {
            Box::new(Extra {
                system: SystemPermits::default(),
                costs: Vec::new(),
                spender: None,
                asks: Vec::new(),
                over_budget: None,
                budget_asks: Vec::new(),
                learned: None,
            })
        })
    }

    /// What `res`'s calls cost lately, for `estimate: learned`: read when a `cost:` rule of the
    /// call first asks, then kept, so every rule holds the same. A rule without `cost:` never
    /// asks: its pass path reads nothing.
    #[inline]
    pub(super) fn learned(&mut self, res: &Resource<C>) -> Option<Quantiles> {
        if !res.learns {
            return None;
        }
        *self
            .extra_mut()
            .learned
            .get_or_insert_with(|| res.stats.learned())
    }

    /// How long the caller must wait before proceeding (paced rules); zero otherwise.
    pub fn wait(&self) -> Duration {
        Duration::from_nanos(self.wait)
    }

    /// The call ended with `outcome` (its response time is measured from the end of the wait).
    pub fn complete(mut self, outcome: Outcome) {
        self.finish(Some(outcome));
    }

    /// Releases what a call blocked after the system rule admitted it holds, recording
    /// nothing: it never ran (a completion with a zero response time would drag BBR's min RT
    /// and the inbound average down).
    #[inline]
    pub(super) fn cancel(&mut self) {
        // Dropping BBR / adaptive permits unreported releases them without a sample.
        self.extra.take();
        self.permit.take();
        self.call.take();
        if let Some(shared) = self.inbound.take() {
            shared.inbound.window.end();
        }
    }

    pub(super) fn finish(&mut self, outcome: Option<Outcome>) {
        let res = self.resource.take();
        let now = match (&res, &self.inbound) {
            (Some(r), _) => r.clock.now(),
            (None, Some(s)) => s.clock.now(),
            (None, None) => return,
        };
        let rt = now.saturating_sub(self.start);
        if let (Some(call), Some((_, b, _))) = (
            self.call.take(),
            res.as_ref().and_then(|r| r.breaker.as_ref()),
        ) {
            match outcome {
                Some(o) => b.breaker.record(call, now, o),
                None => drop(call),
            }
        }
        self.permit.take();
        let mut system = match self.extra.take() {
            Some(extra) => {
                if let (Some(first), Some(r)) = (extra.costs.first(), &res) {
                    // Never settled: each rule keeps its estimate.
                    let e = first.held.estimate;
                    r.stats
                        .cost(extra.spender.as_deref().unwrap_or(""), e, e, false);
                }
                extra.system
            }
            None => SystemPermits::default(),
        };
        if let Some(p) = system.bbr.take() {
            p.finish(now, outcome.unwrap_or(Outcome::Success));
        }
        if let Some(p) = system.adaptive.take() {
            match outcome {
                Some(Outcome::Success) => p.success(now),
                // Cancelled: likely a caller's timeout, a congestion signal.
                None => p.dropped(now),
                // Errors say nothing about capacity: no sample.
                Some(Outcome::Error) => drop(p),
            }
        }
        if let Some(shared) = self.inbound.take() {
            shared.inbound.window.end();
            shared
                .inbound
                .window
                .add_complete(now, rt, outcome.unwrap_or(Outcome::Success));
        }
        if let Some(res) = res {
            res.stats.end(rt, outcome);
        }
    }
}

impl<C: Clock> Drop for Guard<C> {
    fn drop(&mut self) {
        self.finish(None);
    }
}
