//! The lease table under random refreshes, releases and expiries on manual time: the sum of
//! unexpired grants never exceeds the capacity, grants never exceed fair shares or demands,
//! and with steady demands every client holds its exact fair share after two refresh rounds.

use proptest::prelude::*;
use weir_core::{Criticality, Nanos};
use weir_quota::{allocate, Algorithm, Ask, Demand, LeaseTable, ResourceConfig};

const S: Nanos = 1_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Refresh {
        client: usize,
        wants: u32,
        has_factor: u8,
    },
    Release {
        client: usize,
    },
    Wait {
        ms: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..12, 0u32..2000, 0u8..3).prop_map(|(client, wants, has_factor)| Op::Refresh { client, wants, has_factor }),
        1 => (0usize..12).prop_map(|client| Op::Release { client }),
        3 => (0u32..20_000).prop_map(|ms| Op::Wait { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn grants_never_sum_past_the_capacity(
        ops in prop::collection::vec(op(), 1..300),
        capacity in 0u32..5000,
        restarted in any::<bool>(),
    ) {
        let config = ResourceConfig { capacity: f64::from(capacity) / 10.0, ..ResourceConfig::default() };
        let mut now: Nanos = 1_000 * S;
        let mut t = if restarted { LeaseTable::new(config, now) } else { LeaseTable::resume(config, Vec::new()) };
        // What each client believes it holds (its last grant).
        let mut held = [0.0f64; 12];
        for op in ops {
            match op {
                Op::Refresh { client, wants, has_factor } => {
                    // A client may over-claim after a restart (has > what it was granted).
                    let has = held[client] * f64::from(has_factor);
                    // What it uses on its own: unbounded (an Envoy bucket), a rate, or unknown.
                    let safe = match client % 3 { 0 => f64::INFINITY, 1 => f64::from(wants) / 20.0, _ => 0.0 };
                    let ask = Ask { needs: None, wants: f64::from(wants) / 10.0, has, safe, weight: 1.0 + (client % 3) as f64, priority: Criticality::ALL[client % 4] };
                    let lease = t.refresh(&format!("c{client}"), ask, now).unwrap();
                    prop_assert!(lease.granted <= ask.wants + 1e-9);
                    // Learning: never more than the client holds or uses on its own.
                    if lease.learning {
                        prop_assert!(lease.granted <= has.max(safe) + 1e-9);
                    }
                    prop_assert!(lease.granted >= 0.0);
                    held[client] = lease.granted;
                }
                Op::Release { client } => {
                    t.release(&format!("c{client}"));
                    held[client] = 0.0;
                }
                Op::Wait { ms } => {
                    now += Nanos::from(ms) * 1_000_000;
                    t.expire(now);
                }
            }
            prop_assert!(t.outstanding() <= config.capacity + 1e-6, "{} > {}", t.outstanding(), config.capacity);
        }
    }
}

#[test]
fn steady_demands_converge_to_the_exact_fair_shares_within_two_rounds() {
    let config = ResourceConfig {
        capacity: 1000.0,
        ..ResourceConfig::default()
    };
    let wants = [100.0, 260.0, 400.0, 500.0, 50.0, 900.0];
    let demands: Vec<Demand> = wants.iter().map(|&w| Demand::new(w)).collect();
    let mut fair = Vec::new();
    allocate(1000.0, Algorithm::FairShare, &demands, &mut fair).unwrap();
    let mut t = LeaseTable::resume(config, Vec::new());
    let mut now: Nanos = S;
    let mut granted = vec![0.0; wants.len()];
    for round in 0..2 {
        for (i, &w) in wants.iter().enumerate() {
            let ask = Ask {
                has: granted[i],
                ..Ask::wants(w)
            };
            granted[i] = t.refresh(&format!("c{i}"), ask, now).unwrap().granted;
            assert!(t.outstanding() <= 1000.0 + 1e-9, "round {round}");
            now += S / 10;
        }
        now += 5 * S;
    }
    for (g, f) in granted.iter().zip(&fair) {
        assert!((g - f).abs() < 1e-9, "{granted:?} vs fair {fair:?}");
    }
}
