//! `weir serve` as a drop-in for envoyproxy/ratelimit: the behaviours its own tests expect
//! (`test/config/config_test.go`, `test/integration/integration_test.go`, the service tests
//! and `examples/ratelimit/config`), written as requests against `weir serve`'s `/json` on the
//! fixtures of `tests/lyft/`, and its configuration checks through `weir check-config`.
//! docs/serve.md's compatibility table lists each behaviour with the test that checks it.
//!
//! Fixed windows are aligned to the wall clock as Lyft's are; the cases use hour and day
//! limits, and the few minute or second ones start well inside their window.

use crate::{common, support};

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lyft")
}

struct Serve {
    child: Child,
    http: u16,
    grpc: u16,
}

impl Serve {
    fn start(args: &[&str]) -> Self {
        let (http, grpc) = (support::free_port(), support::free_port());
        let (h, g) = (format!("127.0.0.1:{http}"), format!("127.0.0.1:{grpc}"));
        let mut all = vec!["serve", "--http-addr", &h, "--grpc-addr", &g];
        all.extend_from_slice(args);
        let (child, line) = common::start(&all);
        assert!(line.contains("gRPC RLS v3 on"), "{line}");
        Self { child, http, grpc }
    }

    fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let json = "Content-Type: application/json\r\n";
        common::request(self.http, method, path, json, body).expect("an answer")
    }

    fn json(&self, body: &Value) -> Value {
        let (code, text) = self.request("POST", "/json", &body.to_string());
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{code}: {text}"));
        let over = v["overallCode"] == "OVER_LIMIT";
        assert_eq!(code, if over { 429 } else { 200 }, "{v}");
        v
    }

    fn metrics(&self) -> String {
        self.request("GET", "/metrics", "").1
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A request of one or more descriptors (each a list of entries), `hits` per descriptor.
fn req(domain: &str, descriptors: &[&[(&str, &str)]], hits: u64) -> Value {
    json!({
        "domain": domain,
        "hitsAddend": hits,
        "descriptors": descriptors.iter().map(|d| json!({
            "entries": d.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()
        })).collect::<Vec<_>>(),
    })
}

fn one(s: &Serve, domain: &str, entries: &[(&str, &str)]) -> Value {
    s.json(&req(domain, &[entries], 1))
}

/// (code, requestsPerUnit, unit, limitRemaining) of status `i`.
fn status(v: &Value, i: usize) -> (String, u64, String, u64) {
    let s = &v["statuses"][i];
    (
        s["code"].as_str().unwrap_or("").to_string(),
        s["currentLimit"]["requestsPerUnit"].as_u64().unwrap_or(0),
        s["currentLimit"]["unit"].as_str().unwrap_or("").to_string(),
        s["limitRemaining"].as_u64().unwrap_or(0),
    )
}

fn st(code: &str, rpu: u64, unit: &str, remaining: u64) -> (String, u64, String, u64) {
    (code.to_string(), rpu, unit.to_string(), remaining)
}

/// `durationUntilReset` of status `i` in seconds: whole seconds, as Lyft answers.
fn reset(v: &Value, i: usize) -> u64 {
    let d = v["statuses"][i]["durationUntilReset"]
        .as_str()
        .unwrap_or_else(|| panic!("no durationUntilReset in {v}"));
    let secs = d.strip_suffix('s').expect("seconds");
    assert!(!secs.contains('.'), "whole seconds, got {d}");
    secs.parse().unwrap()
}

fn unix_now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

/// Waits until at least `margin` is left in the current wall-clock window of `unit` seconds.
fn inside_window(unit: u64, margin: Duration) {
    let deadline = Instant::now() + Duration::from_secs(unit + 1);
    loop {
        let now = unix_now();
        let left = Duration::from_secs(unit)
            - Duration::from_nanos((now.as_nanos() % (u128::from(unit) * 1_000_000_000)) as u64);
        if left >= margin || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(left + Duration::from_millis(20));
    }
}

fn loads() -> Serve {
    let dir = fixtures().join("loads");
    Serve::start(&["--config", dir.to_str().unwrap(), "--response-metadata"])
}

#[test]
fn matching_limits_unlimited_and_no_limit_answer_as_lyft() {
    let s = loads();
    // An unknown domain or descriptor: OK, no limit, nothing remaining reported.
    let v = one(&s, "nowhere", &[("a", "b")]);
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0], json!({"code": "OK"}));
    let v = one(&s, "basic", &[("nothing", "here")]);
    assert_eq!(v["statuses"][0], json!({"code": "OK"}));
    // Key-only default at the second level, and its value-specific override.
    let v = one(&s, "basic", &[("tier", "gold"), ("user", "ann")]);
    assert_eq!(status(&v, 0), st("OK", 5, "HOUR", 4));
    let v = one(&s, "basic", &[("tier", "gold"), ("user", "vip")]);
    assert_eq!(status(&v, 0), st("OK", 10, "HOUR", 9));
    // A shorter request than the configured path has no limit.
    let v = one(&s, "basic", &[("tier", "gold")]);
    assert_eq!(v["statuses"][0], json!({"code": "OK"}));
    // First level: key default, value override, a value without a limit (allow-listed).
    assert_eq!(
        status(&one(&s, "basic", &[("client", "c1")]), 0),
        st("OK", 20, "HOUR", 19)
    );
    assert_eq!(
        status(&one(&s, "basic", &[("client", "partner")]), 0),
        st("OK", 30, "HOUR", 29)
    );
    assert_eq!(
        one(&s, "basic", &[("client", "trusted")])["statuses"][0],
        json!({"code": "OK"})
    );
    // A named limit carries its name; the second hit of 1 per day is over, 0 remaining.
    let v = one(&s, "basic", &[("team", "t1")]);
    assert_eq!(v["statuses"][0]["currentLimit"]["name"], "team_daily");
    let v = one(&s, "basic", &[("team", "t1")]);
    assert_eq!(status(&v, 0), st("OVER_LIMIT", 1, "DAY", 0));
    let r = reset(&v, 0);
    assert!((1..=86_400).contains(&r), "{v}");
    // Unlimited: OK with 2^32 − 1 remaining and no current limit.
    let v = one(&s, "basic", &[("free", "x")]);
    assert_eq!(
        v["statuses"][0],
        json!({"code": "OK", "limitRemaining": 4_294_967_295u64})
    );
}

#[test]
fn counting_and_reports_when_over_the_limit_answer_as_lyft() {
    let s = loads();
    // 25 hits on 20 per minute: 19 … 0 remaining, then OVER_LIMIT with 0 remaining.
    inside_window(60, Duration::from_secs(10));
    for i in 0..25u64 {
        let v = one(&s, "basic", &[("burst", "b1")]);
        if i < 20 {
            assert_eq!(status(&v, 0), st("OK", 20, "MINUTE", 19 - i), "hit {i}");
        } else {
            assert_eq!(status(&v, 0), st("OVER_LIMIT", 20, "MINUTE", 0), "hit {i}");
        }
        // Whole seconds to the end of the wall clock's minute, as Lyft's `unit − now % unit`.
        let r = reset(&v, 0);
        let expect = 60 - unix_now().as_secs() % 60;
        assert!(
            (1..=60).contains(&r) && r.abs_diff(expect) <= 1,
            "{r} vs {expect}"
        );
    }
    // Two descriptors: each counted on its own; over as soon as one is.
    for i in 0..15u64 {
        let v = s.json(&req("basic", &[&[("client", "p2")], &[("pair", "p2")]], 1));
        assert_eq!(status(&v, 0), st("OK", 20, "HOUR", 19 - i));
        if i < 10 {
            assert_eq!(v["overallCode"], "OK");
            assert_eq!(status(&v, 1), st("OK", 10, "HOUR", 9 - i));
        } else {
            assert_eq!(v["overallCode"], "OVER_LIMIT");
            assert_eq!(status(&v, 1), st("OVER_LIMIT", 10, "HOUR", 0));
        }
    }
    // hits_addend above the limit: over, 0 remaining, the time to the window's end.
    let v = s.json(&req("basic", &[&[("client", "h1")]], 21));
    assert_eq!(status(&v, 0), st("OVER_LIMIT", 20, "HOUR", 0));
    assert!(reset(&v, 0) >= 1, "{v}");
    // 15, then 10 (over: 0 remaining), then 1: still over, every hit counts.
    let v = s.json(&req("basic", &[&[("client", "h2")]], 15));
    assert_eq!(status(&v, 0), st("OK", 20, "HOUR", 5));
    let v = s.json(&req("basic", &[&[("client", "h2")]], 10));
    assert_eq!(status(&v, 0), st("OVER_LIMIT", 20, "HOUR", 0));
    let v = s.json(&req("basic", &[&[("client", "h2")]], 1));
    assert_eq!(status(&v, 0), st("OVER_LIMIT", 20, "HOUR", 0));
    // Weir's counting, chosen per domain (`count_denied: false`): a refused hit costs nothing.
    let v = s.json(&req("counted-when-passed", &[&[("client", "h2")]], 15));
    assert_eq!(status(&v, 0), st("OK", 20, "HOUR", 5));
    let v = s.json(&req("counted-when-passed", &[&[("client", "h2")]], 10));
    assert_eq!(status(&v, 0), st("OVER_LIMIT", 20, "HOUR", 0));
    let v = s.json(&req("counted-when-passed", &[&[("client", "h2")]], 1));
    assert_eq!(status(&v, 0), st("OK", 20, "HOUR", 4));
    // A limit of 0 is always over, reported as 0 per its unit.
    inside_window(1, Duration::from_millis(300));
    let v = one(&s, "gate", &[("closed", "x")]);
    assert_eq!(status(&v, 0), st("OVER_LIMIT", 0, "SECOND", 0));
    assert_eq!(reset(&v, 0), 1);
    let v = one(&s, "gate", &[("open", "x")]);
    assert_eq!(status(&v, 0), st("OK", 50, "SECOND", 49));
    let v = s.json(&req("gate", &[&[("closed", "y")]], 0));
    assert_eq!(v["overallCode"], "OVER_LIMIT", "even a check is over");
}

#[test]
fn limit_overrides_apply_on_known_domains_only() {
    let s = loads();
    let with_limit = |domain: &str, value: &str| {
        json!({"domain": domain, "descriptors": [{
            "entries": [{"key": "anything", "value": value}],
            "limit": {"requestsPerUnit": 10, "unit": "DAY"},
        }]})
    };
    // An unknown domain gets no limit, override or not.
    let v = s.json(&with_limit("foo_domain", "a"));
    assert_eq!(v["statuses"][0], json!({"code": "OK"}));
    // A known domain: the override is the limit, matched descriptor or not.
    let v = s.json(&with_limit("basic", "a"));
    assert_eq!(status(&v, 0), st("OK", 10, "DAY", 9));
    let v = s.json(&json!({"domain": "basic", "descriptors": [{
        "entries": [{"key": "client", "value": "o1"}],
        "limit": {"requestsPerUnit": 2, "unit": "HOUR"},
    }]}));
    assert_eq!(status(&v, 0), st("OK", 2, "HOUR", 1));
}

#[test]
fn replaces_shadow_mode_and_quota_mode_answer_as_lyft() {
    let s = loads();
    // A matched descriptor replaces a named limit: that descriptor gets no limit.
    let v = s.json(&req(
        "shop",
        &[
            &[("category", "account")],
            &[("item", "i1"), ("variant", "vendor")],
        ],
        1,
    ));
    assert_eq!(status(&v, 0), st("OK", 4, "HOUR", 3));
    assert_eq!(v["statuses"][1], json!({"code": "OK"}));
    let v = s.json(&req(
        "shop",
        &[
            &[("origin", "edge"), ("target", "vendor")],
            &[("item", "i2"), ("variant", "vendor")],
        ],
        1,
    ));
    assert_eq!(status(&v, 0), st("OK", 2, "HOUR", 1));
    assert_eq!(v["statuses"][1], json!({"code": "OK"}));
    // Not replaced: the named limit (1 per hour) applies.
    let v = one(&s, "shop", &[("item", "i3"), ("variant", "vendor")]);
    assert_eq!(status(&v, 0), st("OK", 1, "HOUR", 0));
    assert_eq!(v["statuses"][0]["currentLimit"]["name"], "vendor_limit");
    // A blocked descriptor (limit 0) is over, unless a matched descriptor replaces it.
    let v = one(&s, "shop", &[("item", "i4"), ("variant", "blocked")]);
    assert_eq!(status(&v, 0), st("OVER_LIMIT", 0, "HOUR", 0));
    let v = s.json(&req(
        "shop",
        &[
            &[("origin", "edge"), ("target", "pardoned")],
            &[("item", "i4"), ("variant", "blocked")],
        ],
        1,
    ));
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][1], json!({"code": "OK"}));
    // Shadow mode: OK always, the remaining count still reported (0 once over).
    for i in 0..5u64 {
        let v = one(&s, "shop", &[("item", "i5"), ("variant", "watched")]);
        assert_eq!(status(&v, 0), st("OK", 3, "HOUR", 2u64.saturating_sub(i)));
    }
    // Quota mode: over only when every quota descriptor is over; metadata of those passed.
    let small = [("plan", "small")];
    let large = [("plan", "large")];
    let v = s.json(&req("shop", &[&small], 1));
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(
        v["dynamicMetadata"]["metadata"],
        json!({"plan_quota": {"name": "small"}})
    );
    let v = s.json(&req("shop", &[&small], 1));
    assert_eq!(
        v["overallCode"], "OVER_LIMIT",
        "the only quota descriptor is over"
    );
    assert_eq!(status(&v, 0), st("OVER_LIMIT", 1, "HOUR", 0));
    assert!(v["dynamicMetadata"].get("metadata").is_none(), "{v}");
    let v = s.json(&req("shop", &[&small, &large], 1));
    assert_eq!(
        v["overallCode"], "OK",
        "one quota descriptor still passes: {v}"
    );
    assert_eq!(status(&v, 0).0, "OVER_LIMIT");
    assert_eq!(
        v["dynamicMetadata"]["metadata"],
        json!({"plan_quota": {"name": "large", "seats": 10}})
    );
    // Lyft's dynamic metadata carries the request too.
    assert_eq!(v["dynamicMetadata"]["domain"], "shop");
    assert_eq!(
        v["dynamicMetadata"]["descriptors"][1]["entries"],
        json!(["plan=large"])
    );
    assert_eq!(v["dynamicMetadata"]["hitsAddend"], 1);
    // A quota descriptor next to an ordinary one over its limit: over.
    let v = s.json(&req(
        "shop",
        &[&large, &[("item", "i3"), ("variant", "vendor")]],
        1,
    ));
    assert_eq!(v["overallCode"], "OVER_LIMIT");
}

#[test]
fn wildcards_share_threshold_and_metric_names_answer_as_lyft() {
    let s = loads();
    let passes = |entries: &[(&str, &str)]| one(&s, "wild", entries)["overallCode"] == "OK";
    // A trailing wildcard: one counter per value.
    assert!(passes(&[("path", "/img/a")]) && passes(&[("path", "/img/a")]));
    assert!(!passes(&[("path", "/img/a")]));
    assert!(
        passes(&[("path", "/img/b")]),
        "another value, another counter"
    );
    // share_threshold: every value matching the pattern shares one counter.
    assert!(passes(&[("path", "/doc/a")]) && passes(&[("path", "/doc/b")]));
    assert!(!passes(&[("path", "/doc/c")]));
    // An exact value wins over a wildcard.
    let v = one(&s, "wild", &[("path", "/doc/exact")]);
    assert_eq!(status(&v, 0), st("OK", 5, "HOUR", 4));
    // A wildcard in the middle matches zero or more characters; `bar*b` style.
    assert!(passes(&[("mid", "az")]));
    assert_eq!(
        one(&s, "wild", &[("mid", "abc")])["statuses"][0],
        json!({"code": "OK"})
    );
    assert!(passes(&[("mid", "a-long-z")]), "own counter");
    // Several wildcards, shared.
    assert!(
        passes(&[("multi", "x1y2z")])
            && passes(&[("multi", "xyz")])
            && passes(&[("multi", "x-y-z")])
    );
    assert!(!passes(&[("multi", "xAyBz")]));
    // Shared at two nested levels.
    assert!(passes(&[("tenant", "t-1"), ("bucket", "b-1")]));
    assert!(passes(&[("tenant", "t-2"), ("bucket", "b-2")]));
    assert!(!passes(&[("tenant", "t-3"), ("bucket", "b-3")]));
    // value_to_metric names the runtime value in the metric; detailed_metric every value.
    assert!(passes(&[("route", "api/v1"), ("method", "GET")]));
    assert!(one(&s, "shop", &[("report", "weekly")])["overallCode"] == "OK");
    let m = s.metrics();
    assert!(
        m.contains("weir_rls_hits_total{rule=\"wild.route_api/v1.method\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("weir_rls_hits_total{rule=\"shop.report_weekly\"} 1"),
        "{m}"
    );
    // Shared values are named by their pattern.
    assert!(
        m.contains("weir_rls_hits_total{rule=\"wild.path_/doc/*\"} 3"),
        "{m}"
    );
}

fn check(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["check-config"];
    all.extend_from_slice(args);
    let out = common::run(&all, "");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn configurations_lyft_refuses_are_refused_with_their_place() {
    let cases = [
        (
            "bad_unit",
            ":6:7: descriptors[0].rate_limit.unit: unknown unit \"fortnight\"",
        ),
        ("bad_yaml", ":2:1:"),
        (
            "duplicate_key",
            ":6:5: descriptors[1]: duplicate descriptor",
        ),
        ("empty_domain", "missing field `domain`"),
        ("empty_key", ":3:5: descriptors[0]: missing field `key`"),
        (
            "misspelled_field",
            "descriptors[0].ratelimit: unknown field `ratelimit`",
        ),
        (
            "misspelled_nested_field",
            "rate_limit.requestsperunit: unknown field",
        ),
        (
            "non_map_list",
            ":3:5: descriptors[0]: expected a mapping of fields (`field: value`), got \"one\"",
        ),
        ("non_string_key", "unknown field `0.5`"),
        (
            "replaces_empty",
            ":3:5: descriptors[0].rate_limit: replaces: an entry has an empty name",
        ),
        ("replaces_self", "\"mine\" is this limit's own name"),
        (
            "unlimited_with_unit",
            "unlimited: true takes no unit, requests_per_unit",
        ),
        (
            "share_threshold_without_wildcard",
            ":5:22: descriptors[0].share_threshold: applies only to a value with a `*` wildcard",
        ),
    ];
    for (name, expect) in cases {
        let file = fixtures().join(format!("refused/{name}.yaml"));
        let (code, _, err) = check(&[file.to_str().unwrap()]);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(
            err.contains(&format!("{name}.yaml")) && err.contains(expect),
            "{name}: {err}"
        );
        assert_eq!(
            err.lines().count(),
            if name == "non_map_list" { 2 } else { 1 },
            "{name}: {err}"
        );
    }
    // Every fixture Lyft loads, loads.
    let (code, out, err) = check(&[fixtures().join("loads").to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("shop.item.variant_blocked: 0 per 1h") && out.contains("[quota mode]"),
        "{out}"
    );
}

#[test]
fn a_domain_split_over_files_merges_only_when_asked() {
    let dir = fixtures().join("merge");
    let (code, _, err) = check(&[dir.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("domain \"joined\" is also defined") && err.contains("--merge-domains"),
        "{err}"
    );
    let (code, out, err) = check(&["--merge-domains", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("joined.a_one: 10 per 1h") && out.contains("joined.b_two: 20 per 1h"),
        "{out}"
    );
    let s = Serve::start(&["--config", dir.to_str().unwrap(), "--merge-domains"]);
    assert_eq!(
        status(&one(&s, "joined", &[("b", "two")]), 0),
        st("OK", 20, "HOUR", 19)
    );
    assert_eq!(
        status(&one(&s, "joined", &[("a", "one")]), 0),
        st("OK", 10, "HOUR", 9)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_answers_over_grpc() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let s = tokio::task::spawn_blocking(loads).await.unwrap();
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", s.grpc))
        .await
        .unwrap();
    let request = |domain: &str, entries: &[(&str, &str)], hits: u32| RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: hits,
    };
    // Over the limit: 0 remaining, the whole seconds to the window's end.
    let r = client
        .should_rate_limit(request("basic", &[("client", "g1")], 21))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 2, "OVER_LIMIT");
    let st = &r.statuses[0];
    assert_eq!((st.code, st.limit_remaining), (2, 0));
    let d = st.duration_until_reset.unwrap();
    assert_eq!(d.nanos, 0, "whole seconds");
    assert!((1..=3_600).contains(&d.seconds), "{d:?}");
    // Unlimited: 2^32 − 1 remaining, no current limit, no reset.
    let r = client
        .should_rate_limit(request("basic", &[("free", "g")], 1))
        .await
        .unwrap()
        .into_inner();
    let st = &r.statuses[0];
    assert_eq!(st.limit_remaining, u32::MAX);
    assert!(st.current_limit.is_none() && st.duration_until_reset.is_none());
    // Dynamic metadata (--response-metadata) as a protobuf Struct.
    let r = client
        .should_rate_limit(request("shop", &[("plan", "large")], 1))
        .await
        .unwrap()
        .into_inner();
    let md = r.dynamic_metadata.expect("dynamic metadata");
    let domain = &md.fields["domain"].kind;
    assert!(
        matches!(domain, Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(d)) if d == "shop"),
        "{domain:?}"
    );
    assert!(md.fields.contains_key("metadata"));
    drop(s);
}
