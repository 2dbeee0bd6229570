//! Overload-protection hot paths side by side, in one run on one machine:
//! `cargo bench -p weir-core --bench overload`.
//!
//! - `breaker_closed`: one admitted, successful call through a closed breaker (admit + record),
//!   weir with a time window (Hystrix preset) and a count window (Resilience4j preset), with
//!   `now` passed in and with two `MonotonicClock` reads (what a caller measuring the call's
//!   duration pays), against recloser (ring buffer, its default) and failsafe (its default
//!   consecutive-failures policy). Neither of those measures durations, so the fair pair is
//!   weir without clock reads vs them; the clocked row shows what slow-call detection costs.
//! - `adaptive`: acquire + release of one call through AIMD / Gradient2 / Vegas behind
//!   `Windowed` and through BBR.

// criterion_group! defines an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use weir_core::adaptive::bbr::{Bbr, BbrConfig};
use weir_core::adaptive::{AdaptiveLimiter, Aimd, Gradient2, LimitAlgorithm, Vegas, Windowed};
use weir_core::breaker::{Breaker, BreakerConfig};
use weir_core::stats::Outcome;
use weir_core::{Clock, ConcurrencyConfig, Criticality, MonotonicClock};

fn breaker_closed(c: &mut Criterion) {
    let mut g = c.benchmark_group("breaker_closed");
    let clock = MonotonicClock::new();
    for (name, config) in [
        ("weir_time_window", BreakerConfig::hystrix()),
        ("weir_count_window", BreakerConfig::resilience4j()),
    ] {
        let breaker = Breaker::new(config.clone()).unwrap();
        let mut now = 1_000_000_000u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                now += 1_000;
                let call = breaker.try_acquire(black_box(now)).unwrap();
                breaker.record(call, now + 500, Outcome::Success);
            })
        });
        let breaker = Breaker::new(config).unwrap();
        g.bench_function(format!("{name}_with_clock"), |b| {
            b.iter(|| {
                let call = breaker.try_acquire(clock.now()).unwrap();
                breaker.record(call, clock.now(), Outcome::Success);
            })
        });
    }
    let recloser = recloser::Recloser::default();
    g.bench_function("recloser", |b| {
        b.iter(|| black_box(recloser.call(|| Ok::<u32, ()>(black_box(1)))))
    });
    let failsafe = failsafe::Config::new().build();
    g.bench_function("failsafe", |b| {
        b.iter(|| {
            use failsafe::CircuitBreaker;
            black_box(failsafe.call(|| Ok::<u32, ()>(black_box(1))))
        })
    });
    g.finish();
}

fn adaptive_limiter(name: &str, algorithm: impl LimitAlgorithm + 'static, c: &mut Criterion) {
    let limiter = AdaptiveLimiter::new(
        algorithm,
        ConcurrencyConfig {
            max_in_flight: 1,
            max_queue: 0,
            order: weir_core::QueueOrder::Fifo,
            shares: Some(weir_core::criticality::Shares::default()),
        },
    )
    .unwrap();
    let mut now = 1_000_000_000u64;
    c.benchmark_group("adaptive").bench_function(name, |b| {
        b.iter(|| {
            now += 1_000;
            let permit = limiter.try_acquire(Criticality::Critical, now).unwrap();
            permit.success(now + 500);
        })
    });
}

fn adaptive(c: &mut Criterion) {
    adaptive_limiter("aimd", Windowed::new(Aimd::default()), c);
    adaptive_limiter("gradient2", Windowed::new(Gradient2::default()), c);
    adaptive_limiter("vegas", Windowed::new(Vegas::default()), c);
    let bbr = Bbr::new(BbrConfig::default(), Arc::new(|| 0.5)).unwrap();
    let mut now = 1_000_000_000u64;
    c.benchmark_group("adaptive").bench_function("bbr", |b| {
        b.iter(|| {
            now += 1_000;
            let permit = bbr.try_acquire(Criticality::Critical, now).unwrap();
            permit.finish(now + 500, Outcome::Success);
        })
    });
}

criterion_group!(benches, breaker_closed, adaptive);
criterion_main!(benches);
