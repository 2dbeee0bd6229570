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

use crate::algorithm::{units_to_check, Algorithm, Outcome, Quota};
use crate::cell::AtomicCell;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::divide::Divisor;
use crate::error::ConfigError;

/// Largest limit a fixed window accepts (the count shares a word with the window index).
pub const MAX_FIXED_WINDOW_LIMIT: u64 = (1 << 32) - 1;

/// Fixed-window counter parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    quota: Quota,
    window_div: Divisor,
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
            window_div: Divisor::new(quota.window_nanos()),
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

    /// The units counted in the window containing `now` (or a later stored window).
    #[inline]
    fn count_at(&self, state: u64, now: Nanos) -> u64 {
        let (index, count) = self.unpack(state);
        let current = self.window_div.div(now) & self.index_mask();
        let behind = index.wrapping_sub(current) & self.index_mask();
        if behind <= 1 {
            count
        } else {
            0
        }
    }
}

/// What the fixed window's CAS step found.
#[derive(Debug, Clone, Copy)]
pub struct FixedWindowVerdict {
    outcome: Outcome,
    count: u64,
    until_end: Nanos,
}

impl Algorithm for FixedWindow {
    type Verdict = FixedWindowVerdict;
    type State = u64;
    type Cell = AtomicCell;

    fn initial_state(&self, now: Nanos) -> u64 {
        self.pack(self.window_div.div(now) & self.index_mask(), 0)
    }

    #[inline]
    fn step(&self, state: &mut u64, n: u64, now: Nanos) -> FixedWindowVerdict {
        let (index, offset) = self.window_div.div_rem(now);
        let index = index & self.index_mask();
        let (stored_index, stored_count) = self.unpack(*state);
        let w = self.quota.window_nanos();
        // A `now` from a thread whose clock reads slightly behind may fall in the window just
        // before the stored one: count it in the stored window (never reset a newer window).
        let (index, count, until_end) = if stored_index == index {
            (index, stored_count, w - offset)
        } else if stored_index.wrapping_sub(index) & self.index_mask() == 1 {
            (stored_index, stored_count, (w - offset).saturating_add(w))
        } else {
            (index, 0, w - offset)
        };
        let mut v = FixedWindowVerdict {
            outcome: Outcome::Never,
            count,
            until_end,
        };
        let need = units_to_check(n);
        if need > self.quota.limit() {
            return v;
        }
        if count > self.quota.limit() - need {
            v.outcome = Outcome::Denied;
            return v;
        }
        v.outcome = Outcome::Allowed;
        if n > 0 {
            v.count = count + n;
            *state = self.pack(index, v.count);
        }
        v
    }

    #[inline]
    fn finish(&self, v: FixedWindowVerdict, _n: u64, _now: Nanos) -> Decision {
        let limit = self.quota.limit();
        let remaining = limit.saturating_sub(v.count);
        let reset = if v.count > 0 { v.until_end } else { 0 };
        match v.outcome {
            Outcome::Never => Decision::never(limit, remaining, reset),
            Outcome::Denied => Decision::deny(limit, remaining, v.until_end, v.until_end),
            Outcome::Allowed => Decision::allow(limit, remaining, reset, 0),
        }
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
