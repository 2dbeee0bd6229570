//! Rate limiting as a tower layer: any weir-core algorithm, keyed by an extractor.
//!
//! A denied request is answered at once with 429, `Retry-After` (seconds, rounded up),
//! `RateLimit-Policy` / `RateLimit` headers and an `application/problem+json` body; an admitted
//! one reaches the inner service and its response carries the same rate-limit headers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower::{Layer, Service};
use weir_core::{Algorithm, Clock, Decision, KeyedLimiter, MonotonicClock};

use crate::key::KeyExtractor;
use crate::problem;

/// Wraps services with one keyed limiter shared by all of them (`C`: its clock, a manual one in
/// tests).
pub struct RateLimitLayer<A: Algorithm, K, C: Clock = MonotonicClock> {
    limiter: Arc<KeyedLimiter<String, A, C>>,
    key: K,
    policy: Arc<str>,
    window: Duration,
    /// `RateLimit-Policy` for the default limit, built once.
    policy_value: Option<(u64, http::HeaderValue)>,
    /// Rate-limit headers on admitted responses too (default true).
    on_success: bool,
    /// Keys longer than 64 bytes are stored as a digest (bounded memory per key).
    keys: weir_rules::keys::KeyShortener,
}

impl<A: Algorithm, K: Clone, C: Clock> Clone for RateLimitLayer<A, K, C> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            policy: self.policy.clone(),
            window: self.window,
            policy_value: self.policy_value.clone(),
            on_success: self.on_success,
            keys: self.keys,
        }
    }
}

impl<A, K, C> RateLimitLayer<A, K, C>
where
    A: Algorithm + Clone,
    K: KeyExtractor,
    C: Clock,
{
    /// Limits with `limiter`, keyed by `key`; the policy is named `default` in headers.
    pub fn new(limiter: KeyedLimiter<String, A, C>, key: K) -> Self {
        let layer = Self {
            window: limiter.algorithm().window(),
            limiter: Arc::new(limiter),
            key,
            policy: Arc::from("default"),
            policy_value: None,
            on_success: true,
            keys: weir_rules::keys::KeyShortener::new(),
        };
        layer.policy("default")
    }

    /// Names the policy in `RateLimit-Policy` / `RateLimit` (a plain token is safest).
    pub fn policy(mut self, name: &str) -> Self {
        self.policy = Arc::from(name);
        let limit = self.limiter.algorithm().limit();
        self.policy_value = problem::policy_value(name, limit, self.window).map(|v| (limit, v));
        self
    }

    /// Whether admitted responses carry the rate-limit headers too (default true; refusals
    /// always do). Off saves the header formatting on the pass path.
    pub fn headers_on_success(mut self, on: bool) -> Self {
        self.on_success = on;
        self
    }

    /// The shared limiter (for overrides and runtime changes).
    pub fn limiter(&self) -> &Arc<KeyedLimiter<String, A, C>> {
        &self.limiter
    }
}

impl<S, A: Algorithm, K: Clone, C: Clock> Layer<S> for RateLimitLayer<A, K, C> {
    type Service = RateLimit<S, A, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// A service behind a rate limit.
pub struct RateLimit<S, A: Algorithm, K, C: Clock = MonotonicClock> {
    inner: S,
    layer: RateLimitLayer<A, K, C>,
}

impl<S: Clone, A: Algorithm, K: Clone, C: Clock> Clone for RateLimit<S, A, K, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, A, K, C, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, A, K, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    A: Algorithm + Clone,
    K: KeyExtractor,
    C: Clock,
    ResB: From<String>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = LimitFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let Some(key) = self.layer.key.key(&req) else {
            return LimitFuture::Pass {
                inner: self.inner.call(req),
                headers: None,
            };
        };
        let d = self
            .layer
            .limiter
            .acquire(&*self.layer.keys.bounded(&key), 1);
        drop(key);
        let window = self.layer.window;
        if d.allowed() {
            let headers = self.layer.on_success.then(|| {
                let policy = &self.layer.policy;
                Headers {
                    policy: match &self.layer.policy_value {
                        Some((limit, v)) if *limit == d.limit() => Some(v.clone()),
                        _ => problem::policy_value(policy, d.limit(), window),
                    },
                    now: problem::ratelimit_value(policy, &d),
                }
            });
            LimitFuture::Pass {
                inner: self.inner.call(req),
                headers,
            }
        } else {
            LimitFuture::Denied {
                response: Some((self.layer.policy.clone(), window, d)),
            }
        }
    }
}

/// What an admitted response's rate-limit headers say.
pub struct Headers {
    /// `RateLimit-Policy`.
    policy: Option<http::HeaderValue>,
    /// `RateLimit`.
    now: Option<http::HeaderValue>,
}

pin_project_lite::pin_project! {
    /// The response of a [`RateLimit`] service.
    // pin-project-lite takes no documentation on variant fields: the states are what
    // the variants' own documentation says.
    #[allow(missing_docs)]
    #[project = LimitProj]
    pub enum LimitFuture<F> {
        /// Admitted (or not limited): the inner call, then the headers.
        Pass {
            #[pin]
            inner: F,
            headers: Option<Headers>,
        },
        /// Denied: a 429.
        Denied {
            response: Option<(Arc<str>, Duration, Decision)>,
        },
    }
}

impl<F, ResB, E> Future for LimitFuture<F>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    ResB: From<String>,
{
    type Output = Result<Response<ResB>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            LimitProj::Pass { inner, headers } => {
                let mut out = std::task::ready!(inner.poll(cx));
                if let (Ok(r), Some(h)) = (&mut out, headers.take()) {
                    let map = r.headers_mut();
                    if let Some(v) = h.policy {
                        map.insert(problem::RATELIMIT_POLICY, v);
                    }
                    if let Some(v) = h.now {
                        map.insert(problem::RATELIMIT, v);
                    }
                }
                Poll::Ready(out)
            }
            LimitProj::Denied { response } => {
                let (policy, window, d) = response.take().expect("polled after completion");
                Poll::Ready(Ok(problem::too_many(&policy, window, &d)))
            }
        }
    }
}
