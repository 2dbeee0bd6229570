//! A rule set compiled into the state the engine decides on, keeping the state of rules that
//! did not change from the rule set before it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use weir_core::breaker::{Breaker, Transition};
use weir_core::{Clock, ConcurrencyConfig, ConcurrencyLimiter, ConfigError, QueueOrder};

use crate::config::{
    Behavior, BreakerRule, EstimateFrom, FlowRule, HotParamRule, RateAlgorithm, RuleSet,
    DEFAULT_MAX_WAIT, DEFAULT_WARMUP, OTHER_ORIGIN,
};
use crate::metrics::{ResourceStats, RuleStats};
use crate::system::System;
use weir_core::rate::{KeyedRate, RateSpec, SingleRate};

use crate::budget::BudgetInForce;
use crate::shared::SharedRule;

use super::error::RulesError;
use super::state::{
    cluster_fallback, BreakerState, Compiled, Flow, FlowState, HotState, Origins, Resource,
    ResourceMap, Shared, Switch, MAX_OTHER_ORIGINS, ONE_SECOND, TOP_VALUES,
};

/// A rate spec for a flow rule's `qps` (behaviour and algorithm applied).
pub(super) fn flow_spec(f: &FlowRule, qps: u64, window: Duration) -> RateSpec {
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

/// The previous rule set's configurations and states, by rule id, and its resources'
/// statistics by name: what a new set keeps.
pub(super) struct Previous<'a, C: Clock> {
    pub(super) flows: HashMap<&'a str, (&'a FlowRule, &'a Arc<FlowState<C>>)>,
    pub(super) hot: HashMap<&'a str, (&'a HotParamRule, &'a Arc<HotState<C>>)>,
    pub(super) breakers: HashMap<&'a str, (&'a BreakerRule, &'a Arc<BreakerState>)>,
    pub(super) authority: HashMap<&'a str, &'a Arc<RuleStats>>,
    pub(super) switches:
        HashMap<&'a str, (&'a Arc<std::sync::atomic::AtomicBool>, &'a Arc<RuleStats>)>,
    pub(super) stats: HashMap<&'a str, Arc<ResourceStats>>,
    pub(super) budgets: HashMap<&'a str, &'a BudgetInForce>,
}

impl<'a, C: Clock> Previous<'a, C> {
    pub(super) fn of(old: Option<&'a Compiled<C>>) -> Self {
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
pub(super) type Deferred<'a> = Vec<Box<dyn FnOnce() + 'a>>;

/// A rule's error with its id.
pub(super) fn rule_error(id: &str) -> impl Fn(ConfigError) -> RulesError + '_ {
    move |e| RulesError::Rule(id.to_string(), e)
}

pub(super) fn compile<C: Clock + Clone>(
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
pub(super) fn compile_resource<'a, C: Clock + Clone>(
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
pub(super) fn compile_flow<'a, C: Clock + Clone>(
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
        (Some((c, s)), Some(spec), _) => kept_rate(f, c, s, spec, deferred)?,
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
            concurrency: Some(new_concurrency(n.unwrap_or(1)).map_err(&err)?),
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

/// A kept rate rule's state under new parameters (same algorithm and window: the reuse
/// condition): a keyed rate retuned once the whole set compiled, a single limiter replaced by
/// one starting from its state when a parameter changed.
fn kept_rate<'a, C: Clock + Clone>(
    f: &FlowRule,
    c: &FlowRule,
    s: &'a Arc<FlowState<C>>,
    spec: RateSpec,
    deferred: &mut Deferred<'a>,
) -> Result<Arc<FlowState<C>>, RulesError> {
    let err = rule_error(&f.id);
    if let Some(rate) = &s.rate {
        spec.check().map_err(&err)?;
        deferred.push(Box::new(move || {
            // Checked above, same algorithm (the reuse condition).
            let _ = rate.retune(&spec);
        }));
        return Ok(Arc::clone(s));
    }
    let changed = c.qps != f.qps
        || c.burst != f.burst
        || c.max_wait != f.max_wait
        || c.warmup != f.warmup
        || c.cold_factor != f.cold_factor;
    match s.single.as_ref().filter(|_| changed) {
        // New parameters: a new limiter starting from the old one's state.
        Some(single) => Ok(Arc::new(FlowState {
            single: Some(single.retuned(&spec).map_err(&err)?),
            stats: s.stats.clone(),
            ..FlowState::empty()
        })),
        None => Ok(Arc::clone(s)),
    }
}

/// A concurrency rule's limiter: `max_in_flight` calls, none queued.
fn new_concurrency(max_in_flight: u64) -> Result<ConcurrencyLimiter, ConfigError> {
    ConcurrencyLimiter::with_config(ConcurrencyConfig {
        max_in_flight,
        max_queue: 0,
        order: QueueOrder::Fifo,
        shares: None,
    })
}

/// A hot-parameter rule: the previous state (same algorithm, window and bound on values)
/// retuned with its exceptions, or a new one.
pub(super) fn compile_hot<'a, C: Clock + Clone>(
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
pub(super) fn compile_breaker<C: Clock>(
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
