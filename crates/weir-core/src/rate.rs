//! A rate limit chosen at run time: the one algorithm vocabulary ([`RateAlgorithm`]), its
//! parameters ([`RateSpec`]) and the limiters built from them ([`KeyedRate`] per key,
//! [`SingleRate`] for one counter). Rule files, the Lyft configuration of `weir serve`,
//! weir-redis (its scripts and its local fallback) and `weir simulate` all name algorithms
//! with this enum; each file format keeps its own spelling and default.

use std::time::Duration;

use crate::algorithm::Quota;
use crate::clock::{Clock, Nanos};
use crate::cost::Held;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::fixed_window::FixedWindow;
use crate::gcra::Gcra;
use crate::keyed::KeyedLimiter;
use crate::limiter::Limiter;
use crate::pacing::Pacing;
use crate::sliding_counter::SlidingCounter;
use crate::sliding_log::SlidingLog;
use crate::sliding_window::SlidingWindow;
use crate::sliding_window::DEFAULT_BUCKETS;
use crate::token_bucket::TokenBucket;
use crate::warmup::WarmupTokenBucket;
use crate::warmup::DEFAULT_COLD_FACTOR;

/// A rate algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RateAlgorithm {
    /// Bucketed sliding window (Sentinel's LeapArray; 10 sub-windows by default).
    SlidingWindow,
    /// Counter per aligned window; up to 2 × limit across a boundary.
    FixedWindow,
    /// Exact sliding window (one timestamp per unit).
    SlidingLog,
    /// Previous window weighted by overlap (Cloudflare); approximate.
    SlidingCounter,
    /// GCRA (`burst` units at once, default the limit).
    Gcra,
    /// Token bucket with Guava SmoothBursty semantics (capacity `burst`, default the limit).
    TokenBucket,
    /// Pacing queue: calls spaced evenly, waiting up to `max_wait` (leaky bucket as a queue).
    Pacing,
    /// Warming-up token bucket (Guava SmoothWarmingUp).
    WarmUp,
}

impl RateAlgorithm {
    /// Every algorithm.
    pub const ALL: [RateAlgorithm; 8] = [
        Self::SlidingWindow,
        Self::FixedWindow,
        Self::SlidingLog,
        Self::SlidingCounter,
        Self::Gcra,
        Self::TokenBucket,
        Self::Pacing,
        Self::WarmUp,
    ];

    /// The canonical lower-case name (`sliding_window`, `gcra`, …, `pacing`, `warm_up`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SlidingWindow => "sliding_window",
            Self::FixedWindow => "fixed_window",
            Self::SlidingLog => "sliding_log",
            Self::SlidingCounter => "sliding_counter",
            Self::Gcra => "gcra",
            Self::TokenBucket => "token_bucket",
            Self::Pacing => "pacing",
            Self::WarmUp => "warm_up",
        }
    }

    /// The algorithm named `name` among `allowed` (a file format's choice of algorithms), or
    /// `None`.
    pub fn parse_among(name: &str, allowed: &[RateAlgorithm]) -> Option<Self> {
        allowed.iter().copied().find(|a| a.as_str() == name)
    }

    /// Whether the algorithm takes a burst (GCRA, token bucket).
    pub fn has_burst(self) -> bool {
        matches!(self, Self::Gcra | Self::TokenBucket)
    }
}

impl std::fmt::Display for RateAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Algorithm and parameters of a rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateSpec {
    /// The algorithm.
    pub algorithm: RateAlgorithm,
    /// Units per window.
    pub limit: u64,
    /// The window.
    pub window: Duration,
    /// Burst for GCRA / token bucket (default: the limit).
    pub burst: Option<u64>,
    /// Sub-windows of the sliding window (0 = weir-core's default, 10).
    pub buckets: u32,
    /// Longest wait of a paced or warming-up call (pacing, warm-up).
    pub max_wait: Duration,
    /// Warm-up period (warm-up).
    pub warmup: Duration,
    /// Cold rate = limit / cold_factor (warm-up; default 3).
    pub cold_factor: u32,
    /// Count denied units too (envoyproxy/ratelimit's semantics, see
    /// `FixedWindow::counting_denied`). In memory only the fixed window counts them; the Redis
    /// scripts of every algorithm do (weir-redis caps the GCRA / token-bucket penalty at one
    /// window).
    pub count_denied: bool,
}

impl RateSpec {
    /// `limit` per `window` with `algorithm`, default burst and buckets.
    pub fn new(algorithm: RateAlgorithm, limit: u64, window: Duration) -> Self {
        Self {
            algorithm,
            limit,
            window,
            burst: None,
            buckets: 0,
            max_wait: Duration::ZERO,
            warmup: Duration::ZERO,
            cold_factor: DEFAULT_COLD_FACTOR as u32,
            count_denied: false,
        }
    }

    /// This spec with `burst` units at once (GCRA, token bucket).
    pub fn with_burst(self, burst: u64) -> Self {
        Self {
            burst: Some(burst),
            ..self
        }
    }

    /// This spec with `buckets` sub-windows (sliding window).
    pub fn with_buckets(self, buckets: u32) -> Self {
        Self { buckets, ..self }
    }

    /// This spec counting denied units too (fixed window).
    pub fn counting_denied(self, count_denied: bool) -> Self {
        Self {
            count_denied,
            ..self
        }
    }

    /// The burst in force: `burst`, or the limit.
    pub fn burst_or_limit(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    /// The sub-windows in force: `buckets`, or weir-core's default.
    pub fn buckets_or_default(&self) -> u32 {
        if self.buckets == 0 {
            DEFAULT_BUCKETS
        } else {
            self.buckets
        }
    }
}

/// A spec turned into the weir-core algorithm value.
enum Built {
    Fixed(FixedWindow),
    Window(SlidingWindow),
    Log(SlidingLog),
    Counter(SlidingCounter),
    Gcra(Gcra),
    Bucket(TokenBucket),
    Pace(Pacing),
    Warm(WarmupTokenBucket),
}

impl RateSpec {
    /// Whether the spec builds (what [`KeyedRate::new`] and [`KeyedRate::retune`] check).
    pub fn check(&self) -> Result<(), ConfigError> {
        self.build().map(|_| ())
    }

    fn build(&self) -> Result<Built, ConfigError> {
        let q = Quota::new(self.limit, self.window)?;
        let burst = self.burst_or_limit();
        let buckets = self.buckets_or_default();
        Ok(match self.algorithm {
            RateAlgorithm::FixedWindow => {
                Built::Fixed(FixedWindow::new(q)?.counting_denied(self.count_denied))
            }
            RateAlgorithm::SlidingWindow => Built::Window(SlidingWindow::new(q, buckets)?),
            RateAlgorithm::SlidingLog => Built::Log(SlidingLog::new(q)?),
            RateAlgorithm::SlidingCounter => Built::Counter(SlidingCounter::new(q)?),
            RateAlgorithm::Gcra => Built::Gcra(Gcra::new(q, burst)?),
            RateAlgorithm::TokenBucket => Built::Bucket(TokenBucket::new(q, burst)?),
            RateAlgorithm::Pacing => Built::Pace(Pacing::new(q, self.max_wait)?),
            RateAlgorithm::WarmUp => Built::Warm(
                WarmupTokenBucket::with_cold_factor(q, self.warmup, f64::from(self.cold_factor))?
                    .with_max_wait(self.max_wait),
            ),
        })
    }
}

/// A bounded keyed limiter whose algorithm is chosen at run time.
pub enum KeyedRate<C: Clock> {
    /// Fixed window.
    Fixed(KeyedLimiter<String, FixedWindow, C>),
    /// Bucketed sliding window.
    Window(KeyedLimiter<String, SlidingWindow, C>),
    /// Sliding log.
    Log(KeyedLimiter<String, SlidingLog, C>),
    /// Sliding counter.
    Counter(KeyedLimiter<String, SlidingCounter, C>),
    /// GCRA.
    Gcra(KeyedLimiter<String, Gcra, C>),
    /// Token bucket.
    Bucket(KeyedLimiter<String, TokenBucket, C>),
    /// Pacing queue.
    Pace(KeyedLimiter<String, Pacing, C>),
    /// Warming-up token bucket.
    Warm(KeyedLimiter<String, WarmupTokenBucket, C>),
}

macro_rules! each {
    ($self:expr, $l:ident => $body:expr) => {
        match $self {
            KeyedRate::Fixed($l) => $body,
            KeyedRate::Window($l) => $body,
            KeyedRate::Log($l) => $body,
            KeyedRate::Counter($l) => $body,
            KeyedRate::Gcra($l) => $body,
            KeyedRate::Bucket($l) => $body,
            KeyedRate::Pace($l) => $body,
            KeyedRate::Warm($l) => $body,
        }
    };
}

fn other_algorithm() -> ConfigError {
    ConfigError::Invalid("new parameters must keep the limiter's algorithm".into())
}

impl<C: Clock + Clone> KeyedRate<C> {
    /// A limiter for `spec` holding at most `keys` keys, reading `clock`.
    pub fn new(spec: &RateSpec, keys: usize, clock: C) -> Result<Self, ConfigError> {
        Ok(match spec.build()? {
            Built::Fixed(a) => Self::Fixed(KeyedLimiter::with_clock(a, keys, clock)?),
            Built::Window(a) => Self::Window(KeyedLimiter::with_clock(a, keys, clock)?),
            Built::Log(a) => Self::Log(KeyedLimiter::with_clock(a, keys, clock)?),
            Built::Counter(a) => Self::Counter(KeyedLimiter::with_clock(a, keys, clock)?),
            Built::Gcra(a) => Self::Gcra(KeyedLimiter::with_clock(a, keys, clock)?),
            Built::Bucket(a) => Self::Bucket(KeyedLimiter::with_clock(a, keys, clock)?),
            Built::Pace(a) => Self::Pace(KeyedLimiter::with_clock(a, keys, clock)?),
            Built::Warm(a) => Self::Warm(KeyedLimiter::with_clock(a, keys, clock)?),
        })
    }

    /// New default parameters of the same algorithm; every key keeps its state.
    pub fn retune(&self, spec: &RateSpec) -> Result<(), ConfigError> {
        match (self, spec.build()?) {
            (Self::Fixed(l), Built::Fixed(a)) => l.set_algorithm(a),
            (Self::Window(l), Built::Window(a)) => l.set_algorithm(a),
            (Self::Log(l), Built::Log(a)) => l.set_algorithm(a),
            (Self::Counter(l), Built::Counter(a)) => l.set_algorithm(a),
            (Self::Gcra(l), Built::Gcra(a)) => l.set_algorithm(a),
            (Self::Bucket(l), Built::Bucket(a)) => l.set_algorithm(a),
            (Self::Pace(l), Built::Pace(a)) => l.set_algorithm(a),
            (Self::Warm(l), Built::Warm(a)) => l.set_algorithm(a),
            _ => return Err(other_algorithm()),
        }
        Ok(())
    }

    /// Gives `key` its own parameters (same algorithm), keeping its state.
    pub fn set_exception(&self, key: &str, spec: &RateSpec) -> Result<(), ConfigError> {
        let k = key.to_string();
        match (self, spec.build()?) {
            (Self::Fixed(l), Built::Fixed(a)) => l.set_override(k, a),
            (Self::Window(l), Built::Window(a)) => l.set_override(k, a),
            (Self::Log(l), Built::Log(a)) => l.set_override(k, a),
            (Self::Counter(l), Built::Counter(a)) => l.set_override(k, a),
            (Self::Gcra(l), Built::Gcra(a)) => l.set_override(k, a),
            (Self::Bucket(l), Built::Bucket(a)) => l.set_override(k, a),
            (Self::Pace(l), Built::Pace(a)) => l.set_override(k, a),
            (Self::Warm(l), Built::Warm(a)) => l.set_override(k, a),
            _ => return Err(other_algorithm()),
        }
        Ok(())
    }

    /// Back to the default parameters for `key`.
    pub fn remove_exception(&self, key: &str) {
        each!(self, l => l.remove_override(key))
    }

    /// Asks for `n` units for `key` now (avoid an empty key on hot paths: see
    /// `KeyedLimiter::acquire`).
    pub fn acquire(&self, key: &str, n: u64) -> Decision {
        each!(self, l => l.acquire(key, n))
    }

    /// Asks for `n` units for `key` at an explicit time.
    pub fn acquire_at(&self, key: &str, n: u64, now: Nanos) -> Decision {
        each!(self, l => l.acquire_at(key, n, now))
    }

    /// As [`KeyedRate::acquire`], but `None` instead of evicting a busy key when the table is
    /// full (see `KeyedLimiter::acquire_if_room`).
    pub fn acquire_if_room(&self, key: &str, n: u64) -> Option<Decision> {
        each!(self, l => l.acquire_if_room(key, n))
    }

    /// [`KeyedRate::acquire_if_room`] at an explicit time.
    pub fn acquire_if_room_at(&self, key: &str, n: u64, now: Nanos) -> Option<Decision> {
        each!(self, l => l.acquire_if_room_at(key, n, now))
    }

    /// Whether the algorithm settles costs ([`crate::cost`]: GCRA, the token bucket and the
    /// fixed window); the others treat a reservation as a plain acquire and ignore its
    /// settlement.
    pub fn settles(&self) -> bool {
        matches!(self, Self::Fixed(_) | Self::Gcra(_) | Self::Bucket(_))
    }

    /// Holds `estimate` units for `key` at `now` ([`KeyedLimiter::reserve_cost_at`]).
    pub fn reserve_cost_at(&self, key: &str, estimate: u64, now: Nanos) -> Result<Held, Decision> {
        Held::admitted(self.acquire_at(key, estimate, now), estimate, now)
    }

    /// Corrects `key`'s charge to `actual` ([`KeyedLimiter::settle_at`]); nothing for an
    /// algorithm that does not [settle](KeyedRate::settles).
    pub fn settle_at(&self, key: &str, held: Held, actual: u64, now: Nanos) {
        match self {
            Self::Fixed(l) => l.settle_at(key, held, actual, now),
            Self::Gcra(l) => l.settle_at(key, held, actual, now),
            Self::Bucket(l) => l.settle_at(key, held, actual, now),
            _ => {}
        }
    }

    /// The time on the limiter's clock.
    pub fn now(&self) -> Nanos {
        each!(self, l => l.clock().now())
    }

    /// Keys tracked now.
    pub fn len(&self) -> usize {
        each!(self, l => l.len())
    }

    /// True when no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys evicted at the bound so far.
    pub fn evictions(&self) -> u64 {
        each!(self, l => l.evictions())
    }
}

/// One rate limiter whose algorithm is chosen at run time: what a flow rule counting all its
/// calls together uses (no key hashing, no lock: GCRA, token bucket, fixed window and pacing
/// decide with one compare-and-swap).
pub enum SingleRate<C: Clock> {
    /// Fixed window.
    Fixed(Limiter<FixedWindow, C>),
    /// Bucketed sliding window.
    Window(Limiter<SlidingWindow, C>),
    /// Sliding log.
    Log(Limiter<SlidingLog, C>),
    /// Sliding counter.
    Counter(Limiter<SlidingCounter, C>),
    /// GCRA.
    Gcra(Limiter<Gcra, C>),
    /// Token bucket.
    Bucket(Limiter<TokenBucket, C>),
    /// Pacing queue.
    Pace(Limiter<Pacing, C>),
    /// Warming-up token bucket.
    Warm(Limiter<WarmupTokenBucket, C>),
}

macro_rules! each_single {
    ($self:expr, $l:ident => $body:expr) => {
        match $self {
            SingleRate::Fixed($l) => $body,
            SingleRate::Window($l) => $body,
            SingleRate::Log($l) => $body,
            SingleRate::Counter($l) => $body,
            SingleRate::Gcra($l) => $body,
            SingleRate::Bucket($l) => $body,
            SingleRate::Pace($l) => $body,
            SingleRate::Warm($l) => $body,
        }
    };
}

impl<C: Clock + Clone> SingleRate<C> {
    /// A limiter for `spec` reading `clock`.
    pub fn new(spec: &RateSpec, clock: C) -> Result<Self, ConfigError> {
        Ok(match spec.build()? {
            Built::Fixed(a) => Self::Fixed(Limiter::with_clock(a, clock)),
            Built::Window(a) => Self::Window(Limiter::with_clock(a, clock)),
            Built::Log(a) => Self::Log(Limiter::with_clock(a, clock)),
            Built::Counter(a) => Self::Counter(Limiter::with_clock(a, clock)),
            Built::Gcra(a) => Self::Gcra(Limiter::with_clock(a, clock)),
            Built::Bucket(a) => Self::Bucket(Limiter::with_clock(a, clock)),
            Built::Pace(a) => Self::Pace(Limiter::with_clock(a, clock)),
            Built::Warm(a) => Self::Warm(Limiter::with_clock(a, clock)),
        })
    }

    /// A limiter with `spec`'s parameters (same algorithm) starting from this one's state:
    /// counters, stored permits and warm-up progress carry over. Decisions made on this one
    /// after the copy are not carried (a reload swaps limiters between two calls; at most the
    /// calls racing the swap are missed).
    pub fn retuned(&self, spec: &RateSpec) -> Result<Self, ConfigError> {
        Ok(match (self, spec.build()?) {
            (Self::Fixed(l), Built::Fixed(a)) => Self::Fixed(l.retuned(a)),
            (Self::Window(l), Built::Window(a)) => Self::Window(l.retuned(a)),
            (Self::Log(l), Built::Log(a)) => Self::Log(l.retuned(a)),
            (Self::Counter(l), Built::Counter(a)) => Self::Counter(l.retuned(a)),
            (Self::Gcra(l), Built::Gcra(a)) => Self::Gcra(l.retuned(a)),
            (Self::Bucket(l), Built::Bucket(a)) => Self::Bucket(l.retuned(a)),
            (Self::Pace(l), Built::Pace(a)) => Self::Pace(l.retuned(a)),
            (Self::Warm(l), Built::Warm(a)) => Self::Warm(l.retuned(a)),
            _ => return Err(other_algorithm()),
        })
    }

    /// Asks for `n` units at `now`.
    #[inline]
    pub fn acquire_at(&self, n: u64, now: Nanos) -> Decision {
        each_single!(self, l => l.acquire_at(n, now))
    }

    /// Whether the algorithm settles costs (GCRA, the token bucket and the fixed window).
    pub fn settles(&self) -> bool {
        matches!(self, Self::Fixed(_) | Self::Gcra(_) | Self::Bucket(_))
    }

    /// Holds `estimate` units at `now` ([`Limiter::reserve_cost_at`] without the borrow).
    pub fn reserve_cost_at(&self, estimate: u64, now: Nanos) -> Result<Held, Decision> {
        Held::admitted(self.acquire_at(estimate, now), estimate, now)
    }

    /// Corrects a charge to `actual` ([`Limiter::settle_held`]); nothing for an algorithm
    /// that does not [settle](SingleRate::settles).
    pub fn settle_at(&self, held: Held, actual: u64, now: Nanos) {
        match self {
            Self::Fixed(l) => l.settle_held(held, actual, now),
            Self::Gcra(l) => l.settle_held(held, actual, now),
            Self::Bucket(l) => l.settle_held(held, actual, now),
            _ => {}
        }
    }
}
