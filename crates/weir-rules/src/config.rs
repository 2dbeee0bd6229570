//! The rule set: resources and their rules, from YAML or built in code.
//!
//! ```yaml
//! resources:
//!   - name: checkout
//!     flow:
//!       - {id: checkout-qps, qps: 100, window: 1s, algorithm: sliding_window}
//!       - {id: checkout-inflight, concurrency: 20}
//!     hot_params:
//!       - {id: per-user, param: 0, threshold: 5, window: 1s, exceptions: {vip: 50}, max_values: 10000}
//!     authority: {id: callers, allow: [web, mobile]}
//!     breaker: {id: payment, preset: resilience4j, shadow: true}
//!   - name: search
//!     flow:
//!       - {id: search-paced, qps: 50, behavior: pace, max_wait: 500ms}
//!       - {id: search-batch, qps: 5, origin: batch}
//!       - {id: search-when-checkout-busy, qps: 80, relate: checkout}
//! system: {max_in_flight: 500, bbr: {cpu_threshold: 0.8}}
//! http:
//!   trusted_proxies: [10.0.0.0/8]
//!   origin_header: x-caller
//!   routes:
//!     - {resource: checkout, prefix: /api/checkout, methods: [POST], params: [{header: x-user-id}]}
//!     - {resource: search, prefix: /api/search, params: [client_ip]}
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use weir_core::learned::Quantiles;

use crate::yaml::{self, LocatedErrors};

/// A whole rule set.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RuleSet {
    /// The resources.
    #[serde(default)]
    pub resources: Vec<ResourceConfig>,
    /// Rules on all inbound traffic together.
    pub system: Option<SystemRule>,
    /// How HTTP requests map to resources (weir-tower's `RulesLayer`, `weir proxy`).
    pub http: Option<HttpConfig>,
}

/// One resource (an endpoint, a method, a dependency) and its rules.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    /// The resource's name, as `entry` is called with it.
    pub name: String,
    /// Flow rules (all must admit).
    #[serde(default)]
    pub flow: Vec<FlowRule>,
    /// Per-parameter-value limits.
    #[serde(default)]
    pub hot_params: Vec<HotParamRule>,
    /// Allow or deny list of origins.
    pub authority: Option<AuthorityRule>,
    /// A circuit breaker.
    pub breaker: Option<BreakerRule>,
    /// A switch that turns the resource off by hand (degradation).
    pub switch: Option<SwitchRule>,
    /// Calendar budgets: units per day, week or month ([`BudgetRule`]).
    #[serde(default)]
    pub budgets: Vec<BudgetRule>,
}

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

/// A switch on a resource: while on, every call to the resource is blocked (kind `switch`,
/// before any other rule) and gets the route's fallback or 503. `on` here is the state the file
/// asks for; a state set at run time ([`crate::engine::Rules::set_switch`]) overrides it and
/// survives reloads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchRule {
    /// The switch's id (unique among rule ids).
    pub id: String,
    /// Degraded: calls are blocked (default false).
    #[serde(default)]
    pub on: bool,
}

pub use weir_core::rate::RateAlgorithm;

/// The algorithms a rule file's `algorithm` names (pacing and warm-up come from `behavior`);
/// the default is the first, `sliding_window`.
pub const FILE_ALGORITHMS: [RateAlgorithm; 6] = [
    RateAlgorithm::SlidingWindow,
    RateAlgorithm::FixedWindow,
    RateAlgorithm::SlidingLog,
    RateAlgorithm::SlidingCounter,
    RateAlgorithm::Gcra,
    RateAlgorithm::TokenBucket,
];

/// Reads an `algorithm` field: one of [`FILE_ALGORITHMS`] by its name.
fn algorithm<'de, D: serde::Deserializer<'de>>(d: D) -> Result<RateAlgorithm, D::Error> {
    const NAMES: [&str; 6] = [
        "sliding_window",
        "fixed_window",
        "sliding_log",
        "sliding_counter",
        "gcra",
        "token_bucket",
    ];
    let s = String::deserialize(d)?;
    RateAlgorithm::parse_among(&s, &FILE_ALGORITHMS)
        .ok_or_else(|| serde::de::Error::unknown_variant(&s, &NAMES))
}

fn optional_algorithm<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<RateAlgorithm>, D::Error> {
    algorithm(d).map(Some)
}

fn default_algorithm() -> RateAlgorithm {
    FILE_ALGORITHMS[0]
}

/// What a flow rate rule does with a call over the rate (Sentinel's control behaviours).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Behavior {
    /// Block at once (with the rule's `algorithm`).
    #[default]
    Reject,
    /// Space calls evenly at the rate; a call waits its turn if that is within `max_wait`
    /// (default 500 ms), else it is blocked (leaky bucket as a queue).
    Pace,
    /// Token bucket ramping from `qps / cold_factor` to `qps` over `warmup` after a quiet
    /// period (Guava `SmoothWarmingUp`); no waiting.
    WarmUp,
    /// Warm-up, and calls may wait up to `max_wait` (default 500 ms).
    WarmUpPace,
}

impl Behavior {
    /// The name used in rule files.
    pub fn as_str(self) -> &'static str {
        match self {
            Behavior::Reject => "reject",
            Behavior::Pace => "pace",
            Behavior::WarmUp => "warm_up",
            Behavior::WarmUpPace => "warm_up_pace",
        }
    }
}

/// A flow rule: a rate (`qps` units per `window`) or a concurrency limit.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowRule {
    /// Unique id (state is kept across reloads by id).
    pub id: String,
    /// Units per window.
    pub qps: Option<u64>,
    /// Calls in flight.
    pub concurrency: Option<u64>,
    /// The window of `qps` (default `1s`).
    #[serde(default, deserialize_with = "window")]
    pub window: Option<Duration>,
    /// The algorithm of `qps` with behaviour `reject` (default sliding_window).
    #[serde(default, deserialize_with = "optional_algorithm")]
    pub algorithm: Option<RateAlgorithm>,
    /// Burst for GCRA / token bucket.
    pub burst: Option<u64>,
    /// What happens over the rate.
    #[serde(default)]
    pub behavior: Behavior,
    /// Longest wait of `pace` / `warm_up_pace` (default 500ms).
    #[serde(default, deserialize_with = "window")]
    pub max_wait: Option<Duration>,
    /// Warm-up period of `warm_up` / `warm_up_pace` (default 10s).
    #[serde(default, deserialize_with = "window")]
    pub warmup: Option<Duration>,
    /// Cold rate = qps / cold_factor (default 3, ≥ 2).
    pub cold_factor: Option<u32>,
    /// Which callers the rule counts: absent = all together; a name = only that origin;
    /// `other` = each origin not named by another flow rule of the resource, each counted
    /// on its own.
    pub origin: Option<String>,
    /// Limit this resource by the pass rate of another resource (Sentinel's relate strategy):
    /// calls here are blocked while that resource passed `qps` or more in the last second.
    pub relate: Option<String>,
    /// A share of a cluster-wide limit leased from a quota server (weir-quota) instead of
    /// `qps` / `concurrency`: the rule admits at the rate granted to this process.
    pub cluster: Option<ClusterLimit>,
    /// Count what calls cost instead of one per call ([`CostRule`]; boxed: rare, and a rule
    /// the call path reads stays small).
    pub cost: Option<Box<CostRule>>,
    /// Counted in the store every instance shares (`weir proxy --store redis://…`: one
    /// budget across proxies; [`crate::shared`]); without one, locally. Needs `qps` and
    /// `behavior: reject`.
    #[serde(default)]
    pub shared: bool,
    /// Evaluate and count, never block.
    #[serde(default)]
    pub shadow: bool,
}

/// `cost:` of a rate rule (flow `qps` or hot parameter): the rule counts what each call
/// costs — an estimate held when the call starts ([`crate::engine::Context::cost`], or
/// `estimate` when the call states none), settled to the actual cost when it ends
/// ([`crate::engine::Guard::settle_cost`]: the rest given back, an excess a debt later calls
/// wait out; weir-core's `cost`). Needs `algorithm: gcra`, `token_bucket` or `fixed_window`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostRule {
    /// The estimate of a call that states none (default 1), or `learned`: what recent calls
    /// of the resource actually cost ([`Estimate::Learned`]).
    #[serde(default)]
    pub estimate: Estimate,
    /// The least a call holds, whatever it states; by default `estimate` when clients state
    /// their estimates over HTTP (`estimate_from`), else 1. A client stating less —
    /// `max_tokens: 0`, say — holds this: an estimate it chooses can never make its call a
    /// free peek, so the calls one key has in flight are at most what its budget holds in
    /// units of `min`, and their excesses (at most `max − min` each) stay bounded.
    pub min: Option<u64>,
    /// Most one call's estimate or actual cost counts for (larger ones count as this); by
    /// default the rule's burst, else its limit.
    pub max: Option<u64>,
    /// Where an HTTP request states its estimate (weir-tower, `weir proxy`); absent or
    /// unreadable: `estimate`.
    pub estimate_from: Option<EstimateFrom>,
    /// Where an HTTP response states what the call actually cost (weir-tower, `weir proxy`);
    /// absent: the estimate stays charged.
    pub actual_from: Option<ActualFrom>,
}

/// `cost.estimate`: what a call holds when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Estimate {
    /// A number of units (for a call stating none; a call stating more holds more).
    Units(u64),
    /// `learned`: the 95th percentile of what the resource's recent calls actually cost
    /// (weir-core's `learned`), capped by what the call states, and at least the median (a
    /// client stating less than a typical call holds a typical call) unless `min` says
    /// otherwise. Until 16 calls settled: what the call states, else `max`.
    Learned,
}

impl std::fmt::Display for Estimate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Units(n) => write!(f, "{n}"),
            Self::Learned => f.write_str("learned"),
        }
    }
}

impl Default for Estimate {
    fn default() -> Self {
        Self::Units(1)
    }
}

impl<'de> Deserialize<'de> for Estimate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Estimate;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a whole number of units ≥ 1, or `learned`")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Estimate, E> {
                Ok(Estimate::Units(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Estimate, E> {
                u64::try_from(v).map(Estimate::Units).map_err(|_| {
                    E::custom(format!("{v}: a whole number of units ≥ 1, or `learned`"))
                })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Estimate, E> {
                match v {
                    "learned" => Ok(Estimate::Learned),
                    _ => Err(E::custom(format!(
                        "{v:?}: a whole number of units ≥ 1, or `learned`"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// Where an HTTP request states its cost estimate (`cost.estimate_from`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "SourceFields")]
pub enum EstimateFrom {
    /// A request header holding a whole number (`{header: x-max-tokens}`).
    Header(String),
    /// A field of a JSON request body, dotted for nested objects (`{json: max_tokens}`); read
    /// from the body's first [`MAX_COST_JSON`] bytes.
    Json(String),
}

/// Where an HTTP response states what the call cost (`cost.actual_from`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "SourceFields")]
pub enum ActualFrom {
    /// A response header (`{header: x-tokens-used}`).
    Header(String),
    /// A response trailer (`{trailer: x-tokens-used}`).
    Trailer(String),
    /// A field of a JSON response body, dotted (`{json: usage.total_tokens}`); a body larger
    /// than [`MAX_COST_JSON`] keeps the estimate.
    Json(String),
    /// A field of the last Server-Sent Event carrying it, dotted (`{sse: usage.total_tokens}`,
    /// as OpenAI-style streams end); read while the stream passes, events larger than
    /// [`MAX_COST_JSON`] skipped.
    Sse(String),
}

/// A cost source as written: one key of `header`, `trailer`, `json`, `sse`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceFields {
    header: Option<String>,
    trailer: Option<String>,
    json: Option<String>,
    sse: Option<String>,
}

impl SourceFields {
    /// The one key given, or an error naming the keys `allowed`.
    fn one(self, allowed: &str) -> Result<(&'static str, String), String> {
        let given: Vec<(&'static str, String)> = [
            ("header", self.header),
            ("trailer", self.trailer),
            ("json", self.json),
            ("sse", self.sse),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();
        match <[_; 1]>::try_from(given) {
            Ok([(k, v)]) if allowed.split(", ").any(|a| a == k) => Ok((k, v)),
            _ => Err(format!("give exactly one of {allowed}")),
        }
    }
}

impl TryFrom<SourceFields> for EstimateFrom {
    type Error = String;

    fn try_from(f: SourceFields) -> Result<Self, String> {
        Ok(match f.one("header, json")? {
            ("header", v) => Self::Header(v),
            (_, v) => Self::Json(v),
        })
    }
}

impl TryFrom<SourceFields> for ActualFrom {
    type Error = String;

    fn try_from(f: SourceFields) -> Result<Self, String> {
        Ok(match f.one("header, trailer, json, sse")? {
            ("header", v) => Self::Header(v),
            ("trailer", v) => Self::Trailer(v),
            ("json", v) => Self::Json(v),
            (_, v) => Self::Sse(v),
        })
    }
}

/// Most bytes read to find a cost in a JSON body or one Server-Sent Event (64 KiB).
pub const MAX_COST_JSON: usize = 64 * 1024;

/// Where a resource's calls state their costs over HTTP: the `estimate_from` and
/// `actual_from` its `cost:` rules share.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CostSources {
    /// Where the request states its estimate.
    pub estimate: Option<EstimateFrom>,
    /// Where the response states the actual cost.
    pub actual: Option<ActualFrom>,
}

impl CostSources {
    /// Whether there is anything to read.
    pub fn is_empty(&self) -> bool {
        self.estimate.is_none() && self.actual.is_none()
    }
}

impl CostRule {
    /// The least a call holds: `min`; else, for a fixed estimate, the estimate when clients
    /// state their estimates (`estimate_from`), 1 when the caller's own code does; for a learned
    /// one, the median of recent costs once learned (`learned`), else 1. Never 0.
    pub fn floor(&self, learned: Option<Quantiles>) -> u64 {
        let default = match (self.estimate, learned) {
            (Estimate::Units(e), _) if self.estimate_from.is_some() => e,
            (Estimate::Units(_), _) => 1,
            (Estimate::Learned, Some(q)) => q.typical,
            (Estimate::Learned, None) => 1,
        };
        self.min.unwrap_or(default).max(1)
    }

    /// Whether the estimate is learned from recent calls.
    pub fn learns(&self) -> bool {
        self.estimate == Estimate::Learned
    }

    /// The units a call stating `given` (or nothing) holds, at most `max` (the rule's `max`
    /// when set): a fixed estimate — what it states, else `estimate`; a learned one — the high
    /// quantile of `learned` capped by what it states (before anything is learned: what it
    /// states, else `max`); never below [`CostRule::floor`].
    pub fn estimate_of(&self, given: Option<u64>, max: u64, learned: Option<Quantiles>) -> u64 {
        let cap = self.max.unwrap_or(max);
        let held = match (self.estimate, learned) {
            (Estimate::Units(e), _) => given.unwrap_or(e),
            (Estimate::Learned, Some(q)) => given.unwrap_or(cap).min(q.high),
            (Estimate::Learned, None) => given.unwrap_or(cap),
        };
        held.max(self.floor(learned)).min(cap)
    }

    /// The units an actual cost of `actual` counts for, at most `max`.
    pub fn actual_of(&self, actual: u64, max: u64) -> u64 {
        actual.min(self.max.unwrap_or(max))
    }
}

/// A flow rule's cluster-quota resource.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterLimit {
    /// The resource on the quota server.
    pub resource: String,
    /// Units/s this process may use until the quota server is first reached.
    pub safe: f64,
}

impl Eq for ClusterLimit {}

/// The origin value of [`FlowRule::origin`] that means "every caller not named elsewhere".
pub const OTHER_ORIGIN: &str = "other";

/// Sentinel's default longest queueing time of paced rules.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_millis(500);

/// Sentinel's default warm-up period.
pub const DEFAULT_WARMUP: Duration = Duration::from_secs(10);

/// What a hot-parameter rule does when it tracks `max_values` values and a new one comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnFull {
    /// Forget the least recently active value (idle first); counted as an eviction.
    #[default]
    Evict,
    /// Block calls with a new value until a tracked value goes idle; counted as `full`.
    Reject,
    /// Let calls with a new value through unlimited (an explicit fail-open); counted as `full`.
    Allow,
}

/// What a hot-parameter rule does with a call that lacks its parameter (absent or empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Absent {
    /// The rule does not apply to the call (Sentinel's behaviour). Limit such calls with a
    /// flow rule of the resource if they must be limited.
    #[default]
    Skip,
    /// All such calls share one counter of `threshold` (anonymous traffic limited together).
    Shared,
}

/// A limit per value of one request parameter (user id, IP, tenant).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HotParamRule {
    /// Unique id.
    pub id: String,
    /// Index of the parameter in the call's `params`.
    pub param: usize,
    /// Units per window for each value.
    pub threshold: u64,
    /// The window (default `1s`).
    #[serde(default, deserialize_with = "window")]
    pub window: Option<Duration>,
    /// The algorithm.
    #[serde(default = "default_algorithm", deserialize_with = "algorithm")]
    pub algorithm: RateAlgorithm,
    /// Burst for GCRA / token bucket.
    pub burst: Option<u64>,
    /// Values with their own threshold.
    #[serde(default)]
    pub exceptions: BTreeMap<String, u64>,
    /// Most values tracked at once (default 10 000).
    #[serde(default = "default_max_values")]
    pub max_values: usize,
    /// Behaviour at `max_values`.
    #[serde(default)]
    pub on_full: OnFull,
    /// Calls without the parameter (absent or empty, e.g. no `x-user-id` header).
    #[serde(default)]
    pub absent: Absent,
    /// Count what calls cost instead of one per call ([`CostRule`]): per value, e.g. tokens
    /// per user.
    pub cost: Option<Box<CostRule>>,
    /// Counted per value in the store every instance shares (as [`FlowRule::shared`]); takes
    /// no `exceptions`.
    #[serde(default)]
    pub shared: bool,
    /// Evaluate and count, never block.
    #[serde(default)]
    pub shadow: bool,
}

fn default_max_values() -> usize {
    10_000
}

/// Allow or deny list of origins (callers).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorityRule {
    /// Unique id.
    pub id: String,
    /// Only these origins may call (exclusive with `deny`).
    #[serde(default)]
    pub allow: Vec<String>,
    /// These origins may not call.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Evaluate and count, never block.
    #[serde(default)]
    pub shadow: bool,
}

/// Breaker presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerPreset {
    /// Hystrix defaults.
    Hystrix,
    /// Sentinel defaults.
    Sentinel,
    /// Resilience4j defaults.
    Resilience4j,
}

/// A circuit breaker on the resource: a preset, optionally adjusted field by field (every
/// weir-core breaker parameter is here). Outcomes: `Guard::complete(Error)` (a 5xx through the
/// tower layer) is a failure; a call slower than `slow_call` is slow.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerRule {
    /// Unique id.
    pub id: String,
    /// Defaults to start from (default: resilience4j).
    pub preset: Option<BreakerPreset>,
    /// Count the last N calls (exclusive with `window`).
    pub window_calls: Option<u32>,
    /// Count the calls of the last `window` (exclusive with `window_calls`).
    #[serde(default, deserialize_with = "window")]
    pub window: Option<Duration>,
    /// Buckets of a time window (default 10).
    pub buckets: Option<u32>,
    /// Calls in the window before it may trip.
    pub min_calls: Option<u64>,
    /// Trip at this error ratio in (0, 1].
    pub error_ratio: Option<f64>,
    /// Trip at this many errors in the window.
    pub error_count: Option<u64>,
    /// Trip at this ratio of slow calls in (0, 1].
    pub slow_ratio: Option<f64>,
    /// A call slower than this is slow.
    #[serde(default, deserialize_with = "window")]
    pub slow_call: Option<Duration>,
    /// Open this long after tripping.
    #[serde(default, deserialize_with = "window")]
    pub open_for: Option<Duration>,
    /// Multiply the open period by this on each consecutive trip (≥ 1).
    pub open_backoff: Option<f64>,
    /// Longest open period (default: the larger of the preset's and `open_for`).
    #[serde(default, deserialize_with = "window")]
    pub max_open: Option<Duration>,
    /// Probe calls admitted at once when half-open.
    pub max_probes: Option<u32>,
    /// Successful probes that close the breaker.
    pub successes_to_close: Option<u32>,
    /// A probe that has not reported after this counts as failed.
    #[serde(default, deserialize_with = "window")]
    pub probe_timeout: Option<Duration>,
    /// After closing, admit a share of calls growing over this period.
    #[serde(default, deserialize_with = "window")]
    pub slow_start: Option<Duration>,
    /// Evaluate and count, never block.
    #[serde(default)]
    pub shadow: bool,
}

impl BreakerRule {
    /// The weir-core configuration: the preset with this rule's fields applied.
    pub fn config(&self) -> weir_core::breaker::BreakerConfig {
        use weir_core::breaker::{BreakerConfig, Window};
        let mut c = match self.preset.unwrap_or(BreakerPreset::Resilience4j) {
            BreakerPreset::Hystrix => BreakerConfig::hystrix(),
            BreakerPreset::Sentinel => BreakerConfig::sentinel(),
            BreakerPreset::Resilience4j => BreakerConfig::resilience4j(),
        };
        if let Some(n) = self.window_calls {
            c.window = Window::Count(n);
        }
        if let Some(length) = self.window {
            c.window = Window::Time {
                length,
                buckets: self.buckets.unwrap_or(10),
            };
        } else if let (Some(b), Window::Time { length, .. }) = (self.buckets, c.window) {
            c.window = Window::Time { length, buckets: b };
        }
        if self.error_ratio.is_some() {
            c.error_ratio = self.error_ratio;
        }
        if self.error_count.is_some() {
            c.error_count = self.error_count;
        }
        if self.slow_ratio.is_some() {
            c.slow_ratio = self.slow_ratio;
        }
        // The preset's minimum is capped at a count window's size (as Resilience4j does), so a
        // window of 20 calls trips after 20 calls; an explicit min_calls above it is an error.
        c.min_calls = match (self.min_calls, c.window) {
            (Some(n), _) => n,
            (None, Window::Count(n)) => c.min_calls.min(u64::from(n)),
            (None, _) => c.min_calls,
        };
        c.slow_call = self.slow_call.unwrap_or(c.slow_call);
        if let Some(d) = self.open_for {
            c.open_duration = d;
            c.max_open = c.max_open.max(d);
        }
        c.open_backoff = self.open_backoff.unwrap_or(c.open_backoff);
        c.max_open = self.max_open.unwrap_or(c.max_open);
        c.max_probes = self.max_probes.unwrap_or(c.max_probes);
        c.successes_to_close = self.successes_to_close.unwrap_or(c.successes_to_close);
        c.probe_timeout = self.probe_timeout.unwrap_or(c.probe_timeout);
        c.slow_start = self.slow_start.unwrap_or(c.slow_start);
        c
    }
}

/// Rules on all inbound traffic together (Sentinel's system rules; BBR and adaptive
/// concurrency from the overload module). Each part is optional; block ids are
/// `system:max_qps`, `system:max_in_flight`, `system:max_avg_rt`, `system:max_cpu`,
/// `system:bbr`, `system:adaptive`.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SystemRule {
    /// Inbound calls per second over all resources.
    pub max_qps: Option<u64>,
    /// Inbound calls in flight over all resources.
    pub max_in_flight: Option<u64>,
    /// Block while the average response time of the last second is above this.
    #[serde(default, deserialize_with = "window")]
    pub max_avg_rt: Option<Duration>,
    /// Block while the CPU usage in [0, 1] is at or above this (a plain threshold; `bbr`
    /// is the better tool).
    pub max_cpu: Option<f64>,
    /// BBR shedding (kratos): CPU-gated Little's-law limit.
    pub bbr: Option<BbrRule>,
    /// Adaptive concurrency limit.
    pub adaptive: Option<AdaptiveRule>,
    /// Evaluate and count, never block.
    #[serde(default)]
    pub shadow: bool,
}

/// BBR parameters (defaults: kratos's).
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct BbrRule {
    /// CPU usage in [0, 1] at which shedding may start (default 0.8).
    pub cpu_threshold: Option<f64>,
    /// Statistics window (default 10s).
    #[serde(default, deserialize_with = "window")]
    pub window: Option<Duration>,
    /// Buckets in the window (default 100).
    pub buckets: Option<u32>,
    /// Keep shedding this long after a drop (default 1s).
    #[serde(default, deserialize_with = "window")]
    pub cooldown: Option<Duration>,
}

/// Limit algorithm of an adaptive concurrency rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AdaptiveAlgorithm {
    /// Netflix Gradient2.
    #[default]
    Gradient2,
    /// TCP Vegas.
    Vegas,
    /// Additive increase, multiplicative decrease.
    Aimd,
}

/// An adaptive concurrency limit (Netflix concurrency-limits defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveRule {
    /// The estimator.
    #[serde(default)]
    pub algorithm: AdaptiveAlgorithm,
    /// Smallest limit (Gradient2, AIMD).
    pub min: Option<u64>,
    /// Largest limit.
    pub max: Option<u64>,
}

/// How HTTP requests map to resources, for weir-tower's `RulesLayer` and `weir proxy`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Proxies (CIDR blocks) whose `X-Forwarded-For` is believed, read right to left.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// Request header naming the caller (the origin of authority and per-origin rules).
    pub origin_header: Option<String>,
    /// Routes, first match wins; a request matching none is not limited.
    #[serde(default)]
    pub routes: Vec<Route>,
}

/// One route: which requests belong to a resource and which parameters they carry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The resource (declared under `resources`).
    pub resource: String,
    /// Path prefix (default `/`).
    #[serde(default = "root")]
    pub prefix: String,
    /// Methods (default: any).
    #[serde(default)]
    pub methods: Vec<String>,
    /// Headers that must be present with these values (`"*"`: any value).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The call's parameters, by position (what hot-parameter rules index).
    #[serde(default)]
    pub params: Vec<Param>,
    /// What a blocked request gets instead of the block's status (degradation).
    pub fallback: Option<Fallback>,
}

/// Largest fallback body (inline or from a file).
pub const MAX_FALLBACK_BYTES: usize = 1 << 20;

/// A route's answer to blocked requests: a configured response (`status`, `headers`, and
/// `body` inline or `body_file`, read when the rules are loaded), or, in `weir proxy`, the
/// request forwarded to a fallback `upstream` (a static or cached version of the service).
/// Rate-limit headers (`Retry-After`, `RateLimit-*`) are still added when the block was a
/// rate limit.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fallback {
    /// Block kinds it answers (`flow`, `hot_param`, `authority`, `breaker`, `system`,
    /// `switch`); empty or absent: every kind.
    #[serde(default)]
    pub on: Vec<String>,
    /// The status (default 200).
    #[serde(default = "ok_status")]
    pub status: u16,
    /// Headers of the response.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The body, inline.
    pub body: Option<String>,
    /// The body, from this file (relative to the rule file's directory), at most 1 MiB.
    pub body_file: Option<String>,
    /// `http://HOST:PORT` to forward blocked requests to instead (`weir proxy` only).
    pub upstream: Option<String>,
    /// `body_file`'s contents, read by [`RuleSet::from_yaml`].
    #[serde(skip)]
    pub loaded: Option<std::sync::Arc<[u8]>>,
}

fn ok_status() -> u16 {
    200
}

impl Fallback {
    /// Whether it answers blocks of `kind`.
    pub fn covers(&self, kind: &str) -> bool {
        self.on.is_empty() || self.on.iter().any(|k| k == kind)
    }

    /// The body to send: the file's contents, else the inline body, else nothing.
    pub fn body_bytes(&self) -> &[u8] {
        match (&self.loaded, &self.body) {
            (Some(b), _) => b,
            (None, Some(b)) => b.as_bytes(),
            (None, None) => &[],
        }
    }
}

fn root() -> String {
    "/".to_string()
}

/// A request parameter. In YAML: `client_ip`, `method`, `path` or `{header: NAME}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// The client address (trusted proxies applied).
    ClientIp,
    /// The method.
    Method,
    /// The path.
    Path,
    /// A header's value.
    Header(String),
}

impl<'de> Deserialize<'de> for Param {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str = "client_ip, method, path or {header: NAME}";
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Param;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Param, E> {
                match s {
                    "client_ip" => Ok(Param::ClientIp),
                    "method" => Ok(Param::Method),
                    "path" => Ok(Param::Path),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(s), &EXPECTED)),
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Param, A::Error> {
                let key: String = m
                    .next_key()?
                    .ok_or_else(|| serde::de::Error::invalid_length(0, &EXPECTED))?;
                if key != "header" {
                    return Err(serde::de::Error::unknown_field(&key, &["header"]));
                }
                let name: String = m.next_value()?;
                if m.next_key::<String>()?.is_some() {
                    return Err(serde::de::Error::invalid_length(2, &EXPECTED));
                }
                Ok(Param::Header(name))
            }
        }
        d.deserialize_any(V)
    }
}

fn window<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    s.map(|s| {
        parse_duration(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{s:?}: expected a positive duration like 500ms, 1s, 5m, 1h or 1d"
            ))
        })
    })
    .transpose()
}

/// A positive duration in Weir's one grammar ([`weir_core::duration`]: `500ms`, `1.5s`, `5m`,
/// `1h`, `1d`), as configuration files take it.
pub fn parse_duration(s: &str) -> Option<Duration> {
    weir_core::duration::parse(s).ok().filter(|d| !d.is_zero())
}

/// Longest resource name (bytes): names become metric labels, dashboard rows and, for
/// cluster rules, lease-server resources (which bound names the same).
pub const MAX_NAME_BYTES: usize = 256;

impl RuleSet {
    /// Parses and validates a YAML rule set. A file that is not of the right shape reports
    /// every field of the wrong type or with an impossible value ([`yaml::parse_all`]); a
    /// file that parses reports every rule that breaks a constraint, each located at its
    /// field.
    pub fn from_yaml(file: &Path, text: &str) -> Result<Self, LocatedErrors> {
        let mut set: RuleSet = yaml::parse_checked(file, text, |set: &RuleSet, whole| {
            set.problems_with(whole != yaml::Completeness::ElementsSetAside)
        })?;
        let problems = set.load_fallback_bodies(file);
        yaml::located(file, text, problems).map_or(Ok(set), Err)
    }

    /// Reads every route's `fallback.body_file` (relative to `file`'s directory, at most
    /// [`MAX_FALLBACK_BYTES`]); the problems as (field path, reason).
    fn load_fallback_bodies(&mut self, file: &Path) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let dir = file.parent().unwrap_or(Path::new("."));
        let routes = self.http.iter_mut().flat_map(|h| h.routes.iter_mut());
        for (i, r) in routes.enumerate() {
            let Some(f) = r.fallback.as_mut() else {
                continue;
            };
            let Some(name) = &f.body_file else { continue };
            let path = dir.join(name);
            let at = format!("http.routes[{i}].fallback.body_file");
            match std::fs::read(&path) {
                Ok(b) if b.len() <= MAX_FALLBACK_BYTES => f.loaded = Some(b.into()),
                Ok(b) => out.push((
                    at,
                    format!(
                        "{}: {} bytes, at most {MAX_FALLBACK_BYTES}",
                        path.display(),
                        b.len()
                    ),
                )),
                Err(e) => out.push((at, format!("{}: {e}", path.display()))),
            }
        }
        out
    }

    /// Checks what the types cannot (see [`RuleSet::problems`]); answers the first problem as
    /// (field path, reason).
    pub fn validate(&self) -> Result<(), (String, String)> {
        match self.problems().into_iter().next() {
            Some(p) => Err(p),
            None => Ok(()),
        }
    }

    /// Every constraint the types cannot express that this set breaks, as (field path,
    /// reason): unique names and ids, exactly one of `qps` / `concurrency`, at most one
    /// concurrency rule per resource, non-zero thresholds, ratios in [0, 1], options that fit
    /// the behaviour, declared resources in `relate` and routes, valid CIDR blocks, header
    /// names and route prefixes.
    pub fn problems(&self) -> Vec<(String, String)> {
        self.problems_with(true)
    }

    /// [`RuleSet::problems`]; without `references`, a part naming a resource not declared is
    /// not a problem (the set lacks parts that had errors: [`yaml::Completeness`]).
    fn problems_with(&self, references: bool) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut fail = |path: String, reason: &str| out.push((path, reason.to_string()));
        let mut names = std::collections::HashSet::new();
        for (i, r) in self.resources.iter().enumerate() {
            if r.name.is_empty() || !names.insert(r.name.as_str()) {
                fail(
                    format!("resources[{i}].name"),
                    &format!("resource name {:?} empty or duplicated", r.name),
                );
            } else if r.name.len() > MAX_NAME_BYTES {
                fail(
                    format!("resources[{i}].name"),
                    &format!("longer than {MAX_NAME_BYTES} bytes"),
                );
            }
        }
        let mut ids = std::collections::HashSet::new();
        let mut id = |path: String, id: &str, fail: &mut dyn FnMut(String, &str)| {
            if id.is_empty() {
                fail(path, "id must not be empty");
            } else if !ids.insert(id.to_string()) {
                fail(path, &format!("duplicate rule id {id:?}"));
            }
        };
        for (i, r) in self.resources.iter().enumerate() {
            let at = format!("resources[{i}]");
            let mut concurrency = 0;
            for (j, f) in r.flow.iter().enumerate() {
                let p = format!("{at}.flow[{j}]");
                id(format!("{p}.id"), &f.id, &mut fail);
                match (f.qps, f.concurrency, &f.cluster) {
                    (Some(0), _, _) => fail(format!("{p}.qps"), "must be ≥ 1"),
                    (_, Some(0), _) => fail(format!("{p}.concurrency"), "must be ≥ 1"),
                    (Some(_), None, None) => {}
                    (None, Some(_), None) => concurrency += 1,
                    (None, None, Some(c)) => {
                        if c.resource.is_empty() {
                            fail(format!("{p}.cluster.resource"), "must not be empty");
                        }
                        if !(c.safe.is_finite() && c.safe > 0.0) {
                            fail(
                                format!("{p}.cluster.safe"),
                                &format!(
                                    "must be a rate > 0 (never 0 by accident), got {}",
                                    c.safe
                                ),
                            );
                        }
                        if f.origin.is_some()
                            || f.relate.is_some()
                            || f.behavior != Behavior::Reject
                            || f.window.is_some()
                            || f.algorithm.is_some()
                        {
                            fail(
                                format!("{p}.cluster"),
                                "a cluster rule takes no origin, relate, behavior, window or algorithm",
                            );
                        }
                    }
                    _ => fail(p.clone(), "give exactly one of qps, concurrency or cluster"),
                }
                if f.burst == Some(0) {
                    fail(format!("{p}.burst"), "burst must be ≥ 1");
                }
                validate_flow_cost(f, &p, &mut fail);
                validate_flow(f, &p, &r.name, references.then_some(&names), &mut fail);
            }
            if concurrency > 1 {
                fail(
                    format!("{at}.flow"),
                    "at most one concurrency rule per resource",
                );
            }
            for (j, h) in r.hot_params.iter().enumerate() {
                let p = format!("{at}.hot_params[{j}]");
                id(format!("{p}.id"), &h.id, &mut fail);
                validate_hot(h, &p, &mut fail);
            }
            for (j, b) in r.budgets.iter().enumerate() {
                let p = format!("{at}.budgets[{j}]");
                id(format!("{p}.id"), &b.id, &mut fail);
                validate_budget(b, &p, &mut fail);
            }
            validate_cost_sources(r, &at, &mut fail);
            if let Some(a) = &r.authority {
                id(format!("{at}.authority.id"), &a.id, &mut fail);
                if a.allow.is_empty() == a.deny.is_empty() {
                    fail(
                        format!("{at}.authority"),
                        "give exactly one of allow or deny",
                    );
                }
            }
            if let Some(sw) = &r.switch {
                id(format!("{at}.switch.id"), &sw.id, &mut fail);
            }
            if let Some(b) = &r.breaker {
                id(format!("{at}.breaker.id"), &b.id, &mut fail);
                if b.window.is_some() && b.window_calls.is_some() {
                    fail(
                        format!("{at}.breaker"),
                        "give window (time) or window_calls (count), not both",
                    );
                }
                let mut field_ok = true;
                for (field, v) in [("error_ratio", b.error_ratio), ("slow_ratio", b.slow_ratio)] {
                    if let Some(v) = v.filter(|v| !(*v > 0.0 && *v <= 1.0)) {
                        fail(
                            format!("{at}.breaker.{field}"),
                            &format!("must be in (0, 1], got {v}"),
                        );
                        field_ok = false;
                    }
                }
                // What only the whole configuration shows (the preset's values included).
                if let (true, Err(e)) = (field_ok, b.config().validate()) {
                    let e = e.to_string();
                    fail(
                        format!("{at}.breaker"),
                        e.strip_prefix("breaker: ").unwrap_or(&e),
                    );
                }
            }
        }
        if let Some(s) = &self.system {
            validate_system(s, &mut fail);
        }
        if let Some(h) = &self.http {
            validate_http(h, references.then_some(&names), &mut fail);
        }
        out
    }
}

fn validate_flow(
    f: &FlowRule,
    p: &str,
    resource: &str,
    names: Option<&std::collections::HashSet<&str>>,
    out: &mut dyn FnMut(String, &str),
) {
    let mut fail = |field: &str, reason: &str| out(format!("{p}.{field}"), reason);
    let paced = matches!(f.behavior, Behavior::Pace | Behavior::WarmUpPace);
    let warm = matches!(f.behavior, Behavior::WarmUp | Behavior::WarmUpPace);
    if f.behavior != Behavior::Reject {
        if f.qps.is_none() {
            fail("behavior", "pace and warm-up need qps");
        }
        if f.algorithm.is_some() || f.burst.is_some() {
            fail(
                "behavior",
                "algorithm and burst apply to behavior reject only",
            );
        }
    }
    if f.max_wait.is_some() && !paced {
        fail("max_wait", "applies to behavior pace or warm_up_pace");
    }
    if (f.warmup.is_some() || f.cold_factor.is_some()) && !warm {
        fail(
            "warmup",
            "warmup and cold_factor apply to behavior warm_up or warm_up_pace",
        );
    }
    if f.cold_factor.is_some_and(|c| c < 2) {
        fail("cold_factor", "must be ≥ 2");
    }
    if f.origin.as_deref() == Some("") {
        fail("origin", "must not be empty");
    }
    if let Some(other) = &f.relate {
        if names.is_some_and(|n| !n.contains(other.as_str())) || other == resource {
            fail(
                "relate",
                &format!("{other:?} must be another resource declared under resources"),
            );
        }
        if f.qps.is_none() || f.behavior != Behavior::Reject || f.origin.is_some() {
            fail("relate", "relate needs qps, behavior reject and no origin");
        }
        if f.window.is_some_and(|w| w != Duration::from_secs(1)) {
            fail(
                "window",
                "relate rules count the last second: window must be 1s",
            );
        }
    }
}

/// A calendar budget's numbers, resets and cost.
fn validate_budget(b: &BudgetRule, p: &str, fail: &mut dyn FnMut(String, &str)) {
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

/// A hot-parameter rule's numbers and cost.
fn validate_hot(h: &HotParamRule, p: &str, fail: &mut dyn FnMut(String, &str)) {
    if h.threshold == 0 {
        fail(format!("{p}.threshold"), "must be ≥ 1");
    }
    for (value, n) in &h.exceptions {
        if *n == 0 {
            fail(format!("{p}.exceptions.{value}"), "must be ≥ 1");
        }
    }
    if h.max_values == 0 {
        fail(format!("{p}.max_values"), "max_values must be ≥ 1");
    }
    if h.burst == Some(0) {
        fail(format!("{p}.burst"), "burst must be ≥ 1");
    }
    if let Some(c) = &h.cost {
        validate_cost(c, Some(h.algorithm), &format!("{p}.cost"), fail);
    }
    if h.shared && !h.exceptions.is_empty() {
        fail(
            format!("{p}.shared"),
            "a shared rule takes no exceptions (one limit for every value)",
        );
    }
}

/// A flow rule's `cost` and `shared`: each on a rule that can count them.
fn validate_flow_cost(f: &FlowRule, p: &str, fail: &mut dyn FnMut(String, &str)) {
    if let Some(c) = &f.cost {
        let rate = f.qps.is_some() || f.cluster.is_some();
        if !rate || f.relate.is_some() || f.behavior != Behavior::Reject {
            fail(
                format!("{p}.cost"),
                "cost needs qps (or cluster), behavior reject and no relate",
            );
        }
        // A cluster rule's lease is a GCRA.
        let algorithm = match f.cluster {
            Some(_) => Some(RateAlgorithm::Gcra),
            None => f.algorithm,
        };
        validate_cost(c, algorithm, &format!("{p}.cost"), fail);
    }
    let plain_rate = f.qps.is_some() && f.relate.is_none() && f.behavior == Behavior::Reject;
    if f.shared && !plain_rate {
        fail(
            format!("{p}.shared"),
            "a shared rule needs qps, behavior reject and no relate",
        );
    }
}

/// The `cost:` rules of `r` with where each is found (`resources[i].flow[j].cost`, …).
fn cost_rules<'a>(r: &'a ResourceConfig, at: &str) -> Vec<(String, &'a CostRule)> {
    let flows = r.flow.iter().enumerate().filter_map(|(j, f)| {
        f.cost
            .as_deref()
            .map(|c| (format!("{at}.flow[{j}].cost"), c))
    });
    let hot = r.hot_params.iter().enumerate().filter_map(|(j, h)| {
        h.cost
            .as_deref()
            .map(|c| (format!("{at}.hot_params[{j}].cost"), c))
    });
    let budgets = r.budgets.iter().enumerate().filter_map(|(j, b)| {
        b.cost
            .as_deref()
            .map(|c| (format!("{at}.budgets[{j}].cost"), c))
    });
    flows.chain(hot).chain(budgets).collect()
}

impl ResourceConfig {
    /// Whether any of its `cost:` rules learns its estimate (`estimate: learned`).
    pub fn learns_costs(&self) -> bool {
        cost_rules(self, "").iter().any(|(_, c)| c.learns())
    }

    /// Where HTTP calls to this resource state their costs: the first `estimate_from` and
    /// `actual_from` among its `cost:` rules (a valid set states at most one of each).
    pub fn cost_sources(&self) -> CostSources {
        let rules = cost_rules(self, "");
        CostSources {
            estimate: rules.iter().find_map(|(_, c)| c.estimate_from.clone()),
            actual: rules.iter().find_map(|(_, c)| c.actual_from.clone()),
        }
    }
}

/// The cost sources of a resource's `cost:` rules: valid header names and JSON paths, and one
/// of each per resource (an HTTP call states one estimate and one actual cost).
fn validate_cost_sources(r: &ResourceConfig, at: &str, fail: &mut dyn FnMut(String, &str)) {
    let rules = cost_rules(r, at);
    let mut estimate: Option<&EstimateFrom> = None;
    let mut actual: Option<&ActualFrom> = None;
    for (p, c) in &rules {
        if let Some(e) = &c.estimate_from {
            let (name, ok) = match e {
                EstimateFrom::Header(h) => (h, is_header_name(h)),
                EstimateFrom::Json(j) => (j, is_json_path(j)),
            };
            if !ok {
                fail(
                    format!("{p}.estimate_from"),
                    &format!("{name:?} is not a header name or dotted JSON field"),
                );
            }
            match estimate {
                Some(first) if first != e => fail(
                    format!("{p}.estimate_from"),
                    "the cost rules of one resource read the same estimate_from",
                ),
                _ => estimate = Some(e),
            }
        }
        if let Some(a) = &c.actual_from {
            let (name, ok) = match a {
                ActualFrom::Header(h) | ActualFrom::Trailer(h) => (h, is_header_name(h)),
                ActualFrom::Json(j) | ActualFrom::Sse(j) => (j, is_json_path(j)),
            };
            if !ok {
                fail(
                    format!("{p}.actual_from"),
                    &format!("{name:?} is not a header name or dotted JSON field"),
                );
            }
            match actual {
                Some(first) if first != a => fail(
                    format!("{p}.actual_from"),
                    "the cost rules of one resource read the same actual_from",
                ),
                _ => actual = Some(a),
            }
        }
    }
}

/// A dotted path of JSON object keys (`usage.total_tokens`): no empty segment, at most 8.
fn is_json_path(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.split('.').count() <= 8
        && s.split('.').all(|k| !k.is_empty())
}

/// A rate rule's `cost`: an algorithm that settles, estimates and bounds ≥ 1.
fn validate_cost(
    c: &CostRule,
    algorithm: Option<RateAlgorithm>,
    p: &str,
    fail: &mut dyn FnMut(String, &str),
) {
    let settles = matches!(
        algorithm,
        Some(RateAlgorithm::Gcra | RateAlgorithm::TokenBucket | RateAlgorithm::FixedWindow)
    );
    if !settles {
        fail(
            p.to_string(),
            "cost needs algorithm gcra, token_bucket or fixed_window (the others cannot give back what they counted)",
        );
    }
    let estimate = match c.estimate {
        Estimate::Units(e) => e,
        Estimate::Learned => 1,
    };
    if estimate == 0 {
        fail(format!("{p}.estimate"), "must be ≥ 1");
    }
    if c.max.is_some_and(|m| m < estimate.max(1)) {
        fail(format!("{p}.max"), "must be ≥ 1 and ≥ estimate");
    }
    if c.min == Some(0) {
        fail(
            format!("{p}.min"),
            "must be ≥ 1 (an estimate of 0 holds nothing: a client could run any number of calls at once)",
        );
    }
    if let (Some(min), Some(max)) = (c.min, c.max) {
        if min > max {
            fail(format!("{p}.min"), "must be ≤ max");
        }
    }
}

fn validate_system(s: &SystemRule, out: &mut dyn FnMut(String, &str)) {
    let mut fail = |field: &str, reason: &str| out(format!("system.{field}"), reason);
    if s.max_qps == Some(0) {
        fail("max_qps", "must be ≥ 1");
    }
    if s.max_in_flight == Some(0) {
        fail("max_in_flight", "must be ≥ 1");
    }
    if s.max_cpu.is_some_and(|c| !(c > 0.0 && c <= 1.0)) {
        fail("max_cpu", "must be in (0, 1]");
    }
    if let Some(b) = &s.bbr {
        if b.cpu_threshold.is_some_and(|c| !(0.0..=1.0).contains(&c)) {
            fail("bbr.cpu_threshold", "must be in [0, 1]");
        }
        if b.buckets == Some(0) {
            fail("bbr.buckets", "must be ≥ 1");
        }
    }
    if let Some(a) = &s.adaptive {
        if a.max == Some(0) || a.min.zip(a.max).is_some_and(|(lo, hi)| lo > hi) {
            fail("adaptive", "need 1 ≤ max and min ≤ max");
        }
    }
}

/// A route's fallback: known kinds, a real status, header names and values, one body source,
/// an `http://HOST:PORT` upstream.
fn validate_fallback(f: &Fallback, p: &str, fail: &mut dyn FnMut(String, &str)) {
    const KINDS: [&str; 6] = [
        "flow",
        "hot_param",
        "authority",
        "breaker",
        "system",
        "switch",
    ];
    for (j, k) in f.on.iter().enumerate() {
        if !KINDS.contains(&k.as_str()) {
            fail(
                format!("{p}.on[{j}]"),
                &format!("{k:?} is not a block kind ({})", KINDS.join(", ")),
            );
        }
    }
    if !(100..=599).contains(&f.status) {
        fail(format!("{p}.status"), "must be 100..599");
    }
    for (name, value) in &f.headers {
        if !is_header_name(name) {
            fail(format!("{p}.headers.{name}"), "not a header name");
        } else if value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
            fail(
                format!("{p}.headers.{name}"),
                "control characters in the value",
            );
        }
    }
    let given = [
        f.body.is_some(),
        f.body_file.is_some(),
        f.upstream.is_some(),
    ];
    if given.iter().filter(|g| **g).count() > 1 {
        fail(
            p.to_string(),
            "give at most one of body, body_file and upstream",
        );
    }
    if f.body
        .as_ref()
        .is_some_and(|b| b.len() > MAX_FALLBACK_BYTES)
    {
        fail(format!("{p}.body"), "longer than 1 MiB");
    }
    if let Some(u) = &f.upstream {
        let ok = u
            .strip_prefix("http://")
            .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'));
        if !ok {
            fail(
                format!("{p}.upstream"),
                &format!("{u:?}: expected http://HOST:PORT"),
            );
        }
    }
}

/// RFC 9110 token characters (header names).
pub fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn validate_http(
    h: &HttpConfig,
    names: Option<&std::collections::HashSet<&str>>,
    fail: &mut dyn FnMut(String, &str),
) {
    for (i, c) in h.trusted_proxies.iter().enumerate() {
        if let Err(e) = crate::cidr::Cidr::parse(c) {
            fail(format!("http.trusted_proxies[{i}]"), &e);
        }
    }
    if let Some(o) = &h.origin_header {
        if !is_header_name(o) {
            fail(
                "http.origin_header".into(),
                &format!("{o:?} is not a header name"),
            );
        }
    }
    for (i, r) in h.routes.iter().enumerate() {
        let p = format!("http.routes[{i}]");
        if names.is_some_and(|n| !n.contains(r.resource.as_str())) {
            fail(
                format!("{p}.resource"),
                &format!("{:?} is not declared under resources", r.resource),
            );
        }
        if !r.prefix.starts_with('/') {
            fail(format!("{p}.prefix"), "must start with /");
        } else {
            // Requests are matched on their normal form: a prefix in another form matches
            // nothing.
            match crate::path::normalize(&r.prefix) {
                Ok(n) if n == r.prefix && !r.prefix.contains(';') => {}
                Ok(n) => fail(
                    format!("{p}.prefix"),
                    &format!(
                        "{:?} is not in normal form (requests are matched as {:?}; no `;`)",
                        r.prefix,
                        crate::path::match_path(&n)
                    ),
                ),
                Err(e) => fail(format!("{p}.prefix"), &e.to_string()),
            }
        }
        for (j, m) in r.methods.iter().enumerate() {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                fail(
                    format!("{p}.methods[{j}]"),
                    &format!("{m:?} is not a method (GET, POST …)"),
                );
            }
        }
        for name in r.headers.keys() {
            if !is_header_name(name) {
                fail(format!("{p}.headers.{name}"), "not a header name");
            }
        }
        if let Some(f) = &r.fallback {
            validate_fallback(f, &format!("{p}.fallback"), fail);
        }
        for (j, param) in r.params.iter().enumerate() {
            if let Param::Header(name) = param {
                if !is_header_name(name) {
                    fail(
                        format!("{p}.params[{j}].header"),
                        &format!("{name:?} is not a header name"),
                    );
                }
            }
        }
    }
}
