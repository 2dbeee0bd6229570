//! Parsing of human durations (`250ms`, `1s`, `1.5m`, `inf`) and millisecond times.

use std::time::Duration;

/// Parses `<number><unit>` with unit `ns`, `us`, `ms`, `s`, `m`, `h` or `d`; the number may have
/// a decimal fraction (`1.5s`). Returns a message naming the problem on error.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("duration '{text}' needs a unit (ns, us, ms, s, m, h, d)"))?;
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
            return Err(format!(
                "duration '{text}' has unknown unit '{unit}' (use ns, us, ms, s, m, h, d)"
            ))
        }
    };
    let ns = scaled_decimal(number, unit_ns)
        .ok_or_else(|| format!("duration '{text}' is not a number followed by a unit"))?;
    let ns = u64::try_from(ns).map_err(|_| format!("duration '{text}' is too long"))?;
    Ok(Duration::from_nanos(ns))
}

/// Like [`parse_duration`] but also accepts `inf` (= `Duration::MAX`).
pub fn parse_max_wait(text: &str) -> Result<Duration, String> {
    if text.trim().eq_ignore_ascii_case("inf") {
        Ok(Duration::MAX)
    } else {
        parse_duration(text)
    }
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

/// Formats nanoseconds as milliseconds with up to six decimals, trailing zeros trimmed.
pub fn format_ms(ns: u128) -> String {
    let whole = ns / 1_000_000;
    let frac = ns % 1_000_000;
    if frac == 0 {
        whole.to_string()
    } else {
        let f = format!("{frac:06}");
        format!("{whole}.{}", f.trim_end_matches('0'))
    }
}

/// A window for humans: `30s`, `5m`, `1h`, `1d`, else milliseconds.
pub fn format_duration(d: Duration) -> String {
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
    format!("{ms}ms")
}

/// Parses `--clock`: `exact` (the default), `coarse` (updated every millisecond) or
/// `coarse:DUR` (100us to 1s).
pub fn parse_clock(text: &str) -> Result<weir_core::ClockKind, String> {
    let t = text.trim();
    let resolution = match t.split_once(':') {
        None if t == "exact" => return Ok(weir_core::ClockKind::Exact),
        None if t == "coarse" => Duration::from_millis(1),
        Some(("coarse", d)) => parse_duration(d)?,
        _ => {
            return Err(format!(
                "clock '{text}': expected exact, coarse or coarse:DUR (e.g. coarse:1ms)"
            ))
        }
    };
    let (min, max) = (
        weir_core::coarse_clock::MIN_RESOLUTION,
        weir_core::coarse_clock::MAX_RESOLUTION,
    );
    if !(min..=max).contains(&resolution) {
        return Err(format!(
            "clock '{text}': the resolution must be from {min:?} to {max:?}"
        ));
    }
    Ok(weir_core::ClockKind::Coarse(resolution))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks() {
        use weir_core::ClockKind;
        assert_eq!(parse_clock("exact"), Ok(ClockKind::Exact));
        assert_eq!(
            parse_clock("coarse"),
            Ok(ClockKind::Coarse(Duration::from_millis(1)))
        );
        assert_eq!(
            parse_clock("coarse:250us"),
            Ok(ClockKind::Coarse(Duration::from_micros(250)))
        );
        for bad in [
            "",
            "fast",
            "coarse:",
            "coarse:10us",
            "coarse:2s",
            "exact:1ms",
        ] {
            assert!(parse_clock(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_max_wait("inf").unwrap(), Duration::MAX);
        for bad in [
            "",
            "s",
            "10",
            "10x",
            "-1s",
            "1..2s",
            "1e3ms",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn milliseconds() {
        assert_eq!(format_ms(0), "0");
        assert_eq!(format_ms(1_500_000), "1.5");
        assert_eq!(format_ms(200_000_000), "200");
        assert_eq!(format_ms(1), "0.000001");
        assert_eq!(scaled_decimal("1.25", 1_000_000), Some(1_250_000));
        assert_eq!(scaled_decimal(".5", 1_000_000), Some(500_000));
        assert_eq!(scaled_decimal("", 1_000_000), None);
    }
}
