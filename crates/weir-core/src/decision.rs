//! The one answer every limiter gives: [`Decision`].

use std::time::Duration;

use crate::clock::Nanos;

/// The answer to `acquire(n)`, the same for every algorithm, so that HTTP headers, Envoy responses
/// and the simulator never special-case one.
///
/// - `allowed`: the request may proceed (after `wait`).
/// - `limit`: the configured quota: N units per window.
/// - `remaining`: units that would be admitted right now after this decision.
/// - `retry_after`: zero when allowed; when denied, the exact earliest time from now at which the
///   same request would pass if nothing else happens; `None` when it can never pass (n exceeds
///   the capacity).
/// - `reset_after`: time until the limiter is back to its full, idle capacity.
/// - `wait`: for reservation and pacing algorithms, how long an admitted request must wait
///   before proceeding; zero otherwise.
///
/// Denied requests consume nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// The configured quota (units per window).
    pub limit: u64,
    /// Units that could still be admitted at once after this decision.
    pub remaining: u64,
    /// `Some(ZERO)` when allowed; earliest retry time when denied; `None` = never.
    pub retry_after: Option<Duration>,
    /// Time until the limiter is back to full capacity.
    pub reset_after: Duration,
    /// How long an admitted request must wait before proceeding.
    pub wait: Duration,
}

impl Decision {
    /// An admitted request.
    #[inline]
    pub fn allow(limit: u64, remaining: u64, reset_after: Nanos, wait: Nanos) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            retry_after: Some(Duration::ZERO),
            reset_after: Duration::from_nanos(reset_after),
            wait: Duration::from_nanos(wait),
        }
    }

    /// A denied request that would pass `retry_after` nanoseconds from now.
    #[inline]
    pub fn deny(limit: u64, remaining: u64, retry_after: Nanos, reset_after: Nanos) -> Self {
        Self {
            allowed: false,
            limit,
            remaining,
            retry_after: Some(Duration::from_nanos(retry_after)),
            reset_after: Duration::from_nanos(reset_after),
            wait: Duration::ZERO,
        }
    }

    /// A denied request that can never pass (it asks for more than the capacity).
    #[inline]
    pub fn never(limit: u64, remaining: u64, reset_after: Nanos) -> Self {
        Self {
            allowed: false,
            limit,
            remaining,
            retry_after: None,
            reset_after: Duration::from_nanos(reset_after),
            wait: Duration::ZERO,
        }
    }

    /// True when the request is denied and can never pass.
    #[inline]
    pub fn is_never(&self) -> bool {
        self.retry_after.is_none()
    }
}
