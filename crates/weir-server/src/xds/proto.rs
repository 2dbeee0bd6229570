//! envoyproxy/ratelimit's configuration resource as it travels over xDS:
//! `ratelimit.config.ratelimit.v3.RateLimitConfig` (`api/ratelimit/config/ratelimit/v3/rls_conf.proto`
//! of envoyproxy/ratelimit, the type go-control-plane serves), with that file's field
//! numbers. Decoded from the `Any` resources of a `DiscoveryResponse`.

/// The resource's type URL on the aggregated stream.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// One domain's rate-limit configuration.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitConfig {
    /// The resource's name (unique per configuration).
    #[prost(string, tag = "1")]
    pub name: String,
    /// The domain.
    #[prost(string, tag = "2")]
    pub domain: String,
    /// The descriptors.
    #[prost(message, repeated, tag = "3")]
    pub descriptors: Vec<RateLimitDescriptor>,
}

/// A descriptor node.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// Entry key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Entry value (empty: any value).
    #[prost(string, tag = "2")]
    pub value: String,
    /// The limit at this node.
    #[prost(message, optional, tag = "3")]
    pub rate_limit: Option<RateLimitPolicy>,
    /// Nested descriptors.
    #[prost(message, repeated, tag = "4")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Counted, always answered OK.
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    /// Metrics per request value.
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    /// Lyft's quota mode.
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
    /// Returned in the response's dynamic metadata when the descriptor passes.
    #[prost(message, optional, tag = "8")]
    pub metadata: Option<envoy_types::pb::google::protobuf::Struct>,
}

/// A limit.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitPolicy {
    /// `RateLimitUnit`: 1 second, 2 minute, 3 hour, 4 day, 5 month, 6 year, 7 week.
    #[prost(int32, tag = "1")]
    pub unit: i32,
    /// Requests per unit.
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    /// Answer OK without counting.
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    /// The limit's name (metrics, `replaces`).
    #[prost(string, tag = "4")]
    pub name: String,
    /// Limits this one replaces.
    #[prost(message, repeated, tag = "5")]
    pub replaces: Vec<RateLimitReplace>,
}

/// A replaced limit.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitReplace {
    /// Its name.
    #[prost(string, tag = "1")]
    pub name: String,
}

/// The YAML name of a `RateLimitUnit` value (`None`: not a unit).
pub fn unit_name(unit: i32) -> Option<&'static str> {
    Some(match unit {
        1 => "second",
        2 => "minute",
        3 => "hour",
        4 => "day",
        5 => "month",
        6 => "year",
        7 => "week",
        _ => return None,
    })
}
