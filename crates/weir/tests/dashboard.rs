//! The live dashboard of `weir proxy` and `weir serve`, read from the page as Debian's headless
//! Chromium renders it: blocked resources with their counts, an open breaker, the most
//! blocked values, a rejected reload, updates from one load to the next; the JSON API and its
//! bearer token. With `WEIR_SCREENSHOTS=DIR` the tests also save the pages as PNG there (how
//! docs/dashboard-*.png are made).

use crate::{common, support};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const RULES: &str = "resources:
  - name: login
    flow:
      - {id: login-rate, qps: 2}
  - name: search
    hot_params:
      - {id: per-user, param: 0, threshold: 3, window: 1m}
  - name: payments
    breaker: {id: payments-breaker, window_calls: 4, min_calls: 4, error_ratio: 0.5, open_for: 1m}
system: {max_in_flight: 500}
http:
  routes:
    - {resource: login, prefix: /login}
    - {resource: search, prefix: /search, params: [{header: x-user}]}
    - {resource: payments, prefix: /pay}
";

/// `weir proxy` on `rules` in front of an upstream that fails every /pay request; returns the
/// process, its port and its admin port.
fn proxy(rules: &Path, extra: &[&str]) -> (Process, u16, u16) {
    let upstream = common::http1_upstream_status(|line, _| {
        if line.contains(" /pay") {
            (500, "down".into())
        } else {
            (200, "ok".into())
        }
    });
    let (port, admin) = (common::free_port(), common::free_port());
    let (child, line) = common::start(
        &[
            &[
                "proxy",
                "--rules",
                rules.to_str().unwrap(),
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin",
                &format!("127.0.0.1:{admin}"),
                "--upstream",
                &format!("http://127.0.0.1:{upstream}"),
                "--reload-interval",
                "100ms",
            ][..],
            extra,
        ]
        .concat(),
    );
    assert!(line.contains("dashboard: http://"), "{line}");
    (Process(child), port, admin)
}

fn get(port: u16, path: &str, header: &str) -> u16 {
    common::request(port, "GET", path, header, "")
        .map(|(s, _)| s)
        .unwrap_or(0)
}

/// Waits until the dashboard has recorded a second that ends after now (the sampler runs
/// just after each whole second).
fn wait_for_a_sample() {
    std::thread::sleep(Duration::from_millis(2_200));
}

/// The part of `dom` from the element with `attr` to the next element with the same
/// attribute name.
fn part<'a>(dom: &'a str, attr: &str) -> &'a str {
    let start = dom
        .find(attr)
        .unwrap_or_else(|| panic!("{attr} not on the page:\n{dom}"));
    let name = &attr[..attr.find('=').unwrap() + 1];
    let rest = &dom[start + attr.len()..];
    let end = rest.find(name).map_or(rest.len(), |i| i);
    &dom[start..start + attr.len() + end]
}

/// The number in the element with `data-field="field"` inside `html`.
fn field(html: &str, field: &str) -> u64 {
    let tag = format!("data-field=\"{field}\">");
    let at = html
        .find(&tag)
        .unwrap_or_else(|| panic!("{field} not in {html}"));
    let rest = &html[at + tag.len()..];
    rest[..rest.find('<').unwrap()]
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{field}: not a number in {rest:.40}"))
}

fn screenshot(name: &str) -> Option<PathBuf> {
    std::env::var_os("WEIR_SCREENSHOTS").map(|d| PathBuf::from(d).join(name))
}

#[test]
fn the_proxy_dashboard_shows_blocks_breakers_heavy_hitters_and_reloads_as_they_happen() {
    let dir = common::tempdir("dashboard-proxy");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let (_proxy, port, admin) = proxy(&rules, &[]);
    // login: 2/s, so most of 8 are blocked; mallory passes 3 searches of 6, ann 3 of 4;
    // four failed payments open the breaker and the fifth is refused.
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(get(port, "/login", ""));
    }
    for _ in 0..6 {
        get(port, "/search", "x-user: mallory\r\n");
    }
    for _ in 0..4 {
        get(port, "/search", "x-user: ann\r\n");
    }
    let pay: Vec<u16> = (0..5).map(|_| get(port, "/pay", "")).collect();
    assert_eq!(pay, [500, 500, 500, 500, 503]);
    let login_blocked = statuses.iter().filter(|s| **s == 429).count() as u64;
    assert!(login_blocked >= 5, "{statuses:?}");
    wait_for_a_sample();

    let url = format!("http://127.0.0.1:{admin}/");
    let dom = common::render_page(&url, 1280, 800, None, &[]);
    let login = part(&dom, "data-resource=\"login\"");
    assert!(login.contains("class=\"card blocking\""), "{login}");
    let payments = part(&dom, "data-resource=\"payments\"");
    assert!(payments.contains("data-kind=\"breaker\""), "{payments}");
    assert_eq!(field(login, "blocked-total"), login_blocked);
    assert_eq!(field(login, "passed-total"), 8 - login_blocked);
    assert!(login.contains("data-kind=\"flow\""), "{login}");
    let search = part(&dom, "data-resource=\"search\"");
    assert_eq!(field(search, "blocked-total"), 4);
    assert!(search.contains("data-kind=\"hot_param\""), "{search}");
    let breaker = part(&dom, "data-breaker=\"payments-breaker\"");
    assert!(
        breaker.contains("class=\"state open\" data-field=\"state\">open<"),
        "{breaker}"
    );
    assert!(breaker.contains("closed → open"), "{breaker}");
    let heavy = part(&dom, "data-heavy=\"per-user\"");
    let (m, a) = (heavy.find("mallory").unwrap(), heavy.find("ann").unwrap());
    assert!(m < a, "mallory (3 blocked) above ann (1): {heavy}");
    assert!(
        dom.contains("login-rate") && dom.contains("qps 2"),
        "the rules table"
    );
    // Charts stretch their shapes with the page, never their text: no text inside a stretched
    // SVG; the axis labels are drawn beside it.
    let mut charts = 0;
    for svg in dom.split("<svg").skip(1) {
        let svg = svg.split("</svg>").next().unwrap_or("");
        if svg.contains("preserveAspectRatio=\"none\"") {
            charts += 1;
            assert!(!svg.contains("<text"), "stretched text in {svg}");
        }
    }
    assert!(
        charts > 0 && dom.contains("class=\"now\">now<"),
        "charts drawn"
    );
    if let Some(p) = screenshot("dashboard-proxy.png") {
        common::render_page(&url, 1280, 800, Some(&p), &[]);
        let phone = p.with_file_name("dashboard-phone.png");
        common::render_page(&url, 400, 860, Some(&phone), &[]);
        let dark = p.with_file_name("dashboard-dark.png");
        common::render_page(&url, 1280, 800, Some(&dark), &["--force-dark-mode"]);
    }

    // More traffic shows on the next load.
    for _ in 0..6 {
        get(port, "/login", "");
    }
    wait_for_a_sample();
    let dom = common::render_page(&url, 1280, 800, None, &[]);
    let login = part(&dom, "data-resource=\"login\"");
    assert!(
        field(login, "blocked-total") >= login_blocked + 4,
        "{login}"
    );

    // A rejected reload is shown with where the error is; the old rules still serve.
    std::fs::write(&rules, RULES.replace("qps: 2", "qps: -2")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let dom = loop {
        wait_for_a_sample();
        let dom = common::render_page(&url, 1280, 800, None, &[]);
        if dom.contains("data-field=\"reload-error\"") || Instant::now() > deadline {
            break dom;
        }
    };
    let error = part(&dom, "data-field=\"reload-error\"");
    assert!(error.contains("rules.yaml:4:"), "{error}");
    assert!(
        error.contains("previous configuration still serves"),
        "{error}"
    );
    let burst: Vec<u16> = (0..4).map(|_| get(port, "/login", "")).collect();
    assert!(
        burst.contains(&429),
        "the old limit (2/s) still holds: {burst:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn with_a_token_the_data_need_the_bearer_and_health_checks_do_not() {
    let dir = common::tempdir("dashboard-token");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let (_proxy, _, admin) = proxy(&rules, &["--admin-token", "s3cret"]);
    let api = "/api/v1/dashboard";
    assert_eq!(get(admin, api, ""), 401);
    assert_eq!(get(admin, api, "Authorization: Bearer wrong\r\n"), 401);
    assert_eq!(get(admin, api, "Authorization: Bearer s3cret\r\n"), 200);
    // The scheme is case-insensitive (RFC 9110); the token is not.
    assert_eq!(get(admin, api, "authorization: bearer s3cret\r\n"), 200);
    assert_eq!(get(admin, api, "authorization: BEARER s3cret\r\n"), 200);
    assert_eq!(get(admin, api, "authorization: bearer S3CRET\r\n"), 401);
    assert_eq!(get(admin, api, "authorization: Basic s3cret\r\n"), 401);
    assert_eq!(get(admin, api, "authorization: bearer \r\n"), 401);
    assert_eq!(get(admin, "/metrics", ""), 401);
    assert_eq!(
        get(admin, "/metrics", "Authorization: Bearer s3cret\r\n"),
        200
    );
    assert_eq!(get(admin, "/healthz", ""), 200);
    assert_eq!(get(admin, "/", ""), 200, "the page holds no data");
    // The page asks for the token, and shows the data once given it in the address.
    let url = format!("http://127.0.0.1:{admin}/");
    let dom = common::render_page(&url, 1280, 800, None, &[]);
    assert!(dom.contains("token needed"), "{dom}");
    let dom = common::render_page(&format!("{url}#token=s3cret"), 1280, 800, None, &[]);
    assert!(dom.contains("data-resource=\"login\""), "{dom}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_api_sends_only_the_seconds_asked_for() {
    let dir = common::tempdir("dashboard-api");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let (_proxy, port, admin) = proxy(&rules, &[]);
    get(port, "/login", "");
    wait_for_a_sample();
    let (status, body) = common::request(admin, "GET", "/api/v1/dashboard", "", "").unwrap();
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["version"], 1);
    let now = v["now"].as_u64().unwrap();
    let login = v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "login")
        .unwrap();
    let passed: u64 = login["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["passed"].as_u64().unwrap())
        .sum();
    assert_eq!(passed, 1);
    let (_, body) = common::request(
        admin,
        "GET",
        &format!("/api/v1/dashboard?since={now}"),
        "",
        "",
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    for r in v["resources"].as_array().unwrap() {
        for p in r["points"].as_array().unwrap() {
            assert!(p["t"].as_u64().unwrap() > now, "{p}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `weir serve` with `args` on free ports, once it answers: the process and its HTTP port.
fn serve(args: &[&str]) -> (Process, u16) {
    // Minute limits: the test counts within one window (they start on the minute).
    common::inside_minute(std::time::Duration::from_secs(15));
    let (http, grpc) = (common::free_port(), common::free_port());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weir"));
    cmd.arg("serve")
        .args(args)
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let process = Process(cmd.spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(http, "/healthz", "") != 200 {
        assert!(Instant::now() < deadline, "weir serve did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (process, http)
}

#[test]
fn the_serve_dashboard_shows_redis_falling_back_and_the_quota_table() {
    let dir = common::tempdir("dashboard-store");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
    )
    .unwrap();
    let quota = dir.join("quota.yaml");
    std::fs::write(&quota, "resources:\n  - {name: search, capacity: 1000/s}\n").unwrap();
    let mut redis = support::Redis::start();
    let url = redis.url();
    let (_serve, http) = serve(&[
        "--config",
        config.to_str().unwrap(),
        "--store",
        &url,
        "--quota",
        quota.to_str().unwrap(),
    ]);
    let body = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#;
    assert_eq!(
        common::request(http, "POST", "/json", "", body).unwrap().0,
        200
    );
    let lease = r#"{"client":"host-7","resources":[{"resource":"search","wants":120}]}"#;
    assert_eq!(
        common::request(http, "POST", "/quota/v1/refresh", "", lease)
            .unwrap()
            .0,
        200
    );
    wait_for_a_sample();
    let page = format!("http://127.0.0.1:{http}/");
    let dom = common::render_page(&page, 1280, 800, None, &[]);
    let store = part(&dom, "data-store=\"store\"");
    assert!(store.contains(">redis<"), "{store}");
    // Redis goes away: decisions continue on the local fallback, and the page says so.
    redis.kill();
    assert_eq!(
        common::request(http, "POST", "/json", "", body).unwrap().0,
        200
    );
    wait_for_a_sample();
    let dom = common::render_page(&page, 1280, 800, None, &[]);
    let store = part(&dom, "data-store=\"store\"");
    assert!(store.contains(">fallback<"), "{store}");
    assert!(dom.contains("redis → fallback"), "the switch is listed");
    let quota = &dom[dom.find("id=\"quota\"").unwrap()..];
    let row = &quota[quota.find("<td>search</td>").expect("the quota row")..];
    // resource, capacity, wants, granted, clients, learning: host-7 wants 120 of 1000; a
    // server that just started learns demands before it grants more than safe capacities.
    let cells: Vec<&str> = row[..row.find("</tr>").unwrap()]
        .split("</td>")
        .map(|c| &c[c.rfind('>').map_or(0, |i| i + 1)..])
        .collect();
    assert_eq!(cells[..3], ["search", "1.0 k", "120"], "{row:.300}");
    assert_eq!(cells[4], "1", "one client");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_serve_dashboard_shows_rules_over_the_limit_and_who_is_limited() {
    let dir = common::tempdir("dashboard-serve");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 100}
",
    )
    .unwrap();
    let (_serve, http) = serve(&["--config", config.to_str().unwrap()]);
    let decide = |key: &str, value: &str| {
        let body = format!(
            r#"{{"domain":"shop","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
        );
        common::request(http, "POST", "/json", "", &body).unwrap().0
    };
    let mallory: Vec<u16> = (0..7).map(|_| decide("user", "mallory")).collect();
    assert_eq!(mallory, [200, 200, 200, 429, 429, 429, 429]);
    let ann: Vec<u16> = (0..4).map(|_| decide("user", "ann")).collect();
    assert_eq!(ann, [200, 200, 200, 429]);
    for i in 0..5 {
        assert_eq!(decide("remote_address", &format!("10.0.0.{i}")), 200);
    }
    wait_for_a_sample();
    let url = format!("http://127.0.0.1:{http}/");
    let dom = common::render_page(&url, 1280, 800, None, &[]);
    let user = part(&dom, "data-resource=\"shop.user\"");
    assert_eq!(field(user, "blocked-total"), 5);
    assert_eq!(field(user, "passed-total"), 6);
    assert!(user.contains("class=\"card blocking\""), "{user}");
    let addr = part(&dom, "data-resource=\"shop.remote_address\"");
    assert_eq!(
        (field(addr, "passed-total"), field(addr, "blocked-total")),
        (5, 0)
    );
    let heavy = part(&dom, "data-heavy=\"shop.user\"");
    let (m, a) = (
        heavy.find("user=mallory").unwrap(),
        heavy.find("user=ann").unwrap(),
    );
    assert!(m < a, "mallory (4 over) above ann (1): {heavy}");
    assert!(dom.contains("data-store=\"store\""), "store health shown");
    assert!(dom.contains("3 per 1m"), "the rules table");
    if let Some(p) = screenshot("dashboard-serve.png") {
        common::render_page(&url, 1280, 800, Some(&p), &[]);
    }
    let _ = std::fs::remove_dir_all(dir);
}
