//! What a [`super::RulesLayer`], its services and their futures share ([`Policy`]): the rules,
//! the classifier, and what becomes of a blocked request ([`on_block`]).

use std::sync::Arc;

use weir_core::Clock;
use weir_rules::engine::Rules;

use http::Request;
use weir_rules::engine::Block;

use super::fallback::{Degraded, Fallback};
use super::response::is_grpc;
use super::routes::{Classify, Routes};

/// How the layer classifies: the rule file's routes or a user's classifier.
pub(super) enum Classifier<C: Clock + Clone> {
    Routes(Routes<C>),
    Custom(Box<dyn Classify>),
}

/// What the layer, its services and their futures share: the rules, how requests are
/// classified, and what becomes of blocked requests.
pub(super) struct Policy<C: Clock + Clone> {
    pub(super) rules: Arc<Rules<C>>,
    pub(super) classifier: Arc<Classifier<C>>,
    /// Blocked requests go on to the inner service with [`Degraded`] (see `with_fallback`).
    pub(super) pass_blocked: bool,
    /// Told of each decision (see `with_tracer`).
    pub(super) tracer: Option<Arc<dyn crate::trace::DecisionTracer>>,
}

impl<C: Clock + Clone> Clone for Policy<C> {
    fn clone(&self) -> Self {
        Self {
            rules: self.rules.clone(),
            classifier: self.classifier.clone(),
            pass_blocked: self.pass_blocked,
            tracer: self.tracer.clone(),
        }
    }
}

/// A blocked request the layer answers itself: with its route's fallback, or the block.
pub(super) struct Answer {
    pub(super) block: Block,
    pub(super) fallback: Option<Arc<Fallback>>,
    pub(super) grpc: bool,
}

/// What becomes of a request `block` refused, whatever refused it (a local rule, a cost rule, a
/// cluster rule, a `shared: true` rule deciding later): `Ok` — the request to call the inner
/// service with, carrying [`Degraded`] — when its route's `fallback` (covering the block's
/// kind) names an upstream, or the layer passes blocked requests on (`with_fallback`; then
/// `true`: the caller counts it as served by a fallback); otherwise the answer (the route's
/// fallback response, or the block's). A route's fallback serving it is counted here.
pub(super) fn on_block<C: Clock + Clone, B>(
    policy: &Policy<C>,
    fallback: Option<Arc<Fallback>>,
    mut req: Request<B>,
    block: Block,
) -> Result<(Request<B>, bool), Answer> {
    let fallback = fallback.filter(|f| f.kinds.contains(&block.kind));
    if let Some(f) = &fallback {
        policy.rules.fallback_served(&f.resource);
        if let Some(upstream) = &f.upstream {
            req.extensions_mut().insert(Degraded {
                block,
                upstream: Some(upstream.clone()),
            });
            return Ok((req, false));
        }
    }
    if fallback.is_none() && policy.pass_blocked {
        req.extensions_mut().insert(Degraded {
            block,
            upstream: None,
        });
        return Ok((req, true));
    }
    Err(Answer {
        grpc: is_grpc(&req),
        block,
        fallback,
    })
}
