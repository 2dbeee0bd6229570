//! A bounded, sharded map from (rule, key) to per-key local state: what the over-limit cache
//! and the local batching reserve both keep.

use std::collections::HashMap;

use parking_lot::{Mutex, MutexGuard};

use crate::rule::RedisRule;

const SHARDS: usize = 16;

/// One shard's map.
pub(crate) type Shard<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// Sixteen mutex-guarded maps, at most `capacity / 16` entries each.
pub(crate) struct Sharded<V> {
    shards: Vec<Mutex<Shard<V>>>,
    per_shard: usize,
    hasher: foldhash::fast::RandomState,
}

impl<V> Sharded<V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            per_shard: (capacity / SHARDS).max(1),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// The entry id of `key` under `rule`.
    pub(crate) fn id(rule: &RedisRule, key: &str) -> String {
        let mut id = String::with_capacity(rule.name().len() + key.len() + 1);
        id.push_str(rule.name());
        id.push('\0');
        id.push_str(key);
        id
    }

    /// The locked shard holding `id`.
    pub(crate) fn lock(&self, id: &str) -> MutexGuard<'_, Shard<V>> {
        let h = std::hash::BuildHasher::hash_one(&self.hasher, id) as usize;
        self.shards[h % SHARDS].lock()
    }

    /// Whether a shard may take one more entry after dropping those `live` rejects.
    pub(crate) fn make_room(
        &self,
        shard: &mut Shard<V>,
        live: impl FnMut(&String, &mut V) -> bool,
    ) -> bool {
        if shard.len() < self.per_shard {
            return true;
        }
        shard.retain(live);
        shard.len() < self.per_shard
    }
}
