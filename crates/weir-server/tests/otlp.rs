//! OTLP export of `weir serve`'s metrics (with a lease server), in-process, to a receiver of
//! this test that decodes what arrives with the OpenTelemetry project's own generated types
//! (`opentelemetry-proto`): over HTTP/protobuf and over gRPC, every counter, gauge and
//! histogram `/metrics` shows arrives with the same name, labels and values; a collector that
//! refuses, one that never answers and one that is not there cost the decisions nothing and
//! are counted; one whose answer never ends is read no further than 64 KiB.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use weir_server::admin::metrics::Metrics;
use weir_server::otlp::{self, Protocol, Settings};
use weir_server::quota::api::QuotaApi;
use weir_server::rls::MemoryStore;
use weir_server::serve::Server;

mod common;

/// How the receiver answers.
#[derive(Clone, Copy, PartialEq)]
enum Collector {
    /// Takes every export.
    Takes,
    /// Answers 503 (HTTP) or UNAVAILABLE (gRPC).
    Refuses,
    /// Reads the request and never answers.
    Hangs,
    /// Answers 200 with a body that never ends.
    Floods,
}

/// A receiver on 127.0.0.1:0 for both transports (HTTP/1.1 and h2c), sending each export it
/// takes, decoded, to the returned channel.
async fn receiver(
    mode: Collector,
) -> (
    SocketAddr,
    mpsc::UnboundedReceiver<ExportMetricsServiceRequest>,
) {
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
                            == "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
                            let path_ok = grpc || req.uri().path() == "/v1/metrics";
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            if mode == Collector::Hangs {
                                std::future::pending::<()>().await;
                            }
                            let message = if grpc { body.slice(5..) } else { body };
                            let decoded = ExportMetricsServiceRequest::decode(message);
                            let taken = mode == Collector::Takes && path_ok && decoded.is_ok();
                            if let (true, Ok(d)) = (taken, decoded) {
                                let _ = tx.send(d);
                            }
                            if mode == Collector::Floods {
                                let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
                                let endless = futures_util::StreamExt::map(
                                    futures_util::stream::repeat_with(move || chunk.clone()),
                                    |c| {
                                        Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(
                                            c,
                                        ))
                                    },
                                );
                                let body = http_body_util::StreamBody::new(endless);
                                return Ok(http::Response::builder().body(body.boxed()).unwrap());
                            }
                            let response = match (grpc, taken) {
                                (true, ok) => {
                                    // An empty response message, then the status in trailers.
                                    let status = if ok { "0" } else { "14" };
                                    let frame = Bytes::from_static(&[0, 0, 0, 0, 0]);
                                    let mut trailers = http::HeaderMap::new();
                                    trailers.insert("grpc-status", status.parse().unwrap());
                                    let body = http_body_util::StreamBody::new(
                                        futures_util::stream::iter([
                                            Ok::<_, std::convert::Infallible>(
                                                hyper::body::Frame::data(frame),
                                            ),
                                            Ok(hyper::body::Frame::trailers(trailers)),
                                        ]),
                                    );
                                    http::Response::builder()
                                        .header("content-type", "application/grpc")
                                        .body(body.boxed())
                                        .unwrap()
                                }
                                (false, ok) => http::Response::builder()
                                    .status(if ok { 200 } else { 503 })
                                    .header("content-type", "application/x-protobuf")
                                    .body(Full::new(Bytes::new()).boxed())
                                    .unwrap(),
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

/// One request with a JSON body; the answer's body.
async fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> String {
    let answer = common::request(
        addr,
        method,
        path,
        &[("Content-Type", "application/json")],
        body,
    )
    .await;
    answer
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string())
}

/// `weir serve` with a lease server on 127.0.0.1:0, its registry, and its HTTP address.
async fn serve() -> (Arc<Metrics>, SocketAddr, tokio::sync::watch::Sender<bool>) {
    let quota = QuotaApi::load(common::file(
        "otlp",
        "quota.yaml",
        "resources:\n  - {name: search, capacity: 1000/s}\n",
    ))
    .unwrap();
    let metrics = Arc::new(Metrics::new());
    let server = Arc::new(
        Server::builder()
            .store(MemoryStore::default())
            .quota(quota)
            .metrics(metrics.clone())
            .build()
            .unwrap(),
    );
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = http.local_addr().unwrap();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        server
            .serve_http(http, None, async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await;
    });
    (metrics, addr, stop)
}

/// Some traffic: decisions (one over the limit) and a lease.
async fn traffic(addr: SocketAddr) {
    let decision = r#"{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}"#;
    for _ in 0..3 {
        call(addr, "POST", "/json", decision).await;
    }
    call(
        addr,
        "POST",
        "/quota/v1/refresh",
        r#"{"client":"host-7","resources":[{"resource":"search","wants":120,"safe":50}]}"#,
    )
    .await;
}

/// A series: its family, its labels, and its value (counters and gauges) or its count, sum
/// and per-bucket counts (histograms).
type Series = BTreeMap<SeriesKey, String>;

/// A series' family and labels.
type SeriesKey = (String, Vec<(String, String)>);

/// The series of an export (the exporter's own counts left out: they move with each export).
fn exported(request: &ExportMetricsServiceRequest) -> Series {
    let mut out = Series::new();
    let labels = |attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue]| {
        attrs
            .iter()
            .map(|kv| {
                let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(any_value::Value::StringValue(s)) => s.clone(),
                    other => panic!("a label that is not a string: {other:?}"),
                };
                (kv.key.clone(), v)
            })
            .collect::<Vec<_>>()
    };
    let number = |v: &Option<number_data_point::Value>| match v {
        Some(number_data_point::Value::AsInt(i)) => i.to_string(),
        Some(number_data_point::Value::AsDouble(d)) => format!("{d}"),
        None => "none".into(),
    };
    for rm in &request.resource_metrics {
        for sm in &rm.scope_metrics {
            for m in sm.metrics.iter().filter(|m| m.name != "weir_otlp_exports") {
                match &m.data {
                    Some(metric::Data::Sum(s)) => {
                        assert!(s.is_monotonic, "{}", m.name);
                        assert_eq!(s.aggregation_temporality, 2, "cumulative: {}", m.name);
                        for p in &s.data_points {
                            out.insert((m.name.clone(), labels(&p.attributes)), number(&p.value));
                        }
                    }
                    Some(metric::Data::Gauge(g)) => {
                        for p in &g.data_points {
                            out.insert((m.name.clone(), labels(&p.attributes)), number(&p.value));
                        }
                    }
                    Some(metric::Data::Histogram(h)) => {
                        for p in &h.data_points {
                            let value = format!(
                                "count {} sum {:?} buckets {:?} bounds {:?}",
                                p.count, p.sum, p.bucket_counts, p.explicit_bounds
                            );
                            out.insert((m.name.clone(), labels(&p.attributes)), value);
                        }
                    }
                    other => panic!("{}: unexpected data {other:?}", m.name),
                }
            }
        }
    }
    out
}

/// The same series read from the registry's exposition, as `/metrics` shows it.
fn scraped(metrics: &Metrics) -> Series {
    // The exporter's own encoding is what is under test; read the text independently here.
    let text = metrics.render();
    let mut kinds = BTreeMap::new();
    let mut out = Series::new();
    // Per histogram series: count, sum, and (bound, cumulative count) per bucket.
    type Read = (u64, f64, Vec<(f64, u64)>);
    let mut histograms: BTreeMap<SeriesKey, Read> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            kinds.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        let mut pairs: Vec<(String, String)> = Vec::new();
        // Label values here have no `,` or `"` escapes except in quoted text we do not use.
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once("=\"").unwrap();
            pairs.push((k.to_string(), v.trim_end_matches('"').to_string()));
        }
        let family = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| kinds.contains_key(*f)))
            .unwrap_or(name);
        if family.starts_with("weir_otlp_exports") {
            continue;
        }
        match kinds.get(family).map(String::as_str) {
            Some("histogram") => {
                let le = pairs
                    .iter()
                    .position(|(k, _)| k == "le")
                    .map(|i| pairs.remove(i));
                let h = histograms.entry((family.to_string(), pairs)).or_default();
                match (name.strip_prefix(family), le) {
                    (Some("_bucket"), Some((_, le))) => {
                        h.2.push((le.parse().unwrap(), value.parse::<f64>().unwrap() as u64))
                    }
                    (Some("_sum"), _) => h.1 = value.parse().unwrap(),
                    (Some("_count"), _) => h.0 = value.parse().unwrap(),
                    _ => {}
                }
            }
            _ => {
                let v: f64 = value.parse().unwrap();
                let shown = if v.fract() == 0.0 && !value.contains('.') {
                    format!("{}", v as i64)
                } else {
                    format!("{v}")
                };
                out.insert((family.to_string(), pairs), shown);
            }
        }
    }
    for (key, (count, sum, buckets)) in histograms {
        let mut below = 0;
        let per_bucket: Vec<u64> = buckets
            .iter()
            .map(|(_, c)| {
                let n = c - below;
                below = *c;
                n
            })
            .collect();
        let bounds: Vec<f64> = buckets
            .iter()
            .map(|(b, _)| *b)
            .filter(|b| b.is_finite())
            .collect();
        out.insert(
            key,
            format!(
                "count {count} sum {:?} buckets {per_bucket:?} bounds {bounds:?}",
                Some(sum)
            ),
        );
    }
    out
}

async fn exports_equal_scrapes(protocol: Protocol) {
    let (metrics, addr, stop) = serve().await;
    let (collector, mut received) = receiver(Collector::Takes).await;
    let settings = Settings {
        interval: Duration::from_millis(100),
        resource: vec![("deployment.environment".into(), "test".into())],
        ..Settings::new(&format!("http://{collector}"), protocol, "weir-serve").unwrap()
    };
    let exporter = otlp::spawn(metrics.clone(), settings);
    traffic(addr).await;
    // The first export after the traffic, and the registry read at once: nothing moves in
    // between (no traffic), so both show the same values.
    let deadline = Instant::now() + Duration::from_secs(10);
    let request = loop {
        let r = tokio::time::timeout_at(deadline.into(), received.recv())
            .await
            .expect("an export within 10 s")
            .unwrap();
        let series = exported(&r);
        let hits = series.get(&(
            "weir_rls_hits".to_string(),
            vec![("rule".to_string(), "example.remote_address".to_string())],
        ));
        if hits.map(String::as_str) == Some("3")
            && series.keys().any(|(n, _)| n == "weir_quota_client_granted")
        {
            break r;
        }
    };
    let (sent, shown) = (exported(&request), scraped(&metrics));
    assert_eq!(sent, shown, "the export and /metrics differ");
    assert!(sent.len() > 20, "{sent:?}");
    for family in [
        "weir_rls_over_limit",
        "weir_rls_decision_seconds",
        "weir_quota_granted",
    ] {
        assert!(sent.keys().any(|(n, _)| n == family), "no {family}");
    }
    let resource = request.resource_metrics[0].resource.as_ref().unwrap();
    let attrs: Vec<(String, String)> = resource
        .attributes
        .iter()
        .map(|kv| {
            let Some(any_value::Value::StringValue(v)) =
                kv.value.as_ref().and_then(|v| v.value.clone())
            else {
                panic!("not a string")
            };
            (kv.key.clone(), v)
        })
        .collect();
    assert_eq!(
        attrs,
        [
            ("service.name".to_string(), "weir-serve".to_string()),
            ("deployment.environment".to_string(), "test".to_string())
        ]
    );
    // Taken: counted once the collector's answer arrives.
    while exporter.exported() == 0 {
        assert!(
            Instant::now() < deadline,
            "the collector's answer was not taken as success"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The exporter's own counts are in /metrics too.
    assert!(metrics
        .render()
        .contains("weir_otlp_exports_total{result=\"ok\"}"));
    stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_protobuf_exports_what_metrics_shows() {
    exports_equal_scrapes(Protocol::HttpProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_exports_what_metrics_shows() {
    exports_equal_scrapes(Protocol::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_collectors_are_counted_and_decisions_go_on() {
    let (metrics, addr, stop) = serve().await;
    let (refusing, _) = receiver(Collector::Refuses).await;
    let (hanging, _) = receiver(Collector::Hangs).await;
    // A port nothing listens on: bound, then closed.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut exporters = Vec::new();
    for (collector, protocol) in [
        (refusing, Protocol::HttpProtobuf),
        (refusing, Protocol::Grpc),
        (hanging, Protocol::HttpProtobuf),
        (gone, Protocol::Grpc),
    ] {
        let settings = Settings {
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(300),
            ..Settings::new(&format!("http://{collector}"), protocol, "weir-serve").unwrap()
        };
        exporters.push(otlp::spawn(metrics.clone(), settings));
    }
    // Decisions go on while every export fails.
    let started = Instant::now();
    for _ in 0..20 {
        traffic(addr).await;
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(800)).await;
    for (i, e) in exporters.iter().enumerate() {
        assert_eq!(
            e.exported(),
            0,
            "exporter {i} exported to a failing collector"
        );
        assert!(e.lost() >= 2, "exporter {i}: {} lost", e.lost());
    }
    // The hanging collector: exports time out, ticks meanwhile are dropped.
    let text = metrics.render();
    let dropped = text
        .lines()
        .filter(|l| l.starts_with("weir_otlp_exports_total{result=\"dropped\"}"))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum::<u64>();
    assert!(dropped >= 1, "{text}");
    let hits = call(addr, "GET", "/metrics", "").await;
    assert!(hits.contains("weir_rls_hits_total{rule=\"example.remote_address\"}"));
    stop.send_replace(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_never_ends_is_cut_off_not_held() {
    let (flooding, _) = receiver(Collector::Floods).await;
    let registry = Arc::new(Metrics::new());
    // A timeout far longer than the test: what ends each export is the bound on the answer.
    let settings = Settings {
        interval: Duration::from_millis(50),
        timeout: Duration::from_secs(60),
        ..Settings::new(
            &format!("http://{flooding}"),
            Protocol::HttpProtobuf,
            "weir-serve",
        )
        .unwrap()
    };
    let exporter = otlp::spawn(registry.clone(), settings);
    let deadline = Instant::now() + Duration::from_secs(10);
    let failed = || {
        registry
            .render()
            .lines()
            .find_map(|l| l.strip_prefix("weir_otlp_exports_total{result=\"failed\"} "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    while failed() < 3 {
        assert!(
            Instant::now() < deadline,
            "the endless answers were not cut off"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(exporter.exported(), 0);
}
