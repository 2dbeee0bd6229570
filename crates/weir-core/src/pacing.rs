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
//! pass. With the `tokio` feature, [`Limiter::acquire_paced`] sleeps the wait.

use std::time::Duration;

use crate::algorithm::{units_to_check, Algorithm, Quota};
use crate::cell::AtomicCell;
use crate::clock::{duration_to_nanos, Clock, Nanos};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::limiter::Limiter;

/// Pacing parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    quota: Quota,
    interval: Nanos,
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

    /// The decision step with an explicit maximum wait.
    #[inline]
    pub fn decide_within(&self, next: &mut u64, n: u64, now: Nanos, max_wait: Nanos) -> Decision {
        let limit = self.quota.limit();
        let leave = (*next).max(now);
        // Single units that could join the queue now.
        let room = |leave: Nanos| {
            let slack = now.saturating_add(max_wait).saturating_sub(leave);
            if now.saturating_add(max_wait) < leave {
                0
            } else {
                (slack / self.interval).saturating_add(1).min(limit)
            }
        };
        let need = units_to_check(n);
        if need > limit {
            return Decision::never(limit, room(leave), leave - now);
        }
        let wait = leave - now;
        if wait > max_wait {
            return Decision::deny(limit, room(leave), wait - max_wait, wait);
        }
        if n == 0 {
            return Decision::allow(limit, room(leave), wait, wait);
        }
        let after = leave.saturating_add(n * self.interval);
        *next = after;
        Decision::allow(limit, room(after), after - now, wait)
    }
}

impl Algorithm for Pacing {
    type State = u64;
    type Cell = AtomicCell;

    fn initial_state(&self, _now: Nanos) -> u64 {
        0
    }

    #[inline]
    fn decide(&self, next: &mut u64, n: u64, now: Nanos) -> Decision {
        self.decide_within(next, n, now, self.max_wait)
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
}

impl<C: Clock> Limiter<Pacing, C> {
    /// Admits `n` units if they can leave within `max_wait`; the decision carries the wait.
    pub fn try_acquire_within(&self, n: u64, max_wait: Duration) -> Decision {
        let now = self.clock().now();
        let max_wait = duration_to_nanos(max_wait);
        self.update_with(|a, s| a.decide_within(s, n, now, max_wait))
    }

    /// Admits `n` units and sleeps (tokio) until their slot; returns the decision, denied
    /// without sleeping when the queue is longer than the configured `max_wait`.
    #[cfg(feature = "tokio")]
    pub async fn acquire_paced(&self, n: u64) -> Decision {
        let decision = self.acquire(n);
        if decision.allowed && !decision.wait.is_zero() {
            tokio::time::sleep(decision.wait).await;
        }
        decision
    }
}
