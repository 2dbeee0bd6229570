//! Calendar budgets: a limit per period that resets on the calendar (`every: month`, `on`,
//! `at`, `tz`), its warnings and mode, and their checks.

use serde::Deserialize;

use super::cost::validate_cost;
use super::cost::CostRule;
use super::fields::RateAlgorithm;

/// A calendar budget: at most `limit` units per day, week or month, beginning at a local time
/// in a named time zone (`resets`), for all calls together or per value of a parameter
/// (`param`); hard (refuse past the limit) or soft (admit, mark the response, count). Counts
/// with `cost:` as a rate rule does (an estimate held, settled to the actual cost). Counted
/// locally and kept across restarts by the server (a state file beside the rule file), or with
/// `shared: true` in the store every instance shares.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetRule {
    /// Unique id (among every rule id).
    pub id: String,
    /// Units per period.
    pub limit: u64,
    /// When periods begin.
    pub resets: Resets,
    /// One count per value of this parameter (its index in the call's `params`, as
    /// `hot_params`); absent: all calls together. Calls without the value are not counted.
    pub param: Option<usize>,
    /// `hard` (default): refuse a call past the limit until the period ends; `soft`: admit
    /// it, mark the response and count it.
    #[serde(default)]
    pub mode: BudgetMode,
    /// Fractions of the limit logged and counted once per key and period when reached
    /// (default 0.8 and 1.0; `[]` for none).
    #[serde(default = "default_warn")]
    pub warn: Vec<Fraction>,
    /// Most values counted at once with `param` (default 100 000): past it, a new value
    /// evicts one that spent little (weir-core's `budget`).
    #[serde(default = "default_budget_values")]
    pub max_values: usize,
    /// Count what calls cost ([`CostRule`]): a month's tokens per user.
    pub cost: Option<Box<CostRule>>,
    /// Counted in the store every instance shares (`weir proxy --store redis://…`: one count
    /// across proxies, kept by Redis across restarts); without one, or while it cannot be
    /// reached, on this instance.
    #[serde(default)]
    pub shared: bool,
}

fn default_warn() -> Vec<Fraction> {
    vec![Fraction(800), Fraction(1000)]
}

fn default_budget_values() -> usize {
    100_000
}

/// `hard` or `soft` ([`BudgetRule::mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetMode {
    /// Refuse past the limit.
    #[default]
    Hard,
    /// Admit past the limit; mark and count.
    Soft,
}

/// A fraction of a limit in (0, 10], kept in thousandths (`0.8` is 800).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fraction(pub u32);

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = f64::deserialize(d)?;
        if !(f > 0.0 && f <= 10.0) {
            return Err(serde::de::Error::custom(format!(
                "{f}: a fraction of the limit in (0, 10], like 0.8"
            )));
        }
        // In (0, 10]: at most 10 000 thousandths.
        Ok(Fraction((f * 1000.0).round().max(1.0) as u32))
    }
}

/// When a [`BudgetRule`]'s periods begin: `{every: month, at: "00:00", tz: Europe/Berlin}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resets {
    /// `day`, `week` or `month`.
    pub every: Every,
    /// Local time of day the periods begin, `HH:MM` (default `00:00`).
    #[serde(default = "midnight")]
    pub at: String,
    /// An IANA time zone (`Europe/Berlin`, `America/New_York`; default `UTC`): the system's
    /// time-zone database, else the one built in.
    #[serde(default = "utc")]
    pub tz: String,
    /// The day weeks begin (`every: week`; default `monday`).
    pub on: Option<String>,
}

fn midnight() -> String {
    "00:00".into()
}

fn utc() -> String {
    "UTC".into()
}

/// How long a budget's period is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Every {
    /// A calendar day.
    Day,
    /// A week.
    Week,
    /// A calendar month.
    Month,
}

impl Resets {
    /// The calendar these resets describe, or what is wrong as (field, reason).
    pub fn calendar(&self) -> Result<weir_core::calendar::Calendar, (&'static str, String)> {
        use weir_core::calendar::{Calendar, Every as E};
        let at = parse_time_of_day(&self.at).ok_or_else(|| {
            (
                "at",
                format!("{:?}: a local time of day HH:MM, like \"00:00\"", self.at),
            )
        })?;
        let tz = jiff::tz::TimeZone::get(&self.tz).map_err(|_| {
            (
                "tz",
                format!(
                    "{:?} is not a time zone (an IANA name like Europe/Berlin, America/New_York or UTC)",
                    self.tz
                ),
            )
        })?;
        let every = match (self.every, self.on.as_deref()) {
            (Every::Day, None) => E::Day,
            (Every::Month, None) => E::Month,
            (Every::Week, on) => E::Week(match on.map(str::to_ascii_lowercase).as_deref() {
                None | Some("monday") => jiff::civil::Weekday::Monday,
                Some("tuesday") => jiff::civil::Weekday::Tuesday,
                Some("wednesday") => jiff::civil::Weekday::Wednesday,
                Some("thursday") => jiff::civil::Weekday::Thursday,
                Some("friday") => jiff::civil::Weekday::Friday,
                Some("saturday") => jiff::civil::Weekday::Saturday,
                Some("sunday") => jiff::civil::Weekday::Sunday,
                Some(other) => {
                    return Err(("on", format!("{other:?}: a day of the week, like monday")))
                }
            }),
            (_, Some(_)) => return Err(("on", "applies to every: week only".into())),
        };
        Ok(Calendar::new(every, at, tz))
    }
}

/// `HH:MM` (or `HH:MM:SS`), 24-hour.
fn parse_time_of_day(s: &str) -> Option<jiff::civil::Time> {
    let mut parts = s.split(':');
    let h: i8 = parts.next()?.parse().ok()?;
    let m: i8 = parts.next()?.parse().ok()?;
    let sec: i8 = match parts.next() {
        Some(x) => x.parse().ok()?,
        None => 0,
    };
    if parts.next().is_some() {
        return None;
    }
    jiff::civil::Time::new(h, m, sec, 0).ok()
}

/// A calendar budget's numbers, resets and cost.
pub(super) fn validate_budget(b: &BudgetRule, p: &str, fail: &mut dyn FnMut(String, &str)) {
    if b.limit == 0 {
        fail(format!("{p}.limit"), "must be ≥ 1");
    }
    if b.max_values == 0 {
        fail(format!("{p}.max_values"), "must be ≥ 1");
    }
    if let Err((field, reason)) = b.resets.calendar() {
        fail(format!("{p}.resets.{field}"), &reason);
    }
    if let Some(c) = &b.cost {
        validate_cost(
            c,
            Some(RateAlgorithm::FixedWindow),
            &format!("{p}.cost"),
            fail,
        );
    }
}
