//! The pass path of `Rules::entry` + `Guard::complete`: `cargo bench -p weir-rules --bench entry`.
//! `no_rules`: a resource without rules (the fixed cost of asking); `flow_qps`: one rate rule
//! (GCRA, never reached); `flow_qps_concurrency_breaker`: rate + concurrency + breaker;
//! `hot_param_pass`: a hot-parameter rule, value under its limit. The block path:
//! `blocked_flow` (a rate rule far over its limit), `blocked_hot_param` (a value over its
//! limit: counted by kind and recorded in the rule's heavy-hitter sketch). For
//! reference: a weir-core `Limiter` alone, a `KeyedLimiter` hit with key "k", and with key ""
//! (an empty `String` key costs ≈ 75 ns more: glibc's AVX-512 memcmp of length 0 on a dangling
//! pointer — why flow rules use a non-empty key).

// criterion_group! defines an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use weir_core::stats::Outcome;
use weir_rules::config::RuleSet;
use weir_rules::engine::{Context, Rules};

fn entry(c: &mut Criterion) {
    let set = RuleSet::from_yaml(
        Path::new("bench.yaml"),
        "resources:
  - name: qps
    flow:
      - {id: qps, qps: 1000000000, algorithm: gcra}
  - name: all
    flow:
      - {id: all-qps, qps: 1000000000}
      - {id: all-inflight, concurrency: 1000000}
    breaker: {id: all-breaker, preset: resilience4j}
  - name: hot
    hot_params:
      - {id: hot-user, param: 0, threshold: 1000000000, algorithm: gcra}
  - name: over
    flow:
      - {id: over-qps, qps: 1, algorithm: gcra}
  - name: hot-over
    hot_params:
      - {id: hot-over-user, param: 0, threshold: 1, window: 1h, algorithm: gcra}
",
    )
    .unwrap();
    let rules = Rules::new(&set).unwrap();
    let ctx = Context::default();
    let mut g = c.benchmark_group("entry");
    for (name, resource) in [
        ("no_rules", "none"),
        ("flow_qps", "qps"),
        ("flow_qps_concurrency_breaker", "all"),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                rules
                    .entry(black_box(resource), &ctx)
                    .unwrap()
                    .complete(Outcome::Success)
            })
        });
    }
    let user = Context {
        params: &["user-42"],
        ..Context::default()
    };
    g.bench_function("hot_param_pass", |b| {
        b.iter(|| {
            rules
                .entry(black_box("hot"), &user)
                .unwrap()
                .complete(Outcome::Success)
        })
    });
    let _ = rules.entry("over", &ctx);
    g.bench_function("blocked_flow", |b| {
        b.iter(|| rules.entry(black_box("over"), &ctx).is_err())
    });
    let _ = rules.entry("hot-over", &user);
    g.bench_function("blocked_hot_param", |b| {
        b.iter(|| rules.entry(black_box("hot-over"), &user).is_err())
    });
    // The limiter alone, for reference.
    let keyed: weir_core::KeyedLimiter<String, weir_core::Gcra> = weir_core::KeyedLimiter::new(
        weir_core::Gcra::from_quota(weir_core::Quota::per_second(1_000_000_000).unwrap()).unwrap(),
        1,
    )
    .unwrap();
    g.bench_function("keyed_limiter_alone", |b| {
        b.iter(|| keyed.acquire(black_box(""), 1))
    });
    let keyed_k: weir_core::KeyedLimiter<String, weir_core::Gcra> = weir_core::KeyedLimiter::new(
        weir_core::Gcra::from_quota(weir_core::Quota::per_second(1_000_000_000).unwrap()).unwrap(),
        1_000,
    )
    .unwrap();
    g.bench_function("keyed_limiter_k_1000", |b| {
        b.iter(|| keyed_k.acquire(black_box("k"), 1))
    });
    g.bench_function("keyed_limiter_empty_1000", |b| {
        b.iter(|| keyed_k.acquire(black_box(""), 1))
    });
    g.bench_function("keyed_limiter_k_1", |b| {
        b.iter(|| keyed.acquire(black_box("k"), 1))
    });
    let single = weir_core::Limiter::new(
        weir_core::Gcra::from_quota(weir_core::Quota::per_second(1_000_000_000).unwrap()).unwrap(),
    );
    g.bench_function("limiter_alone", |b| b.iter(|| single.acquire(1)));
    g.finish();
}

criterion_group!(benches, entry);
criterion_main!(benches);
