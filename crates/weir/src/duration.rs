//! The flags' durations (Weir's one grammar, [`weir_core::duration`], plus `inf`), the
//! `--clock` flag and millisecond times.

use std::time::Duration;

/// A flag's duration in Weir's one grammar ([`weir_core::duration`]), the problem named on
/// error.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    weir_core::duration::parse(text).map_err(|e| e.to_string())
}

/// Like [`parse_duration`] but also accepts `inf` (= `Duration::MAX`).
pub fn parse_max_wait(text: &str) -> Result<Duration, String> {
    if text.trim().eq_ignore_ascii_case("inf") {
        Ok(Duration::MAX)
    } else {
        parse_duration(text)
    }
}

pub use weir_core::duration::scaled_decimal;

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

pub use weir_core::duration::format as format_duration;

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
