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
