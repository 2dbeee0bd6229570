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
    count_denied: bool,
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
            count_denied: false,
        })
    }

    /// The same window counting denied units too (envoyproxy/ratelimit's semantics: every hit
    /// is added to the window's count, so a client that keeps sending over the limit stays
    /// over it, and a request larger than the limit is still counted). The count saturates at
    /// [`MAX_FIXED_WINDOW_LIMIT`]. Off by default: denied units consume nothing.
    pub fn counting_denied(self, yes: bool) -> Self {
        Self {
            count_denied: yes,
            ..self
        }
    }

    /// Whether denied units are counted ([`FixedWindow::counting_denied`]).
    pub fn counts_denied(&self) -> bool {
        self.count_denied
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
        let denied = if need > self.quota.limit() {
            Some(Outcome::Never)
        } else if count > self.quota.limit() - need {
            Some(Outcome::Denied)
        } else {
            None
        };
        if let Some(outcome) = denied {
            v.outcome = outcome;
            if self.count_denied && n > 0 {
                v.count = count.saturating_add(n).min(MAX_FIXED_WINDOW_LIMIT);
                *state = self.pack(index, v.count);
            }
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

impl crate::cost::Settle for FixedWindow {
    /// Counts `units` in the window of `now`, past the limit if need be: nothing more passes
    /// in that window. The debt ends with the window.
    fn charge(&self, state: &mut u64, units: u64, now: Nanos) {
        let index = self.window_div.div(now) & self.index_mask();
        let (stored_index, count) = self.unpack(*state);
        let count = if stored_index == index { count } else { 0 };
        let count = count.saturating_add(units).min(MAX_FIXED_WINDOW_LIMIT);
        *state = self.pack(index, count);
    }

    /// Takes `units` off the count when the charge was made in the window still counted.
    fn refund(&self, state: &mut u64, units: u64, held: crate::cost::Held, now: Nanos) {
        let taken = self.window_div.div(held.taken) & self.index_mask();
        let index = self.window_div.div(now) & self.index_mask();
        let (stored_index, count) = self.unpack(*state);
        if taken == index && stored_index == index {
            *state = self.pack(index, count.saturating_sub(units.min(held.estimate)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(limit: u64) -> FixedWindow {
        FixedWindow::new(Quota::new(limit, Duration::from_secs(60)).unwrap()).unwrap()
    }

    #[test]
    fn denied_units_cost_nothing_by_default() {
        let w = window(20);
        let mut s = w.initial_state(0);
        assert!(w.decide(&mut s, 15, 0).allowed());
        assert!(!w.decide(&mut s, 10, 1).allowed());
        assert!(
            w.decide(&mut s, 1, 2).allowed(),
            "the refused 10 took nothing"
        );
        assert!(w.decide(&mut s, 21, 3).is_never());
        assert_eq!(w.decide(&mut s, 0, 4).remaining(), 4);
    }

    #[test]
    fn counting_denied_adds_every_hit_as_envoy_ratelimit_does() {
        let w = window(20).counting_denied(true);
        assert!(w.counts_denied());
        let mut s = w.initial_state(0);
        assert!(w.decide(&mut s, 15, 0).allowed());
        let d = w.decide(&mut s, 10, 1);
        assert!(!d.allowed());
        assert!(!w.decide(&mut s, 1, 2).allowed(), "25 counted: over");
        // A request larger than the limit is counted too, and the window still ends.
        let mut s = w.initial_state(0);
        let d = w.decide(&mut s, 21, 0);
        assert!(d.is_never());
        assert_eq!(d.reset_after(), Duration::from_secs(60));
        assert!(!w.decide(&mut s, 1, 1).allowed());
        // A new window starts from zero; a check (n = 0) counts nothing.
        let minute = 60_000_000_000;
        assert!(w.decide(&mut s, 0, minute).allowed());
        assert_eq!(w.decide(&mut s, 20, minute).remaining(), 0);
        // The count saturates instead of wrapping into the window index.
        let big = window(MAX_FIXED_WINDOW_LIMIT).counting_denied(true);
        let mut s = big.initial_state(0);
        for _ in 0..3 {
            big.decide(&mut s, MAX_FIXED_WINDOW_LIMIT, 0);
        }
        assert_eq!(big.decide(&mut s, 0, 0).remaining(), 0);
        assert!(big.decide(&mut s, 1, minute).allowed());
    }
}
