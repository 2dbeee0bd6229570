//! Cost reservations on Redis (weir-core's `cost` model): [`RedisLimiter::reserve_cost`]
//! holds an estimate with the rule's own script, [`RedisLimiter::settle`] corrects it to the
//! actual cost with one atomic script (`lua/settle.lua`): an excess charged whatever the limit
//! (a debt every instance sees), a refund of what the call did not use, whenever it ends (never
//! past a full state, never to a fixed window that ended).
//!
//! While Redis is unreachable the reservation is the fallback's (this instance's share, or
//! fail-open / fail-closed) and is settled there. A settlement that cannot reach Redis is
//! lost: a refund not given back errs on the safe side; an excess not charged is counted by
//! the instance's local stand-in instead.

use weir_core::cost::Held;
use weir_core::Decision;

use crate::config::Fallback;
use crate::error::StoreError;
use crate::limiter::RedisLimiter;
use crate::rule::RedisRule;
use crate::scripts;

/// A cost held for one key of a [`RedisRule`]: settle it with [`RedisLimiter::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostHeld {
    held: Held,
    /// Held by the fallback rather than by Redis.
    local: bool,
}

impl CostHeld {
    /// The estimate held.
    pub fn estimate(&self) -> u64 {
        self.held.estimate
    }

    /// Whether the fallback holds it (Redis was unreachable).
    pub fn is_local(&self) -> bool {
        self.local
    }
}

impl RedisLimiter {
    /// Holds `estimate` units of `rule` for `key`: admitted only if the estimate fits (the
    /// rule's own script), to settle with the actual cost; or the refusal. Never fails: while
    /// Redis is unreachable the fallback decides and holds it.
    pub async fn reserve_cost(
        &self,
        rule: &RedisRule,
        key: &str,
        estimate: u64,
    ) -> Result<CostHeld, Decision> {
        self.reserve_cost_decided(rule, key, estimate)
            .await
            .map(|(held, _)| held)
    }

    /// [`RedisLimiter::reserve_cost`], with the decision that admitted the estimate (what is
    /// left, for `RateLimit` headers).
    pub async fn reserve_cost_decided(
        &self,
        rule: &RedisRule,
        key: &str,
        estimate: u64,
    ) -> Result<(CostHeld, Decision), Decision> {
        let i = &self.inner;
        if i.healthy.load(std::sync::atomic::Ordering::Acquire) {
            match self.call(rule, key, estimate, i.now_arg(), None).await {
                Ok((d, taken)) => {
                    let held = Held::admitted(d, estimate, taken)?;
                    return Ok((CostHeld { held, local: false }, d));
                }
                Err(e) => i.failed(&e),
            }
        }
        self.reserve_locally(rule, key, estimate)
    }

    fn reserve_locally(
        &self,
        rule: &RedisRule,
        key: &str,
        estimate: u64,
    ) -> Result<(CostHeld, Decision), Decision> {
        let i = &self.inner;
        let (held, d) = match i.config.fallback {
            Fallback::Local => {
                i.fallback_decisions
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let now = rule.local_now();
                let d = rule.local_acquire_at(key, estimate, now);
                (Held::admitted(d, estimate, now)?, d)
            }
            _ => {
                let d = self.fallback(rule, key, 0);
                if !d.allowed() {
                    return Err(d);
                }
                (Held { estimate, taken: 0 }, d)
            }
        };
        Ok((CostHeld { held, local: true }, d))
    }

    /// Settles `held` to `actual`: the difference charged (a debt past the limit) or given
    /// back, atomically in Redis, or by the fallback that held it. Nothing for a rule that
    /// does not [settle](RedisRule::settles).
    pub async fn settle(&self, rule: &RedisRule, key: &str, held: CostHeld, actual: u64) {
        let Some(kind) = rule.settle_kind() else {
            return;
        };
        if actual == held.held.estimate {
            return;
        }
        if actual < held.held.estimate {
            self.inner.blocked.forget(rule, key);
        }
        if held.local {
            if self.inner.config.fallback == Fallback::Local {
                rule.local_settle(key, held.held, actual);
            }
            return;
        }
        if let Err(e) = self.try_settle(rule, key, held.held, actual, kind).await {
            self.inner.failed(&e);
            if actual > held.held.estimate {
                // The excess still counts, on this instance.
                rule.local_charge(key, actual - held.held.estimate);
            }
        }
    }

    /// Corrects `key`'s count by `units` without a reservation (a caller that charges and
    /// gives back on its own, like Envoy's stream-end calls): `refund` false charges them
    /// whatever the limit (a debt); true gives back at most what the state still holds, as
    /// if they had been charged just now. Redis unreachable: applied to the local stand-in.
    pub async fn adjust(&self, rule: &RedisRule, key: &str, units: u64, refund: bool) {
        let Some(kind) = rule.settle_kind() else {
            return;
        };
        if units == 0 {
            return;
        }
        if refund {
            self.inner.blocked.forget(rule, key);
        }
        // `taken` = -1: the script reads it as its own time.
        let (held, actual) = if refund { (units, 0) } else { (0, units) };
        let i = &self.inner;
        if i.healthy.load(std::sync::atomic::Ordering::Acquire) {
            match self.invoke_settle(rule, key, held, -1, actual, kind).await {
                Ok(()) => return,
                Err(e) => i.failed(&e),
            }
        }
        if i.config.fallback == Fallback::Local {
            let now = rule.local_now();
            rule.local_settle(
                key,
                Held {
                    estimate: held,
                    taken: now,
                },
                actual,
            );
        }
    }

    async fn try_settle(
        &self,
        rule: &RedisRule,
        key: &str,
        held: Held,
        actual: u64,
        kind: &str,
    ) -> Result<(), StoreError> {
        let taken = i64::try_from(held.taken).unwrap_or(i64::MAX);
        self.invoke_settle(rule, key, held.estimate, taken, actual, kind)
            .await
    }

    /// One run of the settle script: `estimate` held since `taken` (script time, µs; -1:
    /// now), corrected to `actual`.
    async fn invoke_settle(
        &self,
        rule: &RedisRule,
        key: &str,
        estimate: u64,
        taken: i64,
        actual: u64,
        kind: &str,
    ) -> Result<(), StoreError> {
        let Some(mut backend) = self.inner.backend.read().clone() else {
            return Err(StoreError::NotConnected);
        };
        let [k1, k2] = rule.keys(key);
        let [p1, _] = rule.params();
        let mut inv = scripts::SETTLE.prepare_invoke();
        inv.key(k1).key(k2).arg(self.inner.now_arg()).arg(actual);
        inv.arg(0u8).arg(rule.limit()).arg(kind).arg(p1);
        inv.arg(estimate).arg(taken);
        let timeout = self.inner.config.timeout;
        tokio::time::timeout(timeout, backend.invoke(&inv))
            .await
            .map_err(|_| StoreError::Timeout(timeout))??;
        Ok(())
    }
}
