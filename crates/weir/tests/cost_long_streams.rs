//! LLM budgets on real streams: 1–60 s each (heavy-tailed), clients stating `max_tokens` 4–20 ×
//! what the call uses, 20 concurrent clients per user, one user's budget over 5 minutes — four
//! ways side by side in one run of `weir proxy`:
//! - `learned`: `estimate: learned` (the 95th percentile of recent costs held);
//! - `stated`: the stated `max_tokens` held, the burst sized as docs/cost.md says (streams ×
//!   typical estimate);
//! - `requests`: counting requests at the budget's mean cost;
//! - `at end`: charging only when the call ends (an estimate of 1: what gateways that count
//!   tokens after the response do).
//!
//! Measured: the tokens the upstream spent for each, as a share of the budget over the run; the
//! cumulative bound (docs/cost.md) asserted at every call for the cost rules. The same with two
//! proxies sharing one budget on a real Redis. Wall time about 5½ minutes (both tests at once).

use crate::{common, support};

use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::common::llm;

/// Tokens a minute for each user.
const BUDGET: u64 = 30_000;
const RUN: Duration = Duration::from_secs(300);
const CLIENTS: usize = 20;
/// What clients state, uniformly: the calls use a 4th to a 20th of it.
const STATED: [u64; 4] = [800, 1_600, 3_200, 4_000];

/// The rule of one approach (`cost` the rule's `cost:` body; none: requests counted).
fn hot_rule(id: &str, burst: u64, threshold: u64, cost: Option<&str>, shared: bool) -> String {
    let shared = if shared { ", shared: true" } else { "" };
    match cost {
        Some(c) => format!(
            "      - {{id: {id}, param: 0, threshold: {threshold}, window: 1m, algorithm: gcra, burst: {burst}{shared},\n         cost: {{{c}, actual_from: {{sse: usage.total_tokens}}}}}}\n"
        ),
        None => format!(
            "      - {{id: {id}, param: 0, threshold: {threshold}, window: 1m, algorithm: gcra, burst: {burst}{shared}}}\n"
        ),
    }
}

/// `n` clients of `user` calling `path` until `until`, each stating a `max_tokens` of
/// [`STATED`] and reading each stream to its end; a refusal waits 100–300 ms.
async fn clients(port: u16, path: &'static str, user: &'static str, n: usize, until: Instant) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let mut tasks = Vec::new();
    for i in 0..n {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = llm::Rng::new(7_000 + i as u64);
            // Bounded: one call at a time, each at most 70 s, until the run ends.
            while Instant::now() < until {
                let stated = STATED[(rng.next_f64() * STATED.len() as f64) as usize];
                let call =
                    llm::chat(&client, port, path, user, stated, Duration::from_secs(70)).await;
                if call != Some(200) {
                    let wait = 100 + (rng.next_f64() * 200.0) as u64;
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// The value of the counter line starting with `prefix` in a metrics text (0 when absent).
fn metric(text: &str, prefix: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// What one approach spent: prints it and answers the share of the budget used over the run.
/// With `bound` (the rule's burst, and what the proxies owed), checks at every call that the
/// tokens of the calls started so far are at most `burst + rate × elapsed + owed`.
fn report(label: &str, served: &[llm::Served], start: Instant, bound: Option<(u64, u64)>) -> f64 {
    let mut s: Vec<&llm::Served> = served.iter().collect();
    s.sort_by_key(|r| r.at);
    let budget = BUDGET as f64 * RUN.as_secs_f64() / 60.0;
    let used: u64 = s.iter().map(|r| r.tokens).sum();
    let share = used as f64 / budget;
    let stated: u64 = s.iter().map(|r| r.stated).sum();
    // The heaviest 60 s of calls (by start): how far past a minute's budget it went.
    let mut worst = 0u64;
    let (mut from, mut in_span) = (0usize, 0u64);
    for (i, r) in s.iter().enumerate() {
        in_span += r.tokens;
        while r.at.saturating_duration_since(s[from].at) >= Duration::from_secs(60) {
            in_span -= s[from].tokens;
            from += 1;
        }
        if i + 1 == s.len() || s[i + 1].at != r.at {
            worst = worst.max(in_span);
        }
    }
    println!(
        "{label}: {} calls, {used} tokens = {:.1} % of the budget ({budget:.0}); stated {:.1} × what was used; heaviest 60 s {worst} tokens = {:.1} % of a minute's budget",
        s.len(),
        100.0 * share,
        stated as f64 / used.max(1) as f64,
        100.0 * worst as f64 / BUDGET as f64
    );
    if let Some((burst, owed)) = bound {
        let mut so_far = 0;
        for r in &s {
            so_far += r.tokens;
            let elapsed = r.at.saturating_duration_since(start).as_secs_f64();
            let allowed = burst as f64 + BUDGET as f64 * elapsed / 60.0 + owed as f64 + 1.0;
            assert!(
                so_far as f64 <= allowed,
                "{label}: {so_far} tokens by {elapsed:.1} s, bound {allowed:.0} (burst {burst}, owed {owed})"
            );
        }
    }
    share
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_streams_use_the_budget_with_learned_estimates() {
    let (up, log) = llm::start(45, None).await;
    let mean = {
        // The mean cost clients' calls have: the mean stated ÷ the mean of 4–20.
        let stated = STATED.iter().sum::<u64>() as f64 / STATED.len() as f64;
        stated * (5.0f64).ln() / 16.0
    };
    let per_minute = (BUDGET as f64 / mean).round() as u64;
    // Bursts as docs/cost.md sizes them: the streams a user runs at once × what each holds —
    // the stated mean for `stated`, about the 95th percentile of costs for `learned`.
    let stated_burst = CLIENTS as u64 * 2_400;
    let learned_burst = CLIENTS as u64 * 500;
    let mut rules = String::from("resources:\n");
    for (name, rule) in [
        (
            "learned",
            hot_rule(
                "learned-tokens",
                learned_burst,
                BUDGET,
                Some("estimate: learned, max: 4000, estimate_from: {json: max_tokens}"),
                false,
            ),
        ),
        (
            "stated",
            hot_rule(
                "stated-tokens",
                stated_burst,
                BUDGET,
                Some("estimate: 500, max: 4000, estimate_from: {json: max_tokens}"),
                false,
            ),
        ),
        (
            "requests",
            hot_rule("requests", CLIENTS as u64, per_minute, None, false),
        ),
        (
            "at-end",
            hot_rule(
                "at-end-tokens",
                learned_burst,
                BUDGET,
                Some("estimate: 1, min: 1, max: 4000"),
                false,
            ),
        ),
    ] {
        rules.push_str(&format!("  - name: {name}\n    hot_params:\n{rule}"));
    }
    rules.push_str("http:\n  routes:\n");
    for name in ["learned", "stated", "requests", "at-end"] {
        rules.push_str(&format!(
            "    - {{resource: {name}, prefix: /long/{name}, params: [{{header: x-user}}]}}\n"
        ));
    }
    let dir = common::tempdir("long-streams");
    let file = dir.join("rules.yaml");
    std::fs::write(&file, rules).unwrap();
    let admin = common::free_port();
    let admin_at = format!("127.0.0.1:{admin}");
    let (mut proxy, port) = common::start_proxy(&file, up, &["--admin", &admin_at]);
    let start = Instant::now();
    let until = start + RUN;
    tokio::join!(
        clients(port, "/long/learned", "ann", CLIENTS, until),
        clients(port, "/long/stated", "bob", CLIENTS, until),
        clients(port, "/long/requests", "cid", CLIENTS, until),
        clients(port, "/long/at-end", "dee", CLIENTS, until),
    );
    let served = log.lock().clone();
    let text = common::get_body(admin, "/metrics").expect("metrics");
    let owed = |r: &str| {
        metric(
            &text,
            &format!("weir_resource_cost_owed_total{{resource=\"{r}\"}} "),
        )
    };
    let of = |p: &str| -> Vec<llm::Served> {
        served
            .iter()
            .filter(|s| s.path.starts_with(p) && s.at < until)
            .cloned()
            .collect()
    };
    let learned = report(
        "learned estimates",
        &of("/long/learned"),
        start,
        Some((learned_burst, owed("learned"))),
    );
    let stated = report(
        &format!("max_tokens held, burst {stated_burst}"),
        &of("/long/stated"),
        start,
        Some((stated_burst, owed("stated"))),
    );
    let requests = report(
        &format!("requests counted ({per_minute}/min at the mean cost {mean:.0})"),
        &of("/long/requests"),
        start,
        None,
    );
    let at_end = report(
        "charged only at the end",
        &of("/long/at-end"),
        start,
        Some((learned_burst, owed("at-end"))),
    );
    println!(
        "share of the budget used: learned {:.1} %, stated {:.1} %, requests {:.1} %, charged at the end {:.1} %",
        100.0 * learned,
        100.0 * stated,
        100.0 * requests,
        100.0 * at_end
    );
    assert!(
        learned >= 0.95,
        "learned estimates used {learned:.3} of the budget"
    );
    assert!(
        stated >= 0.90,
        "max_tokens held used {stated:.3} of the budget"
    );
    let _ = proxy.kill();
    let _ = proxy.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_on_redis_share_a_learned_budget_of_long_streams() {
    let redis = support::Redis::start();
    let (up, log) = llm::start(46, None).await;
    let burst = CLIENTS as u64 * 500;
    let rules = format!(
        "resources:\n  - name: learned\n    hot_params:\n{}http:\n  routes:\n    - {{resource: learned, prefix: /long/learned, params: [{{header: x-user}}]}}\n",
        hot_rule(
            "learned-tokens",
            burst,
            BUDGET,
            Some("estimate: learned, max: 4000, estimate_from: {json: max_tokens}"),
            true,
        )
    );
    let dir = common::tempdir("long-streams-redis");
    let file = dir.join("rules.yaml");
    std::fs::write(&file, rules).unwrap();
    let start_one = || {
        let admin = common::free_port();
        let admin_at = format!("127.0.0.1:{admin}");
        let (child, port) = common::start_proxy(
            &file,
            up,
            &[
                "--admin",
                &admin_at,
                "--store",
                &redis.url(),
                "--instances",
                "2",
            ],
        );
        (child, port, admin)
    };
    let (mut a, a_port, a_admin) = start_one();
    let (mut b, b_port, b_admin) = start_one();
    let start = Instant::now();
    let until = start + RUN;
    tokio::join!(
        clients(a_port, "/long/learned", "ann", CLIENTS / 2, until),
        clients(b_port, "/long/learned", "ann", CLIENTS / 2, until),
    );
    let owed: u64 = [a_admin, b_admin]
        .iter()
        .map(|admin| {
            let text = common::get_body(*admin, "/metrics").expect("metrics");
            metric(
                &text,
                "weir_resource_cost_owed_total{resource=\"learned\"} ",
            )
        })
        .sum();
    let served: Vec<llm::Served> = log
        .lock()
        .iter()
        .filter(|s| s.at < until)
        .cloned()
        .collect();
    let share = report(
        "two proxies on Redis, learned estimates",
        &served,
        start,
        Some((burst, owed)),
    );
    assert!(share >= 0.95, "two proxies used {share:.3} of the budget");
    for c in [&mut a, &mut b] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
