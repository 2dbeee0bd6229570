//! The rate-limit service's request and answer, apart from any wire: what the gRPC and JSON
//! front ends decode into ([`Request`]) and encode from ([`Response`]), with the request
//! bounds and the rate-limit headers an answer asks Envoy to add.

use std::sync::Arc;
use std::time::Duration;

use super::config::Unit;

/// Request bounds: anything larger is INVALID_ARGUMENT, never unbounded work or memory.
pub const MAX_DESCRIPTORS: usize = 64;

/// Most entries per descriptor.
pub const MAX_ENTRIES: usize = 16;

/// Longest entry key or value in bytes.
pub const MAX_VALUE_BYTES: usize = 1_024;

/// Distinct per-request limit overrides remembered (each keeps its own counters).
pub const MAX_OVERRIDES: usize = 1_024;

/// A request, whatever protocol it came in.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The domain.
    pub domain: String,
    /// The descriptors.
    pub descriptors: Vec<RequestDescriptor>,
    /// Units per descriptor when the descriptor has none (0 = 1, as Envoy sends 0).
    pub hits_addend: u32,
}

/// One descriptor of a request.
#[derive(Debug, Clone, Default)]
pub struct RequestDescriptor {
    /// (key, value) entries.
    pub entries: Vec<(String, String)>,
    /// A limit given by the caller instead of the configured one.
    pub limit: Option<(u32, Unit)>,
    /// Units for this descriptor (0 = check only).
    pub hits_addend: Option<u64>,
    /// The units are given back, not taken (Envoy's `is_negative_hits`): see
    /// [`RequestDescriptor::settlement`].
    pub negative: bool,
}

/// The entry that marks a descriptor as a settlement: appended by Envoy's stream-end rate
/// limit actions (`generic_key: {descriptor_key: weir_cost, descriptor_value: settle}`), it
/// makes the descriptor's hits a charge taken whatever the limit; it is not matched.
pub const SETTLE_ENTRY: (&str, &str) = ("weir_cost", "settle");

impl RequestDescriptor {
    /// What the descriptor settles instead of asking: `Some(true)` gives its hits back
    /// (`negative`), `Some(false)` charges them whatever the limit (it ends with
    /// [`SETTLE_ENTRY`]: a cost known once the response ended); `None`: an ordinary ask.
    pub fn settlement(&self) -> Option<bool> {
        if self.negative {
            Some(true)
        } else {
            self.marked().then_some(false)
        }
    }

    pub(crate) fn marked(&self) -> bool {
        self.entries
            .last()
            .is_some_and(|(k, v)| k == SETTLE_ENTRY.0 && v == SETTLE_ENTRY.1)
    }

    /// The entries matched against the configuration ([`SETTLE_ENTRY`] left out).
    pub fn matched_entries(&self) -> &[(String, String)] {
        match self.marked() {
            true => &self.entries[..self.entries.len() - 1],
            false => &self.entries,
        }
    }
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    /// Over its limit (never in shadow mode).
    pub over_limit: bool,
    /// The limit applied; none when no limit matched.
    pub limit: Option<AppliedLimit>,
    /// Units left in the window: 0 whenever the limit was exceeded (shadow mode included),
    /// [`UNLIMITED_REMAINING`] for an `unlimited` descriptor, as Lyft's service reports.
    pub remaining: u64,
    /// Time until the limit is fully reset; for a fixed window (Lyft's algorithm) the time to
    /// the window's end.
    pub reset: Duration,
    /// Time until a denied request could pass (None = never).
    pub retry_after: Option<Duration>,
    /// The limit's window (the unit, or the `window` extension).
    pub window: Duration,
    /// The descriptor's rule is in quota mode (see [`Response::over_limit`]).
    pub quota_mode: bool,
}

/// `limit_remaining` of an `unlimited` descriptor: 2^32 − 1, what Lyft's service answers
/// (and Envoy passes on in `x-ratelimit-remaining`).
pub const UNLIMITED_REMAINING: u64 = u32::MAX as u64;

/// The limit a descriptor was held to.
#[derive(Debug, Clone, PartialEq)]
pub struct AppliedLimit {
    /// The YAML `name`, reported in `current_limit.name` (empty when absent, as Lyft's service
    /// does: Envoy appends a non-empty name to its `x-ratelimit-limit` header).
    pub name: Option<Arc<str>>,
    /// Names the limit in the IETF `RateLimit` headers: `name`, else the rule's id (empty for a
    /// request's limit override).
    pub policy: Arc<str>,
    /// Requests per unit, as reported to Envoy ([`super::config::RateLimit::reported`]: a `window` that is
    /// not a unit is scaled to the unit covering it).
    pub requests_per_unit: u64,
    /// The unit.
    pub unit: Unit,
    /// Units per window as enforced (the window is [`Status::window`]): what the `RateLimit`
    /// headers report.
    pub quota: u64,
}

/// The answer to a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// OVER_LIMIT: a descriptor not in quota mode is over its limit, or the request has
    /// quota-mode descriptors and every one of them is over (Lyft's rule).
    pub over_limit: bool,
    /// One status per request descriptor, in order.
    pub statuses: Vec<Status>,
    /// Lyft's response dynamic metadata (domain, descriptors, hits, and the `metadata` of the
    /// rules that passed), when [`super::options::EngineOptions::response_metadata`] is on.
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A request the service refuses (gRPC INVALID_ARGUMENT / HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// Which rate-limit headers `weir serve` asks Envoy to add to responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// None (Envoy's own `enable_x_ratelimit_headers` may still add draft-03 headers).
    #[default]
    None,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (draft-03, what Envoy's filter emits).
    Draft03,
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers), plus
    /// `Retry-After` when over the limit.
    Ietf,
}

impl Response {
    /// The headers of `style` for the most restrictive status (fewest units left, then the
    /// longest reset); times are whole seconds rounded up, never down.
    pub fn headers(&self, style: HeaderStyle) -> Vec<(String, String)> {
        if style == HeaderStyle::None {
            return Vec::new();
        }
        let Some(s) = self
            .statuses
            .iter()
            .filter(|s| s.limit.is_some())
            .min_by(|a, b| a.remaining.cmp(&b.remaining).then(b.reset.cmp(&a.reset)))
        else {
            return Vec::new();
        };
        let Some(AppliedLimit {
            policy: name,
            quota: limit,
            ..
        }) = &s.limit
        else {
            return Vec::new();
        };
        let secs = |d: Duration| d.as_nanos().div_ceil(1_000_000_000);
        match style {
            HeaderStyle::None => Vec::new(),
            HeaderStyle::Draft03 => vec![
                ("x-ratelimit-limit".into(), limit.to_string()),
                ("x-ratelimit-remaining".into(), s.remaining.to_string()),
                ("x-ratelimit-reset".into(), secs(s.reset).to_string()),
            ],
            HeaderStyle::Ietf => {
                // weir-tower's writer, as the tower layers and the proxy write them.
                let text = |v: Option<http::HeaderValue>| {
                    v.and_then(|v| v.to_str().ok().map(str::to_string))
                        .unwrap_or_default()
                };
                let mut h = vec![
                    (
                        "ratelimit-policy".into(),
                        text(weir_tower::problem::policy_text(name, *limit, s.window)),
                    ),
                    (
                        "ratelimit".into(),
                        text(weir_tower::problem::ratelimit_text(
                            name,
                            s.remaining,
                            s.reset,
                        )),
                    ),
                ];
                if s.over_limit {
                    if let Some(retry) = s.retry_after {
                        h.push(("retry-after".into(), secs(retry).max(1).to_string()));
                    }
                }
                h
            }
        }
    }
}
