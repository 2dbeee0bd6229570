//! Client-side layers for tower clients (hyper-util's client, tonic channels, any
//! `Service<Request<B>>`): a circuit breaker, Google SRE adaptive throttling and retries with
//! backoff and a budget. They refuse locally with [`ClientError`] instead of sending a request
//! that would only add load to a failing or overloaded server.
//!
//! Outcomes are classified from the HTTP response: a 5xx or a transport error is a failure
//! (breaker); a 429 or 503 is an overload rejection (SRE throttling counts it as not
//! accepted); 429, 502, 503, 504 and transport errors are retryable, honouring `Retry-After`
//! (seconds) when the server sends it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{Layer, Service};
use weir_core::breaker::{Breaker, Rejected};
use weir_core::retry::{RetryBudget, RetryPolicy, RetryVerdict};
use weir_core::stats::Outcome;
use weir_core::throttle::SreThrottle;
use weir_core::{Clock, MonotonicClock, Nanos};

/// Why a client layer failed a call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError<E> {
    /// The breaker is open (or half-open with its probes taken).
    #[error("circuit breaker {state:?}: not sending; retry in {retry_after:?}")]
    BreakerOpen {
        /// The breaker's state.
        state: weir_core::breaker::BreakerState,
        /// When a call may be admitted at the earliest.
        retry_after: Duration,
    },
    /// SRE adaptive throttling rejected the call locally.
    #[error("throttled locally: the server has been rejecting requests")]
    Throttled,
    /// The inner service failed.
    #[error(transparent)]
    Inner(E),
}

/// Whether a response is a failure for the breaker (5xx).
fn failed<B>(r: &Response<B>) -> bool {
    r.status().is_server_error()
}

/// Whether a response is an overload rejection (429, 503).
fn overloaded<B>(r: &Response<B>) -> bool {
    matches!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    )
}

/// What a client layer checks before sending a request and records once it is answered: a
/// circuit breaker or SRE adaptive throttling. [`GateLayer`] runs any gate.
pub trait Gate: Send + Sync + 'static {
    /// What an admitted call carries until its result is recorded.
    type Ticket: Send + 'static;
    /// Admits a call at `now`, or refuses it locally (`ClientError::BreakerOpen` /
    /// `ClientError::Throttled`).
    fn admit(&self, now: Nanos) -> Result<Self::Ticket, ClientError<Infallible>>;
    /// Records the call's result at `now` (`None`: a transport error).
    fn record<B>(&self, ticket: Self::Ticket, now: Nanos, response: Option<&Response<B>>);
}

impl Gate for Breaker {
    type Ticket = weir_core::breaker::Call;

    fn admit(&self, now: Nanos) -> Result<Self::Ticket, ClientError<Infallible>> {
        self.try_acquire(now)
            .map_err(|Rejected { state, retry_after }| ClientError::BreakerOpen {
                state,
                retry_after,
            })
    }

    fn record<B>(&self, call: Self::Ticket, now: Nanos, response: Option<&Response<B>>) {
        let outcome = match response {
            Some(r) if !failed(r) => Outcome::Success,
            _ => Outcome::Error,
        };
        Breaker::record(self, call, now, outcome);
    }
}

impl Gate for SreThrottle {
    type Ticket = ();

    fn admit(&self, now: Nanos) -> Result<(), ClientError<Infallible>> {
        if self.allow(now) {
            Ok(())
        } else {
            Err(ClientError::Throttled)
        }
    }

    fn record<B>(&self, _: (), now: Nanos, response: Option<&Response<B>>) {
        if response.is_some_and(|r| !overloaded(r)) {
            self.record_accept(now);
        }
    }
}

/// A [`Gate`] in front of a client service: [`BreakerLayer`] or [`ThrottleLayer`].
#[derive(Clone)]
pub struct GateLayer<G, C: Clock = MonotonicClock> {
    gate: Arc<G>,
    clock: C,
}

/// A circuit breaker in front of a client service: a 5xx or a transport error is a failure;
/// open → `ClientError::BreakerOpen` without sending.
pub type BreakerLayer<C = MonotonicClock> = GateLayer<Breaker, C>;

/// Google SRE adaptive throttling in front of a client service (K = 2 over 2 minutes with
/// `SreThrottle::new()`): 429 / 503 are not accepts; `ClientError::Throttled` locally.
pub type ThrottleLayer<C = MonotonicClock> = GateLayer<SreThrottle, C>;

impl<G: Gate> GateLayer<G, MonotonicClock> {
    /// Guards calls with `gate` (share the `Arc` to observe or reuse it).
    pub fn new(gate: Arc<G>) -> Self {
        Self::with_clock(gate, MonotonicClock::new())
    }
}

impl<G: Gate, C: Clock> GateLayer<G, C> {
    /// As [`GateLayer::new`], reading `clock`.
    pub fn with_clock(gate: Arc<G>, clock: C) -> Self {
        Self { gate, clock }
    }
}

impl<S, G, C: Clock + Clone> Layer<S> for GateLayer<G, C> {
    type Service = GateService<S, G, C>;

    fn layer(&self, inner: S) -> Self::Service {
        GateService {
            inner,
            gate: self.gate.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// A client service behind a [`Gate`].
#[derive(Clone)]
pub struct GateService<S, G, C: Clock = MonotonicClock> {
    inner: S,
    gate: Arc<G>,
    clock: C,
}

impl<S, G, C, ReqB, ResB> Service<Request<ReqB>> for GateService<S, G, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Future: Send + 'static,
    G: Gate,
    C: Clock + Clone + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = ClientError<S::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(ClientError::Inner)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let ticket = match self.gate.admit(self.clock.now()) {
            Ok(t) => t,
            Err(refusal) => {
                return Box::pin(async move {
                    Err(match refusal {
                        ClientError::BreakerOpen { state, retry_after } => {
                            ClientError::BreakerOpen { state, retry_after }
                        }
                        ClientError::Throttled => ClientError::Throttled,
                        ClientError::Inner(never) => match never {},
                    })
                })
            }
        };
        let fut = self.inner.call(req);
        let (gate, clock) = (self.gate.clone(), self.clock.clone());
        Box::pin(async move {
            let out = fut.await;
            gate.record(ticket, clock.now(), out.as_ref().ok());
            out.map_err(ClientError::Inner)
        })
    }
}

/// Retries with backoff (gRPC's defaults: 1 s × 1.6 ± 20 %, max 120 s; 3 attempts) and an
/// optional budget, honouring `Retry-After`. Requests must be `Clone` (e.g. a body of
/// `Full<Bytes>` or `String`).
#[derive(Clone)]
pub struct RetryLayer<C: Clock = MonotonicClock> {
    policy: RetryPolicy,
    budget: Option<Arc<RetryBudget>>,
    clock: C,
}

impl RetryLayer<MonotonicClock> {
    /// Retries by `policy`, within `budget` if given (share the budget among all clients of
    /// one backend so retries cannot multiply an outage).
    pub fn new(policy: RetryPolicy, budget: Option<Arc<RetryBudget>>) -> Self {
        Self {
            policy,
            budget,
            clock: MonotonicClock::new(),
        }
    }
}

impl<S, C: Clock + Clone> Layer<S> for RetryLayer<C> {
    type Service = RetryService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryService {
            inner,
            layer: self.clone(),
        }
    }
}

/// A client service that retries.
#[derive(Clone)]
pub struct RetryService<S, C: Clock = MonotonicClock> {
    inner: S,
    layer: RetryLayer<C>,
}

/// What the retry layer does with an attempt's result.
pub fn retry_verdict<B, E>(result: &Result<Response<B>, E>) -> RetryVerdict {
    match result {
        Err(_) => RetryVerdict::Retry(None),
        Ok(r) => match r.status() {
            StatusCode::TOO_MANY_REQUESTS
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT => RetryVerdict::Retry(
                r.headers()
                    .get(http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    // At most the backoff's own cap: a hostile Retry-After cannot park us.
                    .map(|s| Duration::from_secs(s.min(120))),
            ),
            _ => RetryVerdict::Done,
        },
    }
}

impl<S, C, ReqB, ResB> Service<Request<ReqB>> for RetryService<S, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Clone + Send + Sync + 'static,
    ResB: Send + 'static,
    C: Clock + Clone + Send + Sync + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The ready service makes the first attempt; clones (readied in turn) the retries.
        let clone = self.inner.clone();
        let first = std::mem::replace(&mut self.inner, clone.clone());
        let layer = self.layer.clone();
        let seed = layer.clock.now();
        Box::pin(async move {
            let mut first = Some(first);
            weir_core::retry::retry(
                &layer.policy,
                layer.budget.as_deref(),
                &layer.clock,
                seed,
                |_| {
                    let attempt = clone_request(&req);
                    let svc = first.take();
                    let mut retry_svc = clone.clone();
                    async move {
                        match svc {
                            Some(mut s) => s.call(attempt).await,
                            None => {
                                std::future::poll_fn(|cx| retry_svc.poll_ready(cx)).await?;
                                retry_svc.call(attempt).await
                            }
                        }
                    }
                },
                retry_verdict,
            )
            .await
        })
    }
}

/// A copy of `req` (method, URI, version, headers, body; extensions are not `Clone` and stay
/// behind).
fn clone_request<B: Clone>(req: &Request<B>) -> Request<B> {
    let mut r = Request::new(req.body().clone());
    *r.method_mut() = req.method().clone();
    *r.uri_mut() = req.uri().clone();
    *r.version_mut() = req.version();
    *r.headers_mut() = req.headers().clone();
    r
}
