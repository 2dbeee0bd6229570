//! CoDel for request queues (as Facebook adapted it for RPC servers): shed when the *minimum*
//! queueing delay over an interval stays above a target, i.e. when there is a standing queue,
//! not a passing burst. Defaults: target 5 ms, interval 100 ms.
//!
//! At each dequeue the caller passes how long the request waited. When an interval ends, the
//! queue is "overloaded" for the next interval iff the smallest wait seen in it exceeded the
//! target. While overloaded, a request is shed if it waited longer than its allowance:
//! 2 × target for SHEDDABLE, doubling per level (4×, 8×), and never for CRITICAL_PLUS.

use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::{duration_to_nanos, Nanos};
use crate::criticality::Criticality;

/// CoDel parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodelConfig {
    /// Acceptable standing queue delay.
    pub target: Duration,
    /// How long the delay must stay above target.
    pub interval: Duration,
}

impl Default for CodelConfig {
    fn default() -> Self {
        Self {
            target: Duration::from_millis(5),
            interval: Duration::from_millis(100),
        }
    }
}

#[derive(Debug)]
struct State {
    interval_end: Nanos,
    min_delay: Nanos,
    overloaded: bool,
}

/// The CoDel shedder.
#[derive(Debug)]
pub struct Codel {
    target: Nanos,
    interval: Nanos,
    state: Mutex<State>,
}

impl Codel {
    /// A shedder with `config`.
    pub fn new(config: CodelConfig) -> Self {
        Self {
            target: duration_to_nanos(config.target),
            interval: duration_to_nanos(config.interval).max(1),
            state: Mutex::new(State {
                interval_end: 0,
                min_delay: u64::MAX,
                overloaded: false,
            }),
        }
    }

    /// Whether the queue is currently considered overloaded.
    pub fn overloaded(&self) -> bool {
        self.state.lock().overloaded
    }

    /// Called when a request leaves the queue at `now` after waiting `delay`: true = shed it.
    pub fn should_shed(&self, delay: Nanos, level: Criticality, now: Nanos) -> bool {
        let mut s = self.state.lock();
        if now >= s.interval_end {
            s.overloaded = s.interval_end != 0 && s.min_delay > self.target;
            s.min_delay = delay;
            s.interval_end = now.saturating_add(self.interval);
        } else {
            s.min_delay = s.min_delay.min(delay);
        }
        if !s.overloaded || level == Criticality::CriticalPlus {
            return false;
        }
        let allowance = self.target.saturating_mul(2 << level.rank());
        delay > allowance
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_burst_is_not_shed_but_a_standing_queue_is() {
        let c = Codel::new(CodelConfig::default());
        // A burst: some long waits, but the minimum in the interval is small.
        for (i, d) in [1, 30, 40, 2, 50].iter().enumerate() {
            assert!(!c.should_shed(d * MS, Criticality::Sheddable, i as u64 * 10 * MS));
        }
        assert!(!c.should_shed(20 * MS, Criticality::Sheddable, 110 * MS));
        assert!(!c.overloaded());
        // A standing queue: every wait ≥ 20 ms for a whole interval.
        for i in 0..10u64 {
            c.should_shed(20 * MS, Criticality::Sheddable, 120 * MS + i * 10 * MS);
        }
        assert!(c.should_shed(20 * MS, Criticality::Sheddable, 230 * MS));
        assert!(c.overloaded());
        // Allowances grow with criticality; CRITICAL_PLUS is never shed.
        assert!(!c.should_shed(15 * MS, Criticality::SheddablePlus, 240 * MS));
        assert!(c.should_shed(25 * MS, Criticality::SheddablePlus, 241 * MS));
        assert!(!c.should_shed(35 * MS, Criticality::Critical, 242 * MS));
        assert!(c.should_shed(45 * MS, Criticality::Critical, 243 * MS));
        assert!(!c.should_shed(500 * MS, Criticality::CriticalPlus, 244 * MS));
    }
}
