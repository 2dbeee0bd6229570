//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: the method's path and its
//! request message as the engine takes it. The gRPC port's router ([`crate::grpc::router`])
//! calls it; the framing is [`crate::grpc::frame`]'s.

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;

use super::server::from_proto;
use crate::grpc::frame::{unframe, Code};

/// The one method served.
pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The request in a unary call's body: one framed `RateLimitRequest`, decoded and checked
/// (the status and message to answer otherwise).
pub fn decode(body: &Bytes) -> Result<super::engine::Request, (Code, String)> {
    let message = unframe(body).map_err(|(code, m)| (code, m.to_string()))?;
    let request = RateLimitRequest::decode(message)
        .map_err(|e| (Code::InvalidArgument, format!("bad RateLimitRequest: {e}")))?;
    from_proto(request).map_err(|e| (Code::InvalidArgument, e.0))
}
