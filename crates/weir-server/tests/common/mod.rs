//! Shared by weir-server's in-process tests.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A file of `text` in a directory of this test binary's own under the system's temporary
/// directory (`group` tells the binaries apart).
pub fn file(group: &str, name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-server-{group}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    path
}

/// Prometheus's `promtool`: on PATH, else the copy `scripts/test` unpacks from Debian's
/// `prometheus` package into `$WEIR_CACHE/prometheus` (default `~/.cache/weir`).
fn promtool() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("promtool"))
            .find(|p| p.is_file())
    });
    let cache = std::env::var_os("WEIR_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/weir")))
        .map(|c| c.join("prometheus/usr/bin/promtool"))
        .filter(|p| p.is_file());
    on_path.or(cache).expect(
        "promtool not found: scripts/test unpacks Debian's prometheus package into ~/.cache/weir/prometheus",
    )
}

/// Runs `promtool check metrics` on an exposition; panics with promtool's findings unless it
/// passes (a parse error or a lint).
pub fn promtool_check(what: &str, exposition: &str) {
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics refused {what}'s /metrics:\n{}{}\n--- exposition:\n{exposition}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The label names of every sample in an exposition, by sample name (`weir_x_total`,
/// `weir_s_bucket`).
fn samples(
    exposition: &str,
) -> std::collections::HashMap<String, std::collections::HashSet<String>> {
    let mut out: std::collections::HashMap<String, std::collections::HashSet<String>> =
        Default::default();
    for line in exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..end].to_string()).or_default();
        if let Some(body) = line[end..]
            .strip_prefix('{')
            .and_then(|r| r.split_once('}'))
        {
            for pair in body.0.split(',').filter(|p| !p.is_empty()) {
                if let Some((name, _)) = pair.split_once('=') {
                    labels.insert(name.to_string());
                }
            }
        }
    }
    out
}

/// Checks the Grafana dashboard `deploy/grafana/NAME.json` against the exposition of the
/// process it is for: every panel is a Prometheus panel of the dashboard's data source with
/// at least one query, every series a query reads is one the process exports, and every
/// label a query groups by is one those series carry.
pub fn check_dashboard(name: &str, exposition: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/grafana")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let exported = samples(exposition);
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty(), "{name}: no panels");
    for p in panels {
        let title = p["title"].as_str().expect("a panel title");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{name}: {title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{name}: {title}: no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("a PromQL expression");
            // Weir's families, and those named by an OpenTelemetry convention.
            let mut at: Vec<usize> = ["weir_", "gen_ai_"]
                .iter()
                .flat_map(|p| expr.match_indices(p).map(|(i, _)| i))
                .collect();
            at.sort_unstable();
            // A series name is followed by its selector (`{job=~"$job"}`); a label by a
            // comma or a parenthesis.
            let series: Vec<&str> = at
                .into_iter()
                .filter_map(|i| {
                    let rest = &expr[i..];
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    rest[end..].starts_with('{').then(|| &rest[..end])
                })
                .collect();
            assert!(
                !series.is_empty(),
                "{name}: {title}: {expr} reads no weir series"
            );
            let grouped: Vec<&str> = expr
                .match_indices("by (")
                .filter_map(|(i, m)| expr[i + m.len()..].split_once(')'))
                .flat_map(|(list, _)| list.split(',').map(str::trim))
                .collect();
            for s in &series {
                let labels = exported.get(*s).unwrap_or_else(|| {
                    panic!("{name}: {title}: {s} is not exported:\n{exposition}")
                });
                for l in &grouped {
                    assert!(
                        labels.contains(*l),
                        "{name}: {title}: {s} has no label {l} (it has {labels:?})"
                    );
                }
            }
        }
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`) with `headers` and
/// `body`: the whole answer, its head's fields in lower case.
pub async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.read_to_string(&mut answer),
    )
    .await
    .expect("an answer within 10 s")
    .unwrap();
    // The status line as sent; the fields in lower case.
    match answer.split_once("\r\n\r\n") {
        Some((head, body)) => {
            let (status, fields) = head.split_once("\r\n").unwrap_or((head, ""));
            format!("{status}\r\n{}\r\n\r\n{body}", fields.to_ascii_lowercase())
        }
        None => answer,
    }
}
