//! A limit stored in Redis: algorithm, quota and key prefix, validated once, plus the local
//! limiter that stands in for it when Redis is unreachable.

use std::sync::Arc;
use std::time::Duration;

use weir_core::cost::Held;
use weir_core::rate::{KeyedRate, RateAlgorithm, RateSpec};
use weir_core::{AnyClock, ClockKind, ConfigError, Decision, Quota};

use crate::scripts;

/// 2^53: integers above it are not exact in Lua's doubles.
const EXACT: u128 = 1 << 53;
/// Most units a sliding-log or concurrency rule may hold (one sorted-set member per unit).
pub const MAX_MEMBER_LIMIT: u64 = 1 << 20;

/// What a [`RedisRule`] limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A rate: units per window under one of weir-core's algorithms (pacing and warm-up
    /// excepted: they wait in process).
    Rate(RateAlgorithm),
    /// At most `limit` units held at once; each lease expires after the window (the lease
    /// TTL) unless released, so a crashed holder's slots come back.
    Concurrency,
}

/// A validated limit: a rate ([`RateSpec`]: `limit` units per `window` under an algorithm)
/// or a concurrency limit, keys `weir:{name:KEY}`.
pub struct RedisRule {
    name: String,
    kind: Kind,
    /// The rate as configured (for a concurrency rule: fixed window of the lease TTL).
    spec: RateSpec,
    quota: Quota,
    /// Algorithm parameters after `limit` (ARGV[5], ARGV[6]).
    params: [u64; 2],
    batch: u64,
    /// The per-instance stand-in used during a fallback (shared with the rules retuned from
    /// this one, so that a new limit keeps the counters).
    local: Arc<KeyedRate<AnyClock>>,
}

/// The local state of a rule taking the parameters of its retuned successor: applied once the
/// whole configuration the successor belongs to is valid (see [`RedisRule::retuned`]).
#[must_use = "the local state keeps the old parameters until the retune is applied"]
pub struct Retune {
    local: Arc<KeyedRate<AnyClock>>,
    spec: RateSpec,
}

impl Retune {
    /// Gives the shared local state its new parameters (every key keeps its state).
    pub fn apply(self) {
        // `spec` was checked by `RedisRule::retuned` and has the same algorithm: cannot fail.
        let _ = self.local.retune(&self.spec);
    }
}

/// Options of a [`RedisRule`] beyond algorithm and quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleOptions {
    /// Instances sharing the limit: the local fallback allows `limit / instances` (at least 1).
    pub instances: u64,
    /// Most keys the local fallback tracks (evicting idle ones first).
    pub local_keys: usize,
    /// Local batching for hot keys: a one-unit request that reaches Redis takes this many units
    /// and serves the rest from this instance for up to a tenth of the window (1 = off, the
    /// default). Over-admission bound: `instances × (batch − 1)` units in any window-length
    /// span; see `docs/redis.md`. Not for concurrency rules.
    pub batch: u64,
    /// The clock of the in-memory limiter (memory store and fallback): exact by default.
    pub clock: ClockKind,
}

impl Default for RuleOptions {
    fn default() -> Self {
        Self {
            instances: 1,
            local_keys: 100_000,
            batch: 1,
            clock: ClockKind::Exact,
        }
    }
}

fn invalid(msg: String) -> ConfigError {
    ConfigError::Invalid(msg)
}

impl RedisRule {
    /// Validates a rate rule. Windows are whole microseconds ≥ 1 ms; every value the script
    /// computes must stay exact in a double. Fixed windows count denied units when the spec
    /// says so ([`RateSpec::count_denied`]: abuse protection, a client hammering a closed
    /// limit stays closed).
    pub fn new(
        name: impl Into<String>,
        spec: &RateSpec,
        options: RuleOptions,
    ) -> Result<Self, ConfigError> {
        Self::build(name.into(), Self::rate_kind(spec)?, spec, options)
    }

    /// Validates a concurrency rule: at most `limit` units held at once, each lease expiring
    /// after `ttl` unless released.
    pub fn concurrency(
        name: impl Into<String>,
        limit: u64,
        ttl: Duration,
        options: RuleOptions,
    ) -> Result<Self, ConfigError> {
        let spec = RateSpec::new(RateAlgorithm::FixedWindow, limit, ttl);
        Self::build(name.into(), Kind::Concurrency, &spec, options)
    }

    fn rate_kind(spec: &RateSpec) -> Result<Kind, ConfigError> {
        match spec.algorithm {
            RateAlgorithm::Pacing | RateAlgorithm::WarmUp => Err(invalid(format!(
                "{} waits in process and has no Redis script",
                spec.algorithm
            ))),
            a => Ok(Kind::Rate(a)),
        }
    }

    fn build(
        name: String,
        kind: Kind,
        spec: &RateSpec,
        options: RuleOptions,
    ) -> Result<Self, ConfigError> {
        let (quota, params, local) = Self::checked(kind, spec, options)?;
        let local = KeyedRate::new(&local, options.local_keys.max(1), options.clock.build()?)?;
        Ok(Self {
            name,
            kind,
            spec: *spec,
            quota,
            params,
            batch: options.batch,
            local: Arc::new(local),
        })
    }

    /// This rule with another limit, burst or counting of denied units — same name, kind,
    /// algorithm and window, so the same Redis keys and state — sharing this rule's local
    /// counters. The local counters take the new parameters when the returned [`Retune`] is
    /// applied (after the rest of the new configuration proved valid; until then this rule is
    /// unchanged).
    pub fn retuned(
        &self,
        spec: &RateSpec,
        options: RuleOptions,
    ) -> Result<(Self, Retune), ConfigError> {
        let kind = match self.kind {
            Kind::Concurrency => Kind::Concurrency,
            Kind::Rate(_) => Self::rate_kind(spec)?,
        };
        if kind != self.kind {
            return Err(invalid(format!(
                "a retune keeps the algorithm ({} → {})",
                self.algorithm_name(),
                spec.algorithm
            )));
        }
        let spec = RateSpec {
            window: self.quota.window(),
            ..*spec
        };
        let (quota, params, local) = Self::checked(kind, &spec, options)?;
        local.check()?;
        let rule = Self {
            name: self.name.clone(),
            kind,
            spec,
            quota,
            params,
            batch: options.batch,
            local: self.local.clone(),
        };
        let retune = Retune {
            local: self.local.clone(),
            spec: local,
        };
        Ok((rule, retune))
    }

    /// Validates a rate rule: its quota, script parameters and local stand-in's spec.
    /// Messages do not name the rule: callers say which one.
    pub fn check(spec: &RateSpec, options: RuleOptions) -> Result<(), ConfigError> {
        Self::checked(Self::rate_kind(spec)?, spec, options)?
            .2
            .check()
    }

    /// The rule's quota, its script's two parameters and its local stand-in's spec.
    fn checked(
        kind: Kind,
        spec: &RateSpec,
        options: RuleOptions,
    ) -> Result<(Quota, [u64; 2], RateSpec), ConfigError> {
        let (limit, window) = (spec.limit, spec.window);
        let quota = Quota::new(limit, window)?;
        let window_us = u64::try_from(window.as_micros()).unwrap_or(u64::MAX);
        Self::check_options(kind, limit, window, window_us, options)?;
        // This instance's share, same algorithm: the fallback while Redis is unreachable.
        let share = limit.div_ceil(options.instances).max(1);
        let local_spec = |alg: RateAlgorithm| RateSpec::new(alg, share, window);
        let (params, local) = match kind {
            Kind::Rate(RateAlgorithm::FixedWindow) => (
                [window_us, 0],
                local_spec(RateAlgorithm::FixedWindow).counting_denied(spec.count_denied),
            ),
            Kind::Rate(RateAlgorithm::SlidingCounter) => (
                sliding_counter_params(limit, window_us)?,
                local_spec(RateAlgorithm::SlidingCounter),
            ),
            Kind::Rate(RateAlgorithm::SlidingWindow) => {
                let buckets = spec.buckets_or_default();
                if buckets == 0 || window_us % u64::from(buckets) != 0 {
                    return Err(invalid(format!(
                        "a window of {window_us} µs does not divide into {buckets} buckets"
                    )));
                }
                (
                    [window_us / u64::from(buckets), u64::from(buckets)],
                    RateSpec {
                        buckets,
                        ..local_spec(RateAlgorithm::SlidingWindow)
                    },
                )
            }
            Kind::Rate(RateAlgorithm::SlidingLog) | Kind::Concurrency
                if limit > MAX_MEMBER_LIMIT =>
            {
                return Err(ConfigError::TooLarge {
                    what: "sliding log / concurrency limit",
                    value: limit,
                    max: MAX_MEMBER_LIMIT,
                });
            }
            Kind::Rate(RateAlgorithm::SlidingLog) => {
                ([window_us, 0], local_spec(RateAlgorithm::SlidingLog))
            }
            Kind::Rate(alg @ (RateAlgorithm::Gcra | RateAlgorithm::TokenBucket)) => {
                let (params, burst) = bucket_params(spec, options, window_us)?;
                let local = RateSpec {
                    burst: Some(burst.div_ceil(options.instances).max(1)),
                    ..local_spec(alg)
                };
                (params, local)
            }
            // Leases are not tracked locally: the fallback admits this instance's share of
            // leases per window.
            Kind::Concurrency => ([window_us, 0], local_spec(RateAlgorithm::FixedWindow)),
            Kind::Rate(alg @ (RateAlgorithm::Pacing | RateAlgorithm::WarmUp)) => {
                // Refused by `rate_kind` before any rule gets here.
                return Err(invalid(format!("{alg} is not a shared algorithm")));
            }
        };
        Ok((quota, params, local))
    }

    /// The window and options every kind needs: whole microseconds, at least 1 ms and short
    /// enough for exact times; a batch within the limit (rates only); at least one instance.
    fn check_options(
        kind: Kind,
        limit: u64,
        window: Duration,
        window_us: u64,
        options: RuleOptions,
    ) -> Result<(), ConfigError> {
        if window < Duration::from_millis(1) || window.subsec_nanos() % 1_000 != 0 {
            return Err(invalid(format!(
                "window must be whole microseconds and at least 1 ms, got {window:?}"
            )));
        }
        if options.batch == 0 || options.batch > limit {
            return Err(invalid(format!(
                "batch must be in [1, limit = {limit}], got {}",
                options.batch
            )));
        }
        if options.batch > 1 && kind == Kind::Concurrency {
            return Err(invalid(
                "batch does not apply to concurrency rules".to_string(),
            ));
        }
        if options.instances == 0 {
            return Err(invalid("instances must be ≥ 1".into()));
        }
        // Times are µs since 2026: stay below 2^53 with room for 100 years of them.
        if u128::from(window_us) * 4 >= EXACT / 8 {
            return Err(invalid("window too long".into()));
        }
        Ok(())
    }

    /// The rule's name (part of every key).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rate's algorithm (`None`: a concurrency rule).
    pub fn algorithm(&self) -> Option<RateAlgorithm> {
        match self.kind {
            Kind::Rate(a) => Some(a),
            Kind::Concurrency => None,
        }
    }

    /// The algorithm's name, `concurrency` for a concurrency rule.
    pub fn algorithm_name(&self) -> &'static str {
        match self.kind {
            Kind::Rate(a) => a.as_str(),
            Kind::Concurrency => "concurrency",
        }
    }

    /// The rate as configured (a concurrency rule: a fixed window of the lease TTL).
    pub fn spec(&self) -> &RateSpec {
        &self.spec
    }

    /// Units per window.
    pub fn limit(&self) -> u64 {
        self.quota.limit()
    }

    /// The window (lease TTL for concurrency rules).
    pub fn window(&self) -> Duration {
        self.quota.window()
    }

    /// The Redis keys of `key`: the state, and a second key in the same slot (sliding log's
    /// sequence counter).
    pub fn keys(&self, key: &str) -> [String; 2] {
        let base = format!("weir:{{{}:{}}}", self.name, key);
        let seq = format!("{base}:seq");
        [base, seq]
    }

    pub(crate) fn script(&self) -> &'static redis::Script {
        match self.kind {
            Kind::Rate(RateAlgorithm::FixedWindow) => &scripts::FIXED_WINDOW,
            Kind::Rate(RateAlgorithm::SlidingCounter) => &scripts::SLIDING_COUNTER,
            Kind::Rate(RateAlgorithm::SlidingWindow) => &scripts::SLIDING_WINDOW,
            Kind::Rate(RateAlgorithm::SlidingLog) => &scripts::SLIDING_LOG,
            Kind::Rate(RateAlgorithm::Gcra) => &scripts::GCRA,
            Kind::Rate(RateAlgorithm::TokenBucket) => &scripts::TOKEN_BUCKET,
            Kind::Concurrency => &scripts::CONCURRENCY,
            // Refused when the rule was built.
            Kind::Rate(RateAlgorithm::Pacing | RateAlgorithm::WarmUp) => &scripts::FIXED_WINDOW,
        }
    }

    pub(crate) fn params(&self) -> [u64; 2] {
        self.params
    }

    pub(crate) fn count_denied(&self) -> bool {
        self.kind != Kind::Concurrency && self.spec.count_denied
    }

    /// Whether denied units are counted too ([`RateSpec::count_denied`]).
    pub fn counts_denied(&self) -> bool {
        self.count_denied()
    }

    /// Units taken per round trip for one-unit requests (1 = no local batching).
    pub fn batch(&self) -> u64 {
        self.batch
    }

    /// Whether a cost reservation on this rule is settled ([`crate::RedisLimiter::settle`]):
    /// GCRA, the token bucket and the fixed window; on the others a reservation is a plain
    /// acquire.
    pub fn settles(&self) -> bool {
        self.settle_kind().is_some()
    }

    /// The settle script's family for this rule's state.
    pub(crate) fn settle_kind(&self) -> Option<&'static str> {
        match self.kind {
            Kind::Rate(RateAlgorithm::Gcra | RateAlgorithm::TokenBucket) => Some("time"),
            Kind::Rate(RateAlgorithm::FixedWindow) => Some("window"),
            _ => None,
        }
    }

    /// Charges `units` to the local stand-in now, whatever its limit (an excess Redis could
    /// not be told of).
    pub(crate) fn local_charge(&self, key: &str, units: u64) {
        let nothing_held = Held {
            estimate: 0,
            taken: 0,
        };
        self.local_settle(key, nothing_held, units);
    }

    /// The local stand-in's time now.
    pub(crate) fn local_now(&self) -> weir_core::Nanos {
        self.local.now()
    }

    /// Settles a reservation of the local stand-in now.
    pub(crate) fn local_settle(&self, key: &str, held: Held, actual: u64) {
        self.local.settle_at(key, held, actual, self.local.now());
    }

    /// This instance's local decision for `key` (the fallback).
    pub fn local_acquire(&self, key: &str, n: u64) -> Decision {
        self.local.acquire(key, n)
    }

    /// [`RedisRule::local_acquire`] at a time the caller read once for a whole request (every
    /// call on one rule must use the same time base).
    pub fn local_acquire_at(&self, key: &str, n: u64, now: weir_core::Nanos) -> Decision {
        self.local.acquire_at(key, n, now)
    }
}

impl std::fmt::Debug for RedisRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRule")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}
/// A sliding counter's script parameters: the window in its resolution, and the resolution
/// (µs, or ms when prev · w and limit · w would not be exact in µs).
fn sliding_counter_params(limit: u64, window_us: u64) -> Result<[u64; 2], ConfigError> {
    let res = if u128::from(limit) * u128::from(window_us) < EXACT {
        1
    } else {
        1_000
    };
    if u128::from(limit) * u128::from(window_us / res) >= EXACT {
        return Err(invalid(
            "limit × window (ms) must be below 2^53".to_string(),
        ));
    }
    if window_us % res != 0 {
        return Err(invalid(
            "a window this long must be whole milliseconds".to_string(),
        ));
    }
    Ok([window_us / res, res])
}

/// GCRA's and the token bucket's script parameters (the interval and the burst), and the
/// burst.
fn bucket_params(
    spec: &RateSpec,
    options: RuleOptions,
    window_us: u64,
) -> Result<([u64; 2], u64), ConfigError> {
    let burst = spec.burst_or_limit();
    if burst == 0 {
        return Err(ConfigError::ZeroBurst);
    }
    if options.batch > burst {
        return Err(invalid(format!(
            "batch {} exceeds burst {burst}",
            options.batch
        )));
    }
    let interval = window_us.div_ceil(spec.limit).max(1);
    if u128::from(burst + spec.limit) * u128::from(interval) >= EXACT / 8 {
        return Err(invalid(
            "burst × interval too large to be exact".to_string(),
        ));
    }
    Ok(([interval, burst], burst))
}
