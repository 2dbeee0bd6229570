//! Weir vs governor, interleaved: the headline ratios of the README.
//!
//! `cargo bench -p weir-core --bench compare` (or `bench/core-compare`).
//!
//! This machine is shared and noisy: a benchmark that runs one contender for seconds and then
//! the other measures the neighbours as much as the code. Here every round times a short batch of
//! each contender in turn (order alternating), and each ratio is the median over rounds of the
//! per-round ratio weir / governor, so slow phases of the machine hit both sides alike. Times are
//! per decision (for 2 threads: wall time of the pair / decisions, i.e. 1 / throughput).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use weir_core::{Gcra, KeyedLimiter, Limiter, Quota, TokenBucket};

mod support;

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

const FAST: u32 = 1_000_000_000;
const KEYS: u64 = 1_000_000;
const ROUNDS: usize = 41;

type Bench = Box<dyn FnMut(u64) -> f64>;

/// Times `iters` calls of `f` on one thread: ns per call.
fn one_thread(mut f: impl FnMut() -> bool + 'static) -> Bench {
    Box::new(move |iters| {
        let start = Instant::now();
        for _ in 0..iters {
            black_box(f());
        }
        start.elapsed().as_nanos() as f64 / iters as f64
    })
}

/// Times `iters` calls split over two threads on shared state: ns per call of the pair.
fn two_threads(f: Arc<dyn Fn() -> bool + Send + Sync>) -> Bench {
    Box::new(move |iters| {
        let f = f.clone();
        let call = Arc::new(move || {
            black_box(f());
        });
        support::two_threads(iters, call).as_nanos() as f64 / iters as f64
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs both contenders ROUNDS times interleaved; returns (weir median, governor median, median
/// of per-round ratios).
fn duel(mut weir: Bench, mut gov: Bench, iters: u64) -> (f64, f64, f64) {
    // Warm up both.
    weir(iters);
    gov(iters);
    let (mut w, mut g, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (a, b) = if round % 2 == 0 {
            let a = weir(iters);
            (a, gov(iters))
        } else {
            let b = gov(iters);
            (weir(iters), b)
        };
        w.push(a);
        g.push(b);
        r.push(a / b);
    }
    (median(&mut w), median(&mut g), median(&mut r))
}

#[inline]
fn next_key(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x % KEYS
}

fn main() {
    // `cargo bench` passes --bench; a filter argument is accepted and ignored.
    let fast = Quota::per_second(u64::from(FAST)).unwrap();
    let gov_quota = governor::Quota::per_second(NonZeroU32::new(FAST).unwrap());
    let mut rows: Vec<(String, (f64, f64, f64))> = Vec::new();

    {
        let c = weir_core::MonotonicClock::new();
        let q = quanta::Clock::new();
        rows.push((
            "clock read: weir MonotonicClock vs quanta (governor's)".into(),
            duel(
                one_thread(move || weir_core::Clock::now(&c) > 1),
                one_thread(move || {
                    black_box(q.now());
                    true
                }),
                200_000,
            ),
        ));
    }
    let weir = Arc::new(Limiter::new(Gcra::from_quota(fast).unwrap()));
    let gov = Arc::new(governor::RateLimiter::direct(gov_quota));
    {
        let (w, g) = (weir.clone(), gov.clone());
        rows.push((
            "GCRA, 1 thread".into(),
            duel(
                one_thread(move || w.acquire(1).allowed()),
                one_thread(move || g.check().is_ok()),
                200_000,
            ),
        ));
    }
    {
        // The same GCRA reading a coarse clock (one atomic load, updated every 1 ms).
        let coarse = Arc::new(Limiter::with_clock(
            Gcra::from_quota(fast).unwrap(),
            weir_core::CoarseClock::new(std::time::Duration::from_millis(1)).unwrap(),
        ));
        let (w, g) = (coarse.clone(), gov.clone());
        rows.push((
            "GCRA, 1 thread, weir on CoarseClock (1 ms)".into(),
            duel(
                one_thread(move || w.acquire(1).allowed()),
                one_thread(move || g.check().is_ok()),
                200_000,
            ),
        ));
        let (w, g) = (coarse, gov.clone());
        rows.push((
            "GCRA, 2 threads on one limiter, weir on CoarseClock (1 ms)".into(),
            duel(
                two_threads(Arc::new(move || w.acquire(1).allowed())),
                two_threads(Arc::new(move || g.check().is_ok())),
                400_000,
            ),
        ));
    }
    {
        // Floors: what any limiter whose state is one shared word pays at least per decision,
        // one locked read-modify-write (and, on 2 threads, the cache line moving between
        // cores), against governor's whole decision in the same rounds.
        let word = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (w, g) = (word.clone(), gov.clone());
        rows.push((
            "floor: one atomic fetch_add (no clock, no decision), 1 thread".into(),
            duel(
                one_thread(move || w.fetch_add(1, Ordering::AcqRel) != u64::MAX),
                one_thread(move || g.check().is_ok()),
                200_000,
            ),
        ));
        let (w, g) = (word, gov.clone());
        rows.push((
            "floor: one atomic fetch_add on one shared word, 2 threads".into(),
            duel(
                two_threads(Arc::new(move || {
                    w.fetch_add(1, Ordering::AcqRel) != u64::MAX
                })),
                two_threads(Arc::new(move || g.check().is_ok())),
                400_000,
            ),
        ));
    }
    {
        let (w, g) = (weir.clone(), gov.clone());
        rows.push((
            "GCRA, 2 threads on one limiter".into(),
            duel(
                two_threads(Arc::new(move || w.acquire(1).allowed())),
                two_threads(Arc::new(move || g.check().is_ok())),
                400_000,
            ),
        ));
    }
    let bucket = Arc::new(Limiter::new(
        TokenBucket::new(fast, u64::from(FAST)).unwrap(),
    ));
    {
        let (w, g) = (bucket.clone(), gov.clone());
        rows.push((
            "token bucket vs governor, 1 thread".into(),
            duel(
                one_thread(move || w.acquire(1).allowed()),
                one_thread(move || g.check().is_ok()),
                200_000,
            ),
        ));
    }
    {
        let (w, g) = (bucket.clone(), gov.clone());
        rows.push((
            "token bucket vs governor, 2 threads".into(),
            duel(
                two_threads(Arc::new(move || w.acquire(1).allowed())),
                two_threads(Arc::new(move || g.check().is_ok())),
                400_000,
            ),
        ));
    }
    {
        let w = Arc::new(
            KeyedLimiter::<u64, _>::new(Gcra::from_quota(fast).unwrap(), 1 << 20).unwrap(),
        );
        let g = Arc::new(governor::RateLimiter::keyed(gov_quota));
        let (w2, g2) = (w.clone(), g.clone());
        rows.push((
            "keyed, one hot key".into(),
            duel(
                one_thread(move || w.acquire(&7, 1).allowed()),
                one_thread(move || g.check_key(&7).is_ok()),
                200_000,
            ),
        ));
        rows.push((
            "keyed, one hot key, 2 threads".into(),
            duel(
                two_threads(Arc::new(move || w2.acquire(&7, 1).allowed())),
                two_threads(Arc::new(move || g2.check_key(&7).is_ok())),
                400_000,
            ),
        ));
    }
    // 1 M keys, memory measured while filling.
    let before = LIVE.load(Ordering::Relaxed);
    let g = Arc::new(governor::RateLimiter::keyed(gov_quota));
    for k in 0..KEYS {
        let _ = g.check_key(&k);
    }
    let gov_bytes = (LIVE.load(Ordering::Relaxed) - before) as f64 / KEYS as f64;
    let before = LIVE.load(Ordering::Relaxed);
    let w =
        Arc::new(KeyedLimiter::<u64, _>::new(Gcra::from_quota(fast).unwrap(), 1 << 20).unwrap());
    for k in 0..KEYS {
        let _ = w.acquire(&k, 1);
    }
    let weir_bytes = (LIVE.load(Ordering::Relaxed) - before) as f64 / KEYS as f64;
    assert_eq!(w.len() as u64, KEYS, "all 1 M keys must fit");
    {
        let (mut xw, mut xg) = (0x9E37_79B9_7F4A_7C15u64, 0x9E37_79B9_7F4A_7C15u64);
        let (w, g) = (w.clone(), g.clone());
        rows.push((
            "keyed, 1 M keys, random order".into(),
            duel(
                one_thread(move || w.acquire(&next_key(&mut xw), 1).allowed()),
                one_thread(move || g.check_key(&next_key(&mut xg)).is_ok()),
                100_000,
            ),
        ));
    }

    println!("| benchmark (time per decision; interleaved, median of {ROUNDS} rounds) | weir | governor | weir / governor |");
    println!("|---|---|---|---|");
    for (name, (w, g, r)) in &rows {
        println!("| {name} | {w:.1} ns | {g:.1} ns | {r:.2} |");
    }
    println!(
        "| keyed, heap bytes per key at 1 M keys | {weir_bytes:.1} B | {gov_bytes:.1} B | {:.2} |",
        weir_bytes / gov_bytes
    );
}
