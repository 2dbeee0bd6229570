//! Weir's limiters side by side with governor, in one run on one machine.
//!
//! Every weir algorithm (and governor's GCRA for reference) with criterion:
//! `cargo bench -p weir-core --bench limiters`. The headline weir / governor ratios come from
//! the interleaved `compare` bench, which is robust to this shared machine's noise; this one
//! gives the per-algorithm table. Groups:
//! - `clock`: cost of reading each clock;
//! - `direct_1t` / `direct_2t`: one limiter, allowed path, 1 and 2 threads (2 threads: time per
//!   decision of the pair, i.e. 1 / aggregate throughput);
//! - `denied_1t`: one limiter, denied path.

// criterion_group! defines an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};

mod support;
use support::two_threads;
use weir_core::{
    Algorithm, Clock, FixedWindow, Gcra, Limiter, MonotonicClock, Pacing, Quota, SlidingCounter,
    SlidingLog, SlidingWindow, SystemClock, TokenBucket, WarmupTokenBucket,
};

const FAST: u64 = 1_000_000_000; // per second: never denies at benchmark speed

fn fast_quota() -> Quota {
    Quota::per_second(FAST).unwrap()
}

fn gov_fast() -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::new(FAST as u32).unwrap())
}

fn gov_slow() -> governor::Quota {
    governor::Quota::per_hour(NonZeroU32::new(1).unwrap())
}

fn clocks(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock");
    g.bench_function("std_instant_now", |b| b.iter(|| black_box(Instant::now())));
    let sys = SystemClock::new();
    g.bench_function("weir_system_clock", |b| b.iter(|| black_box(sys.now())));
    let mono = MonotonicClock::new();
    g.bench_function("weir_monotonic_clock", |b| b.iter(|| black_box(mono.now())));
    let q = quanta::Clock::new();
    g.bench_function("quanta_now_governor_clock", |b| {
        b.iter(|| black_box(q.now()))
    });
    g.finish();
}

fn weir_direct<A: Algorithm>(alg: A) -> Arc<Limiter<A>> {
    Arc::new(Limiter::new(alg))
}

/// Each weir algorithm with a quota it never exhausts.
type Call = Arc<dyn Fn() -> bool + Send + Sync>;

fn allowed_algorithms() -> Vec<(&'static str, Call)> {
    fn wrap<A: Algorithm>(l: Arc<Limiter<A>>) -> Call {
        Arc::new(move || l.acquire(1).allowed())
    }
    let q = fast_quota();
    let big = Quota::per_second(1 << 24).unwrap();
    vec![
        ("weir_gcra", wrap(weir_direct(Gcra::from_quota(q).unwrap()))),
        (
            "weir_token_bucket",
            wrap(weir_direct(TokenBucket::new(q, FAST).unwrap())),
        ),
        (
            "weir_fixed_window",
            wrap(weir_direct(FixedWindow::new(q).unwrap())),
        ),
        (
            "weir_pacing",
            wrap(weir_direct(Pacing::new(q, Duration::MAX).unwrap())),
        ),
        (
            "weir_sliding_window",
            wrap(weir_direct(SlidingWindow::new(q, 10).unwrap())),
        ),
        (
            "weir_sliding_counter",
            wrap(weir_direct(SlidingCounter::new(q).unwrap())),
        ),
        (
            "weir_sliding_log",
            wrap(weir_direct(SlidingLog::new(big).unwrap())),
        ),
        (
            "weir_warmup_token_bucket",
            wrap(weir_direct(
                WarmupTokenBucket::new(q, Duration::from_secs(1))
                    .unwrap()
                    .with_max_wait(Duration::MAX),
            )),
        ),
    ]
}

fn direct(c: &mut Criterion) {
    let gov = Arc::new(governor::RateLimiter::direct(gov_fast()));
    let mut g = c.benchmark_group("direct_1t");
    {
        let gov = gov.clone();
        g.bench_function("governor_gcra", move |b| {
            b.iter(|| black_box(gov.check().is_ok()))
        });
    }
    for (name, f) in allowed_algorithms() {
        g.bench_function(name, move |b| b.iter(|| black_box(f())));
    }
    g.finish();

    let mut g = c.benchmark_group("direct_2t");
    {
        let gov = gov.clone();
        g.bench_function("governor_gcra", move |b| {
            b.iter_custom(|iters| {
                let gov = gov.clone();
                two_threads(
                    iters,
                    Arc::new(move || {
                        black_box(gov.check().is_ok());
                    }),
                )
            })
        });
    }
    for (name, f) in allowed_algorithms() {
        g.bench_function(name, move |b| {
            b.iter_custom(|iters| {
                let f = f.clone();
                two_threads(
                    iters,
                    Arc::new(move || {
                        black_box(f());
                    }),
                )
            })
        });
    }
    g.finish();
}

fn denied(c: &mut Criterion) {
    let mut g = c.benchmark_group("denied_1t");
    let gov = governor::RateLimiter::direct(gov_slow());
    let _ = gov.check();
    g.bench_function("governor_gcra", |b| {
        b.iter(|| black_box(gov.check().is_ok()))
    });
    let slow = Quota::new(1, Duration::from_secs(3600)).unwrap();
    macro_rules! denied {
        ($name:expr, $alg:expr) => {{
            let l = Limiter::new($alg);
            // Exhaust it (token buckets also grant one request on credit).
            let mut tries = 0;
            while l.acquire(1).allowed() {
                tries += 1;
                assert!(tries < 10, "{} never denies", $name);
            }
            g.bench_function($name, |b| b.iter(|| black_box(l.acquire(1).allowed())));
        }};
    }
    denied!("weir_gcra", Gcra::from_quota(slow).unwrap());
    denied!("weir_token_bucket", TokenBucket::new(slow, 1).unwrap());
    denied!("weir_fixed_window", FixedWindow::new(slow).unwrap());
    denied!("weir_pacing", Pacing::new(slow, Duration::ZERO).unwrap());
    denied!("weir_sliding_window", SlidingWindow::new(slow, 10).unwrap());
    denied!("weir_sliding_counter", SlidingCounter::new(slow).unwrap());
    denied!("weir_sliding_log", SlidingLog::new(slow).unwrap());
    denied!(
        "weir_warmup_token_bucket",
        WarmupTokenBucket::new(slow, Duration::from_secs(1)).unwrap()
    );
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(40)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = clocks, direct, denied
}
criterion_main!(benches);
