//! [`RedisLimiter`]: one atomic script per decision, the fallback while Redis is unreachable,
//! the probe that returns to Redis, and the counters of both.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::RwLock;
use weir_core::{Clock, Decision, MonotonicClock};

use crate::cache::OverLimit;
use crate::config::{Fallback, RedisConfig, TimeSource};
use crate::error::StoreError;
use crate::reserve::Reserve;
use crate::rule::RedisRule;
use crate::scripts::{self, EPOCH_UNIX_SECS};
use crate::store::{Backend, Target};

/// The kinds of failed calls counted in [`Status::errors_by_kind`].
pub const ERROR_KINDS: [&str; 3] = ["timeout", "connection", "answer"];

/// Counters of a [`RedisLimiter`] (also exported through `metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Decisions are being made by Redis (false: by the fallback).
    pub on_redis: bool,
    /// Decisions made by the fallback.
    pub fallback_decisions: u64,
    /// Failed or timed-out calls.
    pub errors: u64,
    /// [`Status::errors`] by kind: `timeout`, `connection` (the store unreachable) and
    /// `answer` (Redis answered with an error).
    pub errors_by_kind: [(&'static str, u64); 3],
    /// Switches from Redis to the fallback.
    pub to_fallback: u64,
    /// Switches back to Redis.
    pub to_redis: u64,
    /// Denials answered from the over-limit cache without a round trip.
    pub cache_hits: u64,
}

/// A held slot of a concurrency rule; give it back with [`RedisLimiter::release`]. If never
/// released (a crash), it expires after the rule's window.
#[derive(Debug)]
#[must_use = "release the slot"]
pub struct ConcurrencySlot {
    key: Option<String>,
    id: String,
    n: u64,
}

/// Decides with Redis, falling back locally when Redis fails. Cheap to clone.
#[derive(Clone)]
pub struct RedisLimiter {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) target: Target,
    pub(crate) backend: RwLock<Option<Backend>>,
    pub(crate) config: RedisConfig,
    pub(crate) healthy: AtomicBool,
    pub(crate) probing: AtomicBool,
    pub(crate) clock: MonotonicClock,
    pub(crate) blocked: OverLimit,
    pub(crate) reserve: Reserve,
    pub(crate) lease_prefix: String,
    pub(crate) lease_seq: AtomicU64,
    pub(crate) fallback_decisions: AtomicU64,
    pub(crate) errors: AtomicU64,
    /// Errors by kind, in [`ERROR_KINDS`] order.
    pub(crate) errors_by_kind: [AtomicU64; 3],
    pub(crate) to_fallback: AtomicU64,
    pub(crate) to_redis: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("target", &self.inner.target)
            .field("status", &self.status())
            .finish()
    }
}

impl RedisLimiter {
    /// Connects to `url` (`redis://HOST:PORT[/DB]` or `redis+cluster://H1:P1,H2:P2`). A single
    /// server is connected lazily; an unreachable cluster starts in the fallback and the probe
    /// keeps trying. Must be called within a tokio runtime.
    pub async fn connect(url: &str, config: RedisConfig) -> Result<Self, StoreError> {
        let target = Target::parse(url)?;
        let backend = match Backend::connect(&target, config.timeout).await {
            Ok(b) => Some(b),
            Err(e) if matches!(target, Target::Cluster(_)) => {
                tracing::warn!(target: "weir_redis", "redis cluster unreachable at start ({e}); deciding with the {} fallback", config.fallback.name());
                None
            }
            Err(e) => return Err(e),
        };
        let healthy = backend.is_some();
        let seed = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            (std::process::id(), SystemTime::now()),
        );
        let limiter = Self {
            inner: Arc::new(Inner {
                target,
                backend: RwLock::new(backend),
                config,
                healthy: AtomicBool::new(healthy),
                probing: AtomicBool::new(false),
                clock: MonotonicClock::new(),
                blocked: OverLimit::new(65_536),
                reserve: Reserve::new(65_536),
                lease_prefix: format!("{seed:016x}"),
                lease_seq: AtomicU64::new(0),
                fallback_decisions: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                errors_by_kind: Default::default(),
                to_fallback: AtomicU64::new(0),
                to_redis: AtomicU64::new(0),
                cache_hits: AtomicU64::new(0),
            }),
        };
        metrics::gauge!("weir_redis_fallback").set(if healthy { 0.0 } else { 1.0 });
        if !healthy {
            limiter.inner.to_fallback.fetch_add(1, Ordering::Relaxed);
            Inner::start_probe(&limiter.inner);
        }
        Ok(limiter)
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// Counters and current state.
    pub fn status(&self) -> Status {
        let i = &self.inner;
        Status {
            on_redis: i.healthy.load(Ordering::Acquire),
            fallback_decisions: i.fallback_decisions.load(Ordering::Relaxed),
            errors: i.errors.load(Ordering::Relaxed),
            errors_by_kind: std::array::from_fn(|k| {
                (ERROR_KINDS[k], i.errors_by_kind[k].load(Ordering::Relaxed))
            }),
            to_fallback: i.to_fallback.load(Ordering::Relaxed),
            to_redis: i.to_redis.load(Ordering::Relaxed),
            cache_hits: i.cache_hits.load(Ordering::Relaxed),
        }
    }

    /// Asks for `n` units of `rule` for `key` (`n = 0` checks only). Never fails: while Redis is
    /// unreachable the configured fallback decides, and at most one call pays the timeout.
    pub async fn check(&self, rule: &RedisRule, key: &str, n: u64) -> Decision {
        let i = &self.inner;
        let cached = i.config.over_limit_cache && !rule.count_denied();
        if cached {
            if let Some(d) = i.blocked.get(rule, key, i.clock.now()) {
                i.cache_hits.fetch_add(1, Ordering::Relaxed);
                return d;
            }
        }
        if !i.healthy.load(Ordering::Acquire) {
            return self.fallback(rule, key, n);
        }
        if rule.batch() > 1 && n == 1 {
            return self.check_batched(rule, key).await;
        }
        match self.call(rule, key, n, i.now_arg(), None).await {
            Ok((d, _)) => {
                if cached && !d.allowed() && n <= 1 {
                    if let Some(retry) = d.retry_after() {
                        i.blocked.insert(rule, key, i.clock.now(), retry, d);
                    }
                }
                d
            }
            Err(e) => {
                i.failed(&e);
                self.fallback(rule, key, n)
            }
        }
    }

    /// One unit with local batching: spend a held unit, else take `batch` units from Redis and
    /// hold the rest (falling back to one unit when `batch` do not fit).
    async fn check_batched(&self, rule: &RedisRule, key: &str) -> Decision {
        let i = &self.inner;
        if let Some(d) = i.reserve.take(rule, key, i.clock.now()) {
            return d;
        }
        let k = rule.batch();
        let result = if i.reserve.start(rule, key, i.clock.now()) {
            match self.call(rule, key, k, i.now_arg(), None).await {
                Ok((d, _)) if d.allowed() => {
                    let hold = u64::try_from(rule.window().as_nanos() / 10).unwrap_or(u64::MAX);
                    i.reserve.keep(rule, key, k - 1, i.clock.now(), hold, &d);
                    return Decision::allow(
                        d.limit(),
                        d.remaining() + k - 1,
                        duration_ns(d.reset_after()),
                        0,
                    );
                }
                Ok(_) => {
                    i.reserve.abandon(rule, key);
                    self.call(rule, key, 1, i.now_arg(), None).await
                }
                Err(e) => {
                    i.reserve.abandon(rule, key);
                    Err(e)
                }
            }
        } else {
            // Another request of this instance is taking a batch for this key: one unit.
            self.call(rule, key, 1, i.now_arg(), None).await
        };
        match result {
            Ok((d, _)) => {
                if i.config.over_limit_cache && !rule.count_denied() && !d.allowed() {
                    if let Some(retry) = d.retry_after() {
                        i.blocked.insert(rule, key, i.clock.now(), retry, d);
                    }
                }
                d
            }
            Err(e) => {
                i.failed(&e);
                self.fallback(rule, key, 1)
            }
        }
    }

    /// Asks Redis directly, without fallback or cache; `now_us` (µs since
    /// [`EPOCH_UNIX_SECS`]) overrides the clock when given. For tests and callers that handle
    /// errors themselves.
    pub async fn try_check(
        &self,
        rule: &RedisRule,
        key: &str,
        n: u64,
        now_us: Option<u64>,
    ) -> Result<Decision, StoreError> {
        Ok(self.try_check_timed(rule, key, n, now_us).await?.0)
    }

    /// As [`RedisLimiter::try_check`], also answering the time the script decided at (µs since
    /// [`EPOCH_UNIX_SECS`], Redis `TIME` unless overridden): for audits and accuracy tests.
    pub async fn try_check_timed(
        &self,
        rule: &RedisRule,
        key: &str,
        n: u64,
        now_us: Option<u64>,
    ) -> Result<(Decision, u64), StoreError> {
        let now = now_us.map_or_else(|| self.inner.now_arg(), |t| t.to_string());
        self.call(rule, key, n, now, None).await
    }

    /// Takes `n` slots of a concurrency `rule` for `key`, held until [`RedisLimiter::release`]
    /// or the rule's window (the lease TTL) passes. During a fallback the lease is local.
    pub async fn acquire_lease(
        &self,
        rule: &RedisRule,
        key: &str,
        n: u64,
    ) -> Result<ConcurrencySlot, Decision> {
        let i = &self.inner;
        let id = format!(
            "{}{:x}",
            i.lease_prefix,
            i.lease_seq.fetch_add(1, Ordering::Relaxed)
        );
        let local = |me: &Self| {
            let d = me.fallback(rule, key, n);
            if d.allowed() {
                Ok(ConcurrencySlot {
                    key: None,
                    id: String::new(),
                    n,
                })
            } else {
                Err(d)
            }
        };
        if !i.healthy.load(Ordering::Acquire) {
            return local(self);
        }
        match self.call(rule, key, n, i.now_arg(), Some(&id)).await {
            Ok((d, _)) if d.allowed() => Ok(ConcurrencySlot {
                key: Some(rule.keys(key)[0].clone()),
                id,
                n,
            }),
            Ok((d, _)) => Err(d),
            Err(e) => {
                i.failed(&e);
                local(self)
            }
        }
    }

    /// Gives a lease's slots back (best effort: if Redis is unreachable the lease expires).
    pub async fn release(&self, lease: ConcurrencySlot) {
        let Some(key) = lease.key else { return };
        let Some(mut backend) = self.inner.backend.read().clone() else {
            return;
        };
        let mut inv = scripts::RELEASE.prepare_invoke();
        inv.key(key).arg(lease.id).arg(lease.n);
        let timeout = self.inner.config.timeout;
        match tokio::time::timeout(timeout, backend.invoke(&inv)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => self.inner.failed(&StoreError::Redis(e)),
            Err(_) => self.inner.failed(&StoreError::Timeout(timeout)),
        }
    }

    pub(crate) fn fallback(&self, rule: &RedisRule, key: &str, n: u64) -> Decision {
        let i = &self.inner;
        i.fallback_decisions.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("weir_redis_fallback_decisions_total").increment(1);
        let limit = rule.limit();
        match i.config.fallback {
            Fallback::Local => rule.local_acquire(key, n),
            Fallback::FailOpen => Decision::allow(limit, limit, 0, 0),
            Fallback::FailClosed => {
                let retry = u64::try_from(i.config.probe_interval.as_nanos()).unwrap_or(u64::MAX);
                Decision::deny(limit, 0, retry, 0)
            }
        }
    }

    pub(crate) async fn call(
        &self,
        rule: &RedisRule,
        key: &str,
        n: u64,
        now: String,
        lease: Option<&str>,
    ) -> Result<(Decision, u64), StoreError> {
        let Some(mut backend) = self.inner.backend.read().clone() else {
            return Err(StoreError::NotConnected);
        };
        let [k1, k2] = rule.keys(key);
        let [p1, p2] = rule.params();
        let mut inv = rule.script().prepare_invoke();
        inv.key(k1).key(k2).arg(now).arg(n);
        inv.arg(u8::from(rule.count_denied()))
            .arg(rule.limit())
            .arg(p1);
        match lease {
            Some(id) => inv.arg(id),
            None => inv.arg(p2),
        };
        let timeout = self.inner.config.timeout;
        let value = tokio::time::timeout(timeout, backend.invoke(&inv))
            .await
            .map_err(|_| StoreError::Timeout(timeout))??;
        decision(&value)
    }
}

/// Turns a script's `{allowed, limit, remaining, retry_us, reset_us, now_us}` into a Decision
/// and the Redis-side time of the decision.
fn decision(value: &redis::Value) -> Result<(Decision, u64), StoreError> {
    let bad = || StoreError::Answer(format!("{value:?}"));
    let redis::Value::Array(items) = value else {
        return Err(bad());
    };
    let mut v = [0i64; 6];
    if items.len() != 6 {
        return Err(bad());
    }
    for (slot, item) in v.iter_mut().zip(items) {
        let redis::Value::Int(x) = item else {
            return Err(bad());
        };
        *slot = *x;
    }
    let ns = |us: i64| u64::try_from(us).unwrap_or(0).saturating_mul(1_000);
    let (limit, remaining) = (
        u64::try_from(v[1]).unwrap_or(0),
        u64::try_from(v[2]).unwrap_or(0),
    );
    let d = match (v[0], v[3]) {
        (1, _) => Decision::allow(limit, remaining, ns(v[4]), 0),
        (_, -1) => Decision::never(limit, remaining, ns(v[4])),
        _ => Decision::deny(limit, remaining, ns(v[3]), ns(v[4])),
    };
    Ok((d, u64::try_from(v[5]).unwrap_or(0)))
}

/// Logs of malformed Redis answers: at most one line a second.
static ANSWER_LOG: weir_core::log_gate::LogGate = weir_core::log_gate::LogGate::new(1_000_000_000);

impl Inner {
    pub(crate) fn now_arg(&self) -> String {
        match self.config.time {
            TimeSource::Redis => String::new(),
            TimeSource::Caller => caller_now_us().to_string(),
        }
    }

    /// Records a failed call; a connection-level failure switches every decision to the
    /// fallback and starts the probe.
    pub(crate) fn failed(self: &Arc<Self>, e: &StoreError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let k = match e {
            StoreError::Timeout(_) => 0,
            StoreError::Redis(r) if is_outage(r) => 1,
            StoreError::NotConnected => 1,
            _ => 2,
        };
        self.errors_by_kind[k].fetch_add(1, Ordering::Relaxed);
        let kind = ERROR_KINDS[k];
        metrics::counter!("weir_redis_errors_total", "kind" => kind).increment(1);
        if kind == "answer" {
            // A Redis answering garbage does so to every call: a line a second, not one each.
            if let Some(held) = ANSWER_LOG.open(weir_core::MonotonicClock::default().now()) {
                tracing::error!(target: "weir_redis", "redis call failed: {e} ({held} more such failures not logged since the last line)");
            }
            return;
        }
        if self.healthy.swap(false, Ordering::AcqRel) {
            self.to_fallback.fetch_add(1, Ordering::Relaxed);
            metrics::gauge!("weir_redis_fallback").set(1.0);
            metrics::counter!("weir_redis_transitions_total", "to" => "fallback").increment(1);
            tracing::warn!(target: "weir_redis", "redis unreachable ({e}); deciding with the {} fallback", self.config.fallback.name());
        }
        Self::start_probe(self);
    }

    fn start_probe(this: &Arc<Self>) {
        if this.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak: Weak<Self> = Arc::downgrade(this);
        let interval = this.config.probe_interval;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(me) = weak.upgrade() else { return };
                if me.probe_once().await {
                    me.probing.store(false, Ordering::Release);
                    me.healthy.store(true, Ordering::Release);
                    me.to_redis.fetch_add(1, Ordering::Relaxed);
                    metrics::gauge!("weir_redis_fallback").set(0.0);
                    metrics::counter!("weir_redis_transitions_total", "to" => "redis").increment(1);
                    tracing::info!(target: "weir_redis", "redis reachable again; deciding with redis");
                    return;
                }
            }
        });
    }

    async fn probe_once(&self) -> bool {
        let timeout = self.config.timeout.max(Duration::from_millis(50));
        let existing = self.backend.read().clone();
        let mut backend = match existing {
            Some(b) => b,
            None => match Backend::connect(&self.target, timeout).await {
                Ok(b) => {
                    *self.backend.write() = Some(b.clone());
                    b
                }
                Err(_) => return false,
            },
        };
        matches!(
            tokio::time::timeout(timeout, backend.ping()).await,
            Ok(Ok(()))
        )
    }
}

fn is_outage(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || e.is_unrecoverable_error()
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// This machine's wall clock in µs since [`EPOCH_UNIX_SECS`].
pub fn caller_now_us() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_sub(Duration::from_secs(EPOCH_UNIX_SECS));
    u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
}
