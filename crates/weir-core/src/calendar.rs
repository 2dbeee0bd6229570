//! Calendar periods: days, weeks and months that begin at a local time of day in a named time
//! zone (a budget "per month, from midnight in Berlin"). A period is not a duration: a month
//! lasts 28 to 31 days, and a day 23 to 25 hours across a daylight-saving change, so the
//! period containing an instant is computed from the civil calendar, never as a multiple of a
//! fixed length (envoyproxy/ratelimit's "month = 30 days" drifts by up to two days a month).
//!
//! Instants are Unix seconds (UTC). A start whose local time does not exist (the hour skipped
//! when clocks go forward) is the first instant after the gap; one that exists twice (the hour
//! repeated when clocks go back) is the first of the two (jiff's `compatible` rule, RFC 5545's).
//! The time zone is a value (`jiff::tz::TimeZone`): looking one up by name reads the system's
//! time-zone database, which is the caller's business (weir-rules), not this crate's.

use jiff::civil::{Date, Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// How long a period is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Every {
    /// A calendar day.
    Day,
    /// A week beginning on this day.
    Week(Weekday),
    /// A calendar month, beginning on its first day.
    Month,
}

/// A period: `[start, end)` in Unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Period {
    /// Its first second.
    pub start: i64,
    /// The first second of the next period.
    pub end: i64,
}

/// An instant or a date outside what the calendar can compute (years beyond ±9999).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("instant {0} (Unix seconds) is outside the calendar's range")]
pub struct OutOfRange(pub i64);

/// Periods of one length, each beginning at a local time of day in a time zone.
#[derive(Debug, Clone, PartialEq)]
pub struct Calendar {
    every: Every,
    at: Time,
    tz: TimeZone,
}

impl Calendar {
    /// Periods of `every`, beginning at `at` local time in `tz`.
    pub fn new(every: Every, at: Time, tz: TimeZone) -> Self {
        Self { every, at, tz }
    }

    /// How long its periods are.
    pub fn every(&self) -> Every {
        self.every
    }

    /// The local time its periods begin at.
    pub fn at(&self) -> Time {
        self.at
    }

    /// Its time zone.
    pub fn time_zone(&self) -> &TimeZone {
        &self.tz
    }

    /// The period containing `unix` (seconds).
    pub fn period(&self, unix: i64) -> Result<Period, OutOfRange> {
        let out = |_| OutOfRange(unix);
        let now = Timestamp::from_second(unix).map_err(out)?;
        let today = now.to_zoned(self.tz.clone()).date();
        let mut first = self.align(today).map_err(out)?;
        if self.start_of(first).map_err(out)? > unix {
            first = self.step(first, -1).map_err(out)?;
        }
        let start = self.start_of(first).map_err(out)?;
        let end = self
            .start_of(self.step(first, 1).map_err(out)?)
            .map_err(out)?;
        Ok(Period { start, end })
    }

    /// The first day of the period `day` falls in (by date alone).
    fn align(&self, day: Date) -> Result<Date, jiff::Error> {
        match self.every {
            Every::Day => Ok(day),
            Every::Week(first) => {
                let back =
                    (day.weekday().to_monday_zero_offset() + 7 - first.to_monday_zero_offset()) % 7;
                day.checked_sub(i64::from(back).days())
            }
            Every::Month => Ok(day.first_of_month()),
        }
    }

    /// The first day of the period `n` periods after the one beginning on `first`.
    fn step(&self, first: Date, n: i64) -> Result<Date, jiff::Error> {
        match self.every {
            Every::Day => first.checked_add(n.days()),
            Every::Week(_) => first.checked_add((7 * n).days()),
            Every::Month => first.checked_add(n.months()).map(Date::first_of_month),
        }
    }

    /// The instant a period beginning on `day` begins.
    fn start_of(&self, day: Date) -> Result<i64, jiff::Error> {
        let local = day.to_datetime(self.at);
        Ok(self
            .tz
            .to_ambiguous_timestamp(local)
            .compatible()?
            .as_second())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_second()
    }

    fn tz(name: &str) -> TimeZone {
        // The tests carry their own rules (POSIX strings) so they need no tz database.
        match name {
            "Europe/Berlin" => TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap(),
            "America/New_York" => TimeZone::posix("EST5EDT,M3.2.0,M11.1.0").unwrap(),
            _ => TimeZone::UTC,
        }
    }

    #[test]
    fn months_begin_at_local_midnight_in_their_zone() {
        let berlin = Calendar::new(Every::Month, Time::midnight(), tz("Europe/Berlin"));
        // 2026-11-30 22:59:59 UTC is 23:59:59 in Berlin: still November.
        let p = berlin.period(unix("2026-11-30T22:59:59Z")).unwrap();
        assert_eq!(p.start, unix("2026-10-31T23:00:00Z"));
        assert_eq!(p.end, unix("2026-11-30T23:00:00Z"));
        // One second later, December (31 days) began.
        let p = berlin.period(unix("2026-11-30T23:00:00Z")).unwrap();
        assert_eq!(
            p,
            Period {
                start: unix("2026-11-30T23:00:00Z"),
                end: unix("2026-12-31T23:00:00Z")
            }
        );
        // New York's November ends five hours later than Berlin's.
        let ny = Calendar::new(Every::Month, Time::midnight(), tz("America/New_York"));
        let p = ny.period(unix("2026-11-30T23:00:00Z")).unwrap();
        assert_eq!(p.start, unix("2026-11-01T04:00:00Z"));
        assert_eq!(p.end, unix("2026-12-01T05:00:00Z"));
        // A month across the change to summer time is an hour shorter.
        let march = berlin.period(unix("2027-03-15T12:00:00Z")).unwrap();
        assert_eq!(march.end - march.start, 31 * 86_400 - 3_600);
        // February of a leap year.
        let feb = berlin.period(unix("2028-02-10T00:00:00Z")).unwrap();
        assert_eq!(feb.end - feb.start, 29 * 86_400);
    }

    #[test]
    fn days_and_weeks_begin_at_their_local_time() {
        let six = Time::constant(6, 0, 0, 0);
        let day = Calendar::new(Every::Day, six, tz("America/New_York"));
        // 03:00 local on the 2nd is still the day that began at 06:00 on the 1st.
        let p = day.period(unix("2026-12-02T08:00:00Z")).unwrap();
        assert_eq!(p.start, unix("2026-12-01T11:00:00Z"));
        assert_eq!(p.end, unix("2026-12-02T11:00:00Z"));
        // The day clocks go back lasts 25 hours.
        let p = day.period(unix("2026-11-01T12:00:00Z")).unwrap();
        assert_eq!(p.end - p.start, 24 * 3_600);
        let p = Calendar::new(Every::Day, Time::midnight(), tz("America/New_York"))
            .period(unix("2026-11-01T12:00:00Z"))
            .unwrap();
        assert_eq!(p.end - p.start, 25 * 3_600);
        // Weeks from Monday 00:00 UTC: 2026-11-27 is a Friday.
        let week = Calendar::new(
            Every::Week(Weekday::Monday),
            Time::midnight(),
            TimeZone::UTC,
        );
        let p = week.period(unix("2026-11-27T10:00:00Z")).unwrap();
        assert_eq!(p.start, unix("2026-11-23T00:00:00Z"));
        assert_eq!(p.end, unix("2026-11-30T00:00:00Z"));
        // A start inside the hour skipped in spring is the first instant after it.
        let gap = Calendar::new(Every::Day, Time::constant(2, 30, 0, 0), tz("Europe/Berlin"));
        let p = gap.period(unix("2027-03-28T12:00:00Z")).unwrap();
        assert_eq!(p.start, unix("2027-03-28T01:30:00Z"));
    }

    #[test]
    fn every_instant_falls_in_exactly_one_period() {
        let cals = [
            Calendar::new(Every::Month, Time::midnight(), tz("Europe/Berlin")),
            Calendar::new(
                Every::Day,
                Time::constant(2, 30, 0, 0),
                tz("America/New_York"),
            ),
            Calendar::new(
                Every::Week(Weekday::Sunday),
                Time::constant(23, 0, 0, 0),
                tz("Europe/Berlin"),
            ),
        ];
        for c in &cals {
            // Two years in 7-hour steps: periods tile time, with no gap and no overlap.
            let mut t = unix("2026-01-01T00:00:00Z");
            let mut last = c.period(t).unwrap();
            for _ in 0..2_500 {
                t += 7 * 3_600;
                let p = c.period(t).unwrap();
                assert!(p.start <= t && t < p.end, "{t} not in {p:?}");
                assert!(p == last || p.start == last.end, "{last:?} then {p:?}");
                last = p;
            }
        }
        assert!(cals[0].period(i64::MAX).is_err());
    }
}
