//! Guava RateLimiter compatibility, on a manual clock: each `acquire` returns the wait Guava
//! would sleep, and the clock moves by that wait as Guava's sleeping caller would.

use std::time::Duration;

use weir_core::{Clock, Limiter, ManualClock, Quota, TokenBucket, WarmupTokenBucket};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[test]
fn smooth_bursty_create_5() {
    let clock = ManualClock::new(0);
    let limiter = Limiter::with_clock(TokenBucket::guava(5).unwrap(), &clock);
    // acquire(5): no wait (the bucket pays later).
    let d = limiter.reserve(5);
    assert!(d.allowed());
    assert_eq!(d.wait(), Duration::ZERO);
    // The next acquire(1) pays the 5 permits' debt: 1 s.
    let d = limiter.reserve(1);
    assert_eq!(d.wait(), Duration::from_secs(1));
    clock.advance(d.wait());
    // Then 0.2 s each.
    for _ in 0..5 {
        let d = limiter.reserve(1);
        assert_eq!(d.wait(), Duration::from_millis(200));
        clock.advance(d.wait());
    }
}

#[test]
fn smooth_bursty_stores_up_to_one_second_of_permits() {
    let clock = ManualClock::new(0);
    let limiter = Limiter::with_clock(TokenBucket::guava(5).unwrap(), &clock);
    clock.advance(Duration::from_secs(10)); // idle: store at most 5
    for _ in 0..5 {
        assert_eq!(limiter.reserve(1).wait(), Duration::ZERO);
    }
    assert_eq!(limiter.reserve(1).wait(), Duration::ZERO); // taken on credit
    assert_eq!(limiter.reserve(1).wait(), Duration::from_millis(200));
}

#[test]
fn try_acquire_with_timeout_is_guava_can_acquire() {
    let clock = ManualClock::new(0);
    let limiter = Limiter::with_clock(TokenBucket::guava(5).unwrap(), &clock);
    assert!(limiter.try_acquire_within(1, Duration::ZERO).allowed());
    // Debt of 200 ms now: a zero timeout fails, 200 ms succeeds.
    let d = limiter.try_acquire_within(1, Duration::ZERO);
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_millis(200)));
    let d = limiter.try_acquire_within(1, Duration::from_millis(200));
    assert!(d.allowed());
    assert_eq!(d.wait(), Duration::from_millis(200));
}

/// Guava's RateLimiterTest#testWarmUp: create(2 per second, 4 s warm-up): eight acquires wait
/// 0, 1.375, 1.125, 0.875, 0.625, 0.5, 0.5, 0.5 s; after 4.5 s idle (cold again), the same.
#[test]
fn smooth_warming_up_documented_intervals() {
    let clock = ManualClock::new(0);
    let alg = WarmupTokenBucket::new(
        Quota::new(2, Duration::from_secs(1)).unwrap(),
        Duration::from_millis(4000),
    )
    .unwrap();
    assert_eq!(alg.threshold_permits(), 4.0);
    assert_eq!(alg.max_permits(), 8.0);
    let limiter = Limiter::with_clock(alg, &clock);
    let expected = [0.0, 1375.0, 1125.0, 875.0, 625.0, 500.0, 500.0, 500.0];
    for round in 0..2 {
        for (i, want) in expected.iter().enumerate() {
            let d = limiter.reserve(1);
            assert!(
                (ms(d.wait()) - want).abs() < 0.001,
                "round {round} acquire #{i}: waited {} ms, Guava {want} ms",
                ms(d.wait())
            );
            clock.advance(d.wait());
        }
        // Guava sleeps 500 ms (the last wait) + 4 s to get cold again.
        clock.advance(Duration::from_millis(4500));
    }
    let _ = clock.now();
}

/// Sentinel's warm-up curve: starting cold, the first second admits about rate / cold_factor.
#[test]
fn warmup_starts_at_a_third_of_the_rate() {
    let clock = ManualClock::new(0);
    let alg =
        WarmupTokenBucket::new(Quota::per_second(100).unwrap(), Duration::from_secs(10)).unwrap();
    let limiter = Limiter::with_clock(alg, &clock);
    let mut first_second = 0;
    for _ in 0..1000 {
        if limiter.acquire(1).allowed() {
            first_second += 1;
        }
        clock.advance(Duration::from_millis(1));
    }
    // The cold interval is 30 ms: ≈ 33 per second, slightly more as the bucket warms.
    assert!((30..=40).contains(&first_second), "admitted {first_second}");
    // After the warm-up period at full load it admits the stable rate.
    for _ in 0..12_000 {
        let _ = limiter.acquire(1);
        clock.advance(Duration::from_millis(1));
    }
    let mut warm = 0;
    for _ in 0..1000 {
        if limiter.acquire(1).allowed() {
            warm += 1;
        }
        clock.advance(Duration::from_millis(1));
    }
    assert!((99..=101).contains(&warm), "admitted {warm} when warm");
}
