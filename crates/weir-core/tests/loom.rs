//! Model checks of the lock-free paths with loom: every interleaving of concurrent callers.
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p weir-core --test loom --release`
//! (`scripts/test` does).
#![cfg(loom)]

use std::sync::Arc as StdArc;
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use weir_core::{
    ConcurrencyLimiter, FixedWindow, Gcra, Limiter, ManualClock, Pacing, Quota, TokenBucket,
};

fn q(limit: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(1)).unwrap()
}

/// Two threads × two requests against a limiter that admits exactly `expect` of the four.
fn two_by_two<A: weir_core::Algorithm>(make: fn() -> A, expect: usize) {
    loom::model(move || {
        let clock = StdArc::new(ManualClock::new(0));
        let limiter = Arc::new(Limiter::with_clock(make(), clock));
        let other = {
            let limiter = limiter.clone();
            thread::spawn(move || (0..2).filter(|_| limiter.acquire(1).allowed()).count())
        };
        let mine = (0..2).filter(|_| limiter.acquire(1).allowed()).count();
        assert_eq!(mine + other.join().unwrap(), expect);
    });
}

#[test]
fn gcra_cas_admits_exactly_the_burst() {
    two_by_two(|| Gcra::new(q(10), 3).unwrap(), 3);
}

#[test]
fn fixed_window_cas_admits_exactly_the_limit() {
    two_by_two(|| FixedWindow::new(q(3)).unwrap(), 3);
}

#[test]
fn token_bucket_cas_admits_exactly_the_burst_plus_one_on_credit() {
    // Two stored permits, then one more on credit (Guava's pay-later), then denied.
    two_by_two(|| TokenBucket::new(q(10), 2).unwrap(), 3);
}

#[test]
fn pacing_cas_never_shares_a_slot() {
    loom::model(|| {
        let clock = StdArc::new(ManualClock::new(0));
        let limiter = Arc::new(Limiter::with_clock(
            Pacing::new(q(10), Duration::from_secs(1)).unwrap(),
            clock,
        ));
        let other = {
            let limiter = limiter.clone();
            thread::spawn(move || limiter.acquire(1).wait())
        };
        let mine = limiter.acquire(1).wait();
        let theirs = other.join().unwrap();
        assert_ne!(mine, theirs);
        assert_eq!(mine.max(theirs), Duration::from_millis(100));
    });
}

#[test]
fn concurrency_permits_never_exceed_the_maximum() {
    loom::model(|| {
        let limiter = ConcurrencyLimiter::new(1).unwrap();
        let other = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let permit = limiter.try_acquire(1);
                let held = permit.is_ok();
                assert!(limiter.in_flight() <= 1);
                held
            })
        };
        let mine = limiter.try_acquire(1);
        assert!(limiter.in_flight() <= 1);
        let mine_held = mine.is_ok();
        drop(mine);
        let theirs = other.join().unwrap();
        assert!(mine_held || theirs);
        assert_eq!(limiter.in_flight(), 0);
    });
}
