//! Answers for refused requests: RFC 9457 problem details and rate-limit headers.

use std::time::Duration;

use http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use weir_core::Decision;

/// Whole seconds, rounded up (never down: a client told to retry early is refused again).
pub fn ceil_secs(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000_000)).unwrap_or(u64::MAX)
}

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The `RateLimit-Policy` value `"policy";q=LIMIT;w=WINDOW` (draft-ietf-httpapi-ratelimit-headers).
pub fn policy_value(policy: &str, limit: u64, window: Duration) -> Option<HeaderValue> {
    policy_text(policy, limit, window)
}

/// The `RateLimit` value `"policy";r=REMAINING;t=RESET` for `d`.
pub fn ratelimit_value(policy: &str, d: &Decision) -> Option<HeaderValue> {
    ratelimit_text(policy, d.remaining(), d.reset_after())
}

/// `"policy";q=LIMIT;w=WINDOW` from numbers (the window in whole seconds, rounded up, at
/// least 1): the one writer of Weir's `RateLimit-Policy`, for the tower layers and for the
/// headers `weir serve` asks Envoy to add.
pub fn policy_text(policy: &str, limit: u64, window: Duration) -> Option<HeaderValue> {
    value(policy, [(";q=", limit), (";w=", ceil_secs(window).max(1))])
}

/// `"policy";r=REMAINING;t=RESET` from numbers (the reset in whole seconds, rounded up).
pub fn ratelimit_text(policy: &str, remaining: u64, reset: Duration) -> Option<HeaderValue> {
    value(policy, [(";r=", remaining), (";t=", ceil_secs(reset))])
}

/// `"policy"` (a structured-field string: `"` and `\` escaped, characters that are not
/// printable ASCII left out) then each `(name, number)`: one allocation, no formatting
/// machinery.
fn value(policy: &str, params: [(&str, u64); 2]) -> Option<HeaderValue> {
    let mut out = Vec::with_capacity(policy.len() + 2 + 2 * (3 + 20));
    out.push(b'"');
    for b in policy.bytes() {
        match b {
            b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
            0x20..=0x7e => out.push(b),
            _ => {}
        }
    }
    out.push(b'"');
    for (name, n) in params {
        out.extend_from_slice(name.as_bytes());
        push_decimal(&mut out, n);
    }
    HeaderValue::from_maybe_shared(bytes::Bytes::from(out)).ok()
}

/// Appends `n` in decimal (no allocation: for writers of header values and framing).
pub fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Adds `RateLimit-Policy: "policy";q=LIMIT;w=WINDOW` and `RateLimit: "policy";r=R;t=T`
/// (draft-ietf-httpapi-ratelimit-headers) for `d`.
pub fn set_ratelimit_headers(h: &mut HeaderMap, policy: &str, window: Duration, d: &Decision) {
    if let Some(v) = policy_value(policy, d.limit(), window) {
        h.insert(RATELIMIT_POLICY, v);
    }
    set_ratelimit_now(h, policy, d);
}

/// Adds `RateLimit: "policy";r=R;t=T` for `d` (one allocation, no copy).
pub fn set_ratelimit_now(h: &mut HeaderMap, policy: &str, d: &Decision) {
    if let Some(v) = ratelimit_value(policy, d) {
        h.insert(RATELIMIT, v);
    }
}

/// The value of a `grpc-message` header: gRPC's percent-encoding (printable ASCII except `%`
/// as is, every other byte as `%XX`).
pub fn grpc_message(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_are_structured_field_strings() {
        let v = policy_text("a\"b\\c\u{e9}\n", 5, Duration::from_millis(1500)).unwrap();
        assert_eq!(v, "\"a\\\"b\\\\c\";q=5;w=2");
        let v = ratelimit_text("api", 0, Duration::from_millis(1)).unwrap();
        assert_eq!(v, "\"api\";r=0;t=1");
    }

    #[test]
    fn header_values_spell_every_number() {
        for (n, text) in [
            (0, "0"),
            (7, "7"),
            (10, "10"),
            (1_000_000, "1000000"),
            (u64::MAX, "18446744073709551615"),
        ] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, text.as_bytes());
        }
        let v = policy_value("api", 100, Duration::from_millis(1500)).unwrap();
        assert_eq!(v, "\"api\";q=100;w=2");
        let d = Decision::allow(5, 3, 200_000_000, 0);
        assert_eq!(ratelimit_value("api", &d).unwrap(), "\"api\";r=3;t=1");
    }
}
