//! Learned cost estimates: what recent calls actually cost, summed up in two quantiles.
//!
//! Clients state a maximum (an LLM call's `max_tokens`) that is routinely 4–20 × what the call
//! uses, and an estimate held at that maximum blocks the budget for the whole call. A learned
//! estimate holds what calls like it have actually cost instead: [`LearnedCost::record`] takes
//! each settled call's actual cost, [`LearnedCost::quantiles`] answers the median and a high
//! quantile of the last [`SAMPLES`] once [`MIN_SAMPLES`] came. A cost rule then holds the high
//! quantile (capped by the call's stated maximum), and no less than the median (a client stating
//! less than a typical call holds a typical call) — weir-rules' `estimate: learned`.
//!
//! What it can cost: a call above the high quantile is charged its excess when it settles (a
//! debt, as every excess); about one call in twenty by definition, each at most the rule's `max`
//! above its hold.
//!
//! ```
//! use weir_core::learned::LearnedCost;
//!
//! let learned = LearnedCost::default();
//! let costs = [50, 80, 120, 60, 90, 70, 3_000, 65, 75, 85, 95, 55, 100, 110, 45, 60, 70, 80, 90, 100];
//! for actual in costs {
//!     learned.record(actual);
//! }
//! let q = learned.quantiles().expect("20 samples");
//! assert_eq!(q.typical, 80);
//! assert_eq!(q.high, 120); // the one call of 3 000 in 20 is past the 95th percentile
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Actual costs remembered.
pub const SAMPLES: usize = 64;

/// Actual costs needed before anything is learned.
pub const MIN_SAMPLES: usize = 16;

/// The quantile an estimate holds, in hundredths (nearest rank).
pub const HIGH_PERCENTILE: usize = 95;

/// What recent calls cost: the median and the high quantile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantiles {
    /// The median.
    pub typical: u64,
    /// The [`HIGH_PERCENTILE`]th percentile.
    pub high: u64,
}

/// The last [`SAMPLES`] actual costs and their quantiles (read lock-free on the admission path,
/// recomputed when a call settles).
#[derive(Debug, Default)]
pub struct LearnedCost {
    recent: Mutex<Ring>,
    /// [`Quantiles`], packed as typical << 32 | high (each at most 2³² − 1), and 0 until
    /// learned.
    packed: AtomicU64,
}

#[derive(Debug)]
struct Ring {
    costs: [u64; SAMPLES],
    next: usize,
    len: usize,
}

impl Default for Ring {
    fn default() -> Self {
        Self {
            costs: [0; SAMPLES],
            next: 0,
            len: 0,
        }
    }
}

impl LearnedCost {
    /// A settled call cost `actual`.
    pub fn record(&self, actual: u64) {
        let mut r = self.recent.lock();
        let i = r.next;
        r.costs[i] = actual;
        r.next = (i + 1) % SAMPLES;
        r.len = (r.len + 1).min(SAMPLES);
        if r.len < MIN_SAMPLES {
            return;
        }
        let mut sorted = [0u64; SAMPLES];
        let n = r.len;
        sorted[..n].copy_from_slice(&r.costs[..n]);
        drop(r);
        let sorted = &mut sorted[..n];
        sorted.sort_unstable();
        // Nearest rank: the smallest cost at least p % of the calls did not exceed.
        let at = |p: usize| sorted[(n * p).div_ceil(100) - 1];
        let clamp = |v: u64| v.min(u64::from(u32::MAX));
        let (typical, high) = (clamp(at(50)), clamp(at(HIGH_PERCENTILE)));
        self.packed
            .store((typical << 32) | high.max(1), Ordering::Relaxed);
    }

    /// The quantiles of the recent costs; `None` until [`MIN_SAMPLES`] calls settled.
    pub fn quantiles(&self) -> Option<Quantiles> {
        let p = self.packed.load(Ordering::Relaxed);
        (p != 0).then_some(Quantiles {
            typical: p >> 32,
            high: p & u64::from(u32::MAX),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_learned_before_enough_calls_and_old_ones_are_forgotten() {
        let l = LearnedCost::default();
        for _ in 0..MIN_SAMPLES - 1 {
            l.record(100);
        }
        assert_eq!(l.quantiles(), None);
        l.record(100);
        assert_eq!(
            l.quantiles(),
            Some(Quantiles {
                typical: 100,
                high: 100
            })
        );
        // A whole ring of cheaper calls later, only they count.
        for _ in 0..SAMPLES {
            l.record(10);
        }
        assert_eq!(
            l.quantiles(),
            Some(Quantiles {
                typical: 10,
                high: 10
            })
        );
        // Costs of 0 are learned too (high is at least 1: nothing admits for free).
        for _ in 0..SAMPLES {
            l.record(0);
        }
        assert_eq!(
            l.quantiles(),
            Some(Quantiles {
                typical: 0,
                high: 1
            })
        );
    }

    #[test]
    fn the_high_quantile_covers_nineteen_calls_in_twenty() {
        let l = LearnedCost::default();
        for i in 1..=SAMPLES as u64 {
            l.record(i * 10);
        }
        let q = l.quantiles().unwrap();
        let covered = (1..=SAMPLES as u64).filter(|i| i * 10 <= q.high).count();
        assert!(covered * 100 >= SAMPLES * HIGH_PERCENTILE, "{covered}");
        assert_eq!(q.typical, 320);
    }
}
