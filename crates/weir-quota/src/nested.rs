//! The groups above nested resources (org ⊃ team ⊃ user): what the leases under each group
//! hold, the room a group leaves a refresh, and the division of a whole family by nested
//! weighted max-min ([`crate::hierarchy`]).
//!
//! A nested resource (`org-acme/team-ads/user-bob`, see [`crate::config::Level`]) is leased
//! from its own [`LeaseTable`], whose capacity is its level's, under the groups of its path's
//! prefixes (`org-acme`, `org-acme/team-ads`). Per group the server keeps the sum of the
//! grants outstanding under it, so:
//!
//! - **Every ancestor holds**: a refresh is granted at most what each group above leaves
//!   (`capacity − outstanding under it`, the caller's own grant aside), so at no instant do
//!   the grants under a group sum past its capacity — the leaf table's own rule, one level up
//!   at a time. A unit granted to a user is counted by its team and its org at once; what a
//!   user is refused (past its own capacity) is counted by nobody.
//! - **One division per family**: the shares are those of one nested max-min over every
//!   holder of every table under the top group (a leaf's holders are the leaves of the tree,
//!   under a group of the leaf's capacity and weight), needs first, then the headroom above
//!   the needs from what the first pass left of each group. The division runs when a holder
//!   comes or goes and at most every 100 ms (a tenth of the refresh interval if shorter); in
//!   a family of more than [`EXACT_UP_TO`] leases, a table whose shares are due within that
//!   interval splits its capacity evenly until the next division (its holders are told to
//!   come back sooner), as one large table does.

use std::collections::{BTreeMap, HashMap};

use weir_core::Nanos;

use crate::hierarchy::{Node, Tree};
use crate::lease::{LeaseTable, EXACT_UP_TO};

/// One level's capacity and weight among its siblings.
pub(crate) type LevelParams = (f64, f64);

/// The groups above every nested table of a server.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    groups: HashMap<String, Group>,
}

#[derive(Debug)]
struct Group {
    capacity: f64,
    weight: f64,
    /// The grants outstanding in the tables under it.
    outstanding: f64,
    /// Leases held in the tables under it.
    holders: usize,
    /// The groups and tables right under it (their paths), with their weights.
    children: BTreeMap<String, f64>,
    /// Top groups: when the family was last divided.
    divided_at: Option<Nanos>,
}

/// The groups above nested resource `leaf`, from the top: its path's prefixes.
pub(crate) fn above(leaf: &str) -> impl Iterator<Item = &str> {
    leaf.match_indices('/').map(move |(i, _)| &leaf[..i])
}

impl Groups {
    /// Places the table `leaf` under its groups; `levels`: its path's levels from the top,
    /// the leaf's last.
    pub(crate) fn attach(&mut self, leaf: &str, levels: &[LevelParams]) {
        let paths: Vec<&str> = above(leaf).collect();
        for (k, path) in paths.iter().enumerate() {
            let (Some(&(capacity, weight)), Some(&(_, child_weight))) =
                (levels.get(k), levels.get(k + 1))
            else {
                return;
            };
            let g = self.groups.entry((*path).to_string()).or_insert(Group {
                capacity,
                weight,
                outstanding: 0.0,
                holders: 0,
                children: BTreeMap::new(),
                divided_at: None,
            });
            let child = paths.get(k + 1).copied().unwrap_or(leaf);
            g.children.insert(child.to_string(), child_weight);
        }
    }

    /// Takes the (emptied or dropped) table `leaf` from under its groups; groups left empty
    /// go too.
    pub(crate) fn detach(&mut self, leaf: &str) {
        let paths: Vec<&str> = above(leaf).collect();
        let mut child = leaf;
        for path in paths.into_iter().rev() {
            let Some(g) = self.groups.get_mut(path) else {
                return;
            };
            g.children.remove(child);
            if !g.children.is_empty() {
                return;
            }
            self.groups.remove(path);
            child = path;
        }
    }

    /// Counts a change of the table `leaf`: `granted` more units outstanding, `holders` more
    /// leases (either may be negative).
    pub(crate) fn charge(&mut self, leaf: &str, granted: f64, holders: isize) {
        for path in above(leaf) {
            if let Some(g) = self.groups.get_mut(path) {
                g.outstanding += granted;
                g.holders = g.holders.saturating_add_signed(holders);
            }
        }
    }

    /// What the groups above `leaf` leave a holder of it that holds `held` now.
    pub(crate) fn room(&self, leaf: &str, held: f64) -> f64 {
        above(leaf)
            .filter_map(|p| self.groups.get(p))
            .map(|g| g.capacity - (g.outstanding - held))
            .fold(f64::INFINITY, f64::min)
            .max(0.0)
    }

    /// An even split of every group above `leaf` among the leases under it: the most a holder
    /// of `leaf` should use when it cannot reach the server (with the leaf's own).
    pub(crate) fn safe(&self, leaf: &str) -> f64 {
        above(leaf)
            .filter_map(|p| self.groups.get(p))
            .map(|g| g.capacity / g.holders.max(1) as f64)
            .fold(f64::INFINITY, f64::min)
    }

    /// The family of `leaf` holds more than [`EXACT_UP_TO`] leases and was divided less than
    /// `interval` before `now`: a table whose shares are due splits evenly until the next
    /// division instead of dividing the whole family again.
    pub(crate) fn divided_lately(&self, leaf: &str, now: Nanos, interval: Nanos) -> bool {
        above(leaf)
            .next()
            .and_then(|top| self.groups.get(top))
            .is_some_and(|g| {
                g.holders > EXACT_UP_TO
                    && g.divided_at
                        .is_some_and(|at| now.saturating_sub(at) < interval)
            })
    }

    /// Forgets every group.
    pub(crate) fn clear(&mut self) {
        self.groups.clear();
    }

    /// The groups again from `tables` (after tables were dropped, restored or reconfigured);
    /// `levels` gives a nested table's levels (`None`: not nested, or no longer configured).
    pub(crate) fn rebuild(
        &mut self,
        tables: &HashMap<String, LeaseTable>,
        levels: impl Fn(&str) -> Option<Vec<LevelParams>>,
    ) {
        self.groups.clear();
        for (name, t) in tables {
            if !name.contains('/') {
                continue;
            }
            if let Some(l) = levels(name) {
                self.attach(name, &l);
                self.charge(name, t.outstanding(), t.holders().len() as isize);
            }
        }
    }

    /// Divides the family of `leaf` at `now`: every table under its top group gets its
    /// holders' shares.
    pub(crate) fn divide(
        &mut self,
        leaf: &str,
        tables: &mut HashMap<String, LeaseTable>,
        now: Nanos,
    ) {
        let Some(top) = above(leaf).next() else {
            return;
        };
        let mut order = Vec::new();
        self.leaves(top, tables, &mut order);
        let Some(g) = self.groups.get_mut(top) else {
            return;
        };
        g.divided_at = Some(now);
        let large = g.holders > EXACT_UP_TO;
        let g = &self.groups[top];
        let needs = self.node(top, g.capacity, g.weight, tables);
        let Ok(first) = Tree::new(&needs).map(|t| t.allocate()) else {
            // Not reachable with a checked file and checked asks; never over-grant anyway.
            for name in &order {
                if let Some(t) = tables.get_mut(name) {
                    t.split_evenly(now);
                }
            }
            return;
        };
        let headroom = order.iter().any(|name| {
            tables.get(name).is_some_and(|t| {
                t.demands(false)
                    .zip(t.demands(true))
                    .any(|(w, n)| w.wants > n.wants)
            })
        });
        let mut shares = first.clone();
        if headroom {
            // What the first pass left of each group goes to the headroom above the needs.
            let mut at = 0;
            let extra = self
                .rest(top, g.capacity, g.weight, tables, &first, &mut at)
                .0;
            if let Ok(second) = Tree::new(&extra).map(|t| t.allocate()) {
                for (s, e) in shares.iter_mut().zip(second) {
                    *s += e;
                }
            }
        }
        let mut at = 0;
        for name in &order {
            if let Some(t) = tables.get_mut(name) {
                let n = t.holders().len();
                t.set_shares(
                    &shares[at.min(shares.len())..(at + n).min(shares.len())],
                    now,
                    large,
                );
                at += n;
            }
        }
    }

    /// The tables under `path`, depth first (the order of [`Self::node`]'s leaves).
    fn leaves(&self, path: &str, tables: &HashMap<String, LeaseTable>, out: &mut Vec<String>) {
        let Some(g) = self.groups.get(path) else {
            return;
        };
        for child in g.children.keys() {
            if self.groups.contains_key(child) {
                self.leaves(child, tables, out);
            } else if tables.contains_key(child) {
                out.push(child.clone());
            }
        }
    }

    /// The first pass's tree under group `path` (of `capacity` and `weight`), each holder a
    /// leaf needing what it needs.
    fn node(
        &self,
        path: &str,
        capacity: f64,
        weight: f64,
        tables: &HashMap<String, LeaseTable>,
    ) -> Node {
        let mut children = Vec::new();
        if let Some(g) = self.groups.get(path) {
            for (child, &w) in &g.children {
                if let Some(sub) = self.groups.get(child) {
                    children.push(self.node(child, sub.capacity, w, tables));
                } else if let Some(t) = tables.get(child) {
                    let holders = t.demands(true).map(Node::Leaf).collect();
                    children.push(Node::Group {
                        capacity: t.config().capacity,
                        weight: w,
                        children: holders,
                    });
                }
            }
        }
        Node::Group {
            capacity,
            weight,
            children,
        }
    }

    /// The second pass's tree under `path`: each group's capacity less what `first` granted
    /// under it, each holder wanting its headroom (`wants − first share`). Answers the tree
    /// and what `first` granted under it; `at` walks `first`.
    fn rest(
        &self,
        path: &str,
        capacity: f64,
        weight: f64,
        tables: &HashMap<String, LeaseTable>,
        first: &[f64],
        at: &mut usize,
    ) -> (Node, f64) {
        let mut children = Vec::new();
        let mut used = 0.0;
        if let Some(g) = self.groups.get(path) {
            for (child, &w) in &g.children {
                if let Some(sub) = self.groups.get(child) {
                    let (n, u) = self.rest(child, sub.capacity, w, tables, first, at);
                    children.push(n);
                    used += u;
                } else if let Some(t) = tables.get(child) {
                    let mut leaf_used = 0.0;
                    let holders = t
                        .demands(false)
                        .map(|d| {
                            let share = first.get(*at).copied().unwrap_or(0.0);
                            *at += 1;
                            leaf_used += share;
                            Node::Leaf(crate::allocate::Demand {
                                wants: (d.wants - share).max(0.0),
                                ..d
                            })
                        })
                        .collect();
                    children.push(Node::Group {
                        capacity: (t.config().capacity - leaf_used).max(0.0),
                        weight: w,
                        children: holders,
                    });
                    used += leaf_used;
                }
            }
        }
        let node = Node::Group {
            capacity: (capacity - used).max(0.0),
            weight,
            children,
        };
        (node, used)
    }
}
