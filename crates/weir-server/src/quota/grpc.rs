//! The cluster-quota lease API over gRPC (`crates/weir-quota/proto/weir/quota/v1/quota.proto`), on `weir
//! serve`'s gRPC port beside the rate-limit service: unary `Refresh` and `Release`, framed by
//! hand like `ShouldRateLimit` ([`crate::rls::grpc`]). The fields (a lease client's `needs`, a
//! server below's `holds`, `term` and `parts`) and answers are those of the HTTP/JSON API
//! ([`crate::quota::api`]); a server that is not the quota leader answers
//! `FAILED_PRECONDITION` with the leader in the metadata `weir-quota-leader-grpc` and
//! `weir-quota-leader-http`, or `UNAVAILABLE` while no leader is known.

use bytes::Bytes;
use http::{HeaderValue, Response};
use prost::Message;
use weir_core::Clock;
use weir_quota::proto::{
    Priority, RefreshRequest, RefreshResponse, ReleaseRequest, ReleaseResponse, ResourceAsk,
    ResourceLease,
};

use crate::grpc::frame::{ok, status, Code, GrpcBody};
use crate::quota::api::{checked, CallError, DecodedAsk, QuotaApi, ServerFields, WirePart};
use weir_quota::clients::Denied;

/// The `needs`, `holds`, `term` and `parts` of a gRPC ask (proto3's weight 0 is weight 1).
fn fields(r: &ResourceAsk) -> ServerFields {
    ServerFields {
        needs: r.needs,
        holds: r.holds,
        term: r.term,
        parts: r
            .parts
            .iter()
            .map(|p| WirePart {
                wants: p.wants,
                needs: p.needs,
                weight: weight(p.weight),
                priority: band(p.priority),
            })
            .collect(),
    }
}

/// A weight as sent: proto3 has no absent number, so 0 is the default weight, 1.
fn weight(w: f64) -> f64 {
    if w == 0.0 {
        1.0
    } else {
        w
    }
}

/// A band as sent (a `Priority` number), or why it is none.
fn band(p: i32) -> Result<weir_core::Criticality, String> {
    Priority::try_from(p)
        .map(Priority::criticality)
        .map_err(|_| format!("unknown value {p}"))
}

/// The status of a call refused as a whole.
fn refused(e: CallError) -> Response<GrpcBody> {
    let code = match &e {
        CallError::Bad(_) => Code::InvalidArgument,
        CallError::Denied(Denied::Unauthenticated(_)) => Code::Unauthenticated,
        CallError::Denied(Denied::NotAllowed(_)) => Code::PermissionDenied,
    };
    status(code, &e.to_string())
}

/// Answers one call: `refresh` (else release) with its request `message`, from a caller that
/// presented `bearer` (its `authorization: Bearer` token, if any).
pub fn call(
    api: &QuotaApi,
    refresh: bool,
    message: Bytes,
    bearer: Option<&str>,
) -> Response<GrpcBody> {
    let now = api.clock.now();
    if let Some(leader) = api.elsewhere(now) {
        let Some(leader) = leader else {
            return status(Code::Unavailable, "no quota leader is known yet; retry");
        };
        let mut r = status(
            Code::FailedPrecondition,
            &format!(
                "this server is not the quota leader; the leader is {}",
                leader.grpc.as_deref().unwrap_or(&leader.http)
            ),
        );
        let h = r.headers_mut();
        if let Some(v) = leader.grpc.and_then(|g| HeaderValue::from_str(&g).ok()) {
            h.insert("weir-quota-leader-grpc", v);
        }
        if let Ok(v) = HeaderValue::from_str(&leader.http) {
            h.insert("weir-quota-leader-http", v);
        }
        return r;
    }
    if !refresh {
        return match ReleaseRequest::decode(message) {
            Ok(r) => {
                let resources: Vec<(String, u64)> = r
                    .resources
                    .into_iter()
                    .enumerate()
                    .map(|(i, name)| (name, r.lease_ids.get(i).copied().unwrap_or(0)))
                    .collect();
                match api.release(&r.client, bearer, &resources) {
                    Ok(()) => ok(&ReleaseResponse {}),
                    Err(e) => refused(e),
                }
            }
            Err(e) => status(Code::InvalidArgument, &format!("bad ReleaseRequest: {e}")),
        };
    }
    let request = match RefreshRequest::decode(message) {
        Ok(r) => r,
        Err(e) => return status(Code::InvalidArgument, &format!("bad RefreshRequest: {e}")),
    };
    let decoded: Vec<DecodedAsk> = request
        .resources
        .iter()
        .map(|r| DecodedAsk {
            resource: r.resource.clone(),
            wants: r.wants,
            has: r.has,
            safe: r.safe,
            weight: weight(r.weight),
            priority: band(r.priority),
            lease_id: Ok(r.lease_id),
            fields: fields(r),
        })
        .collect();
    let checked = match checked(&decoded) {
        Ok(c) => c,
        Err(m) => return status(Code::InvalidArgument, &m),
    };
    let answers = match api.refresh_checked(&request.client, bearer, checked, now) {
        Ok(a) => a,
        Err(e) => return refused(e),
    };
    let leases = answers
        .into_iter()
        .map(|(resource, a)| match a {
            Ok(l) => ResourceLease {
                resource,
                granted: l.granted,
                expires_in_ms: l.expires_at.saturating_sub(now) / 1_000_000,
                refresh_in_ms: l.refresh.as_millis() as u64,
                safe_capacity: l.safe_capacity,
                learning: l.learning,
                error: String::new(),
                lease_id: l.lease_id,
            },
            Err(e) => ResourceLease {
                resource: e.resource().to_string(),
                error: e.to_string(),
                ..ResourceLease::default()
            },
        })
        .collect();
    ok(&RefreshResponse { leases })
}
