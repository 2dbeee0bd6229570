//! Typed configuration errors. Library code never panics on bad input; it returns these.

use thiserror::Error;

/// Why a limiter configuration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The limit (units per window) must be at least 1.
    #[error("limit must be at least 1")]
    ZeroLimit,
    /// The window must be longer than zero.
    #[error("window must be longer than zero")]
    ZeroWindow,
    /// The window does not fit the clock's 64-bit nanosecond range.
    #[error("window is too long (at most ~584 years)")]
    WindowTooLong,
    /// The burst must be at least 1.
    #[error("burst must be at least 1")]
    ZeroBurst,
    /// A value exceeds what the algorithm can represent.
    #[error("{what} is too large: {value} (at most {max})")]
    TooLarge {
        /// Which parameter.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The largest accepted value.
        max: u64,
    },
    /// The bucket count of a bucketed sliding window must be at least 1.
    #[error("buckets must be at least 1")]
    ZeroBuckets,
    /// The window is shorter than one nanosecond per bucket.
    #[error("window of {window_ns} ns cannot be split into {buckets} buckets")]
    WindowTooShortForBuckets {
        /// The window in nanoseconds.
        window_ns: u64,
        /// The bucket count asked for.
        buckets: u32,
    },
    /// The warm-up period must be longer than zero.
    #[error("warm-up period must be longer than zero")]
    ZeroWarmup,
    /// The cold factor of a warming-up bucket must be greater than 1.
    #[error("cold factor must be greater than 1, got {0}")]
    BadColdFactor(String),
    /// A keyed limiter needs room for at least one key.
    #[error("max_keys must be at least 1")]
    ZeroMaxKeys,
    /// A parameter is out of its range.
    #[error("{0}")]
    Invalid(String),
    /// A concurrency limiter needs at least one permit.
    #[error("max in-flight must be at least 1")]
    ZeroPermits,
}
