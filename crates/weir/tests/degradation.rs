//! Degradation through the real `weir proxy`: switches turned on and off over the admin API
//! (token required, state kept across a restart), fallback responses for blocked routes
//! (configured status and body, rate-limit headers kept), and a fallback upstream that receives
//! exactly the blocked requests.

use crate::common;

use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const RULES: &str = r#"resources:
  - name: recs
    switch: {id: recs-off}
  - name: cart
    switch: {id: cart-off, on: true}
  - name: login
    flow:
      - {id: login-rate, qps: 1, window: 1h}
  - name: search
    flow:
      - {id: search-rate, qps: 1, window: 1h}
http:
  routes:
    - resource: recs
      prefix: /recs
      fallback: {on: [switch], headers: {content-type: application/json}, body: '{"items":[]}'}
    - {resource: cart, prefix: /cart}
    - resource: login
      prefix: /login
      fallback: {on: [flow], status: 429, body_file: slow-down.txt}
    - resource: search
      prefix: /search
      fallback: {upstream: "http://127.0.0.1:FALLBACK"}
"#;

fn proxy(rules: &Path, upstream: u16, port: u16, admin: u16, token: Option<&str>) -> Process {
    let (l, a, u) = (
        format!("127.0.0.1:{port}"),
        format!("127.0.0.1:{admin}"),
        format!("http://127.0.0.1:{upstream}"),
    );
    let mut args = vec![
        "proxy",
        "--rules",
        rules.to_str().unwrap(),
        "--listen",
        &l,
        "--admin",
        &a,
        "--upstream",
        &u,
    ];
    if let Some(t) = token {
        args.extend(["--admin-token", t]);
    }
    let (child, line) = common::start(&args);
    assert!(line.starts_with("weir proxy: http://"), "{line}");
    Process(child)
}

fn get(port: u16, path: &str) -> (u16, String) {
    common::request(port, "GET", path, "", "").expect("answers")
}

fn admin(port: u16, method: &str, path: &str, token: &str) -> u16 {
    let auth = if token.is_empty() {
        String::new()
    } else {
        format!("Authorization: Bearer {token}\r\n")
    };
    common::request(port, method, path, &auth, "")
        .expect("answers")
        .0
}

#[test]
fn switches_fallbacks_and_a_fallback_upstream() {
    let dir = common::tempdir("degradation");
    let primary_hits = Arc::new(AtomicUsize::new(0));
    let fallback_hits = Arc::new(AtomicUsize::new(0));
    let (p, f) = (primary_hits.clone(), fallback_hits.clone());
    let upstream = common::http1_upstream_status(move |line, _| {
        if line.contains(" /search") {
            p.fetch_add(1, Ordering::SeqCst);
        }
        (200, "primary".into())
    });
    let fallback = common::http1_upstream_status(move |_, _| {
        f.fetch_add(1, Ordering::SeqCst);
        (200, "cached copy".into())
    });
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES.replace("FALLBACK", &fallback.to_string())).unwrap();
    std::fs::write(dir.join("slow-down.txt"), "slow down, please\n").unwrap();
    let (port, admin_port) = (common::free_port(), common::free_port());
    let mut running = Some(proxy(&rules, upstream, port, admin_port, Some("t0k")));

    // A switch turned on over the admin API degrades its resource at the next request.
    assert_eq!(get(port, "/recs"), (200, "primary".into()));
    let on = "/api/v1/switches/recs-off";
    assert_eq!(admin(admin_port, "PUT", on, ""), 401, "no token");
    assert_eq!(admin(admin_port, "PUT", on, "wrong"), 401, "wrong token");
    assert_eq!(admin(admin_port, "PUT", on, "t0k"), 200);
    assert_eq!(get(port, "/recs"), (200, "{\"items\":[]}".into()));
    assert_eq!(
        admin(admin_port, "PUT", "/api/v1/switches/nope", "t0k"),
        404
    );
    // Back to the file (off): the upstream answers.
    assert_eq!(admin(admin_port, "DELETE", on, "t0k"), 200);
    assert_eq!(get(port, "/recs"), (200, "primary".into()));
    // cart-off is on in the file (503: no fallback); an explicit off wins over it, and DELETE
    // hands it back to the file.
    let auth = "Authorization: Bearer t0k\r\n";
    let cart = "/api/v1/switches/cart-off";
    assert_eq!(get(port, "/cart").0, 503);
    let (code, body) = common::request(admin_port, "PUT", cart, auth, r#"{"on": false}"#).unwrap();
    assert_eq!(code, 200, "{body}");
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        state,
        serde_json::json!({"id": "cart-off", "resource": "cart", "file": true, "override": false, "effective": false})
    );
    assert_eq!(get(port, "/cart"), (200, "primary".into()));
    let list = common::request(admin_port, "GET", "/api/v1/switches", auth, "")
        .unwrap()
        .1;
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(
        list,
        serde_json::json!([
            {"id": "cart-off", "resource": "cart", "file": true, "override": false, "effective": false},
            {"id": "recs-off", "resource": "recs", "file": false, "override": null, "effective": false},
        ])
    );
    assert_eq!(admin(admin_port, "DELETE", cart, "t0k"), 200);
    assert_eq!(get(port, "/cart").0, 503);
    let (code, body) = common::request(admin_port, "PUT", cart, auth, r#"{"on": "yes"}"#).unwrap();
    assert!(
        code == 400 && body.contains("expected {\\\"on\\\": true|false}"),
        "{code} {body}"
    );
    // Set on at run time: kept across the restart below.
    assert_eq!(admin(admin_port, "PUT", cart, "t0k"), 200);
    assert_eq!(get(port, "/cart").0, 503);

    // A limited route answers with its configured response, rate-limit headers kept.
    assert_eq!(get(port, "/login"), (200, "primary".into()));
    let raw = common::request(port, "GET", "/login", "", "").unwrap();
    assert_eq!(raw, (429, "slow down, please\n".into()));
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    use std::io::{Read, Write};
    write!(
        s,
        "GET /login HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut head = String::new();
    s.read_to_string(&mut head).unwrap();
    let head = head.to_ascii_lowercase();
    assert!(head.contains("retry-after: "), "{head}");
    assert!(
        head.contains("ratelimit-policy: \"login-rate\";q=1"),
        "{head}"
    );

    // A fallback upstream receives exactly the blocked requests.
    for _ in 0..5 {
        assert_eq!(get(port, "/search").0, 200);
    }
    assert_eq!(primary_hits.load(Ordering::SeqCst), 1);
    assert_eq!(fallback_hits.load(Ordering::SeqCst), 4);
    let metrics = common::request(
        admin_port,
        "GET",
        "/metrics",
        "Authorization: Bearer t0k\r\n",
        "",
    )
    .unwrap()
    .1;
    for line in [
        "weir_resource_fallbacks_total{resource=\"search\"} 4",
        "weir_resource_fallbacks_total{resource=\"login\"} 2",
        "weir_resource_fallbacks_total{resource=\"recs\"} 1",
        "weir_switch_changes_total 5",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }

    // The switch states survive a restart (kept beside the rule file).
    assert_eq!(admin(admin_port, "PUT", on, "t0k"), 200);
    assert!(dir.join("rules.yaml.switches.json").exists());
    drop(running.take());
    let _again = proxy(&rules, upstream, port, admin_port, Some("t0k"));
    assert_eq!(get(port, "/recs"), (200, "{\"items\":[]}".into()));
    assert_eq!(get(port, "/cart").0, 503);
    // What is in force is what the dashboard and check-config show: the run-time state beside
    // the file's.
    let data = common::request(
        admin_port,
        "GET",
        "/api/v1/dashboard",
        "Authorization: Bearer t0k\r\n",
        "",
    )
    .unwrap()
    .1;
    assert!(
        data.contains("on false in the file · set at run time true (blocked)")
            && data.contains("\"overridden\":true"),
        "{data}"
    );
    let out = common::run(&["check-config", rules.to_str().unwrap()], "");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("recs-off: on false in the file · set at run time true (blocked)"),
        "{shown}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn without_a_token_there_is_no_switch_api() {
    let dir = common::tempdir("degradation-notoken");
    let upstream = common::http1_upstream(|_, _| "ok".into());
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "resources:\n  - name: recs\n    switch: {id: recs-off}\n",
    )
    .unwrap();
    let (port, admin_port) = (common::free_port(), common::free_port());
    let _p = proxy(&rules, upstream, port, admin_port, None);
    assert_eq!(
        admin(admin_port, "PUT", "/api/v1/switches/recs-off", ""),
        404
    );
    assert_eq!(admin(admin_port, "GET", "/api/v1/switches", ""), 404);
    let _ = std::fs::remove_dir_all(dir);
}

/// Starts the proxy on `rules`, expecting it to refuse (exit 2): what it printed.
fn refused_start(rules: &Path) -> String {
    let out = common::run(
        &[
            "proxy",
            "--rules",
            rules.to_str().unwrap(),
            "--upstream",
            "http://127.0.0.1:1",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_bad_state_file_or_fallback_is_named_at_start() {
    let dir = common::tempdir("degradation-bad");
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "resources:\n  - name: recs\n    switch: {id: recs-off}\n",
    )
    .unwrap();
    std::fs::write(dir.join("rules.yaml.switches.json"), "{\"recs-off\": 1}").unwrap();
    let err = refused_start(&rules);
    assert!(err.contains("rules.yaml.switches.json:1:"), "{err}");
    assert!(!err.contains(" at line "), "the position once: {err}");
    std::fs::remove_file(dir.join("rules.yaml.switches.json")).unwrap();
    std::fs::write(
        &rules,
        "resources:\n  - name: recs\nhttp:\n  routes:\n    - resource: recs\n      prefix: /recs\n      fallback: {body_file: missing.json}\n",
    )
    .unwrap();
    let err = refused_start(&rules);
    assert!(
        err.contains("rules.yaml:7:")
            && err.contains("fallback.body_file")
            && err.contains("missing.json"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// An HTTP/1.1 upstream on its own port that answers "primary", or 500s, or stops accepting
/// (its listener closed: connections refused) and comes back; counts the requests it answers.
struct Primary {
    port: u16,
    mode: Arc<std::sync::atomic::AtomicU8>,
    hits: Arc<AtomicUsize>,
}

const UP: u8 = 0;
const FAILING: u8 = 1;
const DEAD: u8 = 2;

impl Primary {
    fn start() -> Self {
        let port = common::free_port();
        let mode = Arc::new(std::sync::atomic::AtomicU8::new(UP));
        let hits = Arc::new(AtomicUsize::new(0));
        let (m, h) = (mode.clone(), hits.clone());
        std::thread::spawn(move || loop {
            if m.load(Ordering::SeqCst) == DEAD {
                std::thread::sleep(std::time::Duration::from_millis(5));
                continue;
            }
            let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) else {
                std::thread::sleep(std::time::Duration::from_millis(5));
                continue;
            };
            l.set_nonblocking(true).unwrap();
            while m.load(Ordering::SeqCst) != DEAD {
                match l.accept() {
                    Ok((s, _)) => {
                        let (m, h) = (m.clone(), h.clone());
                        std::thread::spawn(move || serve_primary(s, &m, &h));
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
                }
            }
        });
        Self { port, mode, hits }
    }
}

fn serve_primary(s: std::net::TcpStream, mode: &std::sync::atomic::AtomicU8, hits: &AtomicUsize) {
    use std::io::{BufRead, BufReader, Write};
    let _ = s.set_nonblocking(false);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
        }
        let answer = match mode.load(Ordering::SeqCst) {
            DEAD => return,
            FAILING => "HTTP/1.1 500 X\r\nContent-Length: 4\r\n\r\nfail",
            _ => "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nprimary",
        };
        hits.fetch_add(1, Ordering::SeqCst);
        if w.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn metric(admin: u16, line_start: &str) -> u64 {
    let text = common::request(admin, "GET", "/metrics", "", "").unwrap().1;
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line_start} in\n{text}"))
}

#[test]
fn a_gutter_serves_what_a_failing_primary_sheds_and_traffic_returns_after_the_probe() {
    let dir = common::tempdir("gutter");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, "resources: []\n").unwrap();
    let primary = Primary::start();
    let gutter_hits = Arc::new(AtomicUsize::new(0));
    let g = gutter_hits.clone();
    let gutter = common::http1_upstream_status(move |line, _| {
        g.fetch_add(1, Ordering::SeqCst);
        if line.contains("/slow") {
            std::thread::sleep(std::time::Duration::from_millis(600));
        }
        (200, "gutter".into())
    });
    let (port, admin_port) = (common::free_port(), common::free_port());
    let (listen, admin, up, gut) = (
        format!("127.0.0.1:{port}"),
        format!("127.0.0.1:{admin_port}"),
        format!("http://127.0.0.1:{}", primary.port),
        format!("http://127.0.0.1:{gutter}"),
    );
    let (child, line) = common::start(&[
        "proxy",
        "--rules",
        rules.to_str().unwrap(),
        "--listen",
        &listen,
        "--admin",
        &admin,
        "--upstream",
        &up,
        "--gutter",
        &gut,
        "--gutter-max-requests",
        "2",
        "--upstream-breaker",
        "{window_calls: 4, min_calls: 4, error_ratio: 0.5, open_for: 5s, max_probes: 1, successes_to_close: 1}",
        "--upstream-timeout",
        "3s",
    ]);
    assert!(line.starts_with("weir proxy:"), "{line}");
    let _proxy = Process(child);
    assert_eq!(get(port, "/"), (200, "primary".into()));

    // The primary fails: clients see its 500s until the breaker trips — its window of 4
    // calls holds the first success and 3 failures (75 % ≥ 50 %) — then the gutter answers.
    primary.mode.store(FAILING, Ordering::SeqCst);
    let seen: Vec<u16> = (0..10).map(|_| get(port, "/").0).collect();
    assert_eq!(seen[..3], [500; 3], "{seen:?}");
    assert_eq!(seen[3..], [200; 7], "{seen:?}");
    assert_eq!(gutter_hits.load(Ordering::SeqCst), 7);

    // The primary stops accepting; the gutter (2 at once) is driven above its limit: the
    // excess is thrown back at the primary, whose breaker is open: 503 at once, no hang.
    primary.mode.store(DEAD, Ordering::SeqCst);
    let started = std::time::Instant::now();
    let calls: Vec<_> = (0..5)
        .map(|_| std::thread::spawn(move || get(port, "/slow").0))
        .collect();
    let mut statuses: Vec<u16> = calls.into_iter().map(|c| c.join().unwrap()).collect();
    statuses.sort();
    assert_eq!(statuses, [200, 200, 503, 503, 503]);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "never a hang"
    );

    // The primary comes back: after the open time a probe reaches it, the breaker closes and
    // traffic returns to the primary.
    primary.mode.store(UP, Ordering::SeqCst);
    std::thread::sleep(std::time::Duration::from_millis(5_300));
    let bodies: Vec<String> = (0..4).map(|_| get(port, "/").1).collect();
    assert_eq!(bodies, ["primary"; 4]);

    // /metrics matches what each upstream saw.
    assert_eq!(
        metric(admin_port, "weir_gutter_requests_total{route=\"primary\"} ") as usize,
        primary.hits.load(Ordering::SeqCst)
    );
    assert_eq!(
        metric(admin_port, "weir_gutter_requests_total{route=\"gutter\"} ") as usize,
        gutter_hits.load(Ordering::SeqCst)
    );
    assert_eq!(
        metric(
            admin_port,
            "weir_gutter_requests_total{route=\"rejected\"} "
        ),
        3
    );
    assert_eq!(
        metric(
            admin_port,
            "weir_upstream_breaker_open{upstream=\"primary\"} "
        ),
        0
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_bad_upstream_breaker_is_refused_with_its_field() {
    let out = common::run(
        &[
            "proxy",
            "--rules",
            "/nonexistent.yaml",
            "--upstream",
            "http://127.0.0.1:1",
            "--gutter",
            "http://127.0.0.1:2",
            "--upstream-breaker",
            "{error_ratio: 1.5}",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error_ratio") && err.contains("1.5"), "{err}");
}

/// The `--upstream-breaker` value of docs/degradation.md's gutter example, as written there.
fn documented_upstream_breaker() -> String {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/degradation.md"),
    )
    .unwrap();
    let line = doc
        .lines()
        .find(|l| l.contains("--upstream-breaker '"))
        .expect("the gutter example");
    line.split('\'').nth(1).expect("a quoted value").to_string()
}

#[test]
fn the_documented_gutter_example_trips_after_its_window_and_logs_it() {
    use std::io::Read;
    let dir = common::tempdir("gutter-doc");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, "resources: []\n").unwrap();
    let primary = Primary::start();
    primary.mode.store(FAILING, Ordering::SeqCst);
    let gutter = common::http1_upstream_status(|_, _| (200, "gutter".into()));
    let (port, admin_port) = (common::free_port(), common::free_port());
    let breaker = documented_upstream_breaker();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["proxy", "--rules", rules.to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin", &format!("127.0.0.1:{admin_port}")])
        .args(["--upstream", &format!("http://127.0.0.1:{}", primary.port)])
        .args(["--gutter", &format!("http://127.0.0.1:{gutter}")])
        .args([
            "--gutter-max-requests",
            "64",
            "--upstream-breaker",
            &breaker,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("weir proxy:"), "{line}");
    // A window of 20 calls trips after 20 failures (not the preset's 100), then the gutter.
    let seen: Vec<u16> = (0..30).map(|_| get(port, "/").0).collect();
    assert_eq!(seen[..20], [500; 20], "{breaker}: {seen:?}");
    assert_eq!(seen[20..], [200; 10], "{breaker}: {seen:?}");
    assert_eq!(
        metric(admin_port, "weir_gutter_requests_total{route=\"gutter\"} "),
        10
    );
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        err.contains("upstream breaker state changed") && err.contains("upstream=\"primary\""),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn check_config_shows_switches_fallbacks_and_breakers_as_in_force() {
    let dir = common::tempdir("check-rules");
    let rules = dir.join("rules.yaml");
    // The rules of the switch test, and a breaker.
    let all = RULES.replace("FALLBACK", "9");
    let (head, routes) = all.split_once("http:\n").unwrap();
    std::fs::write(
        &rules,
        format!("{head}  - name: pay\n    breaker: {{id: pay-breaker, error_ratio: 0.5, window_calls: 20, open_for: 10s}}\nhttp:\n{routes}"),
    )
    .unwrap();
    std::fs::write(dir.join("slow-down.txt"), "slow down\n").unwrap();
    let out = common::run(&["check-config", rules.to_str().unwrap()], "");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "switch cart-off: on true (blocked)",
        "switch recs-off: on false",
        "breaker pay-breaker: preset resilience4j · window_calls 20 · min_calls 20 · error_ratio 0.5",
        "fallback on switch: 200 with a 12-byte body",
        "fallback on flow: 429 with the body of slow-down.txt",
        "fallback on every block: forwarded to http://127.0.0.1:9",
    ] {
        assert!(text.contains(want), "{want} in\n{text}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
