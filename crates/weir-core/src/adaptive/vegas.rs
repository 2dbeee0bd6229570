//! Vegas (TCP Vegas applied to concurrency, Netflix `VegasLimit`: initial 20, max 1000,
//! smoothing 1). The estimated queue is `limit × (1 − rtt_noload / rtt)`, with `rtt_noload` the
//! smallest RTT seen (re-probed every few hundred samples). A queue below α = 3·log10(limit)
//! grows the limit by log10(limit) (by β = 6·log10(limit) when below log10(limit)), above β
//! shrinks it by log10(limit); a drop shrinks it too. Samples from an under-used limit (in-flight
//! below half of it) change nothing.

use super::{log10_root, LimitAlgorithm, Sample};
use crate::clock::Nanos;

/// Vegas limit.
#[derive(Debug, Clone)]
pub struct Vegas {
    limit: f64,
    rtt_noload: Nanos,
    samples_until_probe: u64,
    /// Largest limit.
    pub max: u64,
    /// Weight of a new estimate (1 = take it as is).
    pub smoothing: f64,
    /// Re-measure the no-load RTT every `probe_multiplier × limit` samples.
    pub probe_multiplier: u64,
}

impl Default for Vegas {
    fn default() -> Self {
        Self {
            limit: 20.0,
            rtt_noload: 0,
            samples_until_probe: 30 * 20,
            max: 1000,
            smoothing: 1.0,
            probe_multiplier: 30,
        }
    }
}

impl LimitAlgorithm for Vegas {
    fn limit(&self) -> u64 {
        self.limit as u64
    }

    fn on_sample(&mut self, s: Sample) -> u64 {
        if s.rtt == 0 {
            return self.limit();
        }
        self.samples_until_probe = self.samples_until_probe.saturating_sub(1);
        if self.samples_until_probe == 0 {
            // Forget the no-load RTT now and then: the backend may have become slower for good.
            self.rtt_noload = 0;
            self.samples_until_probe = self.probe_multiplier * self.limit.max(1.0) as u64;
        }
        if self.rtt_noload == 0 || s.rtt < self.rtt_noload {
            self.rtt_noload = s.rtt;
            return self.limit();
        }
        let limit = self.limit;
        let log = log10_root(limit);
        let new = if s.dropped {
            limit - log
        } else if (s.in_flight as f64) * 2.0 < limit {
            return self.limit();
        } else {
            let queue = (limit * (1.0 - self.rtt_noload as f64 / s.rtt as f64)).ceil();
            let (alpha, beta) = (3.0 * log, 6.0 * log);
            if queue <= log {
                limit + beta
            } else if queue < alpha {
                limit + log
            } else if queue > beta {
                limit - log
            } else {
                return self.limit();
            }
        };
        let new = new.clamp(1.0, self.max.max(1) as f64);
        self.limit = ((1.0 - self.smoothing) * limit + self.smoothing * new).max(1.0);
        self.limit()
    }
}
