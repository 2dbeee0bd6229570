//! A lease server's own leases from its parent — a tree of lease servers (regional servers
//! leasing from a global one), without I/O.
//!
//! A server under a parent is the parent's client for every resource its clients use: it asks
//! for the sum of their demands (needs and wants apart) and says what it has granted below
//! ([`Ask::holds`]); what it is granted becomes the capacity it divides
//! ([`LeaseServer::lease_from_parent`](crate::server::LeaseServer::lease_from_parent)). Its
//! clients never see the parent. Safe by construction:
//!
//! - **Nothing more while asking**: from the moment an ask is sent until its answer, the
//!   capacity is frozen at the smaller of the grant and what was granted below when the ask
//!   left — so what the parent keeps counting for this server (at least that, see
//!   [`Ask::holds`]) covers every grant below, whatever the answer says and however late it
//!   comes. An ask that fails leaves the capacity frozen until an answer comes.
//! - **A grant lasts from the send**: its expiry is counted on this server's clock from when
//!   the ask was sent, less 1 % for clocks that run at different rates — never after the
//!   parent's own expiry of it, however long the answer took — and no lease below outlives it.
//! - **The parent out of reach**: the grant holds until it expires, then the safe capacity the
//!   parent last advertised (before any answer: the quota file's `safe_capacity`, else 0) —
//!   the same rule as a client's, one level up.
//!
//! Shares move at each level within the refresh intervals of that level: an ask is due at the
//! refresh time the parent set (a fifth of its interval while below its share), or sooner
//! when the demand below moved by a tenth.

use std::collections::HashMap;
use std::time::Duration;

use weir_core::{Criticality, Nanos};

use crate::lease::{Ask, Holder, Lease, Part, MAX_PARTS};

/// One resource's demand below, as a server under a parent asks for it
/// ([`LeaseServer::totals`](crate::server::LeaseServer::totals)).
#[derive(Debug, Clone, PartialEq)]
pub struct Totals {
    /// The resource.
    pub resource: String,
    /// The sum of its holders' demands.
    pub wants: f64,
    /// The sum of what they need.
    pub needs: f64,
    /// Its unexpired grants (released ones included).
    pub outstanding: f64,
    /// The demand in at most [`PARTS`] parts (see [`parts`]).
    pub parts: Vec<Part>,
}

impl Totals {
    /// The totals of `resource`'s `holders`, `outstanding` granted.
    pub fn of(resource: &str, holders: &[Holder], outstanding: f64) -> Self {
        Self::of_parted(resource, holders, outstanding, |_, _| true)
    }

    /// [`Self::of`], with the parts only if `parted(resource, wants)` (they sort the
    /// holders; only an ask due now needs them, see [`Upstream::due`]).
    pub fn of_parted(
        resource: &str,
        holders: &[Holder],
        outstanding: f64,
        parted: impl Fn(&str, f64) -> bool,
    ) -> Self {
        let (wants, needs) = holders
            .iter()
            .fold((0.0, 0.0), |(w, n), h| (w + h.demand.wants, n + h.needs));
        Totals {
            resource: resource.to_string(),
            wants,
            needs,
            outstanding,
            parts: if parted(resource, wants) {
                parts(holders, PARTS)
            } else {
                Vec::new()
            },
        }
    }
}

/// Parts a server sends its parent per resource (at most [`MAX_PARTS`]).
pub const PARTS: usize = 32;

/// The demand of `holders` in at most `max` [`Part`]s: their own parts or demands (each a
/// unit), per band sorted by what they need per unit of weight, cut into runs of about equal
/// length — the bands sharing `max` by their number of units, each at least one part. A part
/// is exact at the parent as long as the parent's water level does not fall inside its run.
pub fn parts(holders: &[Holder], max: usize) -> Vec<Part> {
    let max = max.clamp(1, MAX_PARTS);
    let mut units: Vec<Part> = Vec::new();
    for h in holders {
        if h.parts.is_empty() {
            units.push(Part {
                wants: h.demand.wants,
                needs: h.needs,
                weight: h.demand.weight,
                priority: h.demand.priority,
            });
        } else {
            units.extend_from_slice(&h.parts);
        }
    }
    if units.len() <= max {
        return units;
    }
    units.sort_by(|a, b| {
        b.priority
            .rank()
            .cmp(&a.priority.rank())
            .then((a.needs / a.weight).total_cmp(&(b.needs / b.weight)))
    });
    let mut out = Vec::with_capacity(max);
    let n = units.len();
    let mut start = 0;
    while start < n {
        let band = units[start].priority;
        let end = start
            + units[start..]
                .iter()
                .take_while(|u| u.priority == band)
                .count();
        // This band's share of the parts, at least one.
        let k = ((end - start) * max / n).max(1);
        for r in 0..k {
            let (a, b) = (
                start + (end - start) * r / k,
                start + (end - start) * (r + 1) / k,
            );
            if a == b {
                continue;
            }
            let run = &units[a..b];
            out.push(Part {
                wants: run.iter().map(|u| u.wants).sum(),
                needs: run.iter().map(|u| u.needs).sum(),
                weight: run.iter().map(|u| u.weight).sum(),
                priority: band,
            });
        }
        start = end;
    }
    out.truncate(MAX_PARTS);
    out
}

/// A grant's expiry is shortened by this fraction of its length (clock rate differences).
const DRIFT: f64 = 0.01;

/// A lease held from the parent, as a snapshot carries it to a standby of the same failover
/// group ([`Upstream::adopt`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParentGrant {
    /// Units per second granted.
    pub granted: f64,
    /// When it lapses (this server's clock; relative to the snapshot's time in a
    /// [`TableState`](crate::server::TableState)).
    pub expires_at: Nanos,
    /// The safe capacity the parent advertised.
    pub safe: f64,
    /// The lease's id at the parent.
    pub lease_id: u64,
}

/// The leases of one server from its parent.
#[derive(Debug, Default)]
pub struct Upstream {
    grants: HashMap<String, Grant>,
    /// The failover term asks are sent in ([`Ask::term`]).
    term: u64,
}

#[derive(Debug, Clone)]
struct Grant {
    granted: f64,
    /// On this server's clock; 0: no grant yet.
    expires_at: Nanos,
    /// What to use once the grant has expired.
    safe: f64,
    lease_id: u64,
    /// The next ask is due then.
    due_at: Nanos,
    /// Asked for this much last time.
    asked_wants: f64,
    /// Frozen at this capacity: an ask in flight, or failed since the last answer.
    frozen: Option<f64>,
    /// An ask is in flight: no other is sent before its answer or failure (a second one
    /// would not present the lease id the first may bring).
    in_flight: bool,
    /// The resource is no longer served here (its table is gone): once the parent granted
    /// nothing, the grant is forgotten.
    idle: bool,
}

/// One ask for the parent.
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    /// The resource.
    pub resource: String,
    /// The ask (wants, needs, has, safe, holds, lease id).
    pub ask: Ask,
    /// Its demand in parts.
    pub parts: Vec<Part>,
    /// Sent at (this server's clock).
    pub sent_at: Nanos,
}

impl Upstream {
    /// No grants yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends asks in failover term `term` from now on ([`Ask::term`]; 0: no failover group).
    pub fn set_term(&mut self, term: u64) {
        self.term = term;
    }

    /// Takes over `grant` of `resource` (a leader of the same failover group held it, see
    /// [`ParentGrant`]): in force until it lapses, its lease id presented at the next ask —
    /// due at once. A grant already held is kept if it lapses later.
    pub fn adopt(&mut self, resource: &str, grant: ParentGrant) {
        if self
            .grants
            .get(resource)
            .is_some_and(|g| g.expires_at >= grant.expires_at)
        {
            return;
        }
        self.grants.insert(
            resource.to_string(),
            Grant {
                granted: grant.granted,
                expires_at: grant.expires_at,
                safe: grant.safe,
                lease_id: grant.lease_id,
                due_at: 0,
                asked_wants: f64::NAN,
                frozen: None,
                in_flight: false,
                idle: false,
            },
        );
    }

    /// The lease held from the parent for `resource` (for a snapshot), if any is in force at
    /// `now`.
    pub fn grant(&self, resource: &str, now: Nanos) -> Option<ParentGrant> {
        Self::held(self.grants.get(resource)?, now)
    }

    /// The asks due at `now` for the resources in use (`totals`, from
    /// [`LeaseServer::totals`](crate::server::LeaseServer::totals)), and one asking nothing for
    /// each resource granted but no longer in use; `safe(resource)` is the safe capacity before
    /// the parent first answers. Each ask freezes its resource's capacity until
    /// [`Self::answered`] or after [`Self::failed`].
    pub fn asks(
        &mut self,
        totals: &[Totals],
        safe: impl Fn(&str) -> f64,
        now: Nanos,
    ) -> Vec<Asked> {
        let mut out = Vec::new();
        for t in totals {
            let g = self
                .grants
                .entry(t.resource.clone())
                .or_insert_with(|| Grant {
                    granted: 0.0,
                    expires_at: 0,
                    safe: safe(&t.resource),
                    lease_id: 0,
                    due_at: 0,
                    asked_wants: f64::NAN,
                    frozen: None,
                    in_flight: false,
                    idle: false,
                });
            g.idle = false;
            if !Self::is_due(g, t.wants, now) {
                continue;
            }
            let mut a = Self::ask(g, &t.resource, t.wants, t.needs, t.outstanding, now);
            a.parts.clone_from(&t.parts);
            a.ask.term = self.term;
            out.push(a);
        }
        let in_use: std::collections::HashSet<&str> =
            totals.iter().map(|t| t.resource.as_str()).collect();
        for (name, g) in &mut self.grants {
            if !in_use.contains(name.as_str()) && g.granted > 0.0 && !g.in_flight && now >= g.due_at
            {
                g.idle = true;
                let mut a = Self::ask(g, name, 0.0, 0.0, 0.0, now);
                a.ask.term = self.term;
                out.push(a);
            }
        }
        out
    }

    /// Whether an ask for `resource` is due at `now` with `wants` below: no ask in flight, and
    /// the parent's refresh time reached or the demand moved by a tenth. Only the resources
    /// due need their [`Totals::parts`] ([`LeaseServer::totals_parted`](crate::server::LeaseServer::totals_parted)).
    pub fn due(&self, resource: &str, wants: f64, now: Nanos) -> bool {
        self.grants
            .get(resource)
            .is_none_or(|g| Self::is_due(g, wants, now))
    }

    fn is_due(g: &Grant, wants: f64, now: Nanos) -> bool {
        // NaN (never asked) counts as moved.
        let moved = (wants - g.asked_wants)
            .abs()
            .partial_cmp(&(0.1 * g.asked_wants.max(1.0)))
            != Some(std::cmp::Ordering::Less);
        !g.in_flight && (now >= g.due_at || moved)
    }

    fn ask(g: &mut Grant, resource: &str, wants: f64, needs: f64, holds: f64, now: Nanos) -> Asked {
        let has = if g.expires_at > now { g.granted } else { 0.0 };
        let capacity = Self::in_force(g, now);
        g.frozen = Some(capacity.min(holds));
        g.asked_wants = wants;
        g.in_flight = true;
        Asked {
            resource: resource.to_string(),
            ask: Ask {
                wants,
                needs: Some(needs.min(wants)),
                has,
                safe: g.safe,
                weight: 1.0,
                priority: Criticality::Critical,
                lease_id: g.lease_id,
                holds: Some(holds),
                term: 0,
            },
            parts: Vec::new(),
            sent_at: now,
        }
    }

    /// The parent's answer to an ask sent at `sent_at`, read at `now`: `expires_in` is the
    /// lease's length as the parent stated it (relative).
    pub fn answered(
        &mut self,
        resource: &str,
        lease: &Lease,
        expires_in: Duration,
        sent_at: Nanos,
        now: Nanos,
    ) {
        let Some(g) = self.grants.get_mut(resource) else {
            return;
        };
        let length = (expires_in.as_nanos() as f64 * (1.0 - DRIFT)) as Nanos;
        g.granted = lease.granted;
        g.expires_at = sent_at.saturating_add(length);
        g.safe = lease.safe_capacity;
        g.lease_id = lease.lease_id;
        g.frozen = None;
        g.in_flight = false;
        g.due_at =
            now.saturating_add(Nanos::try_from(lease.refresh.as_nanos()).unwrap_or(Nanos::MAX));
        if lease.granted == 0.0 && g.idle {
            // Given back: forgotten until used again.
            self.grants.remove(resource);
        }
    }

    /// The ask for `resource` got no answer (the parent out of reach, or refused it): the
    /// capacity stays frozen; asked again after `retry`.
    pub fn failed(&mut self, resource: &str, retry: Duration, now: Nanos) {
        if let Some(g) = self.grants.get_mut(resource) {
            g.in_flight = false;
            g.due_at = now.saturating_add(Nanos::try_from(retry.as_nanos()).unwrap_or(Nanos::MAX));
        }
    }

    fn in_force(g: &Grant, now: Nanos) -> f64 {
        if g.expires_at > now {
            g.granted.min(g.frozen.unwrap_or(f64::INFINITY))
        } else {
            g.safe
        }
    }

    /// The capacity `resource` has at `now` and the time no lease below may outlive (`None`:
    /// on the safe capacity, no grant to outlive); `None` for a resource never asked for.
    pub fn capacity(&self, resource: &str, now: Nanos) -> Option<(f64, Option<Nanos>)> {
        let g = self.grants.get(resource)?;
        let by = (g.expires_at > now).then_some(g.expires_at);
        Some((Self::in_force(g, now), by))
    }

    /// Every resource asked for, with its capacity at `now` and the grant in force (`None`:
    /// on the safe capacity), for
    /// [`LeaseServer::lease_from_parent`](crate::server::LeaseServer::lease_from_parent).
    pub fn capacities(&self, now: Nanos) -> Vec<(String, f64, Option<ParentGrant>)> {
        self.grants
            .iter()
            .map(|(name, g)| (name.clone(), Self::in_force(g, now), Self::held(g, now)))
            .collect()
    }

    fn held(g: &Grant, now: Nanos) -> Option<ParentGrant> {
        (g.expires_at > now).then_some(ParentGrant {
            granted: g.granted,
            expires_at: g.expires_at,
            safe: g.safe,
            lease_id: g.lease_id,
        })
    }
}
