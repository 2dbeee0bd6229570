//! Token bucket with Guava `RateLimiter` (SmoothBursty) semantics.
//!
//! Permits are stored while the bucket is idle, up to `burst` (Guava's max-burst-seconds × rate).
//! A request is granted when the *previous* requests' debt is paid within `max_wait`: a request
//! larger than the stored permits is granted at once and the next caller waits for the debt
//! (Guava's "pay later"). A request larger than `burst` can never pass (Guava would grant it;
//! Weir refuses so one caller cannot take an unbounded debt).
//!
//! State is one word, the time F at which the bucket would be full, updated by CAS: stored
//! permits = (now + burst·I − F) / I (clamped to [0, burst]) with I the interval per permit. A
//! request of n at `now` waits `max(F, now) − burst·I − now` (if positive) and moves F to
//! `max(F, now) + n·I`. This is GCRA that checks *before* adding the request's own cost.
//!
//! Bound (property-tested): in any span of one window, at most `limit + burst + n_last` units
//! are granted with `max_wait = 0`, where `n_last ≤ burst` is the last grant taken on credit.

use std::time::Duration;

use crate::algorithm::{units_to_check, Algorithm, Outcome, Quota, Reserving};
use crate::cell::AtomicCell;
use crate::clock::{duration_to_nanos, Nanos};
use crate::decision::Decision;
use crate::error::ConfigError;

/// Token bucket parameters (Guava SmoothBursty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    quota: Quota,
    burst: u64,
    interval: Nanos,
    capacity_ns: Nanos,
    max_wait: Nanos,
    start_full: bool,
}

impl TokenBucket {
    /// A bucket refilled at `quota`, holding up to `burst` permits, starting full, granting only
    /// requests that need not wait (`max_wait` = 0).
    pub fn new(quota: Quota, burst: u64) -> Result<Self, ConfigError> {
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        let interval = quota.emission_interval();
        let capacity_ns = interval
            .checked_mul(burst)
            .filter(|t| *t <= u64::MAX / 4)
            .ok_or(ConfigError::TooLarge {
                what: "burst × interval per permit (ns)",
                value: burst,
                max: (u64::MAX / 4) / interval,
            })?;
        Ok(Self {
            quota,
            burst,
            interval,
            capacity_ns,
            max_wait: 0,
            start_full: true,
        })
    }

    /// Guava's `RateLimiter.create(permits_per_second)`: burst = one second of permits, starts
    /// empty, and reservations may wait any time.
    pub fn guava(permits_per_second: u64) -> Result<Self, ConfigError> {
        let quota = Quota::per_second(permits_per_second)?;
        Ok(Self::new(quota, permits_per_second)?
            .with_max_wait(Duration::MAX)
            .starting_empty())
    }

    /// The longest wait a granted request may be given (`Duration::MAX` = any).
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = duration_to_nanos(max_wait);
        self
    }

    /// Start with no stored permits (Guava's behaviour) instead of a full bucket.
    pub fn starting_empty(mut self) -> Self {
        self.start_full = false;
        self
    }

    /// The most permits stored.
    pub fn burst(&self) -> u64 {
        self.burst
    }
}

/// What the token bucket's CAS step found.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucketVerdict {
    outcome: Outcome,
    start: Nanos,
    end: Nanos,
    wait: Nanos,
    max_wait: Nanos,
}

impl Reserving for TokenBucket {
    #[inline]
    fn step_within(
        &self,
        full_at: &mut u64,
        n: u64,
        now: Nanos,
        max_wait: Nanos,
    ) -> TokenBucketVerdict {
        let start = (*full_at).max(now);
        let need = units_to_check(n);
        let mut v = TokenBucketVerdict {
            outcome: Outcome::Never,
            start,
            end: start,
            wait: 0,
            max_wait,
        };
        if need > self.burst {
            return v;
        }
        v.wait = start.saturating_sub(self.capacity_ns).saturating_sub(now);
        if v.wait > max_wait {
            v.outcome = Outcome::Denied;
            return v;
        }
        v.outcome = Outcome::Allowed;
        if n > 0 {
            v.end = start.saturating_add(n * self.interval);
            *full_at = v.end;
        }
        v
    }
}

impl Algorithm for TokenBucket {
    type Verdict = TokenBucketVerdict;
    type State = u64;
    type Cell = AtomicCell;

    fn initial_state(&self, now: Nanos) -> u64 {
        if self.start_full {
            0
        } else {
            now.saturating_add(self.capacity_ns)
        }
    }

    #[inline]
    fn step(&self, full_at: &mut u64, n: u64, now: Nanos) -> TokenBucketVerdict {
        self.step_within(full_at, n, now, self.max_wait)
    }

    #[inline]
    fn finish(&self, v: TokenBucketVerdict, _n: u64, now: Nanos) -> Decision {
        let limit = self.quota.limit();
        // Stored permits = ⌊(now + capacity − F) / I⌋, divided lazily by the decision.
        let span = |f: Nanos| now.saturating_add(self.capacity_ns).saturating_sub(f);
        let (d, at) = match v.outcome {
            Outcome::Never => (Decision::never(limit, 0, v.start - now), v.start),
            Outcome::Denied => (
                Decision::deny(limit, 0, v.wait - v.max_wait, v.start - now),
                v.start,
            ),
            Outcome::Allowed => (Decision::allow(limit, 0, v.end - now, v.wait), v.end),
        };
        d.with_remaining_span(span(at), self.interval)
    }

    fn is_idle(&self, full_at: &u64, now: Nanos) -> bool {
        *full_at <= now
    }

    fn limit(&self) -> u64 {
        self.quota.limit()
    }

    fn window(&self) -> Duration {
        self.quota.window()
    }

    fn carry(&self, from: &Self, full_at: &mut u64, now: Nanos) {
        crate::algorithm::carry_time(full_at, now, from.interval, self.interval);
    }
}
impl crate::cost::Settle for TokenBucket {
    fn charge(&self, full_at: &mut u64, units: u64, now: Nanos) {
        crate::cost::charge_time(full_at, units, self.interval, now);
    }

    fn refund(&self, full_at: &mut u64, units: u64, held: crate::cost::Held, now: Nanos) {
        crate::cost::refund_time(full_at, units, held, self.interval, now);
    }
}
