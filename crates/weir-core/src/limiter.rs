//! [`Limiter`]: one algorithm, one state, one clock.

use std::time::Duration;

use crate::algorithm::{Algorithm, Reserving};
use crate::cell::StateCell;
use crate::clock::{duration_to_nanos, Clock, MonotonicClock, Nanos};
use crate::decision::Decision;

/// A single rate limiter: an algorithm's parameters, its state in a cell (lock-free for
/// one-word states), and the clock it reads. `Send + Sync`; share it by reference or `Arc`.
pub struct Limiter<A: Algorithm, C: Clock = MonotonicClock> {
    algorithm: A,
    state: A::Cell,
    clock: C,
}

impl<A: Algorithm> Limiter<A, MonotonicClock> {
    /// A limiter on the default real clock.
    pub fn new(algorithm: A) -> Self {
        Self::with_clock(algorithm, MonotonicClock::new())
    }
}

impl<A: Algorithm, C: Clock> Limiter<A, C> {
    /// A limiter reading time from `clock`.
    pub fn with_clock(algorithm: A, clock: C) -> Self {
        let state = A::Cell::new(algorithm.initial_state(clock.now()));
        Self {
            algorithm,
            state,
            clock,
        }
    }

    /// A limiter starting from `state` — another limiter's [`Limiter::state`], to change
    /// parameters and keep its counters.
    pub fn with_state(algorithm: A, state: A::State, clock: C) -> Self {
        Self {
            algorithm,
            state: A::Cell::new(state),
            clock,
        }
    }

    /// The cell holding the state.
    pub(crate) fn cell(&self) -> &A::Cell {
        &self.state
    }

    /// A copy of the current state.
    pub fn state(&self) -> A::State {
        self.state.snapshot()
    }

    /// Asks for `n` units now (`n = 0` peeks).
    #[inline]
    pub fn acquire(&self, n: u64) -> Decision {
        self.acquire_at(n, self.clock.now())
    }

    /// Asks for `n` units at an explicit time.
    #[inline]
    pub fn acquire_at(&self, n: u64, now: Nanos) -> Decision {
        let verdict = self
            .state
            .update(|state| self.algorithm.step(state, n, now));
        self.algorithm.finish(verdict, n, now)
    }

    /// Whether the limiter is idle (as if fresh) now.
    pub fn is_idle(&self) -> bool {
        self.algorithm
            .is_idle(&self.state.snapshot(), self.clock.now())
    }

    /// The algorithm's parameters.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// A new limiter with other parameters that keeps this one's state (counters, stored permits,
    /// warm-up progress), carried to the new parameters ([`Algorithm::carry`]).
    pub fn reconfigured(self, algorithm: A) -> Self {
        let mut state = self.state.snapshot();
        algorithm.carry(&self.algorithm, &mut state, self.clock.now());
        Self {
            algorithm,
            state: A::Cell::new(state),
            clock: self.clock,
        }
    }

    /// A limiter with other parameters starting from a copy of this one's state, carried to
    /// them ([`Algorithm::carry`]). Decisions made on this one afterwards are not carried.
    pub fn retuned(&self, algorithm: A) -> Self
    where
        C: Clone,
    {
        let mut state = self.state.snapshot();
        algorithm.carry(&self.algorithm, &mut state, self.clock.now());
        Self::with_state(algorithm, state, self.clock.clone())
    }

    /// The window of the configured quota.
    pub fn window(&self) -> Duration {
        self.algorithm.window()
    }
}

impl<A: Reserving, C: Clock> Limiter<A, C> {
    /// Guava's `tryAcquire(n, timeout)`: granted iff the wait is at most `max_wait` (instead of
    /// the configured maximum); the decision carries the wait the caller must observe.
    pub fn try_acquire_within(&self, n: u64, max_wait: Duration) -> Decision {
        let now = self.clock.now();
        let max_wait = duration_to_nanos(max_wait);
        let verdict = self
            .state
            .update(|s| self.algorithm.step_within(s, n, now, max_wait));
        self.algorithm.finish(verdict, n, now)
    }

    /// Guava's `reserve(n)` / `acquire(n)` without sleeping: granted with any wait (unless `n`
    /// exceeds the capacity); returns the wait.
    pub fn reserve(&self, n: u64) -> Decision {
        self.try_acquire_within(n, Duration::MAX)
    }
}

impl<A: Algorithm, C: Clock> Limiter<A, C> {
    /// Asks for `n` units and, when admitted with a wait (token bucket reservations, pacing),
    /// sleeps it on tokio before returning.
    #[cfg(feature = "tokio")]
    pub async fn acquire_paced(&self, n: u64) -> Decision {
        let decision = self.acquire(n);
        if decision.allowed() && !decision.wait().is_zero() {
            tokio::time::sleep(decision.wait()).await;
        }
        decision
    }
}

impl<A: Algorithm + std::fmt::Debug, C: Clock> std::fmt::Debug for Limiter<A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}
