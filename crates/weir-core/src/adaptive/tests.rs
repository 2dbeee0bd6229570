use super::*;
use crate::concurrency::QueueOrder;
use crate::criticality::Shares;

const MS: u64 = 1_000_000;

fn sample(rtt_ms: u64, in_flight: u64) -> Sample {
    Sample {
        rtt: rtt_ms * MS,
        in_flight,
        dropped: false,
        at: 0,
    }
}

#[test]
fn aimd_grows_when_used_and_backs_off_on_drops() {
    let mut a = Aimd::with_initial(30);
    assert_eq!(a.on_sample(sample(10, 15)), 31);
    assert_eq!(a.on_sample(sample(10, 5)), 31, "under-used: no growth");
    let dropped = Sample {
        dropped: true,
        ..sample(10, 31)
    };
    assert_eq!(a.on_sample(dropped), 27); // floor(31 × 0.9)
    assert_eq!(
        a.on_sample(sample(6_000, 27)),
        24,
        "timeout counts as a drop"
    );
    for _ in 0..100 {
        a.on_sample(dropped);
    }
    assert_eq!(a.limit(), 20, "never below min");
    for _ in 0..1000 {
        a.on_sample(sample(10, 1000));
    }
    assert_eq!(a.limit(), 200, "never above max");
}

#[test]
fn vegas_grows_without_queueing_and_shrinks_with_it() {
    let mut v = Vegas::default();
    v.on_sample(sample(10, 20)); // sets the no-load RTT
    for _ in 0..20 {
        v.on_sample(sample(10, v.limit()));
    }
    let grown = v.limit();
    assert!(grown > 60, "no queueing: grows fast, got {grown}");
    // RTT doubles: the estimated queue is half the limit → shrink.
    for _ in 0..20 {
        v.on_sample(sample(20, v.limit()));
    }
    assert!(v.limit() < grown, "{} !< {grown}", v.limit());
}

#[test]
fn gradient2_shrinks_when_latency_rises_and_recovers() {
    let mut g = Gradient2::default();
    for _ in 0..100 {
        g.on_sample(sample(10, g.limit()));
    }
    let steady = g.limit();
    assert!(
        steady > 40,
        "stable latency grows by the queue allowance: {steady}"
    );
    for _ in 0..30 {
        g.on_sample(sample(50, g.limit()));
    }
    let squeezed = g.limit();
    assert!(
        squeezed < steady / 2,
        "latency ×5 must shrink: {squeezed} vs {steady}"
    );
    assert!(squeezed >= 20);
    for _ in 0..200 {
        g.on_sample(sample(10, g.limit()));
    }
    assert!(g.limit() > squeezed);
}

#[test]
fn adaptive_limiter_enforces_the_moving_limit() {
    let limiter = AdaptiveLimiter::new(
        Aimd::with_initial(20),
        ConcurrencyConfig {
            max_in_flight: 1,
            max_queue: 0,
            order: QueueOrder::Fifo,
            shares: Some(Shares::default()),
        },
    )
    .unwrap();
    assert_eq!(limiter.limit(), 20);
    let permits: Vec<_> = (0..30)
        .filter_map(|_| limiter.try_acquire(Criticality::CriticalPlus, 0).ok())
        .collect();
    assert_eq!(permits.len(), 20);
    assert!(limiter.try_acquire(Criticality::Sheddable, 0).is_err());
    // Fully used and fast: each success raises the limit by one.
    for p in permits {
        p.success(MS);
    }
    assert!(limiter.limit() > 20);
    assert_eq!(limiter.in_flight(), 0);
    // Sheddable work gets only its share of the (new) limit.
    let limit = limiter.limit();
    let shed: Vec<_> = (0..100)
        .filter_map(|_| limiter.try_acquire(Criticality::Sheddable, 2 * MS).ok())
        .collect();
    assert_eq!(shed.len() as u64, limit / 2);
    // Drops shrink it.
    for p in shed {
        p.dropped(3 * MS);
    }
    assert!(limiter.limit() < limit);
}

#[test]
fn windowed_feeds_one_average_per_window() {
    let mut w = Windowed::new(Aimd::with_initial(30));
    // 100 samples within one second: nothing is fed yet.
    for i in 0..100u64 {
        let s = Sample {
            at: i * 5 * MS,
            ..sample(10, 30)
        };
        assert_eq!(w.on_sample(s), 30);
    }
    // The first sample after the window closes feeds the average: one +1 step.
    let s = Sample {
        at: 1_001 * MS,
        ..sample(10, 30)
    };
    assert_eq!(w.on_sample(s), 31);
    // A drop anywhere in a window counts for the window.
    let drop = Sample {
        at: 1_500 * MS,
        dropped: true,
        ..sample(10, 30)
    };
    w.on_sample(drop);
    for i in 0..10u64 {
        w.on_sample(Sample {
            at: 1_600 * MS + i * MS,
            ..sample(10, 30)
        });
    }
    let s = Sample {
        at: 2_002 * MS,
        ..sample(10, 30)
    };
    assert_eq!(w.on_sample(s), 27);
}
