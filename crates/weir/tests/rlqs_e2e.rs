//! Envoy's RLQS end to end: two real Envoys (configured from `deploy/envoy/rlqs.yaml`, ports
//! replaced) in front of one upstream, one `weir serve --quota` dividing each user's capacity
//! between them. Each Envoy is driven at its own rate; the upstream counts what it receives.
//! Windows are seconds long, as for every end-to-end test.

use crate::{common, support};

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Each user's capacity (units/s).
const R: f64 = 20.0;

const QUOTA: &str = "resources:
  - {name: 'user-*', capacity: 20/s, lease: 10s}
  - {name: closed, capacity: 0, lease: 10s}
rlqs:
  domain: envoy
  idle: 20s
  buckets:
    - {match: {name: per_user, user: '*'}, resource: 'user-{user}'}
    - {match: {name: closed}, resource: closed}
    - {match: {name: open}, unlimited: true}
";

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn weir(quota: &Path, http: u16, grpc: u16) -> Proc {
    Proc(common::serve_quota(quota, None, http, grpc))
}

/// An Envoy from the documented configuration: (process, listener port).
fn envoy(dir: &Path, id: &str, upstream: u16, grpc: u16) -> (Proc, u16) {
    envoy_to(dir, id, upstream, &[grpc])
}

/// The same with several weir servers in its RLQS cluster.
fn envoy_to(dir: &Path, id: &str, upstream: u16, grpc: &[u16]) -> (Proc, u16) {
    let (port, admin) = (common::free_port(), common::free_port());
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/envoy/rlqs.yaml");
    let yaml = std::fs::read_to_string(doc).unwrap();
    let mut replaced = yaml.clone();
    for (from, to) in [
        ("port_value: 9901}", format!("port_value: {admin}}}")),
        ("port_value: 10000}", format!("port_value: {port}}}")),
        ("port_value: 8000}", format!("port_value: {upstream}}}")),
        (
            "        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 8081}}}\n",
            grpc.iter()
                .map(|p| format!("        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {p}}}}}}}\n"))
                .collect(),
        ),
        ("value: envoy-1}", format!("value: {id}}}")),
    ] {
        assert!(replaced.contains(from), "{from} in deploy/envoy/rlqs.yaml");
        replaced = replaced.replace(from, &to);
    }
    let file = dir.join(format!("envoy-{id}.yaml"));
    std::fs::write(&file, replaced).unwrap();
    let p = Proc(common::start_envoy(&file, admin, port));
    (p, port)
}

/// One GET through Envoy: (status, body). Reads exactly the answer (its Content-Length),
/// not to the connection's close, which Envoy may delay after a local reply.
fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    use std::io::BufRead;
    let Ok(s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut w = &s;
    if w.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut r = std::io::BufReader::new(&s);
    let (mut status, mut len) = (String::new(), 0usize);
    if r.read_line(&mut status).is_err() {
        return (0, String::new());
    }
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; len];
    let _ = r.read_exact(&mut body);
    let code = status.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, String::from_utf8_lossy(&body).into_owned())
}

/// Sends `rate` requests/s for `user` through the Envoy on `port` (path `/{tag}`) until
/// `until`.
fn drive(
    port: u16,
    tag: &'static str,
    user: &'static str,
    rate: f64,
    until: Instant,
) -> std::thread::JoinHandle<()> {
    drive_as(port, tag, vec![("x-user", user)], rate, until)
}

/// The same with the request headers `headers`.
fn drive_as(
    port: u16,
    tag: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    rate: f64,
    until: Instant,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut k = 0u32;
        while Instant::now() < until {
            let at = start + Duration::from_secs_f64(f64::from(k) / rate);
            if let Some(d) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            let _ = get(port, &format!("/{tag}"), &headers);
            k += 1;
        }
    })
}

/// What the upstream received: (time, request path).
type Log = Arc<Mutex<Vec<(Instant, String)>>>;

/// Units/s the upstream received on `path` between `from` and `to`.
fn rate(log: &Log, path: &str, from: Instant, to: Instant) -> f64 {
    let n = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, p)| *t >= from && *t < to && p == path)
        .count();
    n as f64 / (to - from).as_secs_f64()
}

/// A directory with the quota file, and an upstream logging what it receives.
fn setup(name: &str) -> (std::path::PathBuf, std::path::PathBuf, Log, u16) {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let quota = dir.join("quota.yaml");
    std::fs::write(&quota, QUOTA).unwrap();
    let log: Log = Arc::default();
    let sink = log.clone();
    let upstream = common::http1_upstream(move |line, _| {
        let path = line.split(' ').nth(1).unwrap_or("").to_string();
        sink.lock().unwrap().push((Instant::now(), path));
        "ok".to_string()
    });
    (dir, quota, log, upstream)
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

#[test]
fn two_envoys_share_each_users_capacity_max_min_fair() {
    let (dir, quota, log, upstream) = setup("weir-rlqs");
    let (http, grpc) = (common::free_port(), common::free_port());
    let started = Instant::now();
    let mut server = weir(&quota, http, grpc);
    let (_a, port_a) = envoy(&dir, "envoy-a", upstream, grpc);
    let (_b, port_b) = envoy(&dir, "envoy-b", upstream, grpc);
    // Both Envoys connected (a bucket new to a learning server gets its share at once).
    sleep_until(started + Duration::from_secs(2));

    // bob: a light client on Envoy A (8/s) and a heavy one on Envoy B (40/s); alice: 30/s on B.
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(30);
    let load = [
        drive(port_a, "a/bob", "bob", 8.0, until),
        drive(port_b, "b/bob", "bob", 40.0, until),
        drive(port_b, "b/alice", "alice", 30.0, until),
    ];
    // An unlimited bucket never blocks; a zero-capacity one gets the configured deny answer.
    let open: Vec<u16> = (0..30)
        .map(|_| get(port_a, "/open", &[("x-bucket", "open")]).0)
        .collect();
    assert!(open.iter().all(|c| *c == 200), "{open:?}");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, body) = get(port_a, "/closed", &[("x-bucket", "closed")]);
        if code == 429 {
            assert_eq!(body, "closed for now\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed bucket was never denied"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for h in load {
        h.join().unwrap();
    }
    // Measured over the last 20 s (after two report intervals to converge).
    let (from, to) = (t0 + Duration::from_secs(10), until);
    let a_bob = rate(&log, "/a/bob", from, to);
    let b_bob = rate(&log, "/b/bob", from, to);
    let alice = rate(&log, "/b/alice", from, to);
    eprintln!(
        "bob: {a_bob:.2}/s via A (offered 8), {b_bob:.2}/s via B (offered 40), total {:.2}/s of {R}; alice {alice:.2}/s of {R}",
        a_bob + b_bob
    );
    assert!(
        a_bob >= 0.95 * 8.0,
        "the light client gets all it asks: {a_bob}"
    );
    assert!(
        a_bob + b_bob <= R * 1.05,
        "bob over his capacity: {}",
        a_bob + b_bob
    );
    assert!(
        a_bob + b_bob >= 0.95 * R,
        "bob under his capacity: {}",
        a_bob + b_bob
    );
    assert!((0.95 * R..=R * 1.05).contains(&alice), "alice: {alice}");

    // weir stops: Envoy B keeps its last assignment until its TTL (the 10 s lease, re-sent at
    // least every 5 s), then its fallback (10/s, its local share); weir back: the bucket is new
    // to it, so it gets its share again at its first report (no drop meanwhile).
    let start = Instant::now();
    let until = start + Duration::from_secs(50);
    let heavy = drive(port_b, "b2/carol", "carol", 40.0, until);
    let t1 = start + Duration::from_secs(12);
    sleep_until(t1);
    drop(server);
    sleep_until(t1 + Duration::from_secs(4));
    let kept = rate(&log, "/b2/carol", t1, t1 + Duration::from_secs(4));
    sleep_until(t1 + Duration::from_secs(16));
    let fallback = rate(
        &log,
        "/b2/carol",
        t1 + Duration::from_secs(11),
        t1 + Duration::from_secs(16),
    );
    let t3 = t1 + Duration::from_secs(17);
    sleep_until(t3);
    server = weir(&quota, http, grpc);
    heavy.join().unwrap();
    let per_second: Vec<String> = (0..50)
        .map(|i| {
            let f = start + Duration::from_secs(i);
            format!(
                "{:.0}",
                rate(&log, "/b2/carol", f, f + Duration::from_secs(1))
            )
        })
        .collect();
    eprintln!(
        "carol, per second from the start (weir stopped at 12 s, back at 29 s): {}",
        per_second.join(" ")
    );
    let learning = rate(&log, "/b2/carol", t3, t3 + Duration::from_secs(10));
    let resumed = rate(&log, "/b2/carol", t3 + Duration::from_secs(13), until);
    eprintln!(
        "weir stopped: {kept:.2}/s while the assignment lasts, {fallback:.2}/s on the fallback; restarted: {learning:.2}/s in its first 10 s, then {resumed:.2}/s"
    );
    assert!((0.9 * R..=1.05 * R).contains(&kept), "kept {kept}");
    assert!((9.0..=10.5).contains(&fallback), "fallback {fallback}");
    assert!(learning >= 9.0, "no drop after the restart: {learning}");
    assert!((0.9 * R..=1.05 * R).contains(&resumed), "resumed {resumed}");
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// `weir serve --quota` sharing the quota through Redis (leader key TTL 1 s).
fn weir_ha(quota: &Path, redis: &str, http: u16, grpc: u16) -> Proc {
    Proc(common::serve_quota(quota, Some(redis), http, grpc))
}

/// The failover role `GET /quota/v1/allocations` reports.
fn role(http: u16) -> String {
    common::failover(http)
        .and_then(|f| f["role"].as_str().map(str::to_string))
        .unwrap_or_default()
}

#[test]
fn envoy_follows_the_quota_leader_through_a_failover() {
    let redis = support::Redis::start();
    let (dir, quota, log, upstream) = setup("weir-rlqs-ha");
    let ports: Vec<(u16, u16)> = (0..2)
        .map(|_| (common::free_port(), common::free_port()))
        .collect();
    let started = Instant::now();
    let leader = weir_ha(&quota, &redis.url(), ports[0].0, ports[0].1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while role(ports[0].0) != "leader" {
        assert!(Instant::now() < deadline, "no leader");
        std::thread::sleep(Duration::from_millis(50));
    }
    let follower = weir_ha(&quota, &redis.url(), ports[1].0, ports[1].1);
    let (_e, port) = envoy_to(&dir, "envoy-a", upstream, &[ports[0].1, ports[1].1]);
    // Envoy connected and healthy-checked (a bucket new to the leader gets its share at once).
    sleep_until(started + Duration::from_secs(3));
    let start = Instant::now();
    let until = start + Duration::from_secs(40);
    let load = drive(port, "zed", "zed", 40.0, until);
    let t1 = start + Duration::from_secs(15);
    sleep_until(t1);
    let steady = rate(&log, "/zed", start + Duration::from_secs(8), t1);
    drop(leader);
    let deadline = Instant::now() + Duration::from_secs(10);
    while role(ports[1].0) != "leader" {
        assert!(Instant::now() < deadline, "no new leader");
        std::thread::sleep(Duration::from_millis(50));
    }
    let elected = t1.elapsed();
    load.join().unwrap();
    let per_second: Vec<f64> = (0..40)
        .map(|i| {
            let f = start + Duration::from_secs(i);
            rate(&log, "/zed", f, f + Duration::from_secs(1))
        })
        .collect();
    let after = rate(&log, "/zed", t1, until);
    let settled = rate(&log, "/zed", t1 + Duration::from_secs(15), until);
    eprintln!(
        "steady {steady:.2}/s; leader killed at 15 s, new leader after {elected:?}; {after:.2}/s over the 25 s after, {settled:.2}/s from 15 s on; per second: {per_second:?}"
    );
    assert!((0.95 * R..=1.05 * R).contains(&steady), "steady {steady}");
    // The Envoy keeps its assignment (TTL 10 s) through the switch and never exceeds it;
    // the new leader resumes from the snapshot (the Envoy's weir-client-id names its rows).
    assert!(
        per_second[15..].iter().all(|r| *r <= R + 2.0),
        "a second above the capacity: {per_second:?}"
    );
    assert!((0.9 * R..=1.05 * R).contains(&after), "after {after}");
    assert!(
        (0.95 * R..=1.05 * R).contains(&settled),
        "settled {settled}"
    );
    drop(follower);
    let _ = std::fs::remove_dir_all(dir);
}

/// `name`'s value in Prometheus text (the first series of that name).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Resident memory of a process, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn random_users_are_abandoned_when_idle_and_memory_stays_flat() {
    let (dir, quota, _log, upstream) = setup("weir-rlqs-random");
    std::fs::write(&quota, QUOTA.replace("idle: 20s", "idle: 3s")).unwrap();
    let (http, grpc) = (common::free_port(), common::free_port());
    let server = weir(&quota, http, grpc);
    let (port, admin) = (common::free_port(), common::free_port());
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/envoy/rlqs.yaml");
    let yaml = std::fs::read_to_string(doc)
        .unwrap()
        .replace("port_value: 9901}", &format!("port_value: {admin}}}"))
        .replace("port_value: 10000}", &format!("port_value: {port}}}"))
        .replace("port_value: 8000}", &format!("port_value: {upstream}}}"))
        .replace("port_value: 8081}", &format!("port_value: {grpc}}}"));
    let file = dir.join("envoy-random.yaml");
    std::fs::write(&file, yaml).unwrap();
    let envoy = Proc(common::start_envoy(&file, admin, port));
    // A new user id on every request, 100/s for 45 s: 4 500 buckets offered.
    let start = Instant::now();
    let until = start + Duration::from_secs(45);
    let driver = std::thread::spawn(move || {
        let mut n = 0u64;
        while Instant::now() < until {
            let at = start + Duration::from_millis(n * 10);
            if let Some(d) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            let user = format!("user-{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let _ = get(port, "/r", &[("x-user", user.as_str())]);
            n += 1;
        }
        n
    });
    let mut samples = Vec::new();
    for at in [15u64, 30, 45] {
        sleep_until(start + Duration::from_secs(at));
        let m = common::get_body(http, "/metrics").unwrap_or_default();
        let envoy_mem = common::get_body(admin, "/memory").unwrap_or_default();
        // `"allocated": "N"` (the answer may be chunked: read the field, not the JSON).
        let allocated: f64 = envoy_mem
            .split("\"allocated\": \"")
            .nth(1)
            .and_then(|r| r.split('"').next()?.parse().ok())
            .unwrap_or(0.0);
        samples.push((
            metric(&m, "weir_rlqs_buckets"),
            metric(&m, "weir_rlqs_abandoned_idle_total"),
            rss_kib(server.0.id()),
            allocated / 1024.0,
        ));
    }
    let sent = driver.join().unwrap();
    eprintln!(
        "{sent} requests, one new user each; at 15/30/45 s (buckets tracked, abandoned so far, weir RSS KiB, Envoy allocated KiB): {samples:?}"
    );
    for (buckets, _, _, _) in &samples {
        // 100 new buckets/s live at most a report interval (5 s) + the idle time (3 s) + a
        // tick or two before they are abandoned.
        assert!(*buckets <= 1_200.0, "buckets tracked: {samples:?}");
    }
    assert!(samples[2].1 >= 2_000.0, "abandoned: {samples:?}");
    let (w15, w45) = (samples[0].2 as f64, samples[2].2 as f64);
    let (e15, e45) = (samples[0].3, samples[2].3);
    assert!(w45 <= w15 * 1.25 + 2048.0, "weir memory grew: {samples:?}");
    assert!(e45 <= e15 * 1.25 + 2048.0, "Envoy memory grew: {samples:?}");
    drop(envoy);
    let _ = std::fs::remove_dir_all(dir);
}

/// The quota file of docs/rlqs.md's quick start, as written there.
fn quick_start_quota() -> String {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/rlqs.md"))
            .unwrap();
    let start = doc.find("## Quick start").expect("a quick start");
    let block = doc[start..]
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its quota file");
    assert!(block.contains("# quota.yaml"), "{block}");
    block.to_string()
}

#[test]
fn an_orgs_capacity_is_shared_by_its_users_each_under_its_own() {
    // The quick start's nested resources: each org 30/s, each of its users at most 20/s.
    let (dir, quota, log, upstream) = setup("weir-rlqs-org");
    std::fs::write(&quota, quick_start_quota()).unwrap();
    let (http, grpc) = (common::free_port(), common::free_port());
    let _server = weir(&quota, http, grpc);
    let (_envoy, port) = envoy(&dir, "envoy-1", upstream, grpc);
    std::thread::sleep(Duration::from_secs(1));
    // bob and amy of acme at 30/s each: the org's 30/s split, 15/s each; zoe of another org
    // alone: her own 20/s.
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(20);
    let load = [
        drive_as(
            port,
            "acme/bob",
            vec![("x-org", "acme"), ("x-user", "bob")],
            30.0,
            until,
        ),
        drive_as(
            port,
            "acme/amy",
            vec![("x-org", "acme"), ("x-user", "amy")],
            30.0,
            until,
        ),
        drive_as(
            port,
            "globex/zoe",
            vec![("x-org", "globex"), ("x-user", "zoe")],
            30.0,
            until,
        ),
    ];
    for h in load {
        h.join().unwrap();
    }
    let from = t0 + Duration::from_secs(8);
    let (bob, amy, zoe) = (
        rate(&log, "/acme/bob", from, until),
        rate(&log, "/acme/amy", from, until),
        rate(&log, "/globex/zoe", from, until),
    );
    eprintln!("acme (30/s): bob {bob:.2}/s, amy {amy:.2}/s, together {:.2}/s; globex's zoe {zoe:.2}/s of her 20/s", bob + amy);
    assert!((27.0..=31.5).contains(&(bob + amy)), "acme: {bob} + {amy}");
    assert!(
        (12.0..=17.0).contains(&bob) && (12.0..=17.0).contains(&amy),
        "{bob} {amy}"
    );
    assert!((18.0..=21.0).contains(&zoe), "zoe: {zoe}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Upstream requests/s on `path` over `[from + skip, to)`.
fn rate_after(log: &Log, path: &str, from: Instant, skip: u64, to: Instant) -> f64 {
    rate(log, path, from + Duration::from_secs(skip), to)
}

#[test]
fn the_quick_start_denies_at_once_and_a_new_user_gets_its_share_within_6_s_even_after_a_restart() {
    let (dir, quota, log, upstream) = setup("weir-rlqs-quick");
    std::fs::write(&quota, quick_start_quota()).unwrap();
    let (http, grpc) = (common::free_port(), common::free_port());
    let server = weir(&quota, http, grpc);
    let (_envoy, port) = envoy(&dir, "envoy-1", upstream, grpc);
    // A capacity of 0 is DENY_ALL from its first report: at most the requests before the first
    // assignment pass (Envoy's no-assignment behaviour).
    let t0 = Instant::now();
    let mut passed = 0;
    loop {
        let (code, _) = get(port, "/closed", &[("x-bucket", "closed")]);
        if code == 429 {
            break;
        }
        passed += 1;
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "closed still open after {passed} requests"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A new user on a just-started server: 30/s offered, its 20/s within 6 s.
    let t1 = Instant::now();
    drive(port, "dora", "dora", 30.0, t1 + Duration::from_secs(10))
        .join()
        .unwrap();
    let dora = rate_after(&log, "/dora", t1, 6, t1 + Duration::from_secs(10));
    // After a restart (no snapshot: the server learns), another new user likewise.
    drop(server);
    std::thread::sleep(Duration::from_millis(500));
    let _server = weir(&quota, http, grpc);
    let t2 = Instant::now();
    drive(port, "erin", "erin", 30.0, t2 + Duration::from_secs(10))
        .join()
        .unwrap();
    let erin = rate_after(&log, "/erin", t2, 6, t2 + Duration::from_secs(10));
    eprintln!("closed: {passed} passed before the first assignment; dora {dora:.2}/s, erin after a restart {erin:.2}/s (capacity 20/s, offered 30/s)");
    for (who, r) in [("dora", dora), ("erin", erin)] {
        assert!(
            (0.9 * R..=1.05 * R).contains(&r),
            "{who}: {r:.2}/s from 6 s on"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
