//! The lease server's core, without I/O: every resource's [`LeaseTable`], created from the
//! configuration (or a template) on first use, refreshed many resources per call. A protocol
//! front end (the HTTP/JSON API of `weir serve`, and later gRPC or Envoy's RLQS) maps its
//! requests onto [`LeaseServer::refresh`], [`LeaseServer::release`] and
//! [`LeaseServer::allocations`].

use std::collections::HashMap;

use parking_lot::Mutex;
use weir_core::Nanos;

use crate::config::QuotaConfig;
use crate::lease::{Ask, Lease, LeaseTable};

/// Why one resource of a refresh got no lease.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// No resource or template of that name is configured.
    #[error("unknown resource {0:?}")]
    UnknownResource(String),
    /// The ask was not valid (negative or non-finite numbers).
    #[error("resource {resource:?}: {reason}")]
    BadAsk {
        /// The resource.
        resource: String,
        /// What is wrong.
        reason: String,
    },
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
    /// (client, wants, granted, expires_at) per client.
    pub clients: Vec<(String, f64, f64, Nanos)>,
}

/// Every resource's lease table.
#[derive(Debug)]
pub struct LeaseServer {
    config: Mutex<QuotaConfig>,
    tables: Mutex<HashMap<String, LeaseTable>>,
    /// Tables made before this time learn (the server started then without a snapshot).
    started_at: Nanos,
}

/// Most resources one server tracks (templates create them on demand).
pub const MAX_RESOURCES: usize = 10_000;

impl LeaseServer {
    /// A server started at `now` with `config`; its tables learn for one lease length.
    pub fn new(config: QuotaConfig, now: Nanos) -> Self {
        Self {
            config: Mutex::new(config),
            tables: Mutex::new(HashMap::new()),
            started_at: now,
        }
    }

    /// A new configuration: tables of resources still configured keep their leases and take
    /// the new parameters; tables of removed resources are dropped.
    pub fn reload(&self, config: QuotaConfig) {
        let mut tables = self.tables.lock();
        tables.retain(|name, t| match config.resource(name) {
            Some(c) => {
                t.reconfigure(c);
                true
            }
            None => false,
        });
        *self.config.lock() = config;
    }

    /// `client` refreshes `asks` at `now`: one answer per ask, in order.
    pub fn refresh(
        &self,
        client: &str,
        asks: &[(String, Ask)],
        now: Nanos,
    ) -> Vec<Result<Lease, Refusal>> {
        let mut tables = self.tables.lock();
        asks.iter()
            .map(|(resource, ask)| {
                if !tables.contains_key(resource) {
                    // The configuration is read only to create a table (first use).
                    let c = self
                        .config
                        .lock()
                        .resource(resource)
                        .ok_or_else(|| Refusal::UnknownResource(resource.clone()))?;
                    if tables.len() >= MAX_RESOURCES {
                        return Err(Refusal::BadAsk {
                            resource: resource.clone(),
                            reason: format!("more than {MAX_RESOURCES} resources in use"),
                        });
                    }
                    // A table created in the first lease length after the start learns for
                    // what is left of it; later ones start empty (nothing was handed out).
                    let mut t = LeaseTable::new(c, self.started_at);
                    if !t.learning(now) {
                        t = LeaseTable::resume(c, Vec::new());
                    }
                    tables.insert(resource.clone(), t);
                }
                let table = tables
                    .get_mut(resource)
                    .ok_or_else(|| Refusal::UnknownResource(resource.clone()))?;
                table
                    .refresh(client, *ask, now)
                    .map_err(|e| Refusal::BadAsk {
                        resource: resource.clone(),
                        reason: e.to_string(),
                    })
            })
            .collect()
    }

    /// `client` gives back its leases on `resources` (shutting down).
    pub fn release(&self, client: &str, resources: &[String]) {
        let mut tables = self.tables.lock();
        for r in resources {
            if let Some(t) = tables.get_mut(r) {
                t.release(client);
            }
        }
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
                    wants: t.holders().iter().map(|h| h.demand.wants).sum(),
                    granted: t.outstanding(),
                    learning: t.learning(now),
                    clients: t
                        .holders()
                        .iter()
                        .map(|h| (h.client.clone(), h.demand.wants, h.granted, h.expires_at))
                        .collect(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.resource.cmp(&b.resource));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const S: Nanos = 1_000_000_000;

    fn config(yaml: &str) -> QuotaConfig {
        QuotaConfig::from_yaml(Path::new("q.yaml"), yaml).unwrap()
    }

    fn ask(resource: &str, wants: f64) -> (String, Ask) {
        (resource.to_string(), Ask::wants(wants))
    }

    #[test]
    fn many_resources_per_call_templates_and_unknown_ones() {
        let s = LeaseServer::new(
            config("resources:\n  - {name: a, capacity: 10}\n  - {name: 't-*', capacity: 4}\n"),
            0,
        );
        // After the first lease length: no learning.
        let r = s.refresh(
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
        s.release("c1", &["a".into()]);
        assert_eq!(s.allocations(31 * S)[0].granted, 0.0);
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
            s.refresh("c1", std::slice::from_ref(&held), S)[0]
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
}
