//! Decision spans end to end, against a receiver of this test decoding what arrives with the
//! OpenTelemetry project's own types: `weir serve` continuing the trace Envoy sends in a
//! `ShouldRateLimit` call's metadata (over gRPC), and `weir proxy` making its decision a child
//! of the client's span and the parent of the upstream's (over HTTP/protobuf); sampling by the
//! caller's flag, refusals always; keys digested, never sent.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use weir_server::admin::metrics::Metrics;
use weir_server::net::accept;
use weir_server::otlp::{self, Protocol, Settings};
use weir_server::proxy::Proxy;
use weir_server::rls::MemoryStore;
use weir_server::serve::Server;

mod common;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// A trace receiver on 127.0.0.1:0 for both transports, sending every span it takes to the
/// returned channel.
async fn receiver() -> (SocketAddr, mpsc::UnboundedReceiver<Span>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let tx = tx.clone();
                        async move {
                            let grpc = req.uri().path()
                                == "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
                            assert!(grpc || req.uri().path() == "/v1/traces", "{:?}", req.uri());
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let message = if grpc { body.slice(5..) } else { body };
                            let export = ExportTraceServiceRequest::decode(message).unwrap();
                            for rs in export.resource_spans {
                                for ss in rs.scope_spans {
                                    for span in ss.spans {
                                        let _ = tx.send(span);
                                    }
                                }
                            }
                            let response = if grpc {
                                let mut trailers = http::HeaderMap::new();
                                trailers.insert("grpc-status", "0".parse().unwrap());
                                let body =
                                    http_body_util::StreamBody::new(futures_util::stream::iter([
                                        Ok::<_, std::convert::Infallible>(
                                            hyper::body::Frame::data(Bytes::from_static(&[
                                                0, 0, 0, 0, 0,
                                            ])),
                                        ),
                                        Ok(hyper::body::Frame::trailers(trailers)),
                                    ]));
                                http::Response::builder()
                                    .header("content-type", "application/grpc")
                                    .body(body.boxed())
                                    .unwrap()
                            } else {
                                http::Response::builder()
                                    .body(Full::new(Bytes::new()).boxed())
                                    .unwrap()
                            };
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(s), service)
                .await;
            });
        }
    });
    (addr, rx)
}

/// The next span within 10 s.
async fn next(rx: &mut mpsc::UnboundedReceiver<Span>) -> Span {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a span within 10 s")
        .expect("the receiver runs")
}

/// No span within 1.5 s (longer than the exporter's batch delay).
async fn none(rx: &mut mpsc::UnboundedReceiver<Span>) {
    if let Ok(Some(s)) = tokio::time::timeout(Duration::from_millis(1_500), rx.recv()).await {
        panic!("no span expected, got {s:?}");
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    let kv = span.attributes.iter().find(|a| a.key == key)?;
    Some(match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::IntValue(i) => i.to_string(),
        any_value::Value::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn settings(collector: SocketAddr, protocol: Protocol, service: &str) -> Settings {
    let mut s = Settings::new(&format!("http://{collector}"), protocol, service).unwrap();
    // Only the caller's sampled flag, and every refusal.
    s.trace(Some(0.0), true).unwrap();
    s
}

/// A `ShouldRateLimit` call over h2c with `traceparent` metadata: the overall code.
async fn should_rate_limit(grpc: SocketAddr, traceparent: &str, ip: &str) -> i32 {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        rate_limit_descriptor::Entry, RateLimitDescriptor,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
    let message = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: ip.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
    .encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let request = http::Request::post(format!(
        "http://{grpc}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("traceparent", traceparent)
    .body(Full::new(Bytes::from(framed)))
    .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    RateLimitResponse::decode(&body[5..]).unwrap().overall_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_serve_continues_envoys_trace() {
    let (collector, mut spans) = receiver().await;
    // A day's window: fixed windows start on the wall clock's unit, and the third call must
    // meet the first two's count (a minute's window can turn over between them).
    let config = common::file(
        "traces",
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: day, requests_per_unit: 2}\n",
    );
    let metrics = Arc::new(Metrics::new());
    let server = Server::builder()
        .config_file(config)
        .store(MemoryStore::default())
        .metrics(metrics.clone())
        .build()
        .unwrap();
    let exporter = otlp::spawn(
        metrics.clone(),
        settings(collector, Protocol::Grpc, "weir-serve"),
    );
    server.trace(exporter.tracer().expect("traces asked for").clone());
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc.local_addr().unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_addr = http.local_addr().unwrap();
    let server = Arc::new(server);
    {
        let server = server.clone();
        tokio::spawn(async move { server.serve_grpc(grpc, std::future::pending()).await });
    }
    {
        let server = server.clone();
        tokio::spawn(async move { server.serve_http(http, None, std::future::pending()).await });
    }

    // Envoy sampled its span: the decision is its child, in its trace.
    let sampled = format!("00-{TRACE}-{PARENT}-01");
    assert_eq!(
        should_rate_limit(grpc_addr, &sampled, "10.1.2.3").await,
        1,
        "OK"
    );
    let span = next(&mut spans).await;
    assert_eq!(hex(&span.trace_id), TRACE);
    assert_eq!(hex(&span.parent_span_id), PARENT);
    assert_ne!(hex(&span.span_id), PARENT);
    assert_eq!(
        span.name,
        "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    );
    assert_eq!(span.kind, 2, "a server span");
    assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
    assert_eq!(attr(&span, "weir.domain").as_deref(), Some("edge"));
    assert_eq!(attr(&span, "weir.verdict").as_deref(), Some("ok"));
    assert_eq!(attr(&span, "weir.hits").as_deref(), Some("1"));
    let digest = attr(&span, "weir.key.digest").expect("the key, digested");
    assert_eq!(digest.len(), 16);
    assert!(
        !format!("{span:?}").contains("10.1.2.3"),
        "the client's address is never sent: {span:?}"
    );

    // Not sampled by Envoy and admitted: no span. Refused: a span whatever the flag.
    let unsampled = format!("00-{TRACE}-{PARENT}-00");
    assert_eq!(
        should_rate_limit(grpc_addr, &unsampled, "10.1.2.3").await,
        1
    );
    none(&mut spans).await;
    assert_eq!(
        should_rate_limit(grpc_addr, &unsampled, "10.1.2.3").await,
        2,
        "OVER_LIMIT"
    );
    let refused = next(&mut spans).await;
    assert_eq!(
        attr(&refused, "weir.verdict").as_deref(),
        Some("over_limit")
    );
    assert_eq!(
        attr(&refused, "weir.rule").as_deref(),
        Some("edge.remote_address")
    );
    assert_eq!(hex(&refused.parent_span_id), PARENT);
    assert_eq!(
        attr(&refused, "weir.key.digest"),
        Some(digest),
        "one key, one digest"
    );

    // A malformed traceparent is no parent: a new trace (sampled here: it was refused).
    let bad = format!("00-{}-{PARENT}-01", TRACE.to_uppercase());
    assert_eq!(should_rate_limit(grpc_addr, &bad, "10.1.2.3").await, 2);
    let fresh = next(&mut spans).await;
    assert_ne!(hex(&fresh.trace_id), TRACE);
    assert!(fresh.parent_span_id.is_empty());

    // Lyft's JSON front end is traced alike.
    let other = format!("00-{TRACE}-{}-01", "1111111111111111");
    let a = common::request(
        http_addr,
        "POST",
        "/json",
        &[("traceparent", &other), ("content-type", "application/json")],
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.9.9.9"}]}]}"#,
    )
    .await;
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    let json = next(&mut spans).await;
    assert_eq!(hex(&json.parent_span_id), "1111111111111111");
    assert_eq!(attr(&json, "weir.verdict").as_deref(), Some("ok"));

    let text = metrics.render();
    assert!(
        text.contains(r#"weir_otlp_spans_total{result="exported"} "#),
        "{text}"
    );
}

/// An upstream that records each request's `traceparent` and answers with the tokens used.
async fn upstream(seen: Arc<Mutex<Vec<String>>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = s.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let tp = head
                            .lines()
                            .find_map(|l| l.strip_prefix("traceparent: "))
                            .unwrap_or("")
                            .to_string();
                        seen.lock().unwrap().push(tp);
                        buf.drain(..end + 4);
                        let answer =
                            b"HTTP/1.1 200 OK\r\nx-tokens-used: 42\r\nContent-Length: 2\r\n\r\nok";
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_proxy_puts_its_decision_between_the_client_and_the_upstream() {
    let (collector, mut spans) = receiver().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let upstream = upstream(seen.clone()).await;
    let rules = common::file(
        "traces",
        "rules.yaml",
        "resources:
  - name: chat
    flow:
      - {id: chat-tokens, qps: 1000000, window: 60s, algorithm: gcra, cost: {estimate: 100, estimate_from: {header: x-max-tokens}, actual_from: {header: x-tokens-used}}}
  - name: api
    flow:
      - {id: api-rate, qps: 1, window: 60s}
http:
  origin_header: x-caller
  routes:
    - {resource: chat, prefix: /chat}
    - {resource: api, prefix: /api}
",
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut proxy = Proxy::build(weir_server::proxy::Settings {
        workers: 1,
        ..weir_server::proxy::Settings::new(&rules, addr, format!("http://{upstream}"))
    })
    .unwrap();
    let exporter = otlp::spawn(
        proxy.metrics().clone(),
        settings(collector, Protocol::HttpProtobuf, "weir-proxy"),
    );
    proxy.trace(exporter.tracer().expect("traces asked for").clone());
    let proxy = Arc::new(proxy);
    let (_trigger, shutdown) = accept::shutdown();
    {
        let proxy = proxy.clone();
        tokio::spawn(async move { proxy.serve(listener, None, shutdown).await });
    }

    // A sampled client: the decision is the client's child, the upstream the decision's.
    let sampled = format!("00-{TRACE}-{PARENT}-01");
    let a = common::request(
        addr,
        "GET",
        "/chat",
        &[
            ("traceparent", &sampled),
            ("x-caller", "ann"),
            ("x-max-tokens", "300"),
        ],
        "",
    )
    .await;
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    let span = next(&mut spans).await;
    assert_eq!(span.name, "weir.decision");
    assert_eq!(hex(&span.trace_id), TRACE);
    assert_eq!(hex(&span.parent_span_id), PARENT);
    let passed_on = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        passed_on,
        format!("00-{TRACE}-{}-01", hex(&span.span_id)),
        "the upstream's parent is the decision's span"
    );
    assert_eq!(attr(&span, "weir.resource").as_deref(), Some("chat"));
    assert_eq!(attr(&span, "weir.verdict").as_deref(), Some("admitted"));
    assert_eq!(attr(&span, "weir.cost.estimate").as_deref(), Some("300"));
    assert_eq!(attr(&span, "weir.cost.settled").as_deref(), Some("42"));
    assert!(attr(&span, "weir.key.digest").is_some());
    assert!(!format!("{span:?}").contains("ann"), "{span:?}");
    // The call's usage, as the GenAI semantic conventions record it.
    let text = proxy
        .metrics()
        .render_as(weir_server::admin::metrics::Format::Prometheus);
    for line in [
        r#"gen_ai_client_token_usage_bucket{le="64.0",resource="chat",gen_ai_token_type="total"} 1"#,
        r#"gen_ai_client_token_usage_bucket{le="16.0",resource="chat",gen_ai_token_type="total"} 0"#,
        r#"gen_ai_client_token_usage_sum{resource="chat",gen_ai_token_type="total"} 42.0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
    common::promtool_check("weir proxy with token usage and traces", &text);

    // Not sampled: admitted without a span, and the caller's traceparent passes untouched.
    let unsampled = format!("00-{TRACE}-{PARENT}-00");
    let a = common::request(addr, "GET", "/api/x", &[("traceparent", &unsampled)], "").await;
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    assert_eq!(seen.lock().unwrap().last().cloned().unwrap(), unsampled);
    none(&mut spans).await;
    // Refused: a span, whatever the flag; nothing reaches the upstream.
    let before = seen.lock().unwrap().len();
    let r = common::request(addr, "GET", "/api/x", &[("traceparent", &unsampled)], "").await;
    assert!(r.starts_with("HTTP/1.1 429"), "{r}");
    let refused = next(&mut spans).await;
    assert_eq!(attr(&refused, "weir.verdict").as_deref(), Some("refused"));
    assert_eq!(attr(&refused, "weir.rule").as_deref(), Some("api-rate"));
    assert_eq!(attr(&refused, "weir.rule.kind").as_deref(), Some("flow"));
    assert_eq!(hex(&refused.parent_span_id), PARENT);
    assert_eq!(seen.lock().unwrap().len(), before);
    // A path no route names is not a decision: no span, traceparent untouched.
    let a = common::request(addr, "GET", "/other", &[("traceparent", &sampled)], "").await;
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    assert_eq!(seen.lock().unwrap().last().cloned().unwrap(), sampled);
    none(&mut spans).await;
}
