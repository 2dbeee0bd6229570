//! A limit stored in Redis: algorithm, quota and key prefix, validated once, plus the local
//! limiter that stands in for it when Redis is unreachable.

use std::sync::Arc;
use std::time::Duration;

use weir_core::{AnyClock, ClockKind, ConfigError, Decision, Quota};
use weir_rules::rate::{KeyedRate, RateAlgorithm, RateSpec};

use crate::scripts;

/// 2^53: integers above it are not exact in Lua's doubles.
const EXACT: u128 = 1 << 53;
/// Most units a sliding-log or concurrency rule may hold (one sorted-set member per unit).
pub const MAX_MEMBER_LIMIT: u64 = 1 << 20;

/// The algorithm a [`RedisRule`] runs in Redis (and locally during a fallback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisAlgorithm {
    /// Counter per aligned window; up to 2 × limit across a boundary.
    FixedWindow,
    /// Previous window weighted by overlap (Cloudflare); approximate.
    SlidingCounter,
    /// Bucketed sliding window (Sentinel's LeapArray) with `buckets` sub-windows.
    SlidingWindow {
        /// Sub-windows (10 by default in weir-core); the window must divide into whole µs.
        buckets: u32,
    },
    /// Exact sliding window, a sorted set bounded to the limit.
    SlidingLog,
    /// GCRA with `burst` units at once.
    Gcra {
        /// Units that may pass at once.
        burst: u64,
    },
    /// Token bucket (Guava SmoothBursty semantics, never waits) with capacity `burst`.
    TokenBucket {
        /// Bucket capacity.
        burst: u64,
    },
    /// At most `limit` units held at once; each lease expires after the window (the lease TTL)
    /// unless released, so a crashed holder's slots come back.
    Concurrency,
}

impl RedisAlgorithm {
    /// Stable lower-case name (`fixed_window`, `gcra`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Self::FixedWindow => "fixed_window",
            Self::SlidingCounter => "sliding_counter",
            Self::SlidingWindow { .. } => "sliding_window",
            Self::SlidingLog => "sliding_log",
            Self::Gcra { .. } => "gcra",
            Self::TokenBucket { .. } => "token_bucket",
            Self::Concurrency => "concurrency",
        }
    }
}

/// A validated limit: `limit` units per `window` under `algorithm`, keys `weir:{name:KEY}`.
pub struct RedisRule {
    name: String,
    algorithm: RedisAlgorithm,
    quota: Quota,
    /// Algorithm parameters after `limit` (ARGV[5], ARGV[6]).
    params: [u64; 2],
    count_denied: bool,
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
    /// Count denied requests too (abuse protection: a client hammering a closed limit stays
    /// closed). Default false: denied requests consume nothing.
    pub count_denied: bool,
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
            count_denied: false,
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
    /// Validates a rule. Windows are whole microseconds ≥ 1 ms; every value the script computes
    /// must stay exact in a double.
    pub fn new(
        name: impl Into<String>,
        algorithm: RedisAlgorithm,
        limit: u64,
        window: Duration,
        options: RuleOptions,
    ) -> Result<Self, ConfigError> {
        let name = name.into();
        let (quota, params, local) = Self::checked(algorithm, limit, window, options)?;
        let local = KeyedRate::new(&local, options.local_keys.max(1), options.clock.build()?)?;
        Ok(Self {
            name,
            algorithm,
            quota,
            params,
            count_denied: options.count_denied,
            batch: options.batch,
            local: Arc::new(local),
        })
    }

    /// This rule with another limit or algorithm parameter (burst) — same name, algorithm and
    /// window, so the same Redis keys and state — sharing this rule's local counters. The
    /// local counters take the new parameters when the returned [`Retune`] is applied (after
    /// the rest of the new configuration proved valid; until then this rule is unchanged).
    pub fn retuned(
        &self,
        algorithm: RedisAlgorithm,
        limit: u64,
        options: RuleOptions,
    ) -> Result<(Self, Retune), ConfigError> {
        if algorithm.name() != self.algorithm.name() {
            return Err(invalid(format!(
                "a retune keeps the algorithm ({} → {})",
                self.algorithm.name(),
                algorithm.name()
            )));
        }
        let window = self.quota.window();
        let (quota, params, spec) = Self::checked(algorithm, limit, window, options)?;
        spec.check()?;
        let rule = Self {
            name: self.name.clone(),
            algorithm,
            quota,
            params,
            count_denied: options.count_denied,
            batch: options.batch,
            local: self.local.clone(),
        };
        let retune = Retune {
            local: self.local.clone(),
            spec,
        };
        Ok((rule, retune))
    }

    /// Validates a rule: its quota, script parameters and local stand-in's spec. Messages do
    /// not name the rule: callers say which one.
    pub fn check(
        algorithm: RedisAlgorithm,
        limit: u64,
        window: Duration,
        options: RuleOptions,
    ) -> Result<(), ConfigError> {
        Self::checked(algorithm, limit, window, options)?.2.check()
    }

    fn checked(
        algorithm: RedisAlgorithm,
        limit: u64,
        window: Duration,
        options: RuleOptions,
    ) -> Result<(Quota, [u64; 2], RateSpec), ConfigError> {
        let quota = Quota::new(limit, window)?;
        let window_us = u64::try_from(window.as_micros()).unwrap_or(u64::MAX);
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
        if options.batch > 1 && algorithm == RedisAlgorithm::Concurrency {
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
        let share = limit.div_ceil(options.instances).max(1);
        let interval = window_us.div_ceil(limit).max(1);
        // This instance's share, same algorithm: the fallback while Redis is unreachable.
        let local_spec = |alg: RateAlgorithm| RateSpec::new(alg, share, window);
        let (params, local) = match algorithm {
            RedisAlgorithm::FixedWindow => (
                [window_us, 0],
                RateSpec {
                    count_denied: options.count_denied,
                    ..local_spec(RateAlgorithm::FixedWindow)
                },
            ),
            RedisAlgorithm::SlidingCounter => {
                // prev · w and limit · w must be exact: switch to ms when µs would not be.
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
                (
                    [window_us / res, res],
                    local_spec(RateAlgorithm::SlidingCounter),
                )
            }
            RedisAlgorithm::SlidingWindow { buckets } => {
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
            RedisAlgorithm::SlidingLog | RedisAlgorithm::Concurrency
                if limit > MAX_MEMBER_LIMIT =>
            {
                return Err(ConfigError::TooLarge {
                    what: "sliding log / concurrency limit",
                    value: limit,
                    max: MAX_MEMBER_LIMIT,
                });
            }
            RedisAlgorithm::SlidingLog => ([window_us, 0], local_spec(RateAlgorithm::SlidingLog)),
            RedisAlgorithm::Gcra { burst } | RedisAlgorithm::TokenBucket { burst } => {
                if burst == 0 {
                    return Err(ConfigError::ZeroBurst);
                }
                if options.batch > burst {
                    return Err(invalid(format!(
                        "batch {} exceeds burst {burst}",
                        options.batch
                    )));
                }
                if u128::from(burst + limit) * u128::from(interval) >= EXACT / 8 {
                    return Err(invalid(
                        "burst × interval too large to be exact".to_string(),
                    ));
                }
                let alg = match algorithm {
                    RedisAlgorithm::Gcra { .. } => RateAlgorithm::Gcra,
                    _ => RateAlgorithm::TokenBucket,
                };
                let local = RateSpec {
                    burst: Some(burst.div_ceil(options.instances).max(1)),
                    ..local_spec(alg)
                };
                ([interval, burst], local)
            }
            // Leases are not tracked locally: the fallback admits this instance's share of
            // leases per window.
            RedisAlgorithm::Concurrency => ([window_us, 0], local_spec(RateAlgorithm::FixedWindow)),
        };
        Ok((quota, params, local))
    }

    /// The rule's name (part of every key).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The algorithm.
    pub fn algorithm(&self) -> RedisAlgorithm {
        self.algorithm
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
        match self.algorithm {
            RedisAlgorithm::FixedWindow => &scripts::FIXED_WINDOW,
            RedisAlgorithm::SlidingCounter => &scripts::SLIDING_COUNTER,
            RedisAlgorithm::SlidingWindow { .. } => &scripts::SLIDING_WINDOW,
            RedisAlgorithm::SlidingLog => &scripts::SLIDING_LOG,
            RedisAlgorithm::Gcra { .. } => &scripts::GCRA,
            RedisAlgorithm::TokenBucket { .. } => &scripts::TOKEN_BUCKET,
            RedisAlgorithm::Concurrency => &scripts::CONCURRENCY,
        }
    }

    pub(crate) fn params(&self) -> [u64; 2] {
        self.params
    }

    pub(crate) fn count_denied(&self) -> bool {
        self.count_denied
    }

    /// Whether denied units are counted too ([`RuleOptions::count_denied`]).
    pub fn counts_denied(&self) -> bool {
        self.count_denied
    }

    /// Units taken per round trip for one-unit requests (1 = no local batching).
    pub fn batch(&self) -> u64 {
        self.batch
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
            .field("algorithm", &self.algorithm)
            .field("quota", &self.quota)
            .field("count_denied", &self.count_denied)
            .finish_non_exhaustive()
    }
}
