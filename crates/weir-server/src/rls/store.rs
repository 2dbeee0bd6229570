//! The store seam of the rate-limit service: where a rule's counters live.
//!
//! The engine ([`super::Engine`]) matches descriptors and builds Lyft's answers; it never
//! counts. Each limit of the configuration asks the [`Store`] for a [`Counter`] once, when
//! the configuration loads, and every request then asks that counter for a [`Decision`] at the
//! engine's one clock reading. Two stores come with Weir:
//!
//! - [`MemoryStore`]: bounded keyed limiters in this process (weir-core only, decides without
//!   waiting);
//! - [`RedisStore`]: one global count across instances on Redis (weir-redis: atomic Lua
//!   scripts, with this instance's share decided locally while Redis is unreachable).
//!
//! A new store (another database, a sharded ring of servers) implements the two traits,
//! refusing a limit it cannot count with a [`CounterError`] (its own reason boxed in
//! [`CounterError::Store`]); the engine, the gRPC/HTTP front ends and the dashboard take it
//! unchanged (`crate::serve::Server::builder().store(..)`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use weir_core::rate::{KeyedRate, RateSpec};
use weir_core::{AnyClock, ClockKind, Decision, Nanos};
use weir_redis::{RedisLimiter, RedisRule, RuleOptions};

/// Where counters live: makes one [`Counter`] per configured limit.
pub trait Store: Send + Sync + 'static {
    /// The store's name for logs, the dashboard and `/api/v1/info` (`memory`, `redis`).
    fn name(&self) -> &'static str;

    /// The counters of one limit: `spec` under `name` (stable while the limit's meaning is:
    /// the rule's id with its algorithm and window). Errors name no rule: the caller does.
    fn counter(&self, name: String, spec: &RateSpec) -> Result<Arc<dyn Counter>, CounterError>;

    /// The state of a store that can fall back to local decisions (Redis); `None` for a store
    /// that cannot fail.
    fn fallback_status(&self) -> Option<weir_redis::Status> {
        None
    }
}

/// The counters of one limit, one per key.
pub trait Counter: Send + Sync {
    /// Takes `n` units for `key` at `now` (the engine's clock reading for the whole request;
    /// a store with its own time base, like Redis's `TIME`, may use that instead).
    fn acquire<'a>(&'a self, key: &'a str, n: u64, now: Nanos) -> Acquire<'a>;

    /// Corrects `key`'s count by `n` units at `now`, for a caller that charges and settles on
    /// its own (Envoy's stream-end calls): `refund` false charges them whatever the limit (a
    /// debt later calls wait out), true gives back at most what the counter still holds, as if
    /// they had been charged at `now`. Nothing for an algorithm that cannot settle (only GCRA,
    /// the token bucket and the fixed window can).
    fn adjust<'a>(&'a self, key: &'a str, n: u64, refund: bool, now: Nanos) -> Adjust<'a>;

    /// The parameters in force.
    fn spec(&self) -> &RateSpec;

    /// The same counters (same algorithm and window, every key keeping its state) with `spec`'s
    /// other parameters: a new limit, burst or counting of denied hits. The returned counter
    /// answers with the new parameters at once; state shared with this one takes them when the
    /// [`Retune`] is applied, after the whole new configuration proved valid.
    fn retuned(&self, spec: &RateSpec) -> Result<(Arc<dyn Counter>, Retune), CounterError>;
}

/// Why a store cannot count a limit. Names no rule: the engine does.
#[derive(Debug, thiserror::Error)]
pub enum CounterError {
    /// The limit's parameters make no limiter (weir-core's refusal, the same for every store).
    #[error(transparent)]
    Spec(#[from] weir_core::ConfigError),
    /// A retune would change what the counts mean (another algorithm or window).
    #[error(
        "a retune keeps the algorithm and window ({} per {:?} → {} per {:?})",
        old.algorithm, old.window, new.algorithm, new.window
    )]
    Changed {
        /// The parameters in force.
        old: Box<RateSpec>,
        /// The parameters asked for.
        new: Box<RateSpec>,
    },
    /// A store of another crate refused, for its own reason.
    #[error(transparent)]
    Store(Box<dyn std::error::Error + Send + Sync>),
}

/// Parameters that shared counter state takes when applied (see [`Counter::retuned`]).
#[must_use = "shared state keeps the old parameters until the retune is applied"]
pub struct Retune(Box<dyn FnOnce() + Send>);

impl Retune {
    /// Gives the shared state its new parameters.
    pub fn apply(self) {
        (self.0)()
    }
}

/// A decision being made: ready at once (a memory store) or waiting on a round trip.
pub enum Acquire<'a> {
    /// Decided without waiting (taken when polled).
    Ready(Option<Decision>),
    /// Waiting on the store.
    Waiting(Pin<Box<dyn Future<Output = Decision> + Send + 'a>>),
}

impl Future for Acquire<'_> {
    type Output = Decision;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        match &mut *self {
            Acquire::Ready(d) => match d.take() {
                Some(d) => Poll::Ready(d),
                None => panic!("Acquire polled after it completed"),
            },
            Acquire::Waiting(f) => f.as_mut().poll(cx),
        }
    }
}

/// An adjustment being made: done at once (`None`, a memory store) or waiting on a round trip.
pub type Adjust<'a> = Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>;

fn same_meaning(old: &RateSpec, new: &RateSpec) -> Result<(), CounterError> {
    if old.algorithm != new.algorithm || old.window != new.window {
        return Err(CounterError::Changed {
            old: Box::new(*old),
            new: Box::new(*new),
        });
    }
    Ok(())
}

/// Counters in this process: a bounded keyed limiter per limit (weir-core only).
#[derive(Debug, Clone, Copy)]
pub struct MemoryStore {
    keys: usize,
    clock: ClockKind,
}

impl MemoryStore {
    /// At most `keys` keys per limit (idle ones evicted first), limiters on `clock`.
    pub fn new(keys: usize, clock: ClockKind) -> Self {
        Self {
            keys: keys.max(1),
            clock,
        }
    }
}

impl Default for MemoryStore {
    /// 100 000 keys per limit on the exact clock.
    fn default() -> Self {
        Self::new(100_000, ClockKind::Exact)
    }
}

impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn counter(&self, _name: String, spec: &RateSpec) -> Result<Arc<dyn Counter>, CounterError> {
        let clock = self.clock.build()?;
        let limiter = KeyedRate::new(spec, self.keys, clock)?;
        Ok(Arc::new(MemoryCounter {
            spec: *spec,
            limiter: Arc::new(limiter),
        }))
    }
}

struct MemoryCounter {
    spec: RateSpec,
    limiter: Arc<KeyedRate<AnyClock>>,
}

impl Counter for MemoryCounter {
    #[inline]
    fn acquire<'a>(&'a self, key: &'a str, n: u64, now: Nanos) -> Acquire<'a> {
        Acquire::Ready(Some(self.limiter.acquire_at(key, n, now)))
    }

    fn adjust<'a>(&'a self, key: &'a str, n: u64, refund: bool, now: Nanos) -> Adjust<'a> {
        let (estimate, actual) = if refund { (n, 0) } else { (0, n) };
        let held = weir_core::cost::Held {
            estimate,
            taken: now,
        };
        self.limiter.settle_at(key, held, actual, now);
        None
    }

    fn spec(&self) -> &RateSpec {
        &self.spec
    }

    fn retuned(&self, spec: &RateSpec) -> Result<(Arc<dyn Counter>, Retune), CounterError> {
        same_meaning(&self.spec, spec)?;
        spec.check()?;
        let counter = Arc::new(MemoryCounter {
            spec: *spec,
            limiter: self.limiter.clone(),
        });
        let (limiter, spec) = (self.limiter.clone(), *spec);
        // `spec` was checked and keeps the algorithm: the retune cannot fail.
        let retune = Retune(Box::new(move || {
            let _ = limiter.retune(&spec);
        }));
        Ok((counter, retune))
    }
}

/// Counters in Redis shared by every instance (weir-redis), each limit's local stand-in
/// deciding this instance's share while Redis is unreachable.
#[derive(Clone)]
pub struct RedisStore {
    limiter: RedisLimiter,
    options: RuleOptions,
}

impl RedisStore {
    /// Counters through `limiter`; the local fallback of each limit allows
    /// `limit / instances`, tracks at most `keys` keys and reads `clock`.
    pub fn new(limiter: RedisLimiter, instances: u64, keys: usize, clock: ClockKind) -> Self {
        let options = RuleOptions {
            instances: instances.max(1),
            local_keys: keys.max(1),
            clock,
            ..RuleOptions::default()
        };
        Self { limiter, options }
    }

    /// The connection.
    pub fn limiter(&self) -> &RedisLimiter {
        &self.limiter
    }
}

impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn counter(&self, name: String, spec: &RateSpec) -> Result<Arc<dyn Counter>, CounterError> {
        let rule = RedisRule::new(name, spec, self.options)?;
        Ok(Arc::new(RedisCounter {
            rule,
            limiter: self.limiter.clone(),
            options: self.options,
        }))
    }

    fn fallback_status(&self) -> Option<weir_redis::Status> {
        Some(self.limiter.status())
    }
}

struct RedisCounter {
    rule: RedisRule,
    limiter: RedisLimiter,
    options: RuleOptions,
}

impl Counter for RedisCounter {
    fn acquire<'a>(&'a self, key: &'a str, n: u64, _now: Nanos) -> Acquire<'a> {
        // Redis's TIME is the one clock of every instance: the engine's reading is not used.
        Acquire::Waiting(Box::pin(self.limiter.check(&self.rule, key, n)))
    }

    fn adjust<'a>(&'a self, key: &'a str, n: u64, refund: bool, _now: Nanos) -> Adjust<'a> {
        Some(Box::pin(self.limiter.adjust(&self.rule, key, n, refund)))
    }

    fn spec(&self) -> &RateSpec {
        self.rule.spec()
    }

    fn retuned(&self, spec: &RateSpec) -> Result<(Arc<dyn Counter>, Retune), CounterError> {
        same_meaning(self.rule.spec(), spec)?;
        let (rule, retune) = self.rule.retuned(spec, self.options)?;
        let counter = Arc::new(RedisCounter {
            rule,
            limiter: self.limiter.clone(),
            options: self.options,
        });
        Ok((counter, Retune(Box::new(move || retune.apply()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use weir_core::rate::RateAlgorithm;

    fn ready(a: Acquire<'_>) -> Decision {
        match a {
            Acquire::Ready(Some(d)) => d,
            _ => panic!("a memory counter decides without waiting"),
        }
    }

    #[test]
    fn memory_counters_decide_at_the_callers_time_and_keep_state_through_a_retune() {
        let store = MemoryStore::new(10, ClockKind::Exact);
        let spec = RateSpec::new(RateAlgorithm::FixedWindow, 2, Duration::from_secs(1));
        let c = store.counter("r".into(), &spec).unwrap();
        assert!(ready(c.acquire("k", 1, 0)).allowed());
        assert!(ready(c.acquire("k", 1, 1)).allowed());
        assert!(!ready(c.acquire("k", 1, 2)).allowed());
        // The next window, by the caller's clock alone.
        assert!(ready(c.acquire("k", 1, 1_000_000_000)).allowed());
        // A higher limit keeps the window's count (1 used): two more pass, not three.
        let (c, retune) = c.retuned(&RateSpec { limit: 3, ..spec }).unwrap();
        retune.apply();
        let passed = (0..3)
            .filter(|i| ready(c.acquire("k", 1, 1_000_000_010 + i)).allowed())
            .count();
        assert_eq!(passed, 2);
        assert_eq!(c.spec().limit, 3);
        // Another algorithm or window is not a retune.
        let gcra = RateSpec::new(RateAlgorithm::Gcra, 3, Duration::from_secs(1));
        assert!(c.retuned(&gcra).is_err());
        assert!(c
            .retuned(&RateSpec {
                window: Duration::from_secs(2),
                ..spec
            })
            .is_err());
    }

    #[test]
    fn memory_counters_refuse_bad_parameters_with_a_message() {
        let store = MemoryStore::default();
        let zero = RateSpec::new(RateAlgorithm::Gcra, 5, Duration::from_secs(1)).with_burst(0);
        let Err(e) = store.counter("r".into(), &zero) else {
            panic!("burst 0 accepted")
        };
        assert!(matches!(e, CounterError::Spec(_)), "{e}");
        assert!(e.to_string().contains("burst"), "{e}");
        assert_eq!(store.name(), "memory");
        assert!(store.fallback_status().is_none());
    }
}
