//! [`Rules`]: a rule set in force, swapped whole on a reload with its state kept; switches,
//! shared stores, calendar budgets' counts and statistics.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arc_swap::ArcSwap;
use weir_core::adaptive::cpu::CpuSource;
use weir_core::{Clock, MonotonicClock};

use crate::config::RuleSet;
use crate::keys::KeyShortener;
use crate::metrics::RuleKind;
use crate::metrics::{BreakerSnapshot, HeavySnapshot, RuleSnapshot, RuleStats, Snapshot};
use crate::system::{Inbound, Part};

use crate::budget::SavedCount;
use crate::shared::SharedStore;
use weir_core::clock::{SystemWallClock, WallClock};

use super::compile::compile;
use super::error::{RulesError, UnknownSwitch};
use super::state::{find_switch, ClusterHandle, ClusterQuota, Compiled, Shared, StoreHandle};

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
    pub(super) current: ArcSwap<Compiled<C>>,
    pub(super) shared: Arc<Shared<C>>,
    pub(super) generation: std::sync::atomic::AtomicU64,
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

    pub(super) fn build(
        set: &RuleSet,
        clock: C,
        cpu: Option<Arc<dyn CpuSource>>,
    ) -> Result<Self, RulesError> {
        Self::build_with(set, clock, cpu, Arc::new(SystemWallClock))
    }

    pub(super) fn build_with(
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
    /// the same store counts together); callers then await [`super::Guard::decide_shared`] after
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

    pub(super) fn snapshot_of(&self, changed_only: bool) -> Snapshot {
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
            let mut snap = r.stats.snapshot(name);
            snap.cost.usage_kind = r
                .cost_sources
                .as_ref()
                .and_then(|c| c.actual.as_ref())
                .map(|a| a.usage_kind());
            out.resources.push(snap);
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
