//! The lease table under random refreshes, releases and expiries on manual time, with an
//! adversary among the callers: whatever client ids and lease ids it sends, the grants in
//! force never sum past the capacity — a grant stops counting only when it lapses or when the
//! call that gives it back presents its lease id (which only its receiver knows). Grants
//! never exceed demands, and with steady demands every client holds its exact fair share
//! after two refresh rounds.

use proptest::prelude::*;
use weir_core::{Criticality, Nanos};
use weir_quota::{allocate, Ask, Demand, Division, LeaseTable, ResourceConfig};

const S: Nanos = 1_000_000_000;
/// Honest clients c0..c5; the adversary may use any of c0..c7.
const HONEST: usize = 6;
const IDS: usize = 8;

/// Which lease id the adversary presents.
#[derive(Debug, Clone, Copy)]
enum Proof {
    /// None (0).
    None,
    /// A guess.
    Guess(u64),
    /// The n-th (mod count) lease id it received itself.
    Own(usize),
}

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
    /// The adversary refreshes under any client id.
    Spoof {
        client: usize,
        wants: u32,
        has: u32,
        weight: u8,
        proof: Proof,
    },
    /// The adversary releases under any client id.
    SpoofRelease {
        client: usize,
        proof: Proof,
    },
    Wait {
        ms: u32,
    },
}

fn proof() -> impl Strategy<Value = Proof> {
    prop_oneof![
        Just(Proof::None),
        any::<u64>().prop_map(Proof::Guess),
        any::<usize>().prop_map(Proof::Own),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..HONEST, 0u32..2000, 0u8..3).prop_map(|(client, wants, has_factor)| Op::Refresh { client, wants, has_factor }),
        1 => (0usize..HONEST).prop_map(|client| Op::Release { client }),
        3 => (0usize..IDS, 0u32..3000, 0u32..3000, 1u8..255, proof()).prop_map(|(client, wants, has, weight, proof)| Op::Spoof { client, wants, has, weight, proof }),
        2 => (0usize..IDS, proof()).prop_map(|(client, proof)| Op::SpoofRelease { client, proof }),
        3 => (0u32..20_000).prop_map(|ms| Op::Wait { ms }),
    ]
}

/// A lease the table handed out: in force until it expires, unless its receiver gave it
/// back (a call presenting its id).
#[derive(Debug)]
struct Issued {
    client: String,
    lease_id: u64,
    granted: f64,
    expires_at: Nanos,
    given_back: bool,
}

/// Every lease handed out, and what the parties know.
#[derive(Default)]
struct World {
    issued: Vec<Issued>,
    /// Per honest client: its last grant and lease id.
    honest: [(f64, u64); HONEST],
    /// Lease ids the adversary received, with the client id it used.
    adversary: Vec<(usize, u64)>,
}

impl World {
    /// A call presenting `lease_id` for `client`: the receiver gives that lease back.
    fn presented(&mut self, client: &str, lease_id: u64) {
        if lease_id == 0 {
            return;
        }
        for i in &mut self.issued {
            if i.client == client && i.lease_id == lease_id {
                i.given_back = true;
            }
        }
    }

    fn issue(&mut self, client: &str, lease: &weir_quota::Lease) {
        self.issued.push(Issued {
            client: client.to_string(),
            lease_id: lease.lease_id,
            granted: lease.granted,
            expires_at: lease.expires_at,
            given_back: false,
        });
    }

    fn in_force(&self, now: Nanos) -> f64 {
        self.issued
            .iter()
            .filter(|i| !i.given_back && i.expires_at > now)
            .map(|i| i.granted)
            .sum()
    }

    fn proof(&self, p: Proof) -> u64 {
        match p {
            Proof::None => 0,
            Proof::Guess(g) => g,
            Proof::Own(n) if self.adversary.is_empty() => n as u64,
            Proof::Own(n) => self.adversary[n % self.adversary.len()].1,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn no_sequence_of_calls_makes_grants_sum_past_the_capacity(
        ops in prop::collection::vec(op(), 1..300),
        capacity in 0u32..5000,
        restarted in any::<bool>(),
    ) {
        let config = ResourceConfig { capacity: f64::from(capacity) / 10.0, ..ResourceConfig::default() };
        let mut now: Nanos = 1_000 * S;
        let mut t = if restarted { LeaseTable::new(config, now) } else { LeaseTable::resume(config, Vec::new()) };
        let mut w = World::default();
        for op in ops {
            match op {
                Op::Refresh { client, wants, has_factor } => {
                    let (held, lease_id) = w.honest[client];
                    // A client may over-claim after a restart (has > what it was granted).
                    let has = held * f64::from(has_factor);
                    // What it uses on its own: unbounded (an Envoy bucket), a rate, or unknown.
                    let safe = match client % 3 { 0 => f64::INFINITY, 1 => f64::from(wants) / 20.0, _ => 0.0 };
                    let ask = Ask { needs: None, wants: f64::from(wants) / 10.0, has, safe, weight: 1.0 + (client % 3) as f64, priority: Criticality::ALL[client % 4], lease_id, holds: None, term: 0 };
                    let name = format!("c{client}");
                    let lease = t.refresh(&name, ask, now).unwrap();
                    prop_assert!(lease.granted <= ask.wants + 1e-9);
                    // Learning: never more than the client holds or uses on its own.
                    if lease.learning {
                        prop_assert!(lease.granted <= has.max(safe) + 1e-9);
                    }
                    prop_assert!(lease.granted >= 0.0);
                    w.presented(&name, lease_id);
                    w.issue(&name, &lease);
                    w.honest[client] = (lease.granted, lease.lease_id);
                }
                Op::Release { client } => {
                    let name = format!("c{client}");
                    let (_, lease_id) = w.honest[client];
                    t.release(&name, lease_id);
                    w.presented(&name, lease_id);
                    w.honest[client] = (0.0, 0);
                }
                Op::Spoof { client, wants, has, weight, proof } => {
                    let lease_id = w.proof(proof);
                    let name = format!("c{client}");
                    let ask = Ask {
                        needs: None,
                        wants: f64::from(wants) / 10.0,
                        has: f64::from(has) / 10.0,
                        safe: f64::INFINITY,
                        weight: f64::from(weight),
                        priority: Criticality::CriticalPlus,
                        lease_id,
                        // Says it is a server with clients below: it never keeps more counted
                        // than it had.
                        holds: (weight % 2 == 0).then(|| f64::from(has) / 5.0),
                        // Claims to be a server in a failover group, in some term: an older
                        // term than the row has seen is refused and changes nothing.
                        term: u64::from(has % 3),
                    };
                    let lease = match t.refresh(&name, ask, now) {
                        Ok(l) => l,
                        Err(weir_quota::QuotaError::Superseded { got, newer }) => {
                            prop_assert!(got < newer && got > 0);
                            continue;
                        }
                        Err(e) => return Err(TestCaseError::fail(e.to_string())),
                    };
                    // Only the adversary's own leases can it give back.
                    if w.adversary.iter().any(|&(c, id)| c == client && id == lease_id) {
                        w.presented(&name, lease_id);
                    }
                    w.issue(&name, &lease);
                    w.adversary.push((client, lease.lease_id));
                }
                Op::SpoofRelease { client, proof } => {
                    let lease_id = w.proof(proof);
                    let name = format!("c{client}");
                    t.release(&name, lease_id);
                    if w.adversary.iter().any(|&(c, id)| c == client && id == lease_id) {
                        w.presented(&name, lease_id);
                    }
                }
                Op::Wait { ms } => {
                    now += Nanos::from(ms) * 1_000_000;
                    t.expire(now);
                }
            }
            prop_assert!(t.outstanding() <= config.capacity + 1e-6, "table: {} > {}", t.outstanding(), config.capacity);
            let in_force = w.in_force(now);
            prop_assert!(in_force <= config.capacity + 1e-6, "leases in force: {in_force} > {}", config.capacity);
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
    allocate(1000.0, Division::FairShare, &demands, &mut fair).unwrap();
    let mut t = LeaseTable::resume(config, Vec::new());
    let mut now: Nanos = S;
    let mut granted = vec![0.0; wants.len()];
    let mut ids = vec![0; wants.len()];
    for round in 0..2 {
        for (i, &w) in wants.iter().enumerate() {
            let ask = Ask {
                has: granted[i],
                lease_id: ids[i],
                ..Ask::wants(w)
            };
            let lease = t.refresh(&format!("c{i}"), ask, now).unwrap();
            (granted[i], ids[i]) = (lease.granted, lease.lease_id);
            assert!(t.outstanding() <= 1000.0 + 1e-9, "round {round}");
            now += S / 10;
        }
        now += 5 * S;
    }
    for (g, f) in granted.iter().zip(&fair) {
        assert!((g - f).abs() < 1e-9, "{granted:?} vs fair {fair:?}");
    }
}
