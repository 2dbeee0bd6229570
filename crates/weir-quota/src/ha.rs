//! Failover: several lease servers, one leader, decided through a shared store (Redis in
//! `weir serve`), without I/O here.
//!
//! Each server runs a *campaign* every [`HaConfig::renew`]: one atomic call to the store that
//! either renews its leader key (checked against its fencing token, and writing the
//! allocation [`Snapshot`] in the same call) or, when the key is free, takes it with a new,
//! larger token — or learns who leads. [`Leadership`] turns the answers into a [`Role`]:
//!
//! - **Leader** while its last renewal succeeded and its proof is fresh: the key cannot have
//!   expired in the store before `sent_at + ttl` of the last successful renewal (less a tenth
//!   for clock-rate differences). Only the leader allocates.
//! - **Holding** as soon as a renewal fails (the store is unreachable, or slow): it keeps
//!   answering from memory — the store being down must not stop the quota — but lets no grant
//!   grow, and no lease it gives outlives the end of its proof plus one lease length
//!   ([`crate::server::LeaseServer::hold`]).
//! - **Follower** when another server leads: it answers with the leader's address.
//!
//! Why two leaders cannot both hand out the capacity: a new leader is elected only after the
//! old key expired, so after the old leader's proof ended. It resumes from the old leader's
//! last snapshot and counts every lease in it as held for one full lease length from its
//! election — longer than any lease the old leader, holding, can still give. What the new
//! leader cannot see is grant growth after the old leader's last snapshot: at most one
//! renewal interval of it (a second by default), while every grant that grew did so into
//! room freed by others, and the new leader learns each live client's real holding at its
//! next refresh. A leader elected without a recent snapshot learns for one lease length
//! instead ([`crate::lease`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use weir_core::{Criticality, Nanos};

use crate::allocate::Demand;
use crate::lease::{Holder, Released};
use crate::server::TableState;
use crate::upstream::ParentGrant;

/// Timing of the leader key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HaConfig {
    /// The leader key's time to live in the store; a dead leader is replaced within about
    /// `ttl + renew`.
    pub ttl: Duration,
    /// How often every server campaigns (the leader renews and writes its snapshot).
    pub renew: Duration,
}

impl Default for HaConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(5),
            renew: Duration::from_secs(1),
        }
    }
}

pub use weir_core::election::Term;

/// What a server is, at a given time.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    /// It allocates.
    Leader,
    /// Its last campaign failed, or its proof ends (ended) at `since`: it answers from memory,
    /// growing no grant, no lease past `since` + one lease length.
    Holding {
        /// When its proof ends.
        since: Nanos,
    },
    /// Another server leads (its address, if known).
    Follower {
        /// The leader's advertised address.
        leader: Option<String>,
    },
}

/// What the server must do with its lease tables after an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Nothing: its tables are the truth.
    Keep,
    /// Newly elected with a snapshot from another leader: resume from it.
    Restore(Snapshot),
    /// Newly elected with no usable snapshot: forget everything and learn for one lease length.
    Learn,
    /// No longer the leader: drop the tables (a later election restores from the store).
    Forget,
}

/// Turns campaign answers into a [`Role`] (see the module documentation).
#[derive(Debug)]
pub struct Leadership {
    config: HaConfig,
    /// The token of the term this server holds or last held.
    token: Option<u64>,
    /// Whether it holds the key (as far as it knows).
    leading: bool,
    /// Its proof ends then.
    proof_until: Nanos,
    /// The last campaign failed.
    failing: bool,
    leader: Option<String>,
}

fn nanos(d: Duration) -> Nanos {
    Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX)
}

impl Leadership {
    /// A server that has not campaigned yet (a follower with no known leader).
    pub fn new(config: HaConfig) -> Self {
        Self {
            config,
            token: None,
            leading: false,
            proof_until: 0,
            failing: false,
            leader: None,
        }
    }

    /// The timing.
    pub fn config(&self) -> &HaConfig {
        &self.config
    }

    /// The fencing token of the current (or last) term.
    pub fn token(&self) -> Option<u64> {
        self.token.filter(|_| self.leading)
    }

    /// The campaign sent at `sent_at` got `answer` (`Err`: the store could not be reached).
    pub fn on_answer(&mut self, sent_at: Nanos, answer: Result<Term, String>) -> Action {
        match answer {
            Ok(Term::Leader {
                token,
                elected,
                snapshot,
            }) => {
                let previous = if self.leading { self.token } else { None };
                let was_leading = self.leading;
                self.leading = true;
                self.failing = false;
                self.leader = None;
                let ttl = nanos(self.config.ttl);
                self.proof_until = sent_at.saturating_add(ttl - ttl / 10);
                let last_term = self.token.replace(token);
                if !elected && was_leading {
                    return Action::Keep;
                }
                let snapshot = snapshot.and_then(|b| Snapshot::decode(&b).ok());
                match (snapshot, previous.or(last_term)) {
                    // This server led last (the key lapsed, nobody else took it): its tables
                    // are newer than any snapshot.
                    (Some(s), Some(mine)) if s.token <= mine && was_leading => Action::Keep,
                    (None, Some(_)) if was_leading => Action::Keep,
                    (Some(s), _) => Action::Restore(s),
                    (None, _) => Action::Learn,
                }
            }
            Ok(Term::Follower { leader }) => {
                let was_leading = self.leading;
                self.leading = false;
                self.failing = false;
                self.leader = Some(leader);
                if was_leading {
                    Action::Forget
                } else {
                    Action::Keep
                }
            }
            Err(_) => {
                self.failing = true;
                Action::Keep
            }
        }
    }

    /// Steps down (the server resigned, stopping): a follower with no known leader.
    pub fn step_down(&mut self) {
        self.leading = false;
        self.failing = false;
        self.leader = None;
    }

    /// The role at `now`.
    pub fn role(&self, now: Nanos) -> Role {
        if !self.leading {
            return Role::Follower {
                leader: self.leader.clone(),
            };
        }
        if !self.failing && now < self.proof_until {
            Role::Leader
        } else {
            Role::Holding {
                since: self.proof_until,
            }
        }
    }
}

/// Every lease table of a leader, as written to the store at each renewal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Snapshot {
    /// The writer's fencing token.
    pub token: u64,
    /// When it was written (Unix ms; for people and for the age check).
    pub written_unix_ms: u64,
    /// The tables.
    pub tables: Vec<SnapshotTable>,
}

/// One resource's leases in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotTable {
    /// The resource.
    pub resource: String,
    /// How much longer it learns (ms).
    pub learning_for_ms: u64,
    /// Its leases.
    pub holders: Vec<SnapshotHolder>,
    /// Grants released without proof, still counted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released: Vec<SnapshotReleased>,
    /// Under a parent (a tree of servers): the lease held from it, which a standby elected
    /// leader takes over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<SnapshotParent>,
}

/// A lease from a parent in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotParent {
    /// Units per second granted.
    pub granted: f64,
    /// Until when, from the snapshot's time (ms).
    pub expires_in_ms: u64,
    /// The safe capacity the parent advertised.
    pub safe: f64,
    /// The lease's id at the parent.
    pub lease_id: u64,
}

/// One client's lease in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotHolder {
    /// The client id.
    pub client: String,
    /// Its demand (units/s).
    pub wants: f64,
    /// What it needs of it (absent: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<f64>,
    /// Its weight.
    pub weight: f64,
    /// Its band.
    pub priority: String,
    /// What it holds (units/s).
    pub granted: f64,
    /// Until when, from the snapshot's time (ms).
    pub expires_in_ms: u64,
    /// The lease's id (absent in snapshots of older servers: the holder then proves
    /// nothing and its next refresh starts a new lease).
    #[serde(default)]
    pub lease_id: u64,
    /// The newest failover term of a lease server below (absent: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub term: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A grant released without proof in a [`Snapshot`], still counted until it expires.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotReleased {
    /// Units per second.
    pub granted: f64,
    /// Until when, from the snapshot's time (ms).
    pub expires_in_ms: u64,
}

/// Why a stored snapshot cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("allocation snapshot: {0}")]
pub struct SnapshotError(String);

impl Snapshot {
    /// The tables of a server (from [`crate::server::LeaseServer::snapshot`]).
    pub fn new(token: u64, written_unix_ms: u64, tables: Vec<TableState>) -> Self {
        let ms = |n: Nanos| n / 1_000_000;
        Self {
            token,
            written_unix_ms,
            tables: tables
                .into_iter()
                .map(|t| SnapshotTable {
                    resource: t.resource,
                    learning_for_ms: ms(t.learning_for),
                    holders: t
                        .holders
                        .into_iter()
                        .map(|h| SnapshotHolder {
                            client: h.client,
                            wants: h.demand.wants,
                            needs: (h.needs < h.demand.wants).then_some(h.needs),
                            weight: h.demand.weight,
                            priority: h.demand.priority.as_str().to_string(),
                            granted: h.granted,
                            expires_in_ms: ms(h.expires_at),
                            lease_id: h.lease_id,
                            term: h.term,
                        })
                        .collect(),
                    released: t
                        .released
                        .into_iter()
                        .map(|r| SnapshotReleased {
                            granted: r.granted,
                            expires_in_ms: ms(r.expires_at),
                        })
                        .collect(),
                    parent: t.parent.map(|p| SnapshotParent {
                        granted: p.granted,
                        expires_in_ms: ms(p.expires_at),
                        safe: p.safe,
                        lease_id: p.lease_id,
                    }),
                })
                .collect(),
        }
    }

    /// The tables, for [`crate::server::LeaseServer::restore`], read at `now_unix_ms`. A lease
    /// from a parent keeps its expiry less the snapshot's age: the parent counts it only that
    /// long (leases below, by contrast, are counted longer on restore).
    pub fn into_tables(self, now_unix_ms: u64) -> Result<Vec<TableState>, SnapshotError> {
        let age_ms = now_unix_ms.saturating_sub(self.written_unix_ms);
        self.tables
            .into_iter()
            .map(|t| {
                let holders = t
                    .holders
                    .into_iter()
                    .map(|h| {
                        let priority: Criticality = h.priority.parse().map_err(|e| {
                            SnapshotError(format!("{}: {}: {e}", t.resource, h.client))
                        })?;
                        let ok = |v: f64| v.is_finite() && v >= 0.0;
                        let needs = h.needs.unwrap_or(h.wants);
                        if !(ok(h.wants)
                            && ok(needs)
                            && ok(h.granted)
                            && h.weight.is_finite()
                            && h.weight > 0.0)
                        {
                            return Err(SnapshotError(format!(
                                "{}: {}: numbers out of range",
                                t.resource, h.client
                            )));
                        }
                        Ok(Holder {
                            keeps: 0.0,
                            parts: Vec::new(),
                            client: h.client,
                            needs: needs.min(h.wants),
                            demand: Demand {
                                wants: h.wants,
                                weight: h.weight,
                                priority,
                            },
                            granted: h.granted,
                            expires_at: h.expires_in_ms.saturating_mul(1_000_000),
                            lease_id: h.lease_id,
                            term: h.term,
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let released = t
                    .released
                    .into_iter()
                    .map(|r| {
                        if !(r.granted.is_finite() && r.granted >= 0.0) {
                            return Err(SnapshotError(format!(
                                "{}: released grant out of range",
                                t.resource
                            )));
                        }
                        Ok(Released {
                            granted: r.granted,
                            expires_at: r.expires_in_ms.saturating_mul(1_000_000),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let parent = match t.parent {
                    Some(p) if !(p.granted.is_finite() && p.granted >= 0.0) => {
                        return Err(SnapshotError(format!(
                            "{}: parent grant out of range",
                            t.resource
                        )));
                    }
                    Some(p) if p.expires_in_ms > age_ms => Some(ParentGrant {
                        granted: p.granted,
                        expires_at: (p.expires_in_ms - age_ms).saturating_mul(1_000_000),
                        safe: if p.safe.is_finite() && p.safe >= 0.0 {
                            p.safe
                        } else {
                            0.0
                        },
                        lease_id: p.lease_id,
                    }),
                    _ => None,
                };
                Ok(TableState {
                    resource: t.resource,
                    learning_for: t.learning_for_ms.saturating_mul(1_000_000),
                    holders,
                    released,
                    parent,
                })
            })
            .collect()
    }

    /// The JSON written to the store.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads what [`Self::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, SnapshotError> {
        serde_json::from_slice(bytes).map_err(|e| SnapshotError(e.to_string()))
    }

    /// Its age at `now_unix_ms` (0 if written "in the future" by a clock ahead of ours).
    pub fn age(&self, now_unix_ms: u64) -> Duration {
        Duration::from_millis(now_unix_ms.saturating_sub(self.written_unix_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn leader(token: u64, elected: bool, snapshot: Option<Vec<u8>>) -> Result<Term, String> {
        Ok(Term::Leader {
            token,
            elected,
            snapshot,
        })
    }

    #[test]
    fn roles_follow_the_answers_and_the_proof() {
        let mut l = Leadership::new(HaConfig::default());
        assert_eq!(l.role(0), Role::Follower { leader: None });
        // Elected with nothing stored: learn.
        assert_eq!(l.on_answer(0, leader(1, true, None)), Action::Learn);
        assert_eq!(l.role(S), Role::Leader);
        assert_eq!(l.token(), Some(1));
        // Renewed: keep; the proof runs 4.5 s from the send time.
        assert_eq!(l.on_answer(S, leader(1, false, None)), Action::Keep);
        assert_eq!(l.role(5 * S), Role::Leader);
        assert_eq!(
            l.role(5 * S + S / 2),
            Role::Holding {
                since: 5 * S + S / 2
            }
        );
        // The store is unreachable: holding at once, since the end of the proof.
        l.on_answer(2 * S, Err("down".into()));
        assert_eq!(
            l.role(3 * S),
            Role::Holding {
                since: 5 * S + S / 2
            }
        );
        assert_eq!(
            l.role(9 * S),
            Role::Holding {
                since: 5 * S + S / 2
            }
        );
        // Back, still ours: keep the tables.
        assert_eq!(l.on_answer(9 * S, leader(1, false, None)), Action::Keep);
        assert_eq!(l.role(10 * S), Role::Leader);
        // Someone else took it: forget.
        let other = Ok(Term::Follower {
            leader: "http://b".into(),
        });
        assert_eq!(l.on_answer(20 * S, other), Action::Forget);
        assert_eq!(
            l.role(20 * S),
            Role::Follower {
                leader: Some("http://b".into())
            }
        );
        assert_eq!(l.token(), None);
        l.on_answer(21 * S, leader(9, true, None));
        l.step_down();
        assert_eq!(l.role(21 * S), Role::Follower { leader: None });
    }

    #[test]
    fn a_new_leader_restores_another_writers_snapshot_but_keeps_its_own_newer_tables() {
        let snap = |token| Snapshot::new(token, 1, Vec::new()).encode();
        // A follower elected: restores the last leader's snapshot.
        let mut b = Leadership::new(HaConfig::default());
        assert!(matches!(
            b.on_answer(0, leader(2, true, Some(snap(1)))),
            Action::Restore(s) if s.token == 1
        ));
        // A leader whose key lapsed (the store was away) and that is elected again with its
        // own older snapshot keeps its tables.
        let mut a = Leadership::new(HaConfig::default());
        a.on_answer(0, leader(3, true, None));
        a.on_answer(S, Err("down".into()));
        assert_eq!(
            a.on_answer(9 * S, leader(4, true, Some(snap(3)))),
            Action::Keep
        );
        // …but restores from a newer leader's snapshot (someone led in between).
        let mut c = Leadership::new(HaConfig::default());
        c.on_answer(0, leader(3, true, None));
        c.on_answer(S, Err("down".into()));
        assert!(matches!(
            c.on_answer(9 * S, leader(6, true, Some(snap(5)))),
            Action::Restore(s) if s.token == 5
        ));
        // An unreadable snapshot: learn.
        let mut d = Leadership::new(HaConfig::default());
        assert_eq!(
            d.on_answer(0, leader(1, true, Some(b"{".to_vec()))),
            Action::Learn
        );
    }

    #[test]
    fn snapshots_round_trip_and_bad_ones_are_named() {
        let tables = vec![TableState {
            resource: "r".into(),
            learning_for: 2 * S,
            holders: vec![Holder {
                keeps: 0.0,
                parts: Vec::new(),
                client: "c".into(),
                needs: 2.5,
                demand: Demand {
                    wants: 3.5,
                    weight: 2.0,
                    priority: Criticality::Sheddable,
                },
                granted: 3.0,
                expires_at: 7 * S,
                lease_id: 99,
                term: 4,
            }],
            released: vec![Released {
                granted: 1.5,
                expires_at: 4 * S,
            }],
            parent: Some(ParentGrant {
                granted: 40.0,
                expires_at: 3 * S,
                safe: 5.0,
                lease_id: 77,
            }),
        }];
        let s = Snapshot::new(9, 1000, tables.clone());
        let back = Snapshot::decode(&s.encode()).unwrap();
        assert_eq!(back.age(3000), Duration::from_secs(2));
        // Read when written: as written.
        assert_eq!(back.clone().into_tables(1000).unwrap(), tables);
        // Two seconds later the parent's grant has a second left; three seconds later none.
        let later = back.clone().into_tables(3000).unwrap();
        assert_eq!(later[0].parent.unwrap().expires_at, S);
        assert_eq!(later[0].holders, tables[0].holders);
        assert_eq!(back.into_tables(4000).unwrap()[0].parent, None);
        let mut bad = s.clone();
        bad.tables[0].holders[0].priority = "URGENT".into();
        assert!(bad
            .into_tables(1000)
            .unwrap_err()
            .to_string()
            .contains("r: c:"));
        assert!(Snapshot::decode(b"[]").is_err());
    }
}
