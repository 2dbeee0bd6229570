//! Shared by the binary's end-to-end tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};

pub mod llm;

/// An upstream speaking HTTP/1.1 only (no h2c), a thread per connection, on a free loopback
/// port: every request (its body read and dropped) gets a 200 whose body is
/// `answer(request line, Host header or "-")`.
pub fn http1_upstream(answer: impl Fn(&str, &str) -> String + Send + Sync + 'static) -> u16 {
    http1_upstream_status(move |line, host| (200, answer(line, host)))
}

/// [`http1_upstream`] answering `(status, body)`.
pub fn http1_upstream_status(
    answer: impl Fn(&str, &str) -> (u16, String) + Send + Sync + 'static,
) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let answer = std::sync::Arc::new(answer);
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut s = s;
                // Head and body are two writes: without this, Nagle's algorithm and the
                // peer's delayed ACK add 40 ms to each answer.
                let _ = s.set_nodelay(true);
                let mut r = BufReader::new(s.try_clone().unwrap());
                loop {
                    let (mut first, mut host, mut len) = (String::new(), "-".to_string(), 0usize);
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let lower = line.to_ascii_lowercase();
                        if first.is_empty() {
                            first = line.trim_end().to_string();
                        } else if let Some(v) = lower.strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap_or(0);
                        } else if let Some(v) = lower.strip_prefix("host:") {
                            host = v.trim().to_string();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; len];
                    let _ = r.read_exact(&mut body);
                    let (status, body) = answer(&first, &host);
                    let head = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    );
                    if s.write_all(head.as_bytes()).is_err()
                        || s.write_all(body.as_bytes()).is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs the binary with `args`, `stdin` on its standard input, to its end.
pub fn run(args: &[&str], stdin: &str) -> std::process::Output {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("weir starts");
    // A process that refuses its arguments may exit before reading its input: a broken pipe
    // here is its answer, not the test's failure.
    if let Err(e) = child.stdin.take().unwrap().write_all(stdin.as_bytes()) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    child.wait_with_output().unwrap()
}

/// Starts the binary with `args` (stdout piped, stderr dropped) and waits for the first line it
/// prints (where it listens): the process and that line.
pub fn start(args: &[&str]) -> (std::process::Child, String) {
    let (child, mut lines) = start_lines(args, 1);
    (child, lines.pop().unwrap_or_default())
}

/// Starts `weir proxy` with `rules` in front of the upstream on loopback port `upstream`, with
/// `extra` arguments, and waits until it listens: the process and its port.
pub fn start_proxy(
    rules: &std::path::Path,
    upstream: u16,
    extra: &[&str],
) -> (std::process::Child, u16) {
    let port = free_port();
    let (listen, upstream) = (
        format!("127.0.0.1:{port}"),
        format!("http://127.0.0.1:{upstream}"),
    );
    let mut args = vec![
        "proxy",
        "--rules",
        rules.to_str().unwrap_or_default(),
        "--listen",
        &listen,
        "--upstream",
        &upstream,
    ];
    args.extend_from_slice(extra);
    let (child, line) = start(&args);
    assert!(line.starts_with("weir proxy: http://"), "{line}");
    (child, port)
}

/// [`start`], waiting for the first `n` lines it prints.
pub fn start_lines(args: &[&str], n: usize) -> (std::process::Child, Vec<String>) {
    start_logged(args, n, std::process::Stdio::null())
}

/// [`start_lines`] with the process's stderr going to `stderr` (a file, to read its log).
pub fn start_logged(
    args: &[&str],
    n: usize,
    stderr: std::process::Stdio,
) -> (std::process::Child, Vec<String>) {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("weir starts");
    let mut out = BufReader::new(child.stdout.as_mut().unwrap());
    let lines = (0..n)
        .map(|_| {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            line
        })
        .collect();
    (child, lines)
}

/// The number at `"key":` in a one-line JSON object (the simulators' `--json` output).
pub fn json_number(json: &str, key: &str) -> f64 {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} in {json}"));
    let rest = &json[at + key.len() + 3..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end].trim().parse().unwrap()
}

/// One unary call of the quota gRPC API with tonic's client: the answer or the status.
pub async fn quota_grpc<Req, Resp>(
    port: u16,
    path: &'static str,
    request: Req,
) -> Result<tonic::Response<Resp>, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    quota_grpc_as(port, path, request, None).await
}

/// [`quota_grpc`] with `authorization: bearer TOKEN` metadata when `token` is given.
#[allow(dead_code)]
pub async fn quota_grpc_as<Req, Resp>(
    port: u16,
    path: &'static str,
    request: Req,
    token: Option<&str>,
) -> Result<tonic::Response<Resp>, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut request = tonic::Request::new(request);
    if let Some(t) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("bearer {t}").parse().unwrap());
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    grpc.unary(
        request,
        http::uri::PathAndQuery::from_static(path),
        tonic_prost::ProstCodec::<Req, Resp>::default(),
    )
    .await
}

/// The Envoy binary: `$WEIR_ENVOY`, else the one scripts/test installs in the cache.
pub fn envoy_bin() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("WEIR_ENVOY") {
        return std::path::PathBuf::from(p);
    }
    let cache = std::env::var_os("WEIR_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/weir")
        });
    let p = cache.join("envoy-venv/bin/envoy");
    assert!(
        p.exists(),
        "envoy not found at {}: run scripts/test, which installs it",
        p.display()
    );
    p
}

/// Envoy's admin `/ready` answers LIVE.
pub fn envoy_ready(admin: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", admin)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(2)));
    if s.write_all(b"GET /ready HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.contains("LIVE")
}

/// Starts Envoy on `config` (one worker, errors on stderr, `--base-id` from `port` so that
/// several run at once) and waits until its admin port says LIVE (30 s at most).
pub fn start_envoy(config: &std::path::Path, admin: u16, port: u16) -> std::process::Child {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let mut child = Command::new(envoy_bin())
        .args([
            "-c",
            config.to_str().unwrap(),
            "--concurrency",
            "1",
            "-l",
            "error",
        ])
        .args(["--base-id", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start envoy");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !envoy_ready(admin) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("envoy exited: {status} (config {})", config.display());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("envoy did not become ready (config {})", config.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

/// `METHOD path` on a loopback port with extra header lines (each ending in CRLF) and a
/// body: the status and the body (read to the connection's close), if it answers.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.get(9..12)?.parse().ok()?;
    Some((status, out.split_once("\r\n\r\n")?.1.to_string()))
}

/// Debian's Chromium (or `WEIR_CHROMIUM`), which the test command installs.
pub fn chromium() -> std::path::PathBuf {
    let path = std::env::var_os("WEIR_CHROMIUM")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/usr/bin/chromium".into());
    assert!(
        path.exists(),
        "{} is missing: scripts/test installs Debian's chromium (or set WEIR_CHROMIUM)",
        path.display()
    );
    path
}

/// Loads `url` in headless Chromium at `width`×`height`, lets its scripts run for a few
/// seconds (virtual time), and returns the rendered DOM; with `screenshot`, saves a PNG of the
/// window there instead. `extra`: more Chromium flags (e.g. `--force-dark-mode`).
pub fn render_page(
    url: &str,
    width: u32,
    height: u32,
    screenshot: Option<&std::path::Path>,
    extra: &[&str],
) -> String {
    use std::process::{Command, Stdio};
    let profile = tempdir("chromium-profile");
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--virtual-time-budget=4000",
    ])
    .args(extra)
    .arg(format!("--user-data-dir={}", profile.display()))
    .arg(format!("--window-size={width},{height}"));
    match screenshot {
        Some(p) => cmd.arg(format!("--screenshot={}", p.display())),
        None => cmd.arg("--dump-dom"),
    };
    let out = cmd
        .arg(url)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(out.status.success(), "chromium failed on {url}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A new empty directory under the system's temporary directory.
pub fn tempdir(what: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "weir-{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The body of `GET path` on a loopback port (read to the connection's close), if it answers.
pub fn get_body(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// `weir serve --quota FILE` on the given ports, sharing the quota through the Redis at
/// `redis` (leader key TTL 1 s) when one is given: the process, once it printed where it
/// listens.
pub fn serve_quota(
    quota: &std::path::Path,
    redis: Option<&str>,
    http: u16,
    grpc: u16,
) -> std::process::Child {
    let (http, grpc) = (format!("127.0.0.1:{http}"), format!("127.0.0.1:{grpc}"));
    let mut args = vec!["serve", "--quota", quota.to_str().unwrap()];
    args.extend(["--http-addr", &http, "--grpc-addr", &grpc]);
    if let Some(url) = redis {
        args.extend(["--store", url, "--quota-leader-ttl", "1s"]);
    }
    let (child, line) = start(&args);
    assert!(line.contains("HTTP on"), "{line}");
    child
}

/// A quota server's failover status (`GET /quota/v1/allocations` → `failover`).
pub fn failover(http: u16) -> Option<serde_json::Value> {
    let body = get_body(http, "/quota/v1/allocations")?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    Some(v["failover"].clone())
}

/// Waits until at least `margin` is left before the wall clock's next minute: `weir serve`'s
/// fixed windows start on the minute (as envoyproxy/ratelimit's do), so a test counting in a
/// MINUTE window must not straddle one.
pub fn inside_minute(margin: std::time::Duration) {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let left =
        Duration::from_secs(60) - Duration::from_nanos((now.as_nanos() % 60_000_000_000) as u64);
    if left < margin {
        std::thread::sleep(left + Duration::from_millis(50));
    }
}
