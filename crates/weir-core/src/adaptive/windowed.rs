//! [`Windowed`]: feeds a limit algorithm one aggregated sample per window instead of every call
//! (Netflix `WindowedLimit`: windows of at least 1 s and 10 samples, average RTT, the largest
//! in-flight, dropped if any call in the window was). Single RTTs are noisy — with a service
//! time of CV ≈ 0.7, Gradient2 and Vegas fed raw samples read every slow call as congestion and
//! drive the limit to its minimum (`weir simulate overload` shows it); averages over a window
//! do not.

use std::time::Duration;

use super::{LimitAlgorithm, Sample};
use crate::clock::{duration_to_nanos, Nanos};

/// A limit algorithm fed windowed averages.
#[derive(Debug, Clone)]
pub struct Windowed<L> {
    inner: L,
    /// Shortest window.
    pub window: Duration,
    /// Fewest samples in a window.
    pub min_samples: u64,
    start: Option<Nanos>,
    count: u64,
    rtt_sum: u128,
    max_in_flight: u64,
    dropped: bool,
}

impl<L: LimitAlgorithm> Windowed<L> {
    /// `inner` fed once per second (and at least 10 samples).
    pub fn new(inner: L) -> Self {
        Self {
            inner,
            window: Duration::from_secs(1),
            min_samples: 10,
            start: None,
            count: 0,
            rtt_sum: 0,
            max_in_flight: 0,
            dropped: false,
        }
    }

    /// The wrapped algorithm.
    pub fn inner(&self) -> &L {
        &self.inner
    }
}

impl<L: LimitAlgorithm> LimitAlgorithm for Windowed<L> {
    fn limit(&self) -> u64 {
        self.inner.limit()
    }

    fn on_sample(&mut self, s: Sample) -> u64 {
        let start = *self.start.get_or_insert(s.at);
        if s.at.saturating_sub(start) >= duration_to_nanos(self.window)
            && self.count >= self.min_samples
        {
            let avg = (self.rtt_sum / u128::from(self.count)) as Nanos;
            let aggregated = Sample {
                rtt: avg,
                in_flight: self.max_in_flight,
                dropped: self.dropped,
                at: s.at,
            };
            self.start = Some(s.at);
            self.count = 0;
            self.rtt_sum = 0;
            self.max_in_flight = 0;
            self.dropped = false;
            self.inner.on_sample(aggregated);
        }
        self.count += 1;
        self.rtt_sum += u128::from(s.rtt);
        self.max_in_flight = self.max_in_flight.max(s.in_flight);
        self.dropped |= s.dropped;
        self.inner.limit()
    }
}
