//! What a blocked request gets instead of the block: its route's fallback (a response or a
//! fallback upstream, [`Degraded`]), or the block passed on ([`OnBlocked`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use tower::Service;
use weir_rules::engine::{Block, RuleKind};

use super::response::blocked_response;

/// A route's compiled fallback (the rule file's `fallback`).
#[derive(Debug)]
pub struct Fallback {
    pub(super) resource: Box<str>,
    pub(super) kinds: Vec<RuleKind>,
    pub(super) status: StatusCode,
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
    pub(super) body: Bytes,
    /// Forward to the fallback upstream instead of answering (the request then carries
    /// [`Degraded`]).
    pub(super) upstream: Option<Arc<str>>,
}

impl Fallback {
    pub(super) fn compile(resource: &str, f: &weir_rules::config::Fallback) -> Self {
        Self {
            resource: resource.into(),
            kinds: RuleKind::ALL
                .into_iter()
                .filter(|k| f.covers(k.as_str()))
                .collect(),
            status: StatusCode::from_u16(f.status).unwrap_or(StatusCode::OK),
            headers: f
                .headers
                .iter()
                .filter_map(|(k, v)| {
                    Some((
                        HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()).ok()?,
                        HeaderValue::from_str(v).ok()?,
                    ))
                })
                .collect(),
            body: Bytes::copy_from_slice(f.body_bytes()),
            upstream: f.upstream.as_deref().map(Arc::from),
        }
    }

    /// The configured answer to `block` (rate-limit headers kept for rate limits).
    pub(super) fn respond(&self, block: &Block) -> Response<Bytes> {
        let plain: Response<String> = blocked_response(block);
        let mut r = Response::new(self.body.clone());
        *r.status_mut() = self.status;
        if matches!(block.kind, RuleKind::Flow | RuleKind::HotParam) {
            for name in ["retry-after", "ratelimit-policy", "ratelimit"] {
                if let Some(v) = plain.headers().get(name) {
                    r.headers_mut().insert(name, v.clone());
                }
            }
        }
        for (k, v) in &self.headers {
            r.headers_mut().insert(k.clone(), v.clone());
        }
        r
    }
}

/// Set on a blocked request that is passed on to be answered by a fallback instead of being
/// refused: a route's fallback `upstream` (`weir proxy` forwards such requests there), or any
/// block when the layer was built [`RulesLayer::with_fallback`](super::RulesLayer::with_fallback) (route it with [`OnBlocked`]).
#[derive(Debug, Clone)]
pub struct Degraded {
    /// Why it was blocked.
    pub block: Block,
    /// `http://HOST:PORT` of the route's fallback upstream, if it names one.
    pub upstream: Option<Arc<str>>,
}

/// Sends requests carrying [`Degraded`] (blocked, see [`RulesLayer::with_fallback`](super::RulesLayer::with_fallback)) to
/// `fallback` and the rest to `main`: Hystrix's `getFallback` for tower. The fallback reads
/// why from the request's `Degraded` extension.
#[derive(Clone, Debug)]
pub struct OnBlocked<S, F> {
    pub(super) main: S,
    pub(super) fallback: F,
}

impl<S, F> OnBlocked<S, F> {
    /// `main` for admitted requests, `fallback` for blocked ones.
    pub fn new(main: S, fallback: F) -> Self {
        Self { main, fallback }
    }
}

impl<S, F, B> Service<Request<B>> for OnBlocked<S, F>
where
    S: Service<Request<B>>,
    F: Service<Request<B>, Response = S::Response, Error = S::Error>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = OnBlockedFuture<S::Future, F::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Both: which one a request needs is known only at the call.
        std::task::ready!(self.main.poll_ready(cx))?;
        self.fallback.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if req.extensions().get::<Degraded>().is_some() {
            OnBlockedFuture::Fallback {
                f: self.fallback.call(req),
            }
        } else {
            OnBlockedFuture::Main {
                f: self.main.call(req),
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`OnBlocked`]: the main service's or the fallback's.
    // pin-project-lite takes no documentation on variant fields: the states are what
    // the variants' own documentation says.
    #[allow(missing_docs)]
    #[project = OnBlockedProj]
    pub enum OnBlockedFuture<A, B> {
        /// Admitted.
        Main { #[pin] f: A },
        /// Blocked.
        Fallback { #[pin] f: B },
    }
}

impl<A: Future, B: Future<Output = A::Output>> Future for OnBlockedFuture<A, B> {
    type Output = A::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<A::Output> {
        match self.project() {
            OnBlockedProj::Main { f } => f.poll(cx),
            OnBlockedProj::Fallback { f } => f.poll(cx),
        }
    }
}
