//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on the wire: the method's
//! path, its request message as the engine takes it and the engine's answer as the message
//! Envoy reads. The gRPC port (`crate::serve`) routes calls here; the framing is
//! [`crate::grpc::frame`]'s.

use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    self as pbr, rate_limit::Unit as PbUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use serde_json::Value;

use super::config::Unit;
use super::request::{BadRequest, HeaderStyle, Request, RequestDescriptor, Response};
use crate::grpc::frame::{unframe, Code};

/// The one method served.
pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The request in a unary call's body: one framed `RateLimitRequest`, decoded and checked
/// (the status and message to answer otherwise).
pub fn decode(body: &Bytes) -> Result<Request, (Code, String)> {
    let message = unframe(body).map_err(|(code, m)| (code, m.to_string()))?;
    let request = RateLimitRequest::decode(message)
        .map_err(|e| (Code::InvalidArgument, format!("bad RateLimitRequest: {e}")))?;
    from_proto(request).map_err(|e| (Code::InvalidArgument, e.0))
}

/// The proto's unit of `u`.
pub(crate) fn pb_unit(u: Unit) -> PbUnit {
    match u {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn unit_from_pb(u: i32) -> Option<Unit> {
    Some(match PbUnit::try_from(u).ok()? {
        PbUnit::Second => Unit::Second,
        PbUnit::Minute => Unit::Minute,
        PbUnit::Hour => Unit::Hour,
        PbUnit::Day => Unit::Day,
        PbUnit::Week => Unit::Week,
        PbUnit::Month => Unit::Month,
        PbUnit::Year => Unit::Year,
        PbUnit::Unknown => return None,
    })
}

/// The engine's request of a decoded `RateLimitRequest`, checked.
pub(crate) fn from_proto(r: RateLimitRequest) -> Result<Request, BadRequest> {
    let descriptors = r
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d): (usize, RateLimitDescriptor)| {
            let limit = match d.limit {
                Some(l) => Some((
                    l.requests_per_unit,
                    unit_from_pb(l.unit).ok_or_else(|| {
                        BadRequest(format!(
                            "descriptors[{i}].limit.unit: unknown unit {}",
                            l.unit
                        ))
                    })?,
                )),
                None => None,
            };
            Ok(RequestDescriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit,
                hits_addend: d.hits_addend.map(|h| h.value),
                negative: d.is_negative_hits,
            })
        })
        .collect::<Result<_, BadRequest>>()?;
    Ok(Request {
        domain: r.domain,
        descriptors,
        hits_addend: r.hits_addend,
    })
}

/// The gRPC answer of `r`, its headers in `style`.
pub(crate) fn to_proto(r: &Response, style: HeaderStyle) -> RateLimitResponse {
    let code = |over: bool| if over { pbr::Code::OverLimit } else { pbr::Code::Ok } as i32;
    RateLimitResponse {
        overall_code: code(r.over_limit),
        statuses: r
            .statuses
            .iter()
            .map(|s| pbr::DescriptorStatus {
                code: code(s.over_limit),
                current_limit: s.limit.as_ref().map(|l| pbr::RateLimit {
                    name: l.name.as_deref().unwrap_or_default().to_string(),
                    requests_per_unit: u32::try_from(l.requests_per_unit).unwrap_or(u32::MAX),
                    unit: pb_unit(l.unit) as i32,
                }),
                limit_remaining: u32::try_from(s.remaining).unwrap_or(u32::MAX),
                duration_until_reset: s.limit.as_ref().map(|_| prost_types_duration(s.reset)),
                quota: None,
            })
            .collect(),
        dynamic_metadata: r.metadata.as_ref().map(pb_struct),
        response_headers_to_add: r
            .headers(style)
            .into_iter()
            .map(
                |(key, value)| envoy_types::pb::envoy::config::core::v3::HeaderValue {
                    key,
                    value,
                    ..Default::default()
                },
            )
            .collect(),
        ..Default::default()
    }
}

/// `duration_until_reset` in whole seconds, rounded up (Lyft's answers: from 1 up to the
/// unit while a window runs).
fn prost_types_duration(d: Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(whole_seconds(d)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// Seconds rounded up.
pub(crate) fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// JSON → `google.protobuf.Struct`.
fn pb_struct(m: &serde_json::Map<String, Value>) -> envoy_types::pb::google::protobuf::Struct {
    envoy_types::pb::google::protobuf::Struct {
        fields: m.iter().map(|(k, v)| (k.clone(), pb_value(v))).collect(),
    }
}

fn pb_value(v: &Value) -> envoy_types::pb::google::protobuf::Value {
    use envoy_types::pb::google::protobuf::{value::Kind, ListValue};
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(pb_value).collect(),
        }),
        Value::Object(m) => Kind::StructValue(pb_struct(m)),
    };
    envoy_types::pb::google::protobuf::Value { kind: Some(kind) }
}
