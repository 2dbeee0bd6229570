//! The lease server's core, without I/O: every resource's [`LeaseTable`], created from the
//! configuration (or a template) on first use, refreshed many resources per call. A protocol
//! front end (the HTTP/JSON API of `weir serve`, and later gRPC or Envoy's RLQS) maps its
//! requests onto [`LeaseServer::refresh`], [`LeaseServer::release`] and
//! [`LeaseServer::allocations`].

use std::collections::HashMap;

use parking_lot::Mutex;
use weir_core::Nanos;

use crate::clients::{admit, ClientRule, Denied};
use crate::config::QuotaConfig;
use crate::lease::{Ask, Holder, Lease, LeaseTable, Released};
use crate::nested::Groups;
use crate::upstream::{ParentGrant, Totals};

/// Why one resource of a refresh got no lease.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// No resource or template of that name is configured.
    #[error("unknown resource {0:?}")]
    UnknownResource(String),
    /// A group of nested resources: clients lease the resources under it.
    #[error("resource {0:?} is a group of nested resources: lease one under it ({0}/…)")]
    Group(String),
    /// The ask was not valid (negative or non-finite numbers).
    #[error("resource {resource:?}: {reason}")]
    BadAsk {
        /// The resource.
        resource: String,
        /// What is wrong.
        reason: String,
    },
    /// A bound on what the server tracks was reached (template instances, holders of a
    /// resource, leases in all): nothing granted. An Envoy bucket refused so is denied.
    #[error("resource {resource:?}: {reason}")]
    Full {
        /// The resource.
        resource: String,
        /// Which bound.
        reason: String,
    },
    /// The server holds (lost the proof of its leadership) and this resource's leases from
    /// it would already have lapsed: the client keeps its lease, then its safe capacity.
    #[error("resource {0:?}: no leader can be proven now; keep the lease you hold")]
    Unavailable(String),
}

impl Refusal {
    /// The resource refused, as the answer may show it (a name over
    /// [`MAX_RESOURCE_NAME`] bytes is cut).
    pub fn resource(&self) -> &str {
        match self {
            Refusal::UnknownResource(r) | Refusal::Group(r) | Refusal::Unavailable(r) => r,
            Refusal::BadAsk { resource, .. } | Refusal::Full { resource, .. } => resource,
        }
    }
}

/// One resource's state, for people, metrics and the dashboard.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// The resource.
    pub resource: String,
    /// Its capacity (units/s).
    pub capacity: f64,
    /// The sum of the current demands.
    pub wants: f64,
    /// The sum of unexpired grants.
    pub granted: f64,
    /// Whether it is still learning after a start.
    pub learning: bool,
    /// Refreshes answered since the table was made.
    pub refreshes: u64,
    /// Leases that lapsed without a refresh since the table was made.
    pub expirations: u64,
    /// (client, wants, granted, expires_at) per client.
    pub clients: Vec<(String, f64, f64, Nanos)>,
}

/// A capacity leased from a parent and the lease in force (none: on the safe capacity); no
/// lease given below outlives that lease.
type Leased = (f64, Option<ParentGrant>);

/// One table's state in a snapshot: its leases with `expires_at` relative to the snapshot's
/// time (so it can be resumed on another clock).
#[derive(Debug, Clone, PartialEq)]
pub struct TableState {
    /// The resource.
    pub resource: String,
    /// How much longer the table learns (0: not learning).
    pub learning_for: Nanos,
    /// The unexpired leases; `expires_at` counts from the snapshot.
    pub holders: Vec<Holder>,
    /// Grants released without proof, still counted; `expires_at` counts from the snapshot.
    pub released: Vec<Released>,
    /// Under a parent: the lease held from it; `expires_at` counts from the snapshot.
    pub parent: Option<ParentGrant>,
}

/// Template instances (resources a template created on demand), each with the client whose
/// ask created it, and how many each client created.
#[derive(Debug, Default)]
struct Instances {
    creator: HashMap<String, String>,
    per_client: HashMap<String, usize>,
}

impl Instances {
    fn len(&self) -> usize {
        self.creator.len()
    }

    fn contains(&self, resource: &str) -> bool {
        self.creator.contains_key(resource)
    }

    fn created_by(&self, client: &str) -> usize {
        self.per_client.get(client).copied().unwrap_or(0)
    }

    fn insert(&mut self, resource: &str, client: &str) {
        if let Some(old) = self
            .creator
            .insert(resource.to_string(), client.to_string())
        {
            self.forget_creator(&old);
        }
        *self.per_client.entry(client.to_string()).or_default() += 1;
    }

    fn remove(&mut self, resource: &str) {
        if let Some(client) = self.creator.remove(resource) {
            self.forget_creator(&client);
        }
    }

    fn forget_creator(&mut self, client: &str) {
        if let Some(n) = self.per_client.get_mut(client) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(client);
            }
        }
    }

    fn clear(&mut self) {
        self.creator.clear();
        self.per_client.clear();
    }
}

/// When the template instances may next be swept for room (see
/// [`LeaseServer::make_room_for_instance`]).
#[derive(Debug, Default)]
struct InstanceSweep {
    /// No instance can lapse before this time: a newcomer refused earlier costs no sweep.
    next: Nanos,
    /// Sweeps run.
    runs: u64,
}

/// Least time between two sweeps of the template instances for room, whatever lapses.
const INSTANCE_SWEEP_EVERY: Nanos = 100_000_000;

/// At most `n` bytes of `s`, cut at a character boundary.
fn truncated(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn lease_nanos(c: &crate::lease::ResourceConfig) -> Nanos {
    Nanos::try_from(c.lease.as_nanos()).unwrap_or(Nanos::MAX)
}

/// Every resource's lease table.
#[derive(Debug)]
pub struct LeaseServer {
    config: Mutex<QuotaConfig>,
    tables: Mutex<HashMap<String, LeaseTable>>,
    /// The groups above nested resources' tables (locked after `tables`, before the others).
    groups: Mutex<Groups>,
    /// Template instances and the clients who created them.
    instances: Mutex<Instances>,
    /// Tables made in the first lease length after this time learn (the server started then
    /// without a snapshot); `None`: nothing to learn.
    started_at: Mutex<Option<Nanos>>,
    /// Holding (see [`LeaseTable::hold`]): no lease outlives this time plus the lease length.
    hold: Mutex<Option<Nanos>>,
    /// Rows in all tables (kept under the `tables` lock), bounded by [`MAX_LEASES`].
    leases: std::sync::atomic::AtomicUsize,
    /// When every table was last swept because the bound was reached.
    swept_at: Mutex<Nanos>,
    /// Template instances swept for room: no sweep before this time (nothing could have
    /// lapsed), and how many sweeps ran.
    instance_sweep: Mutex<InstanceSweep>,
    /// Refreshes presenting another lease id than their row's since the last
    /// [`LeaseServer::take_stale_ids`], and the last client that did.
    stale: Mutex<(u64, Option<String>)>,
    /// Under a parent (a tree of servers): per resource, the capacity leased from it and the
    /// time no lease may outlive; `None`: capacities are the file's.
    leased: Mutex<Option<HashMap<String, Leased>>>,
}

/// Most lease rows (client × resource) one server keeps, all resources together: a newcomer
/// past it is refused, so memory stays bounded (about 600 bytes a row with the longest ids)
/// whatever ids callers invent. One resource holds at most [`crate::lease::MAX_HOLDERS`].
pub const MAX_LEASES: usize = 200_000;

/// Most template instances one server tracks (a template creates one on a client's first
/// ask with a demand); resources named in the configuration always have their table.
pub const MAX_RESOURCES: usize = 10_000;

/// Most template instances one client may have created that still exist.
pub const MAX_INSTANCES_PER_CLIENT: usize = 1_000;

/// Longest resource name (bytes) a client may ask for, and a quota file may declare.
pub use crate::config::MAX_RESOURCE_NAME;

impl LeaseServer {
    /// A server started at `now` with `config`; its tables learn for one lease length.
    pub fn new(config: QuotaConfig, now: Nanos) -> Self {
        Self {
            config: Mutex::new(config),
            tables: Mutex::new(HashMap::new()),
            groups: Mutex::new(Groups::default()),
            instances: Mutex::new(Instances::default()),
            started_at: Mutex::new(Some(now)),
            hold: Mutex::new(None),
            leases: std::sync::atomic::AtomicUsize::new(0),
            swept_at: Mutex::new(0),
            instance_sweep: Mutex::new(InstanceSweep::default()),
            stale: Mutex::new((0, None)),
            leased: Mutex::new(None),
        }
    }

    /// Takes every capacity from a parent from now on ([`crate::upstream`]): a resource has
    /// what [`Self::lease_from_parent`] last gave it, at most its capacity in the file — 0
    /// before that.
    pub fn under_parent(&self) {
        let mut leased = self.leased.lock();
        if leased.is_none() {
            *leased = Some(HashMap::new());
        }
        drop(leased);
        let mut tables = self.tables.lock();
        let config = self.config.lock().clone();
        for (name, t) in tables.iter_mut() {
            if let Some(c) = config.resource(name) {
                let (c, by) = self.in_force(name, c);
                t.reconfigure(c);
                t.expire_by(by);
            }
        }
    }

    /// `resource` has `capacity` (at most its capacity in the file), leased from the parent
    /// under `grant` (`None`: on its safe capacity): no lease given outlives the grant, and
    /// snapshots carry it to a standby.
    pub fn lease_from_parent(&self, resource: &str, capacity: f64, grant: Option<ParentGrant>) {
        let by = grant.map(|g| g.expires_at);
        let mut leased = self.leased.lock();
        let Some(map) = leased.as_mut() else {
            return;
        };
        let before = map
            .insert(resource.to_string(), (capacity, grant))
            .and_then(|(_, g)| g);
        drop(leased);
        let mut tables = self.tables.lock();
        if let Some(t) = tables.get_mut(resource) {
            let mut c = *t.config();
            if let Some(file) = self.config.lock().resource(resource) {
                c.capacity = file.capacity.min(capacity);
            }
            t.reconfigure(c);
            t.expire_by(by);
            if let (Some(lapsed), None) = (before, grant) {
                let lapsed = lapsed.expires_at;
                // The grant from the parent lapsed, and every lease given under it with it:
                // the clients are on their safe capacities until they refresh. For one lease
                // length grant none more than that (learning), or the clients refreshing first
                // would take the whole safe capacity beside those still on theirs.
                t.learn_until(lapsed.saturating_add(lease_nanos(&c)));
            }
        }
    }

    /// `c` (the file's parameters of `name`) as in force: under a parent, with the capacity
    /// leased from it (0 before any) and the time no lease may outlive.
    fn in_force(
        &self,
        name: &str,
        mut c: crate::lease::ResourceConfig,
    ) -> (crate::lease::ResourceConfig, Option<Nanos>) {
        match self.leased.lock().as_ref() {
            None => (c, None),
            Some(map) => {
                let (capacity, grant) = map.get(name).copied().unwrap_or((0.0, None));
                let by = grant.map(|g| g.expires_at);
                c.capacity = c.capacity.min(capacity);
                (c, by)
            }
        }
    }

    /// The leases held from the parent (restored from a snapshot, or recorded by
    /// [`Self::lease_from_parent`]) in force at `now`: what a leader of a failover group takes
    /// over ([`crate::upstream::Upstream::adopt`]).
    pub fn parent_grants(&self, now: Nanos) -> Vec<(String, ParentGrant)> {
        self.leased.lock().as_ref().map_or_else(Vec::new, |map| {
            map.iter()
                .filter_map(|(name, (_, g))| {
                    g.filter(|g| g.expires_at > now).map(|g| (name.clone(), g))
                })
                .collect()
        })
    }

    /// Every resource in use at `now`: the sums of its demands and grants.
    pub fn totals(&self, now: Nanos) -> Vec<Totals> {
        self.totals_parted(now, |_, _| true)
    }

    /// [`Self::totals`], with [`Totals::parts`] only for the resources `parted(resource,
    /// wants)` names (an ask due now, [`crate::upstream::Upstream::due`]): parts sort each
    /// table's holders, too much to do for every table on every tick of a large server.
    pub fn totals_parted(&self, now: Nanos, parted: impl Fn(&str, f64) -> bool) -> Vec<Totals> {
        let mut tables = self.tables.lock();
        let out = tables
            .iter_mut()
            .map(|(name, t)| {
                t.expire(now);
                Totals::of_parted(name, t.holders(), t.outstanding(), &parted)
            })
            .collect();
        self.recount(&tables);
        self.regroup(&tables);
        out
    }

    /// Counts the rows of every table again (after a change that dropped tables or rows).
    fn recount(&self, tables: &HashMap<String, LeaseTable>) {
        let n = tables.values().map(|t| t.holders().len()).sum();
        self.leases.store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// The groups above nested tables again (under the `tables` lock, after tables were
    /// dropped or leases expired in bulk).
    fn regroup(&self, tables: &HashMap<String, LeaseTable>) {
        let mut groups = self.groups.lock();
        let config = self.config.lock();
        groups.rebuild(tables, |name| config.level_params(name));
    }

    /// Rows in `before` became `after` (under the `tables` lock).
    fn counted(&self, before: usize, after: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        if after >= before {
            self.leases.fetch_add(after - before, Relaxed);
        } else {
            self.leases.fetch_sub(before - after, Relaxed);
        }
    }

    /// Lease rows held on all resources.
    pub fn leases(&self) -> usize {
        self.leases.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The longest lease length of the configuration (resources and templates).
    pub fn max_lease(&self) -> std::time::Duration {
        let c = self.config.lock();
        c.resources
            .iter()
            .chain(&c.templates)
            .map(|(_, r)| r.lease)
            .max()
            .unwrap_or_default()
    }

    /// Forgets every lease and learns again from `now` (a leader elected without a snapshot).
    pub fn restart(&self, now: Nanos) {
        let mut tables = self.tables.lock();
        tables.clear();
        self.groups.lock().clear();
        self.recount(&tables);
        drop(tables);
        *self.started_at.lock() = Some(now);
    }

    /// Holds every table (`Some(since)`): the server lost the proof of its leadership at
    /// `since`; no grant grows and no lease outlives `since` plus the resource's lease length.
    /// `None` allocates normally again.
    pub fn hold(&self, since: Option<Nanos>) {
        let mut tables = self.tables.lock();
        let mut hold = self.hold.lock();
        if *hold == since {
            return;
        }
        *hold = since;
        for t in tables.values_mut() {
            t.hold(since.map(|s| s.saturating_add(lease_nanos(t.config()))));
        }
    }

    /// The state of every table at `now`, to resume from elsewhere ([`Self::restore`]).
    pub fn snapshot(&self, now: Nanos) -> Vec<TableState> {
        let parent: HashMap<String, ParentGrant> = self.parent_grants(now).into_iter().collect();
        let mut tables = self.tables.lock();
        let mut out: Vec<TableState> = tables
            .iter_mut()
            .map(|(name, t)| {
                t.expire(now);
                TableState {
                    resource: name.clone(),
                    learning_for: t.learning_until().saturating_sub(now),
                    holders: t
                        .holders()
                        .iter()
                        .map(|h| Holder {
                            expires_at: h.expires_at.saturating_sub(now),
                            // What a server below keeps counted stays counted.
                            granted: h.counted(),
                            keeps: 0.0,
                            ..h.clone()
                        })
                        .collect(),
                    released: t
                        .released()
                        .iter()
                        .map(|r| Released {
                            expires_at: r.expires_at.saturating_sub(now),
                            ..*r
                        })
                        .collect(),
                    parent: parent.get(name).map(|g| ParentGrant {
                        expires_at: g.expires_at.saturating_sub(now),
                        ..*g
                    }),
                }
            })
            .collect();
        self.recount(&tables);
        self.regroup(&tables);
        out.sort_by(|a, b| a.resource.cmp(&b.resource));
        out
    }

    /// Replaces every table with `states` (from [`Self::snapshot`] of another server) at
    /// `now`, without learning (except what the writer still had to learn). Each lease is
    /// counted as held for one full lease length from now: the writer may have extended it
    /// after the snapshot ([`crate::ha`]); a live client's next refresh replaces it with what
    /// it really holds. Resources no longer configured are skipped. `restore(vec![], now)`
    /// starts empty without learning (every earlier lease is known to have lapsed).
    pub fn restore(&self, states: Vec<TableState>, now: Nanos) {
        let mut tables = self.tables.lock();
        let mut groups = self.groups.lock();
        let mut instances = self.instances.lock();
        let config = self.config.lock();
        tables.clear();
        instances.clear();
        if let Some(map) = self.leased.lock().as_mut() {
            // Under a parent: what the writer held from it, until it lapses — and nothing
            // else (this server held nothing from the parent as a follower).
            map.clear();
            for s in &states {
                if let Some(g) = s.parent {
                    let g = ParentGrant {
                        expires_at: now.saturating_add(g.expires_at),
                        ..g
                    };
                    map.insert(s.resource.clone(), (g.granted, Some(g)));
                }
            }
        }
        for s in states.into_iter().take(MAX_RESOURCES) {
            let Some(c) = config.resource(&s.resource) else {
                continue;
            };
            let (c, by) = self.in_force(&s.resource, c);
            if !config.is_named(&s.resource) {
                // A template instance from the snapshot: counted, its creator unknown.
                instances.insert(&s.resource, "");
            }
            let holders = s
                .holders
                .into_iter()
                .map(|h| Holder {
                    expires_at: now
                        .saturating_add(h.expires_at)
                        .max(now.saturating_add(lease_nanos(&c))),
                    ..h
                })
                .collect();
            // Released grants are counted for a full lease length too.
            let released = s
                .released
                .into_iter()
                .map(|r| Released {
                    expires_at: now
                        .saturating_add(r.expires_at)
                        .max(now.saturating_add(lease_nanos(&c))),
                    ..r
                })
                .collect();
            let mut t = LeaseTable::resume_learning(
                c,
                holders,
                released,
                now.saturating_add(s.learning_for)
                    .min(now.saturating_add(lease_nanos(&c))),
            );
            t.hold(self.hold.lock().map(|h| h.saturating_add(lease_nanos(&c))));
            if s.resource.contains('/') {
                t.set_external(false);
            }
            t.expire_by(by);
            tables.insert(s.resource, t);
        }
        self.recount(&tables);
        groups.rebuild(&tables, |name| config.level_params(name));
        *self.started_at.lock() = None;
        self.instance_sweep.lock().next = 0;
    }

    /// Checks that `client` may create the template instance `resource`, dropping lapsed
    /// instances to make room: at most [`MAX_RESOURCES`] instances in all and
    /// [`MAX_INSTANCES_PER_CLIENT`] created by one client. Records the creator.
    fn make_room_for_instance(
        &self,
        tables: &mut HashMap<String, LeaseTable>,
        client: &str,
        resource: &str,
        now: Nanos,
    ) -> Result<(), Refusal> {
        let mut instances = self.instances.lock();
        let full = |i: &Instances| {
            i.len() >= MAX_RESOURCES || i.created_by(client) >= MAX_INSTANCES_PER_CLIENT
        };
        // Make room: instances whose leases all lapsed — swept only once one can have lapsed
        // (and at most every INSTANCE_SWEEP_EVERY), so a newcomer refused at the cap costs
        // O(1) under the lock, however many arrive.
        let mut sweep = self.instance_sweep.lock();
        if full(&instances) && now >= sweep.next {
            sweep.runs += 1;
            let mut dropped = Vec::new();
            let mut next = Nanos::MAX;
            tables.retain(|name, t| {
                if !instances.contains(name) {
                    return true;
                }
                t.expire(now);
                let keep = !t.holders().is_empty() || t.learning(now);
                if keep {
                    next = next.min(t.lapses_at());
                } else {
                    dropped.push(name.clone());
                }
                keep
            });
            sweep.next = next.max(now.saturating_add(INSTANCE_SWEEP_EVERY));
            let nested = dropped.iter().any(|n| n.contains('/'));
            for name in dropped {
                instances.remove(&name);
            }
            self.recount(tables);
            if nested {
                drop(instances);
                self.regroup(tables);
                instances = self.instances.lock();
            }
        }
        drop(sweep);
        if instances.len() >= MAX_RESOURCES {
            return Err(Refusal::Full {
                resource: resource.to_string(),
                reason: format!(
                    "more than {MAX_RESOURCES} template instances in use (resources named in the quota file are not affected)"
                ),
            });
        }
        if instances.created_by(client) >= MAX_INSTANCES_PER_CLIENT {
            return Err(Refusal::Full {
                resource: resource.to_string(),
                reason: format!(
                    "client {client:?} created {MAX_INSTANCES_PER_CLIENT} template instances in use already"
                ),
            });
        }
        instances.insert(resource, client);
        Ok(())
    }

    /// A new configuration: tables of resources still configured keep their leases and take
    /// the new parameters; tables of removed resources are dropped.
    pub fn reload(&self, config: QuotaConfig) {
        let mut tables = self.tables.lock();
        let mut groups = self.groups.lock();
        let mut instances = self.instances.lock();
        tables.retain(|name, t| match config.resource(name) {
            Some(c) => {
                t.reconfigure(self.in_force(name, c).0);
                // A template instance the file now names is a configured resource.
                if config.is_named(name) {
                    instances.remove(name);
                }
                true
            }
            None => {
                instances.remove(name);
                false
            }
        });
        self.recount(&tables);
        groups.rebuild(&tables, |name| config.level_params(name));
        *self.config.lock() = config;
        // Lease lengths may have changed: the next newcomer at the cap sweeps.
        self.instance_sweep.lock().next = 0;
    }

    /// `client` refreshes `asks` at `now`: one answer per ask, in order.
    pub fn refresh(
        &self,
        client: &str,
        asks: &[(String, Ask)],
        now: Nanos,
    ) -> Vec<Result<Lease, Refusal>> {
        self.refresh_parts(client, asks, &[], now)
    }

    /// [`Self::refresh`] by a lease server below: `parts[i]` is the demand of `asks[i]` in
    /// [`Part`](crate::lease::Part)s (missing or empty: the ask's alone).
    pub fn refresh_parts(
        &self,
        client: &str,
        asks: &[(String, Ask)],
        parts: &[Vec<crate::lease::Part>],
        now: Nanos,
    ) -> Vec<Result<Lease, Refusal>> {
        let mut tables = self.tables.lock();
        asks.iter()
            .enumerate()
            .map(|(k, (resource, ask))| {
                let parts = parts.get(k).map_or(&[][..], Vec::as_slice);
                self.refresh_one(&mut tables, client, resource, *ask, parts, now)
            })
            .collect()
    }

    /// One ask of [`Self::refresh_parts`], under the tables' lock.
    fn refresh_one(
        &self,
        tables: &mut HashMap<String, LeaseTable>,
        client: &str,
        resource: &str,
        ask: Ask,
        parts: &[crate::lease::Part],
        now: Nanos,
    ) -> Result<Lease, Refusal> {
        check_name(resource)?;
        if !tables.contains_key(resource) {
            if let Some(nothing) = self.open_table(tables, client, resource, ask, now)? {
                return Ok(nothing);
            }
        }
        let table = tables
            .get_mut(resource)
            .ok_or_else(|| Refusal::UnknownResource(resource.to_string()))?;
        if let Some(since) = *self.hold.lock() {
            if since.saturating_add(lease_nanos(table.config())) <= now {
                return Err(Refusal::Unavailable(resource.to_string()));
            }
        }
        if self.leases() >= MAX_LEASES && table.holder(client).is_none() {
            self.sweep_all(tables, now);
        }
        let table = tables
            .get_mut(resource)
            .ok_or_else(|| Refusal::UnknownResource(resource.to_string()))?;
        let before = table.holders().len();
        let stale = table.stale_ids();
        if self.leases() >= MAX_LEASES && table.holder(client).is_none() {
            return Err(Refusal::Full {
                resource: resource.to_string(),
                reason: format!(
                    "more than {MAX_LEASES} leases held on this server; nothing granted"
                ),
            });
        }
        let answer = if resource.contains('/') {
            self.refresh_nested(tables, resource, client, &ask, now)
        } else {
            table.refresh_parts(client, ask, parts, now)
        };
        let after = tables.get(resource).map_or(before, |t| t.holders().len());
        self.counted(before, after);
        if tables.get(resource).is_some_and(|t| t.stale_ids() > stale) {
            let mut s = self.stale.lock();
            s.0 += 1;
            if s.1.as_deref() != Some(client) {
                s.1 = Some(client.to_string());
            }
        }
        answer.map_err(|e| match e {
            crate::allocate::QuotaError::Full(_) => Refusal::Full {
                resource: resource.to_string(),
                reason: e.to_string(),
            },
            e => Refusal::BadAsk {
                resource: resource.to_string(),
                reason: e.to_string(),
            },
        })
    }

    /// Creates `resource`'s table on its first ask (the configuration is read only then). A
    /// template instance nobody wants gets no table: its zero lease is the answer (`Some`).
    fn open_table(
        &self,
        tables: &mut HashMap<String, LeaseTable>,
        client: &str,
        resource: &str,
        ask: Ask,
        now: Nanos,
    ) -> Result<Option<Lease>, Refusal> {
        let (c, configured, levels) = {
            let config = self.config.lock();
            let c = config.resource(resource).ok_or_else(|| {
                if config.is_group(resource) {
                    Refusal::Group(resource.to_string())
                } else {
                    Refusal::UnknownResource(resource.to_string())
                }
            })?;
            (c, config.is_named(resource), config.level_params(resource))
        };
        if !configured {
            if !(ask.wants.is_finite() && ask.wants >= 0.0) {
                return Err(Refusal::BadAsk {
                    resource: resource.to_string(),
                    reason: format!("wants {}: a finite number ≥ 0", ask.wants),
                });
            }
            if ask.wants == 0.0 {
                return Ok(Some(Lease {
                    granted: 0.0,
                    expires_at: now,
                    refresh: c.refresh,
                    safe_capacity: c.safe_capacity.unwrap_or(c.capacity),
                    learning: false,
                    lease_id: 0,
                }));
            }
            self.make_room_for_instance(tables, client, resource, now)?;
        }
        // A table created in the first lease length after the start learns for what is left
        // of it; later ones start empty (nothing was handed out).
        let (c, by) = self.in_force(resource, c);
        let mut t = match *self.started_at.lock() {
            Some(start) => LeaseTable::new(c, start),
            None => LeaseTable::resume(c, Vec::new()),
        };
        if !t.learning(now) {
            t = LeaseTable::resume(c, Vec::new());
        }
        t.expire_by(by);
        t.hold(self.hold.lock().map(|h| h.saturating_add(lease_nanos(&c))));
        if let Some(levels) = levels {
            t.set_external(false);
            self.groups.lock().attach(resource, &levels);
        }
        tables.insert(resource.to_string(), t);
        Ok(None)
    }

    /// At the cap on leases, lapsed leases of other tables may still be counted: every table
    /// swept, at most every 100 ms.
    fn sweep_all(&self, tables: &mut HashMap<String, LeaseTable>, now: Nanos) {
        let mut swept = self.swept_at.lock();
        if now.saturating_sub(*swept) >= 100_000_000 {
            *swept = now;
            for t in tables.values_mut() {
                t.expire(now);
            }
            self.recount(tables);
            self.regroup(tables);
        }
    }

    /// How many refreshes presented a lease id other than the one their row holds since the
    /// last call, and the last client that did (`None`: none). Many from one client id mean
    /// two processes share it — each takes the row from the other and both get a fraction —
    /// or a client whose leases keep lapsing; the front end warns.
    pub fn take_stale_ids(&self) -> Option<(u64, String)> {
        let mut s = self.stale.lock();
        let n = std::mem::take(&mut s.0);
        let client = s.1.take()?;
        (n > 0).then_some((n, client))
    }

    /// `client` gives back its leases on `resources` (shutting down), each with the lease id
    /// it holds (0: unknown): a grant released without its id keeps counting until it would
    /// have expired ([`LeaseTable::release`]). Answers, per resource, whether the capacity was
    /// freed at once. A table left without holders or released grants (and not learning) is
    /// dropped: templates create one per name, and names come and go (one per user, say).
    pub fn release(&self, client: &str, resources: &[(String, u64)]) -> Vec<bool> {
        let mut tables = self.tables.lock();
        resources
            .iter()
            .map(|(r, lease_id)| {
                let Some(t) = tables.get_mut(r) else {
                    return false;
                };
                let (before, held) = (t.holders().len(), t.outstanding());
                let freed = t.release(client, *lease_id);
                self.counted(before, t.holders().len());
                let nested = r.contains('/');
                if nested {
                    let holders = t.holders().len() as isize - before as isize;
                    self.groups
                        .lock()
                        .charge(r, t.outstanding() - held, holders);
                }
                if t.holders().is_empty() && t.released().is_empty() && t.learning_until() == 0 {
                    tables.remove(r);
                    if nested {
                        self.groups.lock().detach(r);
                    }
                    self.instances.lock().remove(r);
                }
                freed
            })
            .collect()
    }

    /// The `clients` entry serving a lease-API caller `client` that presented `bearer` (its
    /// `Authorization: Bearer` token, if any); apply it to the caller's asks
    /// ([`ClientRule::apply`]) before [`Self::refresh`].
    pub fn admit(&self, client: &str, bearer: Option<&str>) -> Result<ClientRule, Denied> {
        admit(&self.config.lock().clients, client, bearer).map(std::borrow::Cow::into_owned)
    }

    /// The id of the lease `client` holds on `resource` (0: none) — for a front end whose
    /// callers prove their identity another way (an RLQS stream holds its client id alone);
    /// never to be answered to a lease-API caller.
    pub fn lease_id_of(&self, client: &str, resource: &str) -> u64 {
        self.tables
            .lock()
            .get(resource)
            .and_then(|t| t.holder(client))
            .map_or(0, |h| h.lease_id)
    }

    /// What `resource`'s table counts for `client` against the capacity: its grant and what
    /// a server below keeps counted ([`crate::lease::Holder::counted`]); 0 without a row.
    pub fn counted_for(&self, client: &str, resource: &str) -> f64 {
        self.tables
            .lock()
            .get(resource)
            .and_then(|t| t.holder(client))
            .map_or(0.0, crate::lease::Holder::counted)
    }

    /// The `rlqs` section in force, if any.
    pub fn rlqs_config(&self) -> Option<std::sync::Arc<crate::config::RlqsConfig>> {
        self.config.lock().rlqs.clone()
    }

    /// The configured safe capacity of `resource` (units/s), if the file sets one.
    pub fn safe_capacity(&self, resource: &str) -> Option<f64> {
        self.config
            .lock()
            .resource(resource)
            .and_then(|c| c.safe_capacity)
    }

    /// The configured capacity of `resource` (units/s), if configured.
    pub fn capacity(&self, resource: &str) -> Option<f64> {
        self.config.lock().resource(resource).map(|c| c.capacity)
    }

    /// Every resource in use at `now` (expired leases dropped first), sorted by name.
    pub fn allocations(&self, now: Nanos) -> Vec<Allocation> {
        let mut tables = self.tables.lock();
        let mut out: Vec<Allocation> = tables
            .iter_mut()
            .map(|(name, t)| {
                t.expire(now);
                Allocation {
                    resource: name.clone(),
                    capacity: t.config().capacity,
                    wants: t.holders().iter().map(|h| h.demand.wants).sum::<f64>() + 0.0,
                    granted: t.outstanding(),
                    learning: t.learning(now),
                    refreshes: t.refreshes(),
                    expirations: t.expirations(),
                    clients: t
                        .holders()
                        .iter()
                        .map(|h| (h.client.clone(), h.demand.wants, h.granted, h.expires_at))
                        .collect(),
                }
            })
            .collect();
        self.recount(&tables);
        self.regroup(&tables);
        out.sort_by(|a, b| a.resource.cmp(&b.resource));
        out
    }

    /// A refresh of nested resource `resource` (its table exists): granted at most what every
    /// group above leaves, from the shares of its whole family's division ([`crate::nested`]).
    fn refresh_nested(
        &self,
        tables: &mut HashMap<String, LeaseTable>,
        resource: &str,
        client: &str,
        ask: &Ask,
        now: Nanos,
    ) -> Result<Lease, crate::allocate::QuotaError> {
        let mut groups = self.groups.lock();
        let t = tables
            .get_mut(resource)
            .ok_or(crate::allocate::QuotaError::Full(0))?;
        let (held, holders) = (t.outstanding(), t.holders().len());
        let entered = t.enter(client, ask, now);
        let (entered_held, entered_holders) = (t.outstanding(), t.holders().len());
        groups.charge(
            resource,
            entered_held - held,
            entered_holders as isize - holders as isize,
        );
        let i = entered?;
        if t.shares_due(now) {
            if groups.divided_lately(resource, now, t.recompute()) {
                t.split_evenly(now);
            } else {
                groups.divide(resource, tables, now);
            }
        }
        let t = tables
            .get_mut(resource)
            .ok_or(crate::allocate::QuotaError::Full(0))?;
        let above = groups.room(resource, t.holders()[i].granted);
        let mut lease = t.grant(i, ask, now, above);
        groups.charge(resource, t.outstanding() - entered_held, 0);
        if t.config().safe_capacity.is_none() {
            lease.safe_capacity = lease.safe_capacity.min(groups.safe(resource));
        }
        Ok(lease)
    }
}

/// A resource name an ask may carry: not too long, no control characters (named in the
/// refusal safely: truncated or escaped).
fn check_name(resource: &str) -> Result<(), Refusal> {
    if resource.len() > MAX_RESOURCE_NAME {
        return Err(Refusal::BadAsk {
            resource: format!("{}…", truncated(resource, 64)),
            reason: format!("resource name longer than {MAX_RESOURCE_NAME} bytes"),
        });
    }
    if resource.chars().any(char::is_control) {
        return Err(Refusal::BadAsk {
            resource: resource.escape_debug().to_string(),
            reason: "resource name with a control character".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const S: Nanos = 1_000_000_000;

    impl LeaseServer {
        fn lease_id(&self, client: &str, resource: &str) -> u64 {
            self.lease_id_of(client, resource)
        }

        /// A refresh by the holder itself: it presents its lease ids.
        fn refresh_held(
            &self,
            client: &str,
            asks: &[(String, Ask)],
            now: Nanos,
        ) -> Vec<Result<Lease, Refusal>> {
            let asks: Vec<(String, Ask)> = asks
                .iter()
                .map(|(r, a)| {
                    let lease_id = self.lease_id(client, r);
                    (r.clone(), Ask { lease_id, ..*a })
                })
                .collect();
            self.refresh(client, &asks, now)
        }
    }

    fn config(yaml: &str) -> QuotaConfig {
        QuotaConfig::from_yaml(Path::new("q.yaml"), yaml).unwrap()
    }

    fn ask(resource: &str, wants: f64) -> (String, Ask) {
        (resource.to_string(), Ask::wants(wants))
    }

    /// Two processes sharing one client id take the row from each other in turn: counted, so
    /// the front end can say so.
    #[test]
    fn two_processes_sharing_a_client_id_are_noticed() {
        let s = LeaseServer::new(config("resources:\n  - {name: a, capacity: 10}\n"), 0);
        s.restore(Vec::new(), 0);
        let with = |id: u64| {
            let (r, a) = ask("a", 5.0);
            vec![(r, Ask { lease_id: id, ..a })]
        };
        let mut ids = [0u64; 2];
        for round in 0..4 {
            for id in &mut ids {
                *id = s.refresh("region", &with(*id), round * S)[0]
                    .as_ref()
                    .unwrap()
                    .lease_id;
            }
        }
        let (n, client) = s.take_stale_ids().expect("noticed");
        assert!(n >= 6, "{n}");
        assert_eq!(client, "region");
        assert!(s.take_stale_ids().is_none(), "taken");
    }

    #[test]
    fn many_resources_per_call_templates_and_unknown_ones() {
        let s = LeaseServer::new(
            config("resources:\n  - {name: a, capacity: 10}\n  - {name: 't-*', capacity: 4}\n"),
            0,
        );
        // After the first lease length: no learning.
        let r = s.refresh_held(
            "c1",
            &[ask("a", 6.0), ask("t-x", 9.0), ask("nope", 1.0)],
            31 * S,
        );
        assert_eq!(r[0].as_ref().unwrap().granted, 6.0);
        assert_eq!(r[1].as_ref().unwrap().granted, 4.0);
        assert_eq!(r[2], Err(Refusal::UnknownResource("nope".into())));
        let all = s.allocations(31 * S);
        assert_eq!(all.len(), 2);
        assert_eq!((all[0].resource.as_str(), all[0].granted), ("a", 6.0));
        let id = s.lease_id("c1", "a");
        assert_eq!(s.release("c1", &[("a".into(), id)]), vec![true]);
        // Without holders the table is dropped (templates make one per name).
        let all = s.allocations(31 * S);
        assert_eq!((all.len(), all[0].resource.as_str()), (1, "t-x"));
    }

    #[test]
    fn a_snapshot_resumes_elsewhere_without_learning_and_holding_caps_leases() {
        let a = LeaseServer::new(config("resources:\n  - {name: r, capacity: 10}\n"), 0);
        a.refresh_held("c1", &[ask("r", 6.0)], 31 * S);
        a.refresh_held("c2", &[ask("r", 6.0)], 32 * S);
        let snap = a.snapshot(33 * S);
        assert_eq!(snap[0].holders.len(), 2);
        assert_eq!(
            snap[0].holders[0].expires_at,
            28 * S,
            "relative to the snapshot"
        );
        // Another server, on another clock (now = 5 s), resumes: no learning, the leases
        // count as held for a lease length (until 35 s), so a newcomer gets only what is left.
        let b = LeaseServer::new(config("resources:\n  - {name: r, capacity: 10}\n"), 5 * S);
        b.restore(snap, 5 * S);
        let all = b.allocations(5 * S);
        assert!(!all[0].learning);
        assert_eq!(all[0].granted, 10.0);
        assert_eq!(all[0].clients[1].3, 35 * S);
        let c3 = b.refresh_held("c3", &[ask("r", 6.0)], 6 * S);
        assert_eq!(c3[0].as_ref().unwrap().granted, 0.0);
        // Holding since 7 s: c1 cannot grow, its lease ends by 37 s; past that, refused.
        b.hold(Some(7 * S));
        let c1 = b.refresh_held("c1", &[ask("r", 9.0)], 8 * S)[0]
            .clone()
            .unwrap();
        assert!(c1.granted <= 6.0 && c1.expires_at == 37 * S && c1.learning);
        assert_eq!(
            b.refresh_held("c1", &[ask("r", 9.0)], 37 * S)[0],
            Err(Refusal::Unavailable("r".into()))
        );
        b.hold(None);
        assert!(b.refresh_held("c1", &[ask("r", 9.0)], 38 * S)[0].is_ok());
        // Starting empty after a long outage: no learning.
        b.restore(Vec::new(), 40 * S);
        let c4 = b.refresh_held("c4", &[ask("r", 4.0)], 40 * S)[0]
            .clone()
            .unwrap();
        assert_eq!((c4.granted, c4.learning), (4.0, false));
    }

    #[test]
    fn the_server_keeps_at_most_max_leases_rows() {
        let s = LeaseServer::new(
            config("resources:\n  - {name: a, capacity: 10}\n  - {name: b, capacity: 10}\n  - {name: c, capacity: 10}\n"),
            0,
        );
        s.restore(Vec::new(), 0);
        let per = crate::lease::MAX_HOLDERS;
        for r in ["a", "b"] {
            for i in 0..per.min(MAX_LEASES / 2) {
                s.refresh(&format!("x{i}"), &[ask(r, 0.001)], 0)[0]
                    .as_ref()
                    .unwrap();
            }
        }
        assert_eq!(s.leases(), MAX_LEASES);
        let refused = s.refresh("late", &[ask("c", 1.0)], 0);
        assert!(
            matches!(&refused[0], Err(Refusal::Full { reason, .. }) if reason.contains("leases held on this server")),
            "{refused:?}"
        );
        // A holder still refreshes; lapsed leases make room again.
        assert!(s.refresh_held("x1", &[ask("a", 1.0)], 2 * S)[0].is_ok());
        assert!(s.refresh("late", &[ask("c", 1.0)], 31 * S)[0].is_ok());
        assert_eq!(s.leases(), 2);
    }

    #[test]
    fn a_started_server_learns_then_a_reload_keeps_leases() {
        let s = LeaseServer::new(config("resources:\n  - {name: a, capacity: 10}\n"), 0);
        let held = (
            "a".to_string(),
            Ask {
                has: 3.0,
                ..Ask::wants(8.0)
            },
        );
        // Learning: confirms what is held, grants nothing new.
        assert_eq!(
            s.refresh_held("c1", std::slice::from_ref(&held), S)[0]
                .as_ref()
                .unwrap()
                .granted,
            3.0
        );
        assert!(s.allocations(S)[0].learning);
        s.reload(config("resources:\n  - {name: a, capacity: 20}\n"));
        assert_eq!(s.allocations(S)[0].capacity, 20.0);
        assert_eq!(
            s.allocations(S)[0].granted,
            3.0,
            "lease kept across the reload"
        );
        s.reload(config("resources: []\n"));
        assert!(s.allocations(S).is_empty());
    }

    #[test]
    fn names_are_bounded_and_template_instances_cannot_lock_anyone_out() {
        let s = LeaseServer::new(
            config("resources:\n  - {name: search, capacity: 10}\n  - {name: 'tenant-*', capacity: 5}\n"),
            0,
        );
        s.restore(Vec::new(), 0); // no learning
                                  // A name over 256 bytes is refused, and named in the answer by its start only.
        let long = format!("tenant-{}", "x".repeat(MAX_RESOURCE_NAME));
        match &s.refresh_held("c", &[ask(&long, 1.0)], S)[0] {
            Err(Refusal::BadAsk { resource, reason }) => {
                assert!(resource.len() < 80 && reason.contains("longer than 256 bytes"));
            }
            other => panic!("{other:?}"),
        }
        // A zero demand creates no instance.
        let zero = s.refresh_held("c", &[ask("tenant-idle", 0.0)], S);
        assert_eq!(zero[0].as_ref().unwrap().granted, 0.0);
        assert!(s.allocations(S).iter().all(|a| a.resource != "tenant-idle"));
        // One client creates at most MAX_INSTANCES_PER_CLIENT instances…
        let asks: Vec<(String, Ask)> = (0..=MAX_INSTANCES_PER_CLIENT)
            .map(|i| ask(&format!("tenant-junk{i}"), 1.0))
            .collect();
        let answers = s.refresh_held("mallory", &asks, S);
        assert!(answers[..MAX_INSTANCES_PER_CLIENT]
            .iter()
            .all(Result::is_ok));
        assert!(matches!(
            &answers[MAX_INSTANCES_PER_CLIENT],
            Err(Refusal::Full { reason, .. }) if reason.contains("template instances in use already")
        ));
        // … ten clients fill the server's instances, yet configured resources and other
        // clients' existing instances are served.
        for c in 1..10 {
            let asks: Vec<(String, Ask)> = (0..MAX_INSTANCES_PER_CLIENT)
                .map(|i| ask(&format!("tenant-junk{c}-{i}"), 1.0))
                .collect();
            s.refresh_held(&format!("mallory{c}"), &asks, S);
        }
        let new = s.refresh_held("alice", &[ask("tenant-alice", 1.0), ask("search", 4.0)], S);
        assert!(
            matches!(&new[0], Err(Refusal::Full { reason, .. }) if reason.contains("resources named in the quota file are not affected"))
        );
        assert_eq!(new[1].as_ref().unwrap().granted, 4.0);
        // Refusing newcomers at the cap costs no sweep of the tables until a lease can have
        // lapsed: 10 000 more, from clients old and new, ran at most the one sweep above.
        let swept = s.instance_sweep.lock().runs;
        for c in 0..10 {
            let asks: Vec<(String, Ask)> = (0..1_000)
                .map(|i| ask(&format!("tenant-new{c}-{i}"), 1.0))
                .collect();
            let answers = s.refresh_held(&format!("newcomer{c}"), &asks, S + c);
            assert!(answers
                .iter()
                .all(|a| matches!(a, Err(Refusal::Full { .. }))));
        }
        assert!(s.instance_sweep.lock().runs <= swept + 1);
        // Once their leases lapse, the instances make room.
        let later = 100 * S;
        let new = s.refresh_held("alice", &[ask("tenant-alice", 1.0)], later);
        assert_eq!(new[0].as_ref().unwrap().granted, 1.0);
        // -0.0 is 0.
        let g = s.refresh_held("bob", &[ask("search", -0.0)], later)[0]
            .as_ref()
            .unwrap()
            .granted;
        assert!(g == 0.0 && g.is_sign_positive());
    }
}
