//! Local batching for hot keys: units taken from Redis in advance and spent locally.
//!
//! A one-unit request for a rule with `batch = k > 1` that finds no local units asks Redis for
//! k; if granted it keeps k − 1 here, spendable for a tenth of the window (then they lapse,
//! unused). Redis counted them when they were taken, so the global count stays honest; what
//! changes is *when* they are spent: up to k − 1 units per instance counted in one span are
//! admitted in the next, so any window-length span may see `instances × (k − 1)` units over
//! the limit, and an instance holding units may make another wait that much earlier.
//! One request per key and instance takes a batch at a time; requests that miss meanwhile ask
//! Redis for one unit, so an instance holds at most k − 1 units per key and nothing is wasted
//! by concurrent misses. Bounded: at most `capacity` keys hold units; when
//! full, nothing new is held.

use weir_core::{Decision, Nanos};

use crate::rule::RedisRule;
use crate::sharded::Sharded;

struct Held {
    /// A batch is being taken from Redis for this key by one request; others ask for one unit.
    reserving: bool,
    units: u64,
    until: Nanos,
    limit: u64,
    remaining: u64,
    reset_at: Nanos,
}

pub(crate) struct Reserve {
    map: Sharded<Held>,
}

fn id(rule: &RedisRule, key: &str) -> String {
    Sharded::<Held>::id(rule, key)
}

impl Reserve {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            map: Sharded::new(capacity),
        }
    }

    /// Spends one held unit of `key` if there is one still valid at `now`.
    pub(crate) fn take(&self, rule: &RedisRule, key: &str, now: Nanos) -> Option<Decision> {
        let id = id(rule, key);
        let mut shard = self.map.lock(&id);
        let held = shard.get_mut(&id)?;
        if held.until <= now || held.units == 0 {
            if !held.reserving {
                shard.remove(&id);
            }
            return None;
        }
        held.units -= 1;
        let d = Decision::allow(
            held.limit,
            held.remaining + held.units,
            held.reset_at.saturating_sub(now),
            0,
        );
        if held.units == 0 && !held.reserving {
            shard.remove(&id);
        }
        Some(d)
    }

    /// Claims the right to take the next batch for `key`: false if another request is taking
    /// one (then ask Redis for one unit), or if the table is full.
    pub(crate) fn start(&self, rule: &RedisRule, key: &str, now: Nanos) -> bool {
        let id = id(rule, key);
        let mut shard = self.map.lock(&id);
        if let Some(h) = shard.get_mut(&id) {
            if h.reserving {
                return false;
            }
            h.reserving = true;
            return true;
        }
        if !self
            .map
            .make_room(&mut shard, |_, h| h.until > now || h.reserving)
        {
            return false;
        }
        shard.insert(
            id,
            Held {
                reserving: true,
                units: 0,
                until: 0,
                limit: 0,
                remaining: 0,
                reset_at: 0,
            },
        );
        true
    }

    /// Ends a claim from [`Reserve::start`] that did not get a batch.
    pub(crate) fn abandon(&self, rule: &RedisRule, key: &str) {
        let id = id(rule, key);
        let mut shard = self.map.lock(&id);
        if let Some(h) = shard.get_mut(&id) {
            h.reserving = false;
            if h.units == 0 {
                shard.remove(&id);
            }
        }
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
        let mut shard = self.map.lock(&id);
        if !shard.contains_key(&id) && !self.map.make_room(&mut shard, |_, h| h.until > now) {
            return;
        }
        let reset_at =
            now.saturating_add(u64::try_from(d.reset_after().as_nanos()).unwrap_or(u64::MAX));
        let held = shard.entry(id).or_insert(Held {
            reserving: false,
            units: 0,
            until: 0,
            limit: d.limit(),
            remaining: 0,
            reset_at,
        });
        // Units still valid stay; the new ones join them with the new deadline, never more than
        // one batch's worth: concurrent misses on this instance each took a batch, and holding
        // them all would break the bound. The excess lapses unused (counted, never admitted).
        if held.until <= now {
            held.units = 0;
        }
        held.units = (held.units + units).min(units);
        held.reserving = false;
        held.until = now.saturating_add(hold);
        held.remaining = d.remaining();
        held.reset_at = reset_at;
    }
}
