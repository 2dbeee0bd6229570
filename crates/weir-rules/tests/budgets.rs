//! Calendar budgets through `Rules::entry`, on a manual wall clock set to real dates: a
//! monthly budget resets at midnight in its own time zone (Berlin and New York an instant
//! apart), counts costs and settlements, survives a restart and a reload, and a soft budget
//! admits past its limit while marking and counting the calls.

use std::path::Path;
use std::sync::Arc;

use weir_core::stats::Outcome;
use weir_core::ManualClock;
use weir_rules::config::RuleSet;
use weir_rules::engine::{Context, Rules};
use weir_rules::metrics::RuleKind;

/// Sets `clock` to the instant `rfc3339`.
fn set(clock: &ManualClock, rfc3339: &str) {
    let t: jiff::Timestamp = rfc3339.parse().unwrap();
    clock.set(u64::try_from(t.as_nanosecond()).unwrap());
}

fn rules_at(yaml: &str, when: &str) -> (Rules<Arc<ManualClock>>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(0));
    set(&clock, when);
    let set = RuleSet::from_yaml(Path::new("budgets.yaml"), yaml).unwrap();
    let r = Rules::with_clocks(&set, clock.clone(), clock.clone()).unwrap();
    (r, clock)
}

const MONTHLY: &str = "resources:
  - name: chat
    budgets:
      - {id: berlin-month, param: 0, limit: 1000, resets: {every: month, tz: Europe/Berlin},
         cost: {estimate: 100, max: 1000}}
  - name: report
    budgets:
      - {id: ny-month, param: 0, limit: 1000, resets: {every: month, tz: America/New_York},
         cost: {estimate: 100, max: 1000}}
";

fn call(user: &str, cost: u64) -> Context<'_> {
    // Leaks one slice per call: a test's handful.
    let params: &'static [&'static str] =
        Box::leak(vec![&*Box::leak(user.into())].into_boxed_slice());
    Context {
        params,
        cost: Some(cost),
        ..Context::default()
    }
}

/// Spends `n` of `user`'s budget on `resource` (held and settled to `n`).
fn spend(r: &Rules<Arc<ManualClock>>, resource: &str, user: &str, n: u64) -> Result<(), String> {
    match r.entry(resource, &call(user, n)) {
        Ok(mut g) => {
            g.settle_cost(n);
            g.complete(Outcome::Success);
            Ok(())
        }
        Err(b) => Err(format!(
            "{} {:?} retry {:?} r={:?}",
            b.rule, b.kind, b.retry_after, b.remaining
        )),
    }
}

#[test]
fn a_month_ends_at_midnight_in_each_budgets_own_time_zone() {
    // 23:30 in Berlin on 30 November is 17:30 in New York.
    let (r, clock) = rules_at(MONTHLY, "2026-11-30T22:30:00Z");
    spend(&r, "chat", "ann", 1000).unwrap();
    spend(&r, "report", "ann", 1000).unwrap();
    let Err(b) = r.entry("chat", &call("ann", 1)) else {
        panic!("admitted past the budget")
    };
    assert_eq!((b.kind, &*b.rule), (RuleKind::Flow, "berlin-month"));
    // Retry at Berlin's midnight: 30 minutes; RateLimit-Policy's window is November (30 days).
    assert_eq!(b.retry_after.unwrap().as_secs(), 1_800);
    assert_eq!(
        b.rate,
        Some((1000, std::time::Duration::from_secs(30 * 86_400)))
    );
    assert_eq!(b.remaining.map(|r| r.get()), Some(0));
    // One second before Berlin's midnight: still refused.
    set(&clock, "2026-11-30T22:59:59Z");
    assert!(spend(&r, "chat", "ann", 1).is_err());
    // Berlin's December began; New York's November goes on for six more hours.
    set(&clock, "2026-11-30T23:00:00Z");
    spend(&r, "chat", "ann", 1000).unwrap();
    let Err(ny) = r.entry("report", &call("ann", 1)) else {
        panic!("admitted past the budget")
    };
    assert_eq!(ny.retry_after.unwrap().as_secs(), 6 * 3_600);
    set(&clock, "2026-12-01T04:59:59Z");
    assert!(spend(&r, "report", "ann", 1).is_err());
    set(&clock, "2026-12-01T05:00:00Z");
    spend(&r, "report", "ann", 1000).unwrap();
    // Another user was never held back by ann.
    spend(&r, "chat", "bob", 900).unwrap();
}

#[test]
fn estimates_are_settled_in_the_month_they_were_held_in() {
    let (r, clock) = rules_at(MONTHLY, "2026-11-30T22:50:00Z");
    // Holds 800, uses 200: 600 come back in November.
    let mut g = r.entry("chat", &call("ann", 800)).unwrap();
    g.settle_cost(200);
    g.complete(Outcome::Success);
    spend(&r, "chat", "ann", 800).unwrap();
    assert!(spend(&r, "chat", "ann", 1).is_err());
    // A stream held in November that ends in December using more than it held: the excess
    // counts in December (nothing lost), its estimate does not come back to December.
    let mut long = {
        set(&clock, "2026-11-30T22:55:00Z");
        // November is full for ann: use another user.
        r.entry("chat", &call("cat", 100)).unwrap()
    };
    set(&clock, "2026-11-30T23:10:00Z");
    long.settle_cost(700);
    long.complete(Outcome::Success);
    spend(&r, "chat", "cat", 400).unwrap();
    assert!(
        spend(&r, "chat", "cat", 1).is_err(),
        "600 of the stream + 400"
    );
}

#[test]
fn counts_survive_a_restart_and_a_reload_within_their_month() {
    let (r, clock) = rules_at(MONTHLY, "2026-11-20T12:00:00Z");
    spend(&r, "chat", "ann", 900).unwrap();
    spend(&r, "report", "bob", 10).unwrap();
    let saved = r.budget_counts();
    assert_eq!(saved.len(), 2, "{saved:?}");
    // A new process a day later takes them back.
    set(&clock, "2026-11-21T12:00:00Z");
    let set_ = RuleSet::from_yaml(Path::new("budgets.yaml"), MONTHLY).unwrap();
    let again = Rules::with_clocks(&set_, clock.clone(), clock.clone()).unwrap();
    assert_eq!(again.restore_budgets(&saved), 2);
    assert!(spend(&again, "chat", "ann", 101).is_err());
    spend(&again, "chat", "ann", 100).unwrap();
    // A reload with a larger limit keeps the month's count.
    let bigger = RuleSet::from_yaml(
        Path::new("budgets.yaml"),
        &MONTHLY.replacen("limit: 1000", "limit: 1500", 1),
    )
    .unwrap();
    again.apply(&bigger).unwrap();
    spend(&again, "chat", "ann", 500).unwrap();
    assert!(spend(&again, "chat", "ann", 1).is_err());
    // Counts saved in November are dropped by a process started in December.
    set(&clock, "2026-12-02T00:00:00Z");
    let december = Rules::with_clocks(&set_, clock.clone(), clock.clone()).unwrap();
    assert_eq!(december.restore_budgets(&saved), 0);
}

const SOFT: &str = "resources:
  - name: chat
    budgets:
      - {id: team-day, limit: 100, mode: soft, warn: [0.5, 1.0],
         resets: {every: day, at: '06:00', tz: America/New_York}}
";

#[test]
fn a_soft_budget_admits_past_its_limit_and_marks_and_counts_it() {
    let (r, clock) = rules_at(SOFT, "2026-11-27T12:00:00Z");
    for i in 0..150 {
        let g = r.entry("chat", &Context::default()).unwrap();
        assert_eq!(
            g.over_budget(),
            (i >= 100).then_some("team-day"),
            "call {i}"
        );
    }
    let s = r.stats("team-day").unwrap();
    assert_eq!((s.passes, s.blocks, s.over_budget), (150, 0, 50));
    // 50 % and 100 %: two thresholds, once each.
    assert_eq!(s.budget_warnings, 2);
    // 05:59 the next morning in New York (10:59 UTC): the same day; 06:00: a new one.
    set(&clock, "2026-11-28T10:59:00Z");
    assert!(r
        .entry("chat", &Context::default())
        .unwrap()
        .over_budget()
        .is_some());
    set(&clock, "2026-11-28T11:00:00Z");
    assert!(r
        .entry("chat", &Context::default())
        .unwrap()
        .over_budget()
        .is_none());
}

#[test]
fn bad_budgets_are_refused_where_they_say_so() {
    let e = RuleSet::from_yaml(
        Path::new("b.yaml"),
        "resources:\n  - name: x\n    budgets:\n      - {id: m, limit: 0, resets: {every: month, tz: Mars/Olympus, at: '25:00'}, warn: [1.5, 0]}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("budgets[0].warn[1]: 0: a fraction of the limit in (0, 10]"),
        "{e}"
    );
    let e = RuleSet::from_yaml(
        Path::new("b.yaml"),
        "resources:\n  - name: x\n    budgets:\n      - {id: m, limit: 0, resets: {every: fortnight}}\n      - {id: n, limit: 5, resets: {every: day, tz: Mars/Olympus}}\n      - {id: o, limit: 5, resets: {every: day, at: '25:00'}}\n      - {id: p, limit: 5, resets: {every: day, on: friday}}\n",
    )
    .unwrap_err()
    .to_string();
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 4, "{e}");
    assert!(
        lines[0].contains("budgets[0].resets.every: unknown value `fortnight`"),
        "{e}"
    );
    assert!(
        lines[1].contains("budgets[1].resets.tz: \"Mars/Olympus\" is not a time zone"),
        "{e}"
    );
    assert!(
        lines[2].contains("budgets[2].resets.at: \"25:00\": a local time of day HH:MM"),
        "{e}"
    );
    assert!(
        lines[3].contains("budgets[3].resets.on: applies to every: week only"),
        "{e}"
    );
}

#[test]
fn the_calendar_budget_example_of_the_docs_is_a_valid_rule_file() {
    let doc = include_str!("../../../docs/cost.md");
    let section = doc.split("## Calendar budgets").nth(1).unwrap();
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap();
    let set = RuleSet::from_yaml(Path::new("docs/cost.md"), yaml).unwrap();
    assert_eq!(set.resources[0].budgets.len(), 2);
}
