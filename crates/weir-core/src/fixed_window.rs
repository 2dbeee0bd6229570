//! Fixed window: a counter per window, windows aligned to multiples of the window length on the
//! clock.
//!
//! Boundary burst: a client can use the whole quota at the end of one window and again at the
//! start of the next, so a span of one window length can see exactly **2 × limit** (the
//! property tests check that this worst case is reached and never exceeded). Use GCRA or the
//! sliding log when that matters.
//!
//! State: one `u64` = (window index modulo 2^32, count in 32 bits), updated by CAS. The layout
//! does not depend on the limit, so a limit changed at runtime keeps the count. A key idle for
//! exactly a multiple of 2^32 windows (136 years of 1 s windows, 50 days of 1 ms windows) would
//! alias to its old window; the chance is negligible.

use std::time::Duration;

use crate::algorithm::{units_to_check, Algorithm, Quota};
use crate::cell::AtomicCell;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::error::ConfigError;

/// Largest limit a fixed window accepts (the count shares a word with the window index).
pub const MAX_FIXED_WINDOW_LIMIT: u64 = (1 << 32) - 1;

/// Fixed-window counter parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    quota: Quota,
    count_bits: u32,
}

impl FixedWindow {
    /// `quota.limit()` units per aligned window of `quota.window()`.
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        if quota.limit() > MAX_FIXED_WINDOW_LIMIT {
            return Err(ConfigError::TooLarge {
                what: "fixed window limit",
                value: quota.limit(),
                max: MAX_FIXED_WINDOW_LIMIT,
            });
        }
        Ok(Self {
            quota,
            count_bits: 32,
        })
    }

    #[inline]
    fn unpack(&self, state: u64) -> (u64, u64) {
        (
            state >> self.count_bits,
            state & ((1 << self.count_bits) - 1),
        )
    }

    #[inline]
    fn pack(&self, index: u64, count: u64) -> u64 {
        (index << self.count_bits) | count
    }

    #[inline]
    fn index_mask(&self) -> u64 {
        u64::MAX >> self.count_bits
    }

    /// The units counted in the window containing `now`.
    #[inline]
    fn count_at(&self, state: u64, now: Nanos) -> u64 {
        let (index, count) = self.unpack(state);
        if index == (now / self.quota.window_nanos()) & self.index_mask() {
            count
        } else {
            0
        }
    }
}

impl Algorithm for FixedWindow {
    type State = u64;
    type Cell = AtomicCell;

    fn initial_state(&self, now: Nanos) -> u64 {
        self.pack((now / self.quota.window_nanos()) & self.index_mask(), 0)
    }

    #[inline]
    fn decide(&self, state: &mut u64, n: u64, now: Nanos) -> Decision {
        let limit = self.quota.limit();
        let w = self.quota.window_nanos();
        let count = self.count_at(*state, now);
        let until_end = w - now % w;
        let need = units_to_check(n);
        if need > limit {
            let reset = if count > 0 { until_end } else { 0 };
            return Decision::never(limit, limit.saturating_sub(count), reset);
        }
        if count + need > limit {
            return Decision::deny(limit, limit.saturating_sub(count), until_end, until_end);
        }
        let count = count + n;
        if n > 0 {
            *state = self.pack((now / w) & self.index_mask(), count);
        }
        let reset = if count > 0 { until_end } else { 0 };
        Decision::allow(limit, limit.saturating_sub(count), reset, 0)
    }

    fn is_idle(&self, state: &u64, now: Nanos) -> bool {
        self.count_at(*state, now) == 0
    }

    fn limit(&self) -> u64 {
        self.quota.limit()
    }

    fn window(&self) -> Duration {
        self.quota.window()
    }
}
