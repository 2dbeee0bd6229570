//! Hot-parameter rules: a limit per value of a call's parameter, bounded in memory, and the
//! parameters a route reads (`Param`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::cost::validate_cost;
use super::cost::CostRule;
use super::fields::algorithm;
use super::fields::default_algorithm;
use super::fields::window;
use super::fields::RateAlgorithm;

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
    /// Counted per value in the store every instance shares (as [`FlowRule::shared`](super::FlowRule::shared)); takes
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

/// A hot-parameter rule's numbers and cost.
pub(super) fn validate_hot(h: &HotParamRule, p: &str, fail: &mut dyn FnMut(String, &str)) {
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
