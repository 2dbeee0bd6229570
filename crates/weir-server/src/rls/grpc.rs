//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: one unary gRPC method,
//! served as a plain hyper service.
//!
//! Why not tonic's generated server: per call it builds a decoding stream, a metadata map, an
//! encoding stream and boxed bodies, ≈ 20 % of `weir serve`'s CPU per decision under load
//! (docs/serve.md). A unary call is simple enough to frame by hand: the request body is one
//! length-prefixed message; the answer is `200`, `content-type: application/grpc`, one
//! length-prefixed message and the trailer `grpc-status: 0`. Errors are "trailers-only"
//! answers (status and message in the headers, no body), as gRPC specifies. Compression is not
//! offered (no `grpc-accept-encoding`), so conforming clients (Envoy, tonic, grpc-go) send
//! uncompressed messages; a compressed one is answered UNIMPLEMENTED.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};

use crate::budget::{BodyError, ConnectionBudget};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use prost::Message;
use weir_quota::proto::{REFRESH_PATH, RELEASE_PATH};

use super::server::{from_proto, to_proto, Service};

/// The one method served.
pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Largest request message accepted (tonic's and grpc-go's default).
pub const MAX_MESSAGE: usize = 4 << 20;

/// gRPC status codes of the errors answered here (success is the `grpc-status: 0` trailer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// The request could not be read to its end (the caller went away).
    Cancelled = 1,
    /// The request body did not arrive within the body timeout.
    DeadlineExceeded = 4,
    /// A malformed or invalid request.
    InvalidArgument = 3,
    /// A request message above [`MAX_MESSAGE`], or past the buffered-bytes bounds.
    ResourceExhausted = 8,
    /// An unknown method, or a compressed message.
    Unimplemented = 12,
    /// A quota call to a server that is not the quota leader (the leader is named in the
    /// metadata).
    FailedPrecondition = 9,
    /// A quota call while no quota leader is known.
    Unavailable = 14,
    /// A lease-API call without a token the quota file accepts for its client id.
    Unauthenticated = 16,
    /// A lease-API call from a client id the quota file does not allow.
    PermissionDenied = 7,
}

/// The ratelimit service as a hyper service, for one connection (whose request bodies count
/// against that connection's budget).
#[derive(Clone)]
pub struct GrpcService {
    service: Arc<Service>,
    budget: Arc<ConnectionBudget>,
}

impl GrpcService {
    /// Serves `service` on a connection whose bodies are bounded by `budget`.
    pub fn new(service: Arc<Service>, budget: Arc<ConnectionBudget>) -> Self {
        Self { service, budget }
    }
}

/// A unary answer framed here, or the answer of tonic's RLQS stream.
pub type AnyBody = http_body_util::Either<GrpcBody, tonic::body::Body>;

impl hyper::service::Service<Request<Incoming>> for GrpcService {
    type Response = Response<AnyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<AnyBody>, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let (service, budget) = (self.service.clone(), self.budget.clone());
        if let Some(mut reflection) = crate::reflection::server_for(req.uri().path()) {
            return Box::pin(async move {
                let r = tower::Service::call(&mut reflection, req).await;
                Ok(match r {
                    Ok(r) => r.map(http_body_util::Either::Right),
                    Err(never) => match never {},
                })
            });
        }
        if req.uri().path() == crate::rlqs::PATH {
            if let Some(q) = service.quota().filter(|q| q.serves_rlqs()) {
                // A long-lived stream: tonic reads it as it comes (bounded per message),
                // not the unary path's whole-body read.
                let mut rlqs = q.rlqs().server();
                return Box::pin(async move {
                    let r = tower::Service::call(&mut rlqs, req).await;
                    Ok(match r {
                        Ok(r) => r.map(http_body_util::Either::Right),
                        Err(never) => match never {},
                    })
                });
            }
        }
        Box::pin(async move {
            Ok(handle(&service, &budget, req)
                .await
                .map(http_body_util::Either::Left))
        })
    }
}

async fn handle<B>(
    service: &Service,
    budget: &Arc<ConnectionBudget>,
    req: Request<B>,
) -> Response<GrpcBody>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let path = req.uri().path();
    let health = path == crate::rlqs::HEALTH_PATH;
    let quota = match service.quota() {
        _ if health => None,
        Some(q) if path == REFRESH_PATH || path == RELEASE_PATH => Some((q, path == REFRESH_PATH)),
        _ if path == PATH => None,
        _ => {
            let m = format!("unknown method {path}");
            return status(Code::Unimplemented, &m);
        }
    };
    let grpc = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if !grpc {
        // Not a gRPC call at all: plain HTTP, as the gRPC spec asks.
        let mut r = Response::new(GrpcBody::empty());
        *r.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        return r;
    }
    // The lease API's caller token (checked against the quota file's clients section).
    let bearer = quota.and(
        weir_tower::dashboard::bearer_token(req.headers())
            .map(|b| String::from_utf8_lossy(b).into_owned()),
    );
    let body = match budget.read(req.into_body(), MAX_MESSAGE + 5).await {
        Ok(b) => b,
        Err(BodyError::TooLarge(_)) => {
            let m = format!("request message larger than {MAX_MESSAGE} bytes");
            return status(Code::ResourceExhausted, &m);
        }
        Err(e @ (BodyError::ConnectionFull(_) | BodyError::ProcessFull(_))) => {
            return status(Code::ResourceExhausted, &e.to_string())
        }
        Err(e @ BodyError::Timeout(_)) => return status(Code::DeadlineExceeded, &e.to_string()),
        Err(e @ BodyError::Read(_)) => return status(Code::Cancelled, &e.to_string()),
    };
    if health {
        return match unframe(&body.bytes)
            .map_err(|(c, m)| (c, m.to_string()))
            .and_then(|m| {
                crate::rlqs::HealthCheckRequest::decode(m).map_err(|e| {
                    (
                        Code::InvalidArgument,
                        format!("bad HealthCheckRequest: {e}"),
                    )
                })
            }) {
            Ok(_) => ok(&crate::rlqs::health(service.quota().map(|q| &**q))),
            Err((code, m)) => status(code, &m),
        };
    }
    if let Some((api, refresh)) = quota {
        return match unframe(&body.bytes) {
            Ok(m) => crate::quota_grpc::call(api, refresh, m, bearer.as_deref()),
            Err((code, m)) => status(code, m),
        };
    }
    let request = match decode(&body.bytes) {
        Ok(r) => r,
        Err((code, m)) => return status(code, &m),
    };
    match service.decide(&request).await {
        Ok(r) => ok(&to_proto(&r, service.header_style())),
        Err(e) => status(Code::InvalidArgument, &e.0),
    }
}

/// The request in a unary call's body: one framed `RateLimitRequest`, decoded and checked
/// (the status and message to answer otherwise).
pub fn decode(body: &Bytes) -> Result<super::engine::Request, (Code, String)> {
    let message = unframe(body).map_err(|(code, m)| (code, m.to_string()))?;
    let request = RateLimitRequest::decode(message)
        .map_err(|e| (Code::InvalidArgument, format!("bad RateLimitRequest: {e}")))?;
    from_proto(request).map_err(|e| (Code::InvalidArgument, e.0))
}

/// The message of a unary request body: exactly one uncompressed length-prefixed message.
fn unframe(body: &Bytes) -> Result<Bytes, (Code, &'static str)> {
    let Some(&[flag, a, b, c, d]) = body.get(..5) else {
        return Err((Code::InvalidArgument, "request body is not a gRPC message"));
    };
    if flag != 0 {
        return Err((Code::Unimplemented, "compressed messages are not supported"));
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if body.len() - 5 != len {
        return Err((
            Code::InvalidArgument,
            "a unary request carries exactly one message",
        ));
    }
    Ok(body.slice(5..))
}

/// A successful unary answer: `message`, then the `grpc-status: 0` trailer.
pub fn ok(message: &impl Message) -> Response<GrpcBody> {
    let len = message.encoded_len();
    // A Vec, not a BytesMut: prost writes varints a byte at a time, and BytesMut's `put_slice`
    // is an out-of-line call (then memmove) per byte where Vec's inlines to a store.
    // `Bytes::from(Vec)` takes the allocation without copying.
    let mut buf = Vec::with_capacity(5 + len);
    buf.push(0);
    buf.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    // Cannot fail: a Vec grows as needed.
    let _ = message.encode(&mut buf);
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut r = Response::new(GrpcBody {
        data: Some(Bytes::from(buf)),
        trailers: Some(trailers),
    });
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    r
}

/// A trailers-only answer: `code` and `message` in the response headers, no body.
pub fn status(code: Code, message: &str) -> Response<GrpcBody> {
    let mut r = Response::new(GrpcBody::empty());
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert("grpc-status", HeaderValue::from(code as u16));
    if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
        h.insert("grpc-message", v);
    }
    r
}

/// gRPC's `grpc-message` encoding: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A gRPC response body: at most one data frame, then at most one trailers frame.
pub struct GrpcBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl GrpcBody {
    fn empty() -> Self {
        Self {
            data: None,
            trailers: None,
        }
    }
}

impl Body for GrpcBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(d) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::engine::{EngineOptions, Store};
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use http_body_util::Full;

    fn service() -> Service {
        Service::new(None, Store::Memory, EngineOptions::default(), None).expect("bundled example")
    }

    fn call(path: &str, content_type: &str, body: Bytes) -> Response<GrpcBody> {
        let req = Request::post(path)
            .header("content-type", content_type)
            .body(Full::new(body))
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let budget = crate::budget::Budget::new(Default::default()).connection();
        rt.block_on(handle(&service(), &budget, req))
    }

    fn grpc_status(r: &Response<GrpcBody>) -> (String, String) {
        let h = r.headers();
        let get = |k: &str| {
            h.get(k)
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default()
        };
        (get("grpc-status"), get("grpc-message"))
    }

    #[test]
    fn a_decision_is_one_message_then_the_ok_trailer() {
        let req = RateLimitRequest {
            domain: "example".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".into(),
                    value: "10.0.0.1".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        let r = call(PATH, "application/grpc", framed(&req.encode_to_vec()));
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["content-type"], "application/grpc");
        let mut body = r.into_body();
        let data = body.data.take().expect("one message");
        assert_eq!(
            u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize,
            data.len() - 5
        );
        let resp = RateLimitResponse::decode(&data[5..]).unwrap();
        assert_eq!(resp.statuses.len(), 1);
        assert_eq!(body.trailers.take().unwrap()["grpc-status"], "0");
    }

    #[test]
    fn bad_calls_get_the_grpc_status_that_names_the_problem() {
        let r = call("/other.Service/Method", "application/grpc", framed(b""));
        assert_eq!(grpc_status(&r).0, "12");
        assert!(grpc_status(&r).1.contains("/other.Service/Method"));

        let r = call(PATH, "application/json", framed(b""));
        assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

        let r = call(
            PATH,
            "application/grpc",
            Bytes::from_static(b"\xff\xff\xff\xff\xff\xff"),
        );
        assert_eq!(grpc_status(&r).0, "12", "compressed flag");

        let r = call(PATH, "application/grpc", framed(b"\xff\xff\xff"));
        assert_eq!(grpc_status(&r).0, "3");
        assert!(
            grpc_status(&r).1.starts_with("bad RateLimitRequest"),
            "{:?}",
            grpc_status(&r)
        );

        let empty_value = RateLimitRequest {
            domain: "example".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".into(),
                    value: String::new(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        let r = call(
            PATH,
            "application/grpc+proto",
            framed(&empty_value.encode_to_vec()),
        );
        assert_eq!(grpc_status(&r).0, "3");
        assert!(
            grpc_status(&r).1.contains("empty value"),
            "{:?}",
            grpc_status(&r)
        );

        let huge = vec![0u8; MAX_MESSAGE + 1];
        let r = call(PATH, "application/grpc", framed(&huge));
        assert_eq!(grpc_status(&r).0, "8");
    }

    fn framed(msg: &[u8]) -> Bytes {
        let mut b = vec![0u8];
        b.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        b.extend_from_slice(msg);
        Bytes::from(b)
    }

    #[test]
    fn unframe_takes_exactly_one_uncompressed_message() {
        assert_eq!(
            unframe(&framed(b"abc")).unwrap(),
            Bytes::from_static(b"abc")
        );
        assert_eq!(unframe(&framed(b"")).unwrap(), Bytes::new());
        assert_eq!(
            unframe(&Bytes::from_static(b"\0\0")).unwrap_err().0,
            Code::InvalidArgument
        );
        let mut two = framed(b"a").to_vec();
        two.extend_from_slice(&framed(b"b"));
        assert_eq!(
            unframe(&Bytes::from(two)).unwrap_err().0,
            Code::InvalidArgument
        );
        let mut short = framed(b"abcd").to_vec();
        short.pop();
        assert_eq!(
            unframe(&Bytes::from(short)).unwrap_err().0,
            Code::InvalidArgument
        );
        let mut compressed = framed(b"abc").to_vec();
        compressed[0] = 1;
        assert_eq!(
            unframe(&Bytes::from(compressed)).unwrap_err().0,
            Code::Unimplemented
        );
    }

    #[test]
    fn grpc_message_is_percent_encoded() {
        assert_eq!(percent_encode("a b%c"), "a b%25c");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
        let r = status(Code::InvalidArgument, "bad\tvalue");
        assert_eq!(r.headers()["grpc-status"], "3");
        assert_eq!(r.headers()["grpc-message"], "bad%09value");
        assert!(r.body().is_end_stream());
    }
}
