//! Counters striped per thread, for statistics counted on every call.
//!
//! An atomic `fetch_add` is a locked instruction (≈ 4–5 ns on the machines measured, more when
//! threads share the cache line); a call through the rules engine counts four of them. Here each
//! thread that counts owns one stripe of every counter set, leased from a process-wide pool the
//! first time it counts and returned when it exits: adding is a plain load and store on the
//! thread's own stripe (no locked instruction, no shared cache line). Threads beyond the pool
//! (more than the machine's cores plus two count at once) share one more stripe with
//! `fetch_add`. Reading sums the stripes.
//!
//! Exact, not approximate: a stripe has one writer at a time, so no addition is lost. Stores are
//! `Release` and reads `Acquire`: a reader that sees a count also sees every count the writer
//! had seen before it (a call's completion, counted on another thread than its start, is never
//! read without its start). Memory: `N` words per stripe, padded to cache lines; one shared
//! stripe, and the pool's stripes once a thread has added.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Largest pool of owned stripes, whatever the machine's core count.
pub const MAX_STRIPES: usize = 18;

/// The thread's stripe when it has none (the shared one).
const SHARED: usize = usize::MAX;

/// Stripes owned by threads: the machine's cores plus two (a main or reload thread that counts
/// once keeps its stripe), at most [`MAX_STRIPES`].
pub fn owned_stripes() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores + 2).min(MAX_STRIPES)
    })
}

/// Stripe ids returned by exited threads.
static FREE: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// Stripe ids never handed out start here.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A thread's stripe id, given back to the pool when the thread exits.
struct Lease(usize);

impl Lease {
    fn take() -> Self {
        let reused = FREE.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(id) = reused {
            return Self(id);
        }
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        Self(if id < owned_stripes() { id } else { SHARED })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.0 != SHARED {
            // The mutex orders this thread's last stores before the next owner's first loads.
            FREE.lock().unwrap_or_else(|e| e.into_inner()).push(self.0);
        }
    }
}

thread_local! {
    static LEASE: Lease = Lease::take();
}

/// The calling thread's stripe id ([`SHARED`] once its thread-locals are being torn down).
#[inline]
fn current() -> usize {
    LEASE.try_with(|l| l.0).unwrap_or(SHARED)
}

/// One stripe: `N` counters on their own cache lines.
#[derive(Debug)]
#[repr(align(64))]
struct Stripe<const N: usize>([AtomicU64; N]);

impl<const N: usize> Default for Stripe<N> {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

/// `N` counters striped per thread (see the module documentation). The per-thread stripes are
/// allocated at the first addition by a thread that owns one: a counter set nobody adds to
/// costs its shared stripe only.
#[derive(Debug, Default)]
pub struct Striped<const N: usize> {
    owned: OnceLock<Box<[Stripe<N>]>>,
    shared: Stripe<N>,
}

impl<const N: usize> Striped<N> {
    /// Adds `v` to counter `i` (an index past `N` is ignored).
    #[inline]
    pub fn add(&self, i: usize, v: u64) {
        self.add_each([(i, v)]);
    }

    /// Adds each `(i, v)`: [`Striped::add`] with one lookup of the thread's stripe.
    #[inline]
    pub fn add_each<const K: usize>(&self, adds: [(usize, u64); K]) {
        let id = current();
        let pool = owned_stripes();
        let own = if id < pool {
            self.owned
                .get_or_init(|| (0..pool).map(|_| Stripe::default()).collect())
                .get(id)
        } else {
            None
        };
        for (i, v) in adds {
            match own {
                Some(stripe) => {
                    if let Some(c) = stripe.0.get(i) {
                        // This thread is the stripe's only writer: no addition can be lost.
                        c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Release);
                    }
                }
                None => {
                    if let Some(c) = self.shared.0.get(i) {
                        c.fetch_add(v, Ordering::AcqRel);
                    }
                }
            }
        }
    }

    /// Counter `i`: the sum over the stripes (0 past `N`).
    pub fn get(&self, i: usize) -> u64 {
        self.stripes()
            .filter_map(|s| s.0.get(i))
            .fold(0u64, |sum, c| sum.wrapping_add(c.load(Ordering::Acquire)))
    }

    /// Every counter, each summed over the stripes.
    pub fn read(&self) -> [u64; N] {
        let mut out = [0u64; N];
        for s in self.stripes() {
            for (o, c) in out.iter_mut().zip(&s.0) {
                *o = o.wrapping_add(c.load(Ordering::Acquire));
            }
        }
        out
    }

    fn stripes(&self) -> impl Iterator<Item = &Stripe<N>> {
        self.owned
            .get()
            .into_iter()
            .flat_map(|o| o.iter())
            .chain(std::iter::once(&self.shared))
    }
}

/// One counter striped per thread.
#[derive(Debug, Default)]
pub struct StripedCounter(Striped<1>);

impl StripedCounter {
    /// Adds `v`.
    #[inline]
    pub fn add(&self, v: u64) {
        self.0.add(0, v);
    }

    /// The total.
    pub fn get(&self) -> u64 {
        self.0.get(0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn counts_exactly_across_more_threads_than_stripes() {
        let c = Arc::new(Striped::<2>::default());
        let threads = owned_stripes() * 2 + 3;
        std::thread::scope(|s| {
            for t in 0..threads {
                let c = c.clone();
                s.spawn(move || {
                    for _ in 0..10_000 {
                        c.add(0, 1);
                        c.add_each([(1, t as u64)]);
                    }
                });
            }
        });
        assert_eq!(c.get(0), threads as u64 * 10_000);
        let want: u64 = (0..threads as u64).map(|t| t * 10_000).sum();
        assert_eq!(c.read(), [threads as u64 * 10_000, want]);
        assert_eq!(c.get(2), 0, "past N");
        c.add(5, 1); // ignored, no panic
    }

    #[test]
    fn stripes_are_allocated_at_the_first_addition() {
        let c = Striped::<4>::default();
        assert!(c.owned.get().is_none());
        assert_eq!(c.read(), [0; 4]);
        std::thread::spawn(move || {
            c.add(3, 5);
            // A thread with a stripe of its own allocated them; one on the shared stripe not.
            assert_eq!(c.owned.get().is_some(), current() != SHARED);
            assert_eq!(c.read(), [0, 0, 0, 5]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn stripes_of_exited_threads_are_reused_and_keep_their_counts() {
        let c = Arc::new(StripedCounter::default());
        for _ in 0..3 * MAX_STRIPES {
            let c = c.clone();
            std::thread::spawn(move || c.add(2)).join().unwrap();
        }
        assert_eq!(c.get(), 6 * MAX_STRIPES as u64);
    }
}
