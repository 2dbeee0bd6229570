//! Nested max-min (`weir_quota::hierarchy`) against an independent oracle on random trees —
//! depth ≤ 4, ≤ 200 leaves, weights, all four priorities, capacities below and above demand:
//! the oracle recurses over the tree as given (no flattening) and finds each group's water
//! level per band by bisection; and the defining properties are checked on the answer itself
//! (no group over its capacity, no leaf over its demand, each group's grant in a band all
//! given out or every child served, and no unserved child below a sibling's level).

use proptest::prelude::*;
use weir_core::Criticality;
use weir_quota::hierarchy::{allocate_tree, Node};
use weir_quota::Demand;

const BANDS: [Criticality; 4] = [
    Criticality::CriticalPlus,
    Criticality::Critical,
    Criticality::SheddablePlus,
    Criticality::Sheddable,
];

fn band_of(p: Criticality) -> usize {
    BANDS.iter().position(|b| *b == p).unwrap()
}

/// What `node` can use per band: leaves their demand, groups the sum capped band by band.
fn usable(node: &Node) -> [f64; 4] {
    match node {
        Node::Leaf(d) => {
            let mut u = [0.0; 4];
            u[band_of(d.priority)] = d.wants;
            u
        }
        Node::Group {
            capacity, children, ..
        } => {
            let mut u = [0.0; 4];
            for c in children {
                for (a, b) in u.iter_mut().zip(usable(c)) {
                    *a += b;
                }
            }
            let mut left = *capacity;
            for x in &mut u {
                *x = x.min(left);
                left = (left - *x).max(0.0);
            }
            u
        }
    }
}

fn weight(node: &Node) -> f64 {
    match node {
        Node::Leaf(d) => d.weight,
        Node::Group { weight, .. } => *weight,
    }
}

/// Divides `grant` among children using `uses` at `weights` by bisection on the level.
fn bisect(grant: f64, uses: &[f64], weights: &[f64]) -> Vec<f64> {
    let total: f64 = uses.iter().sum();
    if total <= grant {
        return uses.to_vec();
    }
    let given = |level: f64| -> f64 {
        uses.iter()
            .zip(weights)
            .map(|(u, w)| u.min(level * w))
            .sum()
    };
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while given(hi) < grant {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if given(mid) < grant {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    uses.iter()
        .zip(weights)
        .map(|(u, w)| u.min(hi * w))
        .collect()
}

/// The oracle: leaves' shares, depth first, for `node` granted `grant` per band.
fn oracle(node: &Node, grant: [f64; 4], out: &mut Vec<f64>) {
    match node {
        Node::Leaf(_) => out.push(grant.iter().sum()),
        Node::Group { children, .. } => {
            let uses: Vec<[f64; 4]> = children.iter().map(usable).collect();
            let weights: Vec<f64> = children.iter().map(weight).collect();
            let mut per_child = vec![[0.0; 4]; children.len()];
            for b in 0..4 {
                let band_uses: Vec<f64> = uses.iter().map(|u| u[b]).collect();
                for (c, g) in bisect(grant[b], &band_uses, &weights)
                    .into_iter()
                    .enumerate()
                {
                    per_child[c][b] = g;
                }
            }
            for (c, g) in children.iter().zip(per_child) {
                oracle(c, g, out);
            }
        }
    }
}

/// Checks the defining properties on `shares`; answers the leaves' grants per band of
/// `node` and moves `next` past its leaves.
fn check(node: &Node, shares: &[f64], next: &mut usize, tol: f64) -> [f64; 4] {
    match node {
        Node::Leaf(d) => {
            let s = shares[*next];
            *next += 1;
            assert!(
                s >= -tol && s <= d.wants + tol,
                "leaf over its demand: {s} > {}",
                d.wants
            );
            let mut g = [0.0; 4];
            g[band_of(d.priority)] = s;
            g
        }
        Node::Group {
            capacity, children, ..
        } => {
            let got: Vec<[f64; 4]> = children
                .iter()
                .map(|c| check(c, shares, next, tol))
                .collect();
            let uses: Vec<[f64; 4]> = children.iter().map(usable).collect();
            let mut sum = [0.0; 4];
            for g in &got {
                for (a, b) in sum.iter_mut().zip(g) {
                    *a += b;
                }
            }
            let total: f64 = sum.iter().sum();
            assert!(
                total <= capacity + tol,
                "group over its capacity: {total} > {capacity}"
            );
            for b in 0..4 {
                // Max-min among siblings in band b: an unserved child is at the highest level.
                let level = |c: usize| got[c][b] / weight(&children[c]);
                for c in 0..children.len() {
                    if got[c][b] + tol < uses[c][b] {
                        for d in 0..children.len() {
                            assert!(
                                level(d) <= level(c) + tol,
                                "band {b}: an unserved child at level {} below a sibling's {}",
                                level(c),
                                level(d)
                            );
                        }
                    }
                }
            }
            sum
        }
    }
}

fn leaf() -> impl Strategy<Value = Node> {
    (
        0.0f64..100.0,
        prop::sample::select(vec![0.5, 1.0, 1.0, 2.0, 3.0]),
        0usize..4,
    )
        .prop_map(|(wants, weight, p)| {
            Node::Leaf(Demand {
                wants: if wants < 5.0 { 0.0 } else { wants },
                weight,
                priority: BANDS[p],
            })
        })
}

fn tree() -> impl Strategy<Value = Node> {
    leaf().prop_recursive(4, 200, 8, |inner| {
        (
            prop_oneof![Just(f64::INFINITY), 0.0f64..500.0, 0.0f64..50.0],
            prop::sample::select(vec![1.0, 1.0, 2.0, 0.25]),
            prop::collection::vec(inner, 0..8),
        )
            .prop_map(|(capacity, weight, children)| Node::Group {
                capacity,
                weight,
                children,
            })
    })
}

fn root() -> impl Strategy<Value = Node> {
    (0.0f64..2000.0, prop::collection::vec(tree(), 1..8)).prop_map(|(capacity, children)| {
        Node::Group {
            capacity,
            weight: 1.0,
            children,
        }
    })
}

fn leaves(node: &Node) -> usize {
    match node {
        Node::Leaf(_) => 1,
        Node::Group { children, .. } => children.iter().map(leaves).sum(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn nested_max_min_matches_the_oracle(root in root()) {
        prop_assume!(leaves(&root) <= 200);
        let shares = allocate_tree(&root).unwrap();
        let mut want = Vec::new();
        oracle(&root, usable(&root), &mut want);
        prop_assert_eq!(shares.len(), want.len());
        let scale = 1e-7 * (1.0 + want.iter().sum::<f64>());
        for (i, (s, w)) in shares.iter().zip(&want).enumerate() {
            prop_assert!((s - w).abs() <= scale, "leaf {}: {} vs oracle {}", i, s, w);
        }
        let mut next = 0;
        let total = check(&root, &shares, &mut next, scale);
        // Work-conserving: the root gives out all it can use.
        let can: f64 = usable(&root).iter().sum();
        prop_assert!((total.iter().sum::<f64>() - can).abs() <= scale);
    }
}
