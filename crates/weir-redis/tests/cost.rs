//! Cost reservations on a real Redis: the estimate held by the rule's script, then settled
//! atomically — a refund gives room back to every instance, an excess is a debt every
//! instance sees — and the fallback holds and settles them while Redis is down.

mod support;

use std::time::Duration;

use weir_core::rate::{RateAlgorithm, RateSpec};
use weir_redis::{RedisConfig, RedisLimiter, RedisRule, RuleOptions};

fn config() -> RedisConfig {
    RedisConfig {
        timeout: Duration::from_secs(5),
        ..RedisConfig::default()
    }
}

fn rule(name: &str, algorithm: RateAlgorithm) -> RedisRule {
    // 1 000 per hour: no time that passes during the test refills anything that matters.
    let spec = RateSpec::new(algorithm, 1_000, Duration::from_secs(3_600));
    RedisRule::new(name, &spec, RuleOptions::default()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_debts_are_shared_by_every_instance() {
    let redis = support::Redis::start();
    let a = RedisLimiter::connect(&redis.url(), config()).await.unwrap();
    let b = RedisLimiter::connect(&redis.url(), config()).await.unwrap();
    // (The token bucket grants one request on credit past a full bucket: its own test below.)
    for algorithm in [RateAlgorithm::Gcra, RateAlgorithm::FixedWindow] {
        let r = rule(&format!("cost-{algorithm}"), algorithm);
        assert!(r.settles());
        // a holds 900; b cannot take 200 of the 1 000.
        let held = a.reserve_cost(&r, "user", 900).await.unwrap();
        assert_eq!(held.estimate(), 900);
        assert!(!held.is_local());
        assert!(
            b.reserve_cost(&r, "user", 200).await.is_err(),
            "{algorithm}"
        );
        // The call used 100: 800 come back, for b too.
        a.settle(&r, "user", held, 100).await;
        let b_held = b.reserve_cost(&r, "user", 800).await;
        assert!(b_held.is_ok(), "{algorithm}: refund not seen by b");
        // b's call cost 1 500 more than its estimate: a debt; nothing passes for a.
        b.settle(&r, "user", b_held.unwrap(), 2_300).await;
        let refused = a.check(&r, "user", 1).await;
        assert!(!refused.allowed(), "{algorithm}: debt not seen by a");
        // Another key has its own budget.
        assert!(a.check(&r, "other", 1).await.allowed());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_bucket_settles_too() {
    let redis = support::Redis::start();
    let limiter = RedisLimiter::connect(&redis.url(), config()).await.unwrap();
    let r = rule("cost-bucket", RateAlgorithm::TokenBucket);
    let held = limiter.reserve_cost(&r, "k", 1_000).await.unwrap();
    // Guava semantics: one more on credit, then nothing.
    assert!(limiter.check(&r, "k", 1).await.allowed());
    assert!(!limiter.check(&r, "k", 1).await.allowed());
    limiter.settle(&r, "k", held, 0).await;
    let held = limiter.reserve_cost(&r, "k", 900).await.unwrap();
    limiter.settle(&r, "k", held, 3_000).await;
    assert!(!limiter.check(&r, "k", 1).await.allowed(), "the debt holds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_reservation_gives_everything_back_and_a_plain_rule_ignores_settlement() {
    let redis = support::Redis::start();
    let limiter = RedisLimiter::connect(&redis.url(), config()).await.unwrap();
    let r = rule("cost-cancel", RateAlgorithm::Gcra);
    let held = limiter.reserve_cost(&r, "k", 1_000).await.unwrap();
    assert!(!limiter.check(&r, "k", 1).await.allowed());
    limiter.settle(&r, "k", held, 0).await;
    // All but the unit whose time has begun to pass (refunds round down).
    assert!(limiter.reserve_cost(&r, "k", 999).await.is_ok());
    // A sliding log does not settle: the reservation stays a plain acquire.
    let log = rule("cost-log", RateAlgorithm::SlidingLog);
    assert!(!log.settles());
    let held = limiter.reserve_cost(&log, "k", 1_000).await.unwrap();
    limiter.settle(&log, "k", held, 0).await;
    assert!(!limiter.check(&log, "k", 1).await.allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_the_fallback_holds_and_settles() {
    let mut redis = support::Redis::start();
    let limiter = RedisLimiter::connect(&redis.url(), config()).await.unwrap();
    let spec = RateSpec::new(RateAlgorithm::Gcra, 1_000, Duration::from_secs(3_600));
    let options = RuleOptions {
        instances: 2,
        ..RuleOptions::default()
    };
    let r = RedisRule::new("cost-fallback", &spec, options).unwrap();
    redis.kill();
    // This instance's share is 500.
    let held = limiter.reserve_cost(&r, "k", 400).await.unwrap();
    assert!(held.is_local());
    assert!(limiter.reserve_cost(&r, "k", 200).await.is_err());
    limiter.settle(&r, "k", held, 100).await;
    assert!(limiter.reserve_cost(&r, "k", 350).await.is_ok());
}

/// Adjustments without a reservation (Envoy's stream-end calls): a charge past the limit is a
/// debt every instance sees; a refund gives back at most what the state holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adjustments_charge_past_the_limit_and_refund_only_what_is_held() {
    let redis = support::Redis::start();
    let a = RedisLimiter::connect(&redis.url(), config()).await.unwrap();
    let b = RedisLimiter::connect(&redis.url(), config()).await.unwrap();
    for algorithm in [RateAlgorithm::Gcra, RateAlgorithm::FixedWindow] {
        let r = rule(&format!("adjust-{algorithm}"), algorithm);
        assert!(a.check(&r, "k", 600).await.allowed());
        // 600 + 700 > 1 000: charged anyway.
        a.adjust(&r, "k", 700, false).await;
        assert!(!b.check(&r, "k", 1).await.allowed(), "{algorithm}: debt");
        // 1 000 back: 1 300 were held, 300 stay; 700 fit again, 701 do not. (b refused the
        // key and remembers it: the refunding instance forgets its refusal; others may go on
        // refusing until the retry time they were told, on the safe side.)
        b.adjust(&r, "k", 1_000, true).await;
        assert!(!b.check(&r, "k", 701).await.allowed(), "{algorithm}");
        assert!(b.check(&r, "k", 690).await.allowed(), "{algorithm}");
        // A refund larger than everything held empties the key, never past empty.
        b.adjust(&r, "k", 1_000_000, true).await;
        assert!(!b.check(&r, "k", 1_001).await.allowed(), "{algorithm}");
        assert!(b.check(&r, "k", 990).await.allowed(), "{algorithm}");
    }
}
