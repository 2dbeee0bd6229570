//! `weir_rls_decision_seconds`: the decision-latency histogram of `weir serve`.
//!
//! Fixed buckets from 5 µs to 1 s, one relaxed atomic add per bucket hit plus the sum and
//! count, timed with weir-core's [`MonotonicClock`] (the CPU's time-stamp counter), read by
//! the service's collector at a scrape ([`super::metrics`]). A histogram aggregates across
//! instances, which a summary's quantiles do not, and its memory is fixed.

use std::sync::atomic::{AtomicU64, Ordering};

use weir_core::clock::{Clock, MonotonicClock};
use weir_core::Nanos;

/// Upper bounds of the buckets in seconds (+Inf implicit).
pub const BUCKETS: [f64; 16] = [
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

const BUCKETS_NS: [u64; BUCKETS.len()] = weir_rules::metrics::bounds_ns(BUCKETS);

/// The metric's name.
pub const NAME: &str = "weir_rls_decision_seconds";

/// A decision-latency histogram with its clock.
#[derive(Debug, Default)]
pub struct Latency {
    clock: MonotonicClock,
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Latency {
    /// The current time, to pass to [`Latency::since`] when the decision is made.
    #[inline]
    pub fn start(&self) -> Nanos {
        self.clock.now()
    }

    /// Records a decision that started at `start`.
    #[inline]
    pub fn since(&self, start: Nanos) {
        self.observe(self.clock.now().saturating_sub(start));
    }

    /// Records one latency of `ns` nanoseconds.
    pub fn observe(&self, ns: Nanos) {
        let i = BUCKETS_NS.partition_point(|b| *b < ns);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations per bucket (the last: above every bound) and their sum in seconds.
    pub fn read(&self) -> ([u64; BUCKETS.len() + 1], f64) {
        let counts = std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed));
        (counts, self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9)
    }

    /// Writes the histogram as `weir_rls_decision_seconds`.
    pub fn encode(&self, enc: &mut crate::admin::metrics::Encoder) -> std::fmt::Result {
        let (counts, sum) = self.read();
        crate::admin::metrics::histogram(
            enc,
            NAME,
            "Time to decide one ShouldRateLimit or /json request.",
            &BUCKETS,
            &counts,
            sum,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::admin::metrics::{Collector, Encoder, Metrics};
    use std::sync::Arc;

    #[derive(Debug)]
    struct Histogram(Arc<Latency>);

    impl Collector for Histogram {
        fn encode(&self, mut enc: Encoder) -> std::fmt::Result {
            self.0.encode(&mut enc)
        }
    }

    fn render(h: &Arc<Latency>) -> String {
        let m = Metrics::new();
        m.register(Histogram(h.clone()));
        m.render()
    }

    #[test]
    fn buckets_are_cumulative_and_bounds_inclusive() {
        let h = Arc::new(Latency::default());
        h.observe(5_000); // ≤ 5 µs
        h.observe(7_000); // ≤ 10 µs
        h.observe(2_000_000_000); // +Inf
        let out = render(&h);
        for line in [
            "# TYPE weir_rls_decision_seconds histogram",
            "weir_rls_decision_seconds_bucket{le=\"0.000005\"} 1",
            "weir_rls_decision_seconds_bucket{le=\"0.00001\"} 2",
            "weir_rls_decision_seconds_bucket{le=\"1.0\"} 2",
            "weir_rls_decision_seconds_bucket{le=\"+Inf\"} 3",
            "weir_rls_decision_seconds_count 3",
            "weir_rls_decision_seconds_sum 2.000012",
        ] {
            assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
        }
        let start = h.start();
        h.since(start);
        let again = render(&h);
        assert!(
            again.contains("weir_rls_decision_seconds_count 4"),
            "{again}"
        );
    }
}
