//! Cost-aware limits end to end: `weir proxy` in front of an LLM-like upstream (SSE streams
//! ending with a `usage` event, heavy-tailed token counts, one stream in twenty cut midway),
//! 20 concurrent clients of one user with a budget of 10 000 tokens a minute, and in the same
//! run 20 clients of another user under the request-count equivalent (requests a minute at the
//! mean cost). Wall time: about 70 s.

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

mod common;
use common::llm;

const BUDGET: u64 = 10_000;
const BURST: u64 = 2_000;
const ESTIMATE: u64 = 500;
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
                let body = format!(
                    "{{\"model\":\"m\",\"stream\":true,\"max_tokens\":{ESTIMATE},\"messages\":[]}}"
                );
                let req = http::Request::post(format!("http://127.0.0.1:{port}{path}"))
                    .header("x-user", user)
                    .header("content-type", "application/json")
                    .body(Full::new(bytes::Bytes::from(body)))
                    .unwrap();
                let call = tokio::time::timeout(Duration::from_secs(10), async {
                    let r = client.request(req).await.ok()?;
                    let status = r.status().as_u16();
                    // A cut stream ends in an error: the body is read to its end either way.
                    let _ = r.into_body().collect().await;
                    Some(status)
                })
                .await;
                let wait = match call {
                    Ok(Some(200)) => 50,
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
    let (port, admin) = (common::free_port(), common::free_port());
    let (mut proxy, line) = common::start(&[
        "proxy",
        "--rules",
        file.to_str().unwrap(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--admin",
        &format!("127.0.0.1:{admin}"),
        "--upstream",
        &format!("http://127.0.0.1:{up}"),
    ]);
    assert!(line.starts_with("weir proxy:"), "{line}");
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
    let (max, min, excess, largest) = llm::spans(&tokens, SPAN, start, end, ESTIMATE);
    assert!(
        max <= BURST + BUDGET + excess,
        "{max} > {BURST} + {BUDGET} + {excess}"
    );
    let (rmax, rmin, _, _) = llm::spans(&requests, SPAN, start, end, ESTIMATE);
    let pct = |n: u64| 100.0 * n as f64 / BUDGET as f64;
    println!(
        "cost: calls {} (cut {failed}), tokens per 60 s span max {max} ({:.1} %), min {min} ({:.1} %), excess in the max span {excess}, largest single excess {largest}; net charged {cost}",
        tokens.len(),
        pct(max),
        pct(min)
    );
    println!(
        "requests ({per_minute}/min, burst {burst_requests}, mean cost {mean:.1}): calls {}, tokens per 60 s span max {rmax} ({:.1} %), min {rmin} ({:.1} %)",
        requests.len(),
        pct(rmax),
        pct(rmin)
    );
    let _ = proxy.kill();
    let _ = proxy.wait();
}
