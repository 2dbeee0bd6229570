//! Sliding log: the exact sliding window. Every admitted request is logged with its time; a
//! request passes iff the units logged in the last window plus its own fit the limit. In every
//! span of one window at most `limit` units pass.
//!
//! Memory is O(limit) and bounded: each entry holds at least one unit, so at most `limit` entries
//! are live; requests at the same nanosecond share an entry. Each entry stores the cumulative
//! count, so the exact `retry_after` is a binary search, not a scan.

use std::collections::VecDeque;
use std::time::Duration;

use crate::algorithm::{units_to_check, Algorithm, Quota};
use crate::cell::MutexCell;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::error::ConfigError;

/// Largest limit a sliding log accepts: its memory is up to 16 bytes per unit of limit.
pub const MAX_SLIDING_LOG_LIMIT: u64 = 1 << 24;

/// Sliding log parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    quota: Quota,
}

/// One logged admission: its time and the running total of units including it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    at: Nanos,
    cumulative: u64,
}

/// The log of admissions within the last window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingLogState {
    entries: VecDeque<Entry>,
    /// Units ever admitted (the cumulative count of the newest entry).
    total: u64,
    /// Units admitted before the oldest live entry.
    expired: u64,
}

impl SlidingLog {
    /// An exact sliding window of `quota`.
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        if quota.limit() > MAX_SLIDING_LOG_LIMIT {
            return Err(ConfigError::TooLarge {
                what: "sliding log limit",
                value: quota.limit(),
                max: MAX_SLIDING_LOG_LIMIT,
            });
        }
        Ok(Self { quota })
    }

    /// Drops entries that have left the window `(now − window, now]`.
    #[inline]
    fn prune(&self, state: &mut SlidingLogState, now: Nanos) {
        let w = self.quota.window_nanos();
        while let Some(front) = state.entries.front() {
            if front.at.saturating_add(w) > now {
                break;
            }
            state.expired = front.cumulative;
            state.entries.pop_front();
        }
    }

    /// Live units, without mutating (for idle checks).
    fn live_at(&self, state: &SlidingLogState, now: Nanos) -> u64 {
        let w = self.quota.window_nanos();
        let first_live = state
            .entries
            .partition_point(|e| e.at.saturating_add(w) <= now);
        let before = match first_live {
            0 => state.expired,
            i => state.entries[i - 1].cumulative,
        };
        state.total - before
    }
}

impl Algorithm for SlidingLog {
    type State = SlidingLogState;
    type Verdict = Decision;
    type Cell = MutexCell<SlidingLogState>;

    fn initial_state(&self, _now: Nanos) -> SlidingLogState {
        SlidingLogState::default()
    }

    fn step(&self, state: &mut SlidingLogState, n: u64, now: Nanos) -> Decision {
        let limit = self.quota.limit();
        let w = self.quota.window_nanos();
        self.prune(state, now);
        let live = state.total - state.expired;
        let reset = |s: &SlidingLogState| {
            s.entries
                .back()
                .map_or(0, |e| e.at.saturating_add(w).saturating_sub(now))
        };
        let need = units_to_check(n);
        if need > limit {
            return Decision::never(limit, limit.saturating_sub(live), reset(state));
        }
        if live > limit - need {
            // The oldest entries must expire until `live + need − limit` units are gone.
            let target = state.expired.saturating_add(live - (limit - need));
            let k = state.entries.partition_point(|e| e.cumulative < target);
            let retry = state
                .entries
                .get(k)
                .map_or(0, |e| e.at.saturating_add(w).saturating_sub(now));
            return Decision::deny(limit, limit.saturating_sub(live), retry, reset(state));
        }
        if n > 0 {
            state.total += n;
            match state.entries.back_mut() {
                Some(last) if last.at >= now => last.cumulative = state.total,
                _ => state.entries.push_back(Entry {
                    at: now,
                    cumulative: state.total,
                }),
            }
        }
        let live = state.total - state.expired;
        Decision::allow(limit, limit.saturating_sub(live), reset(state), 0)
    }

    #[inline]
    fn finish(&self, decision: Decision, _n: u64, _now: Nanos) -> Decision {
        decision
    }

    fn is_idle(&self, state: &SlidingLogState, now: Nanos) -> bool {
        self.live_at(state, now) == 0
    }

    fn limit(&self) -> u64 {
        self.quota.limit()
    }

    fn window(&self) -> Duration {
        self.quota.window()
    }
}
