//! Weir's limiters side by side with governor, in one run on one machine.
//!
//! `cargo bench -p weir-core --bench limiters` (or `bench/core-compare`, which also prints the
//! table of ratios for the README). Groups:
//! - `clock`: cost of reading each clock;
//! - `direct_1t` / `direct_2t`: one limiter, allowed path, 1 and 2 threads (2 threads: time per
//!   decision of the pair, i.e. 1 / aggregate throughput);
//! - `denied_1t`: one limiter, denied path;
//! - `keyed`: one hot key, and 1 M live keys visited in random order.
//! Memory per key at 1 M keys is measured with a counting allocator and printed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use weir_core::{
    Algorithm, Clock, FixedWindow, Gcra, KeyedLimiter, Limiter, MonotonicClock, Pacing, Quota,
    SlidingCounter, SlidingLog, SlidingWindow, SystemClock, TokenBucket, WarmupTokenBucket,
};

/// Counts live heap bytes so memory per key can be measured.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: ptr was allocated by System.alloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

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

/// Runs `f` on two threads, `iters` calls in all, and returns the elapsed time.
fn two_threads<F: Fn() + Send + Sync + 'static>(iters: u64, f: Arc<F>) -> Duration {
    let barrier = Arc::new(Barrier::new(3));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (f, barrier) = (f.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..iters / 2 {
                    f();
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    start.elapsed()
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
fn allowed_algorithms() -> Vec<(&'static str, Arc<dyn Fn() -> bool + Send + Sync>)> {
    fn wrap<A: Algorithm>(l: Arc<Limiter<A>>) -> Arc<dyn Fn() -> bool + Send + Sync> {
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

const KEYS: u64 = 1_000_000;

/// xorshift: the same cheap key sequence for both libraries.
#[inline]
fn next_key(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x % KEYS
}

fn keyed(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed");
    // Hot key.
    let gov = governor::RateLimiter::keyed(gov_fast());
    let weir =
        KeyedLimiter::<u64, _>::new(Gcra::from_quota(fast_quota()).unwrap(), 1 << 20).unwrap();
    g.bench_function(BenchmarkId::new("governor", "hot_key"), |b| {
        b.iter(|| black_box(gov.check_key(&7).is_ok()))
    });
    g.bench_function(BenchmarkId::new("weir", "hot_key"), |b| {
        b.iter(|| black_box(weir.acquire(&7, 1).allowed()))
    });
    drop((gov, weir));

    // 1 M live keys; memory measured while building.
    let before = LIVE.load(Ordering::Relaxed);
    let gov = governor::RateLimiter::keyed(gov_fast());
    for k in 0..KEYS {
        let _ = gov.check_key(&k);
    }
    let gov_bytes = LIVE.load(Ordering::Relaxed) - before;
    let before = LIVE.load(Ordering::Relaxed);
    let weir =
        KeyedLimiter::<u64, _>::new(Gcra::from_quota(fast_quota()).unwrap(), 1 << 20).unwrap();
    for k in 0..KEYS {
        let _ = weir.acquire(&k, 1);
    }
    let weir_bytes = LIVE.load(Ordering::Relaxed) - before;
    assert_eq!(weir.len() as u64, KEYS);
    assert_eq!(weir.evictions(), 0);
    eprintln!(
        "memory at 1M keys: weir {:.1} B/key, governor {:.1} B/key",
        weir_bytes as f64 / KEYS as f64,
        gov_bytes as f64 / KEYS as f64
    );
    std::fs::create_dir_all("target/criterion").ok();
    let _ = std::fs::write(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/criterion/keyed-memory.txt"
        ),
        format!(
            "weir_bytes_per_key={:.1}\ngovernor_bytes_per_key={:.1}\n",
            weir_bytes as f64 / KEYS as f64,
            gov_bytes as f64 / KEYS as f64
        ),
    );
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    g.bench_function(BenchmarkId::new("governor", "1M_keys"), |b| {
        b.iter(|| black_box(gov.check_key(&next_key(&mut x)).is_ok()))
    });
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    g.bench_function(BenchmarkId::new("weir", "1M_keys"), |b| {
        b.iter(|| black_box(weir.acquire(&next_key(&mut x), 1).allowed()))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(40)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = clocks, direct, denied, keyed
}
criterion_main!(benches);
