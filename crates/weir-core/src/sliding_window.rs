//! Bucketed sliding window (Sentinel's LeapArray done with a configurable bucket count): the
//! window is a ring of B sub-windows ("buckets") of `window / B`; a request is counted against
//! the current bucket plus the B − 1 before it, and buckets are reset lazily when reused.
//!
//! Overshoot bounds (checked by the property tests):
//! - any span of `(B − 1) / B` of the window admits at most `limit` (exact);
//! - traffic that was smooth before a burst at a bucket boundary can overshoot by at most
//!   `limit / B` in a window-length span, i.e. **10 % at the default B = 10** (Sentinel's default
//!   of 2 buckets gives 50 % here and ≈ 2× in half a window, Sentinel#2859);
//! - adversarial traffic (the whole quota at the very end of one bucket, again B − 1 buckets
//!   later) reaches 2 × limit in a window-length span, as any bucketed counter does.
//!
//! Use the sliding log when the limit must hold exactly in every span.

use std::time::Duration;

use crate::algorithm::{units_to_check, Algorithm, Quota};
use crate::cell::MutexCell;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::divide::Divisor;
use crate::error::ConfigError;

/// Default number of buckets: keeps the smooth-traffic boundary overshoot ≤ 10 %.
pub const DEFAULT_BUCKETS: u32 = 10;
/// Largest bucket count accepted (the state holds two words per bucket).
pub const MAX_BUCKETS: u32 = 4096;

/// Bucketed sliding window parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    quota: Quota,
    buckets: u32,
    bucket_ns: Nanos,
    bucket_div: Divisor,
}

/// One bucket: which bucket index it holds and its count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    index: u64,
    count: u64,
}

/// The ring of buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindowState {
    ring: Box<[Bucket]>,
}

impl SlidingWindow {
    /// `quota` counted over `buckets` sub-windows.
    pub fn new(quota: Quota, buckets: u32) -> Result<Self, ConfigError> {
        if buckets == 0 {
            return Err(ConfigError::ZeroBuckets);
        }
        if buckets > MAX_BUCKETS {
            return Err(ConfigError::TooLarge {
                what: "buckets",
                value: u64::from(buckets),
                max: u64::from(MAX_BUCKETS),
            });
        }
        let bucket_ns = quota.window_nanos() / u64::from(buckets);
        if bucket_ns == 0 {
            return Err(ConfigError::WindowTooShortForBuckets {
                window_ns: quota.window_nanos(),
                buckets,
            });
        }
        Ok(Self {
            quota,
            buckets,
            bucket_ns,
            bucket_div: Divisor::new(bucket_ns),
        })
    }

    /// The bucket count.
    pub fn buckets(&self) -> u32 {
        self.buckets
    }

    /// Live buckets from oldest to newest at bucket index `cur`: (bucket index, count).
    #[inline]
    fn live<'a>(
        &'a self,
        state: &'a SlidingWindowState,
        cur: u64,
    ) -> impl Iterator<Item = (u64, u64)> + 'a {
        let b = u64::from(self.buckets);
        // The oldest bucket of the window sits in the slot after the current one.
        let mut slot = ((cur % b) + 1) % b;
        (1..=b).filter_map(move |j| {
            let here = slot as usize;
            slot = if slot + 1 == b { 0 } else { slot + 1 };
            let index = (cur + j).checked_sub(b)?;
            let bucket = state.ring[here];
            (bucket.index == index && bucket.count > 0).then_some((index, bucket.count))
        })
    }
}

impl Algorithm for SlidingWindow {
    type State = SlidingWindowState;
    type Verdict = Decision;
    type Cell = MutexCell<SlidingWindowState>;

    fn initial_state(&self, _now: Nanos) -> SlidingWindowState {
        SlidingWindowState {
            ring: vec![Bucket::default(); self.buckets as usize].into_boxed_slice(),
        }
    }

    fn step(&self, state: &mut SlidingWindowState, n: u64, now: Nanos) -> Decision {
        let limit = self.quota.limit();
        let b = u64::from(self.buckets);
        // A `now` slightly behind the newest bucket (another thread's clock read) counts as
        // the newest bucket's time: never drop buckets that are newer than `now`.
        let newest_stored = state.ring.iter().map(|b| b.index).max().unwrap_or(0);
        let cur = self.bucket_div.div(now).max(newest_stored);
        let (mut sum, mut newest) = (0u64, None);
        for (index, count) in self.live(state, cur) {
            sum = sum.saturating_add(count);
            newest = Some(index);
        }
        let reset_at = |newest: Option<u64>| {
            newest.map_or(0, |i| {
                (i + b).saturating_mul(self.bucket_ns).saturating_sub(now)
            })
        };
        let need = units_to_check(n);
        let remaining = limit.saturating_sub(sum);
        if need > limit {
            return Decision::never(limit, remaining, reset_at(newest));
        }
        // need ≤ limit here: `limit − need` cannot overflow where `sum + need` could.
        if sum > limit - need {
            // Walk buckets oldest first until enough units have expired.
            let mut freed = 0;
            let mut retry = 0;
            for (index, count) in self.live(state, cur) {
                freed += count;
                if sum - freed <= limit - need {
                    retry = (index + b)
                        .saturating_mul(self.bucket_ns)
                        .saturating_sub(now);
                    break;
                }
            }
            return Decision::deny(limit, remaining, retry, reset_at(newest));
        }
        if n > 0 {
            let slot = &mut state.ring[(cur % b) as usize];
            if slot.index != cur {
                *slot = Bucket {
                    index: cur,
                    count: 0,
                };
            }
            slot.count += n;
            sum += n;
            newest = Some(cur);
        }
        Decision::allow(limit, limit.saturating_sub(sum), reset_at(newest), 0)
    }

    #[inline]
    fn finish(&self, decision: Decision, _n: u64, _now: Nanos) -> Decision {
        decision
    }

    fn is_idle(&self, state: &SlidingWindowState, now: Nanos) -> bool {
        let newest_stored = state.ring.iter().map(|b| b.index).max().unwrap_or(0);
        let cur = self.bucket_div.div(now).max(newest_stored);
        self.live(state, cur).next().is_none()
    }

    fn limit(&self) -> u64 {
        self.quota.limit()
    }

    fn window(&self) -> Duration {
        self.quota.window()
    }
}
