use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
use std::sync::{Arc, Barrier};

use super::*;

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

fn count_config() -> BreakerConfig {
    BreakerConfig {
        window: Window::Count(10),
        min_calls: 5,
        error_ratio: Some(0.5),
        open_duration: Duration::from_secs(1),
        open_backoff: 2.0,
        max_open: Duration::from_secs(5),
        max_probes: 2,
        successes_to_close: 2,
        probe_timeout: Duration::from_secs(2),
        ..BreakerConfig::hystrix()
    }
}

fn call(b: &Breaker, now: Nanos, outcome: Outcome) {
    let c = b.try_acquire(now).expect("admitted");
    b.record(c, now, outcome);
}

#[test]
fn opens_only_after_the_minimum_calls() {
    let b = Breaker::new(count_config()).unwrap();
    for i in 0..4 {
        call(&b, i, Outcome::Error);
        assert_eq!(b.state(), BreakerState::Closed, "after {} errors", i + 1);
    }
    call(&b, 4, Outcome::Error);
    assert_eq!(b.state(), BreakerState::Open);
    let r = b.try_acquire(5).unwrap_err();
    assert_eq!(r.state, BreakerState::Open);
    assert_eq!(r.retry_after, Duration::from_nanos(S + 4 - 5));
}

#[test]
fn ratio_below_threshold_stays_closed() {
    let b = Breaker::new(count_config()).unwrap();
    for i in 0..100 {
        call(
            &b,
            i,
            if i % 3 == 0 {
                Outcome::Error
            } else {
                Outcome::Success
            },
        );
    }
    assert_eq!(b.state(), BreakerState::Closed);
}

#[test]
fn half_open_probes_close_or_reopen_with_backoff() {
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let log = seen.clone();
    let b = Breaker::new(count_config())
        .unwrap()
        .with_observer(move |t| log.lock().push((t.from, t.to)));
    for i in 0..5 {
        call(&b, i, Outcome::Error);
    }
    // Open for 1 s, then half-open: 2 probes at most.
    let now = S + 10;
    let p1 = b.try_acquire(now).unwrap();
    let p2 = b.try_acquire(now).unwrap();
    assert_eq!(
        b.try_acquire(now).unwrap_err().state,
        BreakerState::HalfOpen
    );
    // A failed probe re-opens, now for 2 s (backoff ×2).
    b.record(p1, now + 1, Outcome::Error);
    assert_eq!(b.state(), BreakerState::Open);
    assert_eq!(
        b.try_acquire(now + 2).unwrap_err().retry_after,
        Duration::from_nanos(2 * S - 1)
    );
    // The other probe's late report is stale and ignored.
    b.record(p2, now + 3, Outcome::Success);
    assert_eq!(b.state(), BreakerState::Open);
    // Half-open again after 2 s; two successes close it.
    let later = now + 1 + 2 * S;
    let a = b.try_acquire(later).unwrap();
    let c = b.try_acquire(later).unwrap();
    b.record(a, later + 1, Outcome::Success);
    assert_eq!(b.state(), BreakerState::HalfOpen);
    b.record(c, later + 2, Outcome::Success);
    assert_eq!(b.state(), BreakerState::Closed);
    // Closing resets the backoff: the next trip opens for 1 s again.
    for i in 0..5 {
        call(&b, later + 10 + i, Outcome::Error);
    }
    assert_eq!(
        b.try_acquire(later + 15).unwrap_err().retry_after,
        Duration::from_nanos(S - 1)
    );
    use BreakerState::*;
    assert_eq!(
        *seen.lock(),
        vec![
            (Closed, Open),
            (Open, HalfOpen),
            (HalfOpen, Open),
            (Open, HalfOpen),
            (HalfOpen, Closed),
            (Closed, Open)
        ]
    );
}

#[test]
fn open_period_grows_to_the_maximum() {
    let b = Breaker::new(count_config()).unwrap();
    let mut now = 0;
    for _ in 0..5 {
        call(&b, now, Outcome::Error);
        now += 1;
    }
    let mut periods = Vec::new();
    for _ in 0..5 {
        let wait = b.try_acquire(now).unwrap_err().retry_after;
        periods.push(wait.as_secs_f64().round() as u64);
        now += duration_to_nanos(wait);
        let p = b.try_acquire(now).unwrap();
        b.record(p, now, Outcome::Error);
    }
    assert_eq!(periods, vec![1, 2, 4, 5, 5]);
}

#[test]
fn a_probe_that_never_reports_times_out() {
    let b = Breaker::new(count_config()).unwrap();
    for i in 0..5 {
        call(&b, i, Outcome::Error);
    }
    let now = 2 * S;
    let _lost = b.try_acquire(now).unwrap(); // never reported
    let _lost2 = b.try_acquire(now).unwrap();
    assert_eq!(
        b.try_acquire(now + S).unwrap_err().state,
        BreakerState::HalfOpen
    );
    // After the 2 s probe timeout the breaker re-opens instead of staying half-open.
    assert_eq!(
        b.try_acquire(now + 2 * S).unwrap_err().state,
        BreakerState::Open
    );
}

#[test]
fn slow_calls_trip_and_time_window_counts() {
    let config = BreakerConfig {
        window: Window::Time {
            length: Duration::from_secs(10),
            buckets: 10,
        },
        min_calls: 4,
        error_ratio: None,
        slow_ratio: Some(0.5),
        slow_call: Duration::from_millis(100),
        ..count_config()
    };
    let b = Breaker::new(config).unwrap();
    let fast = |t: Nanos| {
        let c = b.try_acquire(t).unwrap();
        b.record(c, t + 10 * MS, Outcome::Success);
    };
    let slow = |t: Nanos| {
        let c = b.try_acquire(t).unwrap();
        b.record(c, t + 200 * MS, Outcome::Success);
    };
    fast(0);
    fast(S);
    slow(2 * S);
    assert_eq!(b.state(), BreakerState::Closed);
    slow(3 * S);
    assert_eq!(b.state(), BreakerState::Open);
}

#[test]
fn error_count_trips() {
    let config = BreakerConfig {
        error_ratio: None,
        error_count: Some(3),
        min_calls: 1,
        ..count_config()
    };
    let b = Breaker::new(config).unwrap();
    for i in 0..50 {
        call(&b, i, Outcome::Success);
    }
    call(&b, 60, Outcome::Error);
    call(&b, 61, Outcome::Error);
    assert_eq!(b.state(), BreakerState::Closed);
    call(&b, 62, Outcome::Error);
    assert_eq!(b.state(), BreakerState::Open);
}

#[test]
fn slow_start_ramps_traffic_back() {
    let config = BreakerConfig {
        max_probes: 1,
        successes_to_close: 1,
        slow_start: Duration::from_secs(10),
        ..count_config()
    };
    let b = Breaker::new(config).unwrap();
    for i in 0..5 {
        call(&b, i, Outcome::Error);
    }
    let t0 = 2 * S;
    let p = b.try_acquire(t0).unwrap();
    b.record(p, t0, Outcome::Success);
    assert_eq!(b.state(), BreakerState::Ramping);
    // About 30 % of calls pass 3 s into a 10 s ramp, all after it.
    let at = t0 + 3 * S;
    let passed = (0..1000).filter(|_| b.try_acquire(at).is_ok()).count();
    assert!((250..=350).contains(&passed), "{passed}");
    assert!(b.try_acquire(t0 + 10 * S).is_ok());
    assert_eq!(b.state(), BreakerState::Closed);
}

#[test]
fn presets_are_valid() {
    for c in [
        BreakerConfig::hystrix(),
        BreakerConfig::sentinel(),
        BreakerConfig::resilience4j(),
    ] {
        assert!(Breaker::new(c).is_ok());
    }
    let bad = BreakerConfig {
        error_ratio: Some(1.5),
        ..BreakerConfig::hystrix()
    };
    assert!(Breaker::new(bad).is_err());
}

/// 8 threads racing for probes never get more than max_probes at once.
#[test]
fn half_open_probe_limit_holds_under_8_threads() {
    let config = BreakerConfig {
        max_probes: 3,
        successes_to_close: 100_000,
        ..count_config()
    };
    let b = Arc::new(Breaker::new(config).unwrap());
    for i in 0..5 {
        call(&b, i, Outcome::Error);
    }
    let now = 2 * S;
    let in_flight = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let barrier = Arc::new(Barrier::new(8));
    let hs: Vec<_> = (0..8)
        .map(|_| {
            let (b, in_flight, peak, barrier) =
                (b.clone(), in_flight.clone(), peak.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for k in 0..2000 {
                    if let Ok(p) = b.try_acquire(now + k) {
                        let n = in_flight.fetch_add(1, AtomicOrdering::SeqCst) + 1;
                        peak.fetch_max(n, AtomicOrdering::SeqCst);
                        in_flight.fetch_sub(1, AtomicOrdering::SeqCst);
                        b.record(p, now + k, Outcome::Success);
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert!(peak.load(AtomicOrdering::SeqCst) <= 3);
    assert_eq!(b.state(), BreakerState::HalfOpen);
}
