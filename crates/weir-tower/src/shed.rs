//! Overload shedding with BBR as a tower layer.
//!
//! Each request reads its criticality from the `x-weir-criticality` header and asks the shared
//! [`Bbr`]; a dropped request is answered at once with 503, `Retry-After: 1` and an
//! `application/problem+json` body, without reaching the inner service. An admitted request's
//! response time runs until the inner service answers (headers ready), which is when its work
//! is done for handlers that compute the response up front.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{header, HeaderValue, Request, Response, StatusCode};
use tower::{Layer, Service};
use weir_core::adaptive::bbr::{Bbr, BbrPermit};
use weir_core::stats::Outcome;
use weir_core::{Clock, MonotonicClock};

/// Wraps services with BBR shedding on one shared [`Bbr`].
#[derive(Clone)]
pub struct BbrLayer {
    bbr: Arc<Bbr>,
    clock: MonotonicClock,
}

impl BbrLayer {
    /// Sheds with `bbr` (shared by every service the layer wraps).
    pub fn new(bbr: Arc<Bbr>) -> Self {
        Self {
            bbr,
            clock: MonotonicClock::new(),
        }
    }
}

impl<S> Layer<S> for BbrLayer {
    type Service = BbrService<S>;

    fn layer(&self, inner: S) -> BbrService<S> {
        BbrService {
            inner,
            bbr: self.bbr.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// A service behind BBR shedding.
#[derive(Clone)]
pub struct BbrService<S> {
    inner: S,
    bbr: Arc<Bbr>,
    clock: MonotonicClock,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for BbrService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: From<String>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let level = crate::criticality::read(req.headers());
        match self.bbr.try_acquire_owned(level, self.clock.now()) {
            Ok(permit) => ResponseFuture::Admitted {
                inner: self.inner.call(req),
                permit: Some(permit),
                clock: self.clock.clone(),
            },
            Err(_) => ResponseFuture::Shed,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response of a [`BbrService`].
    // pin-project-lite takes no documentation on variant fields: the states are what
    // the variants' own documentation says.
    #[allow(missing_docs)]
    #[project = Projected]
    pub enum ResponseFuture<F> {
        /// Admitted: the inner call, completing the permit when it answers.
        Admitted {
            #[pin]
            inner: F,
            permit: Option<BbrPermit<Arc<Bbr>>>,
            clock: MonotonicClock,
        },
        /// Dropped: a 503.
        Shed,
    }
}

impl<F, ResB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    ResB: From<String>,
{
    type Output = Result<Response<ResB>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            Projected::Admitted {
                inner,
                permit,
                clock,
            } => {
                let out = std::task::ready!(inner.poll(cx));
                if let Some(p) = permit.take() {
                    let outcome = match &out {
                        Ok(r) if !r.status().is_server_error() => Outcome::Success,
                        _ => Outcome::Error,
                    };
                    p.finish(clock.now(), outcome);
                }
                Poll::Ready(out)
            }
            Projected::Shed => {
                let mut r = crate::problem::problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "overloaded: request shed by weir (BBR)",
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                Poll::Ready(Ok(r))
            }
        }
    }
}
