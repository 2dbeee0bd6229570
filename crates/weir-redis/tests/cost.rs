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

#[path = "../../weir-core/tests/support/cost_bound.rs"]
mod cost_bound;

/// A small deterministic generator (xorshift64*), for timelines run in real time.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The settle script keeps the bound of docs/cost.md on a real Redis: timelines of 120 calls
/// (estimates 1–59, actual costs 0–119) at 10 000 units/s with a burst of 500, each call lasting
/// from 1 ms to 100 × (estimate ÷ rate), run in real time one Redis call after another — what
/// the calls of any window cost is at most `burst + rate × window` plus the window's excesses
/// plus the estimates outstanding at its start (the window measured from the first call's
/// sending to the last's: a round trip's worth of units allowed for Redis's own clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_on_redis_keep_the_bound_on_timelines_of_long_calls() {
    use tokio::time::Instant;
    let redis = support::Redis::start();
    let config = RedisConfig {
        over_limit_cache: false,
        ..config()
    };
    let limiter = RedisLimiter::connect(&redis.url(), config).await.unwrap();
    const INTERVAL: u64 = 100_000; // ns: 10 000 units/s
    for (n, algorithm) in [RateAlgorithm::Gcra, RateAlgorithm::TokenBucket]
        .into_iter()
        .cycle()
        .take(6)
        .enumerate()
    {
        let spec = RateSpec::new(algorithm, 10_000, Duration::from_secs(1)).with_burst(500);
        let r = RedisRule::new(format!("timeline-{n}"), &spec, RuleOptions::default()).unwrap();
        let mut rng = Rng(0x9e37_79b9 + n as u64);
        // (at, estimate, actual, hold), ms from the start.
        let mut plan = Vec::new();
        let mut at = 0.0;
        for _ in 0..120 {
            at += rng.next() * 2.0;
            let estimate = 1 + (rng.next() * 59.0) as u64;
            let actual = (rng.next() * 120.0) as u64;
            let x = rng.next();
            let hold = 1.0 + x * x * x * estimate as f64 * 10.0;
            plan.push((at, estimate, actual, hold));
        }
        let start = Instant::now();
        let mut ledger = Vec::new();
        let mut open: Vec<(f64, weir_redis::CostHeld, u64, usize, u64)> = Vec::new();
        let mut rtt = Duration::ZERO;
        let ns = |i: Instant| (i - start).as_nanos() as u64;
        let mut next = 0;
        while next < plan.len() || !open.is_empty() {
            let settle_first = open
                .iter()
                .enumerate()
                .min_by(|a, b| a.1 .0.total_cmp(&b.1 .0))
                .filter(|(_, o)| next >= plan.len() || o.0 <= plan[next].0)
                .map(|(i, _)| i);
            if let Some(i) = settle_first {
                let (due, held, actual, call, estimate) = open.swap_remove(i);
                tokio::time::sleep_until(start + Duration::from_secs_f64(due / 1e3)).await;
                let sent = Instant::now();
                limiter.settle(&r, "k", held, actual).await;
                rtt = rtt.max(sent.elapsed());
                ledger.push(cost_bound::Entry::settled(ns(sent), call, estimate, actual));
                continue;
            }
            let (at, estimate, actual, hold) = plan[next];
            tokio::time::sleep_until(start + Duration::from_secs_f64(at / 1e3)).await;
            let sent = Instant::now();
            let held = limiter.reserve_cost(&r, "k", estimate).await;
            rtt = rtt.max(sent.elapsed());
            if let Ok(held) = held {
                ledger.push(cost_bound::Entry::admitted(
                    ns(sent),
                    next,
                    estimate,
                    actual,
                ));
                open.push((
                    ns(Instant::now()) as f64 / 1e6 + hold,
                    held,
                    actual,
                    next,
                    estimate,
                ));
            }
            next += 1;
        }
        let slack = rtt.as_nanos() as u64 / INTERVAL + 1;
        // Guava's token bucket lends its last grant (≤ 59).
        let credit = slack
            + if algorithm == RateAlgorithm::TokenBucket {
                59
            } else {
                0
            };
        assert!(ledger.iter().filter(|e| e.admission).count() > 10);
        assert_eq!(
            cost_bound::tokens_used_within(&ledger, INTERVAL, 500, credit),
            Ok(()),
            "{algorithm}, round trips up to {rtt:?}"
        );
    }
}

/// A call that outlasts the refill of its estimate gives back what it did not use on Redis as
/// in memory, whichever instance settles it (a budget counts tokens, not `max_tokens`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_calls_refund_gives_back_what_it_did_not_use() {
    let redis = support::Redis::start();
    let config = RedisConfig {
        over_limit_cache: false,
        ..config()
    };
    let a = RedisLimiter::connect(&redis.url(), config).await.unwrap();
    let b = RedisLimiter::connect(&redis.url(), config).await.unwrap();
    // 100 a second, a burst of 50: an estimate of 50 refills in half a second.
    let spec = RateSpec::new(RateAlgorithm::Gcra, 100, Duration::from_secs(1)).with_burst(50);
    let r = RedisRule::new("long-call", &spec, RuleOptions::default()).unwrap();
    let long = a.reserve_cost(&r, "k", 50).await.unwrap();
    // Twice its refill later, another call fills the burst.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let busy = b.reserve_cost(&r, "k", 50).await.unwrap();
    assert!(!b.check(&r, "k", 5).await.allowed());
    // The long call used 5: 45 come back at once.
    a.settle(&r, "k", long, 5).await;
    assert!(b.reserve_cost(&r, "k", 40).await.is_ok());
    b.settle(&r, "k", busy, 50).await;
}
