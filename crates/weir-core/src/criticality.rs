//! Request criticality (Google's four levels): under overload the least critical work is shed
//! first, and the level travels with the request from call to call.

use std::fmt;
use std::str::FromStr;

/// The HTTP header (and gRPC metadata key) carrying a request's criticality.
pub const HEADER: &str = "x-weir-criticality";

/// How important a request is. Ordered: `Sheddable < SheddablePlus < Critical < CriticalPlus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Criticality {
    /// Batch or speculative work: shed first.
    Sheddable,
    /// Work that can be retried later at little cost.
    SheddablePlus,
    /// The default: user-facing work.
    #[default]
    Critical,
    /// The most important work: shed last.
    CriticalPlus,
}

impl Criticality {
    /// All levels, least critical first.
    pub const ALL: [Criticality; 4] = [
        Criticality::Sheddable,
        Criticality::SheddablePlus,
        Criticality::Critical,
        Criticality::CriticalPlus,
    ];

    /// The wire name (`CRITICAL_PLUS`, `CRITICAL`, `SHEDDABLE_PLUS`, `SHEDDABLE`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Criticality::Sheddable => "SHEDDABLE",
            Criticality::SheddablePlus => "SHEDDABLE_PLUS",
            Criticality::Critical => "CRITICAL",
            Criticality::CriticalPlus => "CRITICAL_PLUS",
        }
    }

    /// 0 for the least critical level up to 3.
    pub fn rank(&self) -> usize {
        *self as usize
    }

    /// Reads a header value; a missing or unknown value means the default (`CRITICAL`), so a
    /// caller cannot raise its priority with garbage.
    pub fn from_header(value: Option<&[u8]>) -> Self {
        value
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    }
}

impl fmt::Display for Criticality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown criticality name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown criticality '{0}' (expected CRITICAL_PLUS, CRITICAL, SHEDDABLE_PLUS or SHEDDABLE)"
)]
pub struct UnknownCriticality(pub String);

impl FromStr for Criticality {
    type Err = UnknownCriticality;

    /// Case-insensitive; `-` and `_` are the same.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_uppercase().replace('-', "_");
        match norm.as_str() {
            "CRITICAL_PLUS" => Ok(Criticality::CriticalPlus),
            "CRITICAL" => Ok(Criticality::Critical),
            "SHEDDABLE_PLUS" => Ok(Criticality::SheddablePlus),
            "SHEDDABLE" => Ok(Criticality::Sheddable),
            _ => Err(UnknownCriticality(s.chars().take(64).collect())),
        }
    }
}

/// Shares of a capacity reserved per level: a request of level L may use capacity up to
/// `limit × share(L)`, where shares grow with criticality, so sheddable traffic never takes the
/// capacity held back for critical traffic. Defaults: SHEDDABLE 50 %, SHEDDABLE_PLUS 70 %,
/// CRITICAL 90 %, CRITICAL_PLUS 100 %.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shares([f64; 4]);

impl Default for Shares {
    fn default() -> Self {
        Self([0.5, 0.7, 0.9, 1.0])
    }
}

impl Shares {
    /// Shares per level, least critical first; each in (0, 1], non-decreasing, the last 1.
    pub fn new(shares: [f64; 4]) -> Result<Self, crate::ConfigError> {
        let ok = shares.iter().all(|s| *s > 0.0 && *s <= 1.0)
            && shares.windows(2).all(|w| w[0] <= w[1])
            && shares[3] == 1.0;
        if ok {
            Ok(Self(shares))
        } else {
            Err(crate::ConfigError::Invalid(format!(
                "criticality shares must be in (0, 1], non-decreasing, CRITICAL_PLUS = 1: {shares:?}"
            )))
        }
    }

    /// The part of `limit` that requests of `level` may fill (at least 1 when limit ≥ 1).
    pub fn allowance(&self, limit: u64, level: Criticality) -> u64 {
        let a = (limit as f64 * self.0[level.rank()]).floor() as u64;
        a.clamp(limit.min(1), limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_order_and_headers() {
        assert!(Criticality::CriticalPlus > Criticality::Critical);
        assert!(Criticality::SheddablePlus > Criticality::Sheddable);
        for c in Criticality::ALL {
            assert_eq!(c.as_str().parse::<Criticality>().unwrap(), c);
        }
        assert_eq!("sheddable-plus".parse(), Ok(Criticality::SheddablePlus));
        assert!("urgent".parse::<Criticality>().is_err());
        assert_eq!(Criticality::from_header(None), Criticality::Critical);
        assert_eq!(
            Criticality::from_header(Some(b"\xff")),
            Criticality::Critical
        );
        assert_eq!(
            Criticality::from_header(Some(b"SHEDDABLE")),
            Criticality::Sheddable
        );
    }

    #[test]
    fn shares() {
        let s = Shares::default();
        assert_eq!(s.allowance(100, Criticality::Sheddable), 50);
        assert_eq!(s.allowance(100, Criticality::CriticalPlus), 100);
        assert_eq!(s.allowance(1, Criticality::Sheddable), 1);
        assert!(Shares::new([0.9, 0.5, 1.0, 1.0]).is_err());
        assert!(Shares::new([0.1, 0.2, 0.3, 0.9]).is_err());
    }
}
