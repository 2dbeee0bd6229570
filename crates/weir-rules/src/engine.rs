//! Deciding calls to resources under a rule set, and swapping rule sets without losing state.
//!
//! Order of checks (Sentinel's slot order): authority, system (inbound calls only), hot
//! parameters, flow, breaker. A call that passes them all gets a [`Guard`]; completing it
//! reports the outcome (breaker, adaptive limit) and the response time (resource statistics);
//! dropping it releases what it holds and records the response time without an outcome. A
//! paced call gets a guard with a [`Guard::wait`] the caller must wait before proceeding. A
//! blocked call gets a [`Block`] naming the rule, its kind and when to retry. Rules in shadow
//! mode are evaluated and counted, never block. The pass path of a configured resource does
//! not allocate (hot-parameter and `origin: other` rules allocate a key only when the value is
//! new to their table).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use weir_core::adaptive::cpu::CpuSource;
use weir_core::breaker::{Breaker, Call, Transition};
use weir_core::learned::Quantiles;
use weir_core::stats::Outcome;
use weir_core::{
    Clock, ConcurrencyConfig, ConcurrencyLimiter, ConfigError, Criticality, Decision,
    MonotonicClock, Nanos, Permit, QueueOrder, Remaining,
};

use crate::config::{
    Absent, AuthorityRule, Behavior, BreakerRule, CostSources, EstimateFrom, FlowRule,
    HotParamRule, OnFull, RateAlgorithm, RuleSet, DEFAULT_MAX_WAIT, DEFAULT_WARMUP, OTHER_ORIGIN,
};
use crate::keys::KeyShortener;
pub use crate::keys::MAX_KEY_LEN;
pub use crate::metrics::RuleKind;
use crate::metrics::{
    BreakerSnapshot, HeavySnapshot, ResourceStats, RuleSnapshot, RuleStats, Snapshot,
};
use crate::system::{Inbound, Part, System, SystemPermits};
use weir_core::cost::Held;
use weir_core::rate::{KeyedRate, RateSpec, SingleRate};

use crate::budget::{BudgetInForce, BudgetState, SavedCount};
use crate::shared::{SharedHeld, SharedRule, SharedStore};
use weir_core::clock::{SystemWallClock, WallClock};

/// Who calls and with what: the origin (caller), the criticality, the parameters that
/// hot-parameter rules look at, and whether the call comes into this service (system rules
/// apply to inbound calls only).
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The caller's name (`""` when unknown).
    pub origin: &'a str,
    /// The call's criticality.
    pub criticality: Criticality,
    /// Parameters by position (user id, IP, tenant …).
    pub params: &'a [&'a str],
    /// A call into this service (true, the default) or out of it to a dependency (false).
    pub inbound: bool,
    /// What the call says it will cost (its estimate, e.g. an LLM request's `max_tokens`), for
    /// rules with `cost:`; `None`: each rule's own `estimate`.
    pub cost: Option<u64>,
}

impl Default for Context<'_> {
    fn default() -> Self {
        Self {
            origin: "",
            criticality: Criticality::Critical,
            params: &[],
            inbound: true,
            cost: None,
        }
    }
}

/// Why a call was blocked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The rule's id.
    pub rule: Arc<str>,
    /// Its kind.
    pub kind: RuleKind,
    /// When a retry may pass (None: not by waiting, e.g. denied by authority).
    pub retry_after: Option<Duration>,
    /// The rate that was exceeded (units, window), for rate rules: what `RateLimit-Policy`
    /// headers announce.
    pub rate: Option<(u64, Duration)>,
    /// What the rule had left for the call's key, for rate rules (`RateLimit`'s `r=`). With
    /// no `retry_after`, the call asked for more than the rule can ever hold (a cost estimate
    /// above its burst): no wait lets it pass. Divided only when read ([`Remaining::get`]).
    pub remaining: Option<Remaining>,
}

/// Who a flow rule counts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origins {
    /// Every call together.
    All,
    /// Calls from this origin.
    Named(Box<str>),
    /// Calls from origins no other flow rule of the resource names, each counted on its own.
    Other,
}

/// State of a flow rule, shared across reloads while the rule keeps its id and kind.
struct FlowState<C: Clock> {
    /// All calls (or one named origin's) together: one limiter, no key.
    single: Option<SingleRate<C>>,
    /// `origin: other`: a limiter per calling origin.
    rate: Option<KeyedRate<C>>,
    concurrency: Option<ConcurrencyLimiter>,
    /// Shared with the rule's next state when a reload retunes it.
    stats: Arc<RuleStats>,
}

impl<C: Clock> FlowState<C> {
    fn empty() -> Self {
        Self {
            single: None,
            rate: None,
            concurrency: None,
            stats: Arc::default(),
        }
    }
}

struct Flow<C: Clock> {
    config: FlowRule,
    id: Arc<str>,
    state: Arc<FlowState<C>>,
    origins: Origins,
    /// Relate strategy: the resource whose passes count.
    relate: Option<Arc<ResourceStats>>,
    /// `shared: true`: counted in the shared store when there is one.
    shared: Option<Arc<SharedRule>>,
}

impl<C: Clock> Flow<C> {
    /// The most one call counts for under `cost:`: its `max`, else the burst, else `qps`
    /// (a cluster rule: no bound but `max`).
    fn cost_cap(&self) -> u64 {
        // A cluster rule's lease has its own rate: no cap but `max`.
        let max = match self.config.cluster {
            Some(_) => u64::MAX,
            None => self.config.burst.or(self.config.qps).unwrap_or(1),
        };
        self.config.cost.as_ref().and_then(|c| c.max).unwrap_or(max)
    }
}

/// A hot-parameter rule in force: its configuration, state, id and shared form.
type HotRule<C> = (
    HotParamRule,
    Arc<HotState<C>>,
    Arc<str>,
    Option<Arc<SharedRule>>,
);

struct HotState<C: Clock> {
    rate: KeyedRate<C>,
    stats: RuleStats,
    /// The values it blocked most (recorded on the block path only, skipped when contended).
    top: parking_lot::Mutex<weir_core::TopK>,
}

/// Blocked values kept per hot-parameter rule.
pub const TOP_VALUES: usize = 10;

struct BreakerState {
    breaker: Breaker,
    stats: RuleStats,
}

struct Resource<C: Clock> {
    /// The rules' clock (here so a guard needs no copy of it).
    clock: C,
    stats: Arc<ResourceStats>,
    authority: Option<(AuthorityRule, Arc<str>, Arc<RuleStats>)>,
    /// With its shared form when it says `shared: true`.
    hot: Vec<HotRule<C>>,
    flows: Vec<Flow<C>>,
    /// Origins named by this resource's flow rules (what `other` excludes).
    named_origins: Vec<Box<str>>,
    breaker: Option<(BreakerRule, Arc<BreakerState>, Arc<str>)>,
    switch: Option<Switch>,
    /// Where HTTP calls state their costs, when its `cost:` rules say.
    cost_sources: Option<Arc<CostSources>>,
    /// A `cost:` rule learns its estimate from the resource's recent costs.
    learns: bool,
    /// Calendar budgets, decided after every other rule.
    budgets: Vec<BudgetInForce>,
}

/// A compiled switch: its state is shared by every rule set with the same id, so a run-time
/// change and a reload never race.
struct Switch {
    id: Arc<str>,
    on: Arc<std::sync::atomic::AtomicBool>,
    stats: Arc<RuleStats>,
}

/// Resource names to resources (foldhash: a quarter of SipHash's cost on short names).
type ResourceMap<C> = HashMap<String, Arc<Resource<C>>, foldhash::fast::RandomState>;

struct Compiled<C: Clock> {
    /// A resource's `cost:` rules say where HTTP calls state costs.
    states_costs: bool,
    /// A resource's `cost:` rules read estimates from JSON request bodies.
    reads_json: bool,
    resources: ResourceMap<C>,
    system: Option<System<C>>,
    /// The rule set it was compiled from.
    set: Arc<RuleSet>,
}

/// One resource of a rule set in force, looked up once (see [`Rules::resolve`]).
pub struct Resolved<C: Clock = MonotonicClock> {
    compiled: Arc<Compiled<C>>,
    resource: Option<Arc<Resource<C>>>,
}

impl<C: Clock> Resolved<C> {
    /// Where HTTP calls to the resource state their costs (see [`Guard::cost_sources`]).
    pub fn cost_sources(&self) -> Option<&CostSources> {
        self.resource.as_ref()?.cost_sources.as_deref()
    }

    /// Whether a call's criticality can change its decision here (the system rule, a
    /// concurrency rule): when not, a caller need not read it.
    pub fn reads_criticality(&self) -> bool {
        self.compiled.system.is_some()
            || self
                .resource
                .as_ref()
                .is_some_and(|r| r.flows.iter().any(|f| f.state.concurrency.is_some()))
    }
}

impl<C: Clock> Clone for Resolved<C> {
    fn clone(&self) -> Self {
        Self {
            compiled: self.compiled.clone(),
            resource: self.resource.clone(),
        }
    }
}

impl<C: Clock> std::fmt::Debug for Resolved<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field("has_rules", &self.resource.is_some())
            .finish()
    }
}

/// A call admitted to a resource. [`Guard::complete`] reports how it ended; dropping it
/// without that releases what it holds and records its response time with no outcome.
#[must_use = "complete the guard with the call's outcome"]
pub struct Guard<C: Clock = MonotonicClock> {
    resource: Option<Arc<Resource<C>>>,
    inbound: Option<Arc<Shared<C>>>,
    permit: Option<Permit>,
    call: Option<Call>,
    /// What few calls hold: BBR / adaptive permits, estimates of `cost:` rules (boxed: rare,
    /// and a small guard moves cheaply).
    extra: Option<Box<Extra<C>>>,
    /// When the call may proceed (entry time + wait).
    start: Nanos,
    wait: Nanos,
}

/// What a [`Guard`] holds for a few calls only.
struct Extra<C: Clock> {
    system: SystemPermits,
    /// Estimates held by rules with `cost:`, to settle.
    costs: Vec<CostHold<C>>,
    /// Whom the call's cost is charged to in the resource's heaviest spenders: the value of
    /// its first hot-parameter rule with `cost:`, else its origin.
    spender: Option<Box<str>>,
    /// Decisions of `shared: true` rules left to [`Guard::decide_shared`].
    asks: Vec<SharedAsk<C>>,
    /// The first soft budget that admitted the call past its limit.
    over_budget: Option<Arc<str>>,
    /// Calendar budgets with `shared: true` left to [`Guard::decide_shared`].
    budget_asks: Vec<BudgetAsk>,
    /// The resource's learned costs once a `cost:` rule read them (see [`Guard::learned`]).
    learned: Option<Option<Quantiles>>,
}

/// A `shared: true` calendar budget's take left to the caller.
struct BudgetAsk {
    store: Arc<StoreHandle>,
    /// The budget's place in its resource's `budgets`.
    index: usize,
    key: Box<str>,
    n: u64,
}

/// An estimate a `cost:` rule holds for a call.
struct CostHold<C: Clock> {
    on: CostOn<C>,
    held: Held,
    /// The most one call counts for (`cost.max`, else the rule's burst or limit).
    cap: u64,
    /// The rule's budget left once the estimate was held.
    budget: Budget,
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
enum CostOn<C: Clock> {
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
struct SharedBudgetCost {
    store: Arc<StoreHandle>,
    state: Arc<BudgetState>,
    id: Arc<str>,
    key: Box<str>,
    period: weir_core::calendar::Period,
}

/// An estimate a calendar budget holds for a call.
struct BudgetCost {
    state: Arc<BudgetState>,
    id: Arc<str>,
    key: Box<str>,
    period_start: i64,
}

impl Budget {
    /// What rule `rule` (its window `window`) had left once `d` admitted a call.
    fn after(rule: &Arc<str>, d: &Decision, window: Duration) -> Self {
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
struct SharedCost {
    store: Arc<StoreHandle>,
    rule: Arc<SharedRule>,
    key: Box<str>,
    held: SharedHeld,
}

/// The shared store, as the rules keep it.
struct StoreHandle(Box<dyn SharedStore>);

/// A `shared: true` rule's decision left to the caller (see [`Guard::decide_shared`]).
struct SharedAsk<C: Clock> {
    store: Arc<StoreHandle>,
    rule: Arc<SharedRule>,
    key: Box<str>,
    n: u64,
    /// With `cost:`: the most one call counts for.
    cap: Option<u64>,
    of: SharedOf<C>,
    id: Arc<str>,
    shadow: bool,
    window: Duration,
}

/// Whose counters a shared decision updates.
enum SharedOf<C: Clock> {
    Flow(Arc<FlowState<C>>),
    Hot(Arc<HotState<C>>),
}

impl<C: Clock + Clone> CostHold<C> {
    fn settle(self, actual: u64, now: Nanos) {
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

/// What the rules and their guards share.
struct Shared<C: Clock> {
    inbound: Inbound,
    clock: C,
    /// Where cluster flow rules get their decisions (see [`Rules::set_cluster`]).
    cluster: arc_swap::ArcSwapOption<ClusterHandle>,
    /// Where `shared: true` rules are counted (see [`Rules::set_shared`]).
    store: arc_swap::ArcSwapOption<StoreHandle>,
    /// Long keys are stored as a seeded digest (see `keys`).
    keys: KeyShortener,
    /// Switch states set at run time, by id: they win over the file's `on` across reloads.
    switches: parking_lot::Mutex<HashMap<String, bool>>,
    /// The calendar budgets' clock.
    wall: Arc<dyn WallClock>,
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
    fn settle_each(&mut self, actual: impl Fn(&CostHold<C>) -> u64, known: bool) {
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
            .cost(spender.as_deref().unwrap_or(""), estimate, first);
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
    fn hold(&mut self, hold: CostHold<C>, spender: Option<&str>) {
        let extra = self.extra_mut();
        if extra.spender.is_none() {
            extra.spender = spender.map(Into::into);
        }
        extra.costs.push(hold);
    }

    /// Records the estimate flow rule `f` (with `cost:`) holds for this call.
    #[cold]
    fn hold_flow(
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
    fn hold_rule(
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
    fn ask_shared(&mut self, ask: SharedAsk<C>) {
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
    fn budget_taken(
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
    fn release_costs(&mut self, now: Nanos) {
        if let Some(extra) = self.extra.as_mut() {
            for c in std::mem::take(&mut extra.costs) {
                c.settle(0, now);
            }
            extra.spender = None;
        }
    }
}

impl<C: Clock> Guard<C> {
    fn extra_mut(&mut self) -> &mut Extra<C> {
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
    fn learned(&mut self, res: &Resource<C>) -> Option<Quantiles> {
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
    fn cancel(&mut self) {
        // Dropping BBR / adaptive permits unreported releases them without a sample.
        self.extra.take();
        self.permit.take();
        self.call.take();
        if let Some(shared) = self.inbound.take() {
            shared.inbound.window.end();
        }
    }

    fn finish(&mut self, outcome: Option<Outcome>) {
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
                    r.stats.cost(extra.spender.as_deref().unwrap_or(""), e, e);
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

/// Decisions on cluster-quota resources for `cluster` flow rules: a weir-quota lease client
/// (`weir_quota::net::LeaseClient`) or anything that leases shares of a global limit.
pub trait ClusterQuota: Send + Sync + 'static {
    /// Takes `n` units of `resource` at `now` (the engine's one clock read for the call, so a
    /// rule set on a manual or coarse clock decides its cluster rules on that clock too);
    /// `None` when `resource` is not one it leases (the rule then enforces its own safe
    /// capacity locally).
    fn acquire_at(&self, resource: &str, n: u64, now: Nanos) -> Option<weir_core::Decision>;

    /// Corrects a charge `held` of `resource` (made by [`ClusterQuota::acquire_at`], units
    /// being costs) to `actual` at `now`: the rest given back, an excess charged as a debt.
    /// Nothing by default.
    fn settle_at(&self, resource: &str, held: Held, actual: u64, now: Nanos) {
        let _ = (resource, held, actual, now);
    }
}

/// A cluster rule's own limiter at its safe capacity (weir-core's [`Gcra::per_second`] with a
/// burst of 10 ms of the rate, as the lease client's), used while its resource is not leased.
fn cluster_fallback<C: Clock + Clone>(
    c: &crate::config::ClusterLimit,
    clock: &C,
) -> Option<SingleRate<C>> {
    let gcra = weir_core::gcra::Gcra::per_second(c.safe, std::time::Duration::from_millis(10))?;
    Some(SingleRate::Gcra(weir_core::Limiter::with_clock(
        gcra,
        clock.clone(),
    )))
}

/// A [`ClusterQuota`] as stored by the rules.
pub struct ClusterHandle(pub Box<dyn ClusterQuota>);

/// Errors applying a rule set.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RulesError {
    /// The set failed validation: (field path, reason).
    #[error("{0}: {1}")]
    Invalid(String, String),
    /// A rule's parameters were refused by the algorithm.
    #[error("rule {0}: {1}")]
    Rule(String, ConfigError),
}

/// No resource has a switch with this id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no switch {0:?} in the rules in force")]
pub struct UnknownSwitch(pub String);

/// A switch's state: what the file says, what was set at run time, and what is in force.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SwitchState {
    /// The switch's id.
    pub id: String,
    /// Its resource.
    pub resource: String,
    /// The rule file's `on`.
    pub file: bool,
    /// The state set at run time ([`Rules::set_switch`]), if any: it wins over the file's
    /// until cleared ([`Rules::clear_switch`]).
    #[serde(rename = "override")]
    pub run_time: Option<bool>,
    /// In force: on means the resource's calls are blocked.
    pub effective: bool,
}

/// The rules in force. `Send + Sync`; share it (e.g. in an `Arc`).
pub struct Rules<C: Clock + Clone = MonotonicClock> {
    current: ArcSwap<Compiled<C>>,
    shared: Arc<Shared<C>>,
    generation: std::sync::atomic::AtomicU64,
}

impl Rules<MonotonicClock> {
    /// Rules on the real clock (CPU sampled from /proc or cgroups when a rule needs it).
    pub fn new(set: &RuleSet) -> Result<Self, RulesError> {
        Self::with_clock(set, MonotonicClock::new())
    }
}

impl<C: Clock + Clone> Rules<C> {
    /// Rules reading `clock`.
    pub fn with_clock(set: &RuleSet, clock: C) -> Result<Self, RulesError> {
        Self::build(set, clock, None)
    }

    /// Rules reading `clock` and `cpu` (CPU usage in [0, 1], for `max_cpu` and `bbr`).
    pub fn with_signals(
        set: &RuleSet,
        clock: C,
        cpu: Arc<dyn CpuSource>,
    ) -> Result<Self, RulesError> {
        Self::build(set, clock, Some(cpu))
    }

    /// Rules reading `clock`, and `wall` for the periods of calendar budgets (by default the
    /// system's wall clock).
    pub fn with_clocks(
        set: &RuleSet,
        clock: C,
        wall: Arc<dyn WallClock>,
    ) -> Result<Self, RulesError> {
        Self::build_with(set, clock, None, wall)
    }

    fn build(set: &RuleSet, clock: C, cpu: Option<Arc<dyn CpuSource>>) -> Result<Self, RulesError> {
        Self::build_with(set, clock, cpu, Arc::new(SystemWallClock))
    }

    fn build_with(
        set: &RuleSet,
        clock: C,
        cpu: Option<Arc<dyn CpuSource>>,
        wall: Arc<dyn WallClock>,
    ) -> Result<Self, RulesError> {
        let shared = Arc::new(Shared {
            wall,
            inbound: Inbound::new(cpu),
            cluster: arc_swap::ArcSwapOption::empty(),
            store: arc_swap::ArcSwapOption::empty(),
            clock,
            keys: KeyShortener::new(),
            switches: parking_lot::Mutex::new(HashMap::new()),
        });
        let compiled = compile(set, None, &shared)?;
        Ok(Self {
            current: ArcSwap::from_pointee(compiled),
            shared,
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Counts the rules that say `shared: true` in `store` from now on (every instance using
    /// the same store counts together); callers then await [`Guard::decide_shared`] after
    /// each admission.
    pub fn set_shared(&self, store: impl SharedStore) {
        self.shared
            .store
            .store(Some(Arc::new(StoreHandle(Box::new(store)))));
    }

    /// Where `cluster` flow rules get their decisions from now on (before, and for resources
    /// it does not lease: each rule's safe capacity, enforced locally).
    pub fn set_cluster(&self, quota: impl ClusterQuota) {
        self.shared
            .cluster
            .store(Some(Arc::new(ClusterHandle(Box::new(quota)))));
    }

    /// The cluster-quota resources the rules in force use, with their safe capacities.
    pub fn cluster_resources(&self) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = Vec::new();
        for r in &self.rule_set().resources {
            for f in &r.flow {
                if let Some(c) = &f.cluster {
                    if !out.iter().any(|(n, _)| *n == c.resource) {
                        out.push((c.resource.clone(), c.safe));
                    }
                }
            }
        }
        out
    }

    /// Swaps in `set` atomically (all of it or, on error, none of it). Unchanged rules keep
    /// their state; a rate rule whose threshold or burst changed keeps its counters (a
    /// warming-up rule keeps its warm-up progress); a concurrency rule keeps its holders; a
    /// breaker whose configuration is unchanged keeps its state; a resource keeps its
    /// statistics.
    pub fn apply(&self, set: &RuleSet) -> Result<(), RulesError> {
        let old = self.current.load_full();
        let compiled = compile(set, Some(&old), &self.shared)?;
        self.current.store(Arc::new(compiled));
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Turns the switch `id` on (degraded: its resource's calls are blocked) or off, at once
    /// and until changed again: the state wins over the file's `on` across reloads (see
    /// [`Rules::clear_switch`]). Logged. Errors when no resource has a switch `id`.
    pub fn set_switch(&self, id: &str, on: bool) -> Result<(), UnknownSwitch> {
        let c = self.current.load();
        let sw = find_switch(&c, id)?;
        let mut overrides = self.shared.switches.lock();
        overrides.insert(id.to_string(), on);
        sw.on.store(on, Ordering::Release);
        drop(overrides);
        tracing::info!(switch = id, on, "switch set");
        Ok(())
    }

    /// Forgets the run-time state of switch `id`: the file's `on` applies again.
    pub fn clear_switch(&self, id: &str) -> Result<(), UnknownSwitch> {
        let c = self.current.load();
        let sw = find_switch(&c, id)?;
        let file = c
            .set
            .resources
            .iter()
            .filter_map(|r| r.switch.as_ref())
            .find(|f| f.id == id)
            .is_some_and(|f| f.on);
        let mut overrides = self.shared.switches.lock();
        overrides.remove(id);
        sw.on.store(file, Ordering::Release);
        drop(overrides);
        tracing::info!(switch = id, on = file, "switch back to the file's state");
        Ok(())
    }

    /// Run-time switch states to restore (e.g. read back from a state file at start): kept
    /// even for ids no resource has yet, applied to those that have.
    pub fn restore_switches(&self, states: &HashMap<String, bool>) {
        let mut overrides = self.shared.switches.lock();
        overrides.extend(states.iter().map(|(k, v)| (k.clone(), *v)));
        let c = self.current.load();
        for sw in c.resources.values().filter_map(|r| r.switch.as_ref()) {
            if let Some(on) = states.get(&*sw.id) {
                sw.on.store(*on, Ordering::Release);
            }
        }
    }

    /// Every switch of the rules in force: id, resource, whether on, and the run-time state
    /// if one was set.
    pub fn switches(&self) -> Vec<SwitchState> {
        let c = self.current.load();
        let overrides = self.shared.switches.lock();
        let mut out: Vec<SwitchState> = c
            .resources
            .iter()
            .filter_map(|(name, r)| r.switch.as_ref().map(|sw| (name, sw)))
            .map(|(name, sw)| SwitchState {
                id: sw.id.to_string(),
                resource: name.clone(),
                file: c
                    .set
                    .resources
                    .iter()
                    .filter_map(|r| r.switch.as_ref())
                    .find(|f| *f.id == *sw.id)
                    .is_some_and(|f| f.on),
                run_time: overrides.get(&*sw.id).copied(),
                effective: sw.on.load(Ordering::Acquire),
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Counts a blocked call of `resource` that a fallback answered (see
    /// [`crate::config::Fallback`]).
    pub fn fallback_served(&self, resource: &str) {
        if let Some(r) = self.current.load().resources.get(resource) {
            r.stats.fallback();
        }
    }

    /// Every run-time switch state (what to persist).
    pub fn switch_overrides(&self) -> HashMap<String, bool> {
        self.shared.switches.lock().clone()
    }

    /// How many rule sets were applied since creation (changes with every `apply`): a cheap
    /// way for callers deriving data from [`Rules::rule_set`] to know when to refresh it.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether a resource in force reads its cost estimates from a JSON request body
    /// (`cost.estimate_from: {json: …}`): an HTTP front end then reads such bodies first.
    pub fn reads_request_json(&self) -> bool {
        self.current.load().reads_json
    }

    /// Whether a resource in force says where HTTP calls state their costs
    /// (`cost.estimate_from` / `actual_from`).
    pub fn states_costs(&self) -> bool {
        self.current.load().states_costs
    }

    /// The rule set in force.
    pub fn rule_set(&self) -> Arc<RuleSet> {
        self.current.load().set.clone()
    }

    /// Admits a call to `resource`, or says which rule blocked it. Resources without rules
    /// pass (system rules still apply to inbound calls).
    pub fn entry(&self, resource: &str, ctx: &Context<'_>) -> Result<Guard<C>, Block> {
        let compiled = self.current.load();
        let res = compiled.resources.get(resource).cloned();
        self.entry_in(&compiled, res, resource, ctx)
    }

    /// Looks `resource` up once in the rules in force, for [`Rules::entry_resolved`]. Valid
    /// until the next [`Rules::apply`] (compare [`Rules::generation`] and resolve again when it
    /// changed): a stale one still admits by the rules it was resolved from.
    pub fn resolve(&self, resource: &str) -> Resolved<C> {
        let compiled = self.current.load_full();
        let resource = compiled.resources.get(resource).cloned();
        Resolved { compiled, resource }
    }

    /// [`Rules::entry`] for a resource resolved beforehand (`resource` is its name, used in
    /// blocks): no rule-set load and no name lookup per call. A route table resolves each
    /// route's resource when it compiles.
    pub fn entry_resolved(
        &self,
        resolved: &Resolved<C>,
        resource: &str,
        ctx: &Context<'_>,
    ) -> Result<Guard<C>, Block> {
        self.entry_in(&resolved.compiled, resolved.resource.clone(), resource, ctx)
    }

    #[inline(always)]
    fn entry_in(
        &self,
        compiled: &Compiled<C>,
        res: Option<Arc<Resource<C>>>,
        resource: &str,
        ctx: &Context<'_>,
    ) -> Result<Guard<C>, Block> {
        let system = compiled.system.as_ref().filter(|_| ctx.inbound);
        let mut guard = Guard {
            resource: None,
            inbound: None,
            permit: None,
            call: None,
            extra: None,
            start: 0,
            wait: 0,
        };
        if res.is_none() && system.is_none() {
            return Ok(guard);
        }
        if let Some(sw) = res.as_ref().and_then(|r| r.switch.as_ref()) {
            if sw.on.load(Ordering::Acquire) {
                sw.stats.blocks.fetch_add(1, Ordering::Relaxed);
                let block = Block {
                    rule: sw.id.clone(),
                    kind: RuleKind::Switch,
                    retry_after: None,
                    rate: None,
                    remaining: None,
                };
                return Err(blocked(res.as_deref(), resource, block));
            }
        }
        let now = self.shared.clock.now();
        guard.start = now;
        if let Some(r) = &res {
            if let Some((a, id, stats)) = &r.authority {
                let listed = |l: &[String]| l.iter().any(|o| o == ctx.origin);
                let ok = if a.allow.is_empty() {
                    !listed(&a.deny)
                } else {
                    listed(&a.allow)
                };
                verdict(ok, a.shadow, stats, || Block {
                    rule: id.clone(),
                    kind: RuleKind::Authority,
                    retry_after: None,
                    rate: None,
                    remaining: None,
                })
                .map_err(|b| blocked(Some(r), resource, b))?;
            }
        }
        if let Some(system) = system {
            let inbound = &self.shared.inbound;
            match system.check(inbound, ctx.criticality, now) {
                Ok(permits) => {
                    if permits.bbr.is_some() || permits.adaptive.is_some() {
                        guard.extra_mut().system = permits;
                    }
                    inbound.window.add_pass(now, 1);
                    inbound.window.begin();
                    guard.inbound = Some(self.shared.clone());
                }
                Err((part, retry_after)) => {
                    inbound.window.add_block(now, 1);
                    let block = Block {
                        rule: inbound.ids[part as usize].clone(),
                        kind: RuleKind::System,
                        retry_after,
                        rate: system
                            .rule
                            .max_qps
                            .filter(|_| part == Part::MaxQps)
                            .map(|n| (n, ONE_SECOND)),
                        remaining: None,
                    };
                    return Err(blocked(res.as_deref(), resource, block));
                }
            }
        }
        let Some(res) = res else {
            return Ok(guard);
        };
        if let Err(b) = self.check_resource(&res, ctx, now, &mut guard) {
            guard.release_costs(now);
            guard.cancel();
            return Err(blocked(Some(&res), resource, b));
        }
        res.stats.pass(now);
        guard.start = now + guard.wait;
        guard.resource = Some(res);
        Ok(guard)
    }

    /// The resource's hot-parameter rules, value by value.
    #[inline]
    fn check_hot(
        &self,
        res: &Resource<C>,
        ctx: &Context<'_>,
        now: Nanos,
        guard: &mut Guard<C>,
    ) -> Result<(), Block> {
        for (config, h, id, shared) in &res.hot {
            let Some(value) = ctx.params.get(config.param) else {
                continue;
            };
            if value.is_empty() && config.absent == Absent::Skip {
                continue;
            }
            let value = self.shared.keys.bounded(value);
            let value = &*value;
            let n = match &config.cost {
                None => 1,
                Some(c) => {
                    let learned = guard.learned(res);
                    c.estimate_of(ctx.cost, config.burst.unwrap_or(config.threshold), learned)
                }
            };
            if let Some(rule) = shared {
                if self.ask_shared_hot(config, h, id, rule, value, n, guard) {
                    continue;
                }
            }
            let d = match config.on_full {
                OnFull::Evict => h.rate.acquire_at(value, n, now),
                on_full => match h.rate.acquire_if_room_at(value, n, now) {
                    Some(d) => d,
                    None => {
                        h.stats.full.fetch_add(1, Ordering::Relaxed);
                        if on_full == OnFull::Allow {
                            continue;
                        }
                        verdict(false, config.shadow, &h.stats, || Block {
                            rule: id.clone(),
                            kind: RuleKind::HotParam,
                            retry_after: Some(Duration::ZERO),
                            rate: None,
                            remaining: None,
                        })?;
                        continue;
                    }
                },
            };
            if !d.allowed() {
                if let Some(mut top) = h.top.try_lock() {
                    top.record(value);
                }
            }
            verdict(d.allowed(), config.shadow, &h.stats, || Block {
                rule: id.clone(),
                kind: RuleKind::HotParam,
                retry_after: d.retry_after(),
                rate: Some((d.limit(), config.window.unwrap_or(ONE_SECOND))),
                remaining: Some(d.remaining_lazy()),
            })?;
            if let (Some(rule), true) = (&config.cost, d.allowed()) {
                let budget = Budget::after(id, &d, config.window.unwrap_or(ONE_SECOND));
                let cap = rule.max.unwrap_or(config.burst.unwrap_or(config.threshold));
                let hold = CostHold {
                    on: CostOn::Hot(h.clone(), value.into()),
                    held: Held {
                        estimate: n,
                        taken: now,
                    },
                    cap,
                    budget,
                };
                guard.hold(hold, Some(value));
            }
        }
        Ok(())
    }

    /// Leaves flow rule `f` (`shared: true`) to the shared store, if there is one (then
    /// `true`).
    #[cold]
    #[inline(never)]
    fn ask_shared_flow(
        &self,
        res: &Resource<C>,
        f: &Flow<C>,
        key: Option<&str>,
        ctx: &Context<'_>,
        guard: &mut Guard<C>,
    ) -> bool {
        let (Some(rule), Some(store)) = (&f.shared, self.shared.store.load_full()) else {
            return false;
        };
        let n = match &f.config.cost {
            None => 1,
            Some(c) => c.estimate_of(ctx.cost, f.cost_cap(), guard.learned(res)),
        };
        guard.ask_shared(SharedAsk {
            store,
            rule: rule.clone(),
            key: key.unwrap_or("").into(),
            n,
            cap: f.config.cost.as_ref().map(|_| f.cost_cap()),
            of: SharedOf::Flow(f.state.clone()),
            id: f.id.clone(),
            shadow: f.config.shadow,
            window: f.config.window.unwrap_or(ONE_SECOND),
        });
        true
    }

    /// Leaves hot-parameter rule `config` (`shared: true`) to the shared store for `value`, if
    /// there is one (then `true`).
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn ask_shared_hot(
        &self,
        config: &HotParamRule,
        h: &Arc<HotState<C>>,
        id: &Arc<str>,
        rule: &Arc<SharedRule>,
        value: &str,
        n: u64,
        guard: &mut Guard<C>,
    ) -> bool {
        let Some(store) = self.shared.store.load_full() else {
            return false;
        };
        let cap = config
            .cost
            .as_ref()
            .map(|c| c.max.unwrap_or(config.burst.unwrap_or(config.threshold)));
        guard.ask_shared(SharedAsk {
            store,
            rule: rule.clone(),
            key: value.into(),
            n,
            cap,
            of: SharedOf::Hot(h.clone()),
            id: id.clone(),
            shadow: config.shadow,
            window: config.window.unwrap_or(ONE_SECOND),
        });
        true
    }

    fn check_resource(
        &self,
        res: &Resource<C>,
        ctx: &Context<'_>,
        now: Nanos,
        guard: &mut Guard<C>,
    ) -> Result<(), Block> {
        if !res.hot.is_empty() {
            self.check_hot(res, ctx, now, guard)?;
        }
        // Borrowed unless the origin is too long to store as is.
        let origin_key = self.shared.keys.bounded(ctx.origin);
        for f in &res.flows {
            // None: counted together; Some(key): one counter per calling origin.
            let key = match &f.origins {
                Origins::All => None,
                Origins::Named(o) if **o == *ctx.origin => None,
                Origins::Named(_) => continue,
                Origins::Other => {
                    if res.named_origins.iter().any(|o| **o == *ctx.origin) {
                        continue;
                    }
                    if ctx.origin.is_empty() {
                        Some(UNKNOWN_ORIGIN)
                    } else {
                        Some(&*origin_key)
                    }
                }
            };
            let block = |retry_after, remaining| Block {
                rule: f.id.clone(),
                kind: RuleKind::Flow,
                retry_after,
                rate: f
                    .config
                    .qps
                    .map(|q| (q, f.config.window.unwrap_or(ONE_SECOND))),
                remaining,
            };
            if let Some(c) = &f.config.cluster {
                // Not leased (no quota client, or one that does not know the resource yet):
                // the rule's own limiter at its safe capacity — never unlimited.
                let n = match &f.config.cost {
                    None => 1,
                    Some(cost) => cost.estimate_of(ctx.cost, f.cost_cap(), guard.learned(res)),
                };
                let handle = self.shared.cluster.load();
                let leased = handle
                    .as_ref()
                    .and_then(|h| h.0.acquire_at(&c.resource, n, now));
                let d = leased.or_else(|| f.state.single.as_ref().map(|s| s.acquire_at(n, now)));
                let ok = d.is_none_or(|d| d.allowed());
                verdict(ok, f.config.shadow, &f.state.stats, || {
                    block(
                        d.and_then(|d| d.retry_after()),
                        d.map(|d| d.remaining_lazy()),
                    )
                })?;
                if let (Some(_), Some(d)) = (&f.config.cost, d.filter(Decision::allowed)) {
                    let on = match (leased, handle.as_ref()) {
                        (Some(_), Some(h)) => CostOn::Leased(h.clone(), c.resource.as_str().into()),
                        _ => CostOn::Flow(f.state.clone()),
                    };
                    guard.hold_rule(f, on, &d, n, now, ONE_SECOND);
                }
            } else if let Some(stats) = &f.relate {
                let qps = f.config.qps.unwrap_or(u64::MAX);
                let ok = stats.window.snapshot(now).pass < qps;
                verdict(ok, f.config.shadow, &f.state.stats, || {
                    block(Some(stats.window.bucket_duration()), None)
                })?;
            } else if f.shared.is_some() && self.ask_shared_flow(res, f, key, ctx, guard) {
                // Left to the shared store.
            } else if let Some(d) = {
                let n = match &f.config.cost {
                    None => 1,
                    Some(c) => c.estimate_of(ctx.cost, f.cost_cap(), guard.learned(res)),
                };
                match (&f.state.single, &f.state.rate, key) {
                    (Some(single), _, _) => Some(single.acquire_at(n, now)),
                    (None, Some(rate), Some(key)) => Some(rate.acquire_at(key, n, now)),
                    _ => None,
                }
            } {
                verdict(d.allowed(), f.config.shadow, &f.state.stats, || {
                    block(d.retry_after(), Some(d.remaining_lazy()))
                })?;
                if let (Some(c), true) = (&f.config.cost, d.allowed()) {
                    // The estimate just taken: the learned costs were read for it and kept.
                    let n = c.estimate_of(ctx.cost, f.cost_cap(), guard.learned(res));
                    guard.hold_flow(f, key, &d, n, now);
                }
                guard.wait = guard
                    .wait
                    .max(weir_core::clock::duration_to_nanos(d.wait()));
            } else if let Some(c) = &f.state.concurrency {
                match c.try_acquire_as(1, ctx.criticality) {
                    Ok(p) => {
                        f.state.stats.passes.add(1);
                        guard.permit = Some(p);
                    }
                    Err(d) => verdict(false, f.config.shadow, &f.state.stats, || {
                        block(d.retry_after(), None)
                    })?,
                }
            }
        }
        if let Some((config, b, id)) = &res.breaker {
            match b.breaker.try_acquire(now) {
                Ok(c) => {
                    b.stats.passes.add(1);
                    guard.call = Some(c);
                }
                Err(r) => verdict(false, config.shadow, &b.stats, || Block {
                    rule: id.clone(),
                    kind: RuleKind::Breaker,
                    retry_after: Some(r.retry_after),
                    rate: None,
                    remaining: None,
                })?,
            }
        }
        if !res.budgets.is_empty() {
            self.check_budgets(res, ctx, guard)?;
        }
        Ok(())
    }

    /// The resource's calendar budgets, after every other rule admitted the call.
    #[cold]
    #[inline(never)]
    fn check_budgets(
        &self,
        res: &Resource<C>,
        ctx: &Context<'_>,
        guard: &mut Guard<C>,
    ) -> Result<(), Block> {
        for (index, b) in res.budgets.iter().enumerate() {
            let Some(key) = b.key(ctx.params) else {
                continue;
            };
            let key = self.shared.keys.bounded(key);
            let n = match &b.config.cost {
                None => 1,
                Some(c) => c.estimate_of(ctx.cost, b.config.limit, guard.learned(res)),
            };
            if b.config.shared {
                if let Some(store) = self.shared.store.load_full() {
                    let ask = BudgetAsk {
                        store,
                        index,
                        key: (*key).into(),
                        n,
                    };
                    guard.extra_mut().budget_asks.push(ask);
                    continue;
                }
            }
            let Some(t) = b.take(&key, n) else { continue };
            guard.budget_taken(b, &key, n, &t, None)?;
        }
        Ok(())
    }

    /// How many times the calendar budgets' counts changed (takes, settlements, restores),
    /// with the rule set's generation: while both stay, the counts have not changed.
    pub fn budget_changes(&self) -> (u64, u64) {
        let c = self.current.load();
        let changes = c
            .resources
            .values()
            .flat_map(|r| r.budgets.iter())
            .map(|b| b.state.budget.changes())
            .fold(0u64, u64::wrapping_add);
        (changes, self.generation())
    }

    /// Every calendar budget's counts of the current periods, to keep across a restart.
    pub fn budget_counts(&self) -> Vec<SavedCount> {
        let c = self.current.load();
        let now = self.shared.wall.unix_nanos();
        let mut out = Vec::new();
        for r in c.resources.values() {
            for b in &r.budgets {
                for s in b.state.budget.saved(now) {
                    out.push(SavedCount {
                        rule: b.config.id.clone(),
                        key: s.key,
                        period_start: s.period_start,
                        used: s.used,
                    });
                }
            }
        }
        out
    }

    /// Takes back counts kept across a restart ([`Rules::budget_counts`]): those of rules in
    /// force and of their current periods are added; answers how many were.
    pub fn restore_budgets(&self, counts: &[SavedCount]) -> usize {
        let c = self.current.load();
        let now = self.shared.wall.unix_nanos();
        let mut taken = 0;
        for r in c.resources.values() {
            for b in &r.budgets {
                let mine: Vec<weir_core::budget::Saved> = counts
                    .iter()
                    .filter(|s| s.rule == b.config.id)
                    .map(|s| weir_core::budget::Saved {
                        key: s.key.clone(),
                        period_start: s.period_start,
                        used: s.used,
                    })
                    .collect();
                taken += b.state.budget.restore(&mine, now);
            }
        }
        taken
    }

    /// Counters of the rule `id` (flow, hot-parameter, authority, breaker, or a system part
    /// such as `system:bbr`).
    pub fn stats(&self, id: &str) -> Option<RuleSnapshot> {
        self.snapshot().rules.into_iter().find(|r| r.id == id)
    }

    /// Every counter: per declared resource and per rule.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_of(false)
    }

    /// The counters of the resources that changed since the last call (a call came, was
    /// blocked or ended; or calls are still in flight), with their rules, breakers and
    /// hot-parameter top values, and the system rule: what a once-a-second sampler needs,
    /// at a cost of one flag read per other resource. The first call returns every resource.
    pub fn changed_snapshot(&self) -> Snapshot {
        self.snapshot_of(true)
    }

    /// The names of the declared resources, sorted.
    pub fn resource_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.current.load().resources.keys().cloned().collect();
        names.sort_unstable();
        names
    }

    fn snapshot_of(&self, changed_only: bool) -> Snapshot {
        let c = self.current.load_full();
        let mut out = Snapshot::default();
        let mut names: Vec<&String> = c
            .resources
            .iter()
            .filter(|(_, r)| !changed_only || r.stats.take_touched())
            .map(|(n, _)| n)
            .collect();
        names.sort();
        let rule = |id: &str, kind, resource: &str, s: &RuleStats, evictions| RuleSnapshot {
            id: id.to_string(),
            kind,
            resource: resource.to_string(),
            passes: s.passes.get(),
            blocks: s.blocks.load(Ordering::Relaxed),
            shadow_blocks: s.shadow_blocks.load(Ordering::Relaxed),
            evictions,
            full: s.full.load(Ordering::Relaxed),
            over_budget: s.over.load(Ordering::Relaxed),
            budget_warnings: s.warnings.load(Ordering::Relaxed),
        };
        for name in names {
            let r = &c.resources[name];
            out.resources.push(r.stats.snapshot(name));
            if changed_only && out.resources.last().is_some_and(|s| s.in_flight > 0) {
                // Calls in flight show in every second until they end.
                r.stats.keep_touched();
            }
            // This resource's rules are pushed next: their shadow blocks are its own.
            let first_rule = out.rules.len();
            if let Some(sw) = &r.switch {
                out.rules
                    .push(rule(&sw.id, RuleKind::Switch, name, &sw.stats, 0));
            }
            if let Some((a, _, s)) = &r.authority {
                out.rules.push(rule(&a.id, RuleKind::Authority, name, s, 0));
            }
            for (config, h, _, _) in &r.hot {
                let ev = h.rate.evictions();
                out.rules
                    .push(rule(&config.id, RuleKind::HotParam, name, &h.stats, ev));
                out.heavy.push(HeavySnapshot {
                    rule: config.id.clone(),
                    resource: name.to_string(),
                    top: h.top.lock().top(),
                });
            }
            for f in &r.flows {
                let ev = f.state.rate.as_ref().map_or(0, |r| r.evictions());
                out.rules
                    .push(rule(&f.config.id, RuleKind::Flow, name, &f.state.stats, ev));
            }
            for b in &r.budgets {
                let ev = b.state.budget.evicted();
                out.rules
                    .push(rule(&b.config.id, RuleKind::Flow, name, &b.state.stats, ev));
            }
            if let Some((config, b, _)) = &r.breaker {
                out.rules
                    .push(rule(&config.id, RuleKind::Breaker, name, &b.stats, 0));
                out.breakers.push(BreakerSnapshot {
                    rule: config.id.clone(),
                    resource: name.to_string(),
                    state: b.breaker.state(),
                });
            }
            let shadow = out.rules[first_rule..]
                .iter()
                .map(|x| x.shadow_blocks)
                .sum();
            if let Some(last) = out.resources.last_mut() {
                last.shadow_blocks = shadow;
            }
        }
        if let Some(system) = &c.system {
            for part in Part::ALL {
                if system.has(part) {
                    let s = &self.shared.inbound.stats[part as usize];
                    out.rules.push(rule(part.id(), RuleKind::System, "", s, 0));
                }
            }
            out.system = Some(system.snapshot(&self.shared.inbound, self.shared.clock.now()));
        }
        out
    }
}

/// The compiled switch `id`.
fn find_switch<'a, C: Clock>(c: &'a Compiled<C>, id: &str) -> Result<&'a Switch, UnknownSwitch> {
    c.resources
        .values()
        .filter_map(|r| r.switch.as_ref())
        .find(|sw| &*sw.id == id)
        .ok_or_else(|| UnknownSwitch(id.to_string()))
}

/// Counts a block on the resource and traces it.
fn blocked<C: Clock>(res: Option<&Resource<C>>, resource: &str, block: Block) -> Block {
    if let Some(r) = res {
        r.stats.block(block.kind);
    }
    tracing::debug!(
        resource,
        rule = &*block.rule,
        kind = block.kind.as_str(),
        "blocked"
    );
    block
}

/// Counts the verdict; blocks unless allowed or in shadow mode.
fn verdict(
    allowed: bool,
    shadow: bool,
    stats: &RuleStats,
    block: impl FnOnce() -> Block,
) -> Result<(), Block> {
    if allowed {
        stats.passes.add(1);
        return Ok(());
    }
    if shadow {
        stats.shadow_blocks.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    stats.blocks.fetch_add(1, Ordering::Relaxed);
    Err(block())
}

const ONE_SECOND: Duration = Duration::from_secs(1);

/// A rate spec for a flow rule's `qps` (behaviour and algorithm applied).
fn flow_spec(f: &FlowRule, qps: u64, window: Duration) -> RateSpec {
    let (algorithm, max_wait) = match f.behavior {
        Behavior::Reject => (
            f.algorithm.unwrap_or(crate::config::FILE_ALGORITHMS[0]),
            Duration::ZERO,
        ),
        Behavior::Pace => (
            RateAlgorithm::Pacing,
            f.max_wait.unwrap_or(DEFAULT_MAX_WAIT),
        ),
        Behavior::WarmUp => (RateAlgorithm::WarmUp, Duration::ZERO),
        Behavior::WarmUpPace => (
            RateAlgorithm::WarmUp,
            f.max_wait.unwrap_or(DEFAULT_MAX_WAIT),
        ),
    };
    RateSpec {
        burst: f.burst,
        max_wait,
        warmup: f.warmup.unwrap_or(DEFAULT_WARMUP),
        cold_factor: f
            .cold_factor
            .unwrap_or(RateSpec::new(algorithm, 1, window).cold_factor),
        ..RateSpec::new(algorithm, qps, window)
    }
}

/// Distinct origins counted by one `origin: other` rule at most.
const MAX_OTHER_ORIGINS: usize = 4096;

/// The key `origin: other` rules count calls without an origin under.
const UNKNOWN_ORIGIN: &str = "(unknown)";

/// The previous rule set's configurations and states, by rule id, and its resources'
/// statistics by name: what a new set keeps.
struct Previous<'a, C: Clock> {
    flows: HashMap<&'a str, (&'a FlowRule, &'a Arc<FlowState<C>>)>,
    hot: HashMap<&'a str, (&'a HotParamRule, &'a Arc<HotState<C>>)>,
    breakers: HashMap<&'a str, (&'a BreakerRule, &'a Arc<BreakerState>)>,
    authority: HashMap<&'a str, &'a Arc<RuleStats>>,
    switches: HashMap<&'a str, (&'a Arc<std::sync::atomic::AtomicBool>, &'a Arc<RuleStats>)>,
    stats: HashMap<&'a str, Arc<ResourceStats>>,
    budgets: HashMap<&'a str, &'a BudgetInForce>,
}

impl<'a, C: Clock> Previous<'a, C> {
    fn of(old: Option<&'a Compiled<C>>) -> Self {
        let mut p = Previous {
            flows: HashMap::new(),
            hot: HashMap::new(),
            breakers: HashMap::new(),
            authority: HashMap::new(),
            switches: HashMap::new(),
            stats: HashMap::new(),
            budgets: HashMap::new(),
        };
        for (name, r) in old.iter().flat_map(|o| o.resources.iter()) {
            p.stats.insert(name.as_str(), r.stats.clone());
            if let Some(sw) = &r.switch {
                p.switches.insert(&*sw.id, (&sw.on, &sw.stats));
            }
            for f in &r.flows {
                p.flows.insert(f.config.id.as_str(), (&f.config, &f.state));
            }
            for (c, h, _, _) in &r.hot {
                p.hot.insert(c.id.as_str(), (c, h));
            }
            if let Some((c, b, _)) = &r.breaker {
                p.breakers.insert(c.id.as_str(), (c, b));
            }
            if let Some((c, _, s)) = &r.authority {
                p.authority.insert(c.id.as_str(), s);
            }
            for b in &r.budgets {
                p.budgets.insert(b.config.id.as_str(), b);
            }
        }
        p
    }
}

/// Changes to state the running rules share (kept state, new parameters): checked while a set
/// compiles, applied only once all of it has, so a rejected set changes nothing.
type Deferred<'a> = Vec<Box<dyn FnOnce() + 'a>>;

/// A rule's error with its id.
fn rule_error(id: &str) -> impl Fn(ConfigError) -> RulesError + '_ {
    move |e| RulesError::Rule(id.to_string(), e)
}

fn compile<C: Clock + Clone>(
    set: &RuleSet,
    old: Option<&Compiled<C>>,
    shared: &Shared<C>,
) -> Result<Compiled<C>, RulesError> {
    let (inbound, clock) = (&shared.inbound, &shared.clock);
    set.validate().map_err(|(p, r)| RulesError::Invalid(p, r))?;
    let previous = Previous::of(old);
    let stats: HashMap<&str, Arc<ResourceStats>> = set
        .resources
        .iter()
        .map(|r| {
            let s = previous
                .stats
                .get(r.name.as_str())
                .cloned()
                .unwrap_or_else(|| Arc::new(ResourceStats::new()));
            (r.name.as_str(), s)
        })
        .collect();
    let mut resources = ResourceMap::default();
    let mut deferred: Deferred<'_> = Vec::new();
    for r in &set.resources {
        let resource = compile_resource(r, &previous, &stats, shared, &mut deferred)?;
        resources.insert(r.name.clone(), Arc::new(resource));
    }
    let system = match &set.system {
        Some(rule) => Some(
            System::compile(rule, old.and_then(|o| o.system.as_ref()), inbound, clock)
                .map_err(rule_error("system"))?,
        ),
        None => None,
    };
    for apply in deferred {
        apply();
    }
    let sources = || resources.values().filter_map(|r| r.cost_sources.as_ref());
    let states_costs = sources().next().is_some();
    let reads_json = sources().any(|c| matches!(c.estimate, Some(EstimateFrom::Json(_))));
    Ok(Compiled {
        states_costs,
        reads_json,
        resources,
        system,
        set: Arc::new(set.clone()),
    })
}

/// One resource's rules, keeping the state of the rules `previous` had.
fn compile_resource<'a, C: Clock + Clone>(
    r: &'a crate::config::ResourceConfig,
    previous: &Previous<'a, C>,
    stats: &HashMap<&str, Arc<ResourceStats>>,
    shared: &'a Shared<C>,
    deferred: &mut Deferred<'a>,
) -> Result<Resource<C>, RulesError> {
    let clock = &shared.clock;
    let named_origins: Vec<Box<str>> = r
        .flow
        .iter()
        .filter_map(|f| f.origin.as_deref().filter(|o| *o != OTHER_ORIGIN))
        .map(Into::into)
        .collect();
    let mut flows = Vec::with_capacity(r.flow.len());
    for f in &r.flow {
        flows.push(compile_flow(f, previous, stats, clock, deferred)?);
    }
    let mut hot = Vec::with_capacity(r.hot_params.len());
    for h in &r.hot_params {
        let state = compile_hot(h, previous, clock, deferred)?;
        let shared = h.shared.then(|| {
            Arc::new(SharedRule {
                name: h.id.clone(),
                spec: RateSpec {
                    burst: h.burst,
                    ..RateSpec::new(h.algorithm, h.threshold, h.window.unwrap_or(ONE_SECOND))
                },
            })
        });
        hot.push((h.clone(), state, Arc::from(h.id.as_str()), shared));
    }
    let breaker = match &r.breaker {
        Some(b) => Some((
            b.clone(),
            compile_breaker(&r.name, b, previous)?,
            Arc::from(b.id.as_str()),
        )),
        None => None,
    };
    let authority = r.authority.as_ref().map(|a| {
        let stats = previous
            .authority
            .get(a.id.as_str())
            .map(|s| Arc::clone(s))
            .unwrap_or_default();
        (a.clone(), Arc::from(a.id.as_str()), stats)
    });
    let switch = r.switch.as_ref().map(|sw| {
        let (on, stats) = previous
            .switches
            .get(sw.id.as_str())
            .map(|(on, s)| (Arc::clone(on), Arc::clone(s)))
            .unwrap_or_default();
        // Read and stored under the lock `set_switch` holds too: never a stale state.
        let (state, id, file) = (Arc::clone(&on), sw.id.as_str(), sw.on);
        deferred.push(Box::new(move || {
            let overrides = shared.switches.lock();
            state.store(
                overrides.get(id).copied().unwrap_or(file),
                Ordering::Release,
            );
        }));
        Switch {
            id: Arc::from(sw.id.as_str()),
            on,
            stats,
        }
    });
    Ok(Resource {
        clock: clock.clone(),
        stats: stats[r.name.as_str()].clone(),
        authority,
        hot,
        flows,
        named_origins,
        breaker,
        switch,
        cost_sources: Some(r.cost_sources())
            .filter(|c| !c.is_empty())
            .map(Arc::new),
        learns: r.learns_costs(),
        budgets: r
            .budgets
            .iter()
            .map(|b| {
                let old = previous.budgets.get(b.id.as_str()).copied();
                BudgetInForce::compile(b, old, &shared.wall)
                    .map_err(|reason| RulesError::Invalid(b.id.clone(), reason))
            })
            .collect::<Result<_, _>>()?,
    })
}

/// A flow rule: the previous rule's state when the id, algorithm, window, kind and origins
/// are the same (retuned to the new parameters), a new state otherwise.
fn compile_flow<'a, C: Clock + Clone>(
    f: &FlowRule,
    previous: &Previous<'a, C>,
    stats: &HashMap<&str, Arc<ResourceStats>>,
    clock: &C,
    deferred: &mut Deferred<'a>,
) -> Result<Flow<C>, RulesError> {
    let err = rule_error(&f.id);
    let window = f.window.unwrap_or(ONE_SECOND);
    let origins = match f.origin.as_deref() {
        None => Origins::All,
        Some(OTHER_ORIGIN) => Origins::Other,
        Some(o) => Origins::Named(o.into()),
    };
    let spec = f.qps.map(|qps| flow_spec(f, qps, window));
    let reused = previous.flows.get(f.id.as_str()).copied().filter(|(c, _)| {
        let old_spec = c
            .qps
            .map(|q| flow_spec(c, q, c.window.unwrap_or(ONE_SECOND)));
        old_spec.map(|s| (s.algorithm, s.window)) == spec.map(|s| (s.algorithm, s.window))
            && c.origin == f.origin
            && c.relate.is_none()
            && f.relate.is_none()
    });
    let state = match (reused, spec, f.concurrency) {
        _ if f.relate.is_some() => Arc::new(FlowState::empty()),
        _ if f.cluster.is_some() => Arc::new(FlowState {
            single: f.cluster.as_ref().and_then(|c| cluster_fallback(c, clock)),
            ..FlowState::empty()
        }),
        (Some((c, s)), Some(spec), _) => {
            if let Some(rate) = &s.rate {
                spec.check().map_err(&err)?;
                deferred.push(Box::new(move || {
                    // Checked above, same algorithm (the reuse condition).
                    let _ = rate.retune(&spec);
                }));
                Arc::clone(s)
            } else if let Some(single) = s.single.as_ref().filter(|_| {
                c.qps != f.qps
                    || c.burst != f.burst
                    || c.max_wait != f.max_wait
                    || c.warmup != f.warmup
                    || c.cold_factor != f.cold_factor
            }) {
                // New parameters: a new limiter starting from the old one's state.
                Arc::new(FlowState {
                    single: Some(single.retuned(&spec).map_err(&err)?),
                    stats: s.stats.clone(),
                    ..FlowState::empty()
                })
            } else {
                Arc::clone(s)
            }
        }
        (Some((_, s)), None, Some(n)) => {
            if let Some(c) = &s.concurrency {
                c.set_max_in_flight(n);
            }
            Arc::clone(s)
        }
        (_, Some(spec), _) if origins == Origins::Other => Arc::new(FlowState {
            rate: Some(KeyedRate::new(&spec, MAX_OTHER_ORIGINS, clock.clone()).map_err(&err)?),
            ..FlowState::empty()
        }),
        (_, Some(spec), _) => Arc::new(FlowState {
            single: Some(SingleRate::new(&spec, clock.clone()).map_err(&err)?),
            ..FlowState::empty()
        }),
        (_, None, n) => Arc::new(FlowState {
            concurrency: Some(
                ConcurrencyLimiter::with_config(ConcurrencyConfig {
                    max_in_flight: n.unwrap_or(1),
                    max_queue: 0,
                    order: QueueOrder::Fifo,
                    shares: None,
                })
                .map_err(&err)?,
            ),
            ..FlowState::empty()
        }),
    };
    let shared = match (f.shared, f.qps) {
        (true, Some(qps)) => Some(Arc::new(SharedRule {
            name: f.id.clone(),
            spec: flow_spec(f, qps, window),
        })),
        _ => None,
    };
    Ok(Flow {
        config: f.clone(),
        id: Arc::from(f.id.as_str()),
        state,
        origins,
        shared,
        relate: f.relate.as_deref().and_then(|o| {
            let s = stats.get(o).cloned()?;
            s.related.store(true, Ordering::Relaxed);
            Some(s)
        }),
    })
}

/// A hot-parameter rule: the previous state (same algorithm, window and bound on values)
/// retuned with its exceptions, or a new one.
fn compile_hot<'a, C: Clock + Clone>(
    h: &'a HotParamRule,
    previous: &Previous<'a, C>,
    clock: &C,
    deferred: &mut Deferred<'a>,
) -> Result<Arc<HotState<C>>, RulesError> {
    let err = rule_error(&h.id);
    let window = h.window.unwrap_or(ONE_SECOND);
    let reused = previous.hot.get(h.id.as_str()).copied().filter(|(c, _)| {
        c.algorithm == h.algorithm
            && c.window.unwrap_or(ONE_SECOND) == window
            && c.max_values == h.max_values
    });
    let spec = |limit| RateSpec {
        burst: h.burst,
        ..RateSpec::new(h.algorithm, limit, window)
    };
    if let Some((c, s)) = reused {
        let base = spec(h.threshold);
        base.check().map_err(&err)?;
        let mut exceptions = Vec::with_capacity(h.exceptions.len());
        for (value, limit) in &h.exceptions {
            let e = spec(*limit);
            e.check().map_err(&err)?;
            exceptions.push((value.as_str(), e));
        }
        let removed: Vec<&str> = c
            .exceptions
            .keys()
            .filter(|v| !h.exceptions.contains_key(*v))
            .map(String::as_str)
            .collect();
        let rate = &s.rate;
        deferred.push(Box::new(move || {
            // Every spec was checked above; the algorithm is the same (the reuse condition):
            // these cannot fail.
            let _ = rate.retune(&base);
            for value in removed {
                rate.remove_exception(value);
            }
            for (value, e) in exceptions {
                let _ = rate.set_exception(value, &e);
            }
        }));
        return Ok(Arc::clone(s));
    }
    let rate = KeyedRate::new(&spec(h.threshold), h.max_values, clock.clone()).map_err(&err)?;
    for (value, limit) in &h.exceptions {
        rate.set_exception(value, &spec(*limit)).map_err(&err)?;
    }
    Ok(Arc::new(HotState {
        rate,
        stats: RuleStats::default(),
        top: parking_lot::Mutex::new(weir_core::TopK::new(TOP_VALUES)),
    }))
}

/// A breaker rule: the previous breaker when the rule is unchanged, else a new one (closed)
/// that logs its transitions.
fn compile_breaker<C: Clock>(
    resource: &str,
    b: &BreakerRule,
    previous: &Previous<'_, C>,
) -> Result<Arc<BreakerState>, RulesError> {
    if let Some((_, s)) = previous
        .breakers
        .get(b.id.as_str())
        .filter(|(c, _)| *c == b)
    {
        return Ok(Arc::clone(s));
    }
    let (resource, id) = (resource.to_string(), b.id.clone());
    let breaker = Breaker::new(b.config())
        .map_err(rule_error(&b.id))?
        .with_observer(move |t: Transition| {
            tracing::info!(
                resource,
                rule = id,
                from = ?t.from,
                to = ?t.to,
                "breaker state changed"
            );
        });
    Ok(Arc::new(BreakerState {
        breaker,
        stats: RuleStats::default(),
    }))
}
