//! [`RulesService`]: each request classified, admitted or refused, and called.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, Uri};
use http_body::Body;
use tower::Service;
use weir_core::{Clock, MonotonicClock};
use weir_rules::config::EstimateFrom;
use weir_rules::engine::{Block, Context as CallContext, Guard, Resolved, Rules};

use super::fallback::Fallback;
use super::future::{decide_shared, Deciding, Paced, RulesFuture};
use super::policy::{on_block, Classifier, Policy};
use super::response::{GuardBody, Pending};
use super::routes::{target_of, Head, Table, Target};
use crate::trace::{Decided, DecisionRecord, DecisionTracer};

/// A service behind a rule set.
pub struct RulesService<S, C: Clock + Clone = MonotonicClock> {
    pub(super) inner: S,
    pub(super) policy: Policy<C>,
    /// The route table last used (see `Routes::table`).
    pub(super) table: Option<Arc<Table<C>>>,
}

impl<S: Clone, C: Clock + Clone> Clone for RulesService<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            policy: self.policy.clone(),
            table: self.table.clone(),
        }
    }
}

impl<S, C, ReqB, ResB> Service<Request<ReqB>> for RulesService<S, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    C: Clock + Clone + Send + Sync + 'static,
    ResB: Body<Data = Bytes>,
{
    type Response = Response<GuardBody<ResB, C>>;
    type Error = S::Error;
    type Future = RulesFuture<S, Request<ReqB>, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let plain = match normalize(&mut req) {
            Ok(plain) => plain,
            Err(detail) => {
                return RulesFuture::Invalid {
                    detail: Some(detail),
                }
            }
        };
        let (entry, fallback, read_json, record) = self.decide(&req, plain);
        if let Some(r) = record {
            // Traced: the service behind is a child of the decision's span.
            r.pass_on(req.headers_mut());
            req.extensions_mut().insert(r);
        }
        // The body's JSON was read for the estimate: not held any longer than the decision.
        if read_json {
            req.extensions_mut().remove::<crate::cost::RequestJson>();
        }
        self.answer(req, entry, fallback)
    }
}

/// What a request's decision gave: nothing (no route), the guard or the block.
type Entry<C> = Option<Result<Guard<C>, Block>>;

/// Puts the request's path in normal form; whether it was plain (its own normal and route
/// form: the common case, one scan), or why it cannot be.
fn normalize<B>(req: &mut Request<B>) -> Result<bool, &'static str> {
    let plain = crate::path::is_plain(req.uri().path());
    if !plain {
        match crate::path::normalize(req.uri().path()) {
            Ok(std::borrow::Cow::Borrowed(_)) => {}
            Ok(std::borrow::Cow::Owned(normal)) => {
                if set_path(req.uri_mut(), &normal).is_err() {
                    return Err("the normalised path is not a valid URI");
                }
            }
            Err(e) => return Err(e.as_str()),
        }
    }
    Ok(plain)
}

impl<S, C> RulesService<S, C>
where
    C: Clock + Clone + Send + Sync + 'static,
{
    /// The request classified and admitted or refused: the entry, the route's fallback, and
    /// whether the estimate was read from the body's JSON.
    fn decide<B>(
        &mut self,
        req: &Request<B>,
        plain: bool,
    ) -> (
        Entry<C>,
        Option<Arc<Fallback>>,
        bool,
        Option<DecisionRecord>,
    ) {
        let head = Head::of(req);
        let path = if plain {
            std::borrow::Cow::Borrowed(req.uri().path())
        } else {
            crate::path::match_path(req.uri().path())
        };
        let mut fallback = None;
        let rules = &self.policy.rules;
        // With `with_fallback`, a block no route fallback answers goes on to the inner service
        // (counted as answered by a fallback).
        let pass_blocked = self.policy.pass_blocked;
        // The tracer told of the decision, and the record of an admission it traces.
        let tracer = self.policy.tracer.as_ref();
        let record = std::cell::Cell::new(None);
        let passed_on = |t: &Target<'_>,
                         r: Result<Guard<C>, Block>,
                         route: Option<&Fallback>,
                         cost: Option<u64>| {
            let mut fallback =
                route.is_some_and(|f| r.as_ref().is_err_and(|b| f.kinds.contains(&b.kind)));
            if r.is_err() && pass_blocked && !fallback {
                rules.fallback_served(t.resource);
                fallback = true;
            }
            if let Some(tracer) = tracer {
                record.set(traced(&**tracer, head.headers, t, cost, &r, fallback));
            }
            r
        };
        // The estimate the request states, for resources whose cost rules say where (noting
        // whether it came from the body's JSON).
        let read_json = std::cell::Cell::new(false);
        let estimate = |sources: Option<&weir_rules::config::CostSources>| {
            let from = sources?.estimate.as_ref()?;
            read_json.set(matches!(from, EstimateFrom::Json(_)));
            crate::cost::request_estimate(head.headers, head.extensions, from)
        };
        let entry = match &*self.policy.classifier {
            Classifier::Routes(routes) => {
                let table = routes.table(&mut self.table);
                table.find(head, &path).map(|i| {
                    let t = target_of(table, i, head, &path);
                    let route = &table.routes[i];
                    fallback = route.fallback.clone();
                    let cost = estimate(route.resolved.cost_sources());
                    passed_on(
                        &t,
                        admit(rules, Some(&route.resolved), &t, cost),
                        fallback.as_deref(),
                        cost,
                    )
                })
            }
            Classifier::Custom(c) => c.classify(head).map(|t| {
                let cost = if rules.states_costs() {
                    estimate(rules.resolve(t.resource).cost_sources())
                } else {
                    None
                };
                passed_on(&t, admit(rules, None, &t, cost), None, cost)
            }),
        };
        (entry, fallback, read_json.get(), record.into_inner())
    }

    /// The future of a decided request: the inner call (now, after the shared store or a
    /// pacing wait), or the refusal.
    fn answer<ReqB, ResB>(
        &mut self,
        req: Request<ReqB>,
        entry: Entry<C>,
        fallback: Option<Arc<Fallback>>,
    ) -> RulesFuture<S, Request<ReqB>, C>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
        ResB: Body<Data = Bytes>,
    {
        let head = req.method() == Method::HEAD;
        match entry {
            None => RulesFuture::Pass {
                inner: self.inner.call(req),
                guard: Pending::none(),
                head,
            },
            Some(Ok(guard)) if guard.has_shared() => {
                // Shared rules decide in the shared store: wait for it, then call the service
                // that was made ready (boxed: rare).
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                RulesFuture::Deciding {
                    deciding: Some(Box::new(Deciding {
                        decide: Box::pin(decide_shared(guard)),
                        svc: ready,
                        req,
                        fallback,
                        policy: self.policy.clone(),
                    })),
                }
            }
            Some(Ok(guard)) if guard.wait().is_zero() => {
                let guard = Pending::new(guard, req.extensions());
                RulesFuture::Pass {
                    inner: self.inner.call(req),
                    guard,
                    head,
                }
            }
            Some(Ok(guard)) => {
                // Paced: wait, then call the service that was made ready (boxed: rare, and
                // it keeps the common future small).
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                RulesFuture::Waiting {
                    paced: Some(Box::new(Paced {
                        sleep: Box::pin(tokio::time::sleep(guard.wait())),
                        svc: ready,
                        req,
                        guard,
                    })),
                }
            }
            // (A block passed on was counted at the entry.)
            Some(Err(block)) => match on_block(&self.policy, fallback, req, block) {
                Ok((req, _)) => RulesFuture::Pass {
                    inner: self.inner.call(req),
                    guard: Pending::none(),
                    head,
                },
                Err(answer) => RulesFuture::Blocked {
                    grpc: answer.grpc,
                    block: Some(Box::new(answer.block)),
                    fallback: answer.fallback,
                },
            },
        }
    }
}

/// Tells `tracer` of a decision `r` on the request with `headers` for `t` (with `cost`):
/// a refusal at once, an admission through the record it returns, if it traces it.
#[cold]
fn traced<C: Clock + Clone>(
    tracer: &dyn DecisionTracer,
    headers: &http::HeaderMap,
    t: &Target<'_>,
    cost: Option<u64>,
    r: &Result<Guard<C>, Block>,
    fallback: bool,
) -> Option<DecisionRecord> {
    let decided = |refused_by| Decided {
        resource: Some(t.resource.to_string()),
        refused_by,
        fallback,
        origin: t.origin.to_string(),
        params: t.params.iter().map(|p| p.to_string()).collect(),
        estimate: cost,
        ..Decided::default()
    };
    match r {
        Err(b) => {
            tracer.refused(headers, decided(Some((b.rule.to_string(), b.kind))));
            None
        }
        // A decision left to shared rules may still be refused.
        Ok(g) => {
            let record = tracer.admitted(headers, g.has_shared())?;
            let d = decided(None);
            record.note(|n| *n = d);
            Some(record)
        }
    }
}

/// Replaces the path of `uri`, keeping its query (and scheme and authority, if any).
pub(super) fn set_path(uri: &mut Uri, path: &str) -> Result<(), http::Error> {
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let mut parts = std::mem::take(uri).into_parts();
    parts.path_and_query = Some(pq.parse()?);
    *uri = Uri::from_parts(parts)?;
    Ok(())
}

pub(super) fn admit<C: Clock + Clone>(
    rules: &Rules<C>,
    resolved: Option<&Resolved<C>>,
    t: &Target<'_>,
    cost: Option<u64>,
) -> Result<Guard<C>, Block> {
    // Hot-parameter rules index the first 8 parameters.
    let mut params = [""; 8];
    let n = t.params.len().min(params.len());
    for (slot, p) in params.iter_mut().zip(&t.params) {
        *slot = p;
    }
    let call = CallContext {
        origin: t.origin,
        criticality: t.criticality,
        params: &params[..n],
        inbound: true,
        cost,
    };
    admit_call(rules, resolved, t.resource, &call)
}

/// The entry of `resource` (looked up already when `resolved`) for the call `ctx`.
pub(super) fn admit_call<C: Clock + Clone>(
    rules: &Rules<C>,
    resolved: Option<&Resolved<C>>,
    resource: &str,
    ctx: &CallContext<'_>,
) -> Result<Guard<C>, Block> {
    match resolved {
        Some(r) => rules.entry_resolved(r, resource, ctx),
        None => rules.entry(resource, ctx),
    }
}
