//! Sliding window counter: the previous window's count weighted by how much of it still overlaps
//! the sliding window, plus the current window's count (Cloudflare's approximation).
//!
//! A request of n units at offset `e` into the current window passes iff
//! `prev · (w − e) / w + cur + n ≤ limit`, computed exactly in integers
//! (`prev · (w − e) + (cur + n) · w ≤ limit · w`). It assumes the previous window's traffic was
//! spread evenly: for such traffic the error is small, but if the previous window's units all
//! came at its very end, a window-length span can see up to 2 × limit (the property tests check
//! this bound). `retry_after` is exact for this estimate.

use std::time::Duration;

use crate::algorithm::{units_to_check, Algorithm, Quota};
use crate::cell::MutexCell;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::divide::Divisor;
use crate::error::ConfigError;

/// Sliding window counter parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingCounter {
    quota: Quota,
    window_div: Divisor,
}

/// Window index with the previous and current window's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlidingCounterState {
    index: u64,
    prev: u64,
    cur: u64,
}

impl SlidingCounter {
    /// A sliding window counter for `quota`.
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        Ok(Self {
            quota,
            window_div: Divisor::new(quota.window_nanos()),
        })
    }

    /// The state rolled forward to the window of `now`.
    #[inline]
    fn rolled(&self, s: SlidingCounterState, now: Nanos) -> SlidingCounterState {
        let index = self.window_div.div(now);
        if index <= s.index {
            // Same window (or a clock that read earlier: treat as no time passed).
            s
        } else if index == s.index + 1 {
            SlidingCounterState {
                index,
                prev: s.cur,
                cur: 0,
            }
        } else {
            SlidingCounterState {
                index,
                prev: 0,
                cur: 0,
            }
        }
    }

    /// Whether `prev · (w − e) + (cur + need) · w ≤ limit · w`.
    #[inline]
    fn fits(&self, prev: u64, cur: u64, need: u64, e: u64) -> bool {
        let w = u128::from(self.quota.window_nanos());
        u128::from(prev) * (w - u128::from(e)) + (u128::from(cur) + u128::from(need)) * w
            <= u128::from(self.quota.limit()) * w
    }

    /// Units that fit now: `limit − cur − ceil(prev · (w − e) / w)`.
    #[inline]
    fn remaining(&self, prev: u64, cur: u64, e: u64) -> u64 {
        let w = self.quota.window_nanos();
        let weighted = u128::from(prev) * u128::from(w - e);
        let carried = match u64::try_from(weighted) {
            Ok(x) => {
                let (q, r) = self.window_div.div_rem(x);
                q + u64::from(r > 0)
            }
            Err(_) => u64::try_from(weighted.div_ceil(u128::from(w))).unwrap_or(u64::MAX),
        };
        self.quota
            .limit()
            .saturating_sub(cur)
            .saturating_sub(carried)
    }

    /// The smallest offset e' in a window with counts (prev, cur) at which `need` fits, if any
    /// within the window.
    fn earliest_offset(&self, prev: u64, cur: u64, need: u64) -> Option<u64> {
        let limit = self.quota.limit();
        let w = self.quota.window_nanos();
        let room = limit.checked_sub(cur)?.checked_sub(need)?;
        if prev == 0 {
            return Some(0);
        }
        // prev · (w − e) ≤ room · w  ⇔  e ≥ w − floor(room · w / prev)
        let slack = u128::from(room) * u128::from(w) / u128::from(prev);
        let e = u128::from(w).saturating_sub(slack);
        (e < u128::from(w)).then_some(e as u64)
    }
}

impl Algorithm for SlidingCounter {
    type State = SlidingCounterState;
    type Verdict = Decision;
    type Cell = MutexCell<SlidingCounterState>;

    fn initial_state(&self, now: Nanos) -> SlidingCounterState {
        SlidingCounterState {
            index: self.window_div.div(now),
            prev: 0,
            cur: 0,
        }
    }

    fn step(&self, state: &mut SlidingCounterState, n: u64, now: Nanos) -> Decision {
        let limit = self.quota.limit();
        let w = self.quota.window_nanos();
        let s = self.rolled(*state, now);
        let window_start = s.index.saturating_mul(w);
        let e = now.saturating_sub(window_start).min(w - 1);
        let reset = |s: &SlidingCounterState| {
            let windows_left = if s.cur > 0 {
                2
            } else if s.prev > 0 {
                1
            } else {
                return 0;
            };
            (s.index + windows_left)
                .saturating_mul(w)
                .saturating_sub(now)
        };
        let need = units_to_check(n);
        if need > limit {
            return Decision::never(limit, self.remaining(s.prev, s.cur, e), reset(&s));
        }
        if !self.fits(s.prev, s.cur, need, e) {
            let retry_at = match self.earliest_offset(s.prev, s.cur, need) {
                Some(e2) if e2 > e => window_start + e2,
                _ => {
                    let next = window_start.saturating_add(w);
                    match self.earliest_offset(s.cur, 0, need) {
                        Some(e2) => next.saturating_add(e2),
                        None => next.saturating_add(w),
                    }
                }
            };
            return Decision::deny(
                limit,
                self.remaining(s.prev, s.cur, e),
                retry_at.saturating_sub(now),
                reset(&s),
            );
        }
        let mut s = s;
        if n > 0 {
            s.cur += n;
            *state = s;
        }
        Decision::allow(limit, self.remaining(s.prev, s.cur, e), reset(&s), 0)
    }

    #[inline]
    fn finish(&self, decision: Decision, _n: u64, _now: Nanos) -> Decision {
        decision
    }

    fn is_idle(&self, state: &SlidingCounterState, now: Nanos) -> bool {
        let s = self.rolled(*state, now);
        s.prev == 0 && s.cur == 0
    }

    fn limit(&self) -> u64 {
        self.quota.limit()
    }

    fn window(&self) -> Duration {
        self.quota.window()
    }
}
