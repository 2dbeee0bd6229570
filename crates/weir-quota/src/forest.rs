//! Entries that name their parent, linked into a forest: the one parents → tree step of the
//! quota file's nested resources and of `weir simulate quota`'s nested rows, with the one way
//! a loop of parents is found and named.
//!
//! Who calls it: the readers of those inputs, after resolving each entry's parent to an index.
//! A hostile input gets a located error from the reader: a loop is found in time linear in
//! the entries per entry looked at, and no entry is visited twice while building a tree.

/// The forest of `n` entries: each one's parent, its children in input order, and the roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forest {
    /// Each entry's parent (`None`: a root, or not linked).
    pub parent: Vec<Option<usize>>,
    /// Each entry's children, in input order.
    pub children: Vec<Vec<usize>>,
}

impl Forest {
    /// Links entries by their parents' indices (`parent[i]`: entry `i`'s parent).
    pub fn from_parents(parent: Vec<Option<usize>>) -> Self {
        let mut children = vec![Vec::new(); parent.len()];
        for (i, p) in parent.iter().enumerate() {
            if let Some(p) = *p {
                children[p].push(i);
            }
        }
        Self { parent, children }
    }

    /// The first entry (in input order) that no path down from a root reaches: it is in a
    /// loop of parents, or under one.
    pub fn first_unreachable(&self) -> Option<usize> {
        let n = self.parent.len();
        let mut reached = vec![false; n];
        let mut stack: Vec<usize> = (0..n).filter(|&i| self.parent[i].is_none()).collect();
        while let Some(i) = stack.pop() {
            reached[i] = true;
            stack.extend(&self.children[i]);
        }
        (0..n).find(|&i| !reached[i])
    }
}

/// The loop met by following `next` up from `start`, as the entries from the first one
/// seen twice back to it (`[a, b, a]`); `None` when the walk ends first.
pub fn loop_from(start: usize, mut next: impl FnMut(usize) -> Option<usize>) -> Option<Vec<usize>> {
    let mut seen = vec![start];
    let mut at = start;
    while let Some(up) = next(at) {
        if let Some(k) = seen.iter().position(|&s| s == up) {
            let mut cycle = seen.split_off(k);
            cycle.push(up);
            return Some(cycle);
        }
        seen.push(up);
        at = up;
    }
    None
}

/// How a loop of parents is reported: `a cycle of parents: a → b → a`.
pub fn loop_message<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    format!("a cycle of parents: {}", names.join(" → "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_in_input_order_and_loops_named() {
        // 0 ← 1, 0 ← 2, and 3 ⇄ 4 (no root above them), 5 under the loop.
        let f = Forest::from_parents(vec![None, Some(0), Some(0), Some(4), Some(3), Some(4)]);
        assert_eq!(f.children[0], vec![1, 2]);
        assert_eq!(f.first_unreachable(), Some(3));
        let parent = f.parent.clone();
        assert_eq!(loop_from(5, |i| parent[i]), Some(vec![4, 3, 4]));
        assert_eq!(loop_from(1, |i| parent[i]), None);
        assert_eq!(
            loop_message(["a", "b", "a"]),
            "a cycle of parents: a → b → a"
        );
        let tree = Forest::from_parents(vec![None, Some(0), Some(1)]);
        assert_eq!(tree.first_unreachable(), None);
    }
}
