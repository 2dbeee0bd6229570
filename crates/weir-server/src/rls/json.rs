//! Lyft's HTTP API, `POST /json`: the proto3 JSON form of `RateLimitRequest` read onto the
//! proto's types (one decoding, [`super::grpc`]'s) and the answer in the same form.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

use super::config::Unit;
use super::grpc::{from_proto, pb_unit, whole_seconds};
use super::request::{BadRequest, HeaderStyle, Request, Response};
use super::service::Service;
use crate::net::budget::{BodyError, ConnectionBudget};

/// The `/json` route, its bodies read within the connection's budget (an
/// `Extension<Arc<ConnectionBudget>>` the server adds per connection).
pub fn routes(service: Arc<Service>) -> Router {
    Router::new()
        .route("/json", post(json_handler))
        .with_state(service)
}

fn u64_any<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error;
    Ok(match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(
            n.as_u64()
                .ok_or_else(|| D::Error::custom("expected an unsigned integer"))?,
        ),
        Some(Value::String(s)) => {
            Some(s.parse().map_err(|_| {
                D::Error::custom(format!("expected an unsigned integer, got {s:?}"))
            })?)
        }
        Some(other) => {
            return Err(D::Error::custom(format!(
                "expected an unsigned integer, got {other}"
            )))
        }
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(
        alias = "requests_per_unit",
        rename = "requestsPerUnit",
        default,
        deserialize_with = "u64_any"
    )]
    requests_per_unit: Option<u64>,
    unit: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    limit: Option<JsonOverride>,
    #[serde(
        alias = "hits_addend",
        rename = "hitsAddend",
        default,
        deserialize_with = "u64_any"
    )]
    hits_addend: Option<u64>,
    #[serde(alias = "is_negative_hits", rename = "isNegativeHits", default)]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(
        alias = "hits_addend",
        rename = "hitsAddend",
        default,
        deserialize_with = "u64_any"
    )]
    hits_addend: Option<u64>,
}

/// The request in a `/json` body (proto3 JSON of `RateLimitRequest`), checked.
pub fn from_json(body: &[u8]) -> Result<Request, BadRequest> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let r: JsonRequest = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| {
            let inner = e.inner();
            let mut reason = inner.to_string();
            // serde_json's words for a \uD800–\uDFFF escape without its pair ("unexpected end
            // of hex escape", "lone leading surrogate") say nothing a client can act on.
            if reason.contains("hex escape") || reason.contains("surrogate") {
                reason = format!(
                    "invalid \\u escape: a UTF-16 surrogate (\\ud800–\\udfff) must be followed by its pair; a lone one is not a character (line {} column {})",
                    inner.line(),
                    inner.column()
                );
            }
            BadRequest(format!("request body: {}: {reason}", e.path()))
        })?;
    // The JSON form is the proto's: map it onto the proto types and decode once.
    let descriptors = r
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let limit = match d.limit {
                Some(l) => Some(RateLimitOverride {
                    requests_per_unit: u32::try_from(l.requests_per_unit.unwrap_or(0)).map_err(
                        |_| {
                            BadRequest(format!("descriptors[{i}].limit.requestsPerUnit: too large"))
                        },
                    )?,
                    unit: Unit::parse(&l.unit)
                        .map(|u| pb_unit(u) as i32)
                        .ok_or_else(|| {
                            BadRequest(format!(
                                "descriptors[{i}].limit.unit: unknown unit {:?}",
                                l.unit
                            ))
                        })?,
                }),
                None => None,
            };
            Ok(RateLimitDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                limit,
                hits_addend: d
                    .hits_addend
                    .map(|value| envoy_types::pb::google::protobuf::UInt64Value { value }),
                is_negative_hits: d.is_negative_hits,
            })
        })
        .collect::<Result<_, BadRequest>>()?;
    from_proto(RateLimitRequest {
        domain: r.domain,
        descriptors,
        hits_addend: u32::try_from(r.hits_addend.unwrap_or(0))
            .map_err(|_| BadRequest("hitsAddend: too large".into()))?,
    })
}

fn to_json(r: &Response, style: HeaderStyle) -> Value {
    let code = |over: bool| if over { "OVER_LIMIT" } else { "OK" };
    let headers: Vec<Value> = r
        .headers(style)
        .into_iter()
        .map(|(k, v)| json!({"key": k, "value": v}))
        .collect();
    let mut out = json!({
        "overallCode": code(r.over_limit),
        "statuses": r.statuses.iter().map(|s| {
            let mut v = json!({"code": code(s.over_limit)});
            if let Some(l) = &s.limit {
                // proto3 JSON leaves out an empty name, as Lyft's answer does.
                v["currentLimit"] = match &l.name {
                    Some(name) => json!({"name": &**name, "requestsPerUnit": l.requests_per_unit, "unit": l.unit.proto_name()}),
                    None => json!({"requestsPerUnit": l.requests_per_unit, "unit": l.unit.proto_name()}),
                };
                v["limitRemaining"] = json!(s.remaining);
                v["durationUntilReset"] = json!(format!("{}s", whole_seconds(s.reset)));
            } else if s.remaining > 0 {
                // an unlimited descriptor
                v["limitRemaining"] = json!(s.remaining);
            }
            v
        }).collect::<Vec<_>>(),
    });
    if !headers.is_empty() {
        out["responseHeadersToAdd"] = Value::Array(headers);
    }
    if let Some(m) = &r.metadata {
        out["dynamicMetadata"] = Value::Object(m.clone());
    }
    out
}

/// Largest `/json` body (the gRPC message limit).
const MAX_JSON_BODY: usize = crate::grpc::frame::MAX_MESSAGE;

/// `POST /json`: one decision, as Lyft's HTTP API answers it (429 when over the limit).
async fn json_handler(
    State(service): State<Arc<Service>>,
    axum::Extension(budget): axum::Extension<Arc<ConnectionBudget>>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let error =
        |status: StatusCode, e: String| (status, axum::Json(json!({"error": e}))).into_response();
    let begun = service.begin_span(request.headers());
    let body = match budget.read(request.into_body(), MAX_JSON_BODY).await {
        Ok(b) => b,
        Err(e) => {
            service.refused();
            let status = match e {
                BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                BodyError::ConnectionFull(_) | BodyError::ProcessFull(_) => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                BodyError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
                BodyError::Read(_) => StatusCode::BAD_REQUEST,
            };
            return error(status, e.to_string());
        }
    };
    let request = match from_json(&body.bytes) {
        Ok(r) => r,
        Err(e) => {
            service.refused();
            return error(StatusCode::BAD_REQUEST, e.0);
        }
    };
    let answer = service.decide(&request).await;
    if let Some(b) = begun {
        service.end_span(b, &request, &answer);
    }
    match answer {
        Ok(r) => {
            let status = if r.over_limit {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(to_json(&r, service.header_style()))).into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, axum::Json(json!({"error": e.0}))).into_response(),
    }
}
