//! Keys known to be over their limit, answered locally until their retry time.
//!
//! Only denials of one unit are cached: their `retry_after` is the earliest time *any* request
//! can pass (other instances can only consume more), so answering from the cache never admits
//! differently from Redis, it only saves the round trip. A refund (a cost settled below its
//! estimate) is the exception: the instance that gives units back forgets the key, while other
//! instances may go on refusing it until the retry time they were told — on the safe side. Bounded: at most `capacity`
//! entries; when full, expired entries are dropped, and if none are, nothing new is cached.

use std::time::Duration;

use weir_core::{Decision, Nanos};

use crate::rule::RedisRule;
use crate::sharded::Sharded;

struct Entry {
    until: Nanos,
    limit: u64,
    reset_at: Nanos,
    /// The rule's limit and script parameters when the denial was made: a rule retuned since
    /// (a reload raised its limit or burst) decides anew.
    tuning: (u64, [u64; 2]),
}

pub(crate) struct OverLimit {
    map: Sharded<Entry>,
}

impl OverLimit {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            map: Sharded::new(capacity),
        }
    }

    /// A denial for `key` if it is known to be over its limit at `now`.
    pub(crate) fn get(&self, rule: &RedisRule, key: &str, now: Nanos) -> Option<Decision> {
        let id = Sharded::<Entry>::id(rule, key);
        let mut shard = self.map.lock(&id);
        let e = shard.get(&id)?;
        if e.until <= now || e.tuning != (rule.limit(), rule.params()) {
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

    /// Forgets what is known of `key` (this instance gave units back).
    pub(crate) fn forget(&self, rule: &RedisRule, key: &str) {
        let id = Sharded::<Entry>::id(rule, key);
        self.map.lock(&id).remove(&id);
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
        let id = Sharded::<Entry>::id(rule, key);
        let mut shard = self.map.lock(&id);
        if !self.map.make_room(&mut shard, |_, e| e.until > now) {
            return;
        }
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        shard.insert(
            id,
            Entry {
                until: now.saturating_add(ns(retry)),
                limit: d.limit(),
                reset_at: now.saturating_add(ns(d.reset_after())),
                tuning: (rule.limit(), rule.params()),
            },
        );
    }
}
