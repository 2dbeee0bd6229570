//! The system rule: process-wide limits (rate, in flight, response time, CPU) and the
//! adaptive ones (BBR, Gradient2, Vegas, AIMD).

use std::time::Duration;

use serde::Deserialize;

use super::fields::window;

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

pub(super) fn validate_system(s: &SystemRule, out: &mut dyn FnMut(String, &str)) {
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
