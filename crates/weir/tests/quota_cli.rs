//! `weir quota allocate` and `weir simulate quota` through the real binary: the seed example,
//! input order, located errors with nothing on stdout, and the simulator's measures on the
//! built-in scenario (with and without the server going away).

use crate::common;

use std::io::Write;

fn weir(args: &[&str], stdin: &str) -> (i32, String, String) {
    let out = common::run(args, stdin);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn allocate_prints_the_seed_example_in_input_order() {
    let (code, out, err) = weir(
        &["quota", "allocate", "--capacity", "10"],
        "client,wants\nd,5\na,2\nc,4\nb,2.6\n",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "client,share\nd,2.7\na,2\nc,2.7\nb,2.6\n");
    assert!(err.contains("total 10 of capacity 10"), "{err}");
    // Priorities and weights; another algorithm.
    let (code, out, _) = weir(
        &[
            "quota",
            "allocate",
            "--capacity",
            "10",
            "--algorithm",
            "static",
        ],
        "a,1\nb,9\n",
    );
    assert_eq!((code, out.as_str()), (0, "client,share\na,1\nb,5\n"));
}

#[test]
fn allocate_refuses_bad_input_with_the_line_and_prints_nothing() {
    let (code, out, err) = weir(&["quota", "allocate", "--capacity", "10"], "a,1\nb,lots\n");
    assert_eq!(code, 2);
    assert!(out.is_empty(), "partial output: {out}");
    assert_eq!(
        err.trim(),
        "weir: error: stdin:2: wants \"lots\" is not a number"
    );
    let (code, _, err) = weir(
        &[
            "quota",
            "allocate",
            "--capacity",
            "10",
            "--algorithm",
            "fair",
        ],
        "",
    );
    assert_eq!(code, 2);
    assert!(err.contains("fair"), "{err}");
}

#[test]
fn allocate_divides_nested_quotas_by_a_parent_column() {
    // docs/quota.md: an org of 1 000/s over team-a (400/s, users of at most 50/s), team-b
    // (400/s) and team-c (no cap).
    let mut input =
        String::from("client,parent,capacity,wants\nteam-a,,400,\nteam-b,,400,\nteam-c,,none,\n");
    for u in 0..10 {
        input.push_str(&format!("user-{u},team-a,50,\nhost-{u},user-{u},,100\n"));
    }
    input.push_str("b1,team-b,,30\nb2,team-b,50,\nb2-host,b2,,500\nc1,team-c,,900\n");
    let (code, out, err) = weir(&["quota", "allocate", "--capacity", "1000"], &input);
    assert_eq!(code, 0, "{err}");
    let shares: std::collections::HashMap<&str, &str> = out
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(','))
        .collect();
    for (name, share) in [
        ("team-a", "400"),
        ("user-3", "40"),
        ("host-3", "40"),
        ("team-b", "80"),
        ("b1", "30"),
        ("b2-host", "50"),
        ("team-c", "520"),
        ("c1", "520"),
    ] {
        assert_eq!(shares[name], share, "{name} in\n{out}");
    }
    assert!(
        err.contains("total 1000 of capacity 1000 (13 clients, nested fair_share)"),
        "{err}"
    );
    // Each mistake names its line; nothing on stdout.
    for (input, message) in [
        (
            "client,parent,capacity,wants\na,nowhere,,1\n",
            "stdin:2: parent \"nowhere\" is not a row of this input",
        ),
        (
            "client,parent,capacity,wants\ng,,5,\nh,g,9,\n",
            "stdin:3: capacity 9 is more than its parent \"g\" has (5)",
        ),
        (
            "client,parent,capacity,wants\na,,,1\nb,a,,1\n",
            "stdin:3: parent \"a\" is a client (it has wants)",
        ),
        (
            "client,parent,capacity,wants\nx,y,5,\ny,x,5,\n",
            "stdin:2: a cycle of parents: x → y → x",
        ),
        (
            // A row under a loop: the loop is named, at its own line.
            "client,parent,capacity,wants\nu,x,,1\nx,y,5,\ny,x,5,\n",
            "stdin:3: a cycle of parents: x → y → x",
        ),
        (
            "client,parent,capacity,wants\nx,,5,1\n",
            "stdin:2: give wants (a client) or capacity (a group), not both",
        ),
        ("client,boss,wants\n", "stdin:1: unknown column \"boss\""),
    ] {
        let (code, out, err) = weir(&["quota", "allocate", "--capacity", "10"], input);
        assert_eq!(code, 2, "{input}");
        assert!(out.is_empty(), "partial output: {out}");
        assert!(err.contains(message), "{message} in {err}");
    }
    let (code, _, err) = weir(
        &[
            "quota",
            "allocate",
            "--capacity",
            "10",
            "--algorithm",
            "static",
        ],
        "client,parent,capacity,wants\ng,,5,\na,g,,1\n",
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("stdin: nested quotas are divided by fair_share"),
        "{err}"
    );
}

#[test]
fn simulate_quota_tree_meets_its_goals_and_refuses_bad_shapes() {
    let (code, out, err) = weir(
        &[
            "simulate",
            "quota",
            "--tree",
            "1x3x9",
            "--clients",
            "900",
            "--capacity",
            "10000",
            "--refresh",
            "2s",
            "--lease",
            "10s",
            "--duration",
            "150s",
            "--json",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert!(common::json_number(&out, "utilisation") >= 0.98, "{out}");
    assert!(common::json_number(&out, "peak_ratio") <= 1.01, "{out}");
    assert!(
        common::json_number(&out, "fairness_error_ratio") <= 0.01,
        "{out}"
    );
    assert!(
        common::json_number(&out, "misplaced_ratio") <= 0.01,
        "{out}"
    );
    assert!(
        common::json_number(&out, "converge_ms_max") <= common::json_number(&out, "bound_ms"),
        "{out}"
    );
    for (shape, message) in [
        ("1x3x10", "whole multiple"),
        ("10", "2 to 6 levels"),
        ("1xax2", "like 1x10x100"),
    ] {
        let (code, _, err) = weir(
            &[
                "simulate",
                "quota",
                "--tree",
                shape,
                "--capacity",
                "10",
                "--clients",
                "100",
            ],
            "",
        );
        assert_eq!(code, 2, "{shape}");
        assert!(err.contains(message), "{shape}: {err}");
    }
    let (code, _, err) = weir(
        &[
            "simulate",
            "quota",
            "--capacity",
            "10",
            "--cut-region",
            "1s..2s",
        ],
        "",
    );
    assert_eq!(code, 2);
    assert!(err.contains("--cut-region needs --tree"), "{err}");
}

#[test]
fn the_server_down_figures_of_docs_quota_md_are_what_the_command_prints() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/quota.md"),
    )
    .unwrap();
    let text = doc
        .split("(`--server-down 100s..200s`)")
        .nth(1)
        .expect("the server-down paragraph");
    // "mean A – B %" (or "mean A %"): the range over the seeds.
    let range_after = |label: &str| -> (f64, f64) {
        let rest = text
            .split(label)
            .nth(1)
            .unwrap_or_else(|| panic!("{label}"));
        let figures: Vec<f64> = rest
            .split('%')
            .next()
            .unwrap()
            .split('–')
            .map(|n| {
                n.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("a number after {label}: {n:?}"))
            })
            .collect();
        (figures[0], *figures.last().unwrap())
    };
    let (mean, peak) = (range_after("mean"), range_after("peak"));
    let back = text
        .split("learning, peak")
        .nth(1)
        .expect("the figure after the return");
    let range: Vec<f64> = back
        .split('%')
        .next()
        .unwrap()
        .split('–')
        .map(|n| n.trim().parse().unwrap())
        .collect();
    let pct = |x: f64| (x * 1000.0).round() / 10.0;
    let (mut after, mut means, mut peaks) = (Vec::new(), Vec::new(), Vec::new());
    for seed in 1..=5 {
        let seed = seed.to_string();
        let (code, out, err) = weir(
            &[
                "simulate",
                "quota",
                "--capacity",
                "1000",
                "--server-down",
                "100s..200s",
                "--seed",
                &seed,
                "--json",
            ],
            "",
        );
        assert_eq!(code, 0, "{err}");
        means.push(pct(common::json_number(&out, "server_down_mean_ratio")));
        peaks.push(pct(common::json_number(&out, "server_down_peak_ratio")));
        after.push(pct(common::json_number(&out, "peak_ratio")));
    }
    let span = |v: &[f64]| {
        v.iter()
            .fold((f64::MAX, 0.0f64), |(l, h), x| (l.min(*x), h.max(*x)))
    };
    assert_eq!(span(&means), mean, "means over the seeds: {means:?}");
    assert_eq!(span(&peaks), peak, "peaks over the seeds: {peaks:?}");
    let (lo, hi) = after
        .iter()
        .fold((f64::MAX, 0.0f64), |(l, h), x| (l.min(*x), h.max(*x)));
    assert_eq!(
        vec![lo, hi],
        range,
        "peak after the return, seeds 1 – 5: {after:?}"
    );
}

#[test]
fn simulate_quota_on_the_built_in_scenario_meets_its_goals() {
    let (code, out, err) = weir(&["simulate", "quota", "--capacity", "1000", "--json"], "");
    assert_eq!(code, 0, "{err}");
    assert!(common::json_number(&out, "utilisation") >= 0.99, "{out}");
    assert!(common::json_number(&out, "peak_ratio") <= 1.01, "{out}");
    assert!(
        common::json_number(&out, "max_fairness_error") <= 10.0,
        "{out}"
    );
    assert!(
        common::json_number(&out, "converge_ms_p99") <= 10_000.0,
        "{out}"
    );
    // As text: the CSV alone on stdout (`> out.csv` is a CSV file), the measures on stderr.
    let (code, csv, summary) = weir(&["simulate", "quota", "--capacity", "1000"], "");
    assert_eq!(code, 0, "{summary}");
    assert!(
        csv.starts_with("t_s,demand,granted,admitted,fairness_error,server\n"),
        "{csv}"
    );
    assert!(summary.contains("utilisation"), "{summary}");
    // Deterministic for a seed, and every seed its own run (seeds 0 and 1, 2 and 3, … too).
    let (_, again, _) = weir(&["simulate", "quota", "--capacity", "1000", "--json"], "");
    assert_eq!(out, again);
    let runs: Vec<String> = (0..4)
        .map(|seed| {
            let seed = seed.to_string();
            let (code, out, err) = weir(
                &[
                    "simulate",
                    "quota",
                    "--capacity",
                    "1000",
                    "--seed",
                    &seed,
                    "--json",
                ],
                "",
            );
            assert_eq!(code, 0, "{err}");
            out
        })
        .collect();
    for (i, a) in runs.iter().enumerate() {
        for (j, b) in runs.iter().enumerate().skip(i + 1) {
            assert_ne!(a, b, "seeds {i} and {j} gave the same run");
        }
    }
    let (code, out, _) = weir(
        &[
            "simulate",
            "quota",
            "--capacity",
            "1000",
            "--server-down",
            "100s..200s",
            "--json",
        ],
        "",
    );
    assert_eq!(code, 0);
    assert!(
        common::json_number(&out, "server_down_mean_ratio") > 0.5,
        "{out}"
    );
    assert!(
        common::json_number(&out, "server_down_peak_ratio") <= 1.1,
        "{out}"
    );
    let (code, _, err) = weir(
        &[
            "simulate",
            "quota",
            "--capacity",
            "1000",
            "--server-down",
            "200s..100s",
        ],
        "",
    );
    assert_eq!(code, 2);
    assert!(err.contains("FROM..TO"), "{err}");
}

/// `weir serve --quota FILE` on free ports: (child, HTTP port, gRPC port).
struct Server(std::process::Child, u16, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out[9..12].parse().unwrap();
    (
        code,
        out.split_once("\r\n\r\n")
            .map(|x| x.1.to_string())
            .unwrap_or_default(),
    )
}

fn serve_quota(file: &std::path::Path) -> Server {
    let (h, g) = (common::free_port(), common::free_port());
    let (child, line) = common::start(&[
        "serve",
        "--quota",
        file.to_str().unwrap(),
        "--http-addr",
        &format!("127.0.0.1:{h}"),
        "--grpc-addr",
        &format!("127.0.0.1:{g}"),
    ]);
    assert!(line.contains("HTTP on"), "{line}");
    Server(child, h, g)
}

/// The `i`-th lease id of a refresh answer.
fn lease_id(body: &str, i: usize) -> String {
    let v: Vec<&str> = body.split("\"leaseId\":\"").skip(1).collect();
    v[i][..16].to_string()
}

/// `weir serve --quota` on a fresh quota file holding `yaml`, in its own directory.
fn serve_quota_text(what: &str, yaml: &str) -> (Server, std::path::PathBuf) {
    let dir = common::tempdir(what);
    let file = dir.join("quota.yaml");
    std::fs::write(&file, yaml).unwrap();
    (serve_quota(&file), dir)
}

fn granted(body: &str, i: usize) -> f64 {
    let v: Vec<&str> = body.split("\"granted\":").skip(1).collect();
    let s = v[i];
    s[..s.find([',', '}']).unwrap()].parse().unwrap()
}

#[test]
fn serve_quota_leases_fair_shares_over_http() {
    let dir = std::env::temp_dir().join(format!("weir-quota-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("quota.yaml");
    std::fs::write(
        &file,
        "resources:\n  - {name: search, capacity: 10/s, lease: 2s, refresh: 1s}\n",
    )
    .unwrap();
    let s = serve_quota(&file);
    // Each client presents the lease id it was given (none at first).
    let ids = std::cell::RefCell::new(std::collections::HashMap::<String, String>::new());
    let ask = |client: &str, wants: f64, has: f64| {
        let id = ids.borrow().get(client).cloned().unwrap_or_default();
        format!(
            r#"{{"client":"{client}","resources":[{{"resource":"search","wants":{wants},"has":{has},"leaseId":"{id}"}},{{"resource":"nope","wants":1}}]}}"#
        )
    };
    let refresh = |client: &str, body: String| {
        let (code, answer) = http(s.1, "POST", "/quota/v1/refresh", &body);
        if code == 200 {
            ids.borrow_mut()
                .insert(client.to_string(), lease_id(&answer, 0));
        }
        (code, answer)
    };
    // Just started: learning for one lease length (2 s). A client is granted what it holds,
    // or what it says it uses alone (`safe`), whichever is more: nothing when it says neither.
    let (code, body) = refresh("a", ask("a", 8.0, 0.0));
    assert_eq!(code, 200, "{body}");
    assert_eq!(granted(&body, 0), 0.0, "{body}");
    assert!(body.contains("\"learning\":true"), "{body}");
    assert!(body.contains("unknown resource \\\"nope\\\""), "{body}");
    let with_safe = ask("a", 8.0, 0.0).replace("\"has\":0", "\"has\":0,\"safe\":6");
    let (_, body) = refresh("a", with_safe);
    assert_eq!(granted(&body, 0), 6.0, "{body}");
    let (_, body) = refresh("old", ask("old", 8.0, 1.5));
    assert_eq!(granted(&body, 0), 1.5, "{body}");
    for client in ["a", "old"] {
        let id = ids.borrow()[client].clone();
        let release =
            format!(r#"{{"client":"{client}","resources":["search"],"leaseIds":["{id}"]}}"#);
        assert_eq!(http(s.1, "POST", "/quota/v1/release", &release).0, 204);
    }
    std::thread::sleep(std::time::Duration::from_millis(2_200));
    let (_, body) = refresh("a", ask("a", 8.0, 0.0));
    assert_eq!(granted(&body, 0), 8.0, "{body}");
    assert!(body.contains("\"refreshInMs\":1000"), "{body}");
    // b's fair share is 5; 2 are free until a shrinks.
    let (_, body) = refresh("b", ask("b", 8.0, 0.0));
    assert_eq!(granted(&body, 0), 2.0, "{body}");
    let (_, body) = refresh("a", ask("a", 8.0, 8.0));
    assert_eq!(granted(&body, 0), 5.0, "{body}");
    let (_, body) = refresh("b", ask("b", 8.0, 2.0));
    assert_eq!(granted(&body, 0), 5.0, "{body}");
    let (code, body) = http(s.1, "GET", "/quota/v1/allocations", "");
    assert_eq!(code, 200);
    assert!(
        body.contains("\"resource\":\"search\"") && body.contains("\"granted\":10.0"),
        "{body}"
    );
    let (_, metrics) = http(s.1, "GET", "/metrics", "");
    assert!(
        metrics.contains("weir_quota_granted{resource=\"search\"} 10"),
        "{metrics}"
    );
    // Bad requests name the field.
    let (code, body) = http(
        s.1,
        "POST",
        "/quota/v1/refresh",
        r#"{"client":"a","resources":[{"resource":"search"}]}"#,
    );
    assert_eq!(code, 400);
    assert!(
        body.contains("resources[0]") && body.contains("wants"),
        "{body}"
    );
    // Release, then a reload raises the capacity and keeps b's lease.
    let id = ids.borrow()["a"].clone();
    let (code, _) = http(
        s.1,
        "POST",
        "/quota/v1/release",
        &format!(r#"{{"client":"a","resources":["search"],"leaseIds":["{id}"]}}"#),
    );
    assert_eq!(code, 204);
    std::fs::write(
        &file,
        "resources:\n  - {name: search, capacity: 20/s, lease: 2s, refresh: 1s}\n",
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, body) = http(s.1, "GET", "/quota/v1/allocations", "");
        if body.contains("\"capacity\":20.0") {
            assert!(body.contains("\"client\":\"b\""), "{body}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not reloaded: {body}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn serve_quota_leases_over_grpc_with_the_proto_files_messages() {
    use weir_quota::proto::*;
    let dir = std::env::temp_dir().join(format!("weir-quota-grpc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("quota.yaml");
    std::fs::write(
        &file,
        // Clients choose their own priority here.
        "resources:\n  - {name: search, capacity: 10/s, lease: 1s, refresh: 1s}\nclients:\n  - {id: '*', own_values: true}\n",
    )
    .unwrap();
    let s = serve_quota(&file);
    let ask = |client: &str, wants: f64, priority: Priority, lease_id: u64| RefreshRequest {
        client: client.into(),
        resources: vec![
            ResourceAsk {
                resource: "search".into(),
                wants,
                has: 0.0,
                weight: 0.0,
                priority: priority as i32,
                safe: 0.0,
                lease_id,
                ..ResourceAsk::default()
            },
            ResourceAsk {
                resource: "nope".into(),
                wants: 1.0,
                ..ResourceAsk::default()
            },
        ],
    };
    // Past the learning period (one lease, 1 s).
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let r: RefreshResponse =
        common::quota_grpc(s.2, REFRESH_PATH, ask("a", 8.0, Priority::Sheddable, 0))
            .await
            .unwrap()
            .into_inner();
    assert_eq!(r.leases.len(), 2);
    let l = &r.leases[0];
    assert_eq!(
        (l.resource.as_str(), l.granted, l.refresh_in_ms),
        ("search", 8.0, 1000)
    );
    assert!(l.expires_in_ms > 900 && l.expires_in_ms <= 1000 && l.error.is_empty());
    assert!(r.leases[1].error.contains("unknown resource"), "{r:?}");
    // A CRITICAL_PLUS client is served first: the 2 left now, all 10 once a shrinks.
    let b: RefreshResponse =
        common::quota_grpc(s.2, REFRESH_PATH, ask("b", 10.0, Priority::CriticalPlus, 0))
            .await
            .unwrap()
            .into_inner();
    assert_eq!(b.leases[0].granted, 2.0);
    let held = r.leases[0].lease_id;
    let a: RefreshResponse =
        common::quota_grpc(s.2, REFRESH_PATH, ask("a", 8.0, Priority::Sheddable, held))
            .await
            .unwrap()
            .into_inner();
    assert_eq!(a.leases[0].granted, 0.0);
    let _: ReleaseResponse = common::quota_grpc(
        s.2,
        RELEASE_PATH,
        ReleaseRequest {
            client: "b".into(),
            resources: vec!["search".into()],
            lease_ids: vec![b.leases[0].lease_id],
        },
    )
    .await
    .unwrap()
    .into_inner();
    let (_, body) = http(s.1, "GET", "/quota/v1/allocations", "");
    assert!(!body.contains("\"client\":\"b\""), "released: {body}");
    // Bad calls name the field.
    let mut bad = ask("a", 1.0, Priority::Critical, 0);
    bad.resources[0].priority = 9;
    let e = common::quota_grpc::<_, RefreshResponse>(s.2, REFRESH_PATH, bad)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("resources[0].priority"), "{e:?}");
    let e = common::quota_grpc::<_, RefreshResponse>(
        s.2,
        REFRESH_PATH,
        ask("", 1.0, Priority::Critical, 0),
    )
    .await
    .unwrap_err();
    assert!(e.message().contains("client"), "{e:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn grpc_asks_carry_needs_parts_holds_and_terms_as_json_ones_do() {
    use weir_quota::proto::*;
    let dir = common::tempdir("quota-grpc-fields");
    let file = dir.join("quota.yaml");
    std::fs::write(
        &file,
        "resources:\n  - {name: search, capacity: 10/s, lease: 1s, refresh: 1s}\nclients:\n  - {id: '*', own_values: true}\n",
    )
    .unwrap();
    let s = serve_quota(&file);
    let ask = |client: &str, needs: Option<f64>, lease_id: u64| RefreshRequest {
        client: client.into(),
        resources: vec![ResourceAsk {
            resource: "search".into(),
            wants: 10.0,
            needs,
            lease_id,
            ..ResourceAsk::default()
        }],
    };
    let refresh = |r: RefreshRequest| async move {
        let r: RefreshResponse = common::quota_grpc(s.2, REFRESH_PATH, r)
            .await
            .unwrap()
            .into_inner();
        r.leases[0].clone()
    };
    // Past the learning period (one lease, 1 s).
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    // a needs 2 of its 10, b all 10: needs come first, so a keeps 2 and b gets 8 (without
    // `needs` each would get 5).
    let a = refresh(ask("a", Some(2.0), 0)).await;
    let b = refresh(ask("b", None, 0)).await;
    let a = refresh(ask("a", Some(2.0), a.lease_id)).await;
    let b = refresh(ask("b", None, b.lease_id)).await;
    assert_eq!((a.granted, b.granted), (2.0, 8.0), "{a:?} {b:?}");
    // A server below: its parts are divided here (CRITICAL_PLUS first), its term is kept, and
    // an ask in an older term is refused.
    let below = |term: u64, lease_id: u64| RefreshRequest {
        client: "region-1".into(),
        resources: vec![ResourceAsk {
            resource: "search".into(),
            wants: 10.0,
            holds: Some(0.0),
            term,
            lease_id,
            parts: vec![
                DemandPart {
                    wants: 4.0,
                    priority: Priority::CriticalPlus as i32,
                    ..DemandPart::default()
                },
                DemandPart {
                    wants: 6.0,
                    weight: 1.0,
                    ..DemandPart::default()
                },
            ],
            ..ResourceAsk::default()
        }],
    };
    // (A term counts from the holder of the row's lease: the second ask, presenting it.)
    let r = refresh(below(2, 0)).await;
    assert!(r.error.is_empty(), "{r:?}");
    let r = refresh(below(2, r.lease_id)).await;
    assert!(r.error.is_empty(), "{r:?}");
    let r = refresh(below(1, r.lease_id)).await;
    assert!(r.error.contains("term 1 is older than term 2"), "{r:?}");
    // Bad fields are named, as over HTTP/JSON.
    let mut bad = below(3, 0);
    bad.resources[0].parts[1].weight = -1.0;
    let e = common::quota_grpc::<_, RefreshResponse>(s.2, REFRESH_PATH, bad)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("resources[0].parts[1].weight"),
        "{e:?}"
    );
    // A part heavier than any client of the file may be: refused, named.
    let mut bad = below(3, 0);
    bad.resources[0].parts[1].weight = 1e12;
    let e = common::quota_grpc::<_, RefreshResponse>(s.2, REFRESH_PATH, bad)
        .await
        .unwrap_err();
    assert!(
        e.message().contains(
            "resources[0].parts[1].weight: 1000000000000: a finite number > 0 and ≤ 1000000"
        ),
        "{e:?}"
    );
    let mut bad = below(3, 0);
    bad.resources[0].parts[0].priority = 9;
    let e = common::quota_grpc::<_, RefreshResponse>(s.2, REFRESH_PATH, bad)
        .await
        .unwrap_err();
    assert!(
        e.message()
            .contains("resources[0].parts[0].priority: unknown value 9"),
        "{e:?}"
    );
    let e = common::quota_grpc::<_, RefreshResponse>(s.2, REFRESH_PATH, ask("c", Some(-1.0), 0))
        .await
        .unwrap_err();
    assert!(e.message().contains("resources[0].needs"), "{e:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn serve_refuses_a_bad_quota_file_with_its_locations() {
    let dir = std::env::temp_dir().join(format!("weir-quota-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("quota.yaml");
    std::fs::write(&file, "resources:\n  - {name: a, capacity: lots}\n").unwrap();
    let (code, _, err) = weir(&["serve", "--quota", file.to_str().unwrap()], "");
    assert_eq!(code, 2);
    assert!(
        err.starts_with("weir: error: ") && err.contains("quota.yaml:2:"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_client_enforces_its_grant_then_its_safe_capacity_when_the_server_dies() {
    use weir_quota::net::LeaseClient;
    use weir_quota::Source;
    let dir = std::env::temp_dir().join(format!("weir-quota-net-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("quota.yaml");
    std::fs::write(
        &file,
        "resources:\n  - {name: search, capacity: 100/s, lease: 2s, refresh: 1s}\n",
    )
    .unwrap();
    let f = file.clone();
    let mut server = tokio::task::spawn_blocking(move || serve_quota(&f))
        .await
        .unwrap();
    let quota = LeaseClient::builder(&format!("http://127.0.0.1:{}", server.1), "net-1")
        .resource("search", 20.0)
        .start()
        .unwrap();
    // The server is learning: the client never drops to 0 — it keeps its safe capacity until
    // granted, and is granted up to it (its share of what it asks: 1/s before any demand).
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (rate, source) = quota.resource("search").unwrap().rate();
    assert!(
        (source == Source::Safe && rate == 20.0)
            || (source == Source::Granted && (1.0..=20.0).contains(&rate)),
        "{rate} {source:?}"
    );
    // 300/s of demand for 4 s: once the server grants, the client holds the whole capacity.
    let started = std::time::Instant::now();
    let mut admitted_last_second = 0u32;
    while started.elapsed() < std::time::Duration::from_secs(4) {
        for _ in 0..3 {
            let ok = quota.acquire("search", 1).unwrap().allowed();
            if started.elapsed() >= std::time::Duration::from_secs(3) && ok {
                admitted_last_second += 1;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (rate, source) = quota.resource("search").unwrap().rate();
    assert_eq!(source, Source::Granted);
    assert!((99.0..=100.0).contains(&rate), "{rate}");
    assert!(
        (80..=103).contains(&admitted_last_second),
        "{admitted_last_second} admitted in the last second at 100/s"
    );
    assert!(quota.acquire("other", 1).is_none());
    // The server dies: the lease holds until it expires (2 s), then the safe capacity.
    let _ = server.0.kill();
    let _ = server.0.wait();
    tokio::time::sleep(std::time::Duration::from_millis(3_500)).await;
    let r = quota.resource("search").unwrap();
    let (rate, source) = r.rate();
    assert_eq!(source, Source::Safe);
    assert!(rate > 0.0, "never 0 by accident");
    assert!(
        r.counters()
            .failures
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    assert_eq!(
        r.counters()
            .expirations
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    quota.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn lease_clients_of_nested_resources_get_grants_that_fit_every_group_above() {
    use weir_quota::net::LeaseClient;
    use weir_quota::Source;
    // An org of 30/s over teams of 20/s over users of 15/s: team-a's two users want much
    // more than their team can give; team-b's one user is capped by its own 15/s. Nested
    // max-min: team-b 15, team-a 15 (7.5 per user).
    let yaml = "resources:\n  - {name: org, capacity: 30/s}\n  - {name: 'team-*', parent: org, capacity: 20/s}\n  - {name: 'user-*', parent: 'org/team-*', capacity: 15/s, lease: 2s, refresh: 1s}\n";
    let (server, dir) = tokio::task::spawn_blocking(move || serve_quota_text("nested", yaml))
        .await
        .unwrap();
    let url = format!("http://127.0.0.1:{}", server.1);
    let leaves = [
        "org/team-a/user-1",
        "org/team-a/user-2",
        "org/team-b/user-1",
    ];
    let clients: Vec<LeaseClient> = leaves
        .iter()
        .enumerate()
        .map(|(i, leaf)| {
            LeaseClient::builder(&url, &format!("host-{i}"))
                .resource(leaf, 1.0)
                .start()
                .unwrap()
        })
        .collect();
    // 100/s of demand each for up to 12 s (the server learns for its first 2 s).
    let started = std::time::Instant::now();
    let want = [7.5, 7.5, 15.0];
    let converged = |clients: &[LeaseClient]| {
        leaves.iter().zip(clients).zip(want).all(|((leaf, c), w)| {
            let (rate, source) = c.resource(leaf).unwrap().rate();
            source == Source::Granted && (rate - w).abs() < 0.01
        })
    };
    while started.elapsed() < std::time::Duration::from_secs(12) && !converged(&clients) {
        for (leaf, c) in leaves.iter().zip(&clients) {
            let _ = c.acquire(leaf, 1);
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let rates: Vec<(f64, Source)> = leaves
        .iter()
        .zip(&clients)
        .map(|(leaf, c)| c.resource(leaf).unwrap().rate())
        .collect();
    assert!(
        converged(&clients),
        "{rates:?} after {:?}",
        started.elapsed()
    );
    // The server's own account: the org's grants sum to its capacity, no more.
    let (_, body) = http(server.1, "GET", "/quota/v1/allocations", "");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let total: f64 = v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["granted"].as_f64().unwrap())
        .sum();
    assert!((total - 30.0).abs() < 0.01, "{body}");
    // A group, and a name outside the tree, are refused by name.
    let (code, body) = http(
        server.1,
        "POST",
        "/quota/v1/refresh",
        r#"{"client": "x", "resources": [{"resource": "org/team-a", "wants": 1}, {"resource": "org/team-a/user-1/more", "wants": 1}]}"#,
    );
    assert_eq!(code, 200);
    assert!(
        body.contains(r#"is a group of nested resources: lease one under it (org/team-a/…)"#),
        "{body}"
    );
    assert!(
        body.contains(r#"unknown resource \"org/team-a/user-1/more\""#),
        "{body}"
    );
    for c in clients {
        c.shutdown().await;
    }
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_proxy_with_a_cluster_rule_admits_its_leased_share() {
    let dir = std::env::temp_dir().join(format!("weir-quota-proxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let quota = dir.join("quota.yaml");
    std::fs::write(
        &quota,
        "resources:\n  - {name: search, capacity: 20/s, lease: 2s, refresh: 1s}\n",
    )
    .unwrap();
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "resources:\n  - name: api\n    flow:\n      - {id: api-global, cluster: {resource: search, safe: 5}}\nhttp:\n  routes:\n    - {resource: api, prefix: /api}\n",
    )
    .unwrap();
    // Without a quota server the proxy refuses to start.
    let up = common::http1_upstream(|_, _| "ok".to_string());
    let (code, _, err) = weir(
        &[
            "proxy",
            "--rules",
            rules.to_str().unwrap(),
            "--upstream",
            &format!("http://127.0.0.1:{up}"),
        ],
        "",
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("cluster flow rules (search) need --quota-server"),
        "{err}"
    );
    let server = serve_quota(&quota);
    let quota_server = format!("http://127.0.0.1:{}", server.1);
    let (mut proxy, port) = common::start_proxy(&rules, up, &["--quota-server", &quota_server]);
    // ~100 requests/s for 5 s; the last 2 s (the server done learning) are counted.
    let started = std::time::Instant::now();
    let (mut ok, mut limited) = (0, 0);
    while started.elapsed() < std::time::Duration::from_secs(5) {
        let (code, _) = http(port, "GET", "/api/x", "");
        if started.elapsed() >= std::time::Duration::from_secs(3) {
            match code {
                200 => ok += 1,
                429 => limited += 1,
                other => panic!("status {other}"),
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(limited > 0, "demand above the share was limited");
    assert!(
        (30..=46).contains(&ok),
        "{ok} admitted in 2 s at a 20/s cluster capacity ({limited} limited)"
    );
    let (_, alloc) = http(server.1, "GET", "/quota/v1/allocations", "");
    assert!(alloc.contains("weir-proxy-"), "{alloc}");
    // A reload adds a cluster rule on a new resource: the proxy leases it too.
    std::fs::write(
        &quota,
        "resources:\n  - {name: search, capacity: 20/s, lease: 2s, refresh: 1s}\n  - {name: checkout, capacity: 7/s, lease: 2s, refresh: 1s}\n",
    )
    .unwrap();
    std::fs::write(
        &rules,
        "resources:\n  - name: api\n    flow:\n      - {id: api-global, cluster: {resource: search, safe: 5}}\n  - name: pay\n    flow:\n      - {id: pay-global, cluster: {resource: checkout, safe: 1}}\nhttp:\n  routes:\n    - {resource: api, prefix: /api}\n    - {resource: pay, prefix: /pay}\n",
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let _ = http(port, "GET", "/pay/x", "");
        let (_, alloc) = http(server.1, "GET", "/quota/v1/allocations", "");
        if alloc.contains("\"resource\":\"checkout\"") && alloc.contains("weir-proxy-") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "checkout not leased: {alloc}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = proxy.kill();
    let _ = proxy.wait();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn serve_quota_says_what_it_serves_at_start() {
    let dir = common::tempdir("quota-banner");
    let file = dir.join("quota.yaml");
    std::fs::write(
        &file,
        "resources:\n  - {name: 'user-*', capacity: 10}\nrlqs:\n  buckets:\n    - {match: {name: u, user: '*'}, resource: 'user-{user}'}\n",
    )
    .unwrap();
    let (http, grpc) = (common::free_port(), common::free_port());
    let (h, g) = (format!("127.0.0.1:{http}"), format!("127.0.0.1:{grpc}"));
    let quota = file.to_str().unwrap();
    let args = [
        "serve",
        "--quota",
        quota,
        "--http-addr",
        &h,
        "--grpc-addr",
        &g,
    ];
    let (mut child, lines) = common::start_lines(&args, 2);
    let (first, second) = (&lines[0], &lines[1]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        first.contains("rate-limit config: the bundled example"),
        "{first}"
    );
    assert!(
        second.contains(&format!(
            "lease API on http://127.0.0.1:{http}/quota/v1/refresh"
        )) && second.contains(&format!("Envoy RLQS on 127.0.0.1:{grpc}")),
        "{second}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn check_config_tells_a_quota_file_and_prints_its_settings_in_force() {
    let dir = common::tempdir("check-quota");
    // The README's example, as written there.
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
    )
    .unwrap();
    let line = readme
        .lines()
        .find(|l| l.contains("> quota.yaml"))
        .expect("the README's quota file");
    let text = line.split('\'').nth(1).unwrap().replace("\\n", "\n");
    let file = dir.join("quota.yaml");
    std::fs::write(&file, &text).unwrap();
    let (code, out, err) = weir(&["check-config", file.to_str().unwrap()], "");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("resource search: 1000/s, fair_share, lease 30s, refresh 5s"),
        "{out}"
    );
    // Errors of a quota file, every one, located; --kind says what a file is.
    std::fs::write(
        &file,
        "resources:\n  - {name: a, capacity: 5/d}\n  - {name: b, capacity: -1}\n",
    )
    .unwrap();
    let (code, _, err) = weir(&["check-config", file.to_str().unwrap()], "");
    assert_eq!(code, 2);
    assert!(
        err.contains("quota.yaml:2:") && err.contains("quota.yaml:3:"),
        "{err}"
    );
    let (code, _, err) = weir(
        &["check-config", "--kind", "lyft", file.to_str().unwrap()],
        "",
    );
    assert!(
        code == 2 && err.contains("unknown field `resources`"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn lease_api_ids_and_names_are_bounded_and_clean() {
    let (s, dir) = serve_quota_text(
        "quota-bounds",
        "resources:\n  - {name: search, capacity: 10}\n  - {name: 'tenant-*', capacity: 5}\n",
    );
    // A 500 KB name: refused with a bounded answer, nothing kept.
    let long = format!("tenant-{}", "x".repeat(500_000));
    let body = format!(r#"{{"client":"c","resources":[{{"resource":"{long}","wants":1}}]}}"#);
    let (code, answer) = http(s.1, "POST", "/quota/v1/refresh", &body);
    assert_eq!(code, 200);
    assert!(
        answer.len() < 400 && answer.contains("longer than 256 bytes"),
        "{}",
        &answer[..answer.len().min(400)]
    );
    // A NUL in a client id or a resource name never reaches a metric label.
    let (code, answer) = http(
        s.1,
        "POST",
        "/quota/v1/refresh",
        r#"{"client":"a\u0000b","resources":[{"resource":"search","wants":1}]}"#,
    );
    assert!(
        code == 400 && answer.contains("control characters"),
        "{answer}"
    );
    let (_, answer) = http(
        s.1,
        "POST",
        "/quota/v1/refresh",
        r#"{"client":"c","resources":[{"resource":"tenant-\u0000","wants":1}]}"#,
    );
    assert!(answer.contains("control character"), "{answer}");
    // An empty client id cannot release anything.
    let (code, _) = http(
        s.1,
        "POST",
        "/quota/v1/release",
        r#"{"client":"","resources":["search"]}"#,
    );
    assert_eq!(code, 400);
    let (_, metrics) = http(s.1, "GET", "/metrics", "");
    assert!(!metrics.contains('\0') && !metrics.contains("xxxxxxxx"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn allocations_are_behind_the_admin_token_leases_are_not() {
    let dir = common::tempdir("quota-token");
    let file = dir.join("quota.yaml");
    std::fs::write(&file, "resources:\n  - {name: search, capacity: 10}\n").unwrap();
    let (http_port, grpc) = (common::free_port(), common::free_port());
    let (child, line) = common::start(&[
        "serve",
        "--quota",
        file.to_str().unwrap(),
        "--http-addr",
        &format!("127.0.0.1:{http_port}"),
        "--grpc-addr",
        &format!("127.0.0.1:{grpc}"),
        "--admin-token",
        "t0k",
    ]);
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _child = Kill(child);
    assert!(line.contains("HTTP on"), "{line}");
    let alloc = |auth: &str| {
        common::request(http_port, "GET", "/quota/v1/allocations", auth, "")
            .unwrap()
            .0
    };
    assert_eq!(alloc(""), 401);
    assert_eq!(alloc("Authorization: Bearer t0k\r\n"), 200);
    let (code, body) = http(
        http_port,
        "POST",
        "/quota/v1/refresh",
        r#"{"client":"c","resources":[{"resource":"search","wants":1,"safe":1}]}"#,
    );
    assert_eq!(code, 200, "{body}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A refresh of one resource over HTTP: (status, answer).
fn refresh_one(port: u16, auth: &str, client: &str, ask: &str) -> (u16, String) {
    let body = format!(r#"{{"client":"{client}","resources":[{{"resource":"search",{ask}}}]}}"#);
    let headers = format!("{auth}Content-Type: application/json\r\n");
    common::request(port, "POST", "/quota/v1/refresh", &headers, &body).unwrap()
}

fn total_granted(port: u16) -> f64 {
    let (_, body) = http(port, "GET", "/quota/v1/allocations", "");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["resources"][0]["granted"].as_f64().unwrap_or(0.0)
}

#[test]
fn spoofed_releases_refreshes_weights_and_priorities_over_grant_nobody() {
    let (s, dir) = serve_quota_text(
        "quota-spoof",
        "resources:\n  - {name: search, capacity: 100, lease: 3s, refresh: 1s}\n",
    );
    // a holds all 100 (learning: up to what it uses alone, 100).
    let (_, body) = refresh_one(s.1, "", "a", r#""wants":100,"safe":100"#);
    assert_eq!(granted(&body, 0), 100.0, "{body}");
    // Someone else releases a's lease under a's id, without its lease id: the 100 keep
    // counting until a's lease would have ended, so c gets nothing (it got 100 before).
    let release = r#"{"client":"a","resources":["search"]}"#;
    assert_eq!(http(s.1, "POST", "/quota/v1/release", release).0, 204);
    let (_, body) = refresh_one(s.1, "", "c", r#""wants":100,"safe":100"#);
    assert_eq!(granted(&body, 0), 0.0, "{body}");
    // Or refreshes as a, claiming a huge weight and the top band: nothing either.
    let spoof = r#""wants":100,"safe":100,"weight":1e300,"priority":"CRITICAL_PLUS""#;
    let (_, body) = refresh_one(s.1, "", "a", spoof);
    assert_eq!(granted(&body, 0), 0.0, "{body}");
    assert!(total_granted(s.1) <= 100.0);
    // Once every lease has lapsed: x claims weight 1e300 and CRITICAL_PLUS, y sends nothing;
    // without a clients section both count as weight 1, CRITICAL: 50 each.
    std::thread::sleep(std::time::Duration::from_millis(3_300));
    let (_, x) = refresh_one(s.1, "", "x", spoof);
    assert_eq!(granted(&x, 0), 100.0, "{x}");
    let (_, y) = refresh_one(s.1, "", "y", r#""wants":100"#);
    let held = |body: &str| format!(r#""leaseId":"{}","#, lease_id(body, 0));
    let (_, x) = refresh_one(s.1, "", "x", &format!("{}{spoof}", held(&x)));
    let (_, y) = refresh_one(s.1, "", "y", &format!(r#"{}"wants":100"#, held(&y)));
    assert_eq!((granted(&x, 0), granted(&y, 0)), (50.0, 50.0), "{x} {y}");
    // The holder's own release frees its grant at once.
    let release = format!(
        r#"{{"client":"x","resources":["search"],"leaseIds":["{}"]}}"#,
        lease_id(&x, 0)
    );
    assert_eq!(http(s.1, "POST", "/quota/v1/release", &release).0, 204);
    assert_eq!(total_granted(s.1), 50.0);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn lease_api_callers_authenticate_with_tokens_the_quota_file_names() {
    use weir_quota::proto::*;
    // The SHA-256 of "s3cret" (`printf s3cret | sha256sum`).
    let digest = "1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0";
    let (s, dir) = serve_quota_text(
        "quota-auth",
        &format!(
            "resources:\n  - {{name: search, capacity: 100, lease: 1s, refresh: 1s}}\nclients:\n  - {{id: 'checkout-*', token_sha256: {digest}}}\n  - {{id: batch, priority: SHEDDABLE}}\n"
        ),
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let ask = r#""wants":100"#;
    let token = "Authorization: bearer s3cret\r\n";
    let (code, body) = refresh_one(s.1, "", "checkout-1", ask);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("needs a bearer token"), "{body}");
    let (code, _) = refresh_one(s.1, "Authorization: Bearer guess\r\n", "checkout-1", ask);
    assert_eq!(code, 401);
    let (code, body) = refresh_one(s.1, "", "stranger", ask);
    assert!(code == 403 && body.contains("not allowed"), "{body}");
    // batch needs no token; it asks for the top band, the file puts it in SHEDDABLE.
    let (code, b) = refresh_one(
        s.1,
        "",
        "batch",
        r#""wants":100,"priority":"CRITICAL_PLUS""#,
    );
    assert_eq!((code, granted(&b, 0)), (200, 100.0), "{b}");
    let (code, c) = refresh_one(s.1, token, "checkout-1", ask);
    assert_eq!(code, 200, "{c}");
    let b_id = lease_id(&b, 0);
    let (_, b) = refresh_one(
        s.1,
        "",
        "batch",
        &format!(r#""leaseId":"{b_id}","wants":100,"priority":"CRITICAL_PLUS""#),
    );
    assert_eq!(granted(&b, 0), 0.0, "CRITICAL checkout first: {b}");
    let (_, c) = refresh_one(
        s.1,
        token,
        "checkout-1",
        &format!(r#""leaseId":"{}","wants":100"#, lease_id(&c, 0)),
    );
    assert_eq!(granted(&c, 0), 100.0, "{c}");
    // A release needs the token too.
    let release = r#"{"client":"checkout-1","resources":["search"]}"#;
    let headers = "Content-Type: application/json\r\n";
    let (code, _) = common::request(s.1, "POST", "/quota/v1/release", headers, release).unwrap();
    assert_eq!(code, 401);
    // Over gRPC: UNAUTHENTICATED without the token, PERMISSION_DENIED for a stranger.
    let request = |client: &str| RefreshRequest {
        client: client.into(),
        resources: vec![ResourceAsk {
            resource: "search".into(),
            wants: 1.0,
            ..ResourceAsk::default()
        }],
    };
    let e =
        common::quota_grpc_as::<_, RefreshResponse>(s.2, REFRESH_PATH, request("checkout-2"), None)
            .await
            .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = common::quota_grpc_as::<_, RefreshResponse>(
        s.2,
        REFRESH_PATH,
        request("x"),
        Some("s3cret"),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let ok = common::quota_grpc_as::<_, RefreshResponse>(
        s.2,
        REFRESH_PATH,
        request("checkout-2"),
        Some("s3cret"),
    )
    .await
    .unwrap()
    .into_inner();
    assert!(
        ok.leases[0].error.is_empty() && ok.leases[0].lease_id != 0,
        "{ok:?}"
    );
    // The lease client presents its token (weir proxy --quota-token-file).
    let url = format!("http://127.0.0.1:{}", s.1);
    let start = |id: &str, token: Option<&str>| {
        weir_quota::net::LeaseClient::builder(&url, id)
            .token(token.map(str::to_string))
            .resource("search", 1.0)
            .start()
            .unwrap()
    };
    let (with, without) = (
        start("checkout-3", Some("s3cret")),
        start("checkout-4", None),
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let counts = |c: &weir_quota::net::LeaseClient| {
        let r = c.resource("search").unwrap();
        let n = r.counters();
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        (get(&n.leases), get(&n.failures))
    };
    let (leases, failures) = counts(&with);
    assert!(leases > 0 && failures == 0, "{leases} {failures}");
    let (leases, failures) = counts(&without);
    assert!(leases == 0 && failures > 0, "{leases} {failures}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A tree's child trusted with its own values but no token: `check-config` warns (any caller
/// claiming a matching id could take the whole capacity with one heavy part).
#[test]
fn check_config_warns_of_own_values_without_a_token() {
    let dir = common::tempdir("own-values");
    let file = dir.join("quota.yaml");
    std::fs::write(
        &file,
        "resources:\n  - {name: api, capacity: 100/s}\nclients:\n  - {id: 'region-*', own_values: true}\n  - {id: '*'}\n",
    )
    .unwrap();
    let (code, out, err) = weir(&["check-config", file.to_str().unwrap()], "");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("client region-*"), "{out}");
    assert!(
        err.contains("warning")
            && err.contains("\"region-*\" has own_values: true and no token_sha256"),
        "{err}"
    );
}

/// A lease server told to lease from itself is refused at start, naming both flags.
#[test]
fn a_lease_server_is_not_its_own_parent() {
    let dir = common::tempdir("self-parent");
    let file = dir.join("quota.yaml");
    std::fs::write(&file, "resources:\n  - {name: api, capacity: 100/s}\n").unwrap();
    let port = common::free_port();
    let (code, _, err) = weir(
        &[
            "serve",
            "--quota",
            file.to_str().unwrap(),
            "--http-addr",
            &format!("0.0.0.0:{port}"),
            "--grpc-addr",
            &format!("127.0.0.1:{}", common::free_port()),
            "--parent",
            &format!(
                "http://127.0.0.1:{}, http://localhost:{port}",
                common::free_port()
            ),
        ],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is this server's own --http-addr"), "{err}");
}
