//! GCRA, the generic cell rate algorithm: the leaky bucket as a meter.
//!
//! State is one word, the theoretical arrival time (TAT) of the next unit, updated by CAS. Units
//! are spaced by the emission interval T = window / limit (rounded up to a nanosecond); `burst`
//! units may arrive at once. A request of n units at `now` passes iff
//! `max(TAT, now) + n·T − now ≤ burst·T`; it then moves TAT there. In any span of one window at
//! most `burst + limit` units pass (the property tests check this).

use std::time::Duration;

use crate::algorithm::{units_to_check, Algorithm, Outcome, Quota};
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

/// What GCRA's CAS step found: the outcome, the TAT it started from and the TAT after.
#[derive(Debug, Clone, Copy)]
pub struct GcraVerdict {
    outcome: Outcome,
    start: Nanos,
    end: Nanos,
}

impl Algorithm for Gcra {
    type Verdict = GcraVerdict;
    type State = u64;
    type Cell = AtomicCell;

    fn initial_state(&self, _now: Nanos) -> u64 {
        0
    }

    #[inline]
    fn step(&self, tat: &mut u64, n: u64, now: Nanos) -> GcraVerdict {
        let start = (*tat).max(now);
        let need = units_to_check(n);
        if need > self.burst {
            return GcraVerdict {
                outcome: Outcome::Never,
                start,
                end: start,
            };
        }
        // need ≤ burst, so need·T ≤ tolerance ≤ u64::MAX / 4: no overflow.
        let new_tat = start.saturating_add(need * self.interval);
        if new_tat > now.saturating_add(self.tolerance) {
            return GcraVerdict {
                outcome: Outcome::Denied,
                start,
                end: new_tat,
            };
        }
        let end = if n == 0 { start } else { new_tat };
        if n > 0 {
            *tat = end;
        }
        GcraVerdict {
            outcome: Outcome::Allowed,
            start,
            end,
        }
    }

    #[inline]
    fn finish(&self, v: GcraVerdict, _n: u64, now: Nanos) -> Decision {
        let limit = self.quota.limit();
        let horizon = now.saturating_add(self.tolerance);
        // remaining = ⌊(horizon − TAT) / T⌋, divided lazily by the decision.
        let span = |t: Nanos| horizon.saturating_sub(t);
        let d = match v.outcome {
            Outcome::Never => Decision::never(limit, 0, v.start - now),
            Outcome::Denied => Decision::deny(limit, 0, v.end - horizon, v.start - now),
            Outcome::Allowed => Decision::allow(limit, 0, v.end - now, 0),
        };
        let at = if v.outcome == Outcome::Allowed {
            v.end
        } else {
            v.start
        };
        d.with_remaining_span(span(at), self.interval)
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
