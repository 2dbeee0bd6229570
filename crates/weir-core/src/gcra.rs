//! GCRA, the generic cell rate algorithm: the leaky bucket as a meter.
//!
//! State is one word, the theoretical arrival time (TAT) of the next unit, updated by CAS. Units
//! are spaced by the emission interval T = window / limit (rounded up to a nanosecond); `burst`
//! units may arrive at once. A request of n units at `now` passes iff
//! `max(TAT, now) + n·T − now ≤ burst·T`; it then moves TAT there. In any span of one window at
//! most `burst + limit` units pass (the property tests check this).

use std::time::Duration;

use crate::algorithm::{units_to_check, Algorithm, Quota};
use crate::cell::AtomicCell;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::error::ConfigError;

/// GCRA parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    quota: Quota,
    burst: u64,
    interval: Nanos,
    tolerance: Nanos,
}

impl Gcra {
    /// A GCRA admitting `quota` on average with `burst` units at once (commonly = the limit).
    pub fn new(quota: Quota, burst: u64) -> Result<Self, ConfigError> {
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        let interval = quota.emission_interval();
        let tolerance = interval
            .checked_mul(burst)
            .filter(|t| *t <= u64::MAX / 4)
            .ok_or(ConfigError::TooLarge {
                what: "burst × emission interval (ns)",
                value: burst,
                max: (u64::MAX / 4) / interval,
            })?;
        Ok(Self {
            quota,
            burst,
            interval,
            tolerance,
        })
    }

    /// A GCRA whose burst equals its limit.
    pub fn from_quota(quota: Quota) -> Result<Self, ConfigError> {
        Self::new(quota, quota.limit())
    }

    /// Units admitted at once from idle.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Nanoseconds per unit.
    pub fn emission_interval(&self) -> Nanos {
        self.interval
    }
}

impl Algorithm for Gcra {
    type State = u64;
    type Cell = AtomicCell;

    fn initial_state(&self, _now: Nanos) -> u64 {
        0
    }

    #[inline]
    fn decide(&self, tat: &mut u64, n: u64, now: Nanos) -> Decision {
        let limit = self.quota.limit();
        let start = (*tat).max(now);
        let horizon = now.saturating_add(self.tolerance);
        let remaining_at = |t: Nanos| horizon.saturating_sub(t) / self.interval;
        let need = units_to_check(n);
        if need > self.burst {
            return Decision::never(limit, remaining_at(start), start - now);
        }
        // need ≤ burst, so need·T ≤ tolerance ≤ u64::MAX / 4: no overflow.
        let new_tat = start.saturating_add(need * self.interval);
        if new_tat > horizon {
            return Decision::deny(limit, remaining_at(start), new_tat - horizon, start - now);
        }
        let after = if n == 0 { start } else { new_tat };
        if n > 0 {
            *tat = new_tat;
        }
        Decision::allow(limit, remaining_at(after), after - now, 0)
    }

    fn is_idle(&self, tat: &u64, now: Nanos) -> bool {
        *tat <= now
    }

    fn limit(&self) -> u64 {
        self.quota.limit()
    }

    fn window(&self) -> Duration {
        self.quota.window()
    }
}
