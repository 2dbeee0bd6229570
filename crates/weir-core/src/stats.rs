//! [`StatsWindow`]: the one sliding-window metrics ring every overload component uses.
//!
//! A ring of B buckets of `window / B`, each holding lock-free counters: pass, block, success,
//! error, slow, completed, RT sum and minimum RT. A bucket is reset lazily by the first caller
//! that finds it holding an old bucket index (a CAS on the index decides who resets; a count
//! added concurrently with the reset may be lost, which statistics tolerate). In-flight is a
//! gauge kept beside the ring. Reads sum the buckets that are still inside the window.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::{duration_to_nanos, Nanos};
use crate::divide::Divisor;
use crate::error::ConfigError;

const EMPTY: u64 = u64::MAX;
/// A bucket being cleared by one thread (never a real index: time would have to reach 2^64 − 2).
const RESETTING: u64 = u64::MAX - 1;

#[derive(Debug)]
struct Bucket {
    index: AtomicU64,
    pass: AtomicU64,
    block: AtomicU64,
    success: AtomicU64,
    error: AtomicU64,
    slow: AtomicU64,
    completed: AtomicU64,
    rt_sum: AtomicU64,
    min_rt: AtomicU64,
}

impl Bucket {
    fn new() -> Self {
        Self {
            index: AtomicU64::new(EMPTY),
            pass: AtomicU64::new(0),
            block: AtomicU64::new(0),
            success: AtomicU64::new(0),
            error: AtomicU64::new(0),
            slow: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            rt_sum: AtomicU64::new(0),
            min_rt: AtomicU64::new(u64::MAX),
        }
    }

    fn clear(&self) {
        for c in [
            &self.pass,
            &self.block,
            &self.success,
            &self.error,
            &self.slow,
            &self.completed,
            &self.rt_sum,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        self.min_rt.store(u64::MAX, Ordering::Relaxed);
    }
}

/// How a completed call ended, as the caller classifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Succeeded.
    Success,
    /// Failed (counts towards error ratios).
    Error,
}

/// Sums over the buckets inside the window at one time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Requests admitted.
    pub pass: u64,
    /// Requests rejected.
    pub block: u64,
    /// Calls that completed successfully.
    pub success: u64,
    /// Calls that completed with an error.
    pub error: u64,
    /// Completed calls slower than the slow threshold.
    pub slow: u64,
    /// Completed calls (success + error).
    pub completed: u64,
    /// Sum of response times of completed calls, in ns.
    pub rt_sum: u64,
    /// Smallest response time among live buckets, in ns (`u64::MAX` when none).
    pub min_rt: u64,
    /// Largest `pass` of a single complete bucket (BBR's max pass).
    pub max_pass_per_bucket: u64,
    /// Smallest per-bucket average RT in ns among complete buckets with completions
    /// (`u64::MAX` when none): BBR's min RT.
    pub min_bucket_avg_rt: u64,
}

impl Snapshot {
    /// Average response time of completed calls in ns (0 when none).
    pub fn avg_rt(&self) -> u64 {
        self.rt_sum.checked_div(self.completed).unwrap_or(0)
    }

    /// Errors / completed (0 when none).
    pub fn error_ratio(&self) -> f64 {
        if self.completed == 0 {
            0.0
        } else {
            self.error as f64 / self.completed as f64
        }
    }

    /// Slow / completed (0 when none).
    pub fn slow_ratio(&self) -> f64 {
        if self.completed == 0 {
            0.0
        } else {
            self.slow as f64 / self.completed as f64
        }
    }
}

/// Sliding-window metrics with lazily reset buckets and lock-free counters.
#[derive(Debug)]
pub struct StatsWindow {
    buckets: Box<[Bucket]>,
    bucket_ns: Nanos,
    bucket_div: Divisor,
    slow_ns: Nanos,
    in_flight: AtomicI64,
}

impl StatsWindow {
    /// A window of `window` split into `buckets`; completions slower than `slow` count as slow
    /// (`Duration::MAX` = never).
    pub fn new(window: Duration, buckets: u32, slow: Duration) -> Result<Self, ConfigError> {
        if window.is_zero() {
            return Err(ConfigError::ZeroWindow);
        }
        if buckets == 0 {
            return Err(ConfigError::ZeroBuckets);
        }
        let window_ns = duration_to_nanos(window);
        let bucket_ns = window_ns / u64::from(buckets);
        if bucket_ns == 0 {
            return Err(ConfigError::WindowTooShortForBuckets { window_ns, buckets });
        }
        Ok(Self {
            buckets: (0..buckets).map(|_| Bucket::new()).collect(),
            bucket_ns,
            bucket_div: Divisor::new(bucket_ns),
            slow_ns: duration_to_nanos(slow),
            in_flight: AtomicI64::new(0),
        })
    }

    /// Length of one bucket.
    pub fn bucket_duration(&self) -> Duration {
        Duration::from_nanos(self.bucket_ns)
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// The bucket for `now`, reset if it held an older index.
    ///
    /// The thread that resets a bucket first marks it `RESETTING`, clears it, then publishes
    /// the new index; others wait the few stores that takes. Publishing the index before
    /// clearing would let another thread count into the bucket and then lose that count to the
    /// clear (a test with 4 threads caught it under load).
    #[inline]
    fn current(&self, now: Nanos) -> &Bucket {
        let index = self.bucket_div.div(now);
        let bucket = &self.buckets[(index % self.buckets.len() as u64) as usize];
        loop {
            let seen = bucket.index.load(Ordering::Acquire);
            if seen == index {
                return bucket;
            }
            if seen == RESETTING {
                std::hint::spin_loop();
                continue;
            }
            if seen != EMPTY && seen > index {
                // A clock that read slightly behind: count in the newer bucket.
                return bucket;
            }
            if bucket
                .index
                .compare_exchange(seen, RESETTING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                bucket.clear();
                bucket.index.store(index, Ordering::Release);
                return bucket;
            }
        }
    }

    /// Records `n` passes (what "pass" means is the user's: admissions, or completions as BBR
    /// counts them).
    #[inline]
    pub fn add_pass(&self, now: Nanos, n: u64) {
        self.current(now).pass.fetch_add(n, Ordering::Relaxed);
    }

    /// One more call in flight.
    #[inline]
    pub fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// One call fewer in flight.
    #[inline]
    pub fn end(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Records `n` rejected requests.
    #[inline]
    pub fn add_block(&self, now: Nanos, n: u64) {
        self.current(now).block.fetch_add(n, Ordering::Relaxed);
    }

    /// Records a completed call with its response time.
    #[inline]
    pub fn add_complete(&self, now: Nanos, rt: Nanos, outcome: Outcome) {
        let b = self.current(now);
        match outcome {
            Outcome::Success => b.success.fetch_add(1, Ordering::Relaxed),
            Outcome::Error => b.error.fetch_add(1, Ordering::Relaxed),
        };
        if rt > self.slow_ns {
            b.slow.fetch_add(1, Ordering::Relaxed);
        }
        b.completed.fetch_add(1, Ordering::Relaxed);
        b.rt_sum.fetch_add(rt, Ordering::Relaxed);
        b.min_rt.fetch_min(rt, Ordering::Relaxed);
    }

    /// Calls admitted and not completed yet.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed).max(0) as u64
    }

    /// Calls `f(bucket index, pass, completed, rt_sum)` for every complete bucket (not the
    /// current one) inside the window ending at `now`.
    pub fn for_each_complete(&self, now: Nanos, mut f: impl FnMut(u64, u64, u64, u64)) {
        let cur = self.bucket_div.div(now);
        let oldest = (cur + 1).saturating_sub(self.buckets.len() as u64);
        for b in self.buckets.iter() {
            let index = b.index.load(Ordering::Acquire);
            if index == EMPTY || index < oldest || index >= cur {
                continue;
            }
            f(
                index,
                b.pass.load(Ordering::Relaxed),
                b.completed.load(Ordering::Relaxed),
                b.rt_sum.load(Ordering::Relaxed),
            );
        }
    }

    /// Sums of the buckets inside the window ending at `now`.
    pub fn snapshot(&self, now: Nanos) -> Snapshot {
        let cur = self.bucket_div.div(now);
        let n = self.buckets.len() as u64;
        let oldest = (cur + 1).saturating_sub(n);
        let mut s = Snapshot {
            min_rt: u64::MAX,
            min_bucket_avg_rt: u64::MAX,
            ..Snapshot::default()
        };
        for b in self.buckets.iter() {
            let index = b.index.load(Ordering::Acquire);
            if index == EMPTY || index < oldest || index > cur {
                continue;
            }
            let pass = b.pass.load(Ordering::Relaxed);
            let completed = b.completed.load(Ordering::Relaxed);
            let rt_sum = b.rt_sum.load(Ordering::Relaxed);
            s.pass += pass;
            s.block += b.block.load(Ordering::Relaxed);
            s.success += b.success.load(Ordering::Relaxed);
            s.error += b.error.load(Ordering::Relaxed);
            s.slow += b.slow.load(Ordering::Relaxed);
            s.completed += completed;
            s.rt_sum += rt_sum;
            s.min_rt = s.min_rt.min(b.min_rt.load(Ordering::Relaxed));
            if index < cur {
                // Complete buckets only: the current one is still filling.
                s.max_pass_per_bucket = s.max_pass_per_bucket.max(pass);
                if let Some(avg) = rt_sum.checked_div(completed) {
                    s.min_bucket_avg_rt = s.min_bucket_avg_rt.min(avg);
                }
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn counts_slide_out_of_the_window() {
        let w = StatsWindow::new(Duration::from_secs(1), 10, Duration::from_millis(50)).unwrap();
        w.add_pass(0, 3);
        for _ in 0..3 {
            w.begin();
        }
        w.end();
        w.end();
        w.add_complete(10 * MS, 20 * MS, Outcome::Success);
        w.add_complete(150 * MS, 80 * MS, Outcome::Error);
        w.add_block(150 * MS, 2);
        let s = w.snapshot(500 * MS);
        assert_eq!(
            (s.pass, s.block, s.success, s.error, s.slow),
            (3, 2, 1, 1, 1)
        );
        assert_eq!((s.completed, s.avg_rt(), s.min_rt), (2, 50 * MS, 20 * MS));
        assert_eq!(s.max_pass_per_bucket, 3);
        assert_eq!(s.min_bucket_avg_rt, 20 * MS);
        assert_eq!(w.in_flight(), 1);
        // The first bucket [0, 100 ms) leaves the window at 1 s.
        let s = w.snapshot(1_000 * MS);
        assert_eq!((s.pass, s.success, s.error), (0, 0, 1));
        // A reused slot is reset lazily.
        w.add_pass(1_005 * MS, 1);
        assert_eq!(w.snapshot(1_010 * MS).pass, 1);
        assert_eq!(
            w.snapshot(5_000 * MS),
            Snapshot {
                min_rt: u64::MAX,
                min_bucket_avg_rt: u64::MAX,
                ..Snapshot::default()
            }
        );
    }

    #[test]
    fn concurrent_adds_are_counted() {
        // Many rounds on fresh windows, threads released together: the first adds race with
        // the lazy reset of bucket 0, where a lost update used to hide.
        for _ in 0..50 {
            let w = std::sync::Arc::new(
                StatsWindow::new(Duration::from_secs(10), 10, Duration::MAX).unwrap(),
            );
            let start = std::sync::Arc::new(std::sync::Barrier::new(4));
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let (w, start) = (w.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        for i in 0..2_000u64 {
                            w.add_pass(i * 1_000, 1);
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(w.snapshot(10_000_000).pass, 8_000);
        }
    }
}
