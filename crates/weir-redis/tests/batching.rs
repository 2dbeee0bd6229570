//! Local batching for hot keys against real Redis: exact totals for one instance, and the
//! documented over-admission bound (instances × (batch − 1) per window span) under load.

mod support;

use std::time::{Duration, Instant};

use weir_core::rate::{RateAlgorithm, RateSpec};
use weir_redis::{caller_now_us, RedisConfig, RedisLimiter, RedisRule, RuleOptions};

fn config() -> RedisConfig {
    RedisConfig {
        timeout: Duration::from_secs(5),
        ..RedisConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_takes_batches_and_admits_exactly_the_limit() {
    let redis = support::Redis::start();
    let limiter = RedisLimiter::connect(&redis.url(), config()).await.unwrap();
    let rule = RedisRule::new(
        "batch-exact",
        &RateSpec::new(RateAlgorithm::FixedWindow, 22, Duration::from_secs(3_600)),
        RuleOptions {
            batch: 5,
            ..RuleOptions::default()
        },
    )
    .unwrap();
    let mut allowed = 0;
    for _ in 0..40 {
        allowed += u64::from(limiter.check(&rule, "hot", 1).await.allowed());
    }
    // 4 batches of 5, then single units for the last 2 that do not fit a batch.
    assert_eq!(allowed, 22);
    let stored = support::raw(redis.port, "HGET weir:{batch-exact:hot} c").unwrap();
    assert!(stored.contains("\r\n22\r\n"), "{stored}");
    let calls = support::raw(redis.port, "INFO commandstats").unwrap();
    let line = calls
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha"))
        .unwrap();
    eprintln!("{line}");
    // 1 EVALSHA answered NOSCRIPT (first use), 4 batches, then 3 × (batch denied + one unit),
    // the last denial cached: the other 17 requests never reach Redis.
    let n: u64 = line
        .split("calls=")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(n <= 11, "{n} round trips for 40 requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_admission_stays_within_the_documented_bound() {
    let redis = support::Redis::start();
    const LIMIT: u64 = 40;
    const BATCH: u64 = 4;
    const INSTANCES: u64 = 4;
    let window = Duration::from_millis(500);
    let rule: &'static RedisRule = Box::leak(Box::new(
        RedisRule::new(
            "batch-bound",
            &RateSpec::new(RateAlgorithm::SlidingLog, LIMIT, window),
            RuleOptions {
                batch: BATCH,
                instances: INSTANCES,
                ..RuleOptions::default()
            },
        )
        .unwrap(),
    ));
    let deadline = Instant::now() + Duration::from_millis(1_600);
    let mut tasks = Vec::new();
    for _ in 0..INSTANCES {
        let limiter = RedisLimiter::connect(&redis.url(), config()).await.unwrap();
        for _ in 0..8 {
            let limiter = limiter.clone();
            tasks.push(tokio::spawn(async move {
                let (mut times, mut slowest) = (Vec::new(), 0u64);
                for _ in 0..200_000 {
                    if Instant::now() >= deadline {
                        break;
                    }
                    // The unit is admitted somewhere between these two readings.
                    let before = caller_now_us();
                    let allowed = limiter.check(rule, "hot", 1).await.allowed();
                    slowest = slowest.max(caller_now_us() - before);
                    if allowed {
                        times.push(before);
                    }
                    tokio::task::yield_now().await;
                }
                (times, slowest)
            }));
        }
    }
    let (mut times, mut slowest) = (Vec::new(), 0);
    for t in tasks {
        let (ts, s) = t.await.unwrap();
        times.extend(ts);
        slowest = slowest.max(s);
    }
    times.sort_unstable();
    // Admissions recorded at call start are at most `slowest` early: two admissions a true
    // window apart are at least (window − slowest) apart here, so counting in spans of that
    // length never over-counts.
    let w = window.as_micros() as u64 - slowest.min(window.as_micros() as u64 / 2);
    let (mut best, mut j) = (0, 0);
    for i in 0..times.len() {
        while times[j] + w <= times[i] {
            j += 1;
        }
        best = best.max(i - j + 1);
    }
    let bound = LIMIT + INSTANCES * (BATCH - 1);
    eprintln!(
        "{} admitted, max {best} in a window span, bound {bound}",
        times.len()
    );
    assert!(
        times.len() as u64 >= 2 * LIMIT,
        "the load saturated the limit"
    );
    assert!(best as u64 <= bound, "{best} in one window span > {bound}");
}
