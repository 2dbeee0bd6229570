//! `weir serve`'s gRPC port, its one router: Envoy's rate-limit service ([`crate::rls::grpc`]),
//! the lease API ([`crate::quota::grpc`]), Envoy's RLQS stream ([`crate::quota::rlqs`], through
//! tonic), health and reflection, each chosen by the request's path; and the server that runs
//! it on a listener.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::{Body, Incoming};
use prost::Message;
use weir_quota::proto::{REFRESH_PATH, RELEASE_PATH};

use crate::grpc::batch;
use crate::grpc::frame::{ok, status, unframe, Code, GrpcBody, MAX_MESSAGE};
use crate::net::budget::{BodyError, Budget, ConnectionBudget};
use crate::net::tls::ServerTls;
use crate::quota::api::QuotaApi;
use crate::rls::grpc::{decode, to_proto, PATH};
use crate::rls::Service;

/// The port's services as one hyper service, for one connection (whose request bodies count
/// against that connection's budget).
#[derive(Clone)]
struct GrpcService {
    service: Arc<Service>,
    quota: Option<Arc<QuotaApi>>,
    budget: Arc<ConnectionBudget>,
}

/// A unary answer framed here, or the answer of tonic's RLQS stream.
type AnyBody = http_body_util::Either<GrpcBody, tonic::body::Body>;

impl hyper::service::Service<Request<Incoming>> for GrpcService {
    type Response = Response<AnyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<AnyBody>, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let (service, quota, budget) = (
            self.service.clone(),
            self.quota.clone(),
            self.budget.clone(),
        );
        if let Some(mut reflection) = crate::grpc::reflection::server_for(req.uri().path()) {
            return Box::pin(async move {
                let r = tower::Service::call(&mut reflection, req).await;
                Ok(match r {
                    Ok(r) => r.map(http_body_util::Either::Right),
                    Err(never) => match never {},
                })
            });
        }
        if req.uri().path() == crate::quota::rlqs::PATH {
            if let Some(q) = quota.as_ref().filter(|q| q.serves_rlqs()) {
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
            Ok(handle(&service, quota.as_ref(), &budget, req)
                .await
                .map(http_body_util::Either::Left))
        })
    }
}

async fn handle<B>(
    service: &Service,
    lease_api: Option<&Arc<QuotaApi>>,
    budget: &Arc<ConnectionBudget>,
    req: Request<B>,
) -> Response<GrpcBody>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let path = req.uri().path();
    let health = path == crate::quota::rlqs::HEALTH_PATH;
    let quota = match lease_api {
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
    // Envoy's trace context, for the span of a rate-limit call.
    let begun = match quota {
        None if !health => service.begin_span(req.headers()),
        _ => None,
    };
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
                crate::quota::rlqs::HealthCheckRequest::decode(m).map_err(|e| {
                    (
                        Code::InvalidArgument,
                        format!("bad HealthCheckRequest: {e}"),
                    )
                })
            }) {
            Ok(_) => {
                let follower = lease_api
                    .is_some_and(|q| q.elsewhere(weir_core::Clock::now(&q.clock)).is_some());
                ok(&crate::quota::rlqs::health(follower))
            }
            Err((code, m)) => status(code, &m),
        };
    }
    if let Some((api, refresh)) = quota {
        return match unframe(&body.bytes) {
            Ok(m) => {
                // Off the workers that decisions run on: lease-server work never stalls them.
                let api = api.clone();
                let call = move || crate::quota::grpc::call(&api, refresh, m, bearer.as_deref());
                crate::quota::off_the_workers(call)
                    .await
                    .unwrap_or_else(|| status(Code::Internal, "the lease server failed"))
            }
            Err((code, m)) => status(code, m),
        };
    }
    let request = match decode(&body.bytes) {
        Ok(r) => r,
        Err((code, m)) => return status(code, &m),
    };
    let answer = service.decide(&request).await;
    if let Some(b) = begun {
        service.end_span(b, &request, &answer);
    }
    match answer {
        Ok(r) => ok(&to_proto(&r, service.header_style())),
        Err(e) => status(Code::InvalidArgument, &e.0),
    }
}

/// Serves gRPC on `listener` until `shutdown` says stop and its connections have finished, at
/// most `max_connections` connections at once.
///
/// hyper's HTTP/2 server directly (prior knowledge, as Envoy and gRPC clients speak) with the
/// hand-framed unary method of `grpc.rs`; every stream runs on its connection's task
/// ([`batch::ConnectionExecutor`]), so the answers to one socket read (memory store) or to one
/// batch of Redis replies leave in one write (see `batch.rs`).
pub(crate) async fn serve_grpc(
    service: Arc<Service>,
    quota: Option<Arc<QuotaApi>>,
    listener: tokio::net::TcpListener,
    limits: crate::net::accept::Limits,
    bodies: Arc<Budget>,
    tls: Option<Arc<ServerTls>>,
    shutdown: crate::net::accept::Shutdown,
) {
    crate::net::accept::serve(
        listener,
        limits.max_connections,
        "gRPC",
        shutdown,
        move |tcp, peer, sd, conn| {
            let svc = GrpcService {
                service: service.clone(),
                quota: quota.clone(),
                budget: bodies.connection(),
            };
            let tls = tls.clone();
            async move {
                let r = match tls {
                    // The handshake within the first request's time.
                    Some(tls) => match tls.accept(tcp, limits.timeouts.first_request).await {
                        Ok(s) => {
                            batch::serve(grpc_builder, s, svc, sd, conn, limits.timeouts).await
                        }
                        Err(e) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                    },
                    None => batch::serve(grpc_builder, tcp, svc, sd, conn, limits.timeouts).await,
                };
                if let Err(e) = r {
                    tracing::debug!(error = %e, "gRPC connection ended with an error");
                }
            }
        },
    )
    .await;
}

/// Unread request bytes a gRPC connection may have in flight (HTTP/2 connection window).
pub const GRPC_CONNECTION_WINDOW: u32 = 1 << 20;
/// Unread request bytes one gRPC stream may have in flight.
pub const GRPC_STREAM_WINDOW: u32 = 256 << 10;
/// Calls open at once on one gRPC connection (Envoy opens another connection past it).
pub const GRPC_MAX_STREAMS: u32 = 256;
/// Largest header block of one gRPC call.
pub const GRPC_MAX_HEADER_LIST: u32 = 8 << 10;

/// The HTTP/2 settings of a gRPC connection, around that connection's executor.
fn grpc_builder(
    executor: batch::ConnectionExecutor,
) -> hyper::server::conn::http2::Builder<batch::ConnectionExecutor> {
    let mut builder = hyper::server::conn::http2::Builder::new(executor);
    builder
        // Bounds per connection (docs/limits.md): RLS requests are a few hundred bytes, so
        // these cost nothing in speed and cap what one connection can make the server hold.
        .initial_connection_window_size(GRPC_CONNECTION_WINDOW)
        .initial_stream_window_size(GRPC_STREAM_WINDOW)
        .max_concurrent_streams(GRPC_MAX_STREAMS)
        .max_header_list_size(GRPC_MAX_HEADER_LIST)
        // No `date` on gRPC answers (grpc-go and Lyft's service send none): one header less
        // for the caller to decode per decision.
        .auto_date_header(false)
        .timer(hyper_util::rt::TokioTimer::new());
    builder
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::frame::tests::framed;
    use crate::rls::store::MemoryStore;
    use crate::rls::EngineOptions;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use http_body_util::Full;

    fn service() -> Service {
        Service::new(
            None,
            Arc::new(MemoryStore::default()),
            EngineOptions::default(),
            Arc::default(),
        )
        .expect("bundled example")
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
        let budget = crate::net::budget::Budget::new(Default::default()).connection();
        rt.block_on(handle(&service(), None, &budget, req))
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
}
