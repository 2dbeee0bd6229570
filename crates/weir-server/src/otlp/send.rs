//! The two OTLP transports: HTTP/protobuf (`POST …/v1/metrics` or `…/v1/traces`,
//! `application/x-protobuf`) and gRPC (`opentelemetry.proto.collector.metrics.v1.MetricsService/Export`
//! or `….trace.v1.TraceService/Export`, one unary call framed as `grpc::frame` frames it, over
//! h2c). Both to plain `http://` collectors.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prost::Message;

use super::Protocol;

/// The gRPC method of a metrics export.
pub(crate) const GRPC_METRICS: &str =
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// The gRPC method of a trace export.
pub(crate) const GRPC_TRACES: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Most bytes of a collector's answer read (a partial-success message is a few hundred).
const MAX_ANSWER: usize = 64 * 1024;

/// Why an export was not taken.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No answer within the timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The collector could not be reached or the connection failed.
    #[error("{0}")]
    Connection(String),
    /// The collector answered with an error status (HTTP, or gRPC's `grpc-status`).
    #[error("refused: {0}")]
    Refused(String),
}

/// A client for one collector.
pub(crate) struct Sender {
    protocol: Protocol,
    target: Uri,
    timeout: Duration,
    /// The gRPC method ([`GRPC_METRICS`] or [`GRPC_TRACES`]).
    method: &'static str,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

impl Sender {
    /// A client sending to `target` (the full URL of the signal's endpoint, or the collector's
    /// address for gRPC, where `method` is called).
    pub(crate) fn new(
        protocol: Protocol,
        target: Uri,
        timeout: Duration,
        method: &'static str,
    ) -> Self {
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_idle_timeout(Duration::from_secs(30));
        if protocol == Protocol::Grpc {
            builder.http2_only(true);
        }
        Self {
            protocol,
            target,
            timeout,
            method,
            client: builder.build_http(),
        }
    }

    /// Sends one export and waits for the collector's answer.
    pub(crate) async fn send(&self, request: &impl Message) -> Result<(), SendError> {
        let body = request.encode_to_vec();
        let req = match self.protocol {
            Protocol::HttpProtobuf => Request::post(self.target.clone())
                .header(header::CONTENT_TYPE, "application/x-protobuf")
                .body(Full::new(Bytes::from(body))),
            Protocol::Grpc => {
                let mut framed = Vec::with_capacity(body.len() + 5);
                framed.push(0);
                framed.extend_from_slice(
                    &u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes(),
                );
                framed.extend_from_slice(&body);
                Request::post(grpc_uri(&self.target, self.method))
                    .header(header::CONTENT_TYPE, "application/grpc")
                    .header(header::TE, "trailers")
                    .body(Full::new(Bytes::from(framed)))
            }
        }
        .map_err(|e| SendError::Connection(e.to_string()))?;
        let exchange = async {
            let answer = self
                .client
                .request(req)
                .await
                .map_err(|e| SendError::Connection(connection_error(&e)))?;
            let status = answer.status();
            let grpc_header = answer.headers().get("grpc-status").cloned();
            // An export's answer is a small message: a longer one is cut off, never held.
            let collected = http_body_util::Limited::new(answer.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| SendError::Connection(e.to_string()))?;
            if !status.is_success() {
                return Err(SendError::Refused(format!("HTTP {status}")));
            }
            if self.protocol == Protocol::Grpc {
                let trailer = collected
                    .trailers()
                    .and_then(|t| t.get("grpc-status").cloned());
                grpc_ok(trailer.or(grpc_header))?;
            }
            Ok(())
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(SendError::Timeout(self.timeout)),
        }
    }
}

/// The URL of `method` at the collector `base` (`http://host:4317`).
fn grpc_uri(base: &Uri, method: &str) -> Uri {
    let authority = base.authority().map_or("", |a| a.as_str());
    format!("http://{authority}{method}")
        .parse()
        .unwrap_or_else(|_| base.clone())
}

/// `grpc-status` 0 (or, from a server answering in headers only, absent on success).
fn grpc_ok(status: Option<HeaderValue>) -> Result<(), SendError> {
    match status.as_ref().and_then(|s| s.to_str().ok()) {
        Some("0") => Ok(()),
        Some(code) => Err(SendError::Refused(format!("grpc-status {code}"))),
        None => Err(SendError::Refused("no grpc-status".into())),
    }
}

/// A client error with its cause (hyper's own message is only "client error (Connect)").
fn connection_error(e: &hyper_util::client::legacy::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
