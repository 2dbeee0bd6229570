//! [`PairWindow`]: two counters summed over a sliding window of buckets, updated under one small
//! lock so that "check the totals, then count" is atomic (retry budgets, client throttling).

use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::{duration_to_nanos, Nanos};
use crate::error::ConfigError;

const EMPTY: u64 = u64::MAX;

/// Two counters (a, b) per bucket over a sliding window.
#[derive(Debug)]
pub struct PairWindow {
    window_ns: Nanos,
    bucket_ns: Nanos,
    /// (bucket index, a, b).
    ring: Mutex<Vec<(u64, u64, u64)>>,
}

impl PairWindow {
    /// A window of `window` split into `buckets`.
    pub fn new(window: Duration, buckets: u32) -> Result<Self, ConfigError> {
        if window.is_zero() {
            return Err(ConfigError::ZeroWindow);
        }
        if buckets == 0 {
            return Err(ConfigError::ZeroBuckets);
        }
        let window_ns = duration_to_nanos(window);
        Ok(Self {
            window_ns,
            bucket_ns: (window_ns / u64::from(buckets)).max(1),
            ring: Mutex::new(vec![(EMPTY, 0, 0); buckets as usize]),
        })
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns)
    }

    /// Adds to both counters at `now`.
    pub fn add(&self, now: Nanos, a: u64, b: u64) {
        self.add_if(now, |_, _| Some((a, b)));
    }

    /// Given the totals (a, b) in the window at `now`, `decide` returns what to add, if
    /// anything; the check and the addition are atomic. Returns whether something was added.
    pub fn add_if(&self, now: Nanos, decide: impl FnOnce(u64, u64) -> Option<(u64, u64)>) -> bool {
        let index = now / self.bucket_ns;
        let mut ring = self.ring.lock();
        let len = ring.len() as u64;
        let slot = (index % len) as usize;
        if ring[slot].0 != index && (ring[slot].0 == EMPTY || ring[slot].0 < index) {
            ring[slot] = (index, 0, 0);
        }
        let (ta, tb) = Self::sum(&ring, index);
        match decide(ta, tb) {
            Some((a, b)) => {
                if ring[slot].0 == index {
                    ring[slot].1 += a;
                    ring[slot].2 += b;
                }
                true
            }
            None => false,
        }
    }

    /// Totals (a, b) in the window ending at `now`.
    pub fn totals(&self, now: Nanos) -> (u64, u64) {
        Self::sum(&self.ring.lock(), now / self.bucket_ns)
    }

    fn sum(ring: &[(u64, u64, u64)], index: u64) -> (u64, u64) {
        let oldest = (index + 1).saturating_sub(ring.len() as u64);
        ring.iter()
            .filter(|b| b.0 != EMPTY && b.0 >= oldest && b.0 <= index)
            .fold((0, 0), |(a, b), x| (a + x.1, b + x.2))
    }
}
