//! The futures of [`super::RulesService`]: a call waiting for its shared rules' decision
//! ([`Deciding`]), a paced call waiting for its turn ([`Paced`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use tower::Service;
use weir_core::stats::Outcome;
use weir_core::Clock;
use weir_rules::engine::{Block, Guard};

use crate::problem;

use super::fallback::Fallback;
use super::policy::{on_block, Policy};
use super::response::{blocked_grpc_response, blocked_response, Admitted, GuardBody, Pending};

/// The guard once its shared rules admitted the call, or the block with the guard.
pub(super) type SharedDecision<C> = Result<Guard<C>, (Block, Guard<C>)>;

/// A call waiting for its shared rules' decision.
pub struct Deciding<S, Req, C: Clock + Clone> {
    pub(super) decide: Pin<Box<dyn Future<Output = SharedDecision<C>> + Send>>,
    pub(super) svc: S,
    pub(super) req: Req,
    /// What a refusal of the shared rules becomes: the route's fallback, the layer's pass-on.
    pub(super) fallback: Option<Arc<Fallback>>,
    pub(super) policy: Policy<C>,
}

/// A paced call waiting for its turn.
pub struct Paced<S, Req, C: Clock> {
    pub(super) sleep: Pin<Box<tokio::time::Sleep>>,
    pub(super) svc: S,
    pub(super) req: Req,
    pub(super) guard: Guard<C>,
}

pin_project_lite::pin_project! {
    /// The response of a [`RulesService`].
    // pin-project-lite takes no documentation on variant fields: the states are what
    // the variants' own documentation says.
    #[allow(missing_docs)]
    #[project = RulesProj]
    pub enum RulesFuture<S, Req, C> where S: Service<Req>, C: Clock, C: Clone {
        /// Admitted (or not classified): the inner call.
        Pass {
            #[pin]
            inner: S::Future,
            guard: Pending<C>,
            head: bool,
        },
        /// Admitted by a paced rule: waiting for its turn.
        Waiting {
            paced: Option<Box<Paced<S, Req, C>>>,
        },
        /// Admitted by the local rules: waiting for the shared ones.
        Deciding {
            deciding: Option<Box<Deciding<S, Req, C>>>,
        },
        /// Blocked: answered without calling the service.
        Blocked {
            block: Option<Box<Block>>,
            grpc: bool,
            fallback: Option<Arc<Fallback>>,
        },
        /// A path refused by [`crate::path::normalize`]: answered 400.
        Invalid {
            detail: Option<&'static str>,
        },
    }
}

impl<S, ReqB, ResB, C> Future for RulesFuture<S, Request<ReqB>, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    C: Clock + Clone,
    ResB: Body<Data = Bytes>,
{
    type Output = Result<Response<GuardBody<ResB, C>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                RulesProj::Pass { inner, guard, head } => {
                    let out = std::task::ready!(inner.poll(cx));
                    let (guard, record) = (guard.guard.take(), guard.record.take());
                    return Poll::Ready(match out {
                        Ok(mut r) => {
                            let held = guard.map(|g| Admitted::new(g, &mut r, record));
                            Ok(GuardBody::wrap(r, held, *head))
                        }
                        Err(e) => {
                            if let Some(g) = guard {
                                g.complete(Outcome::Error);
                            }
                            Err(e)
                        }
                    });
                }
                RulesProj::Waiting { paced } => {
                    let Some(p) = paced else {
                        // Polled after completion: nothing sensible left to do.
                        return Poll::Pending;
                    };
                    std::task::ready!(p.sleep.as_mut().poll(cx));
                    let Some(p) = paced.take() else {
                        return Poll::Pending;
                    };
                    let Paced {
                        mut svc,
                        req,
                        guard,
                        ..
                    } = *p;
                    self.set(pass(&mut svc, req, Some(guard)));
                }
                RulesProj::Deciding { deciding } => {
                    let Some(d) = deciding else {
                        return Poll::Pending;
                    };
                    let decided = std::task::ready!(d.decide.as_mut().poll(cx));
                    let Some(d) = deciding.take() else {
                        return Poll::Pending;
                    };
                    let Deciding {
                        svc,
                        req,
                        fallback,
                        policy,
                        ..
                    } = *d;
                    self.set(after_shared(decided, svc, req, fallback, &policy));
                }
                RulesProj::Blocked {
                    block,
                    grpc,
                    fallback,
                } => {
                    let Some(block) = block.take() else {
                        return Poll::Pending;
                    };
                    return Poll::Ready(Ok(refusal(&block, *grpc, fallback.as_deref())));
                }
                RulesProj::Invalid { detail } => {
                    let Some(detail) = detail.take() else {
                        return Poll::Pending;
                    };
                    let r: Response<String> = problem::problem(StatusCode::BAD_REQUEST, detail);
                    return Poll::Ready(Ok(r.map(GuardBody::refused)));
                }
            }
        }
    }
}

/// The inner call of an admitted request (`guard`: what it holds, if anything).
fn pass<S, ReqB, C>(
    svc: &mut S,
    req: Request<ReqB>,
    guard: Option<Guard<C>>,
) -> RulesFuture<S, Request<ReqB>, C>
where
    S: Service<Request<ReqB>>,
    C: Clock + Clone,
{
    let head = req.method() == Method::HEAD;
    let guard = match guard {
        Some(g) => Pending::new(g, req.extensions()),
        None => Pending::none(),
    };
    RulesFuture::Pass {
        inner: svc.call(req),
        guard,
        head,
    }
}

/// What follows the shared rules' decision: the call, its pacing wait, or the refusal (the
/// route's fallback as for any block, or passed on).
fn after_shared<S, ReqB, C>(
    decided: SharedDecision<C>,
    mut svc: S,
    req: Request<ReqB>,
    fallback: Option<Arc<Fallback>>,
    policy: &Policy<C>,
) -> RulesFuture<S, Request<ReqB>, C>
where
    S: Service<Request<ReqB>>,
    C: Clock + Clone,
{
    match decided {
        Ok(guard) if guard.wait().is_zero() => pass(&mut svc, req, Some(guard)),
        Ok(guard) => RulesFuture::Waiting {
            paced: Some(Box::new(Paced {
                sleep: Box::pin(tokio::time::sleep(guard.wait())),
                svc,
                req,
                guard,
            })),
        },
        Err((block, guard)) => {
            if let Some(r) = req.extensions().get::<crate::trace::DecisionRecord>() {
                r.refused(&block.rule, block.kind, policy.pass_blocked);
            }
            match on_block(policy, fallback, req, block) {
                Ok((req, passed)) => {
                    if passed {
                        guard.count_fallback();
                    }
                    drop(guard);
                    pass(&mut svc, req, None)
                }
                Err(answer) => RulesFuture::Blocked {
                    block: Some(Box::new(answer.block)),
                    grpc: answer.grpc,
                    fallback: answer.fallback,
                },
            }
        }
    }
}

/// The answer to a blocked call: the route's fallback, else the refusal in gRPC or HTTP.
fn refusal<B: Body<Data = Bytes>, C: Clock + Clone>(
    block: &Block,
    grpc: bool,
    fallback: Option<&Fallback>,
) -> Response<GuardBody<B, C>> {
    if let Some(f) = fallback {
        return f.respond(block).map(GuardBody::refused);
    }
    let r: Response<String> = if grpc {
        blocked_grpc_response(block)
    } else {
        blocked_response(block)
    };
    r.map(GuardBody::refused)
}

/// The guard once its shared rules decided, or the block (with the guard, which gave back
/// what the call held).
pub(super) async fn decide_shared<C: Clock + Clone>(mut guard: Guard<C>) -> SharedDecision<C> {
    match guard.decide_shared().await {
        Ok(()) => Ok(guard),
        Err(block) => Err((block, guard)),
    }
}
