//! Calendar budgets counted in Redis (weir-core's `budget`, one count every instance shares):
//! one key per rule, key and period — `weir:{budget:LEN:RULE:KEY}:PERIOD_START` — updated by one
//! atomic script (`lua/budget.lua`) and kept until a day after its period ends.
//!
//! The period is the caller's, from its own wall clock: instances whose clocks differ by a
//! second disagree about the period for that second at a boundary, no more. While Redis is
//! unreachable these calls fail (`StoreError`) and the caller counts locally
//! (weir-rules: the rule's own count on this instance); a settlement that cannot reach Redis
//! is lost (a refund not given back errs on the safe side).

use weir_core::budget::CountOf;

use crate::error::StoreError;
use crate::limiter::RedisLimiter;
use crate::scripts;

/// Seconds a count is kept after its period ends (a call held in a period may settle later).
pub const KEEP_AFTER: i64 = 86_400;

/// What a take decided: admitted, and the key's count in the period after it (or, refused,
/// before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetCount {
    /// Admitted (a soft budget always is).
    pub admitted: bool,
    /// The count.
    pub used: u64,
}

impl RedisLimiter {
    /// Takes `n` units of the count `of` (`now` Unix seconds, for the count's lifetime): a
    /// hard budget refuses past `limit`.
    pub async fn budget_take(
        &self,
        of: &CountOf<'_>,
        now: i64,
        n: u64,
        limit: u64,
        hard: bool,
    ) -> Result<BudgetCount, StoreError> {
        let units = i64::try_from(n).unwrap_or(i64::MAX);
        let (op, hard) = ("take", if hard { "1" } else { "0" });
        self.budget_script(of, now, [op, hard], units, limit).await
    }

    /// Adds `delta` units (negative: gives back, never below 0) to the count `of`.
    pub async fn budget_add(
        &self,
        of: &CountOf<'_>,
        now: i64,
        delta: i64,
    ) -> Result<BudgetCount, StoreError> {
        self.budget_script(of, now, ["add", "0"], delta, 0).await
    }

    /// One run of the script: `op` and `hard` as its first and fourth arguments.
    async fn budget_script(
        &self,
        of: &CountOf<'_>,
        now: i64,
        [op, hard]: [&str; 2],
        units: i64,
        limit: u64,
    ) -> Result<BudgetCount, StoreError> {
        let period = of.period;
        let i = &self.inner;
        if !i.healthy.load(std::sync::atomic::Ordering::Acquire) {
            return Err(StoreError::NotConnected);
        }
        let Some(mut backend) = i.backend.read().clone() else {
            return Err(StoreError::NotConnected);
        };
        let ttl = period
            .end
            .saturating_sub(now)
            .saturating_add(KEEP_AFTER)
            .max(1);
        let mut inv = scripts::BUDGET.prepare_invoke();
        inv.key(budget_key(of.rule, of.key, period.start))
            .arg(op)
            .arg(units)
            .arg(limit)
            .arg(hard)
            .arg(ttl);
        let timeout = i.config.timeout;
        let answer = tokio::time::timeout(timeout, backend.invoke(&inv))
            .await
            .map_err(|_| StoreError::Timeout(timeout))
            .and_then(|r| r.map_err(StoreError::from));
        let value = match answer {
            Ok(v) => v,
            Err(e) => {
                i.failed(&e);
                return Err(e);
            }
        };
        let parsed: Option<(i64, i64)> = redis::from_redis_value(value).ok();
        match parsed {
            Some((admitted, used)) if used >= 0 => Ok(BudgetCount {
                admitted: admitted == 1,
                used: used.unsigned_abs(),
            }),
            _ => Err(StoreError::Answer(
                "the budget script answered something else".into(),
            )),
        }
    }
}

/// The count's key: the rule (its length first, so no rule and key pair reads as another)
/// and key in one hash slot, the period after it.
fn budget_key(rule: &str, key: &str, period_start: i64) -> String {
    format!("weir:{{budget:{}:{rule}:{key}}}:{period_start}", rule.len())
}
