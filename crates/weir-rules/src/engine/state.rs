//! The compiled state of a rule set in force: resources with their flow, hot-parameter and
//! breaker rules, switches, the shared parts every rule set of a [`super::Rules`] keeps
//! (clocks, the inbound window, the cluster and shared stores).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use weir_core::breaker::Breaker;
use weir_core::{Clock, ConcurrencyLimiter, MonotonicClock, Nanos};

use crate::config::{AuthorityRule, BreakerRule, CostSources, FlowRule, HotParamRule, RuleSet};
use crate::keys::KeyShortener;
use crate::metrics::{ResourceStats, RuleStats};
use crate::system::{Inbound, System};
use weir_core::cost::Held;
use weir_core::rate::{KeyedRate, SingleRate};

use crate::budget::BudgetInForce;
use crate::shared::{SharedRule, SharedStore};
use weir_core::clock::WallClock;

use super::error::UnknownSwitch;

/// Who a flow rule counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Origins {
    /// Every call together.
    All,
    /// Calls from this origin.
    Named(Box<str>),
    /// Calls from origins no other flow rule of the resource names, each counted on its own.
    Other,
}

/// State of a flow rule, shared across reloads while the rule keeps its id and kind.
pub(super) struct FlowState<C: Clock> {
    /// All calls (or one named origin's) together: one limiter, no key.
    pub(super) single: Option<SingleRate<C>>,
    /// `origin: other`: a limiter per calling origin.
    pub(super) rate: Option<KeyedRate<C>>,
    pub(super) concurrency: Option<ConcurrencyLimiter>,
    /// Shared with the rule's next state when a reload retunes it.
    pub(super) stats: Arc<RuleStats>,
}

impl<C: Clock> FlowState<C> {
    pub(super) fn empty() -> Self {
        Self {
            single: None,
            rate: None,
            concurrency: None,
            stats: Arc::default(),
        }
    }
}

pub(super) struct Flow<C: Clock> {
    pub(super) config: FlowRule,
    pub(super) id: Arc<str>,
    pub(super) state: Arc<FlowState<C>>,
    pub(super) origins: Origins,
    /// Relate strategy: the resource whose passes count.
    pub(super) relate: Option<Arc<ResourceStats>>,
    /// `shared: true`: counted in the shared store when there is one.
    pub(super) shared: Option<Arc<SharedRule>>,
}

impl<C: Clock> Flow<C> {
    /// The most one call counts for under `cost:`: its `max`, else the burst, else `qps`
    /// (a cluster rule: no bound but `max`).
    pub(super) fn cost_cap(&self) -> u64 {
        // A cluster rule's lease has its own rate: no cap but `max`.
        let max = match self.config.cluster {
            Some(_) => u64::MAX,
            None => self.config.burst.or(self.config.qps).unwrap_or(1),
        };
        self.config.cost.as_ref().and_then(|c| c.max).unwrap_or(max)
    }
}

/// A hot-parameter rule in force: its configuration, state, id and shared form.
pub(super) type HotRule<C> = (
    HotParamRule,
    Arc<HotState<C>>,
    Arc<str>,
    Option<Arc<SharedRule>>,
);

pub(super) struct HotState<C: Clock> {
    pub(super) rate: KeyedRate<C>,
    pub(super) stats: RuleStats,
    /// The values it blocked most (recorded on the block path only, skipped when contended).
    pub(super) top: parking_lot::Mutex<weir_core::TopK>,
}

/// Blocked values kept per hot-parameter rule.
pub const TOP_VALUES: usize = 10;

pub(super) struct BreakerState {
    pub(super) breaker: Breaker,
    pub(super) stats: RuleStats,
}

pub(super) struct Resource<C: Clock> {
    /// The rules' clock (here so a guard needs no copy of it).
    pub(super) clock: C,
    pub(super) stats: Arc<ResourceStats>,
    pub(super) authority: Option<(AuthorityRule, Arc<str>, Arc<RuleStats>)>,
    /// With its shared form when it says `shared: true`.
    pub(super) hot: Vec<HotRule<C>>,
    pub(super) flows: Vec<Flow<C>>,
    /// Origins named by this resource's flow rules (what `other` excludes).
    pub(super) named_origins: Vec<Box<str>>,
    pub(super) breaker: Option<(BreakerRule, Arc<BreakerState>, Arc<str>)>,
    pub(super) switch: Option<Switch>,
    /// Where HTTP calls state their costs, when its `cost:` rules say.
    pub(super) cost_sources: Option<Arc<CostSources>>,
    /// A `cost:` rule learns its estimate from the resource's recent costs.
    pub(super) learns: bool,
    /// Calendar budgets, decided after every other rule.
    pub(super) budgets: Vec<BudgetInForce>,
}

/// A compiled switch: its state is shared by every rule set with the same id, so a run-time
/// change and a reload never race.
pub(super) struct Switch {
    pub(super) id: Arc<str>,
    pub(super) on: Arc<std::sync::atomic::AtomicBool>,
    pub(super) stats: Arc<RuleStats>,
}

/// Resource names to resources (foldhash: a quarter of SipHash's cost on short names).
pub(super) type ResourceMap<C> = HashMap<String, Arc<Resource<C>>, foldhash::fast::RandomState>;

pub(super) struct Compiled<C: Clock> {
    /// A resource's `cost:` rules say where HTTP calls state costs.
    pub(super) states_costs: bool,
    /// A resource's `cost:` rules read estimates from JSON request bodies.
    pub(super) reads_json: bool,
    pub(super) resources: ResourceMap<C>,
    pub(super) system: Option<System<C>>,
    /// The rule set it was compiled from.
    pub(super) set: Arc<RuleSet>,
}

/// One resource of a rule set in force, looked up once (see [`super::Rules::resolve`]).
pub struct Resolved<C: Clock = MonotonicClock> {
    pub(super) compiled: Arc<Compiled<C>>,
    pub(super) resource: Option<Arc<Resource<C>>>,
}

impl<C: Clock> Resolved<C> {
    /// Where HTTP calls to the resource state their costs (see [`super::Guard::cost_sources`]).
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

/// The shared store, as the rules keep it.
pub(super) struct StoreHandle(pub(super) Box<dyn SharedStore>);

/// What the rules and their guards share.
pub(super) struct Shared<C: Clock> {
    pub(super) inbound: Inbound,
    pub(super) clock: C,
    /// Where cluster flow rules get their decisions (see [`Rules::set_cluster`]).
    pub(super) cluster: arc_swap::ArcSwapOption<ClusterHandle>,
    /// Where `shared: true` rules are counted (see [`Rules::set_shared`]).
    pub(super) store: arc_swap::ArcSwapOption<StoreHandle>,
    /// Long keys are stored as a seeded digest (see `keys`).
    pub(super) keys: KeyShortener,
    /// Switch states set at run time, by id: they win over the file's `on` across reloads.
    pub(super) switches: parking_lot::Mutex<HashMap<String, bool>>,
    /// The calendar budgets' clock.
    pub(super) wall: Arc<dyn WallClock>,
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
pub(super) fn cluster_fallback<C: Clock + Clone>(
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

/// The compiled switch `id`.
pub(super) fn find_switch<'a, C: Clock>(
    c: &'a Compiled<C>,
    id: &str,
) -> Result<&'a Switch, UnknownSwitch> {
    c.resources
        .values()
        .filter_map(|r| r.switch.as_ref())
        .find(|sw| &*sw.id == id)
        .ok_or_else(|| UnknownSwitch(id.to_string()))
}

pub(super) const ONE_SECOND: Duration = Duration::from_secs(1);

/// Distinct origins counted by one `origin: other` rule at most.
pub(super) const MAX_OTHER_ORIGINS: usize = 4096;

/// The key `origin: other` rules count calls without an origin under.
pub(super) const UNKNOWN_ORIGIN: &str = "(unknown)";
