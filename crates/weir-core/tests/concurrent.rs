//! Concurrent callers on one limiter admit exactly what the same timeline admits on one thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use weir_core::{
    Algorithm, FixedWindow, Gcra, Limiter, ManualClock, Pacing, Quota, SlidingCounter, SlidingLog,
    SlidingWindow, TokenBucket,
};

const THREADS: usize = 8;
const PER_THREAD_PER_TICK: usize = 50;
const TICKS: usize = 40;

/// Every tick, THREADS threads each make PER_THREAD_PER_TICK one-unit requests at the same
/// virtual time; the clock moves only between ticks. Returns admitted units per tick.
fn concurrent<A: Algorithm + Clone>(alg: A, tick: Duration) -> Vec<u64> {
    let clock = Arc::new(ManualClock::new(0));
    let limiter = Arc::new(Limiter::with_clock(alg, clock.clone()));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..TICKS).map(|_| AtomicU64::new(0)).collect());
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (limiter, counts, barrier) = (limiter.clone(), counts.clone(), barrier.clone());
            std::thread::spawn(move || {
                for t in 0..TICKS {
                    barrier.wait();
                    for _ in 0..PER_THREAD_PER_TICK {
                        if limiter.acquire(1).allowed() {
                            counts[t].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    barrier.wait();
                }
            })
        })
        .collect();
    for _ in 0..TICKS {
        barrier.wait(); // threads run this tick
        barrier.wait(); // tick done
        clock.advance(tick);
    }
    for h in handles {
        h.join().unwrap();
    }
    counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
}

fn sequential<A: Algorithm + Clone>(alg: A, tick: Duration) -> Vec<u64> {
    let clock = ManualClock::new(0);
    let limiter = Limiter::with_clock(alg, &clock);
    (0..TICKS)
        .map(|_| {
            let admitted = (0..THREADS * PER_THREAD_PER_TICK)
                .filter(|_| limiter.acquire(1).allowed())
                .count() as u64;
            clock.advance(tick);
            admitted
        })
        .collect()
}

fn same<A: Algorithm + Clone>(name: &str, alg: A) {
    let tick = Duration::from_millis(37);
    let expected = sequential(alg.clone(), tick);
    assert!(expected.iter().sum::<u64>() > 0);
    assert_eq!(concurrent(alg, tick), expected, "{name}");
}

#[test]
fn threads_admit_exactly_the_sequential_count() {
    let q = Quota::new(100, Duration::from_millis(250)).unwrap();
    same("gcra", Gcra::new(q, 30).unwrap());
    same("fixed_window", FixedWindow::new(q).unwrap());
    same("token_bucket", TokenBucket::new(q, 30).unwrap());
    same("pacing", Pacing::new(q, Duration::from_millis(20)).unwrap());
    same("sliding_log", SlidingLog::new(q).unwrap());
    same("sliding_window", SlidingWindow::new(q, 10).unwrap());
    same("sliding_counter", SlidingCounter::new(q).unwrap());
}

/// Pacing never hands two concurrent callers the same departure slot.
#[test]
fn pacing_slots_are_unique_under_contention() {
    let clock = Arc::new(ManualClock::new(0));
    let q = Quota::new(1000, Duration::from_secs(1)).unwrap();
    let limiter = Arc::new(Limiter::with_clock(
        Pacing::new(q, Duration::from_secs(10)).unwrap(),
        clock.clone(),
    ));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let limiter = limiter.clone();
            std::thread::spawn(move || {
                (0..500)
                    .map(|_| limiter.acquire(1))
                    .filter(|d| d.allowed())
                    .map(|d| d.wait().as_nanos())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut waits: Vec<u128> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    waits.sort_unstable();
    assert_eq!(waits.len(), THREADS * 500);
    for pair in waits.windows(2) {
        assert_eq!(pair[1] - pair[0], 1_000_000, "slots must be 1 ms apart");
    }
}
