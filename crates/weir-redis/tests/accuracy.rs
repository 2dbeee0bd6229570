//! Accuracy against real Redis: 4 independent clients × 8 tasks on one key over several
//! windows, as separate connections, as separate processes, and on a 3-master Redis Cluster
//! with keys spread over slots. Admission times are Redis's own (`TIME`, answered by each
//! script), so the check is exact: for sliding log, GCRA and token bucket the units admitted in
//! every window-length span stay within limit (+ burst); fixed window within the limit per
//! aligned window (≤ 2 × limit in any span); sliding counter ≤ 2 × limit in any span.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use weir_core::rate::{RateAlgorithm, RateSpec};
use weir_redis::{RedisConfig, RedisLimiter, RedisRule, RuleOptions};

/// Accuracy is measured here, not latency: a generous call timeout so a busy machine (tests run
/// in parallel) cannot turn a slow answer into an error.
fn config() -> RedisConfig {
    RedisConfig {
        timeout: Duration::from_secs(5),
        ..RedisConfig::default()
    }
}

const WINDOW: Duration = Duration::from_millis(500);
const LIMIT: u64 = 40;
const RUN: Duration = Duration::from_millis(1_600);
/// Bound on calls per task (the loops are also bounded in time).
const MAX_CALLS: usize = 50_000;

fn rules(prefix: &str) -> Vec<RedisRule> {
    let spec = |a| RateSpec::new(a, LIMIT, WINDOW);
    [
        spec(RateAlgorithm::SlidingLog),
        spec(RateAlgorithm::Gcra).with_burst(10),
        spec(RateAlgorithm::TokenBucket).with_burst(10),
        spec(RateAlgorithm::FixedWindow),
        spec(RateAlgorithm::SlidingCounter),
        spec(RateAlgorithm::SlidingWindow).with_buckets(10),
    ]
    .into_iter()
    .map(|s| {
        RedisRule::new(
            format!("{prefix}-{}", s.algorithm),
            &s,
            RuleOptions::default(),
        )
        .unwrap()
    })
    .collect()
}

/// 8 tasks on one client hammering `keys` of `rule` until `RUN` passes; answers the Redis
/// times (µs) of admitted units per key.
async fn hammer(
    limiter: RedisLimiter,
    rule: &'static RedisRule,
    keys: &'static [&'static str],
) -> Vec<Vec<u64>> {
    let deadline = Instant::now() + RUN;
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let mut admitted = vec![Vec::new(); keys.len()];
                for i in 0..MAX_CALLS {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let k = (i + t) % keys.len();
                    let (d, at) = limiter
                        .try_check_timed(rule, keys[k], 1, None)
                        .await
                        .unwrap();
                    if d.allowed() {
                        admitted[k].push(at);
                    }
                }
                admitted
            })
        })
        .collect();
    let mut all = vec![Vec::new(); keys.len()];
    for t in tasks {
        for (k, times) in t.await.unwrap().into_iter().enumerate() {
            all[k].extend(times);
        }
    }
    all
}

/// Most units admitted in any span of `w` µs (spans starting at an admission).
fn max_in_span(times: &mut [u64], w: u64) -> u64 {
    times.sort_unstable();
    let mut best = 0;
    let mut j = 0;
    for i in 0..times.len() {
        while times[j] + w <= times[i] {
            j += 1;
        }
        best = best.max((i - j + 1) as u64);
    }
    best
}

fn max_per_aligned_window(times: &[u64], w: u64) -> u64 {
    let mut counts = std::collections::HashMap::new();
    for t in times {
        *counts.entry(t / w).or_insert(0u64) += 1;
    }
    counts.values().copied().max().unwrap_or(0)
}

fn check(rule: &RedisRule, times: &mut [u64]) {
    let w = WINDOW.as_micros() as u64;
    let windows = RUN.as_micros() as u64 / w;
    assert!(
        times.len() as u64 >= LIMIT * (windows - 1),
        "{}: only {} admitted in {windows} windows: the load did not saturate the limit",
        rule.name(),
        times.len()
    );
    let span = max_in_span(times, w);
    let burst = rule.spec().burst_or_limit();
    let (bound, what) = match rule.algorithm().unwrap() {
        RateAlgorithm::SlidingLog => (LIMIT, "limit"),
        RateAlgorithm::Gcra => (LIMIT + burst, "limit + burst"),
        // Guava semantics: the last grant may be on credit (n = 1 here).
        RateAlgorithm::TokenBucket => (LIMIT + burst + 1, "limit + burst + 1"),
        RateAlgorithm::FixedWindow => {
            assert!(
                max_per_aligned_window(times, w) <= LIMIT,
                "{}: aligned window over limit",
                rule.name()
            );
            (2 * LIMIT, "2 × limit")
        }
        RateAlgorithm::SlidingWindow => {
            // Exact over (B − 1) / B of the window; 2 × limit over a whole one (adversarial).
            let b = u64::from(rule.spec().buckets_or_default());
            let short = max_in_span(times, w * (b - 1) / b);
            assert!(
                short <= LIMIT,
                "{}: {short} in (B−1)/B of a window",
                rule.name()
            );
            (2 * LIMIT, "2 × limit")
        }
        RateAlgorithm::SlidingCounter => (2 * LIMIT, "2 × limit"),
        a @ (RateAlgorithm::Pacing | RateAlgorithm::WarmUp) => panic!("{a} is not on Redis"),
    };
    assert!(
        span <= bound,
        "{}: {span} admitted within one window, bound {what} = {bound}",
        rule.name()
    );
    eprintln!(
        "{}: {} admitted, max {span} per window span (bound {bound})",
        rule.name(),
        times.len()
    );
}

async fn run_clients(url: &str, prefix: &str, keys: &'static [&'static str]) {
    for rule in rules(prefix) {
        let rule: &'static RedisRule = Box::leak(Box::new(rule));
        let mut clients = Vec::new();
        for _ in 0..4 {
            let limiter = RedisLimiter::connect(url, config()).await.unwrap();
            clients.push(tokio::spawn(hammer(limiter, rule, keys)));
        }
        let mut per_key = vec![Vec::new(); keys.len()];
        for c in clients {
            for (k, t) in c.await.unwrap().into_iter().enumerate() {
                per_key[k].extend(t);
            }
        }
        for times in &mut per_key {
            check(rule, times);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_clients_eight_tasks_one_key() {
    let redis = support::Redis::start();
    run_clients(&redis.url(), "acc", &["one"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keys_over_slots() {
    let cluster = support::Cluster::start();
    static KEYS: [&str; 6] = ["a", "b", "c", "user:1", "user:2", "tenant-9"];
    run_clients(&cluster.url(), "cl", &KEYS).await;
}

/// The child side of `separate_processes`: does nothing unless started by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_hammer() {
    let (Ok(url), Ok(alg)) = (
        std::env::var("WEIR_HAMMER_URL"),
        std::env::var("WEIR_HAMMER_ALG"),
    ) else {
        return;
    };
    let rule = rules("proc")
        .into_iter()
        .find(|r| r.algorithm_name() == alg)
        .unwrap();
    let rule: &'static RedisRule = Box::leak(Box::new(rule));
    let limiter = RedisLimiter::connect(&url, config()).await.unwrap();
    let times = hammer(limiter, rule, &["one"]).await;
    let line: Vec<String> = times[0].iter().map(u64::to_string).collect();
    // libtest prints "test child_hammer ... " without a newline first.
    println!("\nADMITTED {}", line.join(","));
}

#[test]
fn separate_processes() {
    let redis = support::Redis::start();
    let exe = std::env::current_exe().unwrap();
    for rule in rules("proc") {
        let children: Vec<_> = (0..4)
            .map(|_| {
                Command::new(&exe)
                    .args(["child_hammer", "--exact", "--nocapture", "--test-threads=1"])
                    .env("WEIR_HAMMER_URL", redis.url())
                    .env("WEIR_HAMMER_ALG", rule.algorithm_name())
                    .stderr(std::process::Stdio::null())
                    .spawn_piped()
            })
            .collect();
        let mut times = Vec::new();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success());
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix("ADMITTED "))
                .expect("child output");
            times.extend(
                line.split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.parse::<u64>().unwrap()),
            );
        }
        check(&rule, &mut times);
    }
}

trait SpawnPiped {
    fn spawn_piped(&mut self) -> std::process::Child;
}

impl SpawnPiped for Command {
    fn spawn_piped(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped()).spawn().unwrap()
    }
}
