//! The HTTP mapping: trusted proxies, the origin header, routes from requests to resources
//! and their fallback responses, with their checks.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::fields::is_header_name;
use super::hot_param::Param;

/// How HTTP requests map to resources, for weir-tower's `RulesLayer` and `weir proxy`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Proxies (CIDR blocks) whose `X-Forwarded-For` is believed, read right to left.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// Request header naming the caller (the origin of authority and per-origin rules).
    pub origin_header: Option<String>,
    /// Routes, first match wins; a request matching none is not limited.
    #[serde(default)]
    pub routes: Vec<Route>,
}

/// One route: which requests belong to a resource and which parameters they carry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The resource (declared under `resources`).
    pub resource: String,
    /// Path prefix (default `/`).
    #[serde(default = "root")]
    pub prefix: String,
    /// Methods (default: any).
    #[serde(default)]
    pub methods: Vec<String>,
    /// Headers that must be present with these values (`"*"`: any value).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The call's parameters, by position (what hot-parameter rules index).
    #[serde(default)]
    pub params: Vec<Param>,
    /// What a blocked request gets instead of the block's status (degradation).
    pub fallback: Option<Fallback>,
}

/// Largest fallback body (inline or from a file).
pub const MAX_FALLBACK_BYTES: usize = 1 << 20;

/// A route's answer to blocked requests: a configured response (`status`, `headers`, and
/// `body` inline or `body_file`, read when the rules are loaded), or, in `weir proxy`, the
/// request forwarded to a fallback `upstream` (a static or cached version of the service).
/// Rate-limit headers (`Retry-After`, `RateLimit-*`) are still added when the block was a
/// rate limit.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fallback {
    /// Block kinds it answers (`flow`, `hot_param`, `authority`, `breaker`, `system`,
    /// `switch`); empty or absent: every kind.
    #[serde(default)]
    pub on: Vec<String>,
    /// The status (default 200).
    #[serde(default = "ok_status")]
    pub status: u16,
    /// Headers of the response.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The body, inline.
    pub body: Option<String>,
    /// The body, from this file (relative to the rule file's directory), at most 1 MiB.
    pub body_file: Option<String>,
    /// `http://HOST:PORT` to forward blocked requests to instead (`weir proxy` only).
    pub upstream: Option<String>,
    /// `body_file`'s contents, read by [`RuleSet::from_yaml`](super::RuleSet::from_yaml).
    #[serde(skip)]
    pub loaded: Option<std::sync::Arc<[u8]>>,
}

fn ok_status() -> u16 {
    200
}

impl Fallback {
    /// Whether it answers blocks of `kind`.
    pub fn covers(&self, kind: &str) -> bool {
        self.on.is_empty() || self.on.iter().any(|k| k == kind)
    }

    /// The body to send: the file's contents, else the inline body, else nothing.
    pub fn body_bytes(&self) -> &[u8] {
        match (&self.loaded, &self.body) {
            (Some(b), _) => b,
            (None, Some(b)) => b.as_bytes(),
            (None, None) => &[],
        }
    }
}

fn root() -> String {
    "/".to_string()
}

/// A route's fallback: known kinds, a real status, header names and values, one body source,
/// an `http://HOST:PORT` upstream.
fn validate_fallback(f: &Fallback, p: &str, fail: &mut dyn FnMut(String, &str)) {
    const KINDS: [&str; 6] = [
        "flow",
        "hot_param",
        "authority",
        "breaker",
        "system",
        "switch",
    ];
    for (j, k) in f.on.iter().enumerate() {
        if !KINDS.contains(&k.as_str()) {
            fail(
                format!("{p}.on[{j}]"),
                &format!("{k:?} is not a block kind ({})", KINDS.join(", ")),
            );
        }
    }
    if !(100..=599).contains(&f.status) {
        fail(format!("{p}.status"), "must be 100..599");
    }
    for (name, value) in &f.headers {
        if !is_header_name(name) {
            fail(format!("{p}.headers.{name}"), "not a header name");
        } else if value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
            fail(
                format!("{p}.headers.{name}"),
                "control characters in the value",
            );
        }
    }
    let given = [
        f.body.is_some(),
        f.body_file.is_some(),
        f.upstream.is_some(),
    ];
    if given.iter().filter(|g| **g).count() > 1 {
        fail(
            p.to_string(),
            "give at most one of body, body_file and upstream",
        );
    }
    if f.body
        .as_ref()
        .is_some_and(|b| b.len() > MAX_FALLBACK_BYTES)
    {
        fail(format!("{p}.body"), "longer than 1 MiB");
    }
    if let Some(u) = &f.upstream {
        let ok = u
            .strip_prefix("http://")
            .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'));
        if !ok {
            fail(
                format!("{p}.upstream"),
                &format!("{u:?}: expected http://HOST:PORT"),
            );
        }
    }
}

pub(super) fn validate_http(
    h: &HttpConfig,
    names: Option<&std::collections::HashSet<&str>>,
    fail: &mut dyn FnMut(String, &str),
) {
    for (i, c) in h.trusted_proxies.iter().enumerate() {
        if let Err(e) = crate::cidr::Cidr::parse(c) {
            fail(format!("http.trusted_proxies[{i}]"), &e.to_string());
        }
    }
    if let Some(o) = &h.origin_header {
        if !is_header_name(o) {
            fail(
                "http.origin_header".into(),
                &format!("{o:?} is not a header name"),
            );
        }
    }
    for (i, r) in h.routes.iter().enumerate() {
        let p = format!("http.routes[{i}]");
        if names.is_some_and(|n| !n.contains(r.resource.as_str())) {
            fail(
                format!("{p}.resource"),
                &format!("{:?} is not declared under resources", r.resource),
            );
        }
        if !r.prefix.starts_with('/') {
            fail(format!("{p}.prefix"), "must start with /");
        } else {
            // Requests are matched on their normal form: a prefix in another form matches
            // nothing.
            match crate::path::normalize(&r.prefix) {
                Ok(n) if n == r.prefix && !r.prefix.contains(';') => {}
                Ok(n) => fail(
                    format!("{p}.prefix"),
                    &format!(
                        "{:?} is not in normal form (requests are matched as {:?}; no `;`)",
                        r.prefix,
                        crate::path::match_path(&n)
                    ),
                ),
                Err(e) => fail(format!("{p}.prefix"), &e.to_string()),
            }
        }
        for (j, m) in r.methods.iter().enumerate() {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                fail(
                    format!("{p}.methods[{j}]"),
                    &format!("{m:?} is not a method (GET, POST …)"),
                );
            }
        }
        for name in r.headers.keys() {
            if !is_header_name(name) {
                fail(format!("{p}.headers.{name}"), "not a header name");
            }
        }
        if let Some(f) = &r.fallback {
            validate_fallback(f, &format!("{p}.fallback"), fail);
        }
        for (j, param) in r.params.iter().enumerate() {
            if let Param::Header(name) = param {
                if !is_header_name(name) {
                    fail(
                        format!("{p}.params[{j}].header"),
                        &format!("{name:?} is not a header name"),
                    );
                }
            }
        }
    }
}
