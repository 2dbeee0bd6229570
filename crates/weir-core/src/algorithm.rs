//! The contract between an algorithm (parameters + a pure decision step) and where its state
//! lives (a [`crate::cell::StateCell`] for one limiter, a shard of a [`crate::keyed::KeyedLimiter`]
//! for many keys).

use std::time::Duration;

use crate::cell::StateCell;
use crate::clock::{duration_to_nanos, Nanos};
use crate::decision::Decision;
use crate::error::ConfigError;

/// A rate-limiting algorithm: immutable parameters and a pure step over a state.
///
/// `decide` must not panic for any `n` or `now`, must consume nothing when it denies, and
/// treats a `now` earlier than what the state has seen as "no time has passed".
pub trait Algorithm: Send + Sync + 'static {
    /// Per-limiter (per-key) state.
    type State: Clone + Send + Sync + 'static;
    /// Where a single limiter keeps `State` (lock-free word or mutex).
    type Cell: StateCell<Self::State>;

    /// What [`Algorithm::step`] hands to [`Algorithm::finish`]: the little a lock-free update
    /// must know inside its compare-and-swap window. Algorithms without a CAS path use
    /// [`Decision`] itself.
    type Verdict: Copy;

    /// The state of a fresh, idle limiter created at `now`.
    fn initial_state(&self, now: Nanos) -> Self::State;

    /// The part of a decision that reads and updates the state: as little work as possible, so
    /// that concurrent CAS updates rarely collide.
    fn step(&self, state: &mut Self::State, n: u64, now: Nanos) -> Self::Verdict;

    /// Completes the decision after the state update (computes remaining, reset, retry).
    fn finish(&self, verdict: Self::Verdict, n: u64, now: Nanos) -> Decision;

    /// Decides a request for `n` units at `now` (n = 0 peeks: it answers whether one unit would
    /// pass and consumes nothing), updating `state` when units are consumed.
    #[inline]
    fn decide(&self, state: &mut Self::State, n: u64, now: Nanos) -> Decision {
        let verdict = self.step(state, n, now);
        self.finish(verdict, n, now)
    }

    /// True when `state` behaves exactly like a fresh limiter's at `now` (so dropping it loses
    /// nothing): the keyed store evicts such keys first.
    fn is_idle(&self, state: &Self::State, now: Nanos) -> bool;

    /// The configured quota (units per window), as reported in [`Decision::limit`].
    fn limit(&self) -> u64;

    /// The window the quota is measured over.
    fn window(&self) -> Duration;

    /// Converts `state`, kept under `from`'s parameters, to these at `now` (a limiter retuned
    /// by a reload or a new lease). Algorithms whose state counts units as time ahead of `now`
    /// (GCRA, the token bucket, pacing) keep the units, spaced at the new interval: a limit
    /// raised from a very low rate admits at the new rate at once instead of serving out the
    /// old spacing, and one lowered keeps counting what was admitted. Others keep the state.
    fn carry(&self, _from: &Self, _state: &mut Self::State, _now: Nanos) {}
}

/// The time state `t` (units spaced by `from` nanoseconds, ahead of `now`) with the same units
/// spaced by `to` nanoseconds ([`Algorithm::carry`]); a time not ahead of `now` is kept.
pub(crate) fn carry_time(t: &mut Nanos, now: Nanos, from: Nanos, to: Nanos) {
    if *t > now && from > 0 {
        let ahead = (u128::from(*t - now) * u128::from(to)) / u128::from(from);
        *t = now.saturating_add(u64::try_from(ahead).unwrap_or(u64::MAX));
    }
}

/// Algorithms whose admitted requests may wait (reservations, pacing): the state step with a
/// maximum wait given per call instead of the configured one. [`crate::Limiter`] builds
/// `try_acquire_within` and `reserve` on it.
pub trait Reserving: Algorithm {
    /// [`Algorithm::step`] admitting requests that wait at most `max_wait` nanoseconds.
    fn step_within(
        &self,
        state: &mut Self::State,
        n: u64,
        now: Nanos,
        max_wait: Nanos,
    ) -> Self::Verdict;
}

/// How a decision came out, for algorithms whose verdict carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted.
    Allowed,
    /// Denied; would pass later.
    Denied,
    /// Denied; can never pass.
    Never,
}

/// "N units per window", validated. Shared by every rate algorithm's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    limit: u64,
    window_ns: Nanos,
}

impl Quota {
    /// `limit` units per `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::ZeroLimit);
        }
        if window.is_zero() {
            return Err(ConfigError::ZeroWindow);
        }
        if window.as_nanos() > u128::from(u64::MAX / 4) {
            return Err(ConfigError::WindowTooLong);
        }
        Ok(Self {
            limit,
            window_ns: duration_to_nanos(window),
        })
    }

    /// A quota from the parts of one made by [`Quota::new`] (no checks: crate-internal).
    pub(crate) fn from_parts(limit: u64, window_ns: Nanos) -> Self {
        Self { limit, window_ns }
    }

    /// `limit` units per second.
    pub fn per_second(limit: u64) -> Result<Self, ConfigError> {
        Self::new(limit, Duration::from_secs(1))
    }

    /// The number of units per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length in nanoseconds.
    pub fn window_nanos(&self) -> Nanos {
        self.window_ns
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns)
    }

    /// Nanoseconds per unit, rounded up so the admitted rate never exceeds the quota (the error is
    /// below one nanosecond per unit). At least 1.
    pub fn emission_interval(&self) -> Nanos {
        self.window_ns.div_ceil(self.limit).max(1)
    }
}

/// Units a request asks the algorithm to check: a peek (`n = 0`) checks one unit.
#[inline]
pub(crate) fn units_to_check(n: u64) -> u64 {
    n.max(1)
}
