//! Circuit-breaker rules: a preset or the breaker's own parameters, and their checks.

use std::time::Duration;

use serde::Deserialize;

use super::fields::window;

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

/// A breaker's window and ratios, then what only its whole configuration shows (the
/// preset's values included); `p` is its path.
pub(super) fn validate_breaker(b: &BreakerRule, p: &str, fail: &mut dyn FnMut(String, &str)) {
    if b.window.is_some() && b.window_calls.is_some() {
        fail(
            p.to_string(),
            "give window (time) or window_calls (count), not both",
        );
    }
    let mut field_ok = true;
    for (field, v) in [("error_ratio", b.error_ratio), ("slow_ratio", b.slow_ratio)] {
        if let Some(v) = v.filter(|v| !(*v > 0.0 && *v <= 1.0)) {
            fail(
                format!("{p}.{field}"),
                &format!("must be in (0, 1], got {v}"),
            );
            field_ok = false;
        }
    }
    if let (true, Err(e)) = (field_ok, b.config().validate()) {
        let e = e.to_string();
        fail(p.to_string(), e.strip_prefix("breaker: ").unwrap_or(&e));
    }
}
