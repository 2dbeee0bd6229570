//! [`TopK`]: the heaviest values of a stream in fixed memory (the Space-Saving sketch of
//! Metwally, Agrawal and El Abbadi), for "who is being limited" on dashboards.
//!
//! It keeps at most `k` counters. A value already counted adds to its counter; a new value
//! takes a free counter, or replaces the smallest one and inherits its count (recorded as the
//! new value's possible overcount, `error`). Guarantees: any value seen more than `N / k`
//! times (N = everything recorded) is in the table, and each count is at most `error` above
//! the value's true count. Memory is fixed whatever callers send: `k` entries, each value
//! truncated to [`MAX_VALUE_BYTES`]. Recording is O(k) on a miss (k is small: tens).

/// Longest value kept, in bytes (longer ones are cut at a character boundary).
pub const MAX_VALUE_BYTES: usize = 64;

/// One tracked value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heavy {
    /// The value (at most [`MAX_VALUE_BYTES`]).
    pub value: String,
    /// Its count (an upper bound of the true count).
    pub count: u64,
    /// How much of `count` may belong to values it replaced.
    pub error: u64,
}

/// A Space-Saving sketch of `k` counters.
#[derive(Debug, Clone)]
pub struct TopK {
    k: usize,
    entries: Vec<Heavy>,
    total: u64,
}

impl TopK {
    /// A sketch keeping `k` counters (at least 1).
    pub fn new(k: usize) -> Self {
        Self {
            k: k.max(1),
            entries: Vec::new(),
            total: 0,
        }
    }

    /// Counts one occurrence of `value`.
    pub fn record(&mut self, value: &str) {
        self.record_n(value, 1);
    }

    /// Counts `n` occurrences of `value`.
    pub fn record_n(&mut self, value: &str, n: u64) {
        let value = truncate(value);
        self.total = self.total.saturating_add(n);
        if let Some(e) = self.entries.iter_mut().find(|e| e.value == value) {
            e.count = e.count.saturating_add(n);
            return;
        }
        if self.entries.len() < self.k {
            self.entries.push(Heavy {
                value: value.to_string(),
                count: n,
                error: 0,
            });
            return;
        }
        // Replace the smallest counter; the newcomer inherits its count as possible error.
        if let Some(min) = self.entries.iter_mut().min_by_key(|e| e.count) {
            min.error = min.count;
            min.count = min.count.saturating_add(n);
            min.value.clear();
            min.value.push_str(value);
        }
    }

    /// The tracked values, heaviest first.
    pub fn top(&self) -> Vec<Heavy> {
        let mut v = self.entries.clone();
        v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.value.cmp(&b.value)));
        v
    }

    /// Everything recorded.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.total = 0;
    }
}

fn truncate(value: &str) -> &str {
    if value.len() <= MAX_VALUE_BYTES {
        return value;
    }
    let mut end = MAX_VALUE_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_values_are_found_with_bounded_error() {
        let mut t = TopK::new(8);
        let mut x = 12_345u64;
        // 3 heavy users among 10 000 light ones.
        for i in 0..30_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = match i % 10 {
                0..=2 => "mallory".to_string(),
                3 | 4 => "trudy".to_string(),
                5 => "eve".to_string(),
                _ => format!("user-{}", x % 10_000),
            };
            t.record(&v);
        }
        let top = t.top();
        assert_eq!(top.len(), 8);
        let names: Vec<&str> = top.iter().take(3).map(|h| h.value.as_str()).collect();
        assert_eq!(names, ["mallory", "trudy", "eve"]);
        for (h, truth) in top.iter().zip([9_000u64, 6_000, 3_000]) {
            assert!(h.count >= truth && h.count - h.error <= truth, "{h:?}");
        }
        assert_eq!(t.total(), 30_000);
    }

    #[test]
    fn memory_is_fixed_whatever_is_recorded() {
        let mut t = TopK::new(4);
        let long = "é".repeat(1_000);
        for i in 0..10_000 {
            t.record(&format!("{i}{long}"));
        }
        assert_eq!(t.top().len(), 4);
        for h in t.top() {
            assert!(h.value.len() <= MAX_VALUE_BYTES, "{}", h.value.len());
            assert!(h.value.ends_with('é'), "cut at a character boundary");
        }
    }
}
