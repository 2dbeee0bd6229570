//! The lease API's HTTP/JSON messages, in one place for everything that speaks them: the
//! server (`weir serve --quota`, weir-server's `quota::api`), the lease client ([`crate::net`])
//! and a lease server's link to its parent ([`crate::net::ParentLink`]).
//!
//! - `POST /quota/v1/refresh`: a [`RefreshRequest`] (a client and its [`ResourceAsk`]s), answered
//!   by a [`RefreshResponse`] (one [`LeaseAnswer`] per ask, in order: a lease or why not).
//! - `POST /quota/v1/release`: a [`ReleaseRequest`] (204, no body).
//!
//! Lease ids travel as 16 hex digits ([`lease_id_text`], read back by [`parse_lease_id`]): JSON
//! numbers lose precision past 2^53 in many languages. Requests are read strictly (unknown
//! fields refused); answers leniently (a newer server may add fields). An answer is turned into
//! a [`Lease`] by one validation, [`LeaseAnswer::lease`], whoever reads it.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use weir_core::Nanos;

use crate::lease::Lease;

/// `POST /quota/v1/refresh`: what `client` asks of each resource.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefreshRequest {
    /// The caller's id (1 to 256 bytes, no control characters).
    pub client: String,
    /// One ask per resource (at most 1 000 per call).
    pub resources: Vec<ResourceAsk>,
}

/// One resource's ask in a refresh.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResourceAsk {
    /// The resource's name in the quota file.
    pub resource: String,
    /// Units per second it would use.
    pub wants: f64,
    /// What it holds now (a restarted server learns it).
    #[serde(default)]
    pub has: f64,
    /// What it uses on its own while no lease holds.
    #[serde(default)]
    pub safe: f64,
    /// The lease id it holds ([`lease_id_text`]; none or empty: a newcomer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// Its weight (default 1).
    #[serde(default = "one")]
    pub weight: f64,
    /// Its band (`CRITICAL_PLUS` … `SHEDDABLE`; default `CRITICAL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// Of `wants`, what is needed now (default: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<f64>,
    /// A lease server below: what it has granted its clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holds: Option<f64>,
    /// A lease server below in a failover group: its leader's term.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub term: u64,
    /// A lease server below: its demand in parts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<PartAsk>,
}

/// One part of a lease server below's demand.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartAsk {
    /// What the part wants, in all.
    pub wants: f64,
    /// What it needs (default: what it wants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<f64>,
    /// The sum of its clients' weights (default 1).
    #[serde(default = "one")]
    pub weight: f64,
    /// Its clients' band (default `CRITICAL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
}

/// The answer to a refresh: one entry per ask, in the order asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefreshResponse {
    /// The leases, or why not.
    pub leases: Vec<LeaseAnswer>,
}

/// One resource's answer: a lease (`granted` … `leaseId`) or an `error`. Written with its
/// fields in alphabetical order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseAnswer {
    /// Why no lease was given (the other fields absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Milliseconds until the grant lapses without a refresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<u64>,
    /// Units per second granted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted: Option<f64>,
    /// The table is learning (just started): it granted nothing new.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learning: Option<bool>,
    /// The lease's id, to present on the next refresh or release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// Milliseconds until the next refresh is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_in_ms: Option<u64>,
    /// The resource.
    #[serde(default)]
    pub resource: String,
    /// What to use once the lease has expired and the server cannot be reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_capacity: Option<f64>,
}

impl LeaseAnswer {
    /// The answer of a lease of `resource` given at `now`.
    pub fn granted(resource: &str, lease: &Lease, now: Nanos) -> Self {
        Self {
            error: None,
            expires_in_ms: Some(lease.expires_at.saturating_sub(now) / 1_000_000),
            granted: Some(lease.granted),
            learning: Some(lease.learning),
            lease_id: Some(lease_id_text(lease.lease_id)),
            refresh_in_ms: Some(u64::try_from(lease.refresh.as_millis()).unwrap_or(u64::MAX)),
            resource: resource.to_string(),
            safe_capacity: Some(lease.safe_capacity),
        }
    }

    /// The answer refusing `resource`, saying why.
    pub fn refused(resource: &str, error: String) -> Self {
        Self {
            error: Some(error),
            resource: resource.to_string(),
            ..Self::default()
        }
    }

    /// The lease this answer gives, read at `now`, with how long it lasts; `None` for a
    /// refusal or anything malformed: a grant or safe capacity that is not a finite number
    /// ≥ 0, a missing time or an unreadable lease id.
    pub fn lease(&self, now: Nanos) -> Option<(Lease, Duration)> {
        let number = |v: Option<f64>| v.filter(|g| g.is_finite() && *g >= 0.0);
        let expires_in = Duration::from_millis(self.expires_in_ms?);
        Some((
            Lease {
                granted: number(self.granted)?,
                expires_at: now.saturating_add(Nanos::try_from(expires_in.as_nanos()).ok()?),
                refresh: Duration::from_millis(self.refresh_in_ms?),
                safe_capacity: number(self.safe_capacity)?,
                learning: self.learning.unwrap_or(false),
                lease_id: parse_lease_id(self.lease_id.as_deref()?)?,
            },
            expires_in,
        ))
    }
}

/// `POST /quota/v1/release`: `client` gives its leases on `resources` back, each with the
/// lease id it holds (`lease_ids[i]` for `resources[i]`; missing: none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The caller's id.
    pub client: String,
    /// The resources given back.
    pub resources: Vec<String>,
    /// Their lease ids, in the same order.
    #[serde(default, rename = "leaseIds", skip_serializing_if = "Vec::is_empty")]
    pub lease_ids: Vec<String>,
}

/// A lease id as the HTTP API writes it: 16 hex digits.
pub fn lease_id_text(id: u64) -> String {
    format!("{id:016x}")
}

/// Reads what [`lease_id_text`] wrote (empty: 0, no lease); `None` for anything else.
pub fn parse_lease_id(text: &str) -> Option<u64> {
    match text {
        "" => Some(0),
        t if t.len() <= 16 => u64::from_str_radix(t, 16).ok(),
        _ => None,
    }
}

fn one() -> f64 {
    1.0
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_answer_reads_back_what_the_server_wrote_and_nothing_malformed() {
        let lease = Lease {
            granted: 120.5,
            expires_at: 31_000_000_000,
            refresh: Duration::from_secs(5),
            safe_capacity: 50.0,
            learning: true,
            lease_id: u64::MAX - 7,
        };
        let answer = LeaseAnswer::granted("search", &lease, 1_000_000_000);
        let text = serde_json::to_string(&answer).unwrap();
        // Alphabetical, as the API has always written it.
        assert_eq!(
            text,
            r#"{"expiresInMs":30000,"granted":120.5,"learning":true,"leaseId":"fffffffffffffff8","refreshInMs":5000,"resource":"search","safeCapacity":50.0}"#
        );
        let read: LeaseAnswer = serde_json::from_str(&text).unwrap();
        let (back, lasts) = read.lease(1_000_000_000).unwrap();
        assert_eq!(back, lease);
        assert_eq!(lasts, Duration::from_secs(30));

        let refused = LeaseAnswer::refused("other", "no such resource".into());
        assert_eq!(
            serde_json::to_string(&refused).unwrap(),
            r#"{"error":"no such resource","resource":"other"}"#
        );
        assert!(refused.lease(0).is_none());
        for bad in [
            r#"{"granted":-1,"expiresInMs":1,"refreshInMs":1,"safeCapacity":1,"leaseId":"1"}"#,
            r#"{"granted":1,"expiresInMs":1,"refreshInMs":1,"safeCapacity":1}"#,
            r#"{"granted":1,"expiresInMs":1,"refreshInMs":1,"safeCapacity":1,"leaseId":"xyz"}"#,
            r#"{"granted":1,"refreshInMs":1,"safeCapacity":1,"leaseId":"1"}"#,
            r#"{"granted":1,"expiresInMs":1,"safeCapacity":-2,"refreshInMs":1,"leaseId":"1"}"#,
        ] {
            let a: LeaseAnswer = serde_json::from_str(bad).unwrap();
            assert!(a.lease(0).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_request_writes_only_what_it_states_and_refuses_unknown_fields() {
        let ask = ResourceAsk {
            resource: "search".into(),
            wants: 10.0,
            has: 0.0,
            safe: 5.0,
            lease_id: Some(lease_id_text(1)),
            weight: 1.0,
            priority: Some("CRITICAL".into()),
            needs: None,
            holds: None,
            term: 0,
            parts: Vec::new(),
        };
        let request = RefreshRequest {
            client: "c".into(),
            resources: vec![ask],
        };
        let text = serde_json::to_string(&request).unwrap();
        assert!(!text.contains("holds") && !text.contains("parts") && !text.contains("term"));
        assert_eq!(
            serde_json::from_str::<RefreshRequest>(&text).unwrap(),
            request
        );
        let unknown = r#"{"client":"c","resources":[{"resource":"r","wants":1,"want":2}]}"#;
        let e = serde_json::from_str::<RefreshRequest>(unknown).unwrap_err();
        assert!(e.to_string().contains("want"), "{e}");
        assert_eq!(parse_lease_id(""), Some(0));
        assert_eq!(parse_lease_id(&lease_id_text(u64::MAX)), Some(u64::MAX));
        assert_eq!(parse_lease_id("10000000000000000"), None);
    }
}
