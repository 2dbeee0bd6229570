//! Rules with `cost:` on a manual clock: a call holds its estimate on every such rule that
//! admits it, `Guard::settle_cost` corrects it to the actual cost, a call a later rule blocks
//! gives its estimates back, and files that cannot settle are refused where they say so.

use std::path::Path;

use weir_core::stats::Outcome;
use weir_rules::config::RuleSet;
use weir_rules::engine::Context;

mod support;
use support::rules;

const TOKENS: &str = "resources:
  - name: llm
    flow:
      - {id: tokens, qps: 1000, window: 1m, algorithm: gcra, cost: {estimate: 100}}
";

fn costing(n: u64) -> Context<'static> {
    Context {
        cost: Some(n),
        ..Context::default()
    }
}

#[test]
fn estimates_are_held_and_settled_to_the_actual_cost() {
    let (r, _clock) = rules(TOKENS);
    let mut first = r.entry("llm", &costing(500)).unwrap();
    // 500 held: 600 more do not fit the 1 000 the burst allows.
    assert!(r.entry("llm", &costing(600)).is_err());
    // It cost 100: 400 come back, and 600 fit.
    first.settle_cost(100);
    first.complete(Outcome::Success);
    let mut second = r.entry("llm", &costing(600)).unwrap();
    // A call stating nothing holds the rule's estimate (100): 300 left.
    let third = r.entry("llm", &Context::default()).unwrap();
    drop(third); // never settled: its estimate stays
    assert!(r.entry("llm", &costing(301)).is_err());
    // 600 held, 2 000 used: a debt; nothing passes.
    second.settle_cost(2_000);
    second.settle_cost(0); // once only
    assert!(r.entry("llm", &costing(1)).is_err());
}

#[test]
fn per_user_budgets_and_estimates_given_back_when_another_rule_blocks() {
    let (r, clock) = rules(
        "resources:
  - name: llm
    hot_params:
      - {id: per-user, param: 0, threshold: 100, window: 1m, algorithm: fixed_window, cost: {estimate: 10, max: 80}}
    flow:
      - {id: calls, qps: 2, window: 1s, algorithm: fixed_window}
",
    );
    let user = |name: &'static [&'static str], n| Context {
        params: name,
        cost: Some(n),
        ..Context::default()
    };
    // An estimate above `max` counts as 80; bob's budget is his own.
    let mut a = r.entry("llm", &user(&["ann"], 500)).unwrap();
    a.settle_cost(500); // an actual cost above `max` counts as 80 too
    a.complete(Outcome::Success);
    r.entry("llm", &user(&["bob"], 60))
        .unwrap()
        .complete(Outcome::Success);
    // `calls` has used its 2 this second: ann's next call passes her rule (80 + 10), is
    // blocked by `calls`, and the 10 her rule held come back.
    let Err(blocked) = r.entry("llm", &user(&["ann"], 10)) else {
        panic!("admitted past `calls`")
    };
    assert_eq!(&*blocked.rule, "calls");
    clock.advance(std::time::Duration::from_millis(1_100));
    // Next second: ann has 20 left of her 100 per minute, not 10.
    let g = r.entry("llm", &user(&["ann"], 20)).unwrap();
    g.complete(Outcome::Success);
    let Err(over) = r.entry("llm", &user(&["ann"], 1)) else {
        panic!("admitted past ann's budget")
    };
    assert_eq!(&*over.rule, "per-user");
}

#[test]
fn rules_that_cannot_settle_are_refused_where_they_say_so() {
    let bad = "resources:
  - name: llm
    flow:
      - {id: a, qps: 10, cost: {estimate: 1}}
      - {id: b, qps: 10, algorithm: gcra, behavior: pace, cost: {}}
      - {id: c, concurrency: 3, cost: {}}
    hot_params:
      - {id: h, param: 0, threshold: 5, algorithm: gcra, cost: {estimate: 0, max: 3}}
";
    let e = RuleSet::from_yaml(Path::new("rules.yaml"), bad)
        .unwrap_err()
        .to_string();
    for want in [
        "resources[0].flow[0].cost: cost needs algorithm gcra, token_bucket or fixed_window",
        "resources[0].flow[1].cost: cost needs qps (or cluster), behavior reject and no relate",
        "resources[0].flow[2].cost: cost needs qps",
        "resources[0].hot_params[0].cost.estimate: must be ≥ 1",
    ] {
        assert!(e.contains(want), "{want} not in\n{e}");
    }
}

#[test]
fn cost_sources_are_one_per_resource_and_well_formed() {
    let good = "resources:
  - name: llm
    hot_params:
      - {id: per-user, param: 0, threshold: 100, algorithm: gcra,
         cost: {estimate: 10, estimate_from: {json: max_tokens}, actual_from: {sse: usage.total_tokens}}}
    flow:
      - {id: all, qps: 1000, algorithm: gcra, cost: {actual_from: {sse: usage.total_tokens}}}
";
    let set = RuleSet::from_yaml(Path::new("rules.yaml"), good).expect("valid");
    let sources = set.resources[0].cost_sources();
    assert_eq!(
        sources.estimate,
        Some(weir_rules::config::EstimateFrom::Json("max_tokens".into()))
    );
    assert_eq!(
        sources.actual,
        Some(weir_rules::config::ActualFrom::Sse(
            "usage.total_tokens".into()
        ))
    );
    let bad = "resources:
  - name: llm
    flow:
      - {id: a, qps: 10, algorithm: gcra, cost: {estimate_from: {header: x-max-tokens}, actual_from: {trailer: 'bad name'}}}
      - {id: b, qps: 10, algorithm: gcra, cost: {estimate_from: {json: max_tokens}, actual_from: {json: 'usage..total'}}}
      - {id: c, qps: 10, algorithm: gcra, cost: {actual_from: {sse: usage.total_tokens}}}
";
    let e = RuleSet::from_yaml(Path::new("rules.yaml"), bad)
        .unwrap_err()
        .to_string();
    for want in [
        "resources[0].flow[0].cost.actual_from: \"bad name\" is not a header name",
        "resources[0].flow[1].cost.estimate_from: the cost rules of one resource read the same estimate_from",
        "resources[0].flow[1].cost.actual_from: \"usage..total\" is not a header name or dotted JSON field",
        "resources[0].flow[2].cost.actual_from: the cost rules of one resource read the same actual_from",
    ] {
        assert!(e.contains(want), "{want} not in\n{e}");
    }
    let unknown = "resources:
  - name: llm
    flow:
      - {id: a, qps: 10, algorithm: gcra, cost: {actual_from: {body: x}}}
";
    let e = RuleSet::from_yaml(Path::new("rules.yaml"), unknown)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rules.yaml:4"), "{e}");
}

/// The budget a response reports and the resource's cost counters: admitted, refunded, owed
/// and the heaviest spenders by what they were charged.
#[test]
fn budgets_and_cost_counters() {
    let (r, _clock) = rules(
        "resources:
  - name: llm
    hot_params:
      - {id: per-user, param: 0, threshold: 1000, window: 1m, algorithm: fixed_window, cost: {estimate: 100}}
    flow:
      - {id: all, qps: 5000, window: 1m, algorithm: fixed_window, cost: {estimate: 100}}
",
    );
    let call = |user: &'static [&'static str], n| Context {
        params: user,
        cost: Some(n),
        ..Context::default()
    };
    let mut a = r.entry("llm", &call(&["ann"], 300)).unwrap();
    let budget = a.budget().expect("a budget").clone();
    assert_eq!(&*budget.rule, "per-user");
    assert_eq!((budget.limit, budget.remaining), (1000, 700));
    assert_eq!(budget.window, std::time::Duration::from_secs(60));
    assert!(a.holds_cost());
    a.settle_cost(100); // 200 back
    assert!(!a.holds_cost());
    a.complete(Outcome::Success);
    let mut b = r.entry("llm", &call(&["bob"], 100)).unwrap();
    b.settle_cost(400); // 300 owed
    drop(b);
    let c = r.entry("llm", &call(&["ann"], 50)).unwrap();
    c.complete(Outcome::Success); // never settled: 50
                                  // Blocked by the per-user rule after nothing was held: not counted.
    assert!(r.entry("llm", &call(&["ann"], 2_000)).is_err());
    let snap = r.snapshot();
    let cost = &snap.resource("llm").expect("llm").cost;
    assert_eq!((cost.admitted, cost.refunded, cost.owed), (450, 200, 300));
    let top: Vec<(&str, u64)> = cost
        .top
        .iter()
        .map(|h| (h.value.as_str(), h.count))
        .collect();
    assert_eq!(top, [("bob", 400), ("ann", 150)]);
}

#[test]
fn a_cost_source_names_one_place() {
    for (source, want) in [
        (
            "estimate_from: {sse: x}",
            "give exactly one of header, json",
        ),
        (
            "actual_from: {header: a, json: b}",
            "give exactly one of header, trailer, json, sse",
        ),
    ] {
        let yaml = format!(
            "resources:\n  - name: llm\n    flow:\n      - {{id: a, qps: 10, algorithm: gcra, cost: {{{source}}}}}\n"
        );
        let e = RuleSet::from_yaml(Path::new("rules.yaml"), &yaml)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want) && e.contains("rules.yaml:4"), "{e}");
    }
}

/// A lease's local limiter, as weir-quota's lease client keeps one per resource: a GCRA at the
/// granted rate.
struct Lease(weir_core::gcra::RetunableGcra);

impl weir_rules::engine::ClusterQuota for Lease {
    fn acquire_at(
        &self,
        resource: &str,
        n: u64,
        now: weir_core::Nanos,
    ) -> Option<weir_core::Decision> {
        (resource == "tokens").then(|| self.0.acquire_at(n, now))
    }

    fn settle_at(
        &self,
        resource: &str,
        held: weir_core::cost::Held,
        actual: u64,
        now: weir_core::Nanos,
    ) {
        if resource == "tokens" {
            self.0.settle_at(held, actual, now);
        }
    }
}

/// A cluster rule counts costs in its lease (units are costs), and on its own safe capacity
/// before any lease.
#[test]
fn cluster_rules_count_costs_in_their_lease() {
    let (r, _clock) = rules(
        "resources:
  - name: llm
    flow:
      - {id: shared-tokens, cluster: {resource: tokens, safe: 100}, cost: {estimate: 10}}
",
    );
    // Not leased yet: the safe capacity (100/s, 10 ms of burst: at least 2 units).
    assert!(r.entry("llm", &costing(50)).is_err());
    let mut g = r.entry("llm", &costing(2)).unwrap();
    g.settle_cost(0);
    g.complete(Outcome::Success);
    // Leased: 1 000 a second, a second's burst.
    let gcra = weir_core::Gcra::new(
        weir_core::Quota::new(1_000, std::time::Duration::from_secs(1)).unwrap(),
        1_000,
    )
    .unwrap();
    r.set_cluster(Lease(weir_core::gcra::RetunableGcra::new(gcra)));
    let mut g = r.entry("llm", &costing(900)).unwrap();
    assert!(r.entry("llm", &costing(200)).is_err());
    g.settle_cost(100);
    g.complete(Outcome::Success);
    assert!(
        r.entry("llm", &costing(850)).is_ok(),
        "800 given back to the lease"
    );
    assert!(r.entry("llm", &costing(100)).is_err());
}

/// A stated estimate below the floor (`min`, by default the rule's `estimate` when clients
/// state estimates) holds the floor:
/// `max_tokens: 0` is never a free peek, so the calls one key runs at once are bounded by its
/// budget, and its excesses — the debt a shared rule makes everyone wait out — with them.
#[test]
fn estimates_below_the_floor_hold_the_floor() {
    let file = |min: &str| {
        format!(
            "resources:
  - name: chat
    hot_params:
      - {{id: tokens-per-user, param: 0, threshold: 10000, window: 1m, algorithm: gcra, burst: 2000,
         cost: {{estimate: 500, max: 4000, estimate_from: {{json: max_tokens}}{min}}}}}
    flow:
      - {{id: all-tokens, qps: 20000, window: 1m, algorithm: gcra, burst: 4000,
         cost: {{estimate: 500, max: 4000, estimate_from: {{json: max_tokens}}{min}}}}}
"
        )
    };
    let user = |name: &'static [&'static str], n| Context {
        params: name,
        cost: Some(n),
        ..Context::default()
    };
    let (r, clock) = rules(&file(""));
    // 50 calls stating 0 at once: 4 fit eve's burst (500 each).
    let admitted: Vec<_> = (0..50)
        .filter_map(|_| r.entry("chat", &user(&["eve"], 0)).ok())
        .collect();
    assert_eq!(admitted.len(), 4);
    // Each used 4 000: 14 000 owed, on eve's rule and on all-tokens.
    for mut g in admitted {
        g.settle_cost(4_000);
        g.complete(Outcome::Success);
    }
    // Everyone waits out eve's excess on all-tokens: 14 000 at 20 000 a minute (42 s) less
    // the burst's tolerance (12 s), from a rule 6 s ahead — about 37.5 s, not 588.
    assert!(r.entry("chat", &user(&["ann"], 500)).is_err());
    clock.advance(std::time::Duration::from_secs(37));
    assert!(r.entry("chat", &user(&["ann"], 500)).is_err());
    clock.advance(std::time::Duration::from_secs(1));
    r.entry("chat", &user(&["ann"], 500))
        .expect("ann admitted once eve's excess is paid")
        .complete(Outcome::Success);
    // A file that trusts its callers says so: `min: 1`.
    let (r, _) = rules(&file(", min: 1"));
    let n = (0..50)
        .filter_map(|_| r.entry("chat", &user(&["eve"], 0)).ok())
        .count();
    assert_eq!(n, 50);
    // `min: 0` would make a call a free peek: refused.
    let e = RuleSet::from_yaml(Path::new("r.yaml"), &file(", min: 0")).unwrap_err();
    assert!(e.to_string().contains("min"), "{e}");
}

/// `estimate: learned`: once 16 calls settled, a call holds the 95th percentile of what recent
/// calls cost (capped by what it states), never less than the median — not the `max_tokens`
/// clients state at 10 × what they use. Before that, what it states.
#[test]
fn learned_estimates_hold_what_calls_cost_not_what_they_state() {
    let (r, clock) = rules(
        "resources:
  - name: chat
    hot_params:
      - {id: per-user, param: 0, threshold: 10000, window: 1m, algorithm: gcra, burst: 2000,
         cost: {estimate: learned, max: 4000, estimate_from: {json: max_tokens}}}
",
    );
    let pause = |s| clock.advance(std::time::Duration::from_secs(s));
    let call = |n| Context {
        params: &["ann"],
        cost: Some(n),
        ..Context::default()
    };
    // Nothing learned: a call stating 1 500 holds 1 500, so two do not fit the burst.
    let first = r.entry("chat", &call(1_500)).unwrap();
    assert_eq!(first.budget().unwrap().remaining, 500);
    assert!(r.entry("chat", &call(1_500)).is_err());
    let mut first = first;
    first.settle_cost(100);
    first.complete(Outcome::Success);
    // 16 calls stating 1 500 settle at 100–250.
    for i in 0..16u64 {
        pause(2);
        let mut g = r.entry("chat", &call(1_500)).unwrap();
        g.settle_cost(100 + i * 10);
        g.complete(Outcome::Success);
    }
    pause(60);
    // Learned: median 170, 95th percentile 250 (of the 17 so far). A call stating 1 500 holds
    // 250, one stating 50 holds the median: seven calls at once where one fitted before.
    let held: Vec<_> = (0..7)
        .map(|_| r.entry("chat", &call(1_500)).unwrap())
        .collect();
    assert_eq!(held[0].budget().unwrap().remaining, 2_000 - 250);
    let cheap = r.entry("chat", &call(50)).unwrap();
    assert_eq!(
        cheap.budget().unwrap().remaining,
        2_000 - 7 * 250 - 170,
        "a call stating less than the median holds the median"
    );
}
