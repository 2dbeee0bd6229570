//! The one duration grammar of Weir, for files and flags alike: `<number><unit>`, the number
//! with an optional decimal fraction (`1.5s`, `.25s`), the unit one of `ns`, `us` (or `µs`),
//! `ms`, `s`, `m`, `h`, `d`; exact to the nanosecond (a fraction below one nanosecond is
//! dropped). Configuration files also refuse zero where a duration must be positive.

use std::time::Duration;

/// Why a text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// A number without a unit.
    #[error("duration '{0}' needs a unit (ns, us, ms, s, m, h, d)")]
    NoUnit(String),
    /// A unit not in the grammar.
    #[error("duration '{0}' has unknown unit '{1}' (use ns, us, ms, s, m, h, d)")]
    UnknownUnit(String, String),
    /// Not a number before the unit.
    #[error("duration '{0}' is not a number followed by a unit")]
    NotANumber(String),
    /// Longer than `u64::MAX` nanoseconds (584 years).
    #[error("duration '{0}' is too long")]
    TooLong(String),
}

/// Parses a duration (see the module documentation).
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| DurationError::NoUnit(text.to_string()))?;
    let (number, unit) = t.split_at(split);
    let unit_ns: u128 = match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => {
            return Err(DurationError::UnknownUnit(
                text.to_string(),
                unit.to_string(),
            ))
        }
    };
    let ns = scaled_decimal(number, unit_ns)
        .ok_or_else(|| DurationError::NotANumber(text.to_string()))?;
    let ns = u64::try_from(ns).map_err(|_| DurationError::TooLong(text.to_string()))?;
    Ok(Duration::from_nanos(ns))
}

/// `number × scale` for a non-negative decimal `number` ("12", "0.25"), exactly, rounding
/// fractions below one unit of `scale` down. `None` if malformed or out of range.
pub fn scaled_decimal(number: &str, scale: u128) -> Option<u128> {
    let (int, frac) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if int.len() > 30 || frac.len() > 30 {
        return None;
    }
    let int_value: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut total = int_value.checked_mul(scale)?;
    let mut place = scale;
    for digit in frac.bytes() {
        place /= 10;
        if place == 0 {
            break;
        }
        total = total.checked_add(u128::from(digit - b'0') * place)?;
    }
    Some(total)
}

/// A duration for humans, in the grammar: `30s`, `5m`, `1h`, `1d` when whole, else
/// milliseconds, else microseconds.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, len) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= len && ms % len == 0 {
            return format!("{}{unit}", ms / len);
        }
    }
    if ms > 0 && d.subsec_nanos() % 1_000_000 == 0 {
        format!("{ms}ms")
    } else {
        format!("{}us", d.as_micros())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar() {
        for (text, d) in [
            ("250ms", Duration::from_millis(250)),
            ("1s", Duration::from_secs(1)),
            (" 1m ", Duration::from_secs(60)),
            ("1.5s", Duration::from_millis(1500)),
            (".25s", Duration::from_millis(250)),
            ("2d", Duration::from_secs(172_800)),
            ("250us", Duration::from_micros(250)),
            ("7ns", Duration::from_nanos(7)),
        ] {
            assert_eq!(parse(text), Ok(d), "{text}");
            assert_eq!(parse(&format(d)).map(|x| x.as_millis()), Ok(d.as_millis()));
        }
        assert_eq!(parse("10"), Err(DurationError::NoUnit("10".into())));
        assert_eq!(
            parse("10x"),
            Err(DurationError::UnknownUnit("10x".into(), "x".into()))
        );
        for bad in ["", "s", "-1s", "1..2s", "1e3ms", "99999999999999999999d"] {
            assert!(parse(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(format(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format(Duration::from_micros(1500)), "1500us");
        assert_eq!(scaled_decimal(".5", 1_000_000), Some(500_000));
        assert_eq!(scaled_decimal("", 1_000_000), None);
    }
}
