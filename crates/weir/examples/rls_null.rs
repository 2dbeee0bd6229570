//! The cheapest possible rate-limit service, for benchmarks: every `ShouldRateLimit` call is
//! answered `overall_code: OK` (a constant 2-byte message) without decoding the request.
//!
//! Behind Envoy it measures what the gRPC call costs Envoy itself, whatever service answers:
//! the ceiling of "Envoy + service / Envoy alone" for any service (bench/serve-compare).
//! With `status`, the answer also carries one descriptor status as `weir serve` sends it (the
//! limit, units left, time to reset), to measure what decoding it costs Envoy.
//! `cargo run --release -p weir --example rls_null -- PORT [status]`

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};

/// `RateLimitResponse { overall_code: OK }` (field 1, varint 1) behind the gRPC length prefix.
const ANSWER: &[u8] = &[0, 0, 0, 0, 2, 0x08, 0x01];

/// The framed answer with one descriptor status, built once.
fn with_status() -> Bytes {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        rate_limit::Unit, Code, DescriptorStatus, RateLimit,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use prost::Message;
    let m = RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(RateLimit {
                requests_per_unit: 1_000_000_000,
                unit: Unit::Second as i32,
                ..Default::default()
            }),
            limit_remaining: 999_999_000,
            duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: 0,
                nanos: 412_000_000,
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let body = m.encode_to_vec();
    let mut framed = vec![0];
    framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
    framed.extend_from_slice(&body);
    Bytes::from(framed)
}

static MESSAGE: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();

/// The answer's body: the message, then the `grpc-status: 0` trailer.
struct Answer(u8);

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0 += 1;
        Poll::Ready(match self.0 {
            1 => Some(Ok(Frame::data(MESSAGE.get().cloned().unwrap_or_default()))),
            2 => {
                let mut t = HeaderMap::new();
                t.insert("grpc-status", HeaderValue::from_static("0"));
                Some(Ok(Frame::trailers(t)))
            }
            _ => None,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.0 >= 2
    }
}

async fn answer(req: Request<Incoming>) -> Result<Response<Answer>, Infallible> {
    // Read the call to its end (unread, h2 would reset the stream), never decode it.
    let _ = req.into_body().collect().await;
    let mut r = Response::new(Answer(0));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    Ok(r)
}

fn main() {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| {
            eprintln!("usage: rls_null PORT");
            std::process::exit(2)
        });
    let message = match std::env::args().nth(2).as_deref() {
        None => Bytes::from_static(ANSWER),
        Some("status") => with_status(),
        Some(other) => {
            eprintln!("rls_null: unknown option {other:?} (expected: status)");
            std::process::exit(2)
        }
    };
    let _ = MESSAGE.set(message);
    // The runtime of `weir serve`: one worker thread per core.
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async move {
            let l = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .expect("bind");
            loop {
                let Ok((s, _)) = l.accept().await else {
                    continue;
                };
                let _ = s.set_nodelay(true);
                tokio::spawn(async move {
                    let mut b = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    );
                    b.auto_date_header(false);
                    let svc = hyper::service::service_fn(answer);
                    let _ = b
                        .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                        .await;
                });
            }
        });
}
