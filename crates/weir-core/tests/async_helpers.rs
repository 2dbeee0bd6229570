//! The tokio helpers, on tokio's paused clock (deterministic: no real sleeping).
#![cfg(feature = "tokio")]

use std::time::Duration;

use weir_core::{ConcurrencyLimiter, Limiter, ManualClock, Pacing, Quota};

#[tokio::test(start_paused = true)]
async fn acquire_paced_sleeps_exactly_the_wait() {
    let clock = ManualClock::new(0);
    let q = Quota::new(10, Duration::from_secs(1)).unwrap();
    let limiter = Limiter::with_clock(Pacing::new(q, Duration::from_secs(1)).unwrap(), &clock);
    let start = tokio::time::Instant::now();
    assert_eq!(limiter.acquire_paced(1).await.wait(), Duration::ZERO);
    let second = limiter.acquire_paced(1).await;
    assert_eq!(second.wait(), Duration::from_millis(100));
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    let third = limiter.acquire_paced(1).await;
    assert_eq!(third.wait(), Duration::from_millis(200));
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_gives_up_and_frees_the_queue() {
    let limiter = ConcurrencyLimiter::with_queue(1, 4).unwrap();
    let held = limiter.try_acquire(1).unwrap();
    let start = tokio::time::Instant::now();
    let denied = limiter
        .acquire_timeout(1, Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(!denied.allowed());
    assert_eq!(start.elapsed(), Duration::from_millis(50));
    assert_eq!(limiter.queued(), 0);
    drop(held);
    assert!(limiter
        .acquire_timeout(1, Duration::from_millis(50))
        .await
        .is_ok());
}
