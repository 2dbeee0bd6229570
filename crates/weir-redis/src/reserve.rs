//! Local batching for hot keys: units taken from Redis in advance and spent locally.
//!
//! A one-unit request for a rule with `batch = k > 1` that finds no local units asks Redis for
//! k; if granted it keeps k − 1 here, spendable for a tenth of the window (then they lapse,
//! unused). Redis counted them when they were taken, so the global count stays honest; what
//! changes is *when* they are spent: up to k − 1 units per instance counted in one span are
//! admitted in the next, so any window-length span may see `instances × (k − 1)` units over
//! the limit, and an instance holding units may make another wait that much earlier.
//! Bounded: at most `capacity` keys hold units; when full, nothing new is held.

use std::collections::HashMap;

use parking_lot::Mutex;
use weir_core::{Decision, Nanos};

use crate::RedisRule;

const SHARDS: usize = 16;

struct Held {
    units: u64,
    until: Nanos,
    limit: u64,
    remaining: u64,
    reset_at: Nanos,
}

pub(crate) struct Reserve {
    shards: Vec<Mutex<HashMap<String, Held, foldhash::fast::RandomState>>>,
    per_shard: usize,
    hasher: foldhash::fast::RandomState,
}

fn id(rule: &RedisRule, key: &str) -> String {
    let mut id = String::with_capacity(rule.name().len() + key.len() + 1);
    id.push_str(rule.name());
    id.push('\0');
    id.push_str(key);
    id
}

impl Reserve {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            per_shard: (capacity / SHARDS).max(1),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn shard(&self, id: &str) -> &Mutex<HashMap<String, Held, foldhash::fast::RandomState>> {
        let h = std::hash::BuildHasher::hash_one(&self.hasher, id) as usize;
        &self.shards[h % SHARDS]
    }

    /// Spends one held unit of `key` if there is one still valid at `now`.
    pub(crate) fn take(&self, rule: &RedisRule, key: &str, now: Nanos) -> Option<Decision> {
        let id = id(rule, key);
        let mut shard = self.shard(&id).lock();
        let held = shard.get_mut(&id)?;
        if held.until <= now || held.units == 0 {
            shard.remove(&id);
            return None;
        }
        held.units -= 1;
        let d = Decision::allow(
            held.limit,
            held.remaining + held.units,
            held.reset_at.saturating_sub(now),
            0,
        );
        if held.units == 0 {
            shard.remove(&id);
        }
        Some(d)
    }

    /// Keeps `units` of `key`, granted by `d` at `now`, until `now + hold`.
    pub(crate) fn keep(
        &self,
        rule: &RedisRule,
        key: &str,
        units: u64,
        now: Nanos,
        hold: Nanos,
        d: &Decision,
    ) {
        if units == 0 {
            return;
        }
        let id = id(rule, key);
        let mut shard = self.shard(&id).lock();
        if shard.len() >= self.per_shard && !shard.contains_key(&id) {
            shard.retain(|_, h| h.until > now);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        let reset_at =
            now.saturating_add(u64::try_from(d.reset_after().as_nanos()).unwrap_or(u64::MAX));
        let held = shard.entry(id).or_insert(Held {
            units: 0,
            until: 0,
            limit: d.limit(),
            remaining: 0,
            reset_at,
        });
        // Units still valid stay; the new ones join them with the new deadline.
        if held.until <= now {
            held.units = 0;
        }
        held.units += units;
        held.until = now.saturating_add(hold);
        held.remaining = d.remaining();
        held.reset_at = reset_at;
    }
}
