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
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::yaml::{self, LocatedError};

/// A whole rule set.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RuleSet {
    /// The resources.
    #[serde(default)]
    pub resources: Vec<ResourceConfig>,
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
}

/// The rate algorithm of a flow or hot-parameter rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RateAlgorithm {
    /// Bucketed sliding window, 10 buckets (Sentinel's default model with finer buckets).
    #[default]
    SlidingWindow,
    /// Fixed window.
    FixedWindow,
    /// Exact sliding window.
    SlidingLog,
    /// Previous window weighted by overlap.
    SlidingCounter,
    /// GCRA (`burst`, default the threshold).
    Gcra,
    /// Token bucket (`burst`, default the threshold).
    TokenBucket,
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
    /// The algorithm of `qps`.
    #[serde(default)]
    pub algorithm: RateAlgorithm,
    /// Burst for GCRA / token bucket.
    pub burst: Option<u64>,
    /// Evaluate and count, never block.
    #[serde(default)]
    pub shadow: bool,
}

/// What a hot-parameter rule does when it tracks `max_values` values and a new one comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnFull {
    /// Forget the least recently active value (idle first); counted as an eviction.
    #[default]
    Evict,
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
    #[serde(default)]
    pub algorithm: RateAlgorithm,
    /// Values with their own threshold.
    #[serde(default)]
    pub exceptions: BTreeMap<String, u64>,
    /// Most values tracked at once (default 10 000).
    #[serde(default = "default_max_values")]
    pub max_values: usize,
    /// Behaviour at `max_values`.
    #[serde(default)]
    pub on_full: OnFull,
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

/// A circuit breaker on the resource (a preset, optionally adjusted).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerRule {
    /// Unique id.
    pub id: String,
    /// Defaults to start from (default: resilience4j).
    pub preset: Option<BreakerPreset>,
    /// Trip at this error ratio in [0, 1].
    pub error_ratio: Option<f64>,
    /// Calls in the window before it may trip.
    pub min_calls: Option<u64>,
    /// Open this long after tripping.
    #[serde(default, deserialize_with = "window")]
    pub open_for: Option<Duration>,
    /// Evaluate and count, never block.
    #[serde(default)]
    pub shadow: bool,
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

/// Parses `500ms`, `30s`, `5m`, `1h`, `1d` (positive).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(ms)
        .filter(|v| *v > 0)
        .map(Duration::from_millis)
}

impl RuleSet {
    /// Parses and validates a YAML rule set.
    pub fn from_yaml(file: &Path, text: &str) -> Result<Self, LocatedError> {
        let set: RuleSet = yaml::parse(file, text)?;
        set.validate().map_err(|(path, reason)| LocatedError {
            file: file.to_path_buf(),
            position: None,
            path,
            reason,
        })?;
        Ok(set)
    }

    /// Checks what the types cannot: unique names and ids, exactly one of `qps` /
    /// `concurrency`, at most one concurrency rule per resource, non-zero thresholds, ratios in
    /// [0, 1]. Answers (field path, reason).
    pub fn validate(&self) -> Result<(), (String, String)> {
        let mut names = std::collections::HashSet::new();
        let mut ids = std::collections::HashSet::new();
        let mut id = |path: String, id: &str| {
            if id.is_empty() {
                return Err((path, "id must not be empty".to_string()));
            }
            if !ids.insert(id.to_string()) {
                return Err((path, format!("duplicate rule id {id:?}")));
            }
            Ok(())
        };
        for (i, r) in self.resources.iter().enumerate() {
            let at = format!("resources[{i}]");
            if r.name.is_empty() || !names.insert(r.name.as_str()) {
                return Err((
                    format!("{at}.name"),
                    format!("resource name {:?} empty or duplicated", r.name),
                ));
            }
            let mut concurrency = 0;
            for (j, f) in r.flow.iter().enumerate() {
                let p = format!("{at}.flow[{j}]");
                id(format!("{p}.id"), &f.id)?;
                match (f.qps, f.concurrency) {
                    (Some(0), _) | (_, Some(0)) => {
                        return Err((p, "qps / concurrency must be ≥ 1".into()))
                    }
                    (Some(_), None) => {}
                    (None, Some(_)) => concurrency += 1,
                    _ => return Err((p, "give exactly one of qps or concurrency".into())),
                }
                if f.burst == Some(0) {
                    return Err((format!("{p}.burst"), "burst must be ≥ 1".into()));
                }
            }
            if concurrency > 1 {
                return Err((
                    format!("{at}.flow"),
                    "at most one concurrency rule per resource".into(),
                ));
            }
            for (j, h) in r.hot_params.iter().enumerate() {
                let p = format!("{at}.hot_params[{j}]");
                id(format!("{p}.id"), &h.id)?;
                if h.threshold == 0 || h.exceptions.values().any(|v| *v == 0) {
                    return Err((p, "thresholds must be ≥ 1".into()));
                }
                if h.max_values == 0 {
                    return Err((format!("{p}.max_values"), "max_values must be ≥ 1".into()));
                }
            }
            if let Some(a) = &r.authority {
                id(format!("{at}.authority.id"), &a.id)?;
                if a.allow.is_empty() == a.deny.is_empty() {
                    return Err((
                        format!("{at}.authority"),
                        "give exactly one of allow or deny".into(),
                    ));
                }
            }
            if let Some(b) = &r.breaker {
                id(format!("{at}.breaker.id"), &b.id)?;
                if b.error_ratio.is_some_and(|x| !(0.0..=1.0).contains(&x)) {
                    return Err((
                        format!("{at}.breaker.error_ratio"),
                        "must be in [0, 1]".into(),
                    ));
                }
            }
        }
        Ok(())
    }
}
