//! [`KeyedLimiter`]: one limiter per key (user, IP, tenant) with a hard cap on live keys.
//!
//! Keys live in a fixed number of shards, each a mutex over an open-addressing index
//! (`hashbrown::HashTable` of slot numbers) and a slot array. A shard holds at most
//! `max_keys / shards` keys. When a new key arrives at a full shard, a bounded CLOCK sweep (at
//! most [`EVICTION_SCAN`] slots) picks a victim: a key whose state equals a fresh limiter's first
//! (dropping it loses nothing), else a key not used since the hand last passed, else the oldest
//! slot scanned. No call is O(number of keys) and memory never grows past the cap. The hasher is
//! seeded per process (foldhash), so chosen keys cannot flood one bucket.
//!
//! Limits can change at runtime ([`KeyedLimiter::set_algorithm`], per-key
//! [`KeyedLimiter::set_override`]) without losing the keys' state: the parameters live beside
//! the states in each shard, under the lock the call takes anyway.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hashbrown::HashTable;
use parking_lot::Mutex;

use crate::algorithm::Algorithm;
use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::decision::Decision;
use crate::error::ConfigError;

/// Slots examined at most when a full shard needs room.
pub const EVICTION_SCAN: usize = 16;

/// Shards used for large key caps (a power of two, several per core).
const MAX_SHARDS: usize = 64;

/// Fewest keys per shard when the cap allows (small caps use one shard, so the cap is exact).
const MIN_PER_SHARD: usize = 64;

type Hasher = foldhash::fast::RandomState;

/// Parameters shared by a shard: the default algorithm and per-key overrides.
struct Config<K, A> {
    default: A,
    overrides: hashbrown::HashMap<K, A, Hasher>,
}

struct Slot<K, S> {
    key: K,
    state: S,
    referenced: bool,
}

struct Shard<K, A: Algorithm> {
    config: Arc<Config<K, A>>,
    index: HashTable<u32>,
    slots: Vec<Slot<K, A::State>>,
    hand: usize,
}

/// A rate limiter per key with bounded memory. `Send + Sync`.
pub struct KeyedLimiter<K, A: Algorithm, C: Clock = MonotonicClock> {
    shards: Box<[Mutex<Shard<K, A>>]>,
    shard_shift: u32,
    per_shard: usize,
    hasher: Hasher,
    clock: C,
    evictions: AtomicU64,
    /// Serialises parameter changes so concurrent ones are not lost.
    config_writer: Mutex<()>,
}

impl<K, A> KeyedLimiter<K, A, MonotonicClock>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm + Clone,
{
    /// A keyed limiter on the default real clock holding at most `max_keys` keys.
    pub fn new(algorithm: A, max_keys: usize) -> Result<Self, ConfigError> {
        Self::with_clock(algorithm, max_keys, MonotonicClock::new())
    }
}

impl<K, A, C> KeyedLimiter<K, A, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm + Clone,
    C: Clock,
{
    /// A keyed limiter reading `clock`, holding at most `max_keys` keys.
    pub fn with_clock(algorithm: A, max_keys: usize, clock: C) -> Result<Self, ConfigError> {
        if max_keys == 0 {
            return Err(ConfigError::ZeroMaxKeys);
        }
        // A power of two with at least MIN_PER_SHARD keys each where possible, at most
        // MAX_SHARDS; per-shard caps sum to at most max_keys.
        let shards = (1usize << (max_keys / MIN_PER_SHARD).max(1).ilog2()).min(MAX_SHARDS);
        let per_shard = (max_keys / shards).min(u32::MAX as usize);
        let config = Arc::new(Config {
            default: algorithm,
            overrides: hashbrown::HashMap::with_hasher(Hasher::default()),
        });
        let shards: Box<[_]> = (0..shards)
            .map(|_| {
                Mutex::new(Shard {
                    config: config.clone(),
                    index: HashTable::new(),
                    slots: Vec::new(),
                    hand: 0,
                })
            })
            .collect();
        Ok(Self {
            shard_shift: 64 - shards.len().trailing_zeros(),
            shards,
            per_shard,
            hasher: Hasher::default(),
            clock,
            evictions: AtomicU64::new(0),
            config_writer: Mutex::new(()),
        })
    }

    /// Asks for `n` units for `key` now (`n = 0` peeks).
    #[inline]
    pub fn acquire<Q>(&self, key: &Q, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.acquire_at(key, n, self.clock.now())
    }

    /// Asks for `n` units for `key` at an explicit time.
    pub fn acquire_at<Q>(&self, key: &Q, n: u64, now: Nanos) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard_no = if self.shard_shift >= 64 {
            0
        } else {
            (hash >> self.shard_shift) as usize
        };
        let mut guard = self.shards[shard_no].lock();
        let shard = &mut *guard;
        let config = &*shard.config;
        let algorithm = if config.overrides.is_empty() {
            &config.default
        } else {
            config.overrides.get(key).unwrap_or(&config.default)
        };
        let slots = &shard.slots;
        if let Some(&i) = shard
            .index
            .find(hash, |&i| slots[i as usize].key.borrow() == key)
        {
            let slot = &mut shard.slots[i as usize];
            slot.referenced = true;
            return algorithm.decide(&mut slot.state, n, now);
        }
        // New key: decide on a fresh state first; a peek or a denial need not be stored.
        let mut state = algorithm.initial_state(now);
        let decision = algorithm.decide(&mut state, n, now);
        if algorithm.is_idle(&state, now) {
            return decision;
        }
        let slot = Slot {
            key: key.to_owned(),
            state,
            referenced: true,
        };
        if shard.slots.len() < self.per_shard {
            if shard.slots.len() == shard.slots.capacity() {
                let want = (shard.slots.len() * 2).max(8).min(self.per_shard);
                shard.slots.reserve_exact(want - shard.slots.len());
            }
            let i = shard.slots.len() as u32;
            shard.slots.push(slot);
            let slots = &shard.slots;
            shard
                .index
                .insert_unique(hash, i, |&j| self.hasher.hash_one(&slots[j as usize].key));
        } else {
            let victim = Self::pick_victim(&mut shard.slots, &mut shard.hand, now, algorithm);
            let old_hash = self.hasher.hash_one(&shard.slots[victim].key);
            if let Ok(entry) = shard.index.find_entry(old_hash, |&j| j as usize == victim) {
                entry.remove();
            }
            shard.slots[victim] = slot;
            let slots = &shard.slots;
            shard.index.insert_unique(hash, victim as u32, |&j| {
                self.hasher.hash_one(&slots[j as usize].key)
            });
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        decision
    }

    /// Bounded CLOCK sweep: an idle key first, else one not referenced since the hand passed,
    /// else the first slot scanned.
    fn pick_victim(
        slots: &mut [Slot<K, A::State>],
        hand: &mut usize,
        now: Nanos,
        algorithm: &A,
    ) -> usize {
        let len = slots.len();
        let start = *hand % len;
        let mut unreferenced = None;
        let mut chosen = None;
        let scan = EVICTION_SCAN.min(len);
        for step in 0..scan {
            let i = (start + step) % len;
            let slot = &mut slots[i];
            if algorithm.is_idle(&slot.state, now) {
                chosen = Some(i);
                break;
            }
            if !slot.referenced && unreferenced.is_none() {
                unreferenced = Some(i);
            }
            slot.referenced = false;
        }
        let victim = chosen.or(unreferenced).unwrap_or(start);
        *hand = (victim + 1) % len;
        victim
    }

    /// Live keys (sums the shards).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().slots.len()).sum()
    }

    /// True when no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys this limiter holds.
    pub fn capacity(&self) -> usize {
        self.per_shard * self.shards.len()
    }

    /// Keys evicted to make room so far.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Replaces the default parameters; every key keeps its state.
    pub fn set_algorithm(&self, algorithm: A) {
        self.update_config(|c| c.default = algorithm.clone());
    }

    /// Gives `key` its own parameters (keeping its state).
    pub fn set_override(&self, key: K, algorithm: A) {
        self.update_config(|c| {
            c.overrides.insert(key.clone(), algorithm.clone());
        });
    }

    /// Returns `key` to the default parameters.
    pub fn remove_override<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.update_config(|c| {
            c.overrides.remove(key);
        });
    }

    fn update_config(&self, change: impl Fn(&mut Config<K, A>)) {
        let _writer = self.config_writer.lock();
        let current = self.shards[0].lock().config.clone();
        let mut next = Config {
            default: current.default.clone(),
            overrides: current.overrides.clone(),
        };
        change(&mut next);
        let next = Arc::new(next);
        for shard in self.shards.iter() {
            shard.lock().config = next.clone();
        }
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}
