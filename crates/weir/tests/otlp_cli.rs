//! OTLP export from the binary: `weir serve` and `weir proxy` with `--otlp-endpoint` and the
//! standard `OTEL_` variables push their metrics to a receiver of this test (what is sent is
//! decoded and compared with `/metrics` by weir-server's `tests/otlp.rs`); a collector that is
//! not there is logged once, not at every export; bad settings are refused at start with one
//! line and exit code 2.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One request the receiver took: its path, content type and body.
pub(crate) struct Export {
    pub(crate) path: String,
    pub(crate) content_type: String,
    pub(crate) body: Vec<u8>,
}

/// An HTTP/1.1 receiver on a free loopback port answering 200 to every request (keep-alive),
/// sending each to the channel.
pub(crate) fn receiver() -> (u16, mpsc::Receiver<Export>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split(' ').nth(1).unwrap_or_default().to_string();
                    let (mut length, mut content_type, mut chunked) = (0, String::new(), false);
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                        let (name, value) = h.split_once(':').unwrap_or_default();
                        match name.to_ascii_lowercase().as_str() {
                            "content-length" => length = value.trim().parse().unwrap_or(0),
                            "content-type" => content_type = value.trim().to_string(),
                            "transfer-encoding" => chunked = value.trim() == "chunked",
                            _ => {}
                        }
                    }
                    let body = if chunked {
                        // Envoy's exporters send their bodies chunked.
                        let Some(body) = read_chunked(&mut r) else {
                            return;
                        };
                        body
                    } else {
                        let mut body = vec![0; length];
                        if r.read_exact(&mut body).is_err() {
                            return;
                        }
                        body
                    };
                    let _ = tx.send(Export {
                        path,
                        content_type,
                        body,
                    });
                    if w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (port, rx)
}

/// A chunked body (its trailers skipped).
fn read_chunked(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        r.read_line(&mut size).ok()?;
        let n = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
        if n == 0 {
            loop {
                let mut t = String::new();
                if r.read_line(&mut t).ok()? == 0 || t == "\r\n" {
                    return Some(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + n, 0);
        r.read_exact(&mut body[start..]).ok()?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf).ok()?;
    }
}

/// `weir serve` with `args` and `env` stops at start with exit code 2 and one line holding
/// `message`.
pub(crate) fn refused_at_start(args: &[&str], env: &[(&str, &str)], message: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("serve")
        .args(["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("weir: error: ") && err.contains(message),
        "{err}"
    );
}

/// Starts the binary with `args` and `env`, waiting for its first line (where it listens).
fn start(args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("weir starts");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(!line.is_empty(), "it stopped before listening");
    child
}

/// The first export whose body holds every one of `texts`, within 10 s.
fn export_with(rx: &mpsc::Receiver<Export>, texts: &[&str]) -> Export {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = rx.recv_timeout(left).expect("an export within 10 s");
        let body = String::from_utf8_lossy(&e.body);
        if texts.iter().all(|t| body.contains(t)) {
            return e;
        }
    }
}

#[test]
fn serve_and_proxy_push_their_metrics_to_a_collector() {
    let (collector, rx) = receiver();
    let endpoint = format!("http://127.0.0.1:{collector}");
    let (http, grpc) = (common::free_port(), common::free_port());
    let mut serve = start(
        &[
            "serve",
            "--http-addr",
            &format!("127.0.0.1:{http}"),
            "--grpc-addr",
            &format!("127.0.0.1:{grpc}"),
            "--otlp-endpoint",
            &endpoint,
        ],
        &[
            ("OTEL_SERVICE_NAME", "edge-limits"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ],
    );
    let e = export_with(&rx, &["edge-limits", "weir_rls_hits", "weir_otlp_exports"]);
    assert_eq!(e.path, "/v1/metrics");
    assert_eq!(e.content_type, "application/x-protobuf");
    let _ = serve.kill();
    let _ = serve.wait();

    let rules = common::tempdir("otlp-proxy").join("rules.yaml");
    std::fs::write(
        &rules,
        "resources:\n  - name: api\n    flow:\n      - {id: api-rate, qps: 10}\nhttp:\n  routes:\n    - {resource: api, prefix: /}\n",
    )
    .unwrap();
    let upstream = common::http1_upstream(|_, _| "ok".into());
    let mut proxy = start(
        &[
            "proxy",
            "--rules",
            rules.to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{}", common::free_port()),
            "--upstream",
            &format!("http://127.0.0.1:{upstream}"),
            "--otlp-protocol",
            "http/protobuf",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ],
    );
    export_with(&rx, &["weir-proxy", "weir_proxy_forwarded", "api-rate"]);
    let _ = proxy.kill();
    let _ = proxy.wait();
}

#[test]
fn bad_otlp_settings_are_refused_at_start() {
    for (args, env, message) in [
        (
            vec!["--otlp-endpoint", "https://collector:4318"],
            vec![],
            "https is not supported",
        ),
        (
            vec!["--otlp-endpoint", "http://127.0.0.1:4318"],
            vec![("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
            "expected grpc or http/protobuf",
        ),
        (
            vec![],
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "1m"),
            ],
            "OTEL_METRIC_EXPORT_INTERVAL=\"1m\"",
        ),
    ] {
        refused_at_start(&args, &env, message);
    }
}

#[test]
fn a_collector_that_is_not_there_is_logged_once() {
    // A port nothing listens on: bound, then closed.
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = common::tempdir("otlp-log").join("stderr.log");
    let (http, grpc) = (common::free_port(), common::free_port());
    let mut serve = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["serve", "--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--otlp-endpoint", &format!("http://127.0.0.1:{gone}")])
        .env("OTEL_METRIC_EXPORT_INTERVAL", "50")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("weir serve starts");
    // About 40 failed exports.
    let deadline = Instant::now() + Duration::from_secs(10);
    let failures = |text: &str| text.matches("OTLP export failed").count();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    while Instant::now() < deadline && failures(&read()) == 0 {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    // Still answering, with the failures counted.
    let metrics = common::get_body(http, "/metrics").expect("/metrics answers");
    let _ = serve.kill();
    let _ = serve.wait();
    let text = read();
    assert_eq!(failures(&text), 1, "logged once:\n{text}");
    let failed: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("weir_otlp_exports_total{result=\"failed\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(failed >= 10, "failed exports counted: {failed}\n{metrics}");
}
