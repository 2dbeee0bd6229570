//! Concurrency limiter: permits, FIFO queue, timeouts, cancellation safety.

use std::sync::Arc;
use std::time::Duration;

use weir_core::ConcurrencyLimiter;

#[test]
fn at_most_n_in_flight_and_released_on_drop() {
    let limiter = ConcurrencyLimiter::new(2).unwrap();
    let a = limiter.try_acquire(1).unwrap();
    let b = limiter.try_acquire(1).unwrap();
    let denied = limiter.try_acquire(1).unwrap_err();
    assert!(!denied.allowed());
    assert_eq!((denied.limit(), denied.remaining()), (2, 0));
    assert!(limiter.try_acquire(3).unwrap_err().is_never());
    drop(a);
    assert_eq!(limiter.in_flight(), 1);
    let _c = limiter.try_acquire(1).unwrap();
    drop(b);
    assert_eq!(limiter.in_flight(), 1);
    assert!(limiter.peek(1).allowed());
}

#[test]
fn a_bounded_limiter_has_no_queue() {
    let limiter = ConcurrencyLimiter::bounded(std::num::NonZeroU64::new(2).unwrap());
    let (a, _b) = (
        limiter.try_acquire(1).unwrap(),
        limiter.try_acquire(1).unwrap(),
    );
    assert_eq!(limiter.try_acquire(1).unwrap_err().remaining(), 0);
    assert_eq!((limiter.max_in_flight(), limiter.queued()), (2, 0));
    drop(a);
    assert_eq!(limiter.in_flight(), 1);
    assert!(limiter.try_acquire(1).is_ok());
}

#[test]
fn blocking_queue_is_fifo_bounded_and_times_out() {
    let limiter = ConcurrencyLimiter::with_queue(1, 2).unwrap();
    let held = limiter.try_acquire(1).unwrap();
    // Queue of 2: two waiters queue, a third is refused at once.
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let spawn = |id: u32| {
        let (limiter, order) = (limiter.clone(), order.clone());
        std::thread::spawn(move || {
            let permit = limiter
                .acquire_blocking(1, Duration::from_secs(20))
                .unwrap();
            order.lock().push(id);
            std::thread::sleep(Duration::from_millis(5));
            drop(permit);
        })
    };
    let first = spawn(1);
    while limiter.queued() < 1 {
        std::thread::yield_now();
    }
    let second = spawn(2);
    while limiter.queued() < 2 {
        std::thread::yield_now();
    }
    let refused = limiter.acquire_blocking(1, Duration::from_secs(20));
    assert!(refused.is_err(), "queue full must refuse at once");
    drop(held);
    first.join().unwrap();
    second.join().unwrap();
    assert_eq!(*order.lock(), vec![1, 2]);
    // A timeout leaves the queue empty.
    let held = limiter.try_acquire(1).unwrap();
    assert!(limiter
        .acquire_blocking(1, Duration::from_millis(20))
        .is_err());
    assert_eq!(limiter.queued(), 0);
    drop(held);
    assert_eq!(limiter.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiter_takes_no_permit_and_leaves_the_queue() {
    let limiter = ConcurrencyLimiter::with_queue(1, 10).unwrap();
    let held = limiter.try_acquire(1).unwrap();
    // A waiter that gives up after 20 ms.
    let l2 = limiter.clone();
    let gave_up = tokio::time::timeout(Duration::from_millis(20), l2.acquire(1)).await;
    assert!(gave_up.is_err());
    assert_eq!(limiter.queued(), 0);
    // Queue a real waiter, then release: it gets the permit.
    let l3 = limiter.clone();
    let waiter = tokio::spawn(async move { l3.acquire(1).await.map(|p| p.units()) });
    while limiter.queued() == 0 {
        tokio::task::yield_now().await;
    }
    drop(held);
    assert_eq!(waiter.await.unwrap().unwrap(), 1);
    assert_eq!(limiter.in_flight(), 0);
}

/// Many tasks racing acquire, cancellation and release never exceed the maximum nor leak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stress_never_exceeds_and_never_leaks() {
    let limiter = ConcurrencyLimiter::with_queue(3, 64).unwrap();
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let (limiter, peak) = (limiter.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            let wait = Duration::from_micros(200 + (i * 37) % 900);
            if let Ok(Ok(permit)) = tokio::time::timeout(wait, limiter.acquire(1)).await {
                peak.fetch_max(limiter.in_flight(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_micros(100)).await;
                drop(permit);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(peak.load(std::sync::atomic::Ordering::Relaxed) <= 3);
    assert_eq!(limiter.in_flight(), 0);
    assert_eq!(limiter.queued(), 0);
}

#[test]
fn lifo_serves_the_newest_waiter_first() {
    use weir_core::{ConcurrencyConfig, QueueOrder};
    let limiter = ConcurrencyLimiter::with_config(ConcurrencyConfig {
        max_in_flight: 1,
        max_queue: 4,
        order: QueueOrder::Lifo,
        shares: None,
    })
    .unwrap();
    let held = limiter.try_acquire(1).unwrap();
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for id in 1..=3u32 {
        let (l, order) = (limiter.clone(), order.clone());
        handles.push(std::thread::spawn(move || {
            let p = l.acquire_blocking(1, Duration::from_secs(20)).unwrap();
            order.lock().push(id);
            drop(p);
        }));
        while limiter.queued() < id as usize {
            std::thread::yield_now();
        }
    }
    drop(held);
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(*order.lock(), vec![3, 2, 1]);
}

#[test]
fn sheddable_work_never_takes_the_capacity_kept_for_critical() {
    use weir_core::criticality::Shares;
    use weir_core::{ConcurrencyConfig, Criticality, QueueOrder};
    let limiter = ConcurrencyLimiter::with_config(ConcurrencyConfig {
        max_in_flight: 10,
        max_queue: 0,
        order: QueueOrder::Fifo,
        shares: Some(Shares::default()),
    })
    .unwrap();
    let sheddable: Vec<_> = (0..20)
        .filter_map(|_| limiter.try_acquire_as(1, Criticality::Sheddable).ok())
        .collect();
    assert_eq!(sheddable.len(), 5, "50 % for SHEDDABLE");
    let critical: Vec<_> = (0..20)
        .filter_map(|_| limiter.try_acquire_as(1, Criticality::Critical).ok())
        .collect();
    assert_eq!(critical.len(), 4, "up to 90 % in all for CRITICAL");
    let _last = limiter
        .try_acquire_as(1, Criticality::CriticalPlus)
        .unwrap();
    assert_eq!(limiter.in_flight(), 10);
    // Raising the maximum at runtime lets more in.
    limiter.set_max_in_flight(20);
    assert!(limiter.try_acquire_as(1, Criticality::Sheddable).is_err()); // 10 of 20 = its 50 %
    assert!(limiter.try_acquire_as(1, Criticality::Critical).is_ok());
}
