//! Helpers shared by the benches.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Runs `f` on two threads, `iters` calls in all, on shared state; returns the wall time from
/// the moment both threads are released until both are done.
pub fn two_threads<F: Fn() + Send + Sync + 'static>(iters: u64, f: Arc<F>) -> Duration {
    let barrier = Arc::new(Barrier::new(3));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (f, barrier) = (f.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..iters / 2 {
                    f();
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    start.elapsed()
}
