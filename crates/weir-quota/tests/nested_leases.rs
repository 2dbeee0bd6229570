//! Nested resources on the lease server (org ⊃ team ⊃ user): random families read from a
//! quota file (up to 4 levels, capacities and weights), clients refreshing, releasing and
//! going quiet on manual time. At every instant the leases in force under every group and
//! every leaf sum to at most its capacity; with steady demands every client holds its
//! nested max-min share (`hierarchy::allocate_tree`, itself checked against a bisection
//! oracle in `hierarchy.rs`) within three refresh rounds.

use std::collections::HashMap;
use std::path::Path;

use proptest::prelude::*;
use weir_core::{Criticality, Nanos};
use weir_quota::config::QuotaConfig;
use weir_quota::hierarchy::{allocate_tree, Node};
use weir_quota::server::{LeaseServer, Refusal};
use weir_quota::{Ask, Demand};

const S: Nanos = 1_000_000_000;
const CLIENTS: usize = 12;

/// A small deterministic generator (the test's own, so a seed names a case).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn frac(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() % 10_000) as f64 / 10_000.0
    }
}

/// One node of a generated family.
#[derive(Debug, Clone)]
struct Spec {
    path: String,
    capacity: f64,
    weight: f64,
    children: Vec<usize>,
}

/// A random family (nodes[0] the top) and its quota file.
fn family(seed: u64) -> (Vec<Spec>, String) {
    let mut rng = Rng(seed | 1);
    let mut nodes = vec![Spec {
        path: "org".into(),
        capacity: rng.frac(50.0, 2000.0).round(),
        weight: 1.0,
        children: Vec::new(),
    }];
    let mut yaml = format!(
        "resources:\n  - {{name: org, capacity: {}}}\n",
        nodes[0].capacity
    );
    // Breadth first, depth ≤ 4 (the top and three levels under it).
    let mut frontier = vec![(0usize, 1usize)];
    while let Some((p, depth)) = frontier.pop() {
        let n = 1 + rng.below(3) as usize;
        for k in 0..n {
            let capacity = (nodes[p].capacity * rng.frac(0.1, 1.0)).round().max(1.0);
            let weight = 1.0 + rng.below(3) as f64;
            let name = format!("n{k}");
            let path = format!("{}/{name}", nodes[p].path);
            yaml.push_str(&format!(
                "  - {{name: {name}, parent: '{}', capacity: {capacity}, weight: {weight}}}\n",
                nodes[p].path
            ));
            let id = nodes.len();
            nodes.push(Spec {
                path,
                capacity,
                weight,
                children: Vec::new(),
            });
            nodes[p].children.push(id);
            if depth < 3 && rng.below(2) == 0 {
                frontier.push((id, depth + 1));
            }
        }
    }
    (nodes, yaml)
}

fn leaves(nodes: &[Spec]) -> Vec<usize> {
    (0..nodes.len())
        .filter(|&i| nodes[i].children.is_empty())
        .collect()
}

/// A server past its learning (every earlier lease known to have lapsed).
fn server(yaml: &str) -> LeaseServer {
    let config = QuotaConfig::from_yaml(Path::new("q.yaml"), yaml).unwrap();
    let s = LeaseServer::new(config, 0);
    s.restore(Vec::new(), 0);
    s
}

/// Leases in force, per (client, leaf path): (granted, expires_at, lease id).
type InForce = HashMap<(usize, String), (f64, Nanos, u64)>;

/// Every node's leases in force sum to at most its capacity.
fn check_every_node(nodes: &[Spec], in_force: &InForce, now: Nanos) -> Result<(), TestCaseError> {
    for n in nodes {
        let prefix = format!("{}/", n.path);
        let sum: f64 = in_force
            .iter()
            .filter(|((_, leaf), (_, exp, _))| {
                *exp > now && (*leaf == n.path || leaf.starts_with(&prefix))
            })
            .map(|(_, (g, _, _))| g)
            .sum();
        prop_assert!(
            sum <= n.capacity + 1e-6,
            "{}: {sum} in force > capacity {}",
            n.path,
            n.capacity
        );
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Refresh {
        client: usize,
        wants: u32,
        needs: u8,
        band: u8,
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
        8 => (0usize..CLIENTS, 0u32..3000, 0u8..=10, 0u8..4).prop_map(|(client, wants, needs, band)| Op::Refresh { client, wants, needs, band }),
        1 => (0usize..CLIENTS).prop_map(|client| Op::Release { client }),
        3 => (0u32..20_000).prop_map(|ms| Op::Wait { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn no_group_and_no_leaf_is_ever_granted_past_its_capacity(
        seed in any::<u64>(),
        ops in prop::collection::vec(op(), 1..250),
    ) {
        let (nodes, yaml) = family(seed);
        let s = server(&yaml);
        let leaf_of: Vec<String> = {
            let l = leaves(&nodes);
            (0..CLIENTS).map(|c| nodes[l[c % l.len()]].path.clone()).collect()
        };
        let mut in_force: InForce = HashMap::new();
        let mut now: Nanos = S;
        for op in ops {
            match op {
                Op::Refresh { client, wants, needs, band } => {
                    let leaf = &leaf_of[client];
                    let key = (client, leaf.clone());
                    let (has, lease_id) = in_force
                        .get(&key)
                        .filter(|l| l.1 > now)
                        .map_or((0.0, 0), |l| (l.0, l.2));
                    let wants = f64::from(wants) / 10.0;
                    let ask = Ask {
                        wants,
                        needs: Some(wants * f64::from(needs) / 10.0),
                        has,
                        lease_id,
                        weight: 1.0 + (client % 3) as f64,
                        priority: Criticality::ALL[usize::from(band)],
                        ..Ask::wants(wants)
                    };
                    let lease = s.refresh(&format!("c{client}"), &[(leaf.clone(), ask)], now)
                        .pop()
                        .unwrap()
                        .unwrap();
                    prop_assert!(lease.granted <= wants + 1e-9);
                    in_force.insert(key, (lease.granted, lease.expires_at, lease.lease_id));
                }
                Op::Release { client } => {
                    let leaf = leaf_of[client].clone();
                    if let Some((_, _, id)) = in_force.remove(&(client, leaf.clone())) {
                        s.release(&format!("c{client}"), &[(leaf, id)]);
                    }
                }
                Op::Wait { ms } => now += Nanos::from(ms) * 1_000_000,
            }
            check_every_node(&nodes, &in_force, now)?;
        }
    }

    #[test]
    fn steady_demands_reach_the_nested_max_min_shares_within_three_rounds(seed in any::<u64>()) {
        let (nodes, yaml) = family(seed);
        let s = server(&yaml);
        let l = leaves(&nodes);
        let mut rng = Rng(seed.rotate_left(17) | 1);
        // Each client: its leaf, what it wants, its weight and band.
        let clients: Vec<(usize, Demand)> = (0..CLIENTS)
            .map(|c| {
                let d = Demand {
                    wants: rng.frac(0.0, 600.0).round(),
                    weight: 1.0 + rng.below(3) as f64,
                    priority: Criticality::ALL[rng.below(4) as usize],
                };
                (l[c % l.len()], d)
            })
            .collect();
        // The oracle's tree: the family's groups, each leaf a group over its clients.
        fn tree(nodes: &[Spec], i: usize, clients: &[(usize, Demand)], order: &mut Vec<usize>) -> Node {
            let children = if nodes[i].children.is_empty() {
                clients
                    .iter()
                    .enumerate()
                    .filter(|(_, (leaf, _))| *leaf == i)
                    .map(|(c, (_, d))| {
                        order.push(c);
                        Node::Leaf(*d)
                    })
                    .collect()
            } else {
                nodes[i].children.iter().map(|&c| tree(nodes, c, clients, order)).collect()
            };
            Node::Group { capacity: nodes[i].capacity, weight: nodes[i].weight, children }
        }
        let mut order = Vec::new();
        let shares = allocate_tree(&tree(&nodes, 0, &clients, &mut order)).unwrap();
        let mut want = vec![0.0; CLIENTS];
        for (c, share) in order.into_iter().zip(shares) {
            want[c] = share;
        }
        let mut held = vec![(0.0, 0u64); CLIENTS];
        let mut now = S;
        for _round in 0..3 {
            for (c, (leaf, d)) in clients.iter().enumerate() {
                let ask = Ask {
                    wants: d.wants,
                    has: held[c].0,
                    lease_id: held[c].1,
                    weight: d.weight,
                    priority: d.priority,
                    ..Ask::wants(d.wants)
                };
                let lease = s.refresh(&format!("c{c}"), &[(nodes[*leaf].path.clone(), ask)], now)
                    .pop()
                    .unwrap()
                    .unwrap();
                held[c] = (lease.granted, lease.lease_id);
                now += S / 5;
            }
            now += S;
        }
        for c in 0..CLIENTS {
            prop_assert!((held[c].0 - want[c]).abs() < 1e-6, "client {c}: {} vs {} ({held:?} vs {want:?})\n{yaml}", held[c].0, want[c]);
        }
    }
}

const ORG: &str = "resources:\n  - {name: org-acme, capacity: 1000/s}\n  - {name: 'team-*', parent: org-acme, capacity: 400/s}\n  - {name: 'user-*', parent: 'org-acme/team-*', capacity: 50/s}\n";

#[test]
fn what_a_user_is_refused_is_charged_to_no_ancestor() {
    let s = server(ORG);
    // bob asks for 500: his own capacity (50) refuses the rest; the team and the org count
    // only the 50 granted.
    let bob = s.refresh(
        "h1",
        &[("org-acme/team-a/user-bob".into(), Ask::wants(500.0))],
        S,
    );
    assert_eq!(bob[0].as_ref().unwrap().granted, 50.0);
    // Seven more users of team-a wanting 50 each: 350 fit beside bob's 50 in the team's 400.
    for u in 0..7 {
        let r = s.refresh(
            "h1",
            &[(format!("org-acme/team-a/user-{u}"), Ask::wants(50.0))],
            S,
        );
        assert_eq!(r[0].as_ref().unwrap().granted, 50.0, "user-{u}");
    }
    // The team is full: one more user gets nothing now, whatever it asks.
    let r = s.refresh(
        "h1",
        &[("org-acme/team-a/user-late".into(), Ask::wants(50.0))],
        S,
    );
    assert_eq!(r[0].as_ref().unwrap().granted, 0.0);
    // Another team is not affected.
    let r = s.refresh(
        "h2",
        &[("org-acme/team-b/user-bob".into(), Ask::wants(80.0))],
        S,
    );
    assert_eq!(r[0].as_ref().unwrap().granted, 50.0);
    let team_a: f64 = s
        .allocations(S)
        .iter()
        .filter(|a| a.resource.starts_with("org-acme/team-a/"))
        .map(|a| a.granted)
        .sum();
    assert_eq!(team_a, 400.0);
}

#[test]
fn groups_and_names_outside_the_tree_are_refused_clearly() {
    let s = server(ORG);
    let r = s.refresh(
        "h1",
        &[
            ("org-acme".into(), Ask::wants(1.0)),
            ("org-acme/team-a".into(), Ask::wants(1.0)),
            ("org-other/team-a/user-x".into(), Ask::wants(1.0)),
            ("org-acme/team-a/user-x/more".into(), Ask::wants(1.0)),
        ],
        S,
    );
    assert_eq!(r[0], Err(Refusal::Group("org-acme".into())));
    assert_eq!(r[1], Err(Refusal::Group("org-acme/team-a".into())));
    assert_eq!(
        r[2],
        Err(Refusal::UnknownResource("org-other/team-a/user-x".into()))
    );
    assert!(matches!(r[3], Err(Refusal::UnknownResource(_))));
    assert_eq!(
        r[0].as_ref().unwrap_err().to_string(),
        "resource \"org-acme\" is a group of nested resources: lease one under it (org-acme/…)"
    );
}

#[test]
fn a_family_survives_snapshots_reloads_and_releases() {
    let s = server(ORG);
    let bob = "org-acme/team-a/user-bob".to_string();
    let amy = "org-acme/team-a/user-amy".to_string();
    let lease = s.refresh("h1", &[(bob.clone(), Ask::wants(50.0))], S)[0]
        .clone()
        .unwrap();
    s.refresh("h2", &[(amy.clone(), Ask::wants(50.0))], S);
    // Resumed elsewhere: the team's grants still count against it.
    let other = LeaseServer::new(QuotaConfig::from_yaml(Path::new("q.yaml"), ORG).unwrap(), 0);
    other.restore(s.snapshot(2 * S), 0);
    let fill: Vec<f64> = (0..10)
        .map(|u| {
            other.refresh(
                "h3",
                &[(format!("org-acme/team-a/user-{u}"), Ask::wants(50.0))],
                S,
            )[0]
            .as_ref()
            .unwrap()
            .granted
        })
        .collect();
    assert_eq!(fill.iter().sum::<f64>(), 300.0, "{fill:?}");
    // A reload lowering the team to 120/s: no new grant until the team is under it.
    let lower = ORG.replace("400/s", "120/s");
    s.reload(QuotaConfig::from_yaml(Path::new("q.yaml"), &lower).unwrap());
    let r = s.refresh(
        "h4",
        &[("org-acme/team-a/user-new".into(), Ask::wants(50.0))],
        2 * S,
    );
    assert_eq!(r[0].as_ref().unwrap().granted, 20.0);
    // bob gives his lease back: its 50 are free for the team at once.
    assert_eq!(s.release("h1", &[(bob, lease.lease_id)]), vec![true]);
    let r = s.refresh(
        "h4",
        &[(
            "org-acme/team-a/user-new".into(),
            Ask {
                lease_id: s.lease_id_of("h4", "org-acme/team-a/user-new"),
                has: 20.0,
                ..Ask::wants(50.0)
            },
        )],
        3 * S,
    );
    assert_eq!(r[0].as_ref().unwrap().granted, 50.0);
}
