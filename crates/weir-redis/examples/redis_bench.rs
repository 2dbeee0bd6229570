//! Closed-loop load on one Redis: `C` tasks deciding as fast as they can for a duration.
//! Prints one JSON line: decisions per second, p50 and p99 latency in µs.
//!
//! `cargo run --release -p weir-redis --example redis_bench -- URL ALGORITHM CONCURRENCY MILLIS [KEYS]`
//! (ALGORITHM: gcra, sliding_counter, fixed_window, sliding_log, token_bucket;
//! WEIR_BENCH_BATCH=k takes k units per round trip, local batching). Used by
//! `bench/redis-compare`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_core::rate::{RateAlgorithm, RateSpec};
use weir_redis::{RedisConfig, RedisLimiter, RedisRule, RuleOptions};

fn main() {
    // One runtime thread by default: Redis needs a core of its own on a 2-core machine.
    let threads =
        std::env::var("WEIR_BENCH_THREADS").map_or(1, |t| t.parse().expect("WEIR_BENCH_THREADS"));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run());
}

async fn run() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        eprintln!("usage: redis_bench URL ALGORITHM CONCURRENCY MILLIS [KEYS]");
        std::process::exit(2);
    }
    let on_redis = [
        RateAlgorithm::Gcra,
        RateAlgorithm::TokenBucket,
        RateAlgorithm::SlidingCounter,
        RateAlgorithm::SlidingLog,
        RateAlgorithm::FixedWindow,
    ];
    let Some(algorithm) = RateAlgorithm::parse_among(&args[1], &on_redis) else {
        eprintln!("redis_bench: unknown algorithm {}", args[1]);
        std::process::exit(2);
    };
    let concurrency: usize = args[2].parse().expect("CONCURRENCY");
    let run = Duration::from_millis(args[3].parse().expect("MILLIS"));
    let keys: usize = args.get(4).map_or(1_000, |k| k.parse().expect("KEYS"));
    // A limit no key reaches: every call is a full round trip to Redis (no over-limit cache).
    let rule = Arc::new(
        RedisRule::new(
            format!("bench-{algorithm}"),
            &RateSpec::new(algorithm, 1_000_000, Duration::from_secs(1)).with_burst(1_000),
            RuleOptions {
                batch: std::env::var("WEIR_BENCH_BATCH")
                    .map_or(1, |b| b.parse().expect("WEIR_BENCH_BATCH")),
                ..RuleOptions::default()
            },
        )
        .expect("rule"),
    );
    let config = RedisConfig {
        timeout: Duration::from_secs(1),
        ..RedisConfig::default()
    };
    let limiter = RedisLimiter::connect(&args[0], config)
        .await
        .expect("connect");
    let deadline = Instant::now() + run;
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let (limiter, rule) = (limiter.clone(), rule.clone());
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(1 << 16);
                let mut i = t;
                while Instant::now() < deadline && lat.len() < 5_000_000 {
                    let key = format!("k{}", i % keys);
                    let start = Instant::now();
                    let d = limiter.check(&rule, &key, 1).await;
                    lat.push(start.elapsed().as_micros() as u32);
                    assert!(d.allowed());
                    i += concurrency;
                }
                lat
            })
        })
        .collect();
    let started = Instant::now();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    let secs = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
    let s = limiter.status();
    assert!(s.fallback_decisions == 0, "fallback used: {s:?}");
    println!(
        "{{\"ops_per_s\": {:.0}, \"p50_us\": {}, \"p99_us\": {}, \"calls\": {}}}",
        all.len() as f64 / secs,
        pct(0.50),
        pct(0.99),
        all.len()
    );
}
