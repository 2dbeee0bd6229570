//! AIMD: additive increase while the limit is in use, multiplicative decrease on a drop or a
//! timeout (Netflix `AIMDLimit`: initial 20, min 20, max 200, backoff 0.9, timeout 5 s).

use std::time::Duration;

use super::{LimitAlgorithm, Sample};
use crate::clock::duration_to_nanos;

/// Additive-increase / multiplicative-decrease limit.
#[derive(Debug, Clone)]
pub struct Aimd {
    limit: f64,
    /// Smallest limit.
    pub min: u64,
    /// Largest limit.
    pub max: u64,
    /// Multiplier applied on a drop, in (0.5, 1).
    pub backoff: f64,
    /// An RTT above this counts as a drop.
    pub timeout: Duration,
}

impl Default for Aimd {
    fn default() -> Self {
        Self {
            limit: 20.0,
            min: 20,
            max: 200,
            backoff: 0.9,
            timeout: Duration::from_secs(5),
        }
    }
}

impl Aimd {
    /// Netflix's defaults with another initial limit.
    pub fn with_initial(initial: u64) -> Self {
        Self {
            limit: initial as f64,
            ..Self::default()
        }
    }
}

impl LimitAlgorithm for Aimd {
    fn limit(&self) -> u64 {
        self.limit as u64
    }

    fn on_sample(&mut self, s: Sample) -> u64 {
        if s.dropped || s.rtt > duration_to_nanos(self.timeout) {
            self.limit = (self.limit * self.backoff).floor();
        } else if s.in_flight * 2 >= self.limit as u64 {
            self.limit += 1.0;
        }
        self.limit = self
            .limit
            .clamp(self.min.max(1) as f64, self.max.max(1) as f64);
        self.limit()
    }
}
