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
        "resources[0].flow[1].cost: cost needs qps, behavior reject and no relate",
        "resources[0].flow[2].cost: cost needs qps",
        "resources[0].hot_params[0].cost.estimate: must be ≥ 1",
    ] {
        assert!(e.contains(want), "{want} not in\n{e}");
    }
}
