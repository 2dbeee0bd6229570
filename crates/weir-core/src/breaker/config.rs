//! Breaker configuration and the presets of the frameworks users migrate from.

use std::time::Duration;

use crate::error::ConfigError;

/// The sliding window outcomes are counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The last N calls.
    Count(u32),
    /// The calls completed in the last `length`, in `buckets` (lock-free).
    Time {
        /// Window length.
        length: Duration,
        /// Buckets.
        buckets: u32,
    },
}

/// Circuit breaker parameters. Build one from a preset and adjust fields.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// Where outcomes are counted.
    pub window: Window,
    /// Calls in the window before the breaker may trip.
    pub min_calls: u64,
    /// Trip when errors / calls ≥ this.
    pub error_ratio: Option<f64>,
    /// Trip when errors ≥ this.
    pub error_count: Option<u64>,
    /// Trip when slow calls / calls ≥ this.
    pub slow_ratio: Option<f64>,
    /// A call slower than this is slow (`Duration::MAX`: never).
    pub slow_call: Duration,
    /// First open period.
    pub open_duration: Duration,
    /// Open period multiplier for each consecutive trip (1 = constant).
    pub open_backoff: f64,
    /// Longest open period.
    pub max_open: Duration,
    /// Probe calls admitted at once in half-open.
    pub max_probes: u32,
    /// Successful probes needed to close.
    pub successes_to_close: u32,
    /// A probe that has not reported after this counts as failed.
    pub probe_timeout: Duration,
    /// After closing, admit a share of calls growing linearly over this (zero: all at once).
    pub slow_start: Duration,
}

impl BreakerConfig {
    /// Hystrix: 10 s window of 10 buckets, ≥ 20 requests, ≥ 50 % errors, 5 s open, one probe.
    pub fn hystrix() -> Self {
        Self {
            window: Window::Time {
                length: Duration::from_secs(10),
                buckets: 10,
            },
            min_calls: 20,
            error_ratio: Some(0.5),
            error_count: None,
            slow_ratio: None,
            slow_call: Duration::MAX,
            open_duration: Duration::from_secs(5),
            open_backoff: 1.0,
            max_open: Duration::from_secs(5),
            max_probes: 1,
            successes_to_close: 1,
            probe_timeout: Duration::from_secs(10),
            slow_start: Duration::ZERO,
        }
    }

    /// Sentinel's degrade rule: 1 s statistics, ≥ 5 requests, one probe (error ratio 50 % and a
    /// 10 s open period, Sentinel's values being per rule).
    pub fn sentinel() -> Self {
        Self {
            window: Window::Time {
                length: Duration::from_secs(1),
                buckets: 1,
            },
            min_calls: 5,
            error_ratio: Some(0.5),
            open_duration: Duration::from_secs(10),
            max_open: Duration::from_secs(10),
            ..Self::hystrix()
        }
    }

    /// Resilience4j: count window of 100, ≥ 100 calls, 50 % failures or 100 % calls slower than
    /// 60 s, 60 s open, 10 half-open calls (here: 10 probes, closing after 10 successes and
    /// re-opening on a failed one).
    pub fn resilience4j() -> Self {
        Self {
            window: Window::Count(100),
            min_calls: 100,
            error_ratio: Some(0.5),
            error_count: None,
            slow_ratio: Some(1.0),
            slow_call: Duration::from_secs(60),
            open_duration: Duration::from_secs(60),
            open_backoff: 1.0,
            max_open: Duration::from_secs(60),
            max_probes: 10,
            successes_to_close: 10,
            probe_timeout: Duration::from_secs(60),
            slow_start: Duration::ZERO,
        }
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(format!("breaker: {m}")));
        match self.window {
            Window::Count(0) => return bad("count window must hold at least 1 call"),
            Window::Count(n) if n > 1_000_000 => return bad("count window above 1 000 000 calls"),
            Window::Time { length, .. } if length.is_zero() => {
                return bad("time window must be longer than zero")
            }
            Window::Time { buckets: 0, .. } => return bad("time window needs at least 1 bucket"),
            _ => {}
        }
        for r in [self.error_ratio, self.slow_ratio].into_iter().flatten() {
            if !(r > 0.0 && r <= 1.0) {
                return bad("ratios must be in (0, 1]");
            }
        }
        if self.error_ratio.is_none() && self.error_count.is_none() && self.slow_ratio.is_none() {
            return bad("needs at least one of error_ratio, error_count, slow_ratio");
        }
        if self.open_duration.is_zero() || self.max_open < self.open_duration {
            return bad("needs 0 < open_duration ≤ max_open");
        }
        if !(self.open_backoff.is_finite() && self.open_backoff >= 1.0) {
            return bad("open_backoff must be ≥ 1");
        }
        if self.max_probes == 0 || self.successes_to_close == 0 {
            return bad("max_probes and successes_to_close must be at least 1");
        }
        if self.probe_timeout.is_zero() {
            return bad("probe_timeout must be longer than zero");
        }
        if let Window::Count(n) = self.window {
            if self.min_calls > u64::from(n) {
                return Err(ConfigError::Invalid(format!(
                    "breaker: min_calls {} is more than the window holds ({n} calls): it could never trip",
                    self.min_calls
                )));
            }
        }
        Ok(())
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self::hystrix()
    }
}
