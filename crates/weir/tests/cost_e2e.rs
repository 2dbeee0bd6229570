//! Cost-aware limits end to end, in front of an LLM-like upstream (SSE streams ending with a
//! `usage` event, heavy-tailed token counts, one stream in twenty cut midway), 20 concurrent
//! clients of one user with a budget of 10 000 tokens a minute:
//! - through `weir proxy`, and in the same run 20 clients of another user under the
//!   request-count equivalent (requests a minute at the mean cost);
//! - through a real Envoy running `deploy/envoy/tokens.yaml` with `weir serve`.
//!
//! The two tests run at once; wall time about 70 s.

use crate::{common, support};

use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::common::llm;

const BUDGET: u64 = 10_000;
const BURST: u64 = 2_000;
const ESTIMATE: u64 = 500;
/// `weir serve`'s `cost.min` in the Envoy test: what an ask holds at least.
const MIN: u64 = 500;
const RUN: Duration = Duration::from_secs(66);
const SPAN: Duration = Duration::from_secs(60);

/// `n` clients of `user` calling `path` until `until`, each waiting out a 429.
async fn clients(port: u16, path: &'static str, user: &'static str, n: usize, until: Instant) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let mut tasks = Vec::new();
    for i in 0..n {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = llm::Rng::new(1000 + i as u64);
            // Bounded: at most one call every 50 ms per client.
            while Instant::now() < until {
                let call =
                    llm::chat(&client, port, path, user, ESTIMATE, Duration::from_secs(10)).await;
                let wait = match call {
                    Some(200) => 50,
                    _ => 100 + (rng.next_f64() * 200.0) as u64,
                };
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Checks that every 60 s span of the calls in `served` holds the bound (burst + budget + the
/// excesses of the calls in it) and prints what they spent, as `label`.
fn check_spans(label: &str, served: &[llm::Served], start: Instant, end: Instant) {
    let (max, min, excess, largest) = llm::spans(served, SPAN, start, end, ESTIMATE);
    assert!(
        max <= BURST + BUDGET + excess,
        "{label}: {max} > {BURST} + {BUDGET} + {excess}"
    );
    let failed = served.iter().filter(|s| s.failed).count();
    let pct = |n: u64| 100.0 * n as f64 / BUDGET as f64;
    println!(
        "{label}: calls {} (cut {failed}), tokens per 60 s span max {max} ({:.1} %), min {min} ({:.1} %), excess in the max span {excess}, largest single excess {largest}",
        served.len(),
        pct(max),
        pct(min)
    );
}

/// The value of the counter line starting with `prefix` in a metrics text.
fn metric(text: &str, prefix: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{prefix} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_budgets_through_weir_proxy_hold_against_request_counting() {
    let (up, log) = llm::start(42, None).await;
    let mean = llm::mean_tokens();
    let per_minute = (BUDGET as f64 / mean).round() as u64;
    let burst_requests = ((BURST as f64 / mean).round() as u64).max(1);
    let rules = format!(
        "resources:
  - name: chat-tokens
    hot_params:
      - {{id: tokens-per-user, param: 0, threshold: {BUDGET}, window: 1m, algorithm: gcra, burst: {BURST},
         cost: {{estimate: {ESTIMATE}, max: 4000, estimate_from: {{json: max_tokens}}, actual_from: {{sse: usage.total_tokens}}}}}}
  - name: chat-requests
    hot_params:
      - {{id: requests-per-user, param: 0, threshold: {per_minute}, window: 1m, algorithm: gcra, burst: {burst_requests}}}
http:
  routes:
    - {{resource: chat-tokens, prefix: /tokens, params: [{{header: x-user}}]}}
    - {{resource: chat-requests, prefix: /requests, params: [{{header: x-user}}]}}
"
    );
    let dir = common::tempdir("cost-e2e");
    let file = dir.join("rules.yaml");
    std::fs::write(&file, rules).unwrap();
    let admin = common::free_port();
    let admin_at = format!("127.0.0.1:{admin}");
    let (mut proxy, port) = common::start_proxy(&file, up, &["--admin", &admin_at]);
    let start = Instant::now();
    let until = start + RUN;
    tokio::join!(
        clients(port, "/tokens", "ann", 20, until),
        clients(port, "/requests", "bob", 20, until),
    );
    let end = Instant::now();
    let served = log.lock().clone();
    let of = |p: &str| -> Vec<llm::Served> {
        served
            .iter()
            .filter(|s| s.path.starts_with(p))
            .cloned()
            .collect()
    };
    let (tokens, requests) = (of("/tokens"), of("/requests"));
    let failed = tokens.iter().filter(|s| s.failed).count();
    assert!(
        tokens.len() > 50 && failed > 0,
        "{} calls, {failed} cut",
        tokens.len()
    );

    // Every unit accounted for: what the proxy charged, net, is what the calls cost (a cut
    // stream costs nothing: its estimate was given back).
    let text = common::get_body(admin, "/metrics").expect("metrics");
    let at = |name: &str| metric(&text, &format!("{name}{{resource=\"chat-tokens\"}} "));
    let (admitted, refunded, owed) = (
        at("weir_resource_cost_admitted_total"),
        at("weir_resource_cost_refunded_total"),
        at("weir_resource_cost_owed_total"),
    );
    let cost: u64 = tokens.iter().map(|s| s.tokens).sum();
    assert_eq!(admitted - refunded + owed, cost, "{text}");
    assert_eq!(admitted, ESTIMATE * tokens.len() as u64);

    // In every 60 s span, tokens admitted ≤ the burst + the budget + the excesses of the
    // calls admitted in that span (docs/cost.md).
    check_spans("cost, weir proxy", &tokens, start, end);
    let (rmax, rmin, _, _) = llm::spans(&requests, SPAN, start, end, ESTIMATE);
    let pct = |n: u64| 100.0 * n as f64 / BUDGET as f64;
    println!(
        "requests ({per_minute}/min, burst {burst_requests}, mean cost {mean:.1}): calls {}, tokens per 60 s span max {rmax} ({:.1} %), min {rmin} ({:.1} %)",
        requests.len(),
        pct(rmax),
        pct(rmin)
    );
    let _ = proxy.kill();
    let _ = proxy.wait();
}

/// `weir serve`'s `/json` answer to `body`.
fn rls(http: u16, body: &str) -> String {
    common::request(http, "POST", "/json", "", body)
        .expect("weir serve answers")
        .1
}

/// What `weir serve` has left for `user` now: an ask of the rule's `cost.min`, given back at
/// once (a rule with `cost:` has no free peek).
fn left(http: u16, user: &str) -> u64 {
    let one = |negative: bool| {
        format!(
            "{{\"domain\":\"llm\",\"descriptors\":[{{\"entries\":[{{\"key\":\"user\",\"value\":\"{user}\"}}],\"hitsAddend\":{MIN},\"isNegativeHits\":{negative}}}]}}"
        )
    };
    let answer = rls(http, &one(false));
    if answer.contains("OVER_LIMIT") {
        return 0;
    }
    rls(http, &one(true));
    let at = answer.find("\"limitRemaining\":").map(|i| i + 17);
    at.map_or(0, |i| {
        answer[i..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap_or(0)
    }) + MIN
}

/// A call through Envoy that reads every event (to `[DONE]`) and closes before the trailer
/// comes: its status.
fn call_leaving_before_the_trailer(port: u16, user: &str, estimate: u64) -> u16 {
    call_until(port, "/late-trailer", user, estimate, Some(b"[DONE]"))
}

/// One call through Envoy with `x-max-tokens: estimate`: its status (the body read to its
/// end, or to the error that cuts it).
fn call(port: u16, path: &str, user: &str, estimate: u64) -> u16 {
    call_until(port, path, user, estimate, None)
}

/// [`call`], closing as soon as the answer holds `stop` (if given).
fn call_until(port: u16, path: &str, user: &str, estimate: u64, stop: Option<&[u8]>) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nx-user: {user}\r\nx-max-tokens: {estimate}\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    if s.write_all(req.as_bytes()).is_err() {
        return 0;
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if stop.is_some_and(|stop| out.windows(stop.len()).any(|w| w == stop)) {
            break;
        }
    }
    std::str::from_utf8(out.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_budgets_through_envoy_and_weir_serve() {
    let (up, log) = llm::start(43, Some("x-tokens-used")).await;
    let dir = common::tempdir("cost-envoy");
    let config = dir.join("llm.yaml");
    std::fs::write(
        &config,
        format!("domain: llm\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: {BUDGET}, algorithm: gcra, burst: {BURST}, cost: {{min: {MIN}, max: 4000}}}}\n"),
    )
    .unwrap();
    let (http, grpc) = (support::free_port(), support::free_port());
    let (mut weir, line) = common::start(&[
        "serve",
        "--config",
        config.to_str().unwrap(),
        "--http-addr",
        &format!("127.0.0.1:{http}"),
        "--grpc-addr",
        &format!("127.0.0.1:{grpc}"),
    ]);
    assert!(line.contains("gRPC RLS v3"), "{line}");
    let (port, admin) = (support::free_port(), support::free_port());
    let doc =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/envoy/tokens.yaml");
    let mut yaml = std::fs::read_to_string(doc).unwrap();
    for (from, to) in [
        ("port_value: 9901}", admin),
        ("port_value: 10000}", port),
        ("port_value: 8000}", up),
        ("port_value: 8081}", grpc),
    ] {
        assert!(yaml.contains(from), "{from} in deploy/envoy/tokens.yaml");
        yaml = yaml.replace(from, &format!("port_value: {to}}}"));
    }
    let file = dir.join("envoy.yaml");
    std::fs::write(&file, yaml).unwrap();
    let mut envoy = common::start_envoy(&file, admin, port);

    // One by one first (blocking calls, off the runtime's threads): a cut stream keeps its
    // estimate (no trailer: nothing justifies a refund); a whole one is charged its tokens; a
    // refused one gives nothing back; a request without an estimate is refused; a client that
    // reads every event and leaves before the trailer keeps paying its estimate.
    let checks = tokio::task::spawn_blocking(move || {
        let full = left(http, "zed");
        assert_eq!(call(port, "/cut", "zed", 1_500), 200);
        std::thread::sleep(Duration::from_millis(300));
        let after_cut = left(http, "zed");
        assert!(
            full - after_cut >= 1_200,
            "a cut stream gave its estimate back: {after_cut} of {full}"
        );
        std::thread::sleep(Duration::from_millis(9_000));
        let full = left(http, "zed");
        assert!(full + 1 >= BURST, "refilled: {full}");
        assert_eq!(call(port, "/whole", "zed", 1_500), 200);
        std::thread::sleep(Duration::from_millis(300));
        let after_whole = left(http, "zed");
        assert_eq!(call(port, "/whole", "zed", 1_999), 429);
        std::thread::sleep(Duration::from_millis(300));
        let after_refused = left(http, "zed");
        assert!(
            after_refused + 5 >= after_whole,
            "a refused call gave back: {after_refused} vs {after_whole}"
        );
        let headers = "x-user: zed\r\n";
        let (status, _) = common::request(port, "POST", "/whole", headers, "{}").unwrap();
        assert_eq!(status, 400);
        let eve = left(http, "eve");
        assert_eq!(call_leaving_before_the_trailer(port, "eve", 1_500), 200);
        std::thread::sleep(Duration::from_millis(1_000));
        let eve_after = left(http, "eve");
        assert!(
            eve - eve_after >= 1_200,
            "left before the trailer and paid nothing: {eve_after} of {eve}"
        );
        // `x-max-tokens: 0` from 20 clients at once: each holds `cost.min`, so the burst
        // admits BURST / MIN of them at most (and the refill while they run).
        let zero: Vec<_> = (0..20)
            .map(|_| std::thread::spawn(move || call(port, "/whole", "mallory", 0)))
            .collect();
        let admitted = zero
            .into_iter()
            .map(|t| t.join())
            .filter(|r| matches!(r, Ok(200)))
            .count() as u64;
        println!("x-max-tokens: 0 from 20 clients at once: {admitted} admitted (cost.min {MIN}, burst {BURST})");
        assert!(admitted <= BURST / MIN + 1, "{admitted} admitted");
        (full, after_whole)
    })
    .await
    .unwrap();
    let whole = log
        .lock()
        .iter()
        .find(|s| s.path.starts_with("/whole"))
        .map(|s| s.tokens)
        .unwrap();
    // Charged what it cost (a few units came back with time).
    assert!(
        checks.0 - checks.1 <= whole && checks.0 - checks.1 + 60 >= whole,
        "{checks:?} {whole}"
    );
    log.lock().clear();

    let start = Instant::now();
    clients(port, "/v1/chat", "ann", 20, start + RUN).await;
    let end = Instant::now();
    let served: Vec<llm::Served> = log
        .lock()
        .iter()
        .filter(|s| s.user == "ann")
        .cloned()
        .collect();
    let failed = served.iter().filter(|s| s.failed).count();
    assert!(
        served.len() > 50 && failed > 0,
        "{} calls, {failed} cut",
        served.len()
    );
    check_spans("envoy + weir serve", &served, start, end);
    let _ = envoy.kill();
    let _ = envoy.wait();
    let _ = weir.kill();
    let _ = weir.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_share_one_budget_on_redis() {
    let redis = support::Redis::start();
    let (up, log) = llm::start(44, None).await;
    let rules = format!(
        "resources:
  - name: chat-tokens
    hot_params:
      - {{id: tokens-per-user, param: 0, threshold: {BUDGET}, window: 1m, algorithm: gcra, burst: {BURST}, shared: true,
         cost: {{estimate: {ESTIMATE}, max: 4000, estimate_from: {{json: max_tokens}}, actual_from: {{sse: usage.total_tokens}}}}}}
http:
  routes:
    - {{resource: chat-tokens, prefix: /tokens, params: [{{header: x-user}}]}}
"
    );
    let dir = common::tempdir("cost-redis");
    let file = dir.join("rules.yaml");
    std::fs::write(&file, rules).unwrap();
    let start_proxy = || {
        let (port, admin) = (common::free_port(), common::free_port());
        let (child, line) = common::start(&[
            "proxy",
            "--rules",
            file.to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin",
            &format!("127.0.0.1:{admin}"),
            "--upstream",
            &format!("http://127.0.0.1:{up}"),
            "--store",
            &redis.url(),
            "--instances",
            "2",
        ]);
        assert!(line.starts_with("weir proxy:"), "{line}");
        (child, port, admin)
    };
    let (mut a, a_port, a_admin) = start_proxy();
    let (mut b, b_port, b_admin) = start_proxy();
    let start = Instant::now();
    let until = start + RUN;
    // 20 clients of one user, half on each proxy.
    tokio::join!(
        clients(a_port, "/tokens", "ann", 10, until),
        clients(b_port, "/tokens", "ann", 10, until),
    );
    let end = Instant::now();
    let served = log.lock().clone();
    let failed = served.iter().filter(|s| s.failed).count();
    assert!(
        served.len() > 50 && failed > 0,
        "{} calls, {failed} cut",
        served.len()
    );
    // One budget: every 60 s span of both proxies' calls within the bound.
    check_spans("two proxies on redis", &served, start, end);
    // Both proxies' accounts together equal what the calls cost.
    let mut net = 0i64;
    for admin in [a_admin, b_admin] {
        let text = common::get_body(admin, "/metrics").expect("metrics");
        let at = |name: &str| metric(&text, &format!("{name}{{resource=\"chat-tokens\"}} ")) as i64;
        net += at("weir_resource_cost_admitted_total") - at("weir_resource_cost_refunded_total")
            + at("weir_resource_cost_owed_total");
    }
    let cost: u64 = served.iter().map(|s| s.tokens).sum();
    assert_eq!(net, cost as i64);
    for c in [&mut a, &mut b] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[test]
fn two_proxies_share_a_calendar_budget_on_redis_across_a_restart() {
    let redis = support::Redis::start();
    let up = common::http1_upstream(|_, _| "ok".to_string());
    // A day from a UTC hour about twelve hours away: it never ends during the test.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let hour = (now / 3_600 + 12) % 24;
    let dir = common::tempdir("budget-redis");
    let file = dir.join("rules.yaml");
    std::fs::write(
        &file,
        format!(
            "resources:
  - name: chat
    budgets:
      - {{id: calls-per-user-day, param: 0, limit: 5, shared: true,
         resets: {{every: day, at: '{hour:02}:00', tz: UTC}}}}
http:
  routes:
    - {{resource: chat, prefix: /chat, params: [{{header: x-user}}]}}
"
        ),
    )
    .unwrap();
    let url = redis.url();
    let store = ["--store", url.as_str(), "--instances", "2"];
    let (mut a, a_port) = common::start_proxy(&file, up, &store);
    let (mut b, b_port) = common::start_proxy(&file, up, &store);
    let call = |port: u16, user: &str| {
        common::request(port, "GET", "/chat", &format!("x-user: {user}\r\n"), "").map(|(s, _)| s)
    };
    // Five of ann's calls through either proxy: one count.
    for port in [a_port, b_port, a_port, b_port, a_port] {
        assert_eq!(call(port, "ann"), Some(200));
    }
    assert_eq!(call(b_port, "ann"), Some(429));
    assert_eq!(call(a_port, "ann"), Some(429));
    // A proxy started again (no state file of its own is needed): Redis kept the count.
    let _ = a.kill();
    let _ = a.wait();
    let (mut a, a_port) = common::start_proxy(&file, up, &store);
    assert_eq!(call(a_port, "ann"), Some(429));
    assert_eq!(call(a_port, "bob"), Some(200));
    let _ = a.kill();
    let _ = a.wait();
    let _ = b.kill();
    let _ = b.wait();
}
