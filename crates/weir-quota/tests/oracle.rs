//! `fair_share` against an independent oracle: per band, the water level found by bisection
//! (Σ min(wants, level × weight) = what is left), on random inputs — 1 to 1000 clients,
//! weights, all four priorities, capacity below and above total demand — plus the max-min
//! property checked directly.

use proptest::prelude::*;
use weir_core::Criticality;
use weir_quota::{allocate, Demand, Division};

/// The oracle: a different, simple computation of the same definition.
fn oracle(capacity: f64, demands: &[Demand]) -> Vec<f64> {
    let mut shares = vec![0.0; demands.len()];
    let mut left = capacity;
    for band in [
        Criticality::CriticalPlus,
        Criticality::Critical,
        Criticality::SheddablePlus,
        Criticality::Sheddable,
    ] {
        let idx: Vec<usize> = (0..demands.len())
            .filter(|&i| demands[i].priority == band)
            .collect();
        let total: f64 = idx.iter().map(|&i| demands[i].wants).sum();
        if total <= left {
            for &i in &idx {
                shares[i] = demands[i].wants;
            }
            left -= total;
            continue;
        }
        let given = |level: f64| -> f64 {
            idx.iter()
                .map(|&i| demands[i].wants.min(level * demands[i].weight))
                .sum()
        };
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        while given(hi) < left {
            hi *= 2.0;
        }
        for _ in 0..200 {
            let mid = (lo + hi) / 2.0;
            if given(mid) < left {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        for &i in &idx {
            shares[i] = demands[i].wants.min(hi * demands[i].weight);
        }
        left = 0.0;
    }
    shares
}

fn priority(n: u8) -> Criticality {
    Criticality::ALL[usize::from(n % 4)]
}

prop_compose! {
    fn demands(max: usize)(
        raw in prop::collection::vec((0u32..10_000, 1u32..100, 0u8..4, any::<bool>()), 1..max)
    ) -> Vec<Demand> {
        raw.into_iter()
            .map(|(w, weight, p, zero)| Demand {
                wants: if zero && w % 7 == 0 { 0.0 } else { f64::from(w) / 10.0 },
                weight: f64::from(weight) / 10.0,
                priority: priority(p),
            })
            .collect()
    }
}

fn check(capacity: f64, d: &[Demand]) {
    let mut got = Vec::new();
    allocate(capacity, Division::FairShare, d, &mut got).unwrap();
    let want = oracle(capacity, d);
    let tolerance = 1e-6 * capacity.max(1.0);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance,
            "client {i}: {g} vs oracle {w} (capacity {capacity}, {} clients)",
            d.len()
        );
    }
    let total: f64 = got.iter().sum();
    let wanted: f64 = d.iter().map(|x| x.wants).sum();
    assert!(total <= capacity + tolerance, "{total} > {capacity}");
    assert!(
        (total - wanted.min(capacity)).abs() <= tolerance,
        "not work-conserving: {total} of {}",
        wanted.min(capacity)
    );
    for (i, x) in d.iter().enumerate() {
        assert!(
            got[i] <= x.wants + tolerance,
            "client {i} got more than it wants"
        );
        assert!(got[i] >= 0.0);
    }
    // Max-min: a client held below its demand has the highest share per weight of its band.
    for (i, a) in d.iter().enumerate() {
        if got[i] + tolerance >= a.wants {
            continue;
        }
        for (j, b) in d.iter().enumerate() {
            if b.priority == a.priority {
                assert!(
                    got[j] / b.weight <= got[i] / a.weight + tolerance,
                    "client {j} has more per weight than capped client {i}"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn fair_share_matches_the_oracle(d in demands(1000), fraction in 0.0f64..2.0) {
        let wanted: f64 = d.iter().map(|x| x.wants).sum();
        check(wanted * fraction, &d);
    }

    #[test]
    fn proportional_and_static_stay_within_capacity_and_wants(d in demands(300), fraction in 0.0f64..2.0) {
        let wanted: f64 = d.iter().map(|x| x.wants).sum();
        let capacity = wanted * fraction;
        for algorithm in [Division::ProportionalShare, Division::Static] {
            let mut got = Vec::new();
            allocate(capacity, algorithm, &d, &mut got).unwrap();
            let total: f64 = got.iter().sum();
            prop_assert!(total <= capacity * (1.0 + 1e-9) + 1e-9);
            for (g, x) in got.iter().zip(&d) {
                prop_assert!(*g <= x.wants + 1e-9 && *g >= 0.0);
            }
        }
    }
}

#[test]
fn the_seed_example_and_equal_demands_match_the_oracle() {
    let seed: Vec<Demand> = [2.0, 2.6, 4.0, 5.0].map(Demand::new).to_vec();
    check(10.0, &seed);
    check(10.0, &[Demand::new(3.0); 1000]);
    check(10.0, &[Demand::new(0.0); 3]);
    check(0.0, &seed);
    check(1e9, &seed);
}
