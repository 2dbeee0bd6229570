//! Exact division by a divisor fixed at configuration time, by multiplication
//! (`strength_reduce`): a hardware 64-bit division costs tens of cycles on the hot path; this costs
//! a few multiplies.

use strength_reduce::StrengthReducedU64;

use crate::clock::Nanos;

/// A non-zero divisor prepared for fast exact division.
#[derive(Debug, Clone, Copy)]
pub struct Divisor(StrengthReducedU64);

impl Divisor {
    /// Prepares `d`; zero is treated as one (callers validate divisors before).
    pub fn new(d: Nanos) -> Self {
        Self(StrengthReducedU64::new(d.max(1)))
    }

    /// The divisor.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.get()
    }

    /// `x / d`.
    #[inline]
    pub fn div(&self, x: u64) -> u64 {
        x / self.0
    }

    /// `(x / d, x % d)`.
    #[inline]
    pub fn div_rem(&self, x: u64) -> (u64, u64) {
        StrengthReducedU64::div_rem(x, self.0)
    }
}

impl PartialEq for Divisor {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Divisor {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn exact(x in any::<u64>(), d in 1u64..) {
            let div = Divisor::new(d);
            prop_assert_eq!(div.div(x), x / d);
            prop_assert_eq!(div.div_rem(x), (x / d, x % d));
        }
    }

    #[test]
    fn edges() {
        for d in [1, 2, 3, 7, 1_000_000_000, u64::MAX - 1, u64::MAX] {
            let div = Divisor::new(d);
            for x in [0, 1, d - 1, d, d.wrapping_add(1), u64::MAX - 1, u64::MAX] {
                assert_eq!(div.div(x), x / d, "{x}/{d}");
            }
        }
    }
}
