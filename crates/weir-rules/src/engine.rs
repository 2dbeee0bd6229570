//! Deciding calls to resources under a rule set, and swapping rule sets without losing state.
//!
//! Order of checks (Sentinel's slot order): authority, hot parameters, flow, breaker. A call
//! that passes them all gets a [`Guard`]; completing it reports the outcome (breaker) and
//! releases the concurrency slot; dropping it releases the slot too. A blocked call gets a
//! [`Block`] naming the rule, its kind and when to retry. Rules in shadow mode are evaluated
//! and counted, never block. The pass path of a configured resource does not allocate
//! (hot-parameter rules allocate the value's key only when the value is new to the table).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use weir_core::breaker::{Breaker, BreakerConfig, Call};
use weir_core::stats::Outcome;
use weir_core::{
    Clock, ConcurrencyConfig, ConcurrencyLimiter, ConfigError, Criticality, MonotonicClock, Permit,
    QueueOrder,
};

use crate::config::{AuthorityRule, BreakerPreset, BreakerRule, FlowRule, HotParamRule, RuleSet};
use crate::rate::{KeyedRate, RateSpec};

/// Who calls and with what: the origin (caller), the criticality and the parameters that
/// hot-parameter rules look at.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The caller's name (`""` when unknown).
    pub origin: &'a str,
    /// The call's criticality.
    pub criticality: Criticality,
    /// Parameters by position (user id, IP, tenant …).
    pub params: &'a [&'a str],
}

impl Default for Context<'_> {
    fn default() -> Self {
        Self {
            origin: "",
            criticality: Criticality::Critical,
            params: &[],
        }
    }
}

/// The kind of rule that blocked a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    /// A flow rule (rate or concurrency).
    Flow,
    /// A hot-parameter rule.
    HotParam,
    /// An authority rule.
    Authority,
    /// A circuit breaker.
    Breaker,
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
}

/// Counters of one rule.
#[derive(Debug, Default)]
pub struct RuleStats {
    /// Calls it let through.
    pub passes: AtomicU64,
    /// Calls it blocked.
    pub blocks: AtomicU64,
    /// Calls it would have blocked in shadow mode.
    pub shadow_blocks: AtomicU64,
}

/// State of a flow rule, shared across reloads while the rule keeps its id and kind.
struct FlowState<C: Clock> {
    rate: Option<KeyedRate<C>>,
    concurrency: Option<ConcurrencyLimiter>,
    stats: RuleStats,
}

struct HotState<C: Clock> {
    rate: KeyedRate<C>,
    stats: RuleStats,
}

struct BreakerState {
    breaker: Breaker,
    stats: RuleStats,
}

struct Resource<C: Clock> {
    authority: Option<(AuthorityRule, Arc<str>, Arc<RuleStats>)>,
    hot: Vec<(HotParamRule, Arc<HotState<C>>, Arc<str>)>,
    flows: Vec<(FlowRule, Arc<FlowState<C>>, Arc<str>)>,
    breaker: Option<(BreakerRule, Arc<BreakerState>, Arc<str>)>,
}

struct Compiled<C: Clock> {
    resources: HashMap<String, Arc<Resource<C>>>,
    /// What a resource without rules gets (no allocation per call).
    empty: Arc<Resource<C>>,
}

/// A call admitted to a resource. [`Guard::complete`] reports how it ended; dropping it without
/// that releases the concurrency slot and reports nothing.
#[must_use = "complete the guard with the call's outcome"]
pub struct Guard<C: Clock = MonotonicClock> {
    resource: Arc<Resource<C>>,
    permit: Option<Permit>,
    call: Option<Call>,
    clock: C,
}

impl<C: Clock> Guard<C> {
    /// The call ended with `outcome` (its duration is measured from the entry).
    pub fn complete(mut self, outcome: Outcome) {
        if let (Some(call), Some((_, b, _))) = (self.call.take(), &self.resource.breaker) {
            b.breaker.record(call, self.clock.now(), outcome);
        }
        self.permit.take();
    }
}

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

/// The rules in force. `Send + Sync`; share it (e.g. in an `Arc`).
pub struct Rules<C: Clock + Clone = MonotonicClock> {
    current: RwLock<Arc<Compiled<C>>>,
    clock: C,
}

impl Rules<MonotonicClock> {
    /// Rules on the real clock.
    pub fn new(set: &RuleSet) -> Result<Self, RulesError> {
        Self::with_clock(set, MonotonicClock::new())
    }
}

impl<C: Clock + Clone> Rules<C> {
    /// Rules reading `clock`.
    pub fn with_clock(set: &RuleSet, clock: C) -> Result<Self, RulesError> {
        let compiled = compile(set, None, &clock)?;
        Ok(Self {
            current: RwLock::new(Arc::new(compiled)),
            clock,
        })
    }

    /// Swaps in `set` atomically (all of it or, on error, none of it). Unchanged rules keep
    /// their state; a rate rule whose threshold or burst changed keeps its counters; a
    /// concurrency rule keeps its holders; a breaker whose configuration is unchanged keeps
    /// its state.
    pub fn apply(&self, set: &RuleSet) -> Result<(), RulesError> {
        let old = self.current.read().clone();
        let compiled = compile(set, Some(&old), &self.clock)?;
        *self.current.write() = Arc::new(compiled);
        Ok(())
    }

    /// Admits a call to `resource`, or says which rule blocked it. Resources without rules
    /// always pass.
    pub fn entry(&self, resource: &str, ctx: &Context<'_>) -> Result<Guard<C>, Block> {
        let compiled = self.current.read().clone();
        let Some(res) = compiled.resources.get(resource).cloned() else {
            return Ok(Guard {
                resource: compiled.empty.clone(),
                permit: None,
                call: None,
                clock: self.clock.clone(),
            });
        };
        let now = self.clock.now();
        if let Some((a, id, stats)) = &res.authority {
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
            })?;
        }
        for (config, h, id) in &res.hot {
            let Some(value) = ctx.params.get(config.param) else {
                continue;
            };
            let d = h.rate.acquire(value, 1);
            verdict(d.allowed(), config.shadow, &h.stats, || Block {
                rule: id.clone(),
                kind: RuleKind::HotParam,
                retry_after: d.retry_after(),
            })?;
        }
        let mut permit = None;
        for (config, f, id) in &res.flows {
            if let Some(rate) = &f.rate {
                let d = rate.acquire(FLOW_KEY, 1);
                verdict(d.allowed(), config.shadow, &f.stats, || Block {
                    rule: id.clone(),
                    kind: RuleKind::Flow,
                    retry_after: d.retry_after(),
                })?;
            } else if let Some(c) = &f.concurrency {
                match c.try_acquire_as(1, ctx.criticality) {
                    Ok(p) => {
                        f.stats.passes.fetch_add(1, Ordering::Relaxed);
                        permit = Some(p);
                    }
                    Err(d) => verdict(false, config.shadow, &f.stats, || Block {
                        rule: id.clone(),
                        kind: RuleKind::Flow,
                        retry_after: d.retry_after(),
                    })?,
                }
            }
        }
        let mut call = None;
        if let Some((config, b, id)) = &res.breaker {
            match b.breaker.try_acquire(now) {
                Ok(c) => {
                    b.stats.passes.fetch_add(1, Ordering::Relaxed);
                    call = Some(c);
                }
                Err(r) => verdict(false, config.shadow, &b.stats, || Block {
                    rule: id.clone(),
                    kind: RuleKind::Breaker,
                    retry_after: Some(r.retry_after),
                })?,
            }
        }
        Ok(Guard {
            resource: res,
            permit,
            call,
            clock: self.clock.clone(),
        })
    }

    /// Counters of the rule `id` (passes, blocks, shadow blocks) and, for hot-parameter
    /// rules, values evicted at `max_values`.
    pub fn stats(&self, id: &str) -> Option<(u64, u64, u64, u64)> {
        let c = self.current.read().clone();
        let load = |s: &RuleStats| {
            (
                s.passes.load(Ordering::Relaxed),
                s.blocks.load(Ordering::Relaxed),
                s.shadow_blocks.load(Ordering::Relaxed),
            )
        };
        for r in c.resources.values() {
            if let Some((a, _, s)) = &r.authority {
                if a.id == id {
                    let (p, b, sh) = load(s);
                    return Some((p, b, sh, 0));
                }
            }
            for (config, h, _) in &r.hot {
                if config.id == id {
                    let (p, b, sh) = load(&h.stats);
                    return Some((p, b, sh, h.rate.evictions()));
                }
            }
            for (config, f, _) in &r.flows {
                if config.id == id {
                    let (p, b, sh) = load(&f.stats);
                    return Some((p, b, sh, 0));
                }
            }
            if let Some((config, b, _)) = &r.breaker {
                if config.id == id {
                    let (p, bl, sh) = load(&b.stats);
                    return Some((p, bl, sh, 0));
                }
            }
        }
        None
    }
}

/// Counts the verdict; blocks unless allowed or in shadow mode.
fn verdict(
    allowed: bool,
    shadow: bool,
    stats: &RuleStats,
    block: impl FnOnce() -> Block,
) -> Result<(), Block> {
    if allowed {
        stats.passes.fetch_add(1, Ordering::Relaxed);
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

/// The one key of a flow rule's limiter. Not `""`: an empty `String` has a dangling pointer,
/// and glibc's AVX-512 `memcmp` of length 0 on it costs ≈ 75 ns here (a masked load on an
/// unmapped page); the pass path measured 154 ns with `""` (benches/entry.rs).
const FLOW_KEY: &str = "flow";

fn breaker_config(r: &BreakerRule) -> BreakerConfig {
    let mut c = match r.preset.unwrap_or(BreakerPreset::Resilience4j) {
        BreakerPreset::Hystrix => BreakerConfig::hystrix(),
        BreakerPreset::Sentinel => BreakerConfig::sentinel(),
        BreakerPreset::Resilience4j => BreakerConfig::resilience4j(),
    };
    if let Some(x) = r.error_ratio {
        c.error_ratio = Some(x);
    }
    if let Some(x) = r.min_calls {
        c.min_calls = x;
    }
    if let Some(x) = r.open_for {
        c.open_duration = x;
    }
    c
}

fn compile<C: Clock + Clone>(
    set: &RuleSet,
    old: Option<&Compiled<C>>,
    clock: &C,
) -> Result<Compiled<C>, RulesError> {
    set.validate().map_err(|(p, r)| RulesError::Invalid(p, r))?;
    let err = |id: &str| {
        let id = id.to_string();
        move |e: ConfigError| RulesError::Rule(id.clone(), e)
    };
    // The previous rules' configurations and states, by id.
    let mut old_flows = HashMap::new();
    let mut old_hot = HashMap::new();
    let mut old_breakers = HashMap::new();
    if let Some(old) = old {
        for r in old.resources.values() {
            for (c, f, _) in &r.flows {
                old_flows.insert(c.id.clone(), (c, f));
            }
            for (c, h, _) in &r.hot {
                old_hot.insert(c.id.clone(), (c, h));
            }
            if let Some((c, b, _)) = &r.breaker {
                old_breakers.insert(c.id.clone(), (c, b));
            }
        }
    }
    let mut resources = HashMap::new();
    for r in &set.resources {
        let mut flows = Vec::new();
        for f in &r.flow {
            let window = f.window.unwrap_or(ONE_SECOND);
            // Same id, algorithm, window and kind: keep the state, retune the threshold.
            let reused = old_flows.get(&f.id).filter(|(c, _)| {
                c.algorithm == f.algorithm
                    && c.window.unwrap_or(ONE_SECOND) == window
                    && c.qps.is_some() == f.qps.is_some()
            });
            let state = match (reused, f.qps, f.concurrency) {
                (Some((_, s)), Some(qps), _) => {
                    if let Some(rate) = &s.rate {
                        let spec = RateSpec {
                            burst: f.burst,
                            ..RateSpec::new(f.algorithm, qps, window)
                        };
                        rate.retune(&spec).map_err(err(&f.id))?;
                    }
                    Arc::clone(s)
                }
                (Some((_, s)), None, Some(n)) => {
                    if let Some(c) = &s.concurrency {
                        c.set_max_in_flight(n);
                    }
                    Arc::clone(s)
                }
                (_, Some(qps), _) => Arc::new(FlowState {
                    rate: Some({
                        let spec = RateSpec {
                            burst: f.burst,
                            ..RateSpec::new(f.algorithm, qps, window)
                        };
                        KeyedRate::new(&spec, 1, clock.clone()).map_err(err(&f.id))?
                    }),
                    concurrency: None,
                    stats: RuleStats::default(),
                }),
                (_, None, n) => Arc::new(FlowState {
                    rate: None,
                    concurrency: Some(
                        ConcurrencyLimiter::with_config(ConcurrencyConfig {
                            max_in_flight: n.unwrap_or(1),
                            max_queue: 0,
                            order: QueueOrder::Fifo,
                            shares: None,
                        })
                        .map_err(err(&f.id))?,
                    ),
                    stats: RuleStats::default(),
                }),
            };
            flows.push((f.clone(), state, Arc::from(f.id.as_str())));
        }
        let mut hot = Vec::new();
        for h in &r.hot_params {
            let window = h.window.unwrap_or(ONE_SECOND);
            let reused = old_hot.get(&h.id).filter(|(c, _)| {
                c.algorithm == h.algorithm
                    && c.window.unwrap_or(ONE_SECOND) == window
                    && c.max_values == h.max_values
            });
            let spec = |limit| RateSpec::new(h.algorithm, limit, window);
            let state = match reused {
                Some((c, s)) => {
                    s.rate.retune(&spec(h.threshold)).map_err(err(&h.id))?;
                    for value in c
                        .exceptions
                        .keys()
                        .filter(|v| !h.exceptions.contains_key(*v))
                    {
                        s.rate.remove_exception(value);
                    }
                    for (value, limit) in &h.exceptions {
                        s.rate
                            .set_exception(value, &spec(*limit))
                            .map_err(err(&h.id))?;
                    }
                    Arc::clone(s)
                }
                None => {
                    let rate = KeyedRate::new(&spec(h.threshold), h.max_values, clock.clone())
                        .map_err(err(&h.id))?;
                    for (value, limit) in &h.exceptions {
                        rate.set_exception(value, &spec(*limit))
                            .map_err(err(&h.id))?;
                    }
                    Arc::new(HotState {
                        rate,
                        stats: RuleStats::default(),
                    })
                }
            };
            hot.push((h.clone(), state, Arc::from(h.id.as_str())));
        }
        let breaker = match &r.breaker {
            Some(b) => {
                let state = match old_breakers.get(&b.id).filter(|(c, _)| *c == b) {
                    Some((_, s)) => Arc::clone(s),
                    None => Arc::new(BreakerState {
                        breaker: Breaker::new(breaker_config(b)).map_err(err(&b.id))?,
                        stats: RuleStats::default(),
                    }),
                };
                Some((b.clone(), state, Arc::from(b.id.as_str())))
            }
            None => None,
        };
        let authority = r.authority.as_ref().map(|a| {
            (
                a.clone(),
                Arc::from(a.id.as_str()),
                Arc::new(RuleStats::default()),
            )
        });
        resources.insert(
            r.name.clone(),
            Arc::new(Resource {
                authority,
                hot,
                flows,
                breaker,
            }),
        );
    }
    let empty = Arc::new(Resource {
        authority: None,
        hot: Vec::new(),
        flows: Vec::new(),
        breaker: None,
    });
    Ok(Compiled { resources, empty })
}
