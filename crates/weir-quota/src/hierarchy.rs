//! Nested quotas: an org's capacity shared by its teams, a team's by its users, a user's by
//! its clients — nested weighted max-min fairness with strict priority bands.
//!
//! A [`Tree`] is groups (a capacity and a weight among their siblings) over leaves (one
//! client's [`Demand`]: wants, weight, band). The division, exactly:
//!
//! 1. **What a node can use, per band** (bottom up): a leaf uses what it wants, in its band.
//!    A group adds up its children's use per band, then caps it by its capacity band by band,
//!    most critical first: `use[b] = min(Σ children's use[b], capacity − use of the bands
//!    before b)`.
//! 2. **What a node gets, per band** (top down): the root gets what it can use. A group
//!    divides what it got in band `b` among its children by weighted max-min (water-filling)
//!    on their use in band `b`: a child gets all it can use, or the level `λ·weight` that the
//!    band's grant reaches, whichever is less. A leaf's share is what it got.
//!
//! So a unit taken by a user is taken from its team and its org at once; no node ever gets
//! more than its capacity (its use is capped by it, its grant by its use); what a child cannot
//! use stays with its siblings (it never enters the parent's division); and a more critical
//! band anywhere under a group is served before a less critical one under the same group.
//! Pure, no I/O; `O(n log n)` in the number of nodes.

use crate::allocate::{Demand, QuotaError};

/// Most levels of groups over a leaf ([`Tree::new`] refuses deeper trees).
pub const MAX_DEPTH: usize = 16;

/// Bands, most critical first (index = `3 − Criticality::rank`).
const BANDS: usize = 4;

/// One node of a [`Tree`] as given: a group or a leaf.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// A group: `capacity` units per second (∞ for none) shared by `children`, weighed
    /// `weight` against its siblings.
    Group {
        /// Units per second the group's children take at most together.
        capacity: f64,
        /// Weight among the group's siblings (> 0).
        weight: f64,
        /// Groups and leaves under it.
        children: Vec<Node>,
    },
    /// One client's demand.
    Leaf(Demand),
}

impl Node {
    /// A group of `capacity` at weight 1.
    pub fn group(capacity: f64, children: Vec<Node>) -> Self {
        Node::Group {
            capacity,
            weight: 1.0,
            children,
        }
    }
}

/// A validated tree, its nodes in depth-first order.
#[derive(Debug, Clone)]
pub struct Tree {
    nodes: Vec<Flat>,
    leaves: usize,
}

#[derive(Debug, Clone)]
struct Flat {
    /// Children's indices (empty for a leaf).
    children: Vec<usize>,
    capacity: f64,
    weight: f64,
    /// Leaves: the band and what they want.
    leaf: Option<(usize, f64)>,
}

/// Why a tree is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TreeError {
    /// A leaf's demand (its index among the leaves, depth first).
    #[error("leaf {0}: {1}")]
    Leaf(usize, QuotaError),
    /// A group's capacity is negative or NaN.
    #[error("group {0}: capacity must be ≥ 0, got {1}")]
    Capacity(usize, f64),
    /// A group's weight is not a finite number > 0.
    #[error("group {0}: weight must be a finite number > 0, got {1}")]
    Weight(usize, f64),
    /// Groups nested deeper than [`MAX_DEPTH`].
    #[error("groups nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

impl Tree {
    /// Checks and flattens `root` (groups are numbered depth first in errors).
    pub fn new(root: &Node) -> Result<Self, TreeError> {
        let mut tree = Tree {
            nodes: Vec::new(),
            leaves: 0,
        };
        let mut groups = 0;
        tree.push(root, 0, &mut groups)?;
        Ok(tree)
    }

    fn push(&mut self, node: &Node, depth: usize, groups: &mut usize) -> Result<usize, TreeError> {
        if depth > MAX_DEPTH {
            return Err(TreeError::TooDeep);
        }
        let at = self.nodes.len();
        match node {
            Node::Leaf(d) => {
                let i = self.leaves;
                if !(d.wants.is_finite() && d.wants >= 0.0) {
                    let e = QuotaError::Wants {
                        client: i,
                        value: d.wants,
                    };
                    return Err(TreeError::Leaf(i, e));
                }
                if !(d.weight.is_finite() && d.weight > 0.0) {
                    let e = QuotaError::Weight {
                        client: i,
                        value: d.weight,
                    };
                    return Err(TreeError::Leaf(i, e));
                }
                self.leaves += 1;
                self.nodes.push(Flat {
                    children: Vec::new(),
                    capacity: f64::INFINITY,
                    weight: d.weight,
                    leaf: Some((3 - d.priority.rank(), d.wants)),
                });
            }
            Node::Group {
                capacity,
                weight,
                children,
            } => {
                let g = *groups;
                *groups += 1;
                if capacity.is_nan() || *capacity < 0.0 {
                    return Err(TreeError::Capacity(g, *capacity));
                }
                if !(weight.is_finite() && *weight > 0.0) {
                    return Err(TreeError::Weight(g, *weight));
                }
                self.nodes.push(Flat {
                    children: Vec::with_capacity(children.len()),
                    capacity: *capacity,
                    weight: *weight,
                    leaf: None,
                });
                for c in children {
                    let ci = self.push(c, depth + 1, groups)?;
                    self.nodes[at].children.push(ci);
                }
            }
        }
        Ok(at)
    }

    /// Leaves in the tree.
    pub fn leaves(&self) -> usize {
        self.leaves
    }

    /// Each leaf's share, depth first.
    pub fn allocate(&self) -> Vec<f64> {
        let n = self.nodes.len();
        if n == 0 {
            return Vec::new();
        }
        // 1. What each node can use per band, bottom up (children come after their parent).
        let mut usable = vec![[0.0f64; BANDS]; n];
        for i in (0..n).rev() {
            let node = &self.nodes[i];
            usable[i] = match node.leaf {
                Some((band, wants)) => {
                    let mut u = [0.0; BANDS];
                    u[band] = wants;
                    u
                }
                None => {
                    let mut sum = [0.0; BANDS];
                    for &c in &node.children {
                        for (s, u) in sum.iter_mut().zip(usable[c]) {
                            *s += u;
                        }
                    }
                    let mut left = node.capacity;
                    for s in &mut sum {
                        *s = s.min(left);
                        left = (left - *s).max(0.0);
                    }
                    sum
                }
            };
        }
        // 2. What each node gets per band, top down.
        let mut granted = vec![[0.0f64; BANDS]; n];
        granted[0] = usable[0];
        let mut shares = Vec::with_capacity(self.leaves);
        let mut order: Vec<(f64, usize)> = Vec::new();
        for i in 0..n {
            let node = &self.nodes[i];
            if node.leaf.is_some() {
                shares.push(granted[i].iter().sum());
                continue;
            }
            for band in 0..BANDS {
                let grant = granted[i][band];
                if grant <= 0.0 {
                    continue;
                }
                order.clear();
                order.extend(
                    node.children
                        .iter()
                        .map(|&c| (usable[c][band] / self.nodes[c].weight, c)),
                );
                order.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
                let mut left = grant;
                let mut weight_left: f64 = order.iter().map(|&(_, c)| self.nodes[c].weight).sum();
                for (k, &(_, c)) in order.iter().enumerate() {
                    let (want, w) = (usable[c][band], self.nodes[c].weight);
                    if want * weight_left <= left * w {
                        granted[c][band] = want;
                        left -= want;
                        weight_left -= w;
                        continue;
                    }
                    let level = left / weight_left;
                    for &(_, d) in &order[k..] {
                        granted[d][band] = level * self.nodes[d].weight;
                    }
                    break;
                }
            }
        }
        shares
    }
}

/// Each leaf's share of `root`, depth first ([`Tree::new`] then [`Tree::allocate`]).
pub fn allocate_tree(root: &Node) -> Result<Vec<f64>, TreeError> {
    Ok(Tree::new(root)?.allocate())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::Criticality;

    fn leaf(wants: f64) -> Node {
        Node::Leaf(Demand::new(wants))
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn org_teams_users() {
        // org 1000 ⊃ team-a 400 ⊃ users at most 50 each; team-b 400; team-c takes the rest.
        let user = |wants: f64| Node::group(50.0, vec![leaf(wants)]);
        let org = Node::group(
            1000.0,
            vec![
                Node::group(400.0, (0..10).map(|_| user(100.0)).collect()),
                Node::group(400.0, vec![user(30.0), user(500.0)]),
                Node::group(f64::INFINITY, vec![leaf(900.0)]),
            ],
        );
        let s = allocate_tree(&org).unwrap();
        // team-a: 10 users capped at 50 → 400 between them (40 each); team-b: 30 + 50;
        // team-c: 1000 − 400 − 80 = 520 (it wants 900).
        let mut want = vec![40.0; 10];
        want.extend([30.0, 50.0, 520.0]);
        assert!(close(&s, &want), "{s:?}");
        assert!((s.iter().sum::<f64>() - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn what_a_child_leaves_goes_to_its_siblings_first() {
        // The org splits evenly between two teams that can use more (500 each). Within
        // team-a, what its light user (10) leaves of the team's half goes to its heavy user,
        // not to team-b.
        let org = Node::group(
            1000.0,
            vec![
                Node::group(600.0, vec![leaf(10.0), leaf(1000.0)]),
                Node::group(1000.0, vec![leaf(1000.0)]),
            ],
        );
        let s = allocate_tree(&org).unwrap();
        assert!(close(&s, &[10.0, 490.0, 500.0]), "{s:?}");
    }

    #[test]
    fn bands_cross_groups() {
        let d = |wants, priority| {
            Node::Leaf(Demand {
                wants,
                weight: 1.0,
                priority,
            })
        };
        let org = Node::group(
            100.0,
            vec![
                Node::group(100.0, vec![d(80.0, Criticality::Sheddable)]),
                Node::group(
                    60.0,
                    vec![
                        d(50.0, Criticality::CriticalPlus),
                        d(50.0, Criticality::Critical),
                    ],
                ),
            ],
        );
        // CRITICAL_PLUS 50 first, then CRITICAL gets what team-b's capacity leaves (10),
        // SHEDDABLE the rest of the org (40).
        let s = allocate_tree(&org).unwrap();
        assert!(close(&s, &[40.0, 50.0, 10.0]), "{s:?}");
    }

    #[test]
    fn the_documented_example() {
        // docs/quota.md, "Nested quotas".
        let user = |wants| Node::group(50.0, vec![Node::Leaf(Demand::new(wants))]);
        let org = Node::group(
            1000.0,
            vec![
                Node::group(400.0, vec![user(30.0), user(500.0)]),
                Node::group(f64::INFINITY, vec![Node::Leaf(Demand::new(990.0))]),
            ],
        );
        assert_eq!(allocate_tree(&org).unwrap(), vec![30.0, 50.0, 920.0]);
    }

    #[test]
    fn bad_trees_are_refused() {
        let bad = Node::group(-1.0, vec![leaf(1.0)]);
        assert_eq!(allocate_tree(&bad), Err(TreeError::Capacity(0, -1.0)));
        let nan = Node::group(1.0, vec![leaf(f64::NAN)]);
        assert!(matches!(allocate_tree(&nan), Err(TreeError::Leaf(0, _))));
        let mut deep = leaf(1.0);
        for _ in 0..=MAX_DEPTH {
            deep = Node::group(1.0, vec![deep]);
        }
        assert_eq!(allocate_tree(&deep), Err(TreeError::TooDeep));
        assert_eq!(allocate_tree(&Node::group(5.0, vec![])), Ok(vec![]));
    }
}
