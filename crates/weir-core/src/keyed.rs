//! [`KeyedLimiter`]: one limiter per key (user, IP, tenant) with a hard cap on live keys.
//!
//! Keys live in a fixed number of shards, each a mutex over an open-addressing table with
//! linear probing, at most 4/5 full. Entries (key and state) sit inline where their hash puts
//! them, with no per-entry allocation; whether a slot is full, a 6-bit tag of the hash and a
//! referenced bit live in a parallel array of control bytes (module `slots`), so an entry costs
//! its own size (16 B for a `u64` key and a GCRA state: ≈ 22 B of heap per key at 1 M keys)
//! instead of the 8 B more an `Option` would add. A lookup prefetches the home entry while it
//! reads the control bytes, so it waits for one cache miss, not two in a row. A shard holds at
//! most `max_keys / shards` keys. When a new key arrives at a full shard, a bounded CLOCK sweep
//! (at most [`EVICTION_SCAN`] keys) picks a victim: a key whose state equals a fresh limiter's
//! first (dropping it loses nothing), else a key not used since the hand last passed, else the
//! first key scanned. No call is O(number of keys); memory never grows past the cap (tables
//! grow by doubling up to their final size, rehashing one shard). The hasher is seeded per
//! process (foldhash), so chosen keys cannot be aimed at one slot.
//!
//! Limits can change at runtime ([`KeyedLimiter::set_algorithm`], per-key
//! [`KeyedLimiter::set_override`]) without losing the keys' state: the parameters live beside
//! the states in each shard, under the lock the call takes anyway.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::num::NonZeroU8;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::algorithm::Algorithm;
use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::decision::Decision;
use crate::error::ConfigError;

mod slots;
use slots::Slots;

/// Keys examined at most when a full shard needs room.
pub const EVICTION_SCAN: usize = 16;

/// Shards used for large key caps (a power of two, several per core).
const MAX_SHARDS: usize = 64;

/// Fewest keys per shard when the cap allows (small caps use one shard, so the cap is exact).
const MIN_PER_SHARD: usize = 64;

/// Initial table size of a shard.
const INITIAL_SLOTS: usize = 16;

type Hasher = foldhash::fast::RandomState;

/// Parameters shared by a shard: the default algorithm and per-key overrides.
struct Config<K, A> {
    default: A,
    overrides: hashbrown::HashMap<K, A, Hasher>,
}

/// Control byte of a full slot: bit 7 always set (so it is non-zero), bit 6 = referenced since
/// the CLOCK hand passed, bits 0–5 = a tag from the hash that rejects most other keys without
/// reading their entry.
const META_BASE: u8 = 0x80;
const REFERENCED: u8 = 0x40;
const TAG_MASK: u8 = 0x3F;

struct Entry<K, S> {
    key: K,
    state: S,
}

/// Linear-probing table of one shard, at most 4/5 full.
struct Table<K, S> {
    slots: Slots<Entry<K, S>>,
    len: usize,
    hand: usize,
}

#[inline]
fn tag_of(hash: u64) -> u8 {
    (hash >> 8) as u8 & TAG_MASK
}

#[inline]
fn meta(bits: u8) -> NonZeroU8 {
    NonZeroU8::new(META_BASE | bits).unwrap_or(NonZeroU8::MAX)
}

/// Home slot: the hash's high bits scaled to the table size (any size, not only powers of two).
#[inline]
fn home(hash: u64, slots: usize) -> usize {
    ((u128::from(hash) * slots as u128) >> 64) as usize
}

impl<K: Hash + Eq, S> Table<K, S> {
    fn new() -> Self {
        Self {
            slots: Slots::new(0),
            len: 0,
            hand: 0,
        }
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.size() {
            0
        } else {
            i + 1
        }
    }

    /// `Ok(slot)` holding `key`, or `Err(empty slot)` where it would go. The table must have
    /// at least one empty slot.
    #[inline]
    fn find<Q>(&self, hash: u64, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let tag = tag_of(hash);
        let mut i = home(hash, self.slots.size());
        self.slots.prefetch(i);
        loop {
            let ctrl = self.slots.ctrl(i);
            if ctrl == 0 {
                return Err(i);
            }
            if ctrl & TAG_MASK == tag {
                if let Some(e) = self.slots.get(i) {
                    if e.key.borrow() == key {
                        return Ok(i);
                    }
                }
            }
            i = self.next(i);
        }
    }

    /// Grows to the next size (doubling, capped at `max_slots`) and reinserts every key,
    /// keeping its control byte.
    fn grow(&mut self, max_slots: usize, hasher: &Hasher) {
        let size = (self.slots.size() * 2).clamp(INITIAL_SLOTS.min(max_slots), max_slots);
        let mut old = std::mem::replace(&mut self.slots, Slots::new(size));
        self.hand = 0;
        for j in 0..old.size() {
            let Some(ctrl) = NonZeroU8::new(old.ctrl(j)) else {
                continue;
            };
            let Some(entry) = old.take(j) else {
                continue;
            };
            let mut i = home(hasher.hash_one(&entry.key), size);
            while self.slots.ctrl(i) != 0 {
                i = self.next(i);
            }
            self.slots.put(i, ctrl, entry);
        }
    }

    /// Removes slot `i`, shifting later keys of its cluster back so lookups stay correct.
    fn remove(&mut self, mut i: usize, hasher: &Hasher) {
        drop(self.slots.take(i));
        self.len -= 1;
        let mut j = i;
        loop {
            j = self.next(j);
            let Some(e) = self.slots.get(j) else {
                return;
            };
            let k = home(hasher.hash_one(&e.key), self.slots.size());
            // Keep j in place if its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < k && k <= j
            } else {
                i < k || k <= j
            };
            if !stays {
                let ctrl = NonZeroU8::new(self.slots.ctrl(j));
                if let (Some(ctrl), Some(entry)) = (ctrl, self.slots.take(j)) {
                    self.slots.put(i, ctrl, entry);
                }
                i = j;
            }
        }
    }

    /// An idle key within a bounded scan from the hand, if any.
    fn find_idle(&mut self, mut is_idle: impl FnMut(&S) -> bool) -> Option<usize> {
        let size = self.slots.size();
        let mut i = self.hand % size;
        let mut seen = 0;
        for _ in 0..size {
            if let Some(e) = self.slots.get(i) {
                if is_idle(&e.state) {
                    self.hand = self.next(i);
                    return Some(i);
                }
                seen += 1;
                if seen == EVICTION_SCAN {
                    break;
                }
            }
            i = self.next(i);
        }
        self.hand = i;
        None
    }

    /// Bounded CLOCK sweep: an idle key first, else one not referenced since the hand passed,
    /// else the first key scanned. The table is not empty.
    fn pick_victim(&mut self, mut is_idle: impl FnMut(&S) -> bool) -> usize {
        let size = self.slots.size();
        let mut i = self.hand % size;
        let (mut seen, mut first, mut unreferenced) = (0, None, None);
        for _ in 0..size {
            if let Some(e) = self.slots.get(i) {
                if is_idle(&e.state) {
                    first = Some(i);
                    unreferenced = Some(i);
                    break;
                }
                first.get_or_insert(i);
                let ctrl = self.slots.ctrl(i);
                if ctrl & REFERENCED != 0 {
                    self.slots.set_ctrl(i, meta(ctrl & !REFERENCED));
                } else {
                    unreferenced.get_or_insert(i);
                }
                seen += 1;
                if seen == EVICTION_SCAN {
                    break;
                }
            }
            i = self.next(i);
        }
        let victim = unreferenced.or(first).unwrap_or(0);
        self.hand = self.next(victim);
        victim
    }
}

struct Shard<K, A: Algorithm> {
    config: Arc<Config<K, A>>,
    table: Table<K, A::State>,
}

/// A rate limiter per key with bounded memory. `Send + Sync`.
pub struct KeyedLimiter<K, A: Algorithm, C: Clock = MonotonicClock> {
    shards: Box<[Mutex<Shard<K, A>>]>,
    shard_mask: usize,
    per_shard: usize,
    /// Final table size of a shard: room for `per_shard` keys at most 4/5 full.
    max_slots: usize,
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
                    table: Table::new(),
                })
            })
            .collect();
        Ok(Self {
            shard_mask: shards.len() - 1,
            shards,
            per_shard,
            max_slots: per_shard + per_shard.div_ceil(4) + 1,
            hasher: Hasher::default(),
            clock,
            evictions: AtomicU64::new(0),
            config_writer: Mutex::new(()),
        })
    }

    /// Asks for `n` units for `key` now (`n = 0` peeks). Avoid an empty `String` key on hot
    /// paths: comparing it (a dangling pointer, length 0) costs ≈ 75 ns in glibc's AVX-512
    /// `memcmp` on some machines, 4 × the whole lookup (weir-rules `benches/entry.rs`).
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
        match self.acquire_inner(key, n, now, true) {
            Some(d) => d,
            None => unreachable_full(),
        }
    }

    /// As [`KeyedLimiter::acquire`], but never evicts: `None` when `key` is new, would have to
    /// be stored, and its shard already holds its share of the bound (the bound is split
    /// evenly over the shards, so this can answer `None` a little below `max_keys`).
    pub fn acquire_if_room<Q>(&self, key: &Q, n: u64) -> Option<Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.acquire_inner(key, n, self.clock.now(), false)
    }

    /// [`KeyedLimiter::acquire_if_room`] at an explicit time (the caller's one clock read).
    pub fn acquire_if_room_at<Q>(&self, key: &Q, n: u64, now: Nanos) -> Option<Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.acquire_inner(key, n, now, false)
    }

    #[inline]
    fn acquire_inner<Q>(&self, key: &Q, n: u64, now: Nanos, evict: bool) -> Option<Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.on_state(key, now, evict, |algorithm, state| {
            algorithm.decide(state, n, now)
        })
    }

    /// Runs `op` on `key`'s state (a fresh one for a new key, stored unless it stays idle),
    /// under its shard's lock; `None` when a new key finds no room and `evict` is false.
    #[inline]
    pub(crate) fn on_state<Q, V>(
        &self,
        key: &Q,
        now: Nanos,
        evict: bool,
        op: impl FnOnce(&A, &mut A::State) -> V,
    ) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let mut guard = self.shards[hash as usize & self.shard_mask].lock();
        let shard = &mut *guard;
        let config = &*shard.config;
        let algorithm = if config.overrides.is_empty() {
            &config.default
        } else {
            config.overrides.get(key).unwrap_or(&config.default)
        };
        let table = &mut shard.table;
        if table.len > 0 {
            if let Ok(i) = table.find(hash, key) {
                let ctrl = table.slots.ctrl(i);
                if ctrl & REFERENCED == 0 {
                    table.slots.set_ctrl(i, meta(ctrl | REFERENCED));
                }
                if let Some(e) = table.slots.get_mut(i) {
                    return Some(op(algorithm, &mut e.state));
                }
            }
        }
        // New key: decide on a fresh state first; a peek or a denial need not be stored.
        let mut state = algorithm.initial_state(now);
        let decision = op(algorithm, &mut state);
        if algorithm.is_idle(&state, now) {
            return Some(decision);
        }
        if table.len >= self.per_shard {
            let victim = if evict {
                table.pick_victim(|s| algorithm.is_idle(s, now))
            } else {
                // Only a key whose state equals a fresh one may go.
                table.find_idle(|s| algorithm.is_idle(s, now))?
            };
            table.remove(victim, &self.hasher);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        // Keep at least a fifth of the slots empty.
        if (table.len + 1) * 5 > table.slots.size() * 4 && table.slots.size() < self.max_slots {
            table.grow(self.max_slots, &self.hasher);
        }
        if let Err(i) = table.find(hash, key) {
            let entry = Entry {
                key: key.to_owned(),
                state,
            };
            table.slots.put(i, meta(REFERENCED | tag_of(hash)), entry);
            table.len += 1;
        }
        Some(decision)
    }

    /// Live keys (sums the shards).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().table.len).sum()
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

    /// The default parameters (a copy).
    pub fn algorithm(&self) -> A {
        self.shards[0].lock().config.default.clone()
    }

    /// Replaces the default parameters; every key keeps its state, carried to the new
    /// parameters ([`Algorithm::carry`]).
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
        let now = self.clock.now();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            // Each key's state carried from the parameters it had to those it gets: O(keys)
            // under each shard's lock, once per change.
            let slots = &mut shard.table.slots;
            for i in 0..slots.size() {
                if let Some(e) = slots.get_mut(i) {
                    let from = current.overrides.get(&e.key).unwrap_or(&current.default);
                    let to = next.overrides.get(&e.key).unwrap_or(&next.default);
                    to.carry(from, &mut e.state, now);
                }
            }
            shard.config = next.clone();
        }
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

/// `acquire_inner` with `evict = true` always answers; this is never called.
#[cold]
fn unreachable_full() -> Decision {
    Decision::never(0, 0, 0)
}
