//! Property tests on virtual time: span bounds, exact retry_after, long-run rate.

use std::time::Duration;

use proptest::prelude::*;
use weir_core::{
    Algorithm, Decision, FixedWindow, Gcra, Nanos, Pacing, Quota, SlidingCounter, SlidingLog,
    SlidingWindow, TokenBucket, WarmupTokenBucket,
};

/// Runs `events` (gap before the request, units) through `alg` on one state. Checks for every
/// denial with a finite retry_after that a retry then passes and one nanosecond earlier does
/// not. Returns (proceed time = decision time + wait, units) of admitted requests.
fn run<A: Algorithm>(alg: &A, events: &[(Nanos, u64)]) -> Vec<(Nanos, u64)> {
    let mut now: Nanos = 1_000_000_000; // not at the clock origin
    let mut state = alg.initial_state(now);
    let mut admitted = Vec::new();
    for &(gap, n) in events {
        now += gap;
        let before = state.clone();
        let d = alg.decide(&mut state, n, now);
        check_shape(&d, n);
        if d.allowed() {
            admitted.push((now + d.wait().as_nanos() as Nanos, n));
        } else if let Some(retry) = d.retry_after() {
            let retry = retry.as_nanos() as Nanos;
            assert!(retry > 0, "denied with retry_after 0: {d:?}");
            let mut s = before.clone();
            let later = alg.decide(&mut s, n, now + retry);
            assert!(
                later.allowed(),
                "retry at +{retry} ns still denied: {later:?}"
            );
            let mut s = before.clone();
            let earlier = alg.decide(&mut s, n, now + retry - 1);
            assert!(!earlier.allowed(), "passed 1 ns before retry_after {retry}");
        }
    }
    admitted
}

fn check_shape(d: &Decision, n: u64) {
    if d.allowed() {
        assert_eq!(d.retry_after(), Some(Duration::ZERO));
    } else {
        assert_eq!(d.wait(), Duration::ZERO);
    }
    if n > 0 && d.allowed() {
        assert!(d.remaining() <= d.limit().max(d.remaining()));
    }
}

/// Most units whose times fall in any half-open span `[a, a + span)`.
fn max_in_span(admitted: &[(Nanos, u64)], span: Nanos) -> u64 {
    let mut v = admitted.to_vec();
    v.sort_unstable();
    let (mut lo, mut sum, mut best) = (0, 0u64, 0u64);
    for hi in 0..v.len() {
        sum += v[hi].1;
        while v[hi].0 - v[lo].0 >= span {
            sum -= v[lo].1;
            lo += 1;
        }
        best = best.max(sum);
    }
    best
}

fn quota(limit: u64, window_ms: u64) -> Quota {
    Quota::new(limit, Duration::from_millis(window_ms)).unwrap()
}

prop_compose! {
    fn scenario(max_n: u64)(
        limit in 1u64..40,
        window_ms in 1u64..2000,
        raw in prop::collection::vec((0u64..1000, 1u64..=max_n), 1..300),
    ) -> (u64, u64, Vec<(Nanos, u64)>) {
        // Gaps up to ~half a window so bursts and idle periods both happen.
        let w = window_ms * 1_000_000;
        let events = raw.into_iter().map(|(g, n)| (g * w / 2000, n)).collect();
        (limit, window_ms, events)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn sliding_log_is_exact((limit, wms, events) in scenario(4)) {
        let alg = SlidingLog::new(quota(limit, wms)).unwrap();
        let admitted = run(&alg, &events);
        prop_assert!(max_in_span(&admitted, wms * 1_000_000) <= limit);
    }

    #[test]
    fn gcra_within_limit_plus_burst((limit, wms, events) in scenario(4), burst in 1u64..20) {
        let alg = Gcra::new(quota(limit, wms), burst).unwrap();
        let admitted = run(&alg, &events);
        prop_assert!(max_in_span(&admitted, wms * 1_000_000) <= limit + burst);
    }

    #[test]
    fn token_bucket_within_limit_plus_burst_plus_credit(
        (limit, wms, events) in scenario(4), burst in 1u64..20,
    ) {
        let alg = TokenBucket::new(quota(limit, wms), burst).unwrap();
        let admitted = run(&alg, &events);
        let n_max = events.iter().map(|e| e.1).max().unwrap().min(burst);
        prop_assert!(max_in_span(&admitted, wms * 1_000_000) <= limit + burst + n_max);
    }

    #[test]
    fn token_bucket_reservations_stay_paced(
        (limit, wms, events) in scenario(3), burst in 1u64..10, wait_ms in 0u64..500,
    ) {
        let alg = TokenBucket::new(quota(limit, wms), burst)
            .unwrap()
            .with_max_wait(Duration::from_millis(wait_ms));
        let admitted = run(&alg, &events);
        // Counted when they proceed, the queue adds at most max_wait × rate.
        let extra = (wait_ms * limit).div_ceil(wms);
        let n_max = events.iter().map(|e| e.1).max().unwrap().min(burst);
        prop_assert!(max_in_span(&admitted, wms * 1_000_000) <= limit + burst + n_max + extra);
    }

    #[test]
    fn pacing_spaces_departures((limit, wms, events) in scenario(3), wait_ms in 0u64..3000) {
        let alg = Pacing::new(quota(limit, wms), Duration::from_millis(wait_ms)).unwrap();
        let admitted = run(&alg, &events);
        let n_max = events.iter().map(|e| e.1).max().unwrap().min(limit);
        prop_assert!(max_in_span(&admitted, wms * 1_000_000) < limit + n_max);
    }

    #[test]
    fn fixed_window_at_most_twice((limit, wms, events) in scenario(4)) {
        let alg = FixedWindow::new(quota(limit, wms)).unwrap();
        let admitted = run(&alg, &events);
        prop_assert!(max_in_span(&admitted, wms * 1_000_000) <= 2 * limit);
    }

    #[test]
    fn sliding_window_bounds((limit, wms, events) in scenario(4), buckets in 1u32..12) {
        let alg = SlidingWindow::new(quota(limit, wms), buckets).unwrap();
        let admitted = run(&alg, &events);
        let w = wms * 1_000_000;
        let bucket = w / u64::from(buckets);
        // Exact over (B − 1) buckets, at most 2× over a window.
        if buckets > 1 {
            prop_assert!(max_in_span(&admitted, bucket * u64::from(buckets - 1)) <= limit);
        }
        prop_assert!(max_in_span(&admitted, w) <= 2 * limit);
    }

    #[test]
    fn sliding_counter_at_most_twice((limit, wms, events) in scenario(4)) {
        let alg = SlidingCounter::new(quota(limit, wms)).unwrap();
        let admitted = run(&alg, &events);
        prop_assert!(max_in_span(&admitted, wms * 1_000_000) <= 2 * limit);
    }

    #[test]
    fn warmup_retry_after_is_exact((limit, wms, events) in scenario(2), warm_ms in 1u64..3000) {
        let alg = WarmupTokenBucket::new(quota(limit, wms), Duration::from_millis(warm_ms))
            .unwrap();
        run(&alg, &events);
    }

    #[test]
    fn peek_consumes_nothing((limit, wms, events) in scenario(3)) {
        let alg = Gcra::from_quota(quota(limit, wms)).unwrap();
        let mut now = 0;
        let mut state = alg.initial_state(0);
        for (gap, n) in events {
            now += gap;
            let before = state;
            let peek = alg.decide(&mut state, 0, now);
            prop_assert_eq!(before, state);
            let real = alg.decide(&mut state, 1, now);
            prop_assert_eq!(peek.allowed(), real.allowed());
            let _ = alg.decide(&mut state, n, now);
        }
    }
}

/// Overload for 100 windows: every algorithm's admitted rate converges to the quota.
#[test]
fn long_run_rate_converges() {
    fn rate<A: Algorithm>(alg: &A, limit: u64, w: Nanos) -> f64 {
        let gap = w / (limit * 3); // 3× overload
        let events: Vec<_> = (0..limit * 3 * 100).map(|_| (gap, 1)).collect();
        let admitted = run(alg, &events);
        let units: u64 = admitted.iter().map(|a| a.1).sum();
        units as f64 / (100 * limit) as f64
    }
    let (limit, wms) = (50, 1000);
    let w = wms * 1_000_000;
    let q = quota(limit, wms);
    let pace = Duration::from_millis(200);
    let rates = [
        (
            "fixed_window",
            rate(&FixedWindow::new(q).unwrap(), limit, w),
        ),
        (
            "sliding_window",
            rate(&SlidingWindow::new(q, 10).unwrap(), limit, w),
        ),
        ("sliding_log", rate(&SlidingLog::new(q).unwrap(), limit, w)),
        (
            "sliding_counter",
            rate(&SlidingCounter::new(q).unwrap(), limit, w),
        ),
        ("gcra", rate(&Gcra::from_quota(q).unwrap(), limit, w)),
        (
            "token_bucket",
            rate(&TokenBucket::new(q, limit).unwrap(), limit, w),
        ),
        // Warm-up with max_wait 0 would only quantize arrivals onto its exact cost; allow one
        // interval of queueing as its users do.
        (
            "warmup",
            rate(
                &WarmupTokenBucket::new(q, Duration::from_secs(5))
                    .unwrap()
                    .with_max_wait(Duration::from_millis(20)),
                limit,
                w,
            ),
        ),
        ("pacing", rate(&Pacing::new(q, pace).unwrap(), limit, w)),
    ];
    for (name, r) in rates {
        // Within 3 %: at most one burst (≤ 1 window of 100) above, warm-up below.
        assert!(
            (0.95..=1.03).contains(&r),
            "{name}: admitted {r:.3} × the quota"
        );
    }
}

/// Fixed window's worst case is exactly 2 × limit: the quota at the end of one window and again
/// at the start of the next.
#[test]
fn fixed_window_boundary_burst_is_exactly_twice() {
    let alg = FixedWindow::new(quota(10, 1000)).unwrap();
    let w = 1_000_000_000;
    let mut events = vec![(w - 1, 1); 1];
    events.extend(std::iter::repeat_n((0, 1), 12));
    events.push((1, 1));
    events.extend(std::iter::repeat_n((0, 1), 12));
    let admitted = run(&alg, &events);
    assert_eq!(max_in_span(&admitted, w), 20);
}

/// Smooth traffic at the limit then a burst at any moment: the bucketed window lets through at
/// most limit / B extra in a window-length span (10 % at the default B = 10).
#[test]
fn sliding_window_smooth_then_burst_overshoot_bounded_by_one_bucket() {
    for buckets in [2u32, 4, 10] {
        let limit = 100;
        let alg = SlidingWindow::new(quota(limit, 1000), buckets).unwrap();
        let w: Nanos = 1_000_000_000;
        let mut worst = 0;
        // Try every burst offset on a 1 ms grid across one bucket.
        let bucket_ms = 1000 / u64::from(buckets);
        for offset_ms in 0..bucket_ms {
            let mut events: Vec<(Nanos, u64)> = vec![(0, 1)];
            events.extend(std::iter::repeat_n((w / limit, 1), 3 * limit as usize - 1));
            events.push((offset_ms * 1_000_000, 1));
            events.extend(std::iter::repeat_n((0, 1), limit as usize));
            let admitted = run(&alg, &events);
            worst = worst.max(max_in_span(&admitted, w));
        }
        let bound = limit + limit / u64::from(buckets);
        assert!(worst <= bound, "B={buckets}: {worst} > {bound}");
        if buckets == 10 {
            assert!(worst as f64 <= 1.10 * limit as f64);
        }
    }
}

/// Adversarial timing reaches 2× for a bucketed window too (documented, not hidden).
#[test]
fn sliding_window_adversarial_reaches_twice() {
    let alg = SlidingWindow::new(quota(10, 1000), 10).unwrap();
    let bucket = 100_000_000;
    let mut events = vec![(bucket - 1, 10)];
    events.push((bucket * 9 + 1, 10));
    let admitted = run(&alg, &events);
    assert_eq!(max_in_span(&admitted, 10 * bucket), 20);
}

#[test]
fn never_when_more_than_capacity() {
    let q = quota(5, 1000);
    let mut s = 0u64;
    assert!(FixedWindow::new(q).unwrap().decide(&mut s, 6, 0).is_never());
    let mut s = 0u64;
    assert!(Gcra::new(q, 3).unwrap().decide(&mut s, 4, 0).is_never());
    let mut s = 0u64;
    assert!(TokenBucket::new(q, 3)
        .unwrap()
        .decide(&mut s, 4, 0)
        .is_never());
    let mut s = 0u64;
    assert!(Pacing::new(q, Duration::MAX)
        .unwrap()
        .decide(&mut s, 6, 0)
        .is_never());
    let alg = SlidingLog::new(q).unwrap();
    assert!(alg.decide(&mut alg.initial_state(0), 6, 0).is_never());
    let alg = SlidingCounter::new(q).unwrap();
    assert!(alg.decide(&mut alg.initial_state(0), 6, 0).is_never());
    let alg = SlidingWindow::new(q, 10).unwrap();
    assert!(alg.decide(&mut alg.initial_state(0), 6, 0).is_never());
}

#[test]
fn config_errors_are_typed() {
    use weir_core::ConfigError;
    assert_eq!(
        Quota::new(0, Duration::from_secs(1)),
        Err(ConfigError::ZeroLimit)
    );
    assert_eq!(Quota::new(1, Duration::ZERO), Err(ConfigError::ZeroWindow));
    assert!(Gcra::new(quota(1, 1), 0).is_err());
    assert!(SlidingWindow::new(quota(1, 1), 0).is_err());
    assert!(SlidingWindow::new(Quota::new(1, Duration::from_nanos(3)).unwrap(), 4).is_err());
    assert!(WarmupTokenBucket::new(quota(1, 1), Duration::ZERO).is_err());
    assert!(WarmupTokenBucket::with_cold_factor(quota(1, 1), Duration::from_secs(1), 1.0).is_err());
    assert!(SlidingLog::new(quota(u64::MAX, 1)).is_err());
    assert!(FixedWindow::new(quota(u64::MAX, 1)).is_err());
}

/// Extreme times and costs never panic.
#[test]
fn extreme_inputs_do_not_panic() {
    let q = quota(u32::MAX as u64, 1);
    let times = [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX];
    let costs = [0, 1, u32::MAX as u64, u64::MAX];
    macro_rules! hammer {
        ($alg:expr) => {{
            let alg = $alg;
            let mut s = alg.initial_state(0);
            for &t in &times {
                for &n in &costs {
                    let _ = alg.decide(&mut s, n, t);
                }
            }
        }};
    }
    hammer!(FixedWindow::new(q).unwrap());
    hammer!(Gcra::from_quota(q).unwrap());
    hammer!(TokenBucket::new(q, 1000).unwrap());
    hammer!(Pacing::new(q, Duration::MAX).unwrap());
    hammer!(SlidingCounter::new(q).unwrap());
    hammer!(SlidingWindow::new(quota(1000, 1000), 10).unwrap());
    hammer!(SlidingLog::new(quota(1000, 1000)).unwrap());
    hammer!(WarmupTokenBucket::new(quota(1000, 1000), Duration::from_secs(1)).unwrap());
}

/// A limit near 2^64 is still a limit: the count never wraps past it.
#[test]
fn limits_near_two_to_the_64_never_wrap() {
    let max = u64::MAX;
    macro_rules! exact_at_the_top {
        ($alg:expr) => {{
            let alg = $alg;
            let now = 1_000;
            let mut s = alg.initial_state(now);
            assert!(alg.decide(&mut s, max - 1, now).allowed());
            assert!(alg.decide(&mut s, 1, now).allowed(), "the last unit");
            for n in [1, 2, 1_000, max] {
                assert!(!alg.decide(&mut s, n, now).allowed(), "{n} past the limit");
            }
        }};
    }
    // Fixed windows pack their count with the window index and sliding logs cap their limit:
    // both refuse a limit this large at construction.
    exact_at_the_top!(SlidingWindow::new(quota(max, 1000), 10).unwrap());
    exact_at_the_top!(SlidingCounter::new(quota(max, 1000)).unwrap());
}

/// Runs events whose times, as the algorithm sees them, are jittered up to `jitter` ns into the
/// past (another thread's clock read that lags, see `MonotonicClock`). Returns admitted
/// (true time + wait, units).
fn run_jittered<A: Algorithm>(
    alg: &A,
    events: &[(Nanos, u64, Nanos)],
    jitter: Nanos,
) -> Vec<(Nanos, u64)> {
    let mut now: Nanos = 1_000_000_000;
    let mut state = alg.initial_state(now);
    let mut admitted = Vec::new();
    for &(gap, n, j) in events {
        now += gap;
        let seen = now - j % (jitter + 1);
        let d = alg.decide(&mut state, n, seen);
        if d.allowed() {
            admitted.push((now + d.wait().as_nanos() as Nanos, n));
        }
    }
    admitted
}

prop_compose! {
    fn jittered(max_n: u64)(
        (limit, window_ms, events) in scenario(max_n),
        jitters in prop::collection::vec(any::<u64>(), 300),
        jitter_frac in 1u64..5,
    ) -> (u64, u64, Vec<(Nanos, u64, Nanos)>, Nanos) {
        let w = window_ms * 1_000_000;
        let jitter = w * jitter_frac / 20; // up to a fifth of the window
        let events = events.into_iter().zip(jitters).map(|((g, n), j)| (g, n, j)).collect();
        (limit, window_ms, events, jitter)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Time that goes slightly backwards (cross-thread clock skew) never lets more through than
    /// the algorithm's bound over a span shortened by the jitter.
    #[test]
    fn clock_skew_never_admits_more((limit, wms, events, jitter) in jittered(3)) {
        let q = quota(limit, wms);
        let w = wms * 1_000_000;
        let span = w - jitter;
        let n_max = events.iter().map(|e| e.1).max().unwrap();
        let check = |name: &str, admitted: Vec<(Nanos, u64)>, bound: u64| {
            let got = max_in_span(&admitted, span);
            assert!(got <= bound, "{name}: {got} > {bound} (jitter {jitter} of window {w})");
        };
        check("sliding_log", run_jittered(&SlidingLog::new(q).unwrap(), &events, jitter), limit);
        check("gcra", run_jittered(&Gcra::from_quota(q).unwrap(), &events, jitter), 2 * limit);
        check(
            "token_bucket",
            run_jittered(&TokenBucket::new(q, limit).unwrap(), &events, jitter),
            2 * limit + n_max,
        );
        check(
            "pacing",
            run_jittered(&Pacing::new(q, Duration::from_millis(wms)).unwrap(), &events, jitter),
            limit + n_max,
        );
        check("fixed_window", run_jittered(&FixedWindow::new(q).unwrap(), &events, jitter), 2 * limit);
        check(
            "sliding_window",
            run_jittered(&SlidingWindow::new(q, 10).unwrap(), &events, jitter),
            2 * limit,
        );
        check(
            "sliding_counter",
            run_jittered(&SlidingCounter::new(q).unwrap(), &events, jitter),
            2 * limit,
        );
    }
}
