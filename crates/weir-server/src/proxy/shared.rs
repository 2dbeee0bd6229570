//! The shared store of `weir proxy --store redis://…`: rules that say `shared: true` are
//! counted in Redis (weir-redis, its local fallback while Redis is unreachable), so every
//! proxy on that Redis counts one budget ([`weir_rules::shared`]).

use std::collections::HashMap;
use std::sync::Arc;

use weir_core::budget::CountOf;
use weir_core::Decision;
use weir_redis::{CostHeld, RedisLimiter, RedisRule, RuleOptions};
use weir_rules::shared::{BudgetDeciding, Deciding, SharedHeld, SharedRule, SharedStore};

/// Most rules kept (a reload that changes a rule's parameters makes a new one; past this the
/// table starts afresh).
const MAX_RULES: usize = 4_096;

/// Rules counted in Redis.
pub struct RedisShared {
    limiter: RedisLimiter,
    options: RuleOptions,
    /// Each rule's Redis form, by id, remade when its parameters change.
    rules: parking_lot::Mutex<HashMap<String, Arc<RedisRule>>>,
}

impl RedisShared {
    /// Rules through `limiter`; each one's local fallback allows `limit / instances`.
    pub fn new(limiter: RedisLimiter, instances: u64, keys: usize) -> Self {
        Self {
            limiter,
            options: RuleOptions {
                instances: instances.max(1),
                local_keys: keys.max(1),
                ..RuleOptions::default()
            },
            rules: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// `rule`'s Redis form (`None`: parameters Redis cannot count — refused by validation).
    fn rule(&self, rule: &SharedRule) -> Option<Arc<RedisRule>> {
        let mut rules = self.rules.lock();
        if let Some(r) = rules.get(&rule.name).filter(|r| *r.spec() == rule.spec) {
            return Some(r.clone());
        }
        let r = Arc::new(RedisRule::new(rule.name.clone(), &rule.spec, self.options).ok()?);
        if rules.len() >= MAX_RULES {
            rules.clear();
        }
        rules.insert(rule.name.clone(), r.clone());
        Some(r)
    }
}

impl SharedStore for RedisShared {
    fn acquire<'a>(
        &'a self,
        rule: &'a SharedRule,
        key: &'a str,
        n: u64,
        cost: bool,
    ) -> Deciding<'a> {
        Box::pin(async move {
            let Some(r) = self.rule(rule) else {
                return (Decision::never(0, 0, 0), None);
            };
            if !cost {
                return (self.limiter.check(&r, key, n).await, None);
            }
            match self.limiter.reserve_cost_decided(&r, key, n).await {
                Ok((held, d)) => (d, Some(SharedHeld(Box::new((r, held))))),
                Err(d) => (d, None),
            }
        })
    }

    fn settle(&self, _rule: &SharedRule, key: &str, held: SharedHeld, actual: u64) {
        let Ok(held) = held.0.downcast::<(Arc<RedisRule>, CostHeld)>() else {
            return;
        };
        let (r, held) = *held;
        let (limiter, key) = (self.limiter.clone(), key.to_string());
        // Outside a runtime (never in the proxy) the settlement is lost: the estimate stays.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { limiter.settle(&r, &key, held, actual).await });
        }
    }

    fn take_budget<'a>(
        &'a self,
        of: CountOf<'a>,
        now: i64,
        n: u64,
        limit: u64,
        hard: bool,
    ) -> BudgetDeciding<'a> {
        Box::pin(async move {
            self.limiter
                .budget_take(&of, now, n, limit, hard)
                .await
                .ok()
                .map(|c| (c.admitted, c.used))
        })
    }

    fn add_budget(&self, of: CountOf<'_>, now: i64, delta: i64) {
        let (limiter, rule, key) = (
            self.limiter.clone(),
            of.rule.to_string(),
            of.key.to_string(),
        );
        let period = of.period;
        // Outside a runtime (never in the proxy) the correction is lost.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let of = CountOf {
                    rule: &rule,
                    key: &key,
                    period,
                };
                let _ = limiter.budget_add(&of, now, delta).await;
            });
        }
    }
}
