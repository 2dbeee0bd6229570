//! Token bucket with warm-up (Guava `SmoothWarmingUp`, Sentinel's warm-up flow control).
//!
//! After a quiet period the bucket is "cold": stored permits above a threshold cost more time, so
//! the rate ramps from `rate / cold_factor` up to `rate` over the warm-up period instead of
//! letting a cold service take the full rate at once. With stable interval S, cold interval
//! C = S · cold_factor and warm-up period W (Guava's definitions):
//! - threshold permits = W / (2 S); max permits = threshold + 2 W / (S + C);
//! - taking a permit stored above the threshold costs between S and C, linearly in how far above
//!   the threshold it is; below the threshold a permit costs S;
//! - idle time refills permits at W / max permits per permit; the limiter starts cold (full).
//!
//! As in Guava, a request is granted when the previous requests' wait is within `max_wait`; its
//! own cost is paid by the next caller. The state (fractional permits and next free time) is two
//! words, kept behind a mutex.

use std::time::Duration;

use crate::algorithm::{units_to_check, Algorithm, Quota, Reserving};
use crate::cell::MutexCell;
use crate::clock::{duration_to_nanos, Nanos};
use crate::decision::Decision;
use crate::error::ConfigError;

/// Guava's and Sentinel's cold factor.
pub const DEFAULT_COLD_FACTOR: f64 = 3.0;

/// Warming-up token bucket parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupTokenBucket {
    quota: Quota,
    warmup_ns: f64,
    stable: f64,
    threshold: f64,
    max_permits: f64,
    slope: f64,
    cooldown: f64,
    max_wait: Nanos,
}

/// Stored permits and the time the next request may proceed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupState {
    stored: f64,
    next_free: Nanos,
}

impl WarmupTokenBucket {
    /// A bucket for `quota` warming up over `warmup` with Guava's cold factor 3.
    pub fn new(quota: Quota, warmup: Duration) -> Result<Self, ConfigError> {
        Self::with_cold_factor(quota, warmup, DEFAULT_COLD_FACTOR)
    }

    /// As [`WarmupTokenBucket::new`] with another cold factor (> 1).
    pub fn with_cold_factor(
        quota: Quota,
        warmup: Duration,
        cold_factor: f64,
    ) -> Result<Self, ConfigError> {
        if warmup.is_zero() {
            return Err(ConfigError::ZeroWarmup);
        }
        if !(cold_factor.is_finite() && cold_factor > 1.0) {
            return Err(ConfigError::BadColdFactor(cold_factor.to_string()));
        }
        let warmup_ns = duration_to_nanos(warmup) as f64;
        let stable = quota.window_nanos() as f64 / quota.limit() as f64;
        let cold = stable * cold_factor;
        let threshold = 0.5 * warmup_ns / stable;
        let max_permits = threshold + 2.0 * warmup_ns / (stable + cold);
        Ok(Self {
            quota,
            warmup_ns,
            stable,
            threshold,
            max_permits,
            slope: (cold - stable) / (max_permits - threshold),
            cooldown: warmup_ns / max_permits,
            max_wait: 0,
        })
    }

    /// The longest wait a granted request may be given (`Duration::MAX` = any).
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = duration_to_nanos(max_wait);
        self
    }

    /// The most permits stored (the cold state).
    pub fn max_permits(&self) -> f64 {
        self.max_permits
    }

    /// Permits at which the bucket is fully warm.
    pub fn threshold_permits(&self) -> f64 {
        self.threshold
    }

    fn permits_to_time(&self, permits: f64) -> f64 {
        self.stable + permits * self.slope
    }

    /// Nanoseconds it costs to take `take` of `stored` permits (Guava's storedPermitsToWaitTime).
    fn stored_cost(&self, stored: f64, mut take: f64) -> f64 {
        let above = stored - self.threshold;
        let mut ns = 0.0;
        if above > 0.0 {
            let from_above = above.min(take);
            let length = self.permits_to_time(above) + self.permits_to_time(above - from_above);
            ns = from_above * length / 2.0;
            take -= from_above;
        }
        ns + self.stable * take
    }

    /// Stored permits at `now` (refilled since `next_free` at the cool-down rate).
    fn stored_at(&self, s: &WarmupState, now: Nanos) -> f64 {
        if now > s.next_free {
            (s.stored + (now - s.next_free) as f64 / self.cooldown).min(self.max_permits)
        } else {
            s.stored
        }
    }
}

impl Reserving for WarmupTokenBucket {
    fn step_within(
        &self,
        state: &mut WarmupState,
        n: u64,
        now: Nanos,
        max_wait: Nanos,
    ) -> Decision {
        let limit = self.quota.limit();
        let stored = self.stored_at(state, now);
        let next_free = state.next_free.max(now);
        // Time until full: permits missing × cool-down, after any pending wait.
        let reset = |stored: f64, next_free: Nanos| {
            let missing = (self.max_permits - stored).max(0.0) * self.cooldown;
            (next_free - now).saturating_add(missing as u64)
        };
        let need = units_to_check(n);
        if need as f64 > self.max_permits.max(1.0) {
            return Decision::never(limit, stored as u64, reset(stored, next_free));
        }
        let wait = next_free - now;
        if wait > max_wait {
            return Decision::deny(
                limit,
                stored as u64,
                wait - max_wait,
                reset(stored, next_free),
            );
        }
        if n == 0 {
            return Decision::allow(limit, stored as u64, reset(stored, next_free), wait);
        }
        let take = (n as f64).min(stored);
        let fresh = n as f64 - take;
        let cost = self.stored_cost(stored, take) + fresh * self.stable;
        let next = WarmupState {
            stored: stored - take,
            next_free: next_free.saturating_add(cost.ceil() as u64),
        };
        *state = next;
        Decision::allow(
            limit,
            next.stored as u64,
            reset(next.stored, next.next_free),
            wait,
        )
    }
}

impl Algorithm for WarmupTokenBucket {
    type State = WarmupState;
    type Verdict = Decision;
    type Cell = MutexCell<WarmupState>;

    fn initial_state(&self, now: Nanos) -> WarmupState {
        WarmupState {
            stored: self.max_permits,
            next_free: now,
        }
    }

    fn step(&self, state: &mut WarmupState, n: u64, now: Nanos) -> Decision {
        self.step_within(state, n, now, self.max_wait)
    }

    #[inline]
    fn finish(&self, decision: Decision, _n: u64, _now: Nanos) -> Decision {
        decision
    }

    fn is_idle(&self, state: &WarmupState, now: Nanos) -> bool {
        state.next_free <= now && self.stored_at(state, now) >= self.max_permits
    }

    fn limit(&self) -> u64 {
        self.quota.limit()
    }

    fn window(&self) -> Duration {
        self.quota.window()
    }
}

impl WarmupTokenBucket {
    /// The warm-up period in nanoseconds.
    pub fn warmup_nanos(&self) -> f64 {
        self.warmup_ns
    }
}
