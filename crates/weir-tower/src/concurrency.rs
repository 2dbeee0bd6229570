//! Concurrency limiting as a tower layer: at most N requests in flight, the permit held until
//! the response body ends or is dropped (a client that disconnects mid-body frees its slot).
//! When full, requests are shed at once with 503 and a problem body, lowest criticality first
//! when the limiter has shares.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use tower::{Layer, Service};
use weir_core::{ConcurrencyLimiter, Permit};

use crate::problem;

/// Wraps services with one shared [`ConcurrencyLimiter`].
#[derive(Clone)]
pub struct ConcurrencyLayer {
    limiter: ConcurrencyLimiter,
}

impl ConcurrencyLayer {
    /// Limits with `limiter` (cheap to clone: all services share its state).
    pub fn new(limiter: ConcurrencyLimiter) -> Self {
        Self { limiter }
    }
}

impl<S> Layer<S> for ConcurrencyLayer {
    type Service = Concurrency<S>;

    fn layer(&self, inner: S) -> Concurrency<S> {
        Concurrency {
            inner,
            limiter: self.limiter.clone(),
        }
    }
}

/// A service behind a concurrency limit.
#[derive(Clone)]
pub struct Concurrency<S> {
    inner: S,
    limiter: ConcurrencyLimiter,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Concurrency<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes>,
{
    type Response = Response<PermitBody<ResB>>;
    type Error = S::Error;
    type Future = ConcurrencyFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let level = crate::criticality::read(req.headers());
        let head = req.method() == http::Method::HEAD;
        match self.limiter.try_acquire_as(1, level) {
            Ok(permit) => ConcurrencyFuture::Admitted {
                inner: self.inner.call(req),
                permit: Some(permit),
                head,
            },
            Err(_) => ConcurrencyFuture::Shed,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response of a [`Concurrency`] service.
    // pin-project-lite takes no documentation on variant fields: the states are what
    // the variants' own documentation says.
    #[allow(missing_docs)]
    #[project = ConcProj]
    pub enum ConcurrencyFuture<F> {
        /// Admitted: the inner call; the permit moves into the body.
        Admitted {
            #[pin]
            inner: F,
            permit: Option<Permit>,
            head: bool,
        },
        /// Full: a 503.
        Shed,
    }
}

impl<F, ResB, E> Future for ConcurrencyFuture<F>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    ResB: Body<Data = Bytes>,
{
    type Output = Result<Response<PermitBody<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ConcProj::Admitted {
                inner,
                permit,
                head,
            } => {
                let out = std::task::ready!(inner.poll(cx));
                let permit = permit.take();
                Poll::Ready(out.map(|r| PermitBody::wrap(r, permit, *head)))
            }
            ConcProj::Shed => {
                let r: Response<String> = problem::problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "overloaded: too many requests in flight",
                );
                Poll::Ready(Ok(r.map(PermitBody::refused)))
            }
        }
    }
}

/// A response body holding a concurrency permit until it ends or is dropped.
pub type PermitBody<B> = crate::body::HeldBody<B, Permit>;
