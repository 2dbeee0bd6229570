//! The one answer every limiter gives: [`Decision`].

use std::time::Duration;

use crate::clock::Nanos;

/// Marks "never" in the raw retry field.
const NEVER: Nanos = u64::MAX;

/// The answer to `acquire(n)`, the same for every algorithm, so that HTTP headers, Envoy responses
/// and the simulator never special-case one.
///
/// - [`allowed`](Decision::allowed): the request may proceed (after `wait`).
/// - [`limit`](Decision::limit): the configured quota, N units per window.
/// - [`remaining`](Decision::remaining): units that would be admitted right now after this
///   decision.
/// - [`retry_after`](Decision::retry_after): zero when allowed; when denied, the exact earliest
///   time from now at which the same request would pass if nothing else happens; `None` when it
///   can never pass (n exceeds the capacity).
/// - [`reset_after`](Decision::reset_after): time until the limiter is back to full capacity.
/// - [`wait`](Decision::wait): for reservation and pacing algorithms, how long an admitted
///   request must wait before proceeding; zero otherwise.
///
/// Denied requests consume nothing. Times are kept as nanoseconds and `remaining` may be kept as
/// a quotient still to divide ([`Remaining`]), so building a decision on the hot path costs a
/// few stores; the accessors do the conversions when asked.
#[derive(Debug, Clone, Copy)]
pub struct Decision {
    allowed: bool,
    limit: u64,
    remaining: Remaining,
    retry_after: Nanos,
    reset_after: Nanos,
    wait: Nanos,
}

impl Decision {
    /// An admitted request.
    #[inline]
    pub fn allow(limit: u64, remaining: u64, reset_after: Nanos, wait: Nanos) -> Self {
        Self {
            allowed: true,
            limit,
            remaining: Remaining::units(remaining),
            retry_after: 0,
            reset_after,
            wait,
        }
    }

    /// A denied request that would pass `retry_after` nanoseconds from now.
    #[inline]
    pub fn deny(limit: u64, remaining: u64, retry_after: Nanos, reset_after: Nanos) -> Self {
        Self {
            allowed: false,
            limit,
            remaining: Remaining::units(remaining),
            retry_after: retry_after.min(NEVER - 1),
            reset_after,
            wait: 0,
        }
    }

    /// A denied request that can never pass (it asks for more than the capacity).
    #[inline]
    pub fn never(limit: u64, remaining: u64, reset_after: Nanos) -> Self {
        Self {
            allowed: false,
            limit,
            remaining: Remaining::units(remaining),
            retry_after: NEVER,
            reset_after,
            wait: 0,
        }
    }

    /// This decision with `remaining` given as a span of `span` nanoseconds in which one unit
    /// takes `unit` nanoseconds (so remaining = ⌊span / unit⌋, divided only when read).
    #[inline]
    pub fn with_remaining_span(mut self, span: Nanos, unit: Nanos) -> Self {
        self.remaining = Remaining {
            span,
            unit: unit.max(1),
        };
        self
    }

    /// Whether the request is admitted.
    #[inline]
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// The configured quota (units per window).
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Units that could still be admitted at once after this decision.
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.remaining.get()
    }

    /// [`Decision::remaining`] not yet divided: for a caller that keeps it and may never read it
    /// (a block reason, read only when a response announces it).
    #[inline]
    pub fn remaining_lazy(&self) -> Remaining {
        self.remaining
    }

    /// `Some(ZERO)` when allowed; the earliest retry time when denied; `None` = never.
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        (self.retry_after != NEVER).then(|| Duration::from_nanos(self.retry_after))
    }

    /// Time until the limiter is back to full capacity.
    #[inline]
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after)
    }

    /// How long an admitted request must wait before proceeding.
    #[inline]
    pub fn wait(&self) -> Duration {
        Duration::from_nanos(self.wait)
    }

    /// True when the request is denied and can never pass.
    #[inline]
    pub fn is_never(&self) -> bool {
        self.retry_after == NEVER
    }
}

/// Units that could still be admitted at once, as a decision holds it: a time span and the time
/// one unit takes (GCRA-style algorithms), divided only when read — an integer division costs
/// tens of cycles, more than building the whole decision. Compared and shown by its value.
#[derive(Clone, Copy)]
pub struct Remaining {
    span: u64,
    /// 1 for counters.
    unit: u64,
}

impl Remaining {
    /// `n` units.
    #[inline]
    pub const fn units(n: u64) -> Self {
        Self { span: n, unit: 1 }
    }

    /// The units (⌊span / unit⌋).
    #[inline]
    pub fn get(self) -> u64 {
        if self.unit == 1 {
            self.span
        } else {
            self.span / self.unit
        }
    }
}

impl From<u64> for Remaining {
    fn from(n: u64) -> Self {
        Self::units(n)
    }
}

impl PartialEq for Remaining {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Remaining {}

impl std::fmt::Debug for Remaining {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.allowed == other.allowed
            && self.limit == other.limit
            && self.remaining() == other.remaining()
            && self.retry_after == other.retry_after
            && self.reset_after == other.reset_after
            && self.wait == other.wait
    }
}

impl Eq for Decision {}

impl std::hash::Hash for Decision {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (
            self.allowed,
            self.limit,
            self.remaining(),
            self.retry_after,
            self.reset_after,
            self.wait,
        )
            .hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remaining_span_is_divided_when_read_and_compared_by_its_units() {
        // 2.5 units of 400 ns each left: 2 whole units.
        let d = Decision::deny(10, 0, 100, 4_000).with_remaining_span(1_000, 400);
        let lazy = d.remaining_lazy();
        assert_eq!(lazy.get(), 2);
        assert_eq!(d.remaining(), 2);
        assert_eq!(lazy, Remaining::units(2));
        assert_ne!(lazy, Remaining::from(3));
        assert_eq!(format!("{lazy:?}"), "2");
        // A zero unit never divides by zero.
        let zero = Decision::deny(10, 0, 100, 4_000).with_remaining_span(7, 0);
        assert_eq!(zero.remaining(), 7);
    }
}
