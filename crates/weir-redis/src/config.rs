//! A [`crate::RedisLimiter`]'s options: timeout, fallback, probe, cache, clock.

use std::time::Duration;

/// What decides while Redis is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fallback {
    /// A local limiter with this instance's share of each limit (`limit / instances`).
    #[default]
    Local,
    /// Allow everything.
    FailOpen,
    /// Deny everything (retry after the probe interval).
    FailClosed,
}

impl Fallback {
    /// Stable name (`local`, `fail_open`, `fail_closed`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
        }
    }
}

/// Whose clock the scripts use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeSource {
    /// Redis `TIME`: one clock for every instance (default).
    #[default]
    Redis,
    /// This machine's wall clock (`SystemTime`), sent with each call.
    Caller,
}

/// Options of a [`RedisLimiter`](crate::RedisLimiter).
#[derive(Debug, Clone, Copy)]
pub struct RedisConfig {
    /// Per-call timeout (default 30 ms).
    pub timeout: Duration,
    /// What decides while Redis is unreachable (default: the local share).
    pub fallback: Fallback,
    /// How often the background probe pings an unreachable Redis (default 100 ms).
    pub probe_interval: Duration,
    /// Answer keys known to be over their limit locally until their retry time (default on).
    pub over_limit_cache: bool,
    /// Whose clock the scripts read (default Redis `TIME`).
    pub time: TimeSource,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(30),
            fallback: Fallback::Local,
            probe_interval: Duration::from_millis(100),
            over_limit_cache: true,
            time: TimeSource::Redis,
        }
    }
}
