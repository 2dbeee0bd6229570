//! Allocation of one resource among 10 000 clients (goal: < 1 ms), all in one band and spread
//! over the four bands. `cargo bench -p weir-quota --bench allocate`.

use criterion::{criterion_group, criterion_main, Criterion};
use weir_core::Criticality;
use weir_quota::{allocate, Algorithm, Demand};

fn demands(n: usize, bands: bool) -> Vec<Demand> {
    // A fixed, irregular spread of demands and weights (no RNG dependency).
    (0..n)
        .map(|i| Demand {
            wants: ((i * 7919) % 1000) as f64 / 10.0,
            weight: 1.0 + ((i * 31) % 5) as f64,
            priority: if bands {
                Criticality::ALL[i % 4]
            } else {
                Criticality::Critical
            },
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("allocate_10k");
    for (name, bands) in [("one_band", false), ("four_bands", true)] {
        let d = demands(10_000, bands);
        let total: f64 = d.iter().map(|x| x.wants).sum();
        let mut out = Vec::with_capacity(d.len());
        g.bench_function(name, |b| {
            b.iter(|| allocate(total * 0.6, Algorithm::FairShare, &d, &mut out).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
