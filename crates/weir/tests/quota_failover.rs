//! Cluster quota with failover, end to end on loopback: one real Redis, three `weir serve
//! --quota` processes electing a leader through it, and ten lease clients (the
//! `quota_clients` example, a separate process) offering three times the capacity.
//!
//! One scenario, in order: steady state (admitted ≈ capacity, never above the bound); the
//! leader killed (a new leader within the documented time, no spike); Redis killed (the
//! leader keeps serving from memory); every server killed (clients keep their leases, then
//! fall to their safe capacity); servers restarted (fair shares again within two refresh
//! intervals of the clients' return). Windows are generous (seconds), as for every
//! end-to-end test; the bounds are checked per one-second window of admitted units.

use crate::{common, support};

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CAPACITY: f64 = 1000.0;
const CLIENTS: usize = 10;
const SAFE: f64 = 20.0;
/// The documented bound on any second's admitted units: the capacity, plus each client's
/// local burst (two units, or 10 ms of its grant), plus 1 % for the measuring windows.
const BOUND: f64 = CAPACITY * 1.01 + 2.0 * CLIENTS as f64;

const QUOTA: &str = "resources:
  - name: search
    capacity: 1000/s
    lease: 6s
    refresh: 1s
    safe_capacity: 20/s
";

struct Server {
    child: Child,
    http: u16,
}

impl Server {
    fn start(quota: &std::path::Path, redis: &str, http: u16, grpc: u16) -> Self {
        let child = common::serve_quota(quota, Some(redis), http, grpc);
        Self { child, http }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// This server's failover role ("leader", "holding", "follower"), if it answers.
    fn role(&self) -> Option<String> {
        common::failover(self.http)?["role"]
            .as_str()
            .map(str::to_string)
    }

    /// The leader this server names, if any.
    fn leader(&self) -> Option<String> {
        common::failover(self.http)?["leader"]
            .as_str()
            .map(str::to_string)
    }

    /// Refreshes this server answered for `search` (0 when it has no table).
    fn refreshes(&self) -> u64 {
        common::get_body(self.http, "/quota/v1/allocations")
            .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
            .and_then(|v| v["resources"][0]["refreshes"].as_u64())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One line of the clients' output: when it was read, the admitted rate, clients on a
/// lease, and each client's rate in force.
#[derive(Clone, Debug)]
struct Second {
    at: Instant,
    rate: f64,
    granted: usize,
    rates: Vec<f64>,
}

struct Clients {
    child: Child,
    seconds: Arc<Mutex<Vec<Second>>>,
}

impl Clients {
    fn start(servers: &str, seconds: u64) -> Self {
        let exe = std::env::current_exe().unwrap();
        let examples: PathBuf = exe.parent().unwrap().parent().unwrap().join("examples");
        let bin = examples.join("quota_clients");
        assert!(
            bin.exists(),
            "{} missing: cargo test builds the examples",
            bin.display()
        );
        let mut child = Command::new(bin)
            .args([
                servers,
                "search",
                &CLIENTS.to_string(),
                "300",
                &seconds.to_string(),
                &SAFE.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("quota_clients starts");
        let out = child.stdout.take().unwrap();
        let seconds = Arc::new(Mutex::new(Vec::new()));
        let sink = seconds.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                sink.lock().unwrap().push(Second {
                    at: Instant::now(),
                    rate: v["rate"].as_f64().unwrap(),
                    granted: v["granted"].as_u64().unwrap() as usize,
                    rates: v["rates"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| r.as_f64().unwrap())
                        .collect(),
                });
            }
        });
        Self { child, seconds }
    }

    /// The seconds reported between `from` and `to`.
    fn between(&self, from: Instant, to: Instant) -> Vec<Second> {
        self.seconds
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.at > from && s.at <= to)
            .cloned()
            .collect()
    }

    /// Every second reported so far.
    fn all(&self) -> Vec<Second> {
        self.seconds.lock().unwrap().clone()
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mean(s: &[Second]) -> f64 {
    s.iter().map(|s| s.rate).sum::<f64>() / s.len().max(1) as f64
}

fn peak(s: &[Second]) -> f64 {
    s.iter().map(|s| s.rate).fold(0.0, f64::max)
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

/// Waits (at most `limit`) until `f` holds; answers how long it took.
fn wait_for(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

fn leader_of(servers: &[Server]) -> Option<usize> {
    servers
        .iter()
        .position(|s| s.role().as_deref() == Some("leader"))
}

#[test]
fn three_servers_on_one_redis_hold_the_capacity_through_failures() {
    let mut redis = support::Redis::start();
    let dir = std::env::temp_dir().join(format!("weir-quota-failover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let quota = dir.join("quota.yaml");
    std::fs::write(&quota, QUOTA).unwrap();
    let ports: Vec<(u16, u16)> = (0..3)
        .map(|_| (support::free_port(), support::free_port()))
        .collect();
    // The first server leads; the others follow.
    let mut servers = vec![Server::start(&quota, &redis.url(), ports[0].0, ports[0].1)];
    wait_for(Duration::from_secs(10), "first leader", || {
        leader_of(&servers) == Some(0)
    });
    for &(h, g) in &ports[1..] {
        servers.push(Server::start(&quota, &redis.url(), h, g));
    }
    wait_for(Duration::from_secs(10), "followers", || {
        servers[1..]
            .iter()
            .all(|s| s.role().as_deref() == Some("follower") && s.leader().is_some())
    });
    // The clients know every server, the leader last: they must follow a redirect.
    let list = [1, 2, 0]
        .iter()
        .map(|&i| format!("http://127.0.0.1:{}", ports[i].0))
        .collect::<Vec<_>>()
        .join(",");
    let clients = Clients::start(&list, 120);
    let t0 = Instant::now();

    // 1. Steady state, after the first leader's learning period (one lease, 6 s).
    sleep_until(t0 + Duration::from_secs(14));
    let steady = clients.between(t0 + Duration::from_secs(9), Instant::now());
    assert!(steady.len() >= 4, "{steady:?}");
    assert!(peak(&steady) <= BOUND, "steady peak {}", peak(&steady));
    assert!(
        mean(&steady) >= 0.98 * CAPACITY,
        "steady mean {}",
        mean(&steady)
    );
    for s in &steady {
        assert!(s.rates.iter().all(|r| (r - 100.0).abs() < 1.0), "{s:?}");
    }
    eprintln!(
        "steady: mean {:.1}/s, peak {:.1}/s",
        mean(&steady),
        peak(&steady)
    );

    // 2. The leader is killed: another is elected from its snapshot; no spike.
    let t1 = Instant::now();
    servers[0].kill();
    let failover = wait_for(Duration::from_secs(5), "a new leader", || {
        leader_of(&servers[1..]).is_some()
    });
    let new_leader = 1 + leader_of(&servers[1..]).unwrap();
    let refreshes = servers[new_leader].refreshes();
    sleep_until(t1 + Duration::from_secs(8));
    assert!(
        servers[new_leader].refreshes() > refreshes,
        "the clients moved to the new leader"
    );
    let after = clients.between(t1, Instant::now());
    assert!(
        peak(&after) <= BOUND,
        "peak after failover {}",
        peak(&after)
    );
    let settled = clients.between(t1 + Duration::from_secs(3), Instant::now());
    assert!(
        mean(&settled) >= 0.98 * CAPACITY,
        "mean after failover {}",
        mean(&settled)
    );
    eprintln!(
        "leader killed: new leader in {failover:?}; peak {:.1}/s, min {:.1}/s, mean from 3 s {:.1}/s",
        peak(&after),
        after.iter().map(|s| s.rate).fold(f64::MAX, f64::min),
        mean(&settled)
    );

    // 3. Redis is killed: the leader keeps serving from memory (holding), clients keep
    // their shares.
    let t2 = Instant::now();
    redis.kill();
    wait_for(Duration::from_secs(3), "the leader holds", || {
        servers[new_leader].role().as_deref() == Some("holding")
    });
    let refreshes = servers[new_leader].refreshes();
    sleep_until(t2 + Duration::from_secs(4));
    assert!(
        servers[new_leader].refreshes() > refreshes,
        "refreshes answered without Redis"
    );
    let without = clients.between(t2 + Duration::from_secs(1), Instant::now());
    assert!(
        peak(&without) <= BOUND,
        "peak without Redis {}",
        peak(&without)
    );
    assert!(
        mean(&without) >= 0.95 * CAPACITY,
        "mean without Redis {}",
        mean(&without)
    );
    eprintln!("redis down: mean {:.1}/s", mean(&without));
    redis.restart();
    wait_for(
        Duration::from_secs(5),
        "a leader after Redis returns",
        || leader_of(&servers).is_some(),
    );
    sleep_until(Instant::now() + Duration::from_secs(3));

    // 4. Every server is killed: the clients keep their leases (6 s), then their safe
    // capacity.
    let t3 = Instant::now();
    for s in &mut servers {
        s.kill();
    }
    sleep_until(t3 + Duration::from_secs(4));
    let leased = clients.between(t3 + Duration::from_secs(1), Instant::now());
    assert!(leased.iter().all(|s| s.granted == CLIENTS), "{leased:?}");
    assert!(
        mean(&leased) >= 0.95 * CAPACITY,
        "mean on leases {}",
        mean(&leased)
    );
    sleep_until(t3 + Duration::from_secs(11));
    let safe = clients.between(t3 + Duration::from_secs(8), Instant::now());
    assert!(safe.iter().all(|s| s.granted == 0), "{safe:?}");
    let floor = SAFE * CLIENTS as f64;
    assert!(
        safe.iter()
            .all(|s| s.rate <= floor * 1.05 + 20.0 && s.rate >= floor * 0.9),
        "safe capacity: {safe:?}"
    );
    eprintln!(
        "all servers down: {:.1}/s on leases, then {:.1}/s on safe capacity",
        mean(&leased),
        mean(&safe)
    );

    // 5. The servers come back: the snapshot in Redis shows every lease has lapsed, so the
    // new leader allocates at once; fair shares within two refresh intervals of the clients'
    // return (their backoff after 11 s of failures is at most 16 s).
    let t4 = Instant::now();
    for (s, &(h, g)) in servers.iter_mut().zip(&ports) {
        *s = Server::start(&quota, &redis.url(), h, g);
    }
    let back = wait_for(Duration::from_secs(30), "every client leased again", || {
        clients.all().last().is_some_and(|s| s.granted == CLIENTS)
    });
    let returned = Instant::now();
    let fair = wait_for(
        Duration::from_secs(2) + Duration::from_millis(1500),
        "fair shares",
        || {
            clients
                .all()
                .last()
                .is_some_and(|s| s.rates.iter().all(|r| (r - 100.0).abs() < 1.0))
        },
    );
    sleep_until(returned + Duration::from_secs(5));
    let restarted = clients.between(t4, Instant::now());
    assert!(
        peak(&restarted) <= BOUND,
        "peak after restart {}",
        peak(&restarted)
    );
    eprintln!(
        "restart: every client leased after {back:?}, fair {fair:?} later; peak {:.1}/s",
        peak(&restarted)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_follower_names_the_leader_over_http_and_grpc() {
    use weir_quota::proto::{RefreshRequest, RefreshResponse, ResourceAsk, REFRESH_PATH};
    let redis = support::Redis::start();
    let dir = std::env::temp_dir().join(format!("weir-quota-follower-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let quota = dir.join("quota.yaml");
    std::fs::write(&quota, QUOTA).unwrap();
    let (lh, lg) = (support::free_port(), support::free_port());
    let leader = Server::start(&quota, &redis.url(), lh, lg);
    wait_for(Duration::from_secs(10), "leader", || {
        leader.role().as_deref() == Some("leader")
    });
    let (fh, fg) = (support::free_port(), support::free_port());
    let follower = Server::start(&quota, &redis.url(), fh, fg);
    wait_for(Duration::from_secs(10), "follower", || {
        follower.role().as_deref() == Some("follower") && follower.leader().is_some()
    });
    // HTTP: 421 naming the leader's HTTP and gRPC addresses.
    let body = r#"{"client":"c","resources":[{"resource":"search","wants":5}]}"#;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", fh)).unwrap();
    write!(
        s,
        "POST /quota/v1/refresh HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
    assert!(
        answer.contains(&format!("\"leader\":\"http://127.0.0.1:{lh}\""))
            && answer.contains(&format!("\"leaderGrpc\":\"127.0.0.1:{lg}\"")),
        "{answer}"
    );
    // gRPC: FAILED_PRECONDITION with the leader in the metadata; the leader answers.
    let ask = RefreshRequest {
        client: "c".into(),
        resources: vec![ResourceAsk {
            resource: "search".into(),
            wants: 5.0,
            ..ResourceAsk::default()
        }],
    };
    let e = common::quota_grpc::<_, RefreshResponse>(fg, REFRESH_PATH, ask.clone())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let named = e.metadata().get("weir-quota-leader-grpc").unwrap();
    assert_eq!(named.to_str().unwrap(), format!("127.0.0.1:{lg}"));
    let r = common::quota_grpc::<_, RefreshResponse>(lg, REFRESH_PATH, ask)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.leases.len(), 1);
    assert!(r.leases[0].learning, "the first leader learns: {r:?}");
    let _ = std::fs::remove_dir_all(dir);
}
