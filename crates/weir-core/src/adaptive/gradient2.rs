//! Gradient2 (Netflix `Gradient2Limit`: initial 20, min 20, max 200, smoothing 0.2, queue 4,
//! long window 600, RTT tolerance 1.5). The gradient `clamp(tolerance × long_rtt / short_rtt,
//! 0.5, 1)` compares the latest RTT with a long exponential average: when latency rises the
//! limit shrinks towards `limit × gradient + queue`; when it does not, the queue allowance lets
//! it grow. A long average that drifts far above the short one is decayed so the algorithm
//! recovers after a slow period. Samples from an under-used limit change nothing.

use super::{LimitAlgorithm, Sample};

/// Gradient2 limit.
#[derive(Debug, Clone)]
pub struct Gradient2 {
    limit: f64,
    long_rtt: f64,
    samples: u64,
    /// Smallest limit.
    pub min: u64,
    /// Largest limit.
    pub max: u64,
    /// Weight of a new estimate.
    pub smoothing: f64,
    /// Extra concurrency allowed for queueing.
    pub queue: f64,
    /// Samples in the long RTT average.
    pub long_window: u64,
    /// Latency increase tolerated before shrinking (1.5 = 50 %).
    pub tolerance: f64,
}

impl Default for Gradient2 {
    fn default() -> Self {
        Self {
            limit: 20.0,
            long_rtt: 0.0,
            samples: 0,
            min: 20,
            max: 200,
            smoothing: 0.2,
            queue: 4.0,
            long_window: 600,
            tolerance: 1.5,
        }
    }
}

impl Gradient2 {
    /// The current long-term RTT average in ns.
    pub fn long_rtt(&self) -> f64 {
        self.long_rtt
    }
}

impl LimitAlgorithm for Gradient2 {
    fn limit(&self) -> u64 {
        self.limit as u64
    }

    fn on_sample(&mut self, s: Sample) -> u64 {
        if s.rtt == 0 {
            return self.limit();
        }
        let short = s.rtt as f64;
        // Exponential average; a simple mean over the first 10 samples (warm-up).
        self.samples += 1;
        if self.samples <= 10 {
            self.long_rtt += (short - self.long_rtt) / self.samples as f64;
        } else {
            let f = 2.0 / (self.long_window as f64 + 1.0);
            self.long_rtt = self.long_rtt * (1.0 - f) + short * f;
        }
        if self.long_rtt / short > 2.0 {
            self.long_rtt *= 0.95;
        }
        if (s.in_flight as f64) < self.limit / 2.0 {
            return self.limit();
        }
        let gradient = (self.tolerance * self.long_rtt / short).clamp(0.5, 1.0);
        let target = self.limit * gradient + self.queue;
        let new = self.limit * (1.0 - self.smoothing) + target * self.smoothing;
        self.limit = new.clamp(self.min.max(1) as f64, self.max.max(1) as f64);
        self.limit()
    }
}
