//! The Lyft rate-limit configuration (envoyproxy/ratelimit's YAML), loaded unchanged, plus
//! Weir's documented extensions (`algorithm`, `burst`, `window`).
//!
//! ```yaml
//! domain: api
//! descriptors:
//!   - key: remote_address            # no value: one counter per address
//!     rate_limit: {unit: minute, requests_per_unit: 100}
//!   - key: path
//!     value: "/login*"               # `*` wildcard
//!     rate_limit: {unit: second, requests_per_unit: 5, algorithm: gcra, burst: 10}
//!     descriptors:
//!       - key: user
//!         rate_limit: {window: 30s, requests_per_unit: 3, algorithm: sliding_log}
//! ```
//!
//! Errors name the file, line, column and field path: YAML syntax, unknown fields, wrong types
//! and impossible values (found while deserializing, so they carry the position), duplicate
//! keys at one level. YAML parsing is `serde_yaml_ng` (maintained fork of the deprecated
//! serde_yaml; its errors carry line and column; see docs/serve.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;
use weir_core::rate::{RateAlgorithm, RateSpec};

/// One configuration error (file, line, column, field path, reason), printable as one line.
pub use weir_rules::yaml::LocatedError as ConfigError;

/// Time units of the Lyft format (MONTH = 30 days, YEAR = 365 days).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3 600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit's length.
    pub fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 7 * 86_400,
            Self::Month => 30 * 86_400,
            Self::Year => 365 * 86_400,
        })
    }

    /// Upper-case name as in the proto (`SECOND`, …).
    pub fn proto_name(self) -> &'static str {
        match self {
            Self::Second => "SECOND",
            Self::Minute => "MINUTE",
            Self::Hour => "HOUR",
            Self::Day => "DAY",
            Self::Week => "WEEK",
            Self::Month => "MONTH",
            Self::Year => "YEAR",
        }
    }

    /// Parses a unit name in any case.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "second" => Self::Second,
            "minute" => Self::Minute,
            "hour" => Self::Hour,
            "day" => Self::Day,
            "week" => Self::Week,
            "month" => Self::Month,
            "year" => Self::Year,
            _ => return None,
        })
    }
}

impl<'de> Deserialize<'de> for Unit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Unit::parse(&s).ok_or_else(|| {
            de::Error::custom(format!(
                "unknown unit {s:?}: expected second, minute, hour, day, week, month or year"
            ))
        })
    }
}

/// The algorithms a limit's `algorithm` extension names; the default is the first,
/// `fixed_window`, Lyft's behaviour.
pub const ALGORITHMS: [RateAlgorithm; 6] = [
    RateAlgorithm::FixedWindow,
    RateAlgorithm::SlidingCounter,
    RateAlgorithm::SlidingWindow,
    RateAlgorithm::SlidingLog,
    RateAlgorithm::Gcra,
    RateAlgorithm::TokenBucket,
];

/// Reads the `algorithm` extension: one of [`ALGORITHMS`] by its name.
fn algorithm<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RateAlgorithm>, D::Error> {
    const NAMES: [&str; 6] = [
        "fixed_window",
        "sliding_counter",
        "sliding_window",
        "sliding_log",
        "gcra",
        "token_bucket",
    ];
    let s = String::deserialize(d)?;
    match RateAlgorithm::parse_among(&s, &ALGORITHMS) {
        Some(a) => Ok(Some(a)),
        None => Err(de::Error::unknown_variant(&s, &NAMES)),
    }
}

/// `replaces: [{name: …}]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replace {
    /// Name of the limit this one replaces (`- name:` with nothing reads as empty and is
    /// refused, as Lyft refuses it).
    #[serde(default, deserialize_with = "string_or_null")]
    pub name: String,
}

fn string_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// A validated `rate_limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// The Lyft unit (when `window` is given: the smallest unit covering it, see
    /// [`RateLimit::reported`]).
    pub unit: Unit,
    /// Units per window.
    pub requests_per_unit: u64,
    /// The window: the unit, or the `window` extension (e.g. 30 s).
    pub window: Duration,
    /// Optional name (metrics, `replaces`).
    pub name: Option<String>,
    /// Answer OK without counting.
    pub unlimited: bool,
    /// Limits this one replaces.
    pub replaces: Vec<String>,
    /// The algorithm.
    pub algorithm: RateAlgorithm,
    /// Burst for GCRA / token bucket.
    pub burst: Option<u64>,
    /// `cost: {min, max}`: the rule takes settlements (Envoy's stream-end refunds and
    /// charges, see [`CostBounds`]); `None`: a settlement naming it changes nothing.
    pub cost: Option<CostBounds>,
}

/// A rule's `cost` extension: opts it in to settlements and bounds every hit on it.
///
/// - an ask's hits count as at least `min` and at most `max` (a client stating
///   `x-max-tokens: 0` holds `min`: never a free peek);
/// - a charge (a descriptor ending with `weir_cost=settle`) counts for at most `max`;
/// - a refund (`is_negative_hits`) counts as its ask did (`min` to `max`) and never gives back
///   more than this instance charged the same key's asks in the last
///   `REFUND_HORIZON` (`rls::settlement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostBounds {
    /// The least one ask holds.
    pub min: u64,
    /// The most one ask, charge or refund counts for.
    pub max: u64,
}

impl CostBounds {
    /// What an ask or a refund of `hits` counts for.
    pub fn held(&self, hits: u64) -> u64 {
        hits.clamp(self.min, self.max)
    }

    /// What a charge of `hits` counts for.
    pub fn charged(&self, hits: u64) -> u64 {
        hits.min(self.max)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCost {
    #[serde(default, deserialize_with = "count")]
    min: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    max: Option<u64>,
}

impl RateLimit {
    /// `requests_per_unit: 0`: every request is over the limit (Lyft's way to block a
    /// descriptor; nothing is counted).
    pub fn denies_all(&self) -> bool {
        !self.unlimited && self.requests_per_unit == 0
    }

    /// The rate this limit counts with (in memory and in Redis alike), denied hits not
    /// counted.
    pub fn spec(&self) -> RateSpec {
        let spec = RateSpec::new(self.algorithm, self.requests_per_unit, self.window);
        match self.burst {
            Some(b) => spec.with_burst(b),
            None => spec,
        }
    }
}

/// Largest count (`requests_per_unit`, `burst`) accepted: 2^53, the largest integer Redis's
/// Lua numbers hold exactly. One bound for both stores, so a configuration that loads in
/// memory also loads on Redis.
pub const MAX_COUNT: u64 = 1 << 53;

/// A count (`requests_per_unit`, `burst`): a positive integer at most [`MAX_COUNT`], with an
/// error that says so for anything else (negative, fractional, beyond 2^64, a string).
fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct V;
    impl<'de> de::Visitor<'de> for V {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a whole number from 0 to {MAX_COUNT}")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<u64>, E> {
            if v > MAX_COUNT {
                return Err(E::custom(format!(
                    "{v} cannot be counted exactly: at most {MAX_COUNT} (2^53)"
                )));
            }
            Ok(Some(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<u64>, E> {
            match u64::try_from(v) {
                Ok(v) => self.visit_u64(v),
                Err(_) => Err(E::custom(format!("{v} is negative: expected {}", Exp))),
            }
        }
        fn visit_u128<E: de::Error>(self, v: u128) -> Result<Option<u64>, E> {
            Err(E::custom(format!(
                "{v} cannot be counted exactly: at most {MAX_COUNT} (2^53)"
            )))
        }
        fn visit_i128<E: de::Error>(self, v: i128) -> Result<Option<u64>, E> {
            match u64::try_from(v) {
                Ok(v) => self.visit_u64(v),
                Err(_) if v > 0 => self.visit_u128(v.unsigned_abs()),
                Err(_) => Err(E::custom(format!("{v} is negative: expected {}", Exp))),
            }
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<u64>, E> {
            Err(E::custom(format!(
                "{v} is not a whole number: expected {}",
                Exp
            )))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<u64>, E> {
            Err(E::custom(format!(
                "{v:?} is not a number: expected {}",
                Exp
            )))
        }
    }
    /// The expectation, for messages.
    struct Exp;
    impl std::fmt::Display for Exp {
        fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a whole number from 0 to {MAX_COUNT}")
        }
    }
    d.deserialize_any(V)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    unit: Option<Unit>,
    #[serde(default, deserialize_with = "count")]
    requests_per_unit: Option<u64>,
    name: Option<String>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    replaces: Vec<Replace>,
    #[serde(default, deserialize_with = "algorithm")]
    algorithm: Option<RateAlgorithm>,
    #[serde(default, deserialize_with = "count")]
    burst: Option<u64>,
    window: Option<String>,
    cost: Option<RawCost>,
}

/// Parses `30s`, `500ms`, `5m`, `1h`, `1d` (the rule sets' parser).
pub use weir_rules::config::parse_duration as parse_window;

impl<'de> Deserialize<'de> for RateLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RawRateLimit::deserialize(d)?
            .checked()
            .map_err(de::Error::custom)
    }
}

impl RawRateLimit {
    /// The limit these fields describe, or why they describe none (the field's error, which
    /// the file's reader locates).
    fn checked(self) -> Result<RateLimit, String> {
        let window = match &self.window {
            Some(w) => Some(parse_window(w).ok_or_else(|| {
                format!("window {w:?}: expected a positive duration like 500ms, 30s, 5m, 1h or 1d")
            })?),
            None => None,
        };
        if self.unlimited {
            self.unlimited_alone(window.is_some())?;
        }
        let algorithm = self.algorithm.unwrap_or(ALGORITHMS[0]);
        let unit = match (self.unit, window) {
            (Some(u), None) => u,
            (None, Some(w)) => unit_covering(w),
            (Some(_), Some(_)) => return Err("give either unit or window, not both".into()),
            (None, None) if self.unlimited => Unit::Second,
            (None, None) => {
                return Err("missing unit (second, minute, hour, day, …) or window".into())
            }
        };
        let requests_per_unit = match self.requests_per_unit {
            Some(n) => n,
            None if self.unlimited => 0,
            None => return Err("missing requests_per_unit".into()),
        };
        if self.burst == Some(0) {
            return Err("burst must be ≥ 1".into());
        }
        if self.burst.is_some() && !algorithm.has_burst() {
            return Err(format!(
                "burst applies to gcra and token_bucket, not {}",
                algorithm.as_str()
            ));
        }
        let cost = self.cost_bounds(algorithm, requests_per_unit)?;
        let replaces = self.replaced()?;
        let limit = RateLimit {
            unit,
            requests_per_unit,
            window: window.unwrap_or_else(|| unit.duration()),
            name: self.name,
            unlimited: self.unlimited,
            replaces,
            algorithm,
            burst: self.burst,
            cost,
        };
        if !limit.unlimited && !limit.denies_all() {
            // What the store checks when the rule is built, said here with the location.
            weir_redis::RedisRule::check(&limit.spec(), weir_redis::RuleOptions::default())
                .map_err(|e| {
                    format!(
                        "{} {} per {:?}: {e}",
                        limit.algorithm.as_str(),
                        limit.requests_per_unit,
                        limit.window
                    )
                })?;
        }
        Ok(limit)
    }

    /// An unlimited descriptor is never counted: it takes none of the counting fields.
    fn unlimited_alone(&self, window: bool) -> Result<(), String> {
        let given: Vec<&str> = [
            ("unit", self.unit.is_some()),
            ("window", window),
            ("requests_per_unit", self.requests_per_unit.is_some()),
            ("burst", self.burst.is_some()),
            ("algorithm", self.algorithm.is_some()),
            ("cost", self.cost.is_some()),
        ]
        .into_iter()
        .filter_map(|(f, set)| set.then_some(f))
        .collect();
        if given.is_empty() {
            return Ok(());
        }
        Err(format!(
            "unlimited: true takes no {}: an unlimited descriptor is never counted",
            given.join(", ")
        ))
    }

    /// The bounds of `cost:`, on an algorithm that can give back what it counted.
    fn cost_bounds(
        &self,
        algorithm: RateAlgorithm,
        requests_per_unit: u64,
    ) -> Result<Option<CostBounds>, String> {
        let Some(c) = &self.cost else {
            return Ok(None);
        };
        if !matches!(
            algorithm,
            RateAlgorithm::Gcra | RateAlgorithm::TokenBucket | RateAlgorithm::FixedWindow
        ) {
            return Err(format!(
                "cost needs algorithm gcra, token_bucket or fixed_window, not {} (the others cannot give back what they counted)",
                algorithm.as_str()
            ));
        }
        let max = c.max.or(self.burst).unwrap_or(requests_per_unit).max(1);
        let min = c.min.unwrap_or(1);
        if min == 0 {
            return Err("cost.min must be ≥ 1 (0 would make an ask a free peek)".into());
        }
        if min > max {
            return Err(format!("cost.min {min} is above cost.max {max}"));
        }
        Ok(Some(CostBounds { min, max }))
    }

    /// The names of the limits this one replaces: each given, none its own.
    fn replaced(&self) -> Result<Vec<String>, String> {
        let mut replaces = Vec::with_capacity(self.replaces.len());
        for r in &self.replaces {
            if r.name.is_empty() {
                return Err(
                    "replaces: an entry has an empty name (each entry names the limit it replaces)"
                        .into(),
                );
            }
            if self.name.as_deref() == Some(r.name.as_str()) {
                return Err(format!(
                    "replaces: {:?} is this limit's own name (a limit cannot replace itself)",
                    r.name
                ));
            }
            replaces.push(r.name.clone());
        }
        Ok(replaces)
    }
}

/// The smallest unit at least as long as `w` (YEAR for anything longer).
fn unit_covering(w: Duration) -> Unit {
    [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
    ]
    .into_iter()
    .find(|u| w <= u.duration())
    .unwrap_or(Unit::Year)
}

impl RateLimit {
    /// The limit as Envoy's `current_limit` can say it (requests per one of the Lyft units):
    /// the configured one when the window is a unit; otherwise scaled to the smallest unit
    /// covering the window, rounded down — 100 per 30 s is reported as 200 per MINUTE, never
    /// as 100 per SECOND (30 × too generous). A client pacing itself by the report never
    /// exceeds the enforced rate; the IETF `RateLimit-Policy` header carries the exact window
    /// in seconds (`w=30`).
    pub fn reported(&self) -> (u64, Unit) {
        if self.window == self.unit.duration() || self.requests_per_unit == 0 {
            return (self.requests_per_unit, self.unit);
        }
        let unit = unit_covering(self.window);
        let scaled = u128::from(self.requests_per_unit) * unit.duration().as_nanos()
            / self.window.as_nanos().max(1);
        (u64::try_from(scaled).unwrap_or(u64::MAX).max(1), unit)
    }
}

/// A descriptor node of the configuration tree.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    /// Entry key.
    #[serde(deserialize_with = "non_empty")]
    pub key: String,
    /// Entry value (`*` wildcards); none = any value, one counter per value.
    pub value: Option<String>,
    /// The limit at this node.
    pub rate_limit: Option<RateLimit>,
    /// Evaluate and count, always answer OK.
    #[serde(default)]
    pub shadow_mode: bool,
    /// Quota mode (Lyft): this descriptor over its limit makes the request OVER_LIMIT only
    /// when every quota-mode descriptor of the request is over (its own status still says
    /// OVER_LIMIT).
    #[serde(default)]
    pub quota_mode: bool,
    /// Metrics per request value (the rule's label carries the values), bounded per rule.
    #[serde(default)]
    pub detailed_metric: bool,
    /// The metric label carries the request's value at this level instead of the configured
    /// pattern (or nothing, for a key without value).
    #[serde(default)]
    pub value_to_metric: bool,
    /// Every value matching this wildcard shares one counter (and one metric label): the
    /// pattern stands for the value. Only on a `value` with `*`.
    #[serde(default)]
    pub share_threshold: bool,
    /// Any YAML map, returned in the response's dynamic metadata when the descriptor passes
    /// (`weir serve --response-metadata`).
    #[serde(default, deserialize_with = "metadata")]
    pub metadata: Option<Metadata>,
    /// Nested descriptors.
    #[serde(default)]
    pub descriptors: Vec<Descriptor>,
}

/// A descriptor's `metadata`: a JSON object (YAML map keys are written as strings).
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata(pub serde_json::Map<String, serde_json::Value>);

// YAML has no NaN that survives into JSON (it becomes null), so equality is reflexive.
impl Eq for Metadata {}

fn metadata<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Metadata>, D::Error> {
    let v = serde_yaml_ng::Value::deserialize(d)?;
    if v.is_null() {
        return Ok(None);
    }
    let mut v = v;
    v.apply_merge().map_err(de::Error::custom)?;
    match json_of(v).map_err(de::Error::custom)? {
        serde_json::Value::Object(m) if m.is_empty() => Ok(None),
        serde_json::Value::Object(m) => Ok(Some(Metadata(m))),
        other => Err(de::Error::custom(format!(
            "metadata must be a map, not {}",
            match other {
                serde_json::Value::Array(_) => "a list",
                serde_json::Value::String(_) => "a string",
                _ => "a scalar",
            }
        ))),
    }
}

/// YAML → JSON; map keys that are scalars are written as text (Lyft's `%v`).
fn json_of(v: serde_yaml_ng::Value) -> Result<serde_json::Value, String> {
    use serde_yaml_ng::Value as Y;
    Ok(match v {
        Y::Null => serde_json::Value::Null,
        Y::Bool(b) => b.into(),
        Y::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into()
            } else if let Some(i) = n.as_i64() {
                i.into()
            } else {
                n.as_f64()
                    .map_or(serde_json::Value::Null, serde_json::Value::from)
            }
        }
        Y::String(s) => s.into(),
        Y::Sequence(items) => items.into_iter().map(json_of).collect::<Result<_, _>>()?,
        Y::Mapping(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m {
                let key = match k {
                    Y::String(s) => s,
                    Y::Bool(b) => b.to_string(),
                    Y::Number(n) => n.to_string(),
                    _ => return Err("metadata map keys must be scalars".into()),
                };
                out.insert(key, json_of(v)?);
            }
            serde_json::Value::Object(out)
        }
        Y::Tagged(t) => json_of(t.value)?,
    })
}

fn non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() {
        return Err(de::Error::custom("key must not be empty"));
    }
    Ok(s)
}

/// Problems only the whole tree shows, as (field path, reason): a descriptor defined twice
/// at one level, `share_threshold` on a value without a wildcard.
fn problems(descriptors: &[Descriptor], at: &str, out: &mut Vec<(String, String)>) {
    let mut seen = std::collections::HashSet::new();
    for (i, d) in descriptors.iter().enumerate() {
        let path = format!("{at}descriptors[{i}]");
        if d.share_threshold && !d.value.as_deref().is_some_and(|v| v.contains('*')) {
            out.push((
                format!("{path}.share_threshold"),
                "applies only to a value with a `*` wildcard".into(),
            ));
        }
        if !seen.insert((&d.key, &d.value)) {
            out.push((
                path.clone(),
                format!(
                    "duplicate descriptor: key {:?}{} is already defined at this level",
                    d.key,
                    d.value
                        .as_ref()
                        .map(|v| format!(" value {v:?}"))
                        .unwrap_or_default()
                ),
            ));
        }
        problems(&d.descriptors, &format!("{path}."), out);
    }
}

fn check_unique(v: &[Descriptor]) -> Result<(), String> {
    let mut out = Vec::new();
    problems(v, "", &mut out);
    match out.into_iter().next() {
        None => Ok(()),
        Some((path, reason)) => Err(format!("{path}: {reason}")),
    }
}

/// One Lyft configuration document.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainConfig {
    /// The domain.
    #[serde(deserialize_with = "non_empty")]
    pub domain: String,
    /// Whether a fixed-window rule counts the hits it answers OVER_LIMIT (extension; default
    /// true, as Lyft: every hit is added, so a client that keeps sending stays over the limit).
    /// `false` is Weir's semantics: a refused hit consumes nothing. Other algorithms never
    /// count refused hits.
    #[serde(default = "yes")]
    pub count_denied: bool,
    /// Top-level descriptors.
    #[serde(default)]
    pub descriptors: Vec<Descriptor>,
}

fn yes() -> bool {
    true
}

/// Parses one YAML file's text, reporting every error found, type errors and broken
/// constraints together (see `weir_rules::yaml::parse_checked`).
pub fn parse(file: &Path, text: &str) -> Result<DomainConfig, Vec<ConfigError>> {
    weir_rules::yaml::parse_checked(file, text, |domain: &DomainConfig, _| {
        let mut found = Vec::new();
        problems(&domain.descriptors, "", &mut found);
        found
    })
    .map_err(|e| e.0)
}

/// Loads `path`: a YAML file or a directory of `*.yaml` / `*.yml` files (sorted by name).
/// Answers every file's domain, or every error found (all files are read). A domain in two
/// files is an error, unless `merge_domains` (Lyft's `MERGE_DOMAIN_CONFIG`): then the files'
/// descriptors join, and a descriptor defined in both is the error.
pub fn load(path: &Path, merge_domains: bool) -> Result<Vec<DomainConfig>, Vec<ConfigError>> {
    let files = if path.is_dir() {
        let mut files: Vec<PathBuf> = match std::fs::read_dir(path) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect(),
            Err(e) => return Err(vec![io_error(path, &e)]),
        };
        files.sort();
        if files.is_empty() {
            return Err(vec![ConfigError {
                file: path.to_path_buf(),
                position: None,
                path: String::new(),
                reason: "no .yaml or .yml files in this directory".into(),
            }]);
        }
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut domains = Vec::new();
    let mut errors = Vec::new();
    for f in &files {
        match weir_rules::yaml::read(f)
            .map_err(|e| vec![e])
            .and_then(|text| parse(f, &text))
        {
            Ok(d) => domains.push((f.clone(), d)),
            Err(e) => errors.extend(e),
        }
    }
    match merge(domains, merge_domains) {
        Ok(merged) if errors.is_empty() => Ok(merged),
        Ok(_) => Err(errors),
        Err(e) => {
            errors.extend(e);
            Err(errors)
        }
    }
}

/// The domains of `sources` (each with where it came from), a domain given twice being an
/// error unless `merge_domains` joins their descriptors (a descriptor defined in both is
/// then the error).
pub fn merge(
    domains: Vec<(PathBuf, DomainConfig)>,
    merge_domains: bool,
) -> Result<Vec<DomainConfig>, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let mut merged: Vec<(PathBuf, DomainConfig)> = Vec::with_capacity(domains.len());
    for (f, d) in domains {
        let Some((first, into)) = merged.iter_mut().find(|(_, m)| m.domain == d.domain) else {
            merged.push((f, d));
            continue;
        };
        let error = |path: &str, reason: String| ConfigError {
            file: f.clone(),
            position: None,
            path: path.into(),
            reason,
        };
        if !merge_domains {
            errors.push(error(
                "domain",
                format!(
                    "domain {:?} is also defined in {} (weir serve --merge-domains joins them)",
                    d.domain,
                    first.display()
                ),
            ));
        } else if into.count_denied != d.count_denied {
            errors.push(error(
                "count_denied",
                format!("differs from domain {:?} in {}", d.domain, first.display()),
            ));
        } else {
            into.descriptors.extend(d.descriptors);
            if let Err(e) = check_unique(&into.descriptors) {
                errors.push(error(
                    "descriptors",
                    format!("{e} (merging domain {:?} of {})", d.domain, first.display()),
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(merged.into_iter().map(|(_, d)| d).collect())
    } else {
        Err(errors)
    }
}

fn io_error(path: &Path, e: &std::io::Error) -> ConfigError {
    ConfigError {
        file: path.to_path_buf(),
        position: None,
        path: String::new(),
        reason: format!("cannot read: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(Path::new("c.yaml"), text).unwrap_err()[0].to_string()
    }

    #[test]
    fn lyft_example_loads() {
        let c = parse(
            Path::new("c.yaml"),
            "domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n  - key: database\n    value: default\n    rate_limit:\n      unit: SECOND\n      requests_per_unit: 500\n",
        )
        .unwrap();
        assert_eq!(c.domain, "mongo_cps");
        assert_eq!(c.descriptors.len(), 2);
        let rl = c.descriptors[1].rate_limit.as_ref().unwrap();
        assert_eq!((rl.unit, rl.requests_per_unit), (Unit::Second, 500));
    }

    #[test]
    fn errors_name_line_column_and_path() {
        let e = err("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n");
        assert!(
            e.starts_with("c.yaml:5:7: descriptors[0].rate_limit.unit: unknown unit \"fortnight\""),
            "{e}"
        );
        let e = err("domain: d\ndescriptors:\n  - key: a\n    ratelimit: {}\n");
        assert!(
            e.contains("c.yaml:4:") && e.contains("unknown field `ratelimit`"),
            "{e}"
        );
        let e = err("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -3}\n");
        assert!(
            e.contains("c.yaml:4:") && e.contains("requests_per_unit"),
            "{e}"
        );
        let e = err("domain: d\ndescriptors:\n  - key: a\n  - key: a\n");
        assert!(
            e.contains("c.yaml:4:5: descriptors[1]: duplicate descriptor: key \"a\""),
            "{e}"
        );
        let e = err("domain: ''\n");
        assert!(
            e.contains("domain") && e.contains("must not be empty"),
            "{e}"
        );
        let e = err("domain: d\n  bad: [\n");
        assert!(e.starts_with("c.yaml:"), "{e}");
    }

    #[test]
    fn counts_that_cannot_be_exact_are_refused_with_their_location() {
        let rl = |body: &str| {
            err(&format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{{body}}}\n"
            ))
        };
        let e = rl("unit: second, requests_per_unit: 18446744073709551616");
        assert!(
            e.starts_with("c.yaml:4:")
                && e.contains("requests_per_unit")
                && e.contains("cannot be counted exactly"),
            "{e}"
        );
        let e = rl("unit: second, requests_per_unit: 18446744073709551615");
        assert!(e.contains("at most 9007199254740992"), "{e}");
        let e = rl("unit: second, requests_per_unit: 9007199254740993");
        assert!(e.contains("cannot be counted exactly"), "{e}");
        let e = rl("unit: second, requests_per_unit: 2.5");
        assert!(e.contains("not a whole number"), "{e}");
        let e = rl("unit: second, requests_per_unit: 4000000, algorithm: sliding_log");
        assert!(
            e.starts_with("c.yaml:3:5: descriptors[0].rate_limit: ")
                && e.contains("sliding log")
                && !e.contains("Redis"),
            "{e}"
        );
        let e = rl("unit: second, requests_per_unit: 9007199254740992, algorithm: gcra");
        assert!(
            e.starts_with("c.yaml:3:5: descriptors[0].rate_limit: ")
                && e.contains("too large")
                && !e.contains("rule"),
            "{e}"
        );
        assert!(parse(
            Path::new("c.yaml"),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967295}\n"
        )
        .is_ok());
    }

    #[test]
    fn extensions_window_algorithm_burst() {
        let c = parse(
            Path::new("c.yaml"),
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {window: 30s, requests_per_unit: 3, algorithm: gcra, burst: 5}\n",
        )
        .unwrap();
        let rl = c.descriptors[0].rate_limit.as_ref().unwrap();
        assert_eq!(rl.window, Duration::from_secs(30));
        assert_eq!(rl.algorithm, RateAlgorithm::Gcra);
        assert_eq!(rl.burst, Some(5));
        assert_eq!(
            rl.reported(),
            (6, Unit::Minute),
            "3 per 30 s = 6 per minute"
        );
        let reported = |w: &str, n: u64| {
            let c = parse(
                Path::new("c.yaml"),
                &format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{window: {w}, requests_per_unit: {n}}}\n"),
            )
            .unwrap();
            c.descriptors[0].rate_limit.as_ref().unwrap().reported()
        };
        assert_eq!(reported("30s", 100), (200, Unit::Minute));
        assert_eq!(reported("45s", 100), (133, Unit::Minute), "rounded down");
        assert_eq!(reported("500ms", 5), (10, Unit::Second));
        assert_eq!(reported("1m", 7), (7, Unit::Minute));
        assert_eq!(reported("90m", 3), (48, Unit::Day));
        assert!(err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {window: 30x, requests_per_unit: 3}\n").contains("window \"30x\""));
        assert!(err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3, burst: 2}\n").contains("burst applies to gcra"));
    }
}
