//! Keys known to be over their limit, answered locally until their retry time.
//!
//! Only denials of one unit are cached: their `retry_after` is the earliest time *any* request
//! can pass (other instances can only consume more), so answering from the cache never admits
//! or denies differently from Redis, it only saves the round trip. Bounded: at most `capacity`
//! entries; when full, expired entries are dropped, and if none are, nothing new is cached.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use weir_core::{Decision, Nanos};

use crate::RedisRule;

const SHARDS: usize = 16;

struct Entry {
    until: Nanos,
    limit: u64,
    reset_at: Nanos,
}

pub(crate) struct OverLimit {
    shards: Vec<Mutex<HashMap<String, Entry, foldhash::fast::RandomState>>>,
    per_shard: usize,
    hasher: foldhash::fast::RandomState,
}

impl OverLimit {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            per_shard: (capacity / SHARDS).max(1),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn id(rule: &RedisRule, key: &str) -> String {
        let mut id = String::with_capacity(rule.name().len() + key.len() + 1);
        id.push_str(rule.name());
        id.push('\0');
        id.push_str(key);
        id
    }

    fn shard(&self, id: &str) -> &Mutex<HashMap<String, Entry, foldhash::fast::RandomState>> {
        let h = std::hash::BuildHasher::hash_one(&self.hasher, id) as usize;
        &self.shards[h % SHARDS]
    }

    /// A denial for `key` if it is known to be over its limit at `now`.
    pub(crate) fn get(&self, rule: &RedisRule, key: &str, now: Nanos) -> Option<Decision> {
        let id = Self::id(rule, key);
        let mut shard = self.shard(&id).lock();
        let e = shard.get(&id)?;
        if e.until <= now {
            shard.remove(&id);
            return None;
        }
        Some(Decision::deny(
            e.limit,
            0,
            e.until - now,
            e.reset_at.saturating_sub(now),
        ))
    }

    /// Remembers that `key` is over its limit for `retry` after `now`.
    pub(crate) fn insert(
        &self,
        rule: &RedisRule,
        key: &str,
        now: Nanos,
        retry: Duration,
        d: Decision,
    ) {
        if retry.is_zero() {
            return;
        }
        let id = Self::id(rule, key);
        let mut shard = self.shard(&id).lock();
        if shard.len() >= self.per_shard {
            shard.retain(|_, e| e.until > now);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        shard.insert(
            id,
            Entry {
                until: now.saturating_add(ns(retry)),
                limit: d.limit(),
                reset_at: now.saturating_add(ns(d.reset_after())),
            },
        );
    }
}
