//! [`RulesLayer`]: a rule set and a classifier, wrapping services.

use std::sync::Arc;

use http::HeaderMap;
use tower::Layer;
use weir_core::{Clock, MonotonicClock};
use weir_rules::config::EstimateFrom;
use weir_rules::engine::Rules;

use super::policy::{Classifier, Policy};
use super::routes::{Classify, Head, Routes};
use super::service::RulesService;

/// Wraps services with a rule set.
pub struct RulesLayer<C: Clock + Clone = MonotonicClock> {
    pub(super) policy: Policy<C>,
}

impl<C: Clock + Clone> Clone for RulesLayer<C> {
    fn clone(&self) -> Self {
        Self {
            policy: self.policy.clone(),
        }
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> RulesLayer<C> {
    /// Classifies requests by the rule file's `http.routes` (following reloads).
    pub fn new(rules: Arc<Rules<C>>) -> Self {
        Self {
            policy: Policy {
                classifier: Arc::new(Classifier::Routes(Routes::new(rules.clone()))),
                rules,
                pass_blocked: false,
                tracer: None,
            },
        }
    }

    /// Classifies requests with `classify` (e.g. [`ClassifyFn`](super::ClassifyFn)).
    pub fn with_classifier(rules: Arc<Rules<C>>, classify: impl Classify) -> Self {
        Self {
            policy: Policy {
                rules,
                classifier: Arc::new(Classifier::Custom(Box::new(classify))),
                pass_blocked: false,
                tracer: None,
            },
        }
    }

    /// Blocked requests are not answered by the layer but passed on to the inner service with
    /// a [`Degraded`](super::Degraded) extension saying why (unless their route's `fallback` answers them):
    /// wrap the inner service in [`OnBlocked`](super::OnBlocked) to give them a fallback service. Counted as
    /// answered by a fallback.
    pub fn with_fallback(mut self) -> Self {
        self.policy.pass_blocked = true;
        self
    }

    /// Tells `tracer` of each decision: refusals as they happen, admissions it wants a span of
    /// through a record noted until the response ends (see [`crate::trace`]).
    pub fn with_tracer(mut self, tracer: Arc<dyn crate::trace::DecisionTracer>) -> Self {
        self.policy.tracer = Some(tracer);
        self
    }

    /// The rules (apply new sets, read snapshots).
    pub fn rules(&self) -> &Arc<Rules<C>> {
        &self.policy.rules
    }

    /// The client address of a request from the connection's `peer` (headers `headers`): the
    /// peer, unless it is one of the rule file's `http.trusted_proxies` — then the address
    /// `X-Forwarded-For` names ([`ClientIp`](crate::key::ClientIp)). What per-address bounds in front of the
    /// service should count by.
    pub fn client_ip(&self, peer: std::net::IpAddr, headers: &HeaderMap) -> std::net::IpAddr {
        let Classifier::Routes(routes) = &*self.policy.classifier else {
            return peer;
        };
        // The table last compiled (a reload's trusted proxies apply from the next routed
        // request): one atomic load, no reference count, on every proxied request.
        routes.table.load().client_ip.client_from(peer, headers)
    }

    /// Whether the request with head `parts` goes to a resource whose `cost:` rules take their
    /// estimate from a JSON request body: the requests a
    /// [`ReadJsonLayer`](crate::cost::ReadJsonLayer) in front should read, and no others
    /// (an unrouted request's body is never held).
    pub fn reads_request_json(&self, parts: &http::request::Parts) -> bool {
        if !self.policy.rules.reads_request_json() {
            return false;
        }
        let json = |sources: Option<&weir_rules::config::CostSources>| {
            sources.is_some_and(|s| matches!(s.estimate, Some(EstimateFrom::Json(_))))
        };
        let head = Head {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
            extensions: &parts.extensions,
        };
        match &*self.policy.classifier {
            Classifier::Routes(routes) => {
                let mut cache = None;
                let table = routes.table(&mut cache);
                let path = crate::path::match_path(parts.uri.path());
                table
                    .find(head, &path)
                    .is_some_and(|i| json(table.routes[i].resolved.cost_sources()))
            }
            Classifier::Custom(c) => c
                .classify(head)
                .is_some_and(|t| json(self.policy.rules.resolve(t.resource).cost_sources())),
        }
    }
}

impl<S, C: Clock + Clone> Layer<S> for RulesLayer<C> {
    type Service = RulesService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RulesService {
            inner,
            policy: self.policy.clone(),
            table: None,
        }
    }
}
