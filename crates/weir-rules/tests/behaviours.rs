//! Flow control behaviours (pace, warm-up), per-origin limits, relate strategy, system rules,
//! hot-parameter behaviour at the bound, resource statistics and the file watcher — through the
//! public API on a manual clock and a fake CPU.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_core::stats::Outcome;
use weir_core::{Criticality, ManualClock};
use weir_rules::config::RuleSet;
use weir_rules::engine::{Context, RuleKind, Rules};

mod support;
use support::{passes, rules, set, R};

fn from(origin: &str) -> Context<'_> {
    Context {
        origin,
        ..Context::default()
    }
}

#[test]
fn pace_spaces_calls_and_blocks_past_max_wait() {
    let (r, clock) = rules("resources:\n  - name: api\n    flow:\n      - {id: paced, qps: 10, behavior: pace, max_wait: 300ms}\n");
    let ctx = Context::default();
    // 100 ms apart: waits 0, 100, 200, 300 ms; the fifth would wait 400 ms > 300 ms.
    let waits: Vec<Duration> = (0..4)
        .map(|_| {
            let g = r.entry("api", &ctx).unwrap();
            let w = g.wait();
            g.complete(Outcome::Success);
            w
        })
        .collect();
    assert_eq!(
        waits,
        [0, 100, 200, 300].map(Duration::from_millis).to_vec()
    );
    let b = r.entry("api", &ctx).err().unwrap();
    assert_eq!((&*b.rule, b.kind), ("paced", RuleKind::Flow));
    assert_eq!(b.retry_after, Some(Duration::from_millis(100)));
    clock.advance(Duration::from_millis(100));
    assert_eq!(
        r.entry("api", &ctx).unwrap().wait(),
        Duration::from_millis(300)
    );
}

#[test]
fn warm_up_ramps_and_keeps_progress_across_reloads() {
    let yaml = "resources:\n  - name: api\n    flow:\n      - {id: warm, qps: 30, behavior: warm_up, warmup: 10s}\n";
    let (r, clock) = rules(yaml);
    let ctx = Context::default();
    // Cold: the rate starts at qps / cold_factor (10/s). Count passes in one second, offering
    // one call per millisecond.
    let second = |r: &R| {
        let mut n = 0;
        for _ in 0..1000 {
            n += passes(r, "api", &ctx, 1);
            clock.advance(Duration::from_millis(1));
        }
        n
    };
    let cold = second(&r);
    assert!((9..=13).contains(&cold), "cold second passed {cold}");
    for _ in 0..12 {
        second(&r);
    }
    // A reload with a changed threshold keeps the warm state (Sentinel restarts warm-up).
    r.apply(&set(&yaml.replace("qps: 30", "qps: 31"))).unwrap();
    let warm = second(&r);
    assert!((29..=32).contains(&warm), "warm second passed {warm}");
}

#[test]
fn per_origin_rules_count_named_callers_and_each_other_caller() {
    let (r, _) = rules("resources:\n  - name: api\n    flow:\n      - {id: batch, qps: 2, window: 1m, origin: batch}\n      - {id: others, qps: 3, window: 1m, origin: other}\n");
    assert_eq!(passes(&r, "api", &from("batch"), 10), 2, "named origin");
    // `other` counts each caller not named elsewhere on its own.
    assert_eq!(passes(&r, "api", &from("web"), 10), 3);
    assert_eq!(passes(&r, "api", &from("mobile"), 10), 3);
    // batch is not counted by `other`.
    assert_eq!(r.stats("others").unwrap().blocks, 14);
    assert_eq!(r.stats("batch").unwrap().blocks, 8);
}

#[test]
fn relate_blocks_a_resource_while_another_is_busy() {
    let (r, clock) = rules("resources:\n  - name: write\n  - name: read\n    flow:\n      - {id: read-yields, qps: 5, relate: write}\n");
    let ctx = Context::default();
    assert_eq!(passes(&r, "read", &ctx, 3), 3, "write idle");
    assert_eq!(passes(&r, "write", &ctx, 5), 5, "write has no limit");
    let b = r.entry("read", &ctx).err().unwrap();
    assert_eq!((&*b.rule, b.kind), ("read-yields", RuleKind::Flow));
    clock.advance(Duration::from_millis(1100));
    assert!(r.entry("read", &ctx).is_ok(), "write's second has passed");
}

#[test]
fn system_rules_limit_inbound_calls_only() {
    let (r, clock) = rules("resources:\n  - name: api\nsystem: {max_in_flight: 2, max_qps: 5}\n");
    let inbound = Context::default();
    let outbound = Context {
        inbound: false,
        ..Context::default()
    };
    let a = r.entry("api", &inbound).unwrap();
    let b = r.entry("undeclared", &inbound).unwrap();
    let blocked = r.entry("api", &inbound).err().unwrap();
    assert_eq!(
        (&*blocked.rule, blocked.kind),
        ("system:max_in_flight", RuleKind::System)
    );
    assert!(
        r.entry("api", &outbound).is_ok(),
        "outbound calls are not limited"
    );
    drop(a);
    b.complete(Outcome::Success);
    // 2 passed of 5 per second: 3 more.
    assert_eq!(passes(&r, "api", &inbound, 10), 3);
    assert_eq!(
        r.entry("api", &inbound).err().unwrap().rule.as_ref(),
        "system:max_qps"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(passes(&r, "api", &inbound, 10), 5);
    assert_eq!(r.stats("system:max_qps").unwrap().blocks, 7 + 1 + 5);
}

#[test]
fn system_avg_rt_cpu_and_bbr_read_injected_signals() {
    let cpu = Arc::new(AtomicU64::new(0.1f64.to_bits()));
    let c = cpu.clone();
    let source = Arc::new(move || f64::from_bits(c.load(Ordering::Relaxed)));
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let r = Rules::with_signals(
        &set("system: {max_avg_rt: 50ms, max_cpu: 0.9}\n"),
        clock.clone(),
        source,
    )
    .unwrap();
    let ctx = Context::default();
    // Slow calls push the last second's average above 50 ms.
    let g = r.entry("api", &ctx).unwrap();
    clock.advance(Duration::from_millis(80));
    g.complete(Outcome::Success);
    assert_eq!(
        r.entry("api", &ctx).err().unwrap().rule.as_ref(),
        "system:max_avg_rt"
    );
    clock.advance(Duration::from_secs(1));
    assert!(r.entry("api", &ctx).is_ok(), "the slow second has passed");
    cpu.store(0.95f64.to_bits(), Ordering::Relaxed);
    assert_eq!(
        r.entry("api", &ctx).err().unwrap().rule.as_ref(),
        "system:max_cpu"
    );
    // BBR: hot CPU and in-flight above the estimate → sheddable calls are dropped.
    r.apply(&set(
        "system: {bbr: {cpu_threshold: 0.8, window: 1s, buckets: 10}}\n",
    ))
    .unwrap();
    // Build an estimate: 1 call per 100 ms bucket taking 10 ms.
    for _ in 0..20 {
        let g = r.entry("api", &ctx).unwrap();
        clock.advance(Duration::from_millis(10));
        g.complete(Outcome::Success);
        clock.advance(Duration::from_millis(90));
    }
    let sheddable = Context {
        criticality: Criticality::Sheddable,
        ..ctx
    };
    let held: Vec<_> = (0..50)
        .filter_map(|_| r.entry("api", &sheddable).ok())
        .collect();
    assert!(held.len() < 50, "BBR shed nothing");
    assert!(r.stats("system:bbr").unwrap().blocks > 0);
}

#[test]
fn hot_params_at_the_bound_reject_or_allow_as_configured_and_count() {
    let yaml = |on_full: &str| {
        format!("resources:\n  - name: s\n    hot_params:\n      - {{id: per-user, param: 0, threshold: 1, window: 1m, max_values: 4, on_full: {on_full}}}\n")
    };
    for (on_full, expect_pass) in [("reject", false), ("allow", true)] {
        let (r, _) = rules(&yaml(on_full));
        for u in ["a", "b", "c", "d"] {
            assert!(r
                .entry(
                    "s",
                    &Context {
                        params: &[u],
                        ..Context::default()
                    }
                )
                .is_ok());
        }
        let new = r.entry(
            "s",
            &Context {
                params: &["e"],
                ..Context::default()
            },
        );
        assert_eq!(new.is_ok(), expect_pass, "{on_full}");
        let s = r.stats("per-user").unwrap();
        assert_eq!((s.full, s.evictions), (1, 0), "{on_full}");
        // Tracked values keep their state (limit 1 per minute).
        assert!(r
            .entry(
                "s",
                &Context {
                    params: &["a"],
                    ..Context::default()
                }
            )
            .is_err());
    }
}

#[test]
fn resource_statistics_survive_reloads_and_record_response_times() {
    let yaml = "resources:\n  - name: api\n    flow:\n      - {id: q, qps: 100}\n";
    let (r, clock) = rules(yaml);
    let ctx = Context::default();
    let g = r.entry("api", &ctx).unwrap();
    clock.advance(Duration::from_millis(3));
    g.complete(Outcome::Error);
    let held = r.entry("api", &ctx).unwrap();
    r.apply(&set(&yaml.replace("qps: 100", "qps: 200")))
        .unwrap();
    let snap = r.snapshot();
    let api = snap.resource("api").unwrap();
    assert_eq!(
        (api.passes, api.in_flight, api.completed, api.errors),
        (2, 1, 1, 1)
    );
    // 3 ms lands in the ≤ 5 ms bucket, not in ≤ 2.5 ms.
    let le = |bound: f64| api.rt_buckets.iter().find(|(b, _)| *b == bound).unwrap().1;
    assert_eq!((le(0.0025), le(0.005)), (0, 1));
    drop(held);
    assert_eq!(r.snapshot().resource("api").unwrap().in_flight, 0);
}

#[test]
fn validation_names_the_field() {
    let cases = [
        ("resources:\n  - name: a\n    flow:\n      - {id: x, qps: 3, behavior: pace, algorithm: gcra}\n", "resources[0].flow[0].behavior"),
        ("resources:\n  - name: a\n    flow:\n      - {id: x, qps: 3, max_wait: 1s}\n", "resources[0].flow[0].max_wait"),
        ("resources:\n  - name: a\n    flow:\n      - {id: x, qps: 3, relate: nope}\n", "resources[0].flow[0].relate"),
        ("system: {max_cpu: 1.5}\n", "system.max_cpu"),
        ("resources:\n  - name: a\nhttp:\n  routes:\n    - {resource: b}\n", "http.routes[0].resource"),
        ("resources:\n  - name: a\nhttp:\n  trusted_proxies: [10.0.0.0/40]\n", "http.trusted_proxies[0]"),
        ("resources:\n  - name: a\nhttp:\n  routes:\n    - {resource: a, params: [{header: \"bad header\"}]}\n", "http.routes[0].params[0].header"),
    ];
    for (yaml, path) in cases {
        let e = RuleSet::from_yaml(Path::new("r.yaml"), yaml).unwrap_err();
        let e = e.to_string();
        let (at, rest) = e.split_once(": ").unwrap();
        assert!(
            at.starts_with("r.yaml:") && at.split(':').count() == 3,
            "no line and column: {e}"
        );
        assert!(rest.starts_with(&format!("{path}: ")), "{e}");
    }
}

#[test]
fn every_validation_error_of_a_file_is_reported_where_it_is() {
    let yaml = "resources:
  - name: a
    flow:
      - {id: x, qps: 0}
    hot_params:
      - {id: h, param: 0, threshold: 0}
    breaker: {id: b, error_ratio: 1.5}
";
    let e = RuleSet::from_yaml(Path::new("r.yaml"), yaml)
        .unwrap_err()
        .to_string();
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 3, "{e}");
    assert!(
        lines[0].starts_with("r.yaml:4:22: resources[0].flow[0].qps: must be ≥ 1"),
        "{e}"
    );
    assert!(
        lines[1].starts_with("r.yaml:6:38: resources[0].hot_params[0].threshold: must be ≥ 1"),
        "{e}"
    );
    assert!(
        lines[2].starts_with(
            "r.yaml:7:35: resources[0].breaker.error_ratio: must be in (0, 1], got 1.5"
        ),
        "{e}"
    );
}

#[test]
fn watcher_applies_changes_and_keeps_rules_on_a_bad_file() {
    let dir = std::env::temp_dir().join(format!("weir-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rules.yaml");
    let one = "resources:\n  - name: api\n    flow:\n      - {id: q, qps: 1, window: 1h}\n";
    std::fs::write(&path, one).unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let r = Arc::new(Rules::with_clock(&weir_rules::watch::load(&path).unwrap(), clock).unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let _w = weir_rules::watch::Watcher::start(
        r.clone(),
        path.clone(),
        Duration::from_millis(20),
        move |e| {
            let _ = tx.send(e);
        },
    )
    .unwrap();
    let ctx = Context::default();
    assert_eq!(passes(&r, "api", &ctx, 5), 1);
    // A bad file is reported with its location; the old rules stay.
    std::fs::write(
        &path,
        "resources:\n  - name: api\n    flow:\n      - {id: q, qps: zero}\n",
    )
    .unwrap();
    let event = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        matches!(&event, weir_rules::watch::Event::Rejected(e) if e.to_string().contains("rules.yaml:4:")),
        "{event:?}"
    );
    assert_eq!(passes(&r, "api", &ctx, 5), 0);
    // A good file is applied and keeps the counter (1 used of 3).
    std::fs::write(&path, one.replace("qps: 1", "qps: 3")).unwrap();
    let event = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        matches!(event, weir_rules::watch::Event::Applied),
        "{event:?}"
    );
    assert_eq!(passes(&r, "api", &ctx, 5), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn breaker_rules_take_every_breaker_parameter() {
    // Slow calls trip it; it opens 10 s, then 20 s after a failed probe (backoff 2).
    let (r, clock) = rules("resources:\n  - name: dep\n    breaker: {id: dep-breaker, window_calls: 4, min_calls: 4, error_ratio: 1.0, slow_ratio: 0.5, slow_call: 100ms, open_for: 10s, open_backoff: 2, max_open: 1m, max_probes: 1, successes_to_close: 1}\n");
    let ctx = Context::default();
    for slow in [false, false, true, true] {
        let g = r.entry("dep", &ctx).unwrap();
        clock.advance(Duration::from_millis(if slow { 150 } else { 10 }));
        g.complete(Outcome::Success);
    }
    let b = r.entry("dep", &ctx).err().unwrap();
    assert_eq!(b.kind, RuleKind::Breaker);
    assert_eq!(b.retry_after, Some(Duration::from_secs(10)));
    clock.advance(Duration::from_secs(10));
    r.entry("dep", &ctx).unwrap().complete(Outcome::Error);
    let b = r.entry("dep", &ctx).err().unwrap();
    assert_eq!(
        b.retry_after,
        Some(Duration::from_secs(20)),
        "exponential open"
    );
    // Impossible parameters are refused with the field path.
    let e = RuleSet::from_yaml(
        Path::new("r.yaml"),
        "resources:\n  - name: a\n    breaker: {id: b, window: 10s, window_calls: 5}\n",
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("r.yaml:3:14: resources[0].breaker: give window"),
        "{e}"
    );
    let e = RuleSet::from_yaml(
        Path::new("r.yaml"),
        "resources:\n  - name: a\n    breaker: {id: b, open_backoff: 0.5}\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("open_backoff must be ≥ 1"), "{e}");
}

#[test]
fn long_parameter_values_are_counted_under_a_bounded_digest() {
    let (r, _) = rules("resources:\n  - name: s\n    hot_params:\n      - {id: per-value, param: 0, threshold: 1, window: 1m, max_values: 100}\n");
    let long_a = "a".repeat(16 * 1024);
    let long_b = format!("{}b", "a".repeat(16 * 1024 - 1));
    let call = |v: &str| {
        r.entry(
            "s",
            &Context {
                params: &[v],
                ..Context::default()
            },
        )
        .map(|g| g.complete(Outcome::Success))
        .is_ok()
    };
    assert!(call(&long_a));
    assert!(!call(&long_a), "the same long value is the same key");
    assert!(call(&long_b), "a different long value is another key");
}

#[test]
fn calls_blocked_after_the_system_rule_record_no_completion() {
    let (r, clock) = rules("resources:\n  - name: api\n    flow:\n      - {id: one, qps: 1, window: 1m}\nsystem: {max_avg_rt: 50ms}\n");
    let ctx = Context::default();
    let g = r.entry("api", &ctx).unwrap();
    clock.advance(Duration::from_millis(40));
    g.complete(Outcome::Success);
    // Ten calls pass the system rule and are blocked by the flow rule: they never ran.
    for _ in 0..10 {
        assert_eq!(r.entry("api", &ctx).err().unwrap().rule.as_ref(), "one");
    }
    let g = r.entry("other", &ctx).unwrap();
    clock.advance(Duration::from_millis(100));
    g.complete(Outcome::Success);
    // Average of what ran: (40 + 100) / 2 = 70 ms > 50 ms (not diluted by ten 0 ms "calls").
    assert_eq!(
        r.entry("other", &ctx).err().unwrap().rule.as_ref(),
        "system:max_avg_rt"
    );
}

#[test]
fn a_switch_blocks_its_resource_first_and_run_time_states_survive_reloads() {
    let yaml = "resources:\n  - name: recs\n    switch: {id: recs-off}\n    authority: {id: recs-auth, allow: [web]}\n  - name: cart\n    switch: {id: cart-off, on: true}\n";
    let (r, _) = rules(yaml);
    let web = from("web");
    assert!(r.entry("recs", &web).is_ok(), "off by default");
    let b = r.entry("cart", &web).err().unwrap();
    assert_eq!((b.kind, &*b.rule), (RuleKind::Switch, "cart-off"));
    // On at run time: blocked before any other rule (an unknown origin would be refused by
    // the authority rule; the switch answers first).
    r.set_switch("recs-off", true).unwrap();
    let b = r.entry("recs", &from("mobile")).err().unwrap();
    assert_eq!(b.kind, RuleKind::Switch);
    assert_eq!(r.stats("recs-off").unwrap().blocks, 1);
    assert_eq!(r.stats("recs-auth").unwrap().blocks, 0);
    // A reload of the same file keeps the run-time state; the file's own `on` for a switch
    // never set at run time applies.
    r.set_switch("cart-off", false).unwrap();
    r.apply(&set(yaml)).unwrap();
    assert!(r.entry("recs", &web).is_err());
    assert!(r.entry("cart", &web).is_ok());
    let states: Vec<(String, bool, Option<bool>, bool)> = r
        .switches()
        .into_iter()
        .map(|s| (s.id, s.file, s.run_time, s.effective))
        .collect();
    assert_eq!(
        states,
        [
            ("cart-off".to_string(), true, Some(false), false),
            ("recs-off".to_string(), false, Some(true), true)
        ]
    );
    // Cleared: back to the file.
    r.clear_switch("cart-off").unwrap();
    assert!(r.entry("cart", &web).is_err());
    assert!(r.set_switch("nope", true).is_err());
    // States restored at start apply, also to switches a later file adds.
    let (r2, _) = rules("resources:\n  - name: recs\n");
    r2.restore_switches(&r.switch_overrides());
    r2.apply(&set(yaml)).unwrap();
    assert!(r2.entry("recs", &web).is_err());
    let snap = r2.snapshot();
    let recs = snap.resource("recs").unwrap();
    assert_eq!(recs.blocked_by[RuleKind::Switch as usize], 1);
}
