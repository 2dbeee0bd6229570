//! Answers for refused requests: RFC 9457 problem details and rate-limit headers.

use std::time::Duration;

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use weir_core::Decision;

/// Whole seconds, rounded up (never down: a client told to retry early is refused again).
pub fn ceil_secs(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000_000)).unwrap_or(u64::MAX)
}

/// The `RateLimit-Policy` value `"policy";q=LIMIT;w=WINDOW` (draft-ietf-httpapi-ratelimit-headers).
pub fn policy_value(policy: &str, limit: u64, window: Duration) -> Option<HeaderValue> {
    let text = format!("\"{policy}\";q={limit};w={}", ceil_secs(window).max(1));
    HeaderValue::from_maybe_shared(bytes::Bytes::from(text)).ok()
}

/// Adds `RateLimit-Policy: "policy";q=LIMIT;w=WINDOW` and `RateLimit: "policy";r=R;t=T`
/// (draft-ietf-httpapi-ratelimit-headers) for `d`.
pub fn set_ratelimit_headers(h: &mut HeaderMap, policy: &str, window: Duration, d: &Decision) {
    if let Some(v) = policy_value(policy, d.limit(), window) {
        h.insert("ratelimit-policy", v);
    }
    set_ratelimit_now(h, policy, d);
}

/// Adds `RateLimit: "policy";r=R;t=T` for `d` (one allocation, no copy).
pub fn set_ratelimit_now(h: &mut HeaderMap, policy: &str, d: &Decision) {
    let text = format!(
        "\"{policy}\";r={};t={}",
        d.remaining(),
        ceil_secs(d.reset_after())
    );
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(text)) {
        h.insert("ratelimit", v);
    }
}

/// A response with `status` and an `application/problem+json` body.
pub fn problem<B: From<String>>(status: StatusCode, detail: &str) -> Response<B> {
    let title = status.canonical_reason().unwrap_or("Error");
    let body = format!(
        r#"{{"type":"about:blank","title":"{title}","status":{},"detail":"{}"}}"#,
        status.as_u16(),
        detail.replace('\\', "\\\\").replace('"', "\\\"")
    );
    let mut r = Response::new(B::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    r
}

/// The 429 for a denied decision: problem body, `Retry-After` (seconds, rounded up; absent when
/// the request can never pass), and the rate-limit headers.
pub fn too_many<B: From<String>>(policy: &str, window: Duration, d: &Decision) -> Response<B> {
    let detail = match d.retry_after() {
        Some(r) => format!(
            "rate limit {policy} exceeded; retry in {} s",
            ceil_secs(r).max(1)
        ),
        None => format!("request larger than the rate limit {policy} allows at once"),
    };
    let mut r = problem(StatusCode::TOO_MANY_REQUESTS, &detail);
    if let Some(retry) = d.retry_after() {
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(ceil_secs(retry).max(1)),
        );
    }
    set_ratelimit_headers(r.headers_mut(), policy, window, d);
    r
}
