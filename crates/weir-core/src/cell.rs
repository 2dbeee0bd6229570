//! Where a direct limiter keeps its state: one atomic word updated by CAS, or a mutex for states
//! that do not fit in a word. Algorithms are pure functions over their state; the cell makes the
//! update atomic.

use parking_lot::Mutex;

use crate::sync::{AtomicU64, Ordering};

/// Storage for an algorithm's state that applies a decision step atomically.
pub trait StateCell<S>: Send + Sync {
    /// A cell holding `state`.
    fn new(state: S) -> Self;
    /// Runs `step` on the current state and stores the result atomically. `step` may run more
    /// than once (CAS retry); it must be a pure function of the state it is given.
    fn update<V, F: FnMut(&mut S) -> V>(&self, step: F) -> V;
    /// A copy of the current state.
    fn snapshot(&self) -> S;
}

/// A state that is one `u64` word, updated lock-free with compare-and-swap.
#[derive(Debug)]
pub struct AtomicCell(AtomicU64);

impl StateCell<u64> for AtomicCell {
    fn new(state: u64) -> Self {
        Self(AtomicU64::new(state))
    }

    #[inline]
    fn update<V, F: FnMut(&mut u64) -> V>(&self, mut step: F) -> V {
        let mut current = self.0.load(Ordering::Acquire);
        loop {
            let mut next = current;
            let decision = step(&mut next);
            if next == current {
                return decision;
            }
            match self
                .0
                .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return decision,
                Err(actual) => current = actual,
            }
        }
    }

    fn snapshot(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// A state behind a mutex, for algorithms whose state is more than a word (windows of buckets,
/// logs, warm-up's fractional permits).
#[derive(Debug)]
pub struct MutexCell<S>(Mutex<S>);

impl<S: Clone + Send> StateCell<S> for MutexCell<S> {
    fn new(state: S) -> Self {
        Self(Mutex::new(state))
    }

    #[inline]
    fn update<V, F: FnMut(&mut S) -> V>(&self, mut step: F) -> V {
        step(&mut self.0.lock())
    }

    fn snapshot(&self) -> S {
        self.0.lock().clone()
    }
}
