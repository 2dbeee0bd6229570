//! [`Decider`]: the rules' decision for a server that reads its requests itself rather than
//! through a tower service (the proxy's HTTP/1.1 path, which parses heads into spans of its
//! read buffer): the route found and the rules asked, nothing more.
//!
//! It decides only the requests whose route needs nothing of [`super::RulesService`]'s
//! machinery: a route with a `fallback`, or whose resource has `cost:` rules (an estimate to
//! read, a cost to settle from the response), is [`Verdict::Service`] and nothing is counted,
//! so the caller can hand the request to the service instead. A layer that traces, passes
//! blocked requests on or classifies with a user's [`super::Classify`] has no decider.

use std::sync::Arc;

use http::{Extensions, HeaderMap, Method};
use weir_core::{Clock, MonotonicClock};
use weir_rules::engine::{Block, Guard};

use super::policy::{Classifier, Policy};
use super::routes::{Asked, RouteParam, Routes, Table};
use super::service::admit_call;

/// Decides requests by a layer's routes and rules; one per connection (it keeps the route
/// table between calls, as a service does).
pub struct Decider<C: Clock + Clone = MonotonicClock> {
    policy: Policy<C>,
    table: Option<Arc<Table<C>>>,
}

/// A request as a [`Decider`] reads it.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path in normal form (see [`crate::path::is_plain`]), without the query.
    pub path: &'a str,
    /// The request's headers — at least those [`RouteView::reads`] names.
    pub headers: &'a HeaderMap,
    /// The extensions: [`crate::key::PeerAddr`] for the client address.
    pub extensions: &'a Extensions,
    /// The connection's peer address as text ([`crate::key::ip_string`]): the `client_ip`
    /// parameter when no proxy is trusted, without formatting it per request.
    pub peer_text: Option<&'a str>,
}

/// What a [`Decider`] made of a request.
pub enum Verdict<C: Clock + Clone = MonotonicClock> {
    /// No route matched: the request passes unlimited.
    Unrouted,
    /// Admitted: hold the guard until the response ends (after [`Guard::decide_shared`] when
    /// it [`Guard::has_shared`], and its [`Guard::wait`]); complete it with the outcome.
    Admitted(Guard<C>),
    /// Refused: answer with [`super::blocked_response`].
    Refused(Block),
    /// The route needs the layer's service (a fallback, `cost:` rules): nothing was counted.
    Service,
}

impl<C: Clock + Clone + Send + Sync + 'static> super::RulesLayer<C> {
    /// A decider for requests read without the layer's service; `None` when this layer
    /// classifies with a user's classifier, traces its decisions, or passes blocked requests
    /// on (those need the service).
    pub fn decider(&self) -> Option<Decider<C>> {
        let plain = matches!(&*self.policy.classifier, Classifier::Routes(_))
            && self.policy.tracer.is_none()
            && !self.policy.pass_blocked;
        plain.then(|| Decider {
            policy: self.policy.clone(),
            table: None,
        })
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> Decider<C> {
    /// The routes in force now (following reloads): what a request's headers must include, and
    /// its decision, both from the same table.
    pub fn routes(&mut self) -> RouteView<'_, C> {
        let Classifier::Routes(routes) = &*self.policy.classifier else {
            unreachable_routes()
        };
        let routes: &Routes<C> = routes;
        RouteView {
            table: routes.table(&mut self.table),
            policy: &self.policy,
        }
    }
}

/// A decider is only made over routes ([`super::RulesLayer::decider`]).
#[cold]
fn unreachable_routes() -> ! {
    unreachable!("a Decider is only made for a layer classifying by routes")
}

/// One route table of a [`Decider`].
pub struct RouteView<'d, C: Clock + Clone> {
    table: &'d Table<C>,
    policy: &'d Policy<C>,
}

impl<C: Clock + Clone + Send + Sync + 'static> RouteView<'_, C> {
    /// Whether deciding may read the header `name` (as received: compared ignoring ASCII
    /// case). A [`Call`]'s headers need hold only these.
    pub fn reads(&self, name: &[u8]) -> bool {
        self.table
            .reads
            .iter()
            .any(|n| n.as_str().as_bytes().eq_ignore_ascii_case(name))
    }

    /// Whether deciding reads no header at all (then a [`Call`] may carry an empty map).
    pub fn reads_none(&self) -> bool {
        self.table.reads.is_empty()
    }

    /// The request's route asked: unrouted, admitted, refused — or left to the service,
    /// uncounted.
    pub fn decide(&self, call: Call<'_>) -> Verdict<C> {
        let asked = Asked {
            method: call.method,
            headers: call.headers,
            extensions: call.extensions,
        };
        let Some(i) = self.table.find(asked, call.path) else {
            return Verdict::Unrouted;
        };
        let route = &self.table.routes[i];
        if route.fallback.is_some() || route.resolved.cost_sources().is_some() {
            return Verdict::Service;
        }
        let table = self.table;
        // The client's address as text: the caller's when it is the peer, else looked up.
        let reads_client = route
            .params
            .iter()
            .any(|p| matches!(p, RouteParam::ClientIp));
        let looked_up = (reads_client
            && (call.peer_text.is_none() || table.client_ip.reads_forwarded_for()))
        .then(|| {
            table
                .client_ip
                .client_of(call.headers, call.extensions)
                .map(crate::key::ip_string)
        })
        .flatten();
        let client = looked_up.as_deref().or(call.peer_text).unwrap_or("");
        // Parameters borrowed from the request (hot-parameter rules index the first 8).
        let mut params = [""; 8];
        let n = route.params.len().min(params.len());
        for (slot, p) in params.iter_mut().zip(&route.params) {
            *slot = p.of(asked, call.path, client);
        }
        let ctx = weir_rules::engine::Context {
            origin: table.origin_of(call.headers),
            criticality: route.criticality_of(call.headers),
            params: &params[..n],
            inbound: true,
            cost: None,
        };
        match admit_call(
            &self.policy.rules,
            Some(&route.resolved),
            &route.resource,
            &ctx,
        ) {
            Ok(guard) => Verdict::Admitted(guard),
            Err(block) => Verdict::Refused(block),
        }
    }
}
