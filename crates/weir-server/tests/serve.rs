//! The `weir serve` process built in-process through weir-server's builders, on listeners
//! bound to 127.0.0.1:0 — what an embedding program does, without the binary: a decision over
//! Lyft's HTTP API, a lease from a lease server served beside it, the gRPC port's health, and
//! typed errors for a bad configuration.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use weir_server::quota::api::{OpenError, QuotaApi};
use weir_server::rls::{LoadError, MemoryStore};
use weir_server::serve::Server;

mod common;

fn file(name: &str, text: &str) -> std::path::PathBuf {
    common::file("serve", name, text)
}

/// One GET (with `accept`, if given).
async fn get(addr: std::net::SocketAddr, path: &str, accept: Option<&str>) -> String {
    let headers: Vec<(&str, &str)> = accept.map(|a| ("Accept", a)).into_iter().collect();
    common::request(addr, "GET", path, &headers, "").await
}

/// One POST of a JSON body.
async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> String {
    common::request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serve_process_decides_and_leases_on_its_two_ports() {
    let quota = QuotaApi::load(file(
        "quota.yaml",
        "resources:\n  - {name: search, capacity: 1000/s}\n",
    ))
    .unwrap();
    let server = Arc::new(
        Server::builder()
            .store(MemoryStore::default())
            .quota(quota)
            .build()
            .unwrap(),
    );
    assert!(
        server.quota().is_some(),
        "the lease server is served beside"
    );
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (grpc_addr, http_addr) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let serving = {
        let (server, mut a, mut b) = (server.clone(), stopped.clone(), stopped);
        tokio::spawn(async move {
            tokio::join!(
                server.serve_grpc(grpc, async move {
                    let _ = a.wait_for(|s| *s).await;
                }),
                server.serve_http(http, None, async move {
                    let _ = b.wait_for(|s| *s).await;
                }),
            );
        })
    };

    // A decision of the bundled example over Lyft's JSON API.
    let decision = post(
        http_addr,
        "/json",
        r#"{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}"#,
    )
    .await;
    assert!(decision.starts_with("HTTP/1.1 200"), "{decision}");
    assert!(decision.contains(r#""overallCode":"OK""#), "{decision}");

    // A lease from the lease server on the same HTTP port: a learning server grants what the
    // client says it uses on its own.
    let lease = post(
        http_addr,
        "/quota/v1/refresh",
        r#"{"client":"host-7","resources":[{"resource":"search","wants":120,"safe":50}]}"#,
    )
    .await;
    assert!(lease.starts_with("HTTP/1.1 200"), "{lease}");
    assert!(lease.contains(r#""granted":50.0"#), "{lease}");
    assert!(lease.contains(r#""leaseId""#), "{lease}");

    // The gRPC port: health (`grpc.health.v1.Health/Check`, an empty request framed) over
    // HTTP/2 with prior knowledge, as Envoy calls it.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let request = http::Request::post(format!("http://{grpc_addr}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(&[
            0, 0, 0, 0, 0,
        ])))
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .expect("a gRPC answer within 10 s")
        .unwrap();
    assert_eq!(answer.status(), 200);
    let body = http_body_util::BodyExt::collect(answer.into_body())
        .await
        .unwrap();
    let trailers = body.trailers().cloned().expect("gRPC trailers");
    assert_eq!(trailers["grpc-status"], "0", "{trailers:?}");
    // HealthCheckResponse { status: SERVING (1) }, framed: field 1, varint 1.
    assert_eq!(&body.to_bytes()[..], &[0, 0, 0, 0, 2, 8, 1]);

    // `/metrics` in the text format (no Accept) passes promtool; Prometheus's own Accept gets
    // OpenMetrics, with the same samples.
    let text = get(http_addr, "/metrics", None).await;
    assert!(
        text.contains("content-type: text/plain; version=0.0.4"),
        "{text}"
    );
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    assert!(
        body.contains("weir_rls_hits_total{rule=\"example.remote_address\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("weir_quota_"),
        "the lease server's families: {body}"
    );
    common::promtool_check("weir serve --quota", body);
    common::check_dashboard("weir-serve", body);
    common::check_dashboard("weir-quota", body);
    let open = get(
        http_addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
    )
    .await;
    assert!(
        open.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{open}"
    );
    assert!(open.ends_with("# EOF\n"), "{open}");

    stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the servers stop within 10 s")
        .unwrap();
}

#[test]
fn a_bad_configuration_is_a_typed_error_naming_its_file_and_line() {
    let path = file(
        "lyft.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n",
    );
    let Err(e) = Server::builder().config_file(&path).build() else {
        panic!("a unit that is no unit was accepted");
    };
    let LoadError::Config(problems) = &e.0 else {
        panic!("not the file's problems: {e}");
    };
    assert_eq!(problems.len(), 1, "{e}");
    let text = e.to_string();
    assert!(text.contains("lyft.yaml:4:"), "{text}");
    assert!(text.contains("fortnight"), "{text}");
}

#[test]
fn a_bad_quota_file_is_a_typed_error_one_problem_per_line() {
    let path = file(
        "bad-quota.yaml",
        "resources:\n  - {name: a, capacity: -1/s}\n  - {name: a, capacity: 5/s}\n",
    );
    let Err(e) = QuotaApi::load(path) else {
        panic!("a negative capacity was accepted");
    };
    assert!(matches!(e, OpenError::Config(_)), "{e}");
    let text = e.to_string();
    assert!(text.lines().count() >= 1, "{text}");
    assert!(text.contains("bad-quota.yaml:2:"), "{text}");
}
