//! Allocation of one resource among 10 000 clients (goal: < 1 ms), all in one band and spread
//! over the four bands, and in a 3-level hierarchy (org ⊃ 10 teams ⊃ 100 users each ⊃ 10
//! clients each); and a lease client's local decision next to weir-core's plain GCRA (goal
//! ≤ 1.2 ×). `cargo bench -p weir-quota --bench allocate`.

// criterion_group! defines an undocumented function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use weir_core::Criticality;
use weir_quota::{allocate, Demand, Division};

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
            b.iter(|| allocate(total * 0.6, Division::FairShare, &d, &mut out).unwrap())
        });
    }
    // org 60 % of demand ⊃ 10 teams (each capped at an eighth of the org) ⊃ 100 users (each
    // capped at a fiftieth of its team) ⊃ 10 clients each.
    let d = demands(10_000, true);
    let total: f64 = d.iter().map(|x| x.wants).sum();
    let org = total * 0.6;
    let teams: Vec<weir_quota::hierarchy::Node> = d
        .chunks(1_000)
        .map(|team| {
            let users = team
                .chunks(10)
                .map(|user| {
                    weir_quota::hierarchy::Node::group(
                        org / 8.0 / 50.0,
                        user.iter()
                            .map(|x| weir_quota::hierarchy::Node::Leaf(*x))
                            .collect(),
                    )
                })
                .collect();
            weir_quota::hierarchy::Node::group(org / 8.0, users)
        })
        .collect();
    let root = weir_quota::hierarchy::Node::group(org, teams);
    let tree = weir_quota::hierarchy::Tree::new(&root).unwrap();
    g.bench_function("three_levels", |b| b.iter(|| tree.allocate()));
    g.bench_function("three_levels_with_checks", |b| {
        b.iter(|| weir_quota::hierarchy::allocate_tree(&root).unwrap())
    });
    g.finish();

    // Local decisions: both at 1e6 units/s so nearly every call is admitted, the same `now`
    // sequence for both (virtual time, no clock read).
    let mut g = c.benchmark_group("decision");
    let client =
        weir_quota::ResourceClient::new("r", weir_quota::ClientConfig::default(), 1e6, 1, 0);
    let gcra = weir_core::limiter::Limiter::with_clock(
        weir_core::gcra::Gcra::new(
            weir_core::Quota::new(1_000_000, std::time::Duration::from_secs(1)).unwrap(),
            10_000,
        )
        .unwrap(),
        weir_core::MonotonicClock::new(),
    );
    let mut t = 0u64;
    g.bench_function("plain_gcra", |b| {
        b.iter(|| {
            t += 1_000;
            gcra.acquire_at(1, t)
        })
    });
    let mut t = 0u64;
    g.bench_function("lease_client", |b| {
        b.iter(|| {
            t += 1_000;
            client.acquire(1, t)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
