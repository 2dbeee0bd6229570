//! A gate for log lines an attacker can trigger at will (a malformed cost, a store answering
//! garbage): at most one line per interval, with the count of those held back since, so a
//! flood of bad input costs a log line a second, not one per request.
//!
//! ```
//! use weir_core::log_gate::LogGate;
//!
//! let gate = LogGate::new(1_000_000_000); // one line a second
//! assert_eq!(gate.open(0), Some(0)); // log it; none held back before
//! assert_eq!(gate.open(10), None); // held back
//! assert_eq!(gate.open(20), None);
//! assert_eq!(gate.open(1_000_000_000), Some(2)); // log it, saying 2 were held back
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::Nanos;

/// At most one open per `interval`; lock-free.
#[derive(Debug)]
pub struct LogGate {
    interval: Nanos,
    /// When the gate last opened, plus one (0: never).
    last: AtomicU64,
    held: AtomicU64,
}

impl LogGate {
    /// A gate opening at most once per `interval` nanoseconds.
    pub const fn new(interval: Nanos) -> Self {
        Self {
            interval,
            last: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// Whether to log at `now`: `Some(n)` — log, `n` lines were held back since the last —
    /// or `None` (counted as held back).
    pub fn open(&self, now: Nanos) -> Option<u64> {
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last - 1) >= self.interval;
        if due
            && self
                .last
                .compare_exchange(
                    last,
                    now.saturating_add(1),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.held.swap(0, Ordering::AcqRel));
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_whatever_the_flood() {
        let gate = LogGate::new(1_000);
        let opened = (0..10_000u64).filter(|t| gate.open(*t).is_some()).count();
        assert_eq!(opened, 10);
        assert_eq!(gate.open(10_000), Some(999));
    }
}
