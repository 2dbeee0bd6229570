//! A lease server's leases from its parent over the network (a tree of lease servers): the
//! [`Upstream`] logic of [`crate::upstream`] driven by a task that asks the parent's HTTP/JSON
//! API (`weir serve --quota FILE --parent URL`) and gives the [`LeaseServer`] the capacities
//! it is granted.
//!
//! Every 100 ms the task reads what the server's clients want ([`LeaseServer::totals`]), sends
//! the asks that are due in one call (the parent's refresh times; sooner when the demand
//! below moves by a tenth), and applies the capacities in force — the grant while its lease
//! lasts, frozen while an ask is in flight, the safe capacity after it lapses. A parent that
//! cannot be reached, or answers something that is not a lease, counts as unreachable for
//! that call (logged once per transition): asks are retried every second — a parent has few
//! children, and a parent back from a restart must hear from all of them while it learns (one
//! lease length), or a child still on its safe capacity would count beside the grants it
//! hands out once learning ends.

use std::sync::Arc;
use std::time::Duration;

use weir_core::{Clock, Nanos};

use super::{call_leader, NetError, Transport};
use crate::server::LeaseServer;
use crate::upstream::{Asked, Upstream};
use crate::wire::{lease_id_text, PartAsk, RefreshRequest, RefreshResponse, ResourceAsk};

/// The task leasing a server's capacities from its parent; stops when dropped.
pub struct ParentLink {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ParentLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ParentLink {
    /// Leases every resource `server` serves from the parent at `endpoint` (`http://HOST:PORT`,
    /// several sharing a quota as a comma-separated list) as `client_id`, sending `token` if
    /// any. `active(now)` is the failover term this server may lease in (0: no failover
    /// group), `None` pausing it (a follower). On becoming active it takes over the leases
    /// its server holds from the parent ([`LeaseServer::parent_grants`], restored from the
    /// last leader's snapshot) and asks in its term, so a standby elected leader continues
    /// the group's lease and a deposed leader's late asks are refused. `server` takes its
    /// capacities from the parent from now on ([`LeaseServer::under_parent`]); `clock` must be
    /// the one its refreshes are answered on.
    pub fn start<C: Clock + Send + Sync + 'static>(
        server: Arc<LeaseServer>,
        clock: C,
        endpoint: &str,
        client_id: &str,
        token: Option<String>,
        active: impl Fn(Nanos) -> Option<u64> + Send + Sync + 'static,
    ) -> Result<Self, NetError> {
        let link = Transport::new(endpoint, client_id, token)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| NetError::NoRuntime)?;
        server.under_parent();
        let task = runtime.spawn(run(server, clock, link, active));
        Ok(Self { task })
    }
}

/// The body of one call asking for `asks`.
fn body(client: &str, asks: &[Asked]) -> String {
    let resources = asks
        .iter()
        .map(|a| ResourceAsk {
            resource: a.resource.clone(),
            wants: a.ask.wants,
            has: a.ask.has,
            safe: a.ask.safe,
            lease_id: Some(lease_id_text(a.ask.lease_id)),
            weight: a.ask.weight,
            priority: None,
            needs: a.ask.needs,
            holds: a.ask.holds,
            term: a.ask.term,
            parts: a
                .parts
                .iter()
                .map(|p| PartAsk {
                    wants: p.wants,
                    needs: Some(p.needs),
                    weight: p.weight,
                    priority: Some(p.priority.as_str().to_string()),
                })
                .collect(),
        })
        .collect();
    let request = RefreshRequest {
        client: client.to_string(),
        resources,
    };
    serde_json::to_string(&request).unwrap_or_default()
}

fn apply(server: &LeaseServer, upstream: &Upstream, now: Nanos) {
    for (name, capacity, grant) in upstream.capacities(now) {
        server.lease_from_parent(&name, capacity, grant);
    }
}

async fn run<C: Clock>(
    server: Arc<LeaseServer>,
    clock: C,
    link: Transport,
    active: impl Fn(Nanos) -> Option<u64>,
) {
    let mut upstream = Upstream::new();
    let mut reachable: Option<bool> = None;
    let retry = Duration::from_secs(1);
    let mut term = None;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = clock.now();
        let Some(t) = active(now) else {
            if term.take().is_some() {
                // A follower now: the next leader continues the leases.
                upstream = Upstream::new();
            }
            continue;
        };
        if term != Some(t) {
            // Newly leading (or in a new term): continue the group's leases.
            term = Some(t);
            upstream.set_term(t);
            for (name, grant) in server.parent_grants(now) {
                upstream.adopt(&name, grant);
            }
        }
        let totals = server.totals_parted(now, |r, wants| upstream.due(r, wants, now));
        // Before the parent first answers: the file's safe capacity, else nothing.
        let asks = upstream.asks(&totals, |r| server.safe_capacity(r).unwrap_or(0.0), now);
        apply(&server, &upstream, now);
        if asks.is_empty() {
            continue;
        }
        for chunk in asks.chunks(super::MAX_RESOURCES) {
            let answer = call_leader(&link, body(&link.client_id, chunk)).await;
            let at = clock.now();
            let leases = answer
                .as_ref()
                .ok()
                .and_then(|v| serde_json::from_value::<RefreshResponse>(v.clone()).ok())
                .map(|r| r.leases);
            match leases {
                Some(leases) if leases.len() == chunk.len() => {
                    if reachable != Some(true) {
                        tracing::info!(client = %link.client_id, "parent lease server reached");
                    }
                    reachable = Some(true);
                    for (a, v) in chunk.iter().zip(&leases) {
                        match v.lease(at) {
                            Some((lease, expires_in)) => {
                                upstream.answered(&a.resource, &lease, expires_in, a.sent_at, at);
                            }
                            None => {
                                let answer = serde_json::to_string(&v).unwrap_or_default();
                                tracing::warn!(resource = %a.resource, %answer, "parent lease server refused a resource; its grant holds until it lapses");
                                upstream.failed(&a.resource, Duration::from_secs(5), at);
                            }
                        }
                    }
                }
                _ => {
                    if reachable != Some(false) {
                        let why = match &answer {
                            Err(e) => e.clone(),
                            Ok(v) => format!("not a lease answer: {}", truncated(&v.to_string())),
                        };
                        tracing::warn!(client = %link.client_id, error = %why, "parent lease server unreachable; grants held until they lapse, then the safe capacity");
                    }
                    reachable = Some(false);
                    for a in chunk {
                        upstream.failed(&a.resource, retry, at);
                    }
                }
            }
        }
        apply(&server, &upstream, clock.now());
    }
}

fn truncated(s: &str) -> &str {
    let mut end = s.len().min(200);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
