//! Flow rules: a rate (`qps` with its window, algorithm and burst), a concurrency limit or a
//! cluster lease, with the behaviours (reject, pace, warm-up), origins and related resources.

use std::time::Duration;

use serde::Deserialize;

use super::cost::validate_cost;
use super::cost::CostRule;
use super::fields::optional_algorithm;
use super::fields::window;
use super::fields::RateAlgorithm;

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

pub(super) fn validate_flow(
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

/// A flow rule's `cost` and `shared`: each on a rule that can count them.
pub(super) fn validate_flow_cost(f: &FlowRule, p: &str, fail: &mut dyn FnMut(String, &str)) {
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
