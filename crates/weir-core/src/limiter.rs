//! [`Limiter`]: one algorithm, one state, one clock.

use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::cell::StateCell;
use crate::clock::{Clock, MonotonicClock, Nanos};
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

    /// Runs `step` with the algorithm and the state atomically: for algorithm-specific calls such
    /// as a token bucket's reservation with its own maximum wait.
    #[inline]
    pub(crate) fn update_with<V>(&self, mut step: impl FnMut(&A, &mut A::State) -> V) -> V {
        self.state.update(|s| step(&self.algorithm, s))
    }

    /// A new limiter with other parameters that keeps this one's state (counters, stored permits,
    /// warm-up progress).
    pub fn reconfigured(self, algorithm: A) -> Self {
        Self {
            algorithm,
            state: self.state,
            clock: self.clock,
        }
    }

    /// The window of the configured quota.
    pub fn window(&self) -> Duration {
        self.algorithm.window()
    }
}

impl<A: Algorithm + std::fmt::Debug, C: Clock> std::fmt::Debug for Limiter<A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}
