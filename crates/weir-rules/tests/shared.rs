//! Rules with `shared: true`: two rule sets standing for two processes count one budget in a
//! shared store (here weir-core's keyed limiter, the same counters weir-redis keeps in Redis),
//! estimates of `cost:` rules held and settled there; a refusal gives back what the call held;
//! without a store the rules count locally.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Waker};

use weir_core::cost::Held;
use weir_core::rate::KeyedRate;
use weir_core::{Decision, ManualClock};
use weir_rules::engine::{Context, Guard};
use weir_rules::shared::{Deciding, SharedHeld, SharedRule, SharedStore};

mod support;
use support::rules;

/// One rule's counters in the store.
type Counters = Arc<KeyedRate<Arc<ManualClock>>>;

/// A store every "process" shares: one keyed limiter per rule, on its own (still) clock.
#[derive(Clone, Default)]
struct Store(Arc<parking_lot::Mutex<std::collections::HashMap<String, Counters>>>);

impl Store {
    fn limiter(&self, rule: &SharedRule) -> Counters {
        self.0
            .lock()
            .entry(rule.name.clone())
            .or_insert_with(|| {
                Arc::new(KeyedRate::new(&rule.spec, 1_000, Arc::new(ManualClock::new(0))).unwrap())
            })
            .clone()
    }
}

impl SharedStore for Store {
    fn acquire<'a>(
        &'a self,
        rule: &'a SharedRule,
        key: &'a str,
        n: u64,
        cost: bool,
    ) -> Deciding<'a> {
        let l = self.limiter(rule);
        let now = l.now();
        let d: Decision = l.acquire_at(key, n, now);
        let held = (cost && d.allowed()).then(|| {
            SharedHeld(Box::new(Held {
                estimate: n,
                taken: now,
            }))
        });
        Box::pin(std::future::ready((d, held)))
    }

    fn settle(&self, rule: &SharedRule, key: &str, held: SharedHeld, actual: u64) {
        if let Ok(h) = held.0.downcast::<Held>() {
            let l = self.limiter(rule);
            l.settle_at(key, *h, actual, l.now());
        }
    }
}

/// Runs a future that is ready at once (the store above never waits).
fn now<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut TaskContext::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the test store answers at once"),
    }
}

const RULES: &str = "resources:
  - name: llm
    hot_params:
      - {id: tokens-per-user, param: 0, threshold: 1000, window: 1h, algorithm: gcra, shared: true,
         cost: {estimate: 100}}
    flow:
      - {id: calls, qps: 3, window: 1h, algorithm: fixed_window, shared: true}
";

fn call<'a>(user: &'a [&'a str], n: u64) -> Context<'a> {
    Context {
        params: user,
        cost: Some(n),
        ..Context::default()
    }
}

/// The rule that refused a call on `r` (`None`: admitted).
fn refused(r: &support::R, ctx: &Context<'_>) -> Option<String> {
    enter(r, ctx).err()
}

/// Admits a call on `r`, its shared rules decided.
fn enter(r: &support::R, ctx: &Context<'_>) -> Result<Guard<Arc<ManualClock>>, String> {
    let mut g = r.entry("llm", ctx).map_err(|b| b.rule.to_string())?;
    assert!(g.has_shared());
    now(g.decide_shared()).map_err(|b| b.rule.to_string())?;
    Ok(g)
}

#[test]
fn two_processes_count_one_budget() {
    let store = Store::default();
    let (a, _) = rules(RULES);
    let (b, _) = rules(RULES);
    a.set_shared(store.clone());
    b.set_shared(store.clone());
    // a holds 800 of ann's 1 000; b cannot hold 300 more.
    let mut first = enter(&a, &call(&["ann"], 800)).unwrap();
    assert_eq!(
        refused(&b, &call(&["ann"], 300)).unwrap(),
        "tokens-per-user"
    );
    // It cost 100: 700 back, in the store, for b too.
    first.settle_cost(100);
    let second = enter(&b, &call(&["ann"], 850)).unwrap();
    // Three calls an hour between the two (the refused one never reached `calls`): the
    // fourth is refused, whichever process.
    drop(second);
    assert!(enter(&a, &call(&["bob"], 1)).is_ok());
    assert_eq!(refused(&b, &call(&["carl"], 1)).unwrap(), "calls");
    assert_eq!(b.snapshot().rule("calls").unwrap().blocks, 1);
}

#[test]
fn a_refusal_gives_back_what_the_call_held() {
    let store = Store::default();
    let (a, _) = rules(
        "resources:
  - name: llm
    hot_params:
      - {id: tokens-per-user, param: 0, threshold: 1000, window: 1h, algorithm: gcra, shared: true,
         cost: {estimate: 100}}
    flow:
      - {id: local-tokens, qps: 5000, window: 1h, algorithm: gcra, cost: {estimate: 100}}
      - {id: calls, qps: 1, window: 1h, algorithm: fixed_window, shared: true}
",
    );
    a.set_shared(store.clone());
    let first = enter(&a, &call(&["ann"], 600)).unwrap();
    first.complete(weir_core::stats::Outcome::Success);
    // The shared call rule refuses: the 300 held on tokens-per-user (shared) and on
    // local-tokens come back.
    assert_eq!(refused(&a, &call(&["ann"], 300)).unwrap(), "calls");
    let l = store.limiter(&SharedRule {
        name: "tokens-per-user".into(),
        spec: weir_core::rate::RateSpec::new(
            weir_core::rate::RateAlgorithm::Gcra,
            1000,
            std::time::Duration::from_secs(3600),
        ),
    });
    assert!(
        l.acquire_at("ann", 400, l.now()).allowed(),
        "the refused call's 600 came back"
    );
}

#[test]
fn without_a_store_shared_rules_count_locally() {
    let (a, _) = rules(RULES);
    let g = a.entry("llm", &call(&["ann"], 900)).unwrap();
    assert!(!g.has_shared());
    assert!(a.entry("llm", &call(&["ann"], 200)).is_err());
    drop(g);
    let e = weir_rules::config::RuleSet::from_yaml(
        std::path::Path::new("rules.yaml"),
        "resources:
  - name: x
    flow:
      - {id: a, concurrency: 2, shared: true}
    hot_params:
      - {id: h, param: 0, threshold: 5, shared: true, exceptions: {vip: 50}}
",
    )
    .unwrap_err()
    .to_string();
    for want in [
        "resources[0].flow[0].shared: a shared rule needs qps",
        "resources[0].hot_params[0].shared: a shared rule takes no exceptions",
    ] {
        assert!(e.contains(want), "{want} in\n{e}");
    }
}
