//! `weir serve` and `weir check-config` through the real binary: HTTP /json, gRPC RLS v3,
//! bad input, hot reload, and two processes sharing one limit on a real Redis.

use crate::{common, support};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde_json::Value;

struct Serve {
    child: Child,
    http: u16,
    grpc: u16,
}

impl Serve {
    fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        // Minute limits: the longest test (a reload) counts within one window.
        common::inside_minute(Duration::from_secs(15));
        let (http, grpc) = (support::free_port(), support::free_port());
        let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
            .envs(env.iter().copied())
            .arg("serve")
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("weir serve starts");
        // The first line says where it listens.
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        if !line.contains("gRPC RLS v3 on") {
            // It stopped before listening: say why.
            let _ = child.kill();
            let mut err = String::new();
            let _ = child.stderr.as_mut().unwrap().read_to_string(&mut err);
            panic!("weir serve did not start: {line:?}, stderr: {err}");
        }
        let s = Self { child, http, grpc };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if s.get("/healthz").is_some_and(|(c, _)| c == 200) {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("weir serve did not answer /healthz");
    }

    fn request(&self, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.http)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let code = out.get(9..12)?.parse().ok()?;
        let body = out
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Some((code, body))
    }

    /// Everything the process wrote to stderr (call once it has exited or been killed).
    fn stderr_after_exit(&mut self) -> String {
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        self.request("GET", path, "")
    }

    fn json(&self, body: &str) -> (u16, Value) {
        let (code, text) = self.request("POST", "/json", body).expect("answer");
        (
            code,
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("JSON: {text}")),
        )
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("limits.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

fn temp_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("weir-serve-{}-{name}", std::process::id()))
}

const CONFIG: &str = "domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /cart
    descriptors:
      - key: user
        rate_limit: {window: 30s, requests_per_unit: 2, algorithm: sliding_log}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: api
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: sliding_window}
";

fn body(entries: &[(&str, &str)]) -> String {
    let e: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!(r#"{{"key":"{k}","value":"{v}"}}"#))
        .collect();
    format!(
        r#"{{"domain":"shop","descriptors":[{{"entries":[{}]}}]}}"#,
        e.join(",")
    )
}

#[test]
fn http_json_limits_exactly_then_429_and_refuses_bad_input() {
    let dir = temp_dir("http");
    let config = write_config(&dir, CONFIG);
    let s = Serve::start(&["--config", config.to_str().unwrap()]);
    let codes: Vec<u16> = (0..5)
        .map(|_| s.json(&body(&[("user", "ann")])).0)
        .collect();
    assert_eq!(codes, [200, 200, 200, 429, 429]);
    let (_, v) = s.json(&body(&[("user", "ann")]));
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    assert_eq!(v["statuses"][0]["currentLimit"]["requestsPerUnit"], 3);
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(v["statuses"][0]["limitRemaining"], 0);
    // another user has its own counter; nested path with a 30 s sliding log
    assert_eq!(s.json(&body(&[("user", "bob")])).0, 200);
    let cart = body(&[("path", "/cart"), ("user", "ann")]);
    let codes: Vec<u16> = (0..3).map(|_| s.json(&cart).0).collect();
    assert_eq!(codes, [200, 200, 429]);
    // shadow mode: never blocks
    assert!((0..3).all(|_| s.json(&body(&[("shadowed", "x")])).0 == 200));
    // the bucketed sliding window (extension)
    let codes: Vec<u16> = (0..5).map(|_| s.json(&body(&[("api", "k")])).0).collect();
    assert_eq!(codes, [200, 200, 200, 200, 429]);
    // no matching rule: OK
    assert_eq!(s.json(&body(&[("unknown", "x")])).0, 200);
    // a per-descriptor override in the JSON form: 1 per hour
    let over = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"ovr"}],"limit":{"requestsPerUnit":1,"unit":"HOUR"}}]}"#;
    assert_eq!(s.json(over).0, 200);
    let (code, v) = s.json(over);
    assert_eq!(
        (code, v["statuses"][0]["currentLimit"]["unit"].as_str()),
        (429, Some("HOUR"))
    );
    // bad input: 400 with a reason
    for (bad, needle) in [
        (
            r#"{"domain":"","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}"#,
            "domain",
        ),
        (r#"{"domain":"shop","descriptors":[]}"#, "descriptor list"),
        (
            r#"{"domain":"shop","descriptors":[{"entries":[{"key":"","value":"b"}]}]}"#,
            "empty key",
        ),
        (
            r#"{"domain":"shop","descriptors":[{"entries":[{"key":"a","value":""}]}]}"#,
            "empty value",
        ),
        (
            r#"{"domain":"shop","descriptors":[{"entries":[{"key":"a","value":"b"}],"bogus":1}]}"#,
            "bogus",
        ),
        ("not json", "request body"),
        (
            r#"{"domain":"shop","descriptors":[{"entries":[{"key":"a","value":"b"}],"limit":{"requestsPerUnit":1,"unit":"fortnight"}}]}"#,
            "unknown unit \"fortnight\"",
        ),
        (
            r#"{"domain":"shop","descriptors":[{"entries":[{"key":"a","value":"\ud800"}]}]}"#,
            "a lone one is not a character",
        ),
    ] {
        let (code, v) = s.json(bad);
        assert_eq!(code, 400, "{bad}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{bad}: {v}");
    }
    let (code, metrics) = s.get("/metrics").unwrap();
    assert_eq!(code, 200);
    // Every malformed body above is counted (8 refused, none before).
    assert!(
        metrics.contains("weir_rls_bad_requests_total 8"),
        "{metrics}"
    );
    assert!(
        metrics.contains("weir_rls_over_limit_total{rule=\"shop.user\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("weir_rls_shadow_over_limit_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE weir_rls_decision_seconds histogram")
            && metrics.contains("weir_rls_decision_seconds_bucket{le=\"+Inf\"}"),
        "{metrics}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// gRPC streams on one HTTP/2 connection that each send `chunk` bytes and never end:
/// the `grpc-status` each is answered with, and the most buffered bytes `/metrics` reported.
async fn unfinished_streams(s: &Serve, streams: usize, chunk: usize) -> (Vec<String>, u64) {
    use futures_util::StreamExt;
    use http_body_util::StreamBody;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", s.grpc))
        .await
        .unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let data = bytes::Bytes::from(vec![0u8; chunk]);
    let calls: Vec<_> = (0..streams)
        .map(|_| {
            let mut sender = sender.clone();
            let data = data.clone();
            tokio::spawn(async move {
                let frames = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(
                    hyper::body::Frame::data(data),
                )])
                .chain(futures_util::stream::pending());
                let req = http::Request::post(format!(
                    "http://x{}",
                    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
                ))
                .header("content-type", "application/grpc")
                .body(StreamBody::new(frames))
                .unwrap();
                let r = sender.send_request(req).await.unwrap();
                r.headers()
                    .get("grpc-status")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default()
            })
        })
        .collect();
    let mut most = 0u64;
    let http = s.http;
    let sampler = tokio::spawn(async move {
        let mut most = 0u64;
        for _ in 0..20 {
            let text = tokio::task::spawn_blocking(move || {
                let s = std::net::TcpStream::connect(("127.0.0.1", http)).unwrap();
                let mut s = s;
                write!(
                    s,
                    "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
                )
                .unwrap();
                let mut out = String::new();
                let _ = s.read_to_string(&mut out);
                out
            })
            .await
            .unwrap();
            if let Some(v) = text
                .lines()
                .find_map(|l| l.strip_prefix("weir_buffered_body_bytes "))
            {
                most = most.max(v.trim().parse().unwrap());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        most
    });
    let mut codes = Vec::new();
    for c in calls {
        codes.push(
            tokio::time::timeout(Duration::from_secs(20), c)
                .await
                .expect("every stream is answered")
                .unwrap(),
        );
    }
    most = most.max(sampler.await.unwrap());
    (codes, most)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_bodies_are_bounded_per_connection_and_in_time() {
    let s = tokio::task::spawn_blocking(|| {
        Serve::start(&["--body-timeout", "1s", "--max-buffered-bytes", "8388608"])
    })
    .await
    .unwrap();
    // 12 streams × 1 MiB that never end, on one connection whose bound is 4 MiB.
    let started = Instant::now();
    let (codes, most) = unfinished_streams(&s, 12, 1 << 20).await;
    assert!(
        codes.iter().all(|c| c == "4" || c == "8"),
        "DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED only: {codes:?}"
    );
    assert!(codes.iter().any(|c| c == "8"), "{codes:?}");
    assert!(codes.iter().any(|c| c == "4"), "{codes:?}");
    assert!(most <= 4 << 20, "{most} bytes buffered by one connection");
    assert!(started.elapsed() < Duration::from_secs(10));
    // A /json body announced as 1000 bytes that sends 2: answered 408 after the body timeout.
    let http = s.http;
    let (code, took) = tokio::task::spawn_blocking(move || {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", http)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let t = Instant::now();
        write!(
            c,
            "POST /json HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n{{}}"
        )
        .unwrap();
        let mut out = [0u8; 12];
        c.read_exact(&mut out).unwrap();
        (
            String::from_utf8_lossy(&out[9..12]).to_string(),
            t.elapsed(),
        )
    })
    .await
    .unwrap();
    assert_eq!(code, "408");
    assert!(took >= Duration::from_millis(900), "{took:?}");
    drop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_grpc_connections_cannot_lock_out_envoy() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = temp_dir("idle");
    let config = write_config(&dir, CONFIG);
    let s = tokio::task::spawn_blocking(move || {
        Serve::start(&[
            "--config",
            config.to_str().unwrap(),
            "--max-connections",
            "4",
            "--header-timeout",
            "4s",
            "--idle-timeout",
            "1s",
        ])
    })
    .await
    .unwrap();
    // Twice the cap of connections that send only the HTTP/2 preface, then nothing.
    let mut squatters = Vec::new();
    for _ in 0..8 {
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", s.grpc))
            .await
            .unwrap();
        c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        squatters.push(c);
    }
    // A real client still gets its answer (idle ones make room), well before any timeout.
    let started = Instant::now();
    let call = async {
        let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", s.grpc))
            .await
            .unwrap();
        client
            .should_rate_limit(grpc_request(&[("user", "idle")], None, None))
            .await
            .unwrap()
            .into_inner()
    };
    let r = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("answered despite the idle connections");
    assert_eq!(r.overall_code, 1);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered only after {:?}: the squatters' own timeout, not room made for it",
        started.elapsed()
    );
    // A connection that carried a call is closed (GOAWAY) after 1 s without one.
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", s.grpc))
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::post("http://x/unknown.Service/Method")
        .header("content-type", "application/grpc")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let answered = sender.send_request(req).await.unwrap();
    assert_eq!(answered.headers()["grpc-status"], "12");
    let served = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("an idle connection is closed")
        .unwrap()
        .ok();
    assert!(
        served.elapsed() >= Duration::from_millis(900),
        "{:?}",
        served.elapsed()
    );
    // The squatters that were not closed to make room are closed after the header timeout.
    let mut buf = [0u8; 64];
    for mut c in squatters {
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue,
                }
            }
        })
        .await;
        assert!(
            closed.is_ok(),
            "a connection that never sent a request stayed open"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn grpc_request(
    entries: &[(&str, &str)],
    hits: Option<u64>,
    limit: Option<(u32, i32)>,
) -> RateLimitRequest {
    RateLimitRequest {
        domain: "shop".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            limit: limit.map(|(rpu, unit)| RateLimitOverride {
                requests_per_unit: rpu,
                unit,
            }),
            hits_addend: hits.map(|value| envoy_types::pb::google::protobuf::UInt64Value { value }),
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_should_rate_limit_with_hits_and_overrides() {
    let dir = temp_dir("grpc");
    let config = write_config(&dir, CONFIG);
    let s =
        tokio::task::spawn_blocking(move || Serve::start(&["--config", config.to_str().unwrap()]))
            .await
            .unwrap();
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", s.grpc))
        .await
        .unwrap();
    // hits_addend 0 on a descriptor = check only
    let r = client
        .should_rate_limit(grpc_request(&[("user", "g")], Some(0), None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 1, "OK");
    assert_eq!(r.statuses[0].limit_remaining, 3);
    // 2 then 1: exactly the limit of 3
    let r = client
        .should_rate_limit(grpc_request(&[("user", "g")], Some(2), None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (1, 1));
    let r = client
        .should_rate_limit(grpc_request(&[("user", "g")], None, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (1, 0));
    let r = client
        .should_rate_limit(grpc_request(&[("user", "g")], None, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 2, "OVER_LIMIT");
    let reset = r.statuses[0].duration_until_reset.unwrap();
    assert!(reset.seconds > 0 && reset.seconds <= 60);
    // a per-descriptor override: 1 per second for this descriptor
    let r = client
        .should_rate_limit(grpc_request(&[("user", "o")], None, Some((1, 1))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            r.overall_code,
            r.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit
        ),
        (1, 1)
    );
    let r = client
        .should_rate_limit(grpc_request(&[("user", "o")], None, Some((1, 1))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 2);
    // bad input: INVALID_ARGUMENT with a reason
    let e = client
        .should_rate_limit(grpc_request(&[("user", "")], None, None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("empty value"), "{}", e.message());
    drop(s);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn hot_reload_applies_changes_keeps_counters_and_survives_bad_files() {
    let dir = temp_dir("reload");
    let config = write_config(&dir, CONFIG);
    let mut s = Serve::start(&["--config", config.to_str().unwrap()]);
    assert_eq!(s.json(&body(&[("user", "kim")])).0, 200);
    // An invalid file: reported, the old rules stay.
    std::fs::write(
        &config,
        "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: nope}\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(1_600));
    let codes: Vec<u16> = (0..3)
        .map(|_| s.json(&body(&[("user", "kim")])).0)
        .collect();
    assert_eq!(
        codes,
        [200, 200, 429],
        "old rule (3 per minute) still in force, counter kept"
    );
    // A valid change: the new limit applies; the unchanged nested rule keeps its counter.
    let cart = body(&[("path", "/cart"), ("user", "kim")]);
    assert_eq!(s.json(&cart).0, 200);
    std::fs::write(
        &config,
        CONFIG.replace("requests_per_unit: 3}", "requests_per_unit: 10}"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.json(&body(&[("user", "lee")])).1["statuses"][0]["currentLimit"]["requestsPerUnit"]
        != 10
    {
        assert!(Instant::now() < deadline, "reload not applied");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(s.json(&cart).0, 200);
    assert_eq!(
        s.json(&cart).0,
        429,
        "nested rule kept its count across the reload"
    );
    // The changed rule kept its counter too: kim's 4 hits (the refused one counted, as Lyft
    // counts it) leave 6 of the new limit.
    let kim: Vec<u16> = (0..10)
        .map(|_| s.json(&body(&[("user", "kim")])).0)
        .collect();
    assert_eq!(kim.iter().filter(|c| **c == 200).count(), 6, "{kim:?}");
    // Lowered back during an incident: no fresh quota for anyone who used it.
    std::fs::write(&config, CONFIG).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.json(&body(&[("user", "new")])).1["statuses"][0]["currentLimit"]["requestsPerUnit"] != 3
    {
        assert!(Instant::now() < deadline, "reload not applied");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(s.json(&body(&[("user", "kim")])).0, 429);
    let _ = s.child.kill();
    let err = s.stderr_after_exit();
    assert!(
        err.contains("reload kept the previous configuration") && err.contains("limits.yaml:4:"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn instances_divide_only_a_shared_store() {
    // A memory store is one process's: `--instances 2` would halve every limit for nothing.
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["serve", "--instances", "2", "--http-addr", "127.0.0.1:0"])
        .args(["--grpc-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("weir: error: --instances applies to a shared store"),
        "{err}"
    );
}

#[test]
fn check_config_prints_rules_or_every_error() {
    let dir = temp_dir("check");
    let good = write_config(&dir, CONFIG);
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["check-config", good.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("shop.path_/cart.user: 2 per 30s (sliding_log)"),
        "{text}"
    );
    std::fs::write(dir.join("b.yaml"), "domain: other\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2.5}\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 4000000, algorithm: sliding_log}\n").unwrap();
    std::fs::write(dir.join("c.yml"), "domain: shop\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["check-config", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    // Every error of a file in one run.
    assert!(
        err.contains("b.yaml:4:") && err.contains("descriptors[0].rate_limit.unit: unknown unit"),
        "{err}"
    );
    assert!(
        err.contains("b.yaml:6:")
            && err
                .contains("descriptors[1].rate_limit.requests_per_unit: 2.5 is not a whole number"),
        "{err}"
    );
    assert!(
        err.contains("b.yaml:8:17: descriptors[2].rate_limit: sliding_log 4000000"),
        "{err}"
    );
    assert!(
        err.contains("c.yml") && err.contains("domain \"shop\" is also defined"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn check_config_refuses_huge_deep_and_odd_files_at_once_and_clearly() {
    let dir = temp_dir("odd");
    std::fs::create_dir_all(&dir).unwrap();
    let check = |name: &str, contents: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, contents).unwrap();
        let t = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["check-config", p.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), err, t.elapsed())
    };
    // 9 MiB: refused before it is parsed.
    let mut big = b"domain: d\ndescriptors:\n".to_vec();
    while big.len() < 9 << 20 {
        big.extend_from_slice(
            b"  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
        );
    }
    let (code, err, took) = check("big.yaml", &big);
    assert_eq!(code, Some(2));
    assert!(err.contains("big.yaml: larger than 8 MiB"), "{err}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // 200 KB of `[`: refused at the 65th with its place.
    let mut deep = b"domain: ".to_vec();
    deep.extend(std::iter::repeat_n(b'[', 200_000));
    let (code, err, took) = check("deep.yaml", &deep);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("deep.yaml:1:73: nested deeper than 64"),
        "{err}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    // A UTF-8 byte-order mark is not a second document.
    let mut bom = "\u{feff}".as_bytes().to_vec();
    bom.extend_from_slice(CONFIG.as_bytes());
    assert_eq!(check("bom.yaml", &bom).0, Some(0));
    // A count past 2^64 names the field and the bound.
    let huge = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 18446744073709551616}\n";
    let (code, err, _) = check("huge.yaml", huge.as_bytes());
    assert_eq!(code, Some(2));
    assert!(
        err.contains("huge.yaml:4:")
            && err.contains("cannot be counted exactly: at most 9007199254740992"),
        "{err}"
    );
    // A GCRA limit too large to be exact: said once, with the place, no rule name repeated.
    let gcra = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 9007199254740992, algorithm: gcra}\n";
    let (code, err, _) = check("gcra.yaml", gcra.as_bytes());
    assert_eq!(code, Some(2));
    assert!(
        err.contains("gcra.yaml:3:") && !err.contains("rule d.a"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn overrides_without_a_rule_count_per_key_and_value() {
    let s = Serve::start(&[]);
    let with = |key: &str| {
        format!(
            r#"{{"domain":"example","descriptors":[{{"entries":[{{"key":"{key}","value":"alice"}}],"limit":{{"requestsPerUnit":1,"unit":"MINUTE"}}}}]}}"#
        )
    };
    assert_eq!(s.json(&with("user")).0, 200);
    assert_eq!(s.json(&with("user")).0, 429);
    assert_eq!(s.json(&with("org")).0, 200, "another key, another counter");
    let two = r#"{"domain":"example","descriptors":[{"entries":[{"key":"a","value":"x"},{"key":"b","value":"y"}],"limit":{"requestsPerUnit":1,"unit":"MINUTE"}}]}"#;
    let one = r#"{"domain":"example","descriptors":[{"entries":[{"key":"a","value":"x\u001fy"}],"limit":{"requestsPerUnit":1,"unit":"MINUTE"}}]}"#;
    assert_eq!(s.json(two).0, 200);
    assert_eq!(s.json(one).0, 200, "one value is not two entries");
}

#[test]
fn a_coarse_clock_limits_the_same() {
    let s = Serve::start(&["--clock", "coarse"]);
    let one = r#"{"domain":"example","descriptors":[{"entries":[{"key":"user","value":"bob"}],"limit":{"requestsPerUnit":2,"unit":"MINUTE"}}]}"#;
    assert_eq!(s.json(one).0, 200);
    assert_eq!(s.json(one).0, 200);
    assert_eq!(s.json(one).0, 429);
}

#[test]
fn two_processes_on_one_redis_share_one_limit() {
    let redis = support::Redis::start();
    let dir = temp_dir("redis");
    let config = write_config(&dir, CONFIG);
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--store",
        &redis.url(),
        "--instances",
        "2",
    ];
    let (a, b) = (Serve::start(&args), Serve::start(&args));
    let mut allowed = 0;
    for i in 0..10 {
        let s = if i % 2 == 0 { &a } else { &b };
        allowed += u32::from(s.json(&body(&[("user", "shared")])).0 == 200);
    }
    assert_eq!(
        allowed, 3,
        "one global limit of 3 per minute across both processes"
    );
    // A raised limit keeps the Redis counter: the 10 hits counted (refused ones too, as Lyft
    // counts them) of the new 13 leave 3, for both.
    std::fs::write(
        &config,
        CONFIG.replace("requests_per_unit: 3}", "requests_per_unit: 13}"),
    )
    .unwrap();
    wait_for_limit(&a, 13);
    wait_for_limit(&b, 13);
    let mut allowed = 0;
    for i in 0..6 {
        let s = if i % 2 == 0 { &a } else { &b };
        allowed += u32::from(s.json(&body(&[("user", "shared")])).0 == 200);
    }
    assert_eq!(allowed, 3, "the counter in Redis survived the reload");
    let _ = std::fs::remove_dir_all(dir);
}

/// The `requestsPerUnit` now answered for `user`, once it equals `want` (or panics after 20 s).
fn wait_for_limit(s: &Serve, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.json(&body(&[("user", "probe")])).1["statuses"][0]["currentLimit"]["requestsPerUnit"]
        != want
    {
        assert!(Instant::now() < deadline, "reload to {want} not applied");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_change_is_reloaded_even_when_the_modification_time_goes_back() {
    let dir = temp_dir("mtime");
    let config = write_config(&dir, CONFIG);
    let s = Serve::start(&["--config", config.to_str().unwrap()]);
    wait_for_limit(&s, 3);
    let before = std::fs::metadata(&config).unwrap().modified().unwrap();
    // As `touch -r` or `cp -p` can leave it: new contents, the same modification time.
    std::fs::write(
        &config,
        CONFIG.replace("requests_per_unit: 3}", "requests_per_unit: 7}"),
    )
    .unwrap();
    let f = std::fs::File::options().write(true).open(&config).unwrap();
    f.set_modified(before).unwrap();
    drop(f);
    wait_for_limit(&s, 7);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn decisions_are_not_held_up_while_a_large_configuration_reloads() {
    let dir = temp_dir("bigreload");
    let config = write_config(&dir, CONFIG);
    // One runtime worker: a reload parsed on it would stop every decision.
    let s = Serve::start_with_env(
        &["--config", config.to_str().unwrap()],
        &[("TOKIO_WORKER_THREADS", "1")],
    );
    wait_for_limit(&s, 3);
    let mut big = CONFIG.replace("requests_per_unit: 3}", "requests_per_unit: 9}");
    for i in 0..40_000 {
        big.push_str(&format!(
            "  - key: k{i}\n    rate_limit: {{unit: second, requests_per_unit: 5}}\n"
        ));
    }
    let started = Instant::now();
    std::fs::write(&config, &big).unwrap();
    let mut worst = Duration::ZERO;
    let deadline = started + Duration::from_secs(60);
    for n in 0.. {
        let t = Instant::now();
        let (code, v) = s.json(&body(&[("user", &format!("u{n}"))]));
        worst = worst.max(t.elapsed());
        assert_eq!(code, 200);
        if v["statuses"][0]["currentLimit"]["requestsPerUnit"] == 9 {
            break;
        }
        assert!(Instant::now() < deadline, "reload not applied");
    }
    let reload = started.elapsed();
    eprintln!("reload took {reload:?}; slowest decision meanwhile {worst:?}");
    assert!(
        worst < Duration::from_millis(500) && worst * 4 < reload,
        "a decision waited {worst:?} during a reload of {reload:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn response_headers_ietf_and_draft03() {
    let dir = temp_dir("headers");
    let config = write_config(&dir, CONFIG);
    let s = Serve::start(&[
        "--config",
        config.to_str().unwrap(),
        "--response-headers",
        "ietf",
    ]);
    let cart = body(&[("path", "/cart"), ("user", "hh")]);
    let (_, v) = s.json(&cart);
    // 2 per 30 s is told to Envoy as 4 per MINUTE (never 2 per SECOND).
    assert_eq!(
        v["statuses"][0]["currentLimit"],
        serde_json::json!({"requestsPerUnit": 4, "unit": "MINUTE"})
    );
    let headers = |v: &Value| -> Vec<(String, String)> {
        v["responseHeadersToAdd"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|h| {
                        (
                            h["key"].as_str().unwrap().to_string(),
                            h["value"].as_str().unwrap().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let h = headers(&v);
    assert!(
        h.contains(&(
            "ratelimit-policy".into(),
            "\"shop.path_/cart.user\";q=2;w=30".into()
        )),
        "{h:?}"
    );
    assert!(
        h.contains(&(
            "ratelimit".into(),
            "\"shop.path_/cart.user\";r=1;t=30".into()
        )),
        "{h:?}"
    );
    s.json(&cart);
    let (code, v) = s.json(&cart);
    assert_eq!(code, 429);
    let h = headers(&v);
    let retry: u64 = h
        .iter()
        .find(|(k, _)| k == "retry-after")
        .expect("retry-after")
        .1
        .parse()
        .unwrap();
    assert!(
        (1..=30).contains(&retry),
        "Retry-After {retry} rounds up, within the 30 s window"
    );
    drop(s);
    let s = Serve::start(&[
        "--config",
        config.to_str().unwrap(),
        "--response-headers",
        "draft03",
    ]);
    let (_, v) = s.json(&body(&[("user", "dd")]));
    let h = headers(&v);
    assert!(
        h.contains(&("x-ratelimit-limit".into(), "3".into())),
        "{h:?}"
    );
    assert!(
        h.contains(&("x-ratelimit-remaining".into(), "2".into())),
        "{h:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Sends SIGTERM (what `kill`, systemd and Kubernetes send) and waits, bounded, for the exit.
fn terminate(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let pid = child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn sigterm_stops_cleanly_and_an_idle_connection_cannot_hold_it_past_the_drain_timeout() {
    // An idle client on each listener: the gRPC one never sends the HTTP/2 preface, the HTTP
    // one holds a keep-alive connection after a request.
    let mut s = Serve::start(&["--drain-timeout", "2s"]);
    let grpc_idle = TcpStream::connect(("127.0.0.1", s.grpc)).unwrap();
    let mut http_idle = TcpStream::connect(("127.0.0.1", s.http)).unwrap();
    write!(http_idle, "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    http_idle
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut first = [0u8; 12];
    http_idle.read_exact(&mut first).unwrap();
    assert_eq!(&first[9..12], b"200");
    let started = Instant::now();
    let status = terminate(&mut s.child, Duration::from_secs(15)).expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    // Bounded by the drain timeout (2 s) plus slack for a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "{:?}",
        started.elapsed()
    );
    assert!(
        TcpStream::connect(("127.0.0.1", s.http)).is_err(),
        "HTTP listener still open after exit"
    );
    let err = s.stderr_after_exit();
    assert!(err.contains("weir serve: stopping"), "{err}");
    drop(grpc_idle);
}

/// The README's grpcurl line, done the way grpcurl does it: the service found and the request's
/// schema fetched over gRPC reflection (no `.proto` file at hand), the JSON body parsed against
/// that schema, the call made. The example's login limit (5 a minute per user) answers OK five
/// times, then OVER_LIMIT.
#[test]
fn the_readme_grpcurl_call_works_through_reflection() {
    use prost::Message;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("grpcurl -plaintext -d '"))
        .expect("a grpcurl line in README.md");
    let rest = &line["grpcurl -plaintext -d '".len()..];
    let (json, rest) = rest.split_once('\'').unwrap();
    let words: Vec<&str> = rest.split_whitespace().collect();
    assert_eq!(words.len(), 2, "{line}");
    assert_eq!(words[0], "127.0.0.1:8081", "the default gRPC address");
    let (service, method) = words[1].split_once('/').unwrap();

    let s = Serve::start(&[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", s.grpc))
                .unwrap()
                .connect()
                .await
                .unwrap();
        let mut client = ServerReflectionClient::new(channel);
        let mut ask = async |request: MessageRequest| {
            let request = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(request),
            };
            let mut answers = client
                .server_reflection_info(futures_util::stream::iter([request]))
                .await
                .unwrap()
                .into_inner();
            answers
                .message()
                .await
                .unwrap()
                .unwrap()
                .message_response
                .unwrap()
        };
        // `grpcurl list`.
        let MessageResponse::ListServicesResponse(list) =
            ask(MessageRequest::ListServices(String::new())).await
        else {
            panic!("not a service list");
        };
        let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
        for want in [
            service,
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
            "weir.quota.v1.QuotaService",
        ] {
            assert!(names.contains(&want), "{want} not in {names:?}");
        }
        // The file declaring the service, then every file it imports, by name.
        let mut files: Vec<prost_types::FileDescriptorProto> = Vec::new();
        let mut wanted = vec![MessageRequest::FileContainingSymbol(service.into())];
        while let Some(request) = wanted.pop() {
            let MessageResponse::FileDescriptorResponse(r) = ask(request).await else {
                panic!("not a file descriptor");
            };
            for bytes in r.file_descriptor_proto {
                let file = prost_types::FileDescriptorProto::decode(bytes.as_slice()).unwrap();
                if files.iter().all(|f| f.name != file.name) {
                    files.push(file);
                }
            }
            for f in &files {
                for dep in &f.dependency {
                    if files
                        .iter()
                        .all(|g| g.name.as_deref() != Some(dep.as_str()))
                    {
                        wanted.push(MessageRequest::FileByFilename(dep.clone()));
                    }
                }
            }
        }
        let set = prost_types::FileDescriptorSet { file: files };
        let pool = prost_reflect::DescriptorPool::decode(set.encode_to_vec().as_slice())
            .expect("the reflected files make a complete schema");
        let method = pool
            .get_service_by_name(service)
            .unwrap()
            .methods()
            .find(|m| m.name() == method)
            .unwrap();
        let mut de = serde_json::Deserializer::from_str(json);
        let message = prost_reflect::DynamicMessage::deserialize(method.input(), &mut de)
            .expect("the README's JSON fits the reflected request type");
        let request = RateLimitRequest::decode(message.encode_to_vec().as_slice()).unwrap();
        let mut rls = RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", s.grpc))
            .await
            .unwrap();
        let mut codes = Vec::new();
        for _ in 0..6 {
            let r = rls.should_rate_limit(request.clone()).await.unwrap();
            codes.push(r.into_inner().overall_code);
        }
        assert_eq!(codes, [1, 1, 1, 1, 1, 2], "OK five times, then OVER_LIMIT");
    });
}
