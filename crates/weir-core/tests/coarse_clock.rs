//! The exactness bound of a coarse clock, on a manual clock that lags the same way: each
//! decision at true time `t` is made with the reading `t − (t mod r)` (a clock updated every
//! `r`, read just before its next update — the worst case). Limiters on such a clock admit, over
//! any real interval of length `w`, at most what they admit on an exact clock over `w + r`.

use std::time::Duration;

use weir_core::{FixedWindow, Gcra, Limiter, ManualClock, Nanos, Quota, SlidingLog};

const MS: Nanos = 1_000_000;
const S: Nanos = 1_000_000_000;

/// Offers one request every `every` ns for `span` ns; answers the true times admitted when
/// every decision reads a clock updated every `r` ns.
fn admitted(decide: impl Fn(Nanos) -> bool, every: Nanos, span: Nanos, r: Nanos) -> Vec<Nanos> {
    (0..span / every)
        .map(|i| S + i * every + (i * 7919 % 97) * 1_000) // a little jitter
        .filter(|&t| decide(t - t % r))
        .collect()
}

/// The most admissions in any real interval of length `w`.
fn most_in(times: &[Nanos], w: Nanos) -> usize {
    let mut best = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] >= w {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

#[test]
fn a_lagging_clock_never_admits_more_than_the_exact_bound_over_a_window_longer_by_r() {
    for r in [MS, 10 * MS, 100 * MS] {
        // Sliding log, 100 per second: at most 100 in any real window of 1 s − r.
        let log = Limiter::with_clock(
            SlidingLog::new(Quota::new(100, Duration::from_secs(1)).unwrap()).unwrap(),
            ManualClock::new(0),
        );
        let t = admitted(|now| log.acquire_at(1, now).allowed(), MS / 4, 5 * S, r);
        assert!(
            most_in(&t, S - r) <= 100,
            "sliding log, r {r}: {}",
            most_in(&t, S - r)
        );
        // …and under a steady excess it still admits its rate (within one window).
        assert!(t.len() >= 400, "sliding log, r {r}: only {}", t.len());
        // GCRA, 100/s with a burst of 10: at most 10 + 100 × (w + r) in any interval w.
        let gcra = Limiter::with_clock(
            Gcra::new(Quota::new(100, Duration::from_secs(1)).unwrap(), 10).unwrap(),
            ManualClock::new(0),
        );
        let t = admitted(|now| gcra.acquire_at(1, now).allowed(), MS / 4, 5 * S, r);
        for w in [10 * MS, 100 * MS, S] {
            let bound = 10 + (100 * (w + r)).div_ceil(S) as usize;
            assert!(
                most_in(&t, w) <= bound,
                "gcra, r {r}, w {w}: {} > {bound}",
                most_in(&t, w)
            );
        }
        assert!(t.len() >= 490, "gcra, r {r}: only {}", t.len());
        // Fixed window, 100 per second: exact per (reading) window; any real window of 1 s − r
        // lies across at most two of them, as on an exact clock.
        let fixed = Limiter::with_clock(
            FixedWindow::new(Quota::new(100, Duration::from_secs(1)).unwrap()).unwrap(),
            ManualClock::new(0),
        );
        let t = admitted(|now| fixed.acquire_at(1, now).allowed(), MS / 4, 5 * S, r);
        assert!(most_in(&t, S - r) <= 200, "fixed window, r {r}");
        assert!(t.len() >= 400, "fixed window, r {r}: only {}", t.len());
    }
}
