//! The per-second history dashboards read, fed by a real rule set on a manual clock.

mod support;

use std::time::Duration;

use support::rules;
use weir_core::stats::Outcome;
use weir_rules::engine::Context;
use weir_rules::history::History;

fn user(u: &str) -> Vec<&str> {
    vec![u]
}

#[test]
fn seconds_split_blocks_by_kind_and_track_breakers_and_heavy_values() {
    let (r, clock) = rules(
        "resources:
  - name: api
    flow:
      - {id: api-qps, qps: 5}
    hot_params:
      - {id: per-user, param: 0, threshold: 2, window: 1m}
    breaker: {id: api-breaker, window_calls: 4, min_calls: 4, error_ratio: 0.5, open_for: 10s}
  - name: other
    flow:
      - {id: other-shadow, qps: 1, shadow: true}
",
    );
    let mut h = History::new(3);
    h.record_snapshot(100, r.snapshot());
    // The baseline names every resource, with no seconds yet.
    let known: Vec<(&str, usize)> = h.resources().map(|(n, ring)| (n, ring.count())).collect();
    assert_eq!(known, [("api", 0), ("other", 0)]);
    // Second 101: mallory is held at 2 by the hot-parameter rule, then the flow rule (5/s)
    // stops everyone.
    let mut outcomes = Vec::new();
    for u in [
        "mallory", "mallory", "mallory", "mallory", "ann", "bob", "cy",
    ] {
        let params = user(u);
        let ctx = Context {
            params: &params,
            ..Context::default()
        };
        outcomes.push(match r.entry("api", &ctx) {
            Ok(g) => {
                clock.advance(Duration::from_millis(4));
                g.complete(Outcome::Success);
                "pass"
            }
            Err(b) => b.kind.as_str(),
        });
    }
    assert_eq!(
        outcomes,
        [
            "pass",
            "pass",
            "hot_param",
            "hot_param",
            "pass",
            "pass",
            "pass"
        ]
    );
    let ctx = Context {
        params: &["dan"],
        ..Context::default()
    };
    assert_eq!(r.entry("api", &ctx).err().unwrap().kind.as_str(), "flow");
    for _ in 0..3 {
        let _ = r
            .entry("other", &Context::default())
            .map(|g| g.complete(Outcome::Success));
    }
    h.record_snapshot(101, r.snapshot());

    let p = h.points_since("api", 0);
    assert_eq!(p.len(), 1);
    let p = p[0];
    assert_eq!((p.t, p.passed, p.blocked), (101, 5, 3));
    assert_eq!((p.blocked_by.hot_param, p.blocked_by.flow), (2, 1));
    assert_eq!(p.in_flight, 0);
    // Every call took 4 ms: both quantiles in the (2.5, 5] ms bucket.
    assert!((2.5..=5.0).contains(&p.p50_ms), "{}", p.p50_ms);
    assert!((2.5..=5.0).contains(&p.p99_ms), "{}", p.p99_ms);
    let o = h.points_since("other", 0)[0];
    assert_eq!((o.passed, o.blocked, o.blocked_by.shadow), (3, 0, 2));

    let snap = r.snapshot();
    let heavy = &snap.heavy[0];
    assert_eq!(heavy.rule, "per-user");
    assert_eq!(
        (heavy.top[0].value.as_str(), heavy.top[0].count),
        ("mallory", 2)
    );

    // Second 102: four errors open the breaker; the next call is blocked by it.
    clock.advance(Duration::from_secs(1));
    for _ in 0..4 {
        let params = user("eve");
        let ctx = Context {
            params: &params,
            ..Context::default()
        };
        if let Ok(g) = r.entry("api", &ctx) {
            g.complete(Outcome::Error);
        }
    }
    let params = user("fay");
    let b = r
        .entry(
            "api",
            &Context {
                params: &params,
                ..Context::default()
            },
        )
        .err()
        .unwrap();
    assert_eq!(b.kind.as_str(), "breaker");
    h.record_snapshot(102, r.snapshot());
    let p = *h.points_since("api", 101).last().unwrap();
    assert_eq!((p.t, p.errors, p.blocked_by.breaker), (102, 2, 1));
    assert_eq!(p.blocked_by.hot_param, 2, "eve's third and fourth call");
    let track = h.breakers().next().unwrap();
    assert_eq!((track.rule.as_str(), track.state), ("api-breaker", "open"));
    assert_eq!(track.transitions.len(), 1);
    assert_eq!(
        (
            track.transitions[0].t,
            track.transitions[0].from,
            track.transitions[0].to
        ),
        (102, "closed", "open")
    );

    // The ring keeps 3 seconds; a second recorded twice counts once.
    h.record_snapshot(102, r.snapshot());
    h.record_snapshot(103, r.snapshot());
    h.record_snapshot(104, r.snapshot());
    let ts: Vec<u64> = h.points_since("api", 0).iter().map(|p| p.t).collect();
    assert_eq!(ts, [102, 103, 104]);
    assert_eq!(h.points_since("api", 103).len(), 1);

    // A resource that leaves the rule set leaves the history.
    r.apply(&support::set("resources:\n  - name: api\n"))
        .unwrap();
    h.record_snapshot(105, r.snapshot());
    let names: Vec<&str> = h.resources().map(|(n, _)| n).collect();
    assert_eq!(names, ["api"]);
    assert_eq!(h.breakers().count(), 0);
}

/// Idle seconds are not stored (a large rule set costs nothing per idle resource) but read
/// back as zeros, and the window is kept by time.
#[test]
fn idle_seconds_cost_nothing_and_read_back_as_zeros() {
    use weir_rules::metrics::ResourceSnapshot;
    let snap = |name: String, passes: u64| ResourceSnapshot {
        name,
        passes,
        completed: passes,
        ..ResourceSnapshot::default()
    };
    let mut h = History::new(5);
    let many = |busy: u64| {
        (0..20_000)
            .map(|i| snap(format!("r{i:05}"), if i == 7 { busy } else { 0 }))
            .collect::<Vec<_>>()
    };
    h.record(100, many(0), &[]);
    // r00007 passes 3 calls in second 102 and 1 in second 106; the others never.
    for (t, busy) in [(101, 0), (102, 3), (103, 3), (104, 3), (105, 3), (106, 4)] {
        h.record(t, many(busy), &[]);
    }
    let stored: usize = h.resources().map(|(_, ring)| ring.count()).sum();
    assert_eq!(stored, 2, "only r00007's two busy seconds are stored");
    let passed: Vec<(u64, u32)> = h
        .points_since("r00007", 0)
        .iter()
        .map(|p| (p.t, p.passed))
        .collect();
    assert_eq!(
        passed,
        [(102, 3), (103, 0), (104, 0), (105, 0), (106, 1)],
        "the last 5 seconds, idle ones as zeros"
    );
    assert_eq!(h.points_since("r19999", 104).len(), 2);
    assert!(h.points_since("r19999", 0).iter().all(|p| p.is_idle()));
    // Second 102 leaves the window at 107: so does its stored point.
    h.record(107, many(4), &[]);
    assert_eq!(
        h.resources().map(|(_, ring)| ring.count()).sum::<usize>(),
        1
    );
    assert!(h.points_since("nobody", 0).is_empty());
}

#[test]
fn a_sampler_reads_only_what_changed_and_records_the_same_seconds() {
    let text = (0..50)
        .map(|i| format!("  - name: r{i:02}\n    flow:\n      - {{id: f{i:02}, qps: 1000}}\n"))
        .collect::<String>();
    let (r, clock) = rules(&format!("resources:\n{text}"));
    let (mut full, mut changed) = (History::new(10), History::new(10));
    // The first changed snapshot has every resource (the baseline).
    let first = r.changed_snapshot();
    assert_eq!(first.resources.len(), 50);
    full.record_snapshot(100, r.snapshot());
    changed.record_changed(100, first.resources, &first.breakers);
    // Nothing happened: nothing to read.
    assert!(r.changed_snapshot().resources.is_empty());
    let ctx = Context::default();
    let mut held = None;
    for t in 101..=104u64 {
        // r07 gets calls every second; r31 one call that stays in flight from second 102.
        for _ in 0..t - 100 {
            r.entry("r07", &ctx).unwrap().complete(Outcome::Success);
        }
        if t == 102 {
            held = Some(r.entry("r31", &ctx).unwrap());
        }
        clock.advance(Duration::from_secs(1));
        let snap = r.changed_snapshot();
        let names: Vec<&str> = snap.resources.iter().map(|s| s.name.as_str()).collect();
        let expected: &[&str] = if t >= 102 { &["r07", "r31"] } else { &["r07"] };
        assert_eq!(names, expected, "second {t}");
        full.record_snapshot(t, r.snapshot());
        changed.record_changed(t, snap.resources, &snap.breakers);
    }
    drop(held);
    for name in ["r00", "r07", "r31"] {
        assert_eq!(
            full.points_since(name, 0),
            changed.points_since(name, 0),
            "{name}"
        );
    }
    assert_eq!(changed.points_since("r31", 0)[2].in_flight, 1);
    // A resource that left the rule set leaves the history.
    changed.retain(|n| n != "r07", |_| true);
    assert!(changed.points_since("r07", 0).is_empty());
    assert_eq!(changed.resources().count(), 49);
}
