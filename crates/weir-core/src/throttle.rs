//! Google SRE adaptive throttling on the client ("Handling Overload", the SRE book): each client
//! tracks, over a sliding window, the requests it attempted and those the backend accepted, and
//! rejects new requests locally with probability
//! `max(0, (requests − K × accepts) / (requests + 1))`. With K = 2 the client keeps sending up to
//! twice what the backend accepts; a failing backend stops receiving most traffic within the
//! window, and recovers as accepts come back.

use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::Nanos;
use crate::error::ConfigError;
use crate::pair_window::PairWindow;
use crate::retry::SplitMix64;

/// Client-side adaptive throttling.
#[derive(Debug)]
pub struct SreThrottle {
    k: f64,
    /// (requests, accepts).
    counts: PairWindow,
    rng: Mutex<SplitMix64>,
}

impl SreThrottle {
    /// K = 2 over the SRE book's 2-minute window (in 120 buckets of 1 s).
    pub fn new() -> Self {
        Self::with(2.0, Duration::from_secs(120), 120, 0x5EED).expect("defaults are valid")
    }

    /// Custom multiplier `k` (≥ 1), window and buckets; `seed` for the local random draws.
    pub fn with(k: f64, window: Duration, buckets: u32, seed: u64) -> Result<Self, ConfigError> {
        if !(k.is_finite() && k >= 1.0) {
            return Err(ConfigError::Invalid(format!(
                "SRE throttle K must be ≥ 1, got {k}"
            )));
        }
        Ok(Self {
            k,
            counts: PairWindow::new(window, buckets)?,
            rng: Mutex::new(SplitMix64(seed)),
        })
    }

    /// The current rejection probability.
    pub fn reject_probability(&self, now: Nanos) -> f64 {
        let (requests, accepts) = self.counts.totals(now);
        Self::probability(self.k, requests, accepts)
    }

    fn probability(k: f64, requests: u64, accepts: u64) -> f64 {
        ((requests as f64 - k * accepts as f64) / (requests as f64 + 1.0)).max(0.0)
    }

    /// Decides with the uniform draw `u` ∈ [0, 1): true = send, false = reject locally. Either
    /// way the request counts as attempted (the SRE book counts local rejections too, which is
    /// what lets the probability rise).
    pub fn allow_with(&self, now: Nanos, u: f64) -> bool {
        let mut send = true;
        self.counts.add_if(now, |requests, accepts| {
            send = u >= Self::probability(self.k, requests, accepts);
            Some((1, 0))
        });
        send
    }

    /// Decides with the throttle's own random generator.
    pub fn allow(&self, now: Nanos) -> bool {
        let u = self.rng.lock().next_f64();
        self.allow_with(now, u)
    }

    /// Records that the backend accepted a request (a response that was not an overload
    /// rejection).
    pub fn record_accept(&self, now: Nanos) {
        self.counts.add(now, 0, 1);
    }
}

impl Default for SreThrottle {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probability_matches_the_formula() {
        let t = SreThrottle::with(2.0, Duration::from_secs(60), 60, 1).unwrap();
        // 100 requests, 30 accepted: p = (100 − 60) / 101.
        for i in 0..100u64 {
            assert!(t.allow_with(i, 0.999_999));
            if i < 30 {
                t.record_accept(i);
            }
        }
        let p = t.reject_probability(100);
        assert!((p - 40.0 / 101.0).abs() < 1e-12, "{p}");
        // Draws below p reject, above pass.
        assert!(!t.allow_with(101, p / 2.0));
        assert!(t.allow_with(102, 0.99));
        // Healthy backend: accepts ≥ requests / K → never rejects.
        let h = SreThrottle::with(2.0, Duration::from_secs(60), 60, 1).unwrap();
        for i in 0..100u64 {
            assert!(h.allow_with(i, 0.0));
            h.record_accept(i);
        }
        assert_eq!(h.reject_probability(100), 0.0);
    }

    #[test]
    fn a_dead_backend_is_mostly_not_called_and_recovery_follows_accepts() {
        let t = SreThrottle::with(2.0, Duration::from_secs(10), 10, 42).unwrap();
        let ms = 1_000_000;
        let sent = (0..10_000u64).filter(|i| t.allow(i * ms / 2)).count();
        // Everything fails: p → 1, only a few requests reach the backend.
        assert!(sent < 200, "sent {sent} of 10000 to a dead backend");
        assert!(t.reject_probability(5_000 * ms) > 0.99);
        // After the window slides past, the client tries again.
        assert_eq!(t.reject_probability(30_000 * ms), 0.0);
        assert!(SreThrottle::with(0.5, Duration::from_secs(1), 1, 0).is_err());
    }
}
