//! `cost:` on a rule: the estimate reserved on entry (fixed, learned or stated by the call),
//! where HTTP calls state their estimate and actual cost, and their checks.

use serde::Deserialize;
use weir_core::learned::Quantiles;

use super::fields::RateAlgorithm;

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

impl ActualFrom {
    /// What the source counts, by its name's last part: `input` (`prompt_tokens`,
    /// `input_tokens`), `output` (`completion_tokens`, `output_tokens`), else `total`.
    pub fn usage_kind(&self) -> &'static str {
        let name = match self {
            ActualFrom::Header(n)
            | ActualFrom::Trailer(n)
            | ActualFrom::Json(n)
            | ActualFrom::Sse(n) => n,
        };
        let last = name.rsplit('.').next().unwrap_or(name).to_ascii_lowercase();
        if last.contains("input") || last.contains("prompt") {
            "input"
        } else if last.contains("output") || last.contains("completion") {
            "output"
        } else {
            "total"
        }
    }
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

/// A rate rule's `cost`: an algorithm that settles, estimates and bounds ≥ 1.
pub(super) fn validate_cost(
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
