//! One table of timelines, run against weir-core's in-memory algorithms and against the Redis
//! scripts (with the caller's time, so both see the same clock): every decision must be equal
//! (allowed, limit, remaining, retry_after incl. "never", reset_after).

mod support;

use std::time::Duration;

use weir_core::rate::{RateAlgorithm as A, RateSpec};
use weir_core::{
    Algorithm, Decision, FixedWindow, Gcra, Limiter, ManualClock, Quota, SlidingCounter,
    SlidingLog, SlidingWindow, TokenBucket,
};
use weir_redis::{RedisConfig, RedisLimiter, RedisRule, RuleOptions};

struct Case {
    /// Algorithm and burst or buckets (limit and window below).
    algorithm: (A, u64),
    limit: u64,
    window_ms: u64,
    seed: u64,
}

/// Requests: (µs since the case's start, n). Deterministic from the seed: bursts, gaps,
/// peeks (n = 0), over-limit asks (n > limit).
fn timeline(case: &Case) -> Vec<(u64, u64)> {
    let mut x = case.seed;
    let mut next = || {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let w = case.window_ms * 1_000;
    let mut t = 0;
    (0..300)
        .map(|_| {
            t += match next() % 10 {
                0..=4 => 0,
                5..=7 => next() % (w / 10 + 1),
                8 => next() % w,
                _ => w + next() % (2 * w),
            };
            let n = match next() % 20 {
                0 => 0,
                1 => case.limit + 1,
                2..=4 => 1 + next() % 3,
                _ => 1,
            };
            (t, n)
        })
        .collect()
}

fn core_run<A: Algorithm>(alg: A, start_us: u64, steps: &[(u64, u64)]) -> Vec<Decision> {
    let clock = ManualClock::new(0);
    let limiter = Limiter::with_clock(alg, &clock);
    steps
        .iter()
        .map(|&(t, n)| {
            clock.set((start_us + t) * 1_000);
            limiter.acquire(n)
        })
        .collect()
}

/// Redis works in whole µs, weir-core in ns: times are compared rounded up to the µs (Redis's
/// answer is never earlier than the exact one).
fn show(d: &Decision) -> String {
    let us = |x: Duration| x.as_nanos().div_ceil(1_000);
    format!(
        "allowed={} limit={} remaining={} retry_us={:?} reset_us={}",
        d.allowed(),
        d.limit(),
        d.remaining(),
        d.retry_after().map(us),
        us(d.reset_after())
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_scripts_decide_like_weir_core() {
    let redis = support::Redis::start();
    // Decisions are compared here, not latency: a generous timeout for a busy machine.
    let config = RedisConfig {
        timeout: Duration::from_secs(5),
        ..RedisConfig::default()
    };
    let limiter = RedisLimiter::connect(&redis.url(), config).await.unwrap();
    let mut cases = Vec::new();
    for seed in 1..=4u64 {
        for (algorithm, limit, window_ms) in [
            ((A::FixedWindow, 0), 5, 1_000),
            ((A::FixedWindow, 0), 100, 60_000),
            ((A::SlidingCounter, 0), 10, 1_000),
            ((A::SlidingCounter, 0), 7, 30_000),
            ((A::SlidingWindow, 10), 8, 1_000),
            ((A::SlidingWindow, 4), 20, 60_000),
            ((A::SlidingLog, 0), 5, 1_000),
            ((A::SlidingLog, 0), 20, 10_000),
            ((A::Gcra, 1), 10, 1_000),
            ((A::Gcra, 5), 4, 100),
            ((A::TokenBucket, 3), 10, 1_000),
            ((A::TokenBucket, 8), 8, 2_000),
        ] {
            cases.push(Case {
                algorithm,
                limit,
                // Scaled up: the scripts' expiries (PEXPIRE, SET PX) run on Redis's real clock
                // while this test feeds virtual time; with windows ≥ 10 s of virtual time, every
                // TTL is seconds of real time, far above any scheduling stall (a 100 ms window once
                // let a key expire under a stalled CI run and the decisions diverged).
                window_ms: window_ms * 100,
                seed,
            });
        }
    }
    let mut compared = 0;
    for (i, case) in cases.iter().enumerate() {
        let steps = timeline(case);
        // Start at an arbitrary, window-unaligned time well after the project epoch.
        let start_us = 86_400_000_000 * 30 + 123_457 + case.seed * 7_777;
        let window = Duration::from_millis(case.window_ms);
        let quota = Quota::new(case.limit, window).unwrap();
        let (algorithm, param) = case.algorithm;
        let expected = match algorithm {
            A::FixedWindow => core_run(FixedWindow::new(quota).unwrap(), start_us, &steps),
            A::SlidingCounter => core_run(SlidingCounter::new(quota).unwrap(), start_us, &steps),
            A::SlidingLog => core_run(SlidingLog::new(quota).unwrap(), start_us, &steps),
            A::SlidingWindow => core_run(
                SlidingWindow::new(quota, param as u32).unwrap(),
                start_us,
                &steps,
            ),
            A::Gcra => core_run(Gcra::new(quota, param).unwrap(), start_us, &steps),
            A::TokenBucket => core_run(TokenBucket::new(quota, param).unwrap(), start_us, &steps),
            A::Pacing | A::WarmUp => unreachable!(),
        };
        let mut spec = RateSpec::new(algorithm, case.limit, window);
        match algorithm {
            A::SlidingWindow => spec = spec.with_buckets(param as u32),
            A::Gcra | A::TokenBucket => spec = spec.with_burst(param),
            _ => {}
        }
        let rule = RedisRule::new(format!("table{i}"), &spec, RuleOptions::default()).unwrap();
        let mut allowed = 0;
        for (step, (&(t, n), want)) in steps.iter().zip(&expected).enumerate() {
            let got = limiter
                .try_check(&rule, "k", n, Some(start_us + t))
                .await
                .unwrap();
            assert_eq!(
                show(&got),
                show(want),
                "{} limit {} / {} ms seed {}: step {step} (t = {t} µs, n = {n})",
                algorithm,
                case.limit,
                case.window_ms,
                case.seed
            );
            allowed += u64::from(got.allowed());
            compared += 1;
        }
        assert!(
            allowed > 0 && allowed < steps.len() as u64,
            "the timeline exercises both outcomes"
        );
    }
    assert_eq!(compared, 48 * 300);
}
