//! Nested resources in the quota file: entries naming a `parent` — the path of another entry
//! from the top (`org-acme`, `org-acme/team-*`) — form families of [`Level`]s.
//!
//! Checked, each error at its entry's field: every parent exists (a cycle is named as one), no
//! path is declared twice, a child's capacity is at most its parent's, at most
//! [`MAX_LEVELS`] levels, a group (an entry with entries under it) carries no lease
//! parameters (clients lease the leaves under it), and nested resources are divided by fair
//! share (nested weighted max-min, [`crate::hierarchy`]).

use std::collections::HashMap;

use super::{Level, RawResource, MAX_LEVELS};
use crate::allocate::Division;
use crate::forest::{loop_from, loop_message, Forest};
use crate::lease::ResourceConfig;

/// The families of a file.
pub(super) struct Nesting {
    /// Per entry of the file: it belongs to a family (it names a parent, or entries name it).
    pub nested: Vec<bool>,
    /// The top level of each family, in file order.
    pub roots: Vec<Level>,
}

#[derive(Clone, PartialEq)]
enum State {
    /// Its parent is not resolved yet.
    Pending,
    /// Its path from the top.
    Resolved(String),
    /// Refused (declared twice, too deep); its error is recorded.
    Dropped,
}

/// Reads the `parent` fields of `raw` (whose parsed parameters are `parsed`).
pub(super) fn resolve(
    raw: &[RawResource],
    parsed: &[ResourceConfig],
    problems: &mut Vec<(String, String)>,
) -> Nesting {
    let n = raw.len();
    let mut state = vec![State::Pending; n];
    let mut by_path: HashMap<String, usize> = HashMap::new();
    let mut parent_of: Vec<Option<usize>> = vec![None; n];
    let mut depth = vec![1usize; n];
    for (i, r) in raw.iter().enumerate() {
        if r.parent.is_none() {
            state[i] = State::Resolved(r.name.clone());
            by_path.entry(r.name.clone()).or_insert(i);
        }
    }
    // Top down, one level per pass.
    let mut changed = true;
    while changed {
        changed = false;
        for i in 0..n {
            let (State::Pending, Some(p)) = (&state[i], &raw[i].parent) else {
                continue;
            };
            let Some(&pi) = by_path.get(p.as_str()) else {
                continue;
            };
            changed = true;
            let full = format!("{p}/{}", raw[i].name);
            if depth[pi] >= MAX_LEVELS {
                problems.push((
                    format!("resources[{i}].parent"),
                    format!("nested deeper than {MAX_LEVELS} levels"),
                ));
                state[i] = State::Dropped;
            } else if by_path.contains_key(&full) {
                problems.push((
                    format!("resources[{i}].name"),
                    format!("{full:?} is declared twice"),
                ));
                state[i] = State::Dropped;
            } else {
                by_path.insert(full.clone(), i);
                state[i] = State::Resolved(full);
                parent_of[i] = Some(pi);
                depth[i] = depth[pi] + 1;
            }
        }
    }
    for i in 0..n {
        if state[i] == State::Pending {
            let p = raw[i].parent.as_deref().unwrap_or_default();
            problems.push((
                format!("resources[{i}].parent"),
                unresolved(raw, &state, i, p),
            ));
        }
    }
    let Forest { children, .. } = Forest::from_parents(parent_of.clone());
    let nested: Vec<bool> = (0..n)
        .map(|i| raw[i].parent.is_some() || !children[i].is_empty())
        .collect();
    for i in (0..n).filter(|&i| nested[i] && matches!(state[i], State::Resolved(_))) {
        check(i, raw, parsed, &parent_of, &children, problems);
    }
    let roots = (0..n)
        .filter(|&i| raw[i].parent.is_none() && !children[i].is_empty())
        .map(|i| level(i, raw, parsed, &children))
        .collect();
    Nesting { nested, roots }
}

/// Why entry `i`'s parent `p` never resolved: a cycle, or no such path.
fn unresolved(raw: &[RawResource], state: &[State], i: usize, p: &str) -> String {
    // Follow the parents by name among the entries still pending.
    let up = |at: usize| {
        let parent = raw[at].parent.as_deref()?;
        let last = parent.rsplit('/').next().unwrap_or(parent);
        (0..raw.len())
            .find(|&j| state[j] == State::Pending && raw[j].name == last && raw[j].parent.is_some())
    };
    if let Some(cycle) = loop_from(i, up) {
        return loop_message(cycle.iter().map(|&s| raw[s].name.as_str()));
    }
    format!(
        "{p:?}: no resource has this path (a parent is named by its path from the top, like org-acme/team-*)"
    )
}

/// The checks of nested entry `i`.
fn check(
    i: usize,
    raw: &[RawResource],
    parsed: &[ResourceConfig],
    parent_of: &[Option<usize>],
    children: &[Vec<usize>],
    problems: &mut Vec<(String, String)>,
) {
    let at = |field: &str| format!("resources[{i}].{field}");
    let r = &raw[i];
    if let Some(p) = parent_of[i] {
        if parsed[i].capacity > parsed[p].capacity {
            problems.push((
                at("capacity"),
                format!(
                    "{}/s is more than its parent {:?} has ({}/s)",
                    parsed[i].capacity, raw[p].name, parsed[p].capacity
                ),
            ));
        }
    }
    if !children[i].is_empty() {
        for (field, set) in [
            ("lease", r.lease.is_some()),
            ("refresh", r.refresh.is_some()),
            ("safe_capacity", r.safe_capacity.is_some()),
        ] {
            if set {
                problems.push((
                    at(field),
                    "a group is not leased itself: set this on the resources under it".into(),
                ));
            }
        }
    }
    if r.algorithm.is_some() && parsed[i].algorithm != Division::FairShare {
        problems.push((
            at("algorithm"),
            "nested resources are divided by fair_share (nested weighted max-min)".into(),
        ));
    }
    if let Some(w) = r.weight {
        if !(w.is_finite() && w > 0.0 && w <= 1e6) {
            problems.push((at("weight"), format!("{w}: a number > 0 and ≤ 1000000")));
        }
    }
}

/// Entry `i` and the levels under it.
fn level(
    i: usize,
    raw: &[RawResource],
    parsed: &[ResourceConfig],
    children: &[Vec<usize>],
) -> Level {
    Level {
        name: raw[i].name.clone(),
        config: parsed[i],
        weight: raw[i]
            .weight
            .filter(|w| w.is_finite() && *w > 0.0)
            .unwrap_or(1.0),
        children: children[i]
            .iter()
            .map(|&c| level(c, raw, parsed, children))
            .collect(),
    }
}
