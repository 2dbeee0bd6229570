//! The pass path of `Rules::entry` + `Guard::complete`: `cargo bench -p weir-rules --bench entry`.
//! `no_rules`: a resource without rules (the fixed cost of asking); `flow_qps`: one rate rule
//! (sliding window, never reached); `flow_qps_concurrency_breaker`: rate + concurrency + breaker.

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
    g.finish();
}

criterion_group!(benches, entry);
criterion_main!(benches);
