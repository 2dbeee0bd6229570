//! Every rule kind through the public API on a manual clock, shadow mode, and reloads that keep
//! state.

use std::path::Path;
use std::time::Duration;

use weir_core::stats::Outcome;
use weir_rules::config::RuleSet;
use weir_rules::engine::{Context, RuleKind};

mod support;
use support::{passes, rules, set};

const CTX: Context<'static> = Context {
    origin: "web",
    criticality: weir_core::Criticality::Critical,
    params: &[],
    inbound: true,
    cost: None,
};

#[test]
fn flow_rate_blocks_with_rule_kind_and_retry_after() {
    let (r, clock) = rules("resources:\n  - name: api\n    flow:\n      - {id: api-qps, qps: 3, window: 1s, algorithm: sliding_log}\n");
    assert_eq!(passes(&r, "api", &CTX, 3), 3);
    let block = r.entry("api", &CTX).err().unwrap();
    assert_eq!((&*block.rule, block.kind), ("api-qps", RuleKind::Flow));
    assert_eq!(block.retry_after, Some(Duration::from_secs(1)));
    clock.advance(Duration::from_secs(1));
    assert_eq!(passes(&r, "api", &CTX, 5), 3);
    assert_eq!(r.stats("api-qps").unwrap().blocks, 3, "blocks counted");
    // Resources without rules always pass.
    assert_eq!(passes(&r, "other", &CTX, 10), 10);
}

#[test]
fn concurrency_slot_returns_when_the_guard_completes_or_drops() {
    let (r, _) =
        rules("resources:\n  - name: db\n    flow:\n      - {id: db-inflight, concurrency: 1}\n");
    let g = r.entry("db", &CTX).unwrap();
    assert_eq!(r.entry("db", &CTX).err().unwrap().kind, RuleKind::Flow);
    g.complete(Outcome::Success);
    let g = r.entry("db", &CTX).unwrap();
    drop(g);
    assert!(r.entry("db", &CTX).is_ok());
}

#[test]
fn hot_params_limit_per_value_with_exceptions_and_count_evictions() {
    let (r, _) = rules(
        "resources:\n  - name: search\n    hot_params:\n      - {id: per-user, param: 0, threshold: 2, window: 1m, exceptions: {vip: 5}, max_values: 64}\n",
    );
    let ctx = |user: &'static [&'static str]| Context {
        params: user,
        ..CTX
    };
    assert_eq!(passes(&r, "search", &ctx(&["ann"]), 5), 2);
    assert_eq!(
        passes(&r, "search", &ctx(&["bob"]), 5),
        2,
        "a counter per value"
    );
    assert_eq!(passes(&r, "search", &ctx(&["vip"]), 9), 5, "exception");
    assert_eq!(
        r.entry("search", &ctx(&["ann"])).err().unwrap().kind,
        RuleKind::HotParam
    );
    // Calls without the parameter are not limited by it.
    assert_eq!(passes(&r, "search", &CTX, 5), 5);
    // Past max_values, idle values are evicted and counted.
    let values: Vec<String> = (0..200).map(|i| format!("u{i}")).collect();
    for v in &values {
        let p = [v.as_str()];
        let _ = r.entry("search", &Context { params: &p, ..CTX });
    }
    assert!(
        r.stats("per-user").unwrap().evictions > 0,
        "evictions counted"
    );
}

#[test]
fn authority_allow_and_deny_lists() {
    let (r, _) = rules(
        "resources:\n  - name: admin\n    authority: {id: admins, allow: [ops]}\n  - name: public\n    authority: {id: blocklist, deny: [scraper]}\n",
    );
    let from = |origin: &'static str| Context { origin, ..CTX };
    assert!(r.entry("admin", &from("ops")).is_ok());
    let b = r.entry("admin", &from("web")).err().unwrap();
    assert_eq!((b.kind, b.retry_after), (RuleKind::Authority, None));
    assert!(r.entry("public", &from("web")).is_ok());
    assert!(r.entry("public", &from("scraper")).is_err());
}

#[test]
fn breaker_opens_on_errors_and_blocks() {
    let (r, clock) = rules(
        "resources:\n  - name: pay\n    breaker: {id: pay-breaker, preset: resilience4j, error_ratio: 0.5, min_calls: 4, open_for: 10s}\n",
    );
    for _ in 0..4 {
        r.entry("pay", &CTX).unwrap().complete(Outcome::Error);
    }
    let b = r.entry("pay", &CTX).err().unwrap();
    assert_eq!(b.kind, RuleKind::Breaker);
    assert!(b.retry_after.unwrap() <= Duration::from_secs(10));
    clock.advance(Duration::from_secs(11));
    assert!(
        r.entry("pay", &CTX).is_ok(),
        "half-open probe after the open time"
    );
}

#[test]
fn a_small_count_window_caps_the_presets_minimum_of_calls() {
    // Resilience4j's preset asks 100 calls; a window of 20 trips after its 20 calls.
    let (r, _clock) = rules(
        "resources:\n  - name: up\n    breaker: {id: up-breaker, error_ratio: 0.5, window_calls: 20, open_for: 10s}\n",
    );
    for _ in 0..20 {
        r.entry("up", &CTX).unwrap().complete(Outcome::Error);
    }
    assert_eq!(r.entry("up", &CTX).err().unwrap().kind, RuleKind::Breaker);
    // An explicit minimum the window cannot hold is refused, located.
    let e = RuleSet::from_yaml(
        Path::new("r.yaml"),
        "resources:\n  - name: up\n    breaker: {id: b, window_calls: 20, min_calls: 30, error_ratio: 0.5}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("r.yaml:3:")
            && e.contains(
                "resources[0].breaker: min_calls 30 is more than the window holds (20 calls)"
            ),
        "{e}"
    );
}

#[test]
fn shadow_rules_count_but_never_block() {
    let (r, _) =
        rules("resources:\n  - name: api\n    flow:\n      - {id: trial, qps: 1, shadow: true}\n");
    assert_eq!(passes(&r, "api", &CTX, 5), 5);
    let s = r.stats("trial").unwrap();
    assert_eq!((s.passes, s.blocks, s.shadow_blocks), (1, 0, 4));
}

#[test]
fn reload_keeps_counters_and_rejects_invalid_sets_atomically() {
    let yaml = "resources:\n  - name: api\n    flow:\n      - {id: api-qps, qps: 3, window: 1m, algorithm: fixed_window}\n  - name: db\n    flow:\n      - {id: db-inflight, concurrency: 2}\n";
    let (r, _) = rules(yaml);
    assert_eq!(passes(&r, "api", &CTX, 2), 2);
    let held = r.entry("db", &CTX).unwrap();
    // Unchanged: the counter (2 used) and the holder survive.
    r.apply(&set(yaml)).unwrap();
    assert_eq!(passes(&r, "api", &CTX, 5), 1);
    // Threshold raised to 5: the counter (3 used) is kept, 2 more pass.
    r.apply(&set(&yaml.replace("qps: 3", "qps: 5"))).unwrap();
    assert_eq!(passes(&r, "api", &CTX, 5), 2);
    // Concurrency lowered to 1: the existing holder still counts.
    r.apply(&set(&yaml
        .replace("concurrency: 2", "concurrency: 1")
        .replace("qps: 3", "qps: 5")))
        .unwrap();
    assert!(r.entry("db", &CTX).is_err());
    drop(held);
    // An invalid set changes nothing.
    let mut bad = set(yaml);
    bad.resources[0].flow[0].qps = None;
    assert!(r.apply(&bad).is_err());
    assert!(
        r.entry("db", &CTX).is_ok(),
        "the previous rules are still in force"
    );
}

#[test]
fn a_limit_raised_from_a_trickle_admits_at_the_new_rate_at_once() {
    // One a minute per rule and per user (GCRA and the token bucket keep time ahead as state).
    let yaml = "resources:
  - name: api
    flow:
      - {id: gcra, qps: 1, window: 1m, algorithm: gcra}
  - name: db
    flow:
      - {id: bucket, qps: 1, window: 1m, algorithm: token_bucket}
  - name: search
    hot_params:
      - {id: per-user, param: 0, threshold: 1, window: 1m}
";
    let (r, clock) = rules(yaml);
    let user = Context {
        params: &["u"],
        ..CTX
    };
    for res in ["api", "db"] {
        assert!(passes(&r, res, &CTX, 5) < 5, "{res} exhausted");
        assert_eq!(passes(&r, res, &CTX, 1), 0, "{res} exhausted");
    }
    assert_eq!(passes(&r, "search", &user, 3), 1);
    // Raised to 6 000 a minute (100/s): what was admitted counts as that many units at the
    // new rate (10 ms each), not as the minute the old rate spaced them by.
    r.apply(&set(&yaml
        .replace("qps: 1, window: 1m", "qps: 6000, window: 1m")
        .replace(
            "threshold: 1, window: 1m",
            "threshold: 6000, window: 1m",
        )))
    .unwrap();
    clock.advance(Duration::from_millis(50));
    for res in ["api", "db"] {
        assert!(
            passes(&r, res, &CTX, 3) >= 1,
            "{res} admits after the raise"
        );
    }
    assert!(
        passes(&r, "search", &user, 3) >= 1,
        "per-user admits after the raise"
    );
}

#[test]
fn a_rejected_reload_leaves_shared_limiters_untouched() {
    let yaml = "resources:
  - name: search
    hot_params:
      - {id: per-user, param: 0, threshold: 1, window: 1m, exceptions: {vip: 2}}
    flow:
      - {id: per-caller, qps: 1, window: 1m, origin: other}
";
    let (r, _) = rules(yaml);
    let user = |u: &'static [&'static str]| Context { params: u, ..CTX };
    assert_eq!(passes(&r, "search", &user(&["x"]), 1), 1);
    // Raised limits, plus a rule only the algorithm can refuse (a sliding log that long):
    // the set is rejected as a whole...
    let raised = yaml
        .replace("threshold: 1,", "threshold: 5,")
        .replace("qps: 1,", "qps: 5,")
        + "  - name: other
    flow:
      - {id: too-long, qps: 100000000, algorithm: sliding_log}
";
    assert!(r.apply(&set(&raised)).is_err());
    // ... so the limits in force are still 1 per minute, for the value and for the caller.
    assert_eq!(passes(&r, "search", &user(&["x"]), 3), 0);
    assert_eq!(
        passes(&r, "search", &user(&["y"]), 3),
        0,
        "the caller used its 1"
    );
    // A valid raise applies both, keeping what was counted.
    r.apply(&set(&yaml
        .replace("threshold: 1,", "threshold: 5,")
        .replace("qps: 1,", "qps: 5,")))
        .unwrap();
    assert_eq!(passes(&r, "search", &user(&["z"]), 10), 4);
}

#[test]
fn yaml_errors_name_file_line_column_and_path() {
    let e = RuleSet::from_yaml(
        Path::new("r.yaml"),
        "resources:\n  - name: a\n    flow:\n      - {id: x, qps: 3, windw: 1s}\n",
    )
    .unwrap_err();
    assert!(
        e.to_string().starts_with("r.yaml:4:") && e.to_string().contains("unknown field `windw`"),
        "{e}"
    );
    let e = RuleSet::from_yaml(
        Path::new("r.yaml"),
        "resources:\n  - name: a\n    flow:\n      - {id: x, qps: 3, window: 1y}\n",
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("resources[0].flow[0].window") && e.to_string().contains("\"1y\""),
        "{e}"
    );
    let e = RuleSet::from_yaml(
        Path::new("r.yaml"),
        "resources:\n  - name: a\n    flow:\n      - {id: x, qps: 3, concurrency: 2}\n",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "r.yaml:4:9: resources[0].flow[0]: give exactly one of qps, concurrency or cluster"
    );
    let e = RuleSet::from_yaml(Path::new("r.yaml"), "resources:\n  - name: a\n    flow:\n      - {id: x, qps: 3}\n  - name: b\n    flow:\n      - {id: x, qps: 3}\n").unwrap_err();
    assert!(e.to_string().contains("duplicate rule id \"x\""), "{e}");
}

#[test]
fn a_resolved_resource_shares_state_with_entry_and_is_refreshed_after_apply() {
    let (r, _) = rules("resources:\n  - name: api\n    flow:\n      - {id: api-qps, qps: 4, window: 1s, algorithm: sliding_log}\n");
    let resolved = r.resolve("api");
    let generation = r.generation();
    // The same counters whichever way a call enters.
    assert!(r.entry_resolved(&resolved, "api", &CTX).is_ok());
    assert!(r.entry("api", &CTX).is_ok());
    assert_eq!(passes(&r, "api", &CTX, 5), 2);
    let block = r.entry_resolved(&resolved, "api", &CTX).err().unwrap();
    assert_eq!(&*block.rule, "api-qps");
    // A resource without rules passes; system rules would still apply to it.
    let none = r.resolve("other");
    assert!(r.entry_resolved(&none, "other", &CTX).is_ok());
    // After a reload the generation moves on; resolving again gives the new rules.
    r.apply(&set("resources:\n  - name: api\n    flow:\n      - {id: api-qps, qps: 4, window: 1s, algorithm: sliding_log}\n      - {id: api-one, concurrency: 1}\n")).unwrap();
    assert_ne!(r.generation(), generation);
    let fresh = r.resolve("api");
    let block = r.entry_resolved(&fresh, "api", &CTX).err().unwrap();
    assert_eq!(&*block.rule, "api-qps", "counters kept across the reload");
}

/// A cluster quota provider backed by a plain weir-core limiter per resource (what a lease
/// client does with its grant).
struct Limiters(
    std::collections::HashMap<String, weir_core::limiter::Limiter<weir_core::FixedWindow>>,
    /// The times it was asked at.
    std::sync::Arc<std::sync::Mutex<Vec<weir_core::Nanos>>>,
);

impl weir_rules::engine::ClusterQuota for Limiters {
    fn acquire_at(
        &self,
        resource: &str,
        n: u64,
        now: weir_core::Nanos,
    ) -> Option<weir_core::Decision> {
        self.1.lock().unwrap().push(now);
        self.0.get(resource).map(|l| l.acquire_at(n, now))
    }
}

#[test]
fn cluster_rules_decide_through_their_provider_and_are_validated() {
    let yaml = "resources:\n  - name: api\n    flow:\n      - {id: global, cluster: {resource: search, safe: 5}}\n  - name: new\n    flow:\n      - {id: fresh, cluster: {resource: unleased, safe: 100}}\n";
    let (r, clock) = rules(yaml);
    assert_eq!(
        r.cluster_resources(),
        vec![("search".to_string(), 5.0), ("unleased".to_string(), 100.0)]
    );
    // No provider yet: each rule's safe capacity, enforced locally (a burst of two units,
    // then 5/s) — never unlimited.
    assert_eq!(passes(&r, "api", &CTX, 10), 2);
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        passes(&r, "api", &CTX, 10),
        2,
        "5/s, at most the burst at once"
    );
    let q = weir_core::Quota::new(3, Duration::from_secs(3600)).unwrap();
    let mut m = std::collections::HashMap::new();
    m.insert(
        "search".to_string(),
        weir_core::limiter::Limiter::new(weir_core::FixedWindow::new(q).unwrap()),
    );
    let asked_at = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    r.set_cluster(Limiters(m, asked_at.clone()));
    assert_eq!(passes(&r, "api", &CTX, 10), 3);
    // The provider decides at the engine's time (its manual clock), read once per call.
    let asked = asked_at.lock().unwrap().clone();
    assert_eq!(asked, vec![weir_core::Clock::now(&*clock); 10]);
    // A resource the provider does not lease (added by a reload, say): its safe capacity.
    assert_eq!(passes(&r, "new", &CTX, 10), 2);
    // Offered 200/s for a second: 100 pass (its rate), plus at most the burst.
    let passed: usize = (0..100)
        .map(|_| {
            clock.advance(Duration::from_millis(10));
            passes(&r, "new", &CTX, 2)
        })
        .sum();
    assert!((100..=102).contains(&passed), "{passed}");
    let b = r.entry("api", &CTX).err().unwrap();
    assert_eq!((b.kind, &*b.rule), (RuleKind::Flow, "global"));
    for (bad, needle) in [
        (
            "{id: g, cluster: {resource: search, safe: 0}}",
            "cluster.safe: must be a rate > 0",
        ),
        (
            "{id: g, qps: 3, cluster: {resource: search, safe: 1}}",
            "exactly one of qps, concurrency or cluster",
        ),
        (
            "{id: g, origin: x, cluster: {resource: search, safe: 1}}",
            "takes no origin",
        ),
        (
            "{id: g, cluster: {resource: '', safe: 1}}",
            "cluster.resource: must not be empty",
        ),
    ] {
        let text = format!("resources:\n  - name: api\n    flow:\n      - {bad}\n");
        let e = RuleSet::from_yaml(Path::new("r.yaml"), &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle) && e.starts_with("r.yaml:4:"), "{e}");
    }
}
