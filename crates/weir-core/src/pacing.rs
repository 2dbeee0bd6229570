//! Pacing: the leaky bucket as a queue (Sentinel's "rate limiter" control behaviour,
//! uber-go/ratelimit, nginx `limit_req` with `delay`).
//!
//! Admitted requests leave evenly spaced at the configured rate: a request of n units leaves at
//! `max(now, next)` and moves `next` forward by n emission intervals. It is admitted, with that
//! wait, iff the wait is at most `max_wait` (the longest queueing time), else denied with the
//! exact time at which it would fit. State is one word updated by CAS, so concurrent callers
//! never get the same slot (Sentinel#3091 lets bursts through an unsynchronised fast path).
//!
//! Counted at their leave times, any span of one window holds at most `limit + n_max − 1` units
//! (exactly `limit` for single-unit requests). A request for more than `limit` units can never
//! pass. With the `tokio` feature, [`crate::Limiter::acquire_paced`] sleeps the wait.

use std::time::Duration;

use crate::algorithm::{units_to_check, Algorithm, Outcome, Quota, Reserving};
use crate::cell::AtomicCell;
use crate::clock::{duration_to_nanos, Nanos};
use crate::decision::Decision;
use crate::divide::Divisor;
use crate::error::ConfigError;

/// Pacing parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    quota: Quota,
    interval: Nanos,
    interval_div: Divisor,
    max_wait: Nanos,
}

impl Pacing {
    /// Requests spaced to `quota`, queueing at most `max_wait` (`Duration::MAX` = unbounded).
    pub fn new(quota: Quota, max_wait: Duration) -> Result<Self, ConfigError> {
        let interval = quota.emission_interval();
        if interval.checked_mul(quota.limit()).is_none() {
            return Err(ConfigError::TooLarge {
                what: "pacing limit × interval (ns)",
                value: quota.limit(),
                max: u64::MAX / interval,
            });
        }
        Ok(Self {
            quota,
            interval,
            interval_div: Divisor::new(interval),
            max_wait: duration_to_nanos(max_wait),
        })
    }

    /// Nanoseconds between units.
    pub fn emission_interval(&self) -> Nanos {
        self.interval
    }

    /// The longest queueing time.
    pub fn max_wait(&self) -> Duration {
        Duration::from_nanos(self.max_wait)
    }
}

/// What the pacing CAS step found.
#[derive(Debug, Clone, Copy)]
pub struct PacingVerdict {
    outcome: Outcome,
    leave: Nanos,
    end: Nanos,
    max_wait: Nanos,
}

impl Reserving for Pacing {
    #[inline]
    fn step_within(&self, next: &mut u64, n: u64, now: Nanos, max_wait: Nanos) -> PacingVerdict {
        let leave = (*next).max(now);
        let mut v = PacingVerdict {
            outcome: Outcome::Never,
            leave,
            end: leave,
            max_wait,
        };
        if units_to_check(n) > self.quota.limit() {
            return v;
        }
        if leave - now > max_wait {
            v.outcome = Outcome::Denied;
            return v;
        }
        v.outcome = Outcome::Allowed;
        if n > 0 {
            v.end = leave.saturating_add(n * self.interval);
            *next = v.end;
        }
        v
    }
}

impl Algorithm for Pacing {
    type Verdict = PacingVerdict;
    type State = u64;
    type Cell = AtomicCell;

    fn initial_state(&self, _now: Nanos) -> u64 {
        0
    }

    #[inline]
    fn step(&self, next: &mut u64, n: u64, now: Nanos) -> PacingVerdict {
        self.step_within(next, n, now, self.max_wait)
    }

    #[inline]
    fn finish(&self, v: PacingVerdict, _n: u64, now: Nanos) -> Decision {
        let limit = self.quota.limit();
        let deadline = now.saturating_add(v.max_wait);
        // Single units that could join the queue now.
        let room = |leave: Nanos| match deadline.checked_sub(leave) {
            Some(slack) => self.interval_div.div(slack).saturating_add(1).min(limit),
            None => 0,
        };
        let wait = v.leave - now;
        match v.outcome {
            Outcome::Never => Decision::never(limit, room(v.leave), wait),
            Outcome::Denied => Decision::deny(limit, room(v.leave), wait - v.max_wait, wait),
            Outcome::Allowed => Decision::allow(limit, room(v.end), v.end - now, wait),
        }
    }

    fn is_idle(&self, next: &u64, now: Nanos) -> bool {
        *next <= now
    }

    fn limit(&self) -> u64 {
        self.quota.limit()
    }

    fn window(&self) -> Duration {
        self.quota.window()
    }

    fn carry(&self, from: &Self, next: &mut u64, now: Nanos) {
        crate::algorithm::carry_time(next, now, from.interval, self.interval);
    }
}
