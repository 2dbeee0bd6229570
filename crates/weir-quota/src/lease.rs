//! The lease table of one resource: who holds how much of its capacity, until when.
//!
//! Each refresh from a client records its demand, recomputes every client's fair share with
//! [`allocate`](crate::allocate()) and grants this client
//! `min(its fair share, capacity − what all other clients hold)`. So:
//!
//! - **Never overshoot**: the sum of unexpired grants never exceeds the capacity, at any
//!   instant — a client whose share grew gets the increase only as the others' grants shrink
//!   (at their next refresh, or when their lease expires). Such a client is told to refresh
//!   five times as often until it holds its share, so convergence to the fair shares takes
//!   about one refresh interval.
//! - **Cheap refreshes**: a refresh costs O(1) however many clients hold leases (up to
//!   [`MAX_HOLDERS`]): fair shares are recomputed (O(n log n)) at most every 100 ms (or a
//!   tenth of the refresh interval) and when a holder comes or goes — in a table of more than
//!   [`EXACT_UP_TO`] holders a newcomer instead starts from an even split of the capacity
//!   until the next recomputation (and is told to come back five times sooner) — the sum of
//!   grants is kept as they change, and lapsed leases are swept at most as often. A grant is
//!   still capped by the current demand and by what is left.
//! - **Leases expire**: a client that stops refreshing loses its grant at the lease's expiry,
//!   and the capacity returns to the pool. [`LeaseTable::release`] gives it back at once.
//! - **Only the holder gives a lease back**: every holder's lease carries an unguessable
//!   [`Lease::lease_id`]; a refresh or release that does not present it (another process
//!   using the same client id, or one that lost its id) cannot prove the grant unused, so the
//!   grant it replaces or releases keeps counting against the capacity until it would have
//!   expired. Whatever ids and calls a caller sends, grants in force never sum past the
//!   capacity.
//! - **Learning after a restart**: a table that starts without a snapshot does not know what
//!   was handed out before. For one lease length it confirms what each client says it holds
//!   (`has`), or grants what the client uses on its own without a lease (`safe`, its safe
//!   capacity), whichever is more — capped by its fair share and by what is left — and lets
//!   no grant grow past that: any lease from before the restart has expired by the end of it,
//!   and meanwhile no client uses more than it would without the server (the bound:
//!   grants + the safe capacities of clients granted nothing). A capacity of 0 never learns.
//!   [`LeaseTable::resume`] starts from a snapshot instead, without learning.
//! - **Holding**: a server that can no longer prove it is the leader ([`crate::ha`]) keeps
//!   answering from memory but lets no grant grow, and no lease it gives outlives a cap
//!   ([`LeaseTable::hold`]), so a leader elected meanwhile can account for every grant.
//!
//! Time is read by the caller (`now`, weir-core nanoseconds), so the table runs as well on a
//! manual clock as on a real one.

use std::collections::HashMap;
use std::time::Duration;

use weir_core::{Criticality, Nanos};

use crate::allocate::{allocate, Demand, Division, QuotaError};

/// A resource's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResourceConfig {
    /// Units per second shared by all clients.
    pub capacity: f64,
    /// How the capacity is divided.
    pub algorithm: Division,
    /// How long a grant is valid without a refresh.
    pub lease: Duration,
    /// How often clients should refresh.
    pub refresh: Duration,
    /// What a client may use when it cannot reach the server (default: capacity ÷ the number
    /// of clients last seen).
    pub safe_capacity: Option<f64>,
}

impl Default for ResourceConfig {
    fn default() -> Self {
        Self {
            capacity: 0.0,
            algorithm: Division::FairShare,
            lease: Duration::from_secs(30),
            refresh: Duration::from_secs(5),
            safe_capacity: None,
        }
    }
}

/// A client's refresh: its demand and what it believes it holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ask {
    /// Units per second it would use (with headroom for growth).
    pub wants: f64,
    /// Of `wants`, what it needs now (its measured rate, say): shares are divided on needs
    /// first, and the headroom above (`wants − needs`) is granted only from capacity nobody
    /// needs — so a light client's headroom never starves a heavy one. `None`: all of
    /// `wants` is needed.
    pub needs: Option<f64>,
    /// What it holds now (its last grant, if unexpired; 0 otherwise).
    pub has: f64,
    /// What it uses on its own while it holds no lease (its safe capacity; infinite for an
    /// Envoy bucket without an assignment, 0 when unknown): a learning table grants up to the
    /// larger of this and `has`, so a restart never lets a client use more than it would
    /// without the server.
    pub safe: f64,
    /// Its weight within its band (> 0).
    pub weight: f64,
    /// Its band.
    pub priority: Criticality,
    /// The [`Lease::lease_id`] of the lease it holds (0: none or unknown). A refresh that
    /// presents the current id may shrink or release the grant at once; one that does not is
    /// served as a new holder, the old grant counting until it would have expired.
    pub lease_id: u64,
    /// A lease server below (a tree of servers): what it has granted its own clients when it
    /// sent this ask — it grants nothing more until the answer. A grant shrinking below it
    /// keeps counting that much (never more than it counted before) until the holder's next
    /// refresh, while the clients below shrink; `None` for a client.
    pub holds: Option<f64>,
    /// A lease server below in a failover group: its leader's term (the election's fencing
    /// token; 0: none). A standby elected leader takes over the group's lease (its id, from
    /// the snapshot) in a newer term; an ask in an older term than the row has seen — a
    /// deposed leader's, however late it arrives — is refused, so only one leader of the
    /// group moves the grant.
    pub term: u64,
}

impl Ask {
    /// `wants`, holding nothing, weight 1, CRITICAL.
    pub fn wants(wants: f64) -> Self {
        Self {
            wants,
            needs: None,
            has: 0.0,
            safe: 0.0,
            weight: 1.0,
            priority: Criticality::Critical,
            lease_id: 0,
            holds: None,
            term: 0,
        }
    }
}

/// Most [`Part`]s one ask may carry.
pub const MAX_PARTS: usize = 64;

/// Largest weight: of a client in the quota file's `clients` section, and of one [`Part`] a
/// lease server below states (a heavier part is refused: what a child states decides the
/// division, so it is bounded as the file's own weights are).
pub const MAX_WEIGHT: f64 = 1e6;

/// One part of a lease server's demand on its parent (a tree of servers): a group of its
/// clients alike in band and in demand per weight, so the parent divides its capacity among
/// the clients of all its children nearly as if they were its own (exactly, when each part's
/// clients are on one side of the parent's water level).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Part {
    /// What the group wants, in all.
    pub wants: f64,
    /// What it needs, in all (at most `wants`).
    pub needs: f64,
    /// The sum of its clients' weights (> 0).
    pub weight: f64,
    /// Its clients' band.
    pub priority: Criticality,
}

/// The answer to a refresh.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lease {
    /// Units per second the client may use until `expires_at`.
    pub granted: f64,
    /// When the grant lapses without a refresh.
    pub expires_at: Nanos,
    /// When to refresh (from now).
    pub refresh: Duration,
    /// What to use when the server cannot be reached once the lease has expired.
    pub safe_capacity: f64,
    /// The table is learning (just started): it confirmed what the client holds and granted
    /// nothing new. A client holding nothing keeps its safe capacity meanwhile.
    pub learning: bool,
    /// Proof of holding this lease, to present on the next refresh or release
    /// ([`Ask::lease_id`]); unchanged while the client keeps presenting it (0: no table was
    /// made, nothing to prove).
    pub lease_id: u64,
}

/// One client's row.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    /// The client's id.
    pub client: String,
    /// Its last demand.
    pub demand: Demand,
    /// Of `demand.wants`, what it needs ([`Ask::needs`]; equal when it gave none).
    pub needs: f64,
    /// What it holds.
    pub granted: f64,
    /// Until when.
    pub expires_at: Nanos,
    /// The lease's id, known only to the holder (and the snapshot).
    pub lease_id: u64,
    /// A lease server below ([`Ask::holds`]): what it still has granted below beyond
    /// `granted`, counted against the capacity until its next refresh (0 for a client).
    pub keeps: f64,
    /// A lease server below: its demand in [`Part`]s, divided as if they were clients (empty:
    /// `demand` and `needs` alone).
    pub parts: Vec<Part>,
    /// The newest failover term a lease server below asked in while presenting this row's
    /// lease id ([`Ask::term`]; 0: none yet).
    pub term: u64,
}

impl Holder {
    /// What the row counts against the capacity: its grant and what it keeps.
    pub fn counted(&self) -> f64 {
        self.granted + self.keeps
    }
}

/// A grant given back, or replaced, by a caller that did not prove it held it: it may still
/// be in use, so it counts against the capacity until it would have expired.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Released {
    /// Units per second.
    pub granted: f64,
    /// When the lease would have expired.
    pub expires_at: Nanos,
}

/// Up to this many holders, the fair shares are computed again as soon as a holder comes or
/// goes (tens of microseconds); above, at most every 100 ms, a newcomer starting from an even
/// split meanwhile (so a thousand clients joining at once do not cost a thousand
/// recomputations).
pub const EXACT_UP_TO: usize = 1_000;

/// Most holders of one resource's table; a newcomer past it is refused
/// ([`QuotaError::Full`]) and gets nothing — a lease client keeps its lease, then its safe
/// capacity, and an Envoy bucket is denied.
pub const MAX_HOLDERS: usize = 100_000;

/// The lease table of one resource.
#[derive(Debug)]
pub struct LeaseTable {
    config: ResourceConfig,
    /// Until this time, only confirm what clients hold.
    learning_until: Nanos,

    holders: Vec<Holder>,
    index: HashMap<String, usize>,
    /// Grants given back or replaced without proof that they are unused (see [`Released`]),
    /// merged by expiry so that there are at most about 17.
    released: Vec<Released>,
    /// The sum of `holders[].granted` and `released[].granted` (kept as they change, and
    /// summed again whenever leases expire).
    outstanding: f64,
    /// No lease (held or released) expires before this time: [`Self::expire`] scans only
    /// from then on.
    next_expiry: Nanos,
    /// Reused buffers for allocation; `shares[i]` is `holders[i]`'s fair share as of
    /// `shares_at` (`None`: to recompute now — a reconfiguration or a sweep changed them);
    /// `provisional[i]`: an even split given to a newcomer since then.
    demands: Vec<Demand>,
    shares: Vec<f64>,
    provisional: Vec<bool>,
    /// When lapsed leases were last swept on a refresh.
    swept_at: Nanos,
    /// The second pass (headroom from what nobody needs).
    extra: Vec<f64>,
    /// Per demand divided: the holder it is part of, what it wants (the headroom pass) and
    /// its share.
    owners: Vec<usize>,
    wants: Vec<f64>,
    part_shares: Vec<f64>,
    shares_at: Option<Nanos>,
    /// Clients seen at the last refresh (for the default safe capacity).
    clients_seen: usize,
    /// Since when `clients_seen` has not grown: it shrinks to the holders left only a lease
    /// length later, so leases lapsing together (a pause of the server, a parent's grant
    /// lapsing) never make the even split advertised to the first refresher the whole capacity.
    seen_since: Nanos,
    /// Holding: no grant grows, no lease outlives this time.
    hold: Option<Nanos>,
    /// No lease outlives this time: the server's own lease from its parent ends then (a tree
    /// of lease servers).
    expires_by: Option<Nanos>,
    /// Between [`Self::enter`] and [`Self::grant`]: what the refreshing holder counted before,
    /// if it proved its lease (0 otherwise).
    proven: f64,
    /// Shares set from outside ([`Self::set_shares`]): a nested resource, divided with its
    /// whole family by the server. `Some(large)`: the family holds more than [`EXACT_UP_TO`]
    /// leases (a newcomer starts from an even split until the next division).
    external: Option<bool>,
    /// Refreshes answered and leases expired since the table was made.
    refreshes: u64,
    expirations: u64,
    /// Refreshes that presented a lease id other than their row's (see
    /// [`LeaseTable::stale_ids`]).
    stale_ids: u64,
    /// Makes lease ids.
    ids: LeaseIds,
}

/// Lease ids: a keyed hash (SipHash with keys from the operating system's random source, as
/// std's `RandomState` draws them) of a counter, so one id tells nothing about another.
#[derive(Debug)]
struct LeaseIds {
    key: std::collections::hash_map::RandomState,
    next: u64,
}

impl LeaseIds {
    fn new() -> Self {
        Self {
            key: std::collections::hash_map::RandomState::new(),
            next: 0,
        }
    }

    fn make(&mut self) -> u64 {
        use std::hash::BuildHasher;
        self.next += 1;
        // 0 means "no id".
        self.key.hash_one(self.next).max(1)
    }
}

fn nanos(d: Duration) -> Nanos {
    Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX)
}

impl LeaseTable {
    /// A table starting at `now` without knowledge of earlier grants: it learns for one lease
    /// length (see the module documentation).
    pub fn new(config: ResourceConfig, now: Nanos) -> Self {
        let mut t = Self::resume(config, Vec::new());
        t.learning_until = now.saturating_add(nanos(config.lease));
        t
    }

    /// A table continuing from `holders` (a snapshot), without learning.
    pub fn resume(config: ResourceConfig, holders: Vec<Holder>) -> Self {
        let mut t = Self {
            config,
            learning_until: 0,
            clients_seen: holders.len(),
            seen_since: 0,
            holders,
            index: HashMap::new(),
            released: Vec::new(),
            outstanding: 0.0,
            next_expiry: 0,
            demands: Vec::new(),
            shares: Vec::new(),
            provisional: Vec::new(),
            swept_at: 0,
            extra: Vec::new(),
            owners: Vec::new(),
            wants: Vec::new(),
            part_shares: Vec::new(),
            shares_at: None,
            hold: None,
            expires_by: None,
            proven: 0.0,
            external: None,
            refreshes: 0,
            expirations: 0,
            stale_ids: 0,
            ids: LeaseIds::new(),
        };
        t.holders.truncate(MAX_HOLDERS);
        t.reindex();
        t.resum();
        t
    }

    /// A table continuing from `holders` and `released` grants that still learns until
    /// `learning_until` (a snapshot, possibly taken while its writer was learning).
    pub fn resume_learning(
        config: ResourceConfig,
        holders: Vec<Holder>,
        released: Vec<Released>,
        learning_until: Nanos,
    ) -> Self {
        let mut t = Self::resume(config, holders);
        for r in released {
            t.retire(r);
        }
        t.learning_until = learning_until;
        t
    }

    /// Learns until `until` (see the module documentation), as a table that just started:
    /// no grant past what a client holds or uses on its own.
    pub fn learn_until(&mut self, until: Nanos) {
        self.learning_until = self.learning_until.max(until);
    }

    /// When learning ends (0 or a past time: not learning).
    pub fn learning_until(&self) -> Nanos {
        self.learning_until
    }

    /// Holds the table (`Some(cap)`): from now on no grant grows and no lease given outlives
    /// `cap`; `None` grants normally again.
    pub fn hold(&mut self, cap: Option<Nanos>) {
        self.hold = cap;
    }

    /// No lease given from now on outlives `by` (`None`: the lease length alone) — a server
    /// whose capacity is leased from a parent until then.
    pub fn expire_by(&mut self, by: Option<Nanos>) {
        self.expires_by = by;
    }

    /// Refreshes answered since the table was made.
    pub fn refreshes(&self) -> u64 {
        self.refreshes
    }

    /// Leases that lapsed without a refresh since the table was made.
    pub fn expirations(&self) -> u64 {
        self.expirations
    }

    /// Refreshes that presented a lease id, but not the one their client's row holds: a
    /// client that lost its lease (it expired, another took the row), or two processes
    /// sharing one client id, each taking the row from the other in turn.
    pub fn stale_ids(&self) -> u64 {
        self.stale_ids
    }

    /// The resource's parameters.
    pub fn config(&self) -> &ResourceConfig {
        &self.config
    }

    /// New parameters (a reload); grants above a lowered capacity shrink at their holders'
    /// next refresh, never beyond what the table already holds.
    pub fn reconfigure(&mut self, config: ResourceConfig) {
        self.config = config;
        self.shares_at = None;
    }

    /// Whether the table is still confirming grants from before a restart (never for a
    /// capacity of 0: nothing can have been granted).
    pub fn learning(&self, now: Nanos) -> bool {
        now < self.learning_until && self.config.capacity > 0.0
    }

    /// The earliest time the table may have no holder and no learning left: the latest
    /// holder's expiry or the end of learning, whichever is later (a refresh only moves it
    /// later).
    pub fn lapses_at(&self) -> Nanos {
        self.holders
            .iter()
            .map(|h| h.expires_at)
            .max()
            .unwrap_or(0)
            .max(self.learning_until)
    }

    /// The unexpired grants, one row per client.
    pub fn holders(&self) -> &[Holder] {
        &self.holders
    }

    /// `client`'s row, if it holds one.
    pub fn holder(&self, client: &str) -> Option<&Holder> {
        self.index.get(client).map(|&i| &self.holders[i])
    }

    /// Grants given back or replaced without proof, still counted until they would have
    /// expired.
    pub fn released(&self) -> &[Released] {
        &self.released
    }

    /// The sum of unexpired grants, released ones included.
    pub fn outstanding(&self) -> f64 {
        self.outstanding.max(0.0)
    }

    /// The capacity a client should use when it cannot reach the server.
    pub fn safe_capacity(&self) -> f64 {
        self.config
            .safe_capacity
            .unwrap_or(self.config.capacity / self.clients_seen.max(1) as f64)
    }

    /// Drops the leases expired at `now`; answers how many holders lost theirs. O(1) until
    /// the earliest lease expires.
    pub fn expire(&mut self, now: Nanos) -> usize {
        if now < self.next_expiry {
            return 0;
        }
        let before = self.holders.len();
        self.holders.retain(|h| h.expires_at > now);
        self.released.retain(|r| r.expires_at > now);
        let expired = before - self.holders.len();
        if expired != 0 {
            self.reindex();
            self.shares_at = None;
            self.expirations += expired as u64;
        }
        self.resum();
        expired
    }

    /// Sums the outstanding grants and finds the next expiry again.
    fn resum(&mut self) {
        let held = self.holders.iter().map(|h| (h.counted(), h.expires_at));
        let released = self.released.iter().map(|r| (r.granted, r.expires_at));
        let (mut sum, mut next) = (0.0, Nanos::MAX);
        for (g, at) in held.chain(released) {
            sum += g;
            next = next.min(at);
        }
        self.outstanding = sum;
        self.next_expiry = next;
    }

    /// Counts `r` until it would have expired.
    fn retire(&mut self, r: Released) {
        if r.granted <= 0.0 {
            return;
        }
        self.outstanding += r.granted;
        self.next_expiry = self.next_expiry.min(r.expires_at);
        // Merged with one expiring within a sixteenth of a lease length (keeping the later
        // expiry): at most about 17 entries, whatever the number of calls.
        let slack = nanos(self.config.lease / 16);
        if let Some(m) = self
            .released
            .iter_mut()
            .find(|m| m.expires_at.abs_diff(r.expires_at) <= slack)
        {
            m.granted += r.granted;
            m.expires_at = m.expires_at.max(r.expires_at);
        } else {
            self.released.push(r);
        }
    }

    /// Gives `client`'s grant back. With the holder's `lease_id` the capacity is free at
    /// once; without it (0 or another id) the grant keeps counting until it would have
    /// expired — the caller may not be the holder. Answers whether it was freed at once.
    pub fn release(&mut self, client: &str, lease_id: u64) -> bool {
        let Some(i) = self.index.remove(client) else {
            return false;
        };
        if self.incremental() && self.aligned() {
            self.shares.swap_remove(i);
            self.provisional.swap_remove(i);
        } else {
            self.shares_at = None;
        }
        let h = self.holders.swap_remove(i);
        if let Some(moved) = self.holders.get(i) {
            self.index.insert(moved.client.clone(), i);
        }
        let proven = lease_id != 0 && lease_id == h.lease_id;
        self.outstanding -= h.counted();
        if !proven {
            // Counted on as a released grant.
            self.retire(Released {
                granted: h.counted(),
                expires_at: h.expires_at,
            });
        }
        proven
    }

    /// Whether a holder may come or go without a recomputation: a large table, or a table of
    /// a large family.
    fn incremental(&self) -> bool {
        self.external.unwrap_or(self.holders.len() > EXACT_UP_TO)
    }

    /// Makes this a nested resource's table: its shares come from [`Self::set_shares`].
    pub(crate) fn set_external(&mut self, large: bool) {
        self.external = Some(large);
    }

    /// Whether the shares are due again at `now` (a holder came or went, or they are older
    /// than the recomputation interval).
    pub(crate) fn shares_due(&self, now: Nanos) -> bool {
        !(self.aligned()
            && self
                .shares_at
                .is_some_and(|at| now.saturating_sub(at) < self.recompute()))
    }

    /// Every holder's share (in [`Self::holders`] order), computed at `now` by whoever
    /// divides this table's family; `large`: see [`Self::set_external`].
    pub(crate) fn set_shares(&mut self, shares: &[f64], now: Nanos, large: bool) {
        self.shares.clear();
        self.shares.extend_from_slice(shares);
        self.shares.resize(self.holders.len(), 0.0);
        self.provisional.clear();
        self.provisional.resize(self.holders.len(), false);
        self.shares_at = Some(now);
        self.external = Some(large);
    }

    /// Until the family's next division: every holder an even split of the capacity (marked
    /// provisional, so told to come back sooner).
    pub(crate) fn split_evenly(&mut self, now: Nanos) {
        let even = self.config.capacity / self.holders.len().max(1) as f64;
        self.shares.clear();
        self.shares.resize(self.holders.len(), even);
        self.provisional.clear();
        self.provisional.resize(self.holders.len(), true);
        self.shares_at = Some(now);
    }

    /// Each holder's demand for a division (needs first, as [`Self::shares`] divides).
    pub(crate) fn demands(&self, needs: bool) -> impl Iterator<Item = Demand> + '_ {
        self.holders.iter().map(move |h| Demand {
            wants: if needs { h.needs } else { h.demand.wants },
            ..h.demand
        })
    }

    pub(crate) fn recompute(&self) -> Nanos {
        nanos(self.config.refresh / 10).min(100_000_000)
    }

    /// Whether `shares` has one entry per holder (so rows can come and go without a
    /// recomputation).
    fn aligned(&self) -> bool {
        self.shares_at.is_some()
            && self.shares.len() == self.holders.len()
            && self.provisional.len() == self.holders.len()
    }

    /// [`Self::aligned`] before the holder just pushed.
    fn aligned_but_one(&self) -> bool {
        self.shares_at.is_some()
            && self.shares.len() + 1 == self.holders.len()
            && self.provisional.len() + 1 == self.holders.len()
    }

    fn reindex(&mut self) {
        self.index.clear();
        for (i, h) in self.holders.iter().enumerate() {
            self.index.insert(h.client.clone(), i);
        }
    }

    /// Checks an ask's numbers; answers its demand and needs.
    fn check(&self, ask: &Ask) -> Result<(Demand, f64), QuotaError> {
        let demand = Demand {
            wants: ask.wants,
            weight: ask.weight,
            priority: ask.priority,
        };
        // Checks the demand (and capacity) before anything changes.
        allocate(
            self.config.capacity,
            self.config.algorithm,
            &[demand],
            &mut Vec::with_capacity(1),
        )?;
        if !(ask.has.is_finite() && ask.has >= 0.0) {
            return Err(QuotaError::Wants {
                client: 0,
                value: ask.has,
            });
        }
        if ask.safe.is_nan() || ask.safe < 0.0 {
            return Err(QuotaError::Wants {
                client: 0,
                value: ask.safe,
            });
        }
        let needs = match ask.needs {
            Some(n) if n.is_finite() && n >= 0.0 => n.min(ask.wants),
            Some(n) => {
                return Err(QuotaError::Wants {
                    client: 0,
                    value: n,
                })
            }
            None => ask.wants,
        };
        Ok((demand, needs))
    }

    /// `client`'s row, made if it has none (or if the caller does not present its lease id:
    /// the old grant is then released unproven and a new row starts from nothing).
    fn row(
        &mut self,
        client: &str,
        ask: &Ask,
        demand: Demand,
        needs: f64,
        learning: bool,
    ) -> Result<usize, QuotaError> {
        if let Some(&i) = self.index.get(client) {
            let term = self.holders[i].term;
            if ask.term != 0 && ask.term < term {
                return Err(QuotaError::Superseded {
                    got: ask.term,
                    newer: term,
                });
            }
            if ask.lease_id != 0 && ask.lease_id == self.holders[i].lease_id {
                self.holders[i].term = term.max(ask.term);
                return Ok(i);
            }
            if ask.lease_id != 0 {
                self.stale_ids += 1;
            }
            self.release(client, 0);
        }
        if self.holders.len() >= MAX_HOLDERS {
            return Err(QuotaError::Full(MAX_HOLDERS));
        }
        // Unknown to this table: while learning, what the client says it holds may still be
        // out there; otherwise it holds nothing from us.
        let granted = if learning { ask.has } else { 0.0 };
        self.outstanding += granted;
        self.holders.push(Holder {
            client: client.to_string(),
            demand,
            needs,
            granted,
            expires_at: 0,
            lease_id: self.ids.make(),
            keeps: 0.0,
            parts: Vec::new(),
            // A term counts only from the holder of the row's lease (a refresh presenting its
            // id): a caller claiming the row's client id cannot freeze the real holder's asks
            // with a huge term.
            term: 0,
        });
        self.index
            .insert(client.to_string(), self.holders.len() - 1);
        if self.incremental() && self.aligned_but_one() {
            // A large table: an even split until the next recomputation.
            self.shares
                .push(self.config.capacity / self.holders.len() as f64);
            self.provisional.push(true);
        } else {
            self.shares_at = None;
        }
        Ok(self.holders.len() - 1)
    }

    /// Recomputes the fair shares when they are older than `recompute` (or a holder came or
    /// went): needs first, then what nobody needs goes to the headroom above the needs.
    fn shares(&mut self, now: Nanos) -> Result<(), QuotaError> {
        // At most every `recompute`: O(n log n) per refresh would cost a resource with
        // thousands of clients more than the rest of the call. A share at most that old only
        // delays a demand change; grants stay bounded by what is left, so never past the
        // capacity.
        if !self.shares_due(now) || self.external.is_some() {
            return Ok(());
        }
        // Each holder one demand, or its parts: needs first.
        self.demands.clear();
        self.owners.clear();
        self.wants.clear();
        for (i, h) in self.holders.iter().enumerate() {
            if h.parts.is_empty() {
                self.demands.push(Demand {
                    wants: h.needs,
                    ..h.demand
                });
                self.wants.push(h.demand.wants);
                self.owners.push(i);
            } else {
                for p in &h.parts {
                    self.demands.push(Demand {
                        wants: p.needs,
                        weight: p.weight,
                        priority: p.priority,
                    });
                    self.wants.push(p.wants);
                    self.owners.push(i);
                }
            }
        }
        allocate(
            self.config.capacity,
            self.config.algorithm,
            &self.demands,
            &mut self.part_shares,
        )?;
        let left = self.config.capacity - self.part_shares.iter().sum::<f64>();
        let headroom = self
            .wants
            .iter()
            .zip(&self.demands)
            .any(|(w, d)| *w > d.wants);
        if left > 1e-9 && headroom {
            for (d, (w, s)) in self
                .demands
                .iter_mut()
                .zip(self.wants.iter().zip(&self.part_shares))
            {
                d.wants = (w - s).max(0.0);
            }
            allocate(left, self.config.algorithm, &self.demands, &mut self.extra)?;
            for (s, e) in self.part_shares.iter_mut().zip(&self.extra) {
                *s += e;
            }
        }
        self.shares.clear();
        self.shares.resize(self.holders.len(), 0.0);
        for (&i, s) in self.owners.iter().zip(&self.part_shares) {
            self.shares[i] += s;
        }
        self.provisional.clear();
        self.provisional.resize(self.holders.len(), false);
        self.shares_at = Some(now);
        Ok(())
    }

    /// `client` refreshes at `now` with `ask`: its new lease.
    pub fn refresh(&mut self, client: &str, ask: Ask, now: Nanos) -> Result<Lease, QuotaError> {
        self.refresh_parts(client, ask, &[], now)
    }

    /// A refresh from a lease server below whose demand comes in `parts` (at most
    /// [`MAX_PARTS`]; `ask.wants` and `ask.needs` should be their sums): its share is what its
    /// parts get as if each were a client.
    pub fn refresh_parts(
        &mut self,
        client: &str,
        ask: Ask,
        parts: &[Part],
        now: Nanos,
    ) -> Result<Lease, QuotaError> {
        let i = self.enter(client, &ask, now)?;
        self.set_parts(i, parts)?;
        self.shares(now)?;
        Ok(self.grant(i, &ask, now, f64::INFINITY))
    }

    /// Checks `parts` and records them in row `i`; a change of parts makes the shares due.
    pub(crate) fn set_parts(&mut self, i: usize, parts: &[Part]) -> Result<(), QuotaError> {
        if parts.len() > MAX_PARTS {
            return Err(QuotaError::Wants {
                client: i,
                value: parts.len() as f64,
            });
        }
        for p in parts {
            for v in [p.wants, p.needs] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(QuotaError::Wants {
                        client: i,
                        value: v,
                    });
                }
            }
            if !(p.weight.is_finite() && p.weight > 0.0 && p.weight <= MAX_WEIGHT) {
                return Err(QuotaError::Weight {
                    client: i,
                    value: p.weight,
                });
            }
        }
        let h = &mut self.holders[i];
        if h.parts.as_slice() != parts {
            h.parts.clear();
            h.parts.extend(parts.iter().map(|p| Part {
                needs: p.needs.min(p.wants),
                ..*p
            }));
            // Parts weigh in the division as a whole: not an even-split newcomer.
            if !self.incremental() {
                self.shares_at = None;
            }
        }
        Ok(())
    }

    /// The first half of a refresh: checks `ask`, sweeps lapsed leases, and records the
    /// demand in `client`'s row (made if needed); answers the row. The shares are then due
    /// ([`Self::shares_due`]) before [`Self::grant`].
    pub(crate) fn enter(
        &mut self,
        client: &str,
        ask: &Ask,
        now: Nanos,
    ) -> Result<usize, QuotaError> {
        let (demand, needs) = self.check(ask)?;
        // Lapsed leases are swept at most every 100 ms here: until then they still count
        // against the capacity, which errs on the safe side.
        if now >= self.next_expiry && now.saturating_sub(self.swept_at) >= 100_000_000 {
            self.swept_at = now;
            self.expire(now);
        }
        let learning = self.learning(now);
        // What a holder proving its lease counted before this refresh (what a server below
        // may keep counted: never a newcomer's claim).
        self.proven = self
            .index
            .get(client)
            .map(|&i| &self.holders[i])
            .filter(|h| ask.lease_id != 0 && ask.lease_id == h.lease_id)
            .map_or(0.0, Holder::counted);
        let i = self.row(client, ask, demand, needs, learning)?;
        self.holders[i].demand = demand;
        self.holders[i].needs = needs;
        Ok(i)
    }

    /// The second half of a refresh: row `i`'s grant, at most its share, what is left of the
    /// capacity, and `above` (what the groups above a nested resource leave it).
    pub(crate) fn grant(&mut self, i: usize, ask: &Ask, now: Nanos, above: f64) -> Lease {
        // Past the parent's grant (its next capacity not applied yet): nothing beyond what a
        // client uses on its own, as while learning.
        let learning = self.learning(now) || self.expires_by.is_some_and(|by| now >= by);
        let (granted_before, held) = (self.holders[i].granted, self.holders[i].counted());
        let room = (self.config.capacity - (self.outstanding - held))
            .min(above)
            .max(0.0);
        // A cached share may come from a larger demand: never more than wanted now.
        let fair = self.shares.get(i).copied().unwrap_or(0.0).min(ask.wants);
        let mut granted = if learning {
            // Capacity granted before the restart may still be in use: confirm what the client
            // holds, or grant what it uses on its own without a lease (its safe capacity),
            // whichever is more — never more than it would use anyway.
            fair.min(ask.has.max(ask.safe)).min(room)
        } else {
            fair.min(room)
        };
        let mut expires_at = now.saturating_add(nanos(self.config.lease));
        if let Some(cap) = self.hold {
            // Holding: what the client held at most, for no longer than the cap.
            granted = granted.min(granted_before);
            expires_at = expires_at.min(cap);
        }
        if let Some(by) = self.expires_by {
            expires_at = expires_at.min(by);
        }
        // -0.0 (from a `wants` of -0.0) is reported as 0.
        if granted == 0.0 {
            granted = 0.0;
        }
        // A server below keeps counting what it still has out (at most what it counted), until
        // its clients shrink to the new grant.
        let keeps = ask
            .holds
            .filter(|h| h.is_finite())
            .map_or(0.0, |h| (h.min(self.proven) - granted).max(0.0));
        let learning = learning || self.hold.is_some();
        self.refreshes += 1;
        self.outstanding += granted + keeps - held;
        self.next_expiry = self.next_expiry.min(expires_at);
        let h = &mut self.holders[i];
        h.granted = granted;
        h.keeps = keeps;
        h.expires_at = expires_at;
        let lease_id = h.lease_id;
        let n = self.holders.len();
        if n >= self.clients_seen || now.saturating_sub(self.seen_since) >= nanos(self.config.lease)
        {
            self.clients_seen = n;
            self.seen_since = now;
        }
        // Held below its fair share (waiting for others to shrink): come back sooner, so the
        // room they free is taken within a fraction of the interval.
        let refresh = if (granted + 1e-9 < fair || self.provisional.get(i).copied().unwrap_or(true))
            && !learning
        {
            self.config.refresh / 5
        } else {
            self.config.refresh
        };
        Lease {
            granted,
            expires_at,
            refresh,
            // A learning table has seen only some of the clients: the even split it would
            // advertise is too large, so it never advertises more than the grant or what the
            // client already uses alone (a bare ask: its grant).
            safe_capacity: if learning {
                self.safe_capacity().min(ask.has.max(ask.safe).max(granted))
            } else {
                self.safe_capacity()
            },
            learning,
            lease_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    impl LeaseTable {
        /// A refresh by the holder itself: it presents its lease id.
        fn refresh_held(
            &mut self,
            client: &str,
            ask: Ask,
            now: Nanos,
        ) -> Result<Lease, QuotaError> {
            let lease_id = self
                .index
                .get(client)
                .map_or(0, |&i| self.holders[i].lease_id);
            self.refresh(client, Ask { lease_id, ..ask }, now)
        }
    }

    fn config(capacity: f64) -> ResourceConfig {
        ResourceConfig {
            capacity,
            ..ResourceConfig::default()
        }
    }

    #[test]
    fn grants_follow_fair_shares_without_overshoot() {
        let mut t = LeaseTable::resume(config(10.0), Vec::new());
        // a alone gets all it wants.
        let a = t.refresh_held("a", Ask::wants(8.0), 0).unwrap();
        assert_eq!(a.granted, 8.0);
        // b's fair share is 5, but only 2 are free until a shrinks.
        let b = t.refresh_held("b", Ask::wants(8.0), S).unwrap();
        assert_eq!(b.granted, 2.0);
        assert!(t.outstanding() <= 10.0);
        // a refreshes: shrinks to its fair 5; b's next refresh gets the freed capacity.
        assert_eq!(
            t.refresh_held("a", Ask::wants(8.0), 5 * S).unwrap().granted,
            5.0
        );
        assert_eq!(
            t.refresh_held("b", Ask::wants(8.0), 6 * S).unwrap().granted,
            5.0
        );
        assert_eq!(t.outstanding(), 10.0);
    }

    /// A term counts only from the holder of the row's lease: a caller claiming a child's id
    /// with a huge term (and no lease id) cannot freeze the real child's asks.
    #[test]
    fn a_term_counts_only_from_the_leases_holder() {
        let mut t = LeaseTable::resume(config(10.0), Vec::new());
        let ask = |lease_id, term| Ask {
            lease_id,
            term,
            ..Ask::wants(4.0)
        };
        let id = t.refresh("child", ask(0, 3), 0).unwrap().lease_id;
        let id = t.refresh("child", ask(id, 3), S).unwrap().lease_id;
        // The impostor takes the row (it has the child's id) but its term is not recorded.
        t.refresh("child", ask(0, 1 << 63), 2 * S).unwrap();
        assert!(t.refresh("child", ask(id, 3), 3 * S).is_ok(), "frozen");
        // A proven term still fences a deposed leader's late asks.
        let id = t.holder("child").unwrap().lease_id;
        t.refresh("child", ask(id, 4), 4 * S).unwrap();
        assert!(matches!(
            t.refresh("child", ask(id, 3), 5 * S),
            Err(QuotaError::Superseded { got: 3, newer: 4 })
        ));
    }

    #[test]
    fn expired_and_released_leases_return_their_capacity() {
        let mut t = LeaseTable::resume(config(10.0), Vec::new());
        t.refresh_held("a", Ask::wants(10.0), 0).unwrap();
        assert_eq!(
            t.refresh_held("b", Ask::wants(10.0), S).unwrap().granted,
            0.0
        );
        // a's lease (30 s) lapses: b gets everything.
        assert_eq!(
            t.refresh_held("b", Ask::wants(10.0), 31 * S)
                .unwrap()
                .granted,
            10.0
        );
        assert_eq!(t.holders().len(), 1);
        assert!(t.release("b", t.holders()[0].lease_id));
        assert_eq!(t.outstanding(), 0.0);
        assert_eq!(
            t.refresh_held("c", Ask::wants(4.0), 32 * S)
                .unwrap()
                .granted,
            4.0
        );
    }

    #[test]
    fn learning_grants_what_clients_hold_or_use_on_their_own_never_more() {
        let mut t = LeaseTable::new(config(10.0), 0);
        let ask = |wants, has| Ask {
            has,
            ..Ask::wants(wants)
        };
        assert!(t.learning(0));
        // A bare ask (holding nothing, nothing used alone) is told no safe capacity above its
        // grant.
        let bare = t.refresh_held("bare", Ask::wants(9.0), S).unwrap();
        assert!(
            bare.learning && bare.safe_capacity <= bare.granted,
            "{bare:?}"
        );
        t.release("bare", bare.lease_id);
        // a held 6 before the restart: confirmed; b held 4: confirmed; c held nothing, and
        // nothing is left.
        assert_eq!(t.refresh_held("a", ask(9.0, 6.0), S).unwrap().granted, 6.0);
        assert_eq!(t.refresh_held("b", ask(9.0, 4.0), S).unwrap().granted, 4.0);
        let c = t.refresh_held("c", ask(9.0, 0.0), S).unwrap();
        assert_eq!((c.granted, c.learning), (0.0, true));
        // a's fair share is now 10/3: its confirmed grant shrinks to it.
        let a = t.refresh_held("a", ask(9.0, 6.0), 2 * S).unwrap().granted;
        assert!((a - 10.0 / 3.0).abs() < 1e-9, "{a}");
        // c holds nothing and uses 2 on its own: what a freed, up to that.
        let c = t
            .refresh_held(
                "c",
                Ask {
                    safe: 2.0,
                    ..ask(9.0, 0.0)
                },
                2 * S,
            )
            .unwrap();
        assert_eq!((c.granted, c.learning), (2.0, true));
        assert!(t.outstanding() <= 10.0 + 1e-9);
        // A newcomer whose own rate is unbounded (an Envoy bucket without an assignment) gets
        // its share of what is left at once; one that says nothing, nothing.
        let mut alone = LeaseTable::new(config(10.0), 0);
        let open = Ask {
            safe: f64::INFINITY,
            ..ask(4.0, 0.0)
        };
        assert_eq!(alone.refresh_held("n", open, S).unwrap().granted, 4.0);
        assert_eq!(
            alone.refresh_held("m", ask(4.0, 0.0), S).unwrap().granted,
            0.0
        );
        // A capacity of 0 has nothing to learn: the answer is 0, not "learning".
        let mut zero = LeaseTable::new(config(0.0), 0);
        let z = zero.refresh_held("n", ask(4.0, 3.0), S).unwrap();
        assert_eq!((z.granted, z.learning), (0.0, false));
        // After one lease length, the table grants again.
        assert!(!t.learning(31 * S));
        let c = t.refresh_held("c", ask(9.0, 0.0), 31 * S).unwrap().granted;
        assert!(c > 0.0);
        assert!(t.outstanding() <= 10.0 + 1e-9);
    }

    #[test]
    fn safe_capacity_defaults_to_an_even_split_of_the_clients_seen() {
        let mut t = LeaseTable::resume(config(12.0), Vec::new());
        assert_eq!(
            t.refresh_held("a", Ask::wants(1.0), 0)
                .unwrap()
                .safe_capacity,
            12.0
        );
        t.refresh_held("b", Ask::wants(1.0), 0).unwrap();
        assert_eq!(
            t.refresh_held("c", Ask::wants(1.0), 0)
                .unwrap()
                .safe_capacity,
            4.0
        );
        let mut fixed = config(12.0);
        fixed.safe_capacity = Some(1.5);
        t.reconfigure(fixed);
        assert_eq!(
            t.refresh_held("a", Ask::wants(1.0), 0)
                .unwrap()
                .safe_capacity,
            1.5
        );
    }

    #[test]
    fn headroom_comes_only_from_capacity_nobody_needs() {
        let mut t = LeaseTable::resume(config(20.0), Vec::new());
        let ask = |needs: f64| Ask {
            needs: Some(needs),
            ..Ask::wants(needs * 1.2 + 1.0)
        };
        // A light client (needs 8, wants 10.6) and a heavy one (needs 40): the heavy one gets
        // all the light one does not need, not 20 − 10.6.
        t.refresh_held("light", ask(8.0), 0).unwrap();
        t.refresh_held("heavy", ask(40.0), 0).unwrap();
        let light = t.refresh_held("light", ask(8.0), S).unwrap().granted;
        let heavy = t.refresh_held("heavy", ask(40.0), S).unwrap().granted;
        assert_eq!((light, heavy), (8.0, 12.0));
        // Below capacity, the headroom is granted: 8 × 1.2 + 1 and 5 × 1.2 + 1.
        t.refresh_held("heavy", ask(5.0), 2 * S).unwrap();
        let light = t.refresh_held("light", ask(8.0), 3 * S).unwrap().granted;
        let heavy = t.refresh_held("heavy", ask(5.0), 3 * S).unwrap().granted;
        assert!(
            (light - 10.6).abs() < 1e-9 && (heavy - 7.0).abs() < 1e-9,
            "{light} {heavy}"
        );
    }

    #[test]
    fn a_held_table_lets_no_grant_grow_and_no_lease_outlive_the_cap() {
        let mut t = LeaseTable::resume(config(10.0), Vec::new());
        t.refresh_held("a", Ask::wants(4.0), 0).unwrap();
        t.hold(Some(20 * S));
        // a wants more: it keeps 4; b is new: nothing, flagged so it keeps its safe capacity.
        let a = t.refresh_held("a", Ask::wants(9.0), S).unwrap();
        assert_eq!((a.granted, a.expires_at, a.learning), (4.0, 20 * S, true));
        let b = t.refresh_held("b", Ask::wants(9.0), S).unwrap();
        assert_eq!((b.granted, b.learning), (0.0, true));
        // Shrinking is still allowed.
        assert_eq!(
            t.refresh_held("a", Ask::wants(1.0), 2 * S).unwrap().granted,
            1.0
        );
        assert_eq!(t.refreshes(), 4);
        t.hold(None);
        assert_eq!(
            t.refresh_held("b", Ask::wants(9.0), 3 * S).unwrap().granted,
            9.0
        );
        // Both leases lapse: two expirations.
        assert_eq!(t.expire(60 * S), 2);
        assert_eq!(t.expirations(), 2);
    }

    #[test]
    fn a_newcomer_gets_its_exact_share_at_once_or_in_a_large_table_an_even_split_first() {
        // A small table computes the shares again when a holder comes: a shrinks at once.
        let mut t = LeaseTable::resume(config(10.0), Vec::new());
        t.refresh_held("a", Ask::wants(8.0), 0).unwrap();
        assert_eq!(
            t.refresh_held("b", Ask::wants(8.0), 1).unwrap().granted,
            2.0
        );
        assert_eq!(
            t.refresh_held("a", Ask::wants(8.0), 2).unwrap().granted,
            5.0
        );
        // A table of more than EXACT_UP_TO holders: a newcomer 50 ms after the last
        // computation starts from an even split (capacity ÷ holders), told to come back in a
        // fifth of the refresh interval; 100 ms on, its exact max-min share.
        let capacity = (EXACT_UP_TO + 1) as f64;
        let mut t = LeaseTable::resume(config(capacity), Vec::new());
        for i in 0..=EXACT_UP_TO {
            t.refresh_held(&i.to_string(), Ask::wants(0.001), 0)
                .unwrap();
        }
        let c = t.refresh_held("c", Ask::wants(900.0), S / 20).unwrap();
        let even = capacity / (EXACT_UP_TO + 2) as f64;
        assert_eq!((c.granted, c.refresh), (even, Duration::from_secs(1)));
        let c = t.refresh_held("c", Ask::wants(900.0), S / 5).unwrap();
        assert_eq!((c.granted, c.refresh), (900.0, Duration::from_secs(5)));
        assert!(t.outstanding() <= capacity);
    }

    #[test]
    fn a_table_holds_at_most_max_holders() {
        let mut t = LeaseTable::resume(config(1000.0), Vec::new());
        for i in 0..MAX_HOLDERS {
            t.refresh(&i.to_string(), Ask::wants(0.001), 0).unwrap();
        }
        assert_eq!(
            t.refresh("one-more", Ask::wants(1.0), 0),
            Err(QuotaError::Full(MAX_HOLDERS))
        );
        // A holder refreshes as before; once leases lapse there is room again.
        t.refresh_held("7", Ask::wants(0.002), 2 * S).unwrap();
        assert!(t.refresh("one-more", Ask::wants(1.0), 31 * S).is_ok());
        assert_eq!(t.holders().len(), 2);
    }

    #[test]
    fn bad_asks_change_nothing() {
        let mut t = LeaseTable::resume(config(10.0), Vec::new());
        assert!(t.refresh_held("a", Ask::wants(-1.0), 0).is_err());
        assert!(t
            .refresh_held(
                "a",
                Ask {
                    has: f64::NAN,
                    ..Ask::wants(1.0)
                },
                0
            )
            .is_err());
        assert!(t.holders().is_empty());
    }
}
