//! A gutter: a small second upstream that takes what a failing primary sheds.
//!
//! Instead of a full failover cluster (twice the machines), a gutter is a small pool (say a
//! tenth of the primary) that serves the requests the primary's circuit breaker refuses; when
//! the gutter cannot take a request either (its own breaker open, or at its concurrency limit)
//! the request is thrown back at the primary, through the primary's breaker (so only as a
//! half-open probe or a ramping share) and its concurrency limit, so it only ever adds what the
//! primary can take. Each upstream ("lane") has its own breaker and concurrency limit.
//!
//! Per request, in order:
//! 1. **primary**: its breaker admits (closed, a half-open probe, a ramping share) and a
//!    concurrency permit is free;
//! 2. **gutter**: the same on the gutter lane;
//! 3. **thrown back**: the primary once more (a probe slot or a permit may have freed);
//! 4. **rejected**: [`GutterError::Rejected`] at once — never a wait.
//!
//! A lane's call is a failure for its breaker when the response is a 5xx or the inner
//! service fails (a timeout the inner service reports as 504 included); slow calls count as
//! its breaker configuration says. The primary's recovery is probed as its breaker
//! prescribes; once closed, traffic returns to it. [`Gutter::stats`] counts every decision.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower::Service;
use weir_core::breaker::{Breaker, BreakerConfig, BreakerState, Call};
use weir_core::clock::{Clock, MonotonicClock};
use weir_core::concurrency::{ConcurrencyLimiter, Permit};
use weir_core::stats::Outcome;
use weir_core::ConfigError;

/// One upstream's protection: a breaker and a concurrency limit.
#[derive(Debug, Clone)]
pub struct LaneConfig {
    /// Its circuit breaker.
    pub breaker: BreakerConfig,
    /// Most requests in flight to it.
    pub max_in_flight: u64,
}

struct Lane {
    breaker: Breaker,
    limit: ConcurrencyLimiter,
}

impl Lane {
    /// A lane whose breaker logs its transitions (`upstream`: `primary` or `gutter`).
    fn new(upstream: &'static str, c: &LaneConfig) -> Result<Self, ConfigError> {
        let breaker = Breaker::new(c.breaker.clone())?.with_observer(move |t| {
            tracing::warn!(upstream, from = ?t.from, to = ?t.to, "upstream breaker state changed");
        });
        Ok(Self {
            breaker,
            limit: ConcurrencyLimiter::new(c.max_in_flight)?,
        })
    }

    /// A breaker call and a permit, or the breaker's state and wait when refused.
    fn admit(&self, now: u64) -> Result<(Call, Permit), Duration> {
        let permit = self.limit.try_acquire(1).map_err(|_| Duration::ZERO)?;
        let call = self.breaker.try_acquire(now).map_err(|r| r.retry_after)?;
        Ok((call, permit))
    }
}

/// Where a request went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The primary took it.
    Primary,
    /// The gutter took it (the primary refused).
    Gutter,
    /// Both refused at first; the primary took it on the second ask.
    ThrownBack,
}

/// Decisions so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GutterStats {
    /// Sent to the primary.
    pub primary: u64,
    /// Sent to the gutter.
    pub gutter: u64,
    /// Thrown back at the primary and taken.
    pub thrown_back: u64,
    /// Refused by both.
    pub rejected: u64,
}

#[derive(Default)]
struct Counters([AtomicU64; 4]);

struct Shared<C> {
    primary: Lane,
    gutter: Lane,
    clock: C,
    counts: Counters,
}

/// Why the gutter service failed a request.
#[derive(Debug, thiserror::Error)]
pub enum GutterError<E> {
    /// Neither upstream could take it (their breakers open or their limits reached).
    #[error("primary and gutter both refused; retry in {retry_after:?}")]
    Rejected {
        /// When the primary's breaker may admit again (zero: unknown, a limit was full).
        retry_after: Duration,
    },
    /// The upstream that took it failed.
    #[error(transparent)]
    Inner(E),
}

/// A service over a primary and a gutter (see the module documentation). Cheap to clone.
pub struct Gutter<P, G, C: Clock = MonotonicClock> {
    primary: P,
    gutter: G,
    shared: Arc<Shared<C>>,
}

impl<P: Clone, G: Clone, C: Clock> Clone for Gutter<P, G, C> {
    fn clone(&self) -> Self {
        Self {
            primary: self.primary.clone(),
            gutter: self.gutter.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<P, G> Gutter<P, G> {
    /// `primary` and `gutter` each behind its own breaker and concurrency limit.
    pub fn new(primary: P, gutter: G, p: &LaneConfig, g: &LaneConfig) -> Result<Self, ConfigError> {
        Self::with_clock(primary, gutter, p, g, MonotonicClock::default())
    }
}

impl<P, G, C: Clock> Gutter<P, G, C> {
    /// [`Gutter::new`] reading time from `clock`.
    pub fn with_clock(
        primary: P,
        gutter: G,
        p: &LaneConfig,
        g: &LaneConfig,
        clock: C,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            primary,
            gutter,
            shared: Arc::new(Shared {
                primary: Lane::new("primary", p)?,
                gutter: Lane::new("gutter", g)?,
                clock,
                counts: Counters::default(),
            }),
        })
    }

    /// The same breakers, limits and counters in front of other services (e.g. clones with
    /// per-connection state).
    pub fn with_services<P2, G2>(&self, primary: P2, gutter: G2) -> Gutter<P2, G2, C> {
        Gutter {
            primary,
            gutter,
            shared: self.shared.clone(),
        }
    }

    /// Every decision so far.
    pub fn stats(&self) -> GutterStats {
        let c = &self.shared.counts.0;
        let n = |i: usize| c[i].load(Ordering::Relaxed);
        GutterStats {
            primary: n(0),
            gutter: n(1),
            thrown_back: n(2),
            rejected: n(3),
        }
    }

    /// The breakers' states (primary, gutter).
    pub fn states(&self) -> (BreakerState, BreakerState) {
        (
            self.shared.primary.breaker.state(),
            self.shared.gutter.breaker.state(),
        )
    }

    /// Where a request at `now` goes, with what it holds; or when to retry.
    fn route(&self, now: u64) -> Result<(Route, Call, Permit), Duration> {
        let s = &self.shared;
        let count = |i: usize| s.counts.0[i].fetch_add(1, Ordering::Relaxed);
        let wait = match s.primary.admit(now) {
            Ok((call, permit)) => {
                count(0);
                return Ok((Route::Primary, call, permit));
            }
            Err(wait) => wait,
        };
        if let Ok((call, permit)) = s.gutter.admit(now) {
            count(1);
            return Ok((Route::Gutter, call, permit));
        }
        match s.primary.admit(now) {
            Ok((call, permit)) => {
                count(2);
                Ok((Route::ThrownBack, call, permit))
            }
            Err(again) => {
                count(3);
                Err(wait.max(again))
            }
        }
    }
}

/// The future of a [`Gutter`] call.
type GutterFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, GutterError<E>>> + Send>>;

impl<P, G, C, ReqB, ResB, E> Service<Request<ReqB>> for Gutter<P, G, C>
where
    P: Service<Request<ReqB>, Response = Response<ResB>, Error = E> + Clone + Send + 'static,
    G: Service<Request<ReqB>, Response = Response<ResB>, Error = E> + Clone + Send + 'static,
    P::Future: Send + 'static,
    G::Future: Send + 'static,
    C: Clock + Send + Sync + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    E: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = GutterError<E>;
    type Future = GutterFuture<Response<ResB>, E>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each call picks its upstream; the chosen one is readied in the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let shared = self.shared.clone();
        let (route, call, permit) = match self.route(shared.clock.now()) {
            Ok(chosen) => chosen,
            Err(retry_after) => {
                return Box::pin(async move { Err(GutterError::Rejected { retry_after }) })
            }
        };
        let fut: Pin<Box<dyn Future<Output = Result<Response<ResB>, E>> + Send>> = match route {
            Route::Gutter => Box::pin(ready_and_call(self.gutter.clone(), req)),
            Route::Primary | Route::ThrownBack => {
                Box::pin(ready_and_call(self.primary.clone(), req))
            }
        };
        Box::pin(async move {
            let out = fut.await;
            let outcome = match &out {
                Ok(r) if !r.status().is_server_error() => Outcome::Success,
                _ => Outcome::Error,
            };
            let lane = match route {
                Route::Gutter => &shared.gutter,
                Route::Primary | Route::ThrownBack => &shared.primary,
            };
            lane.breaker.record(call, shared.clock.now(), outcome);
            drop(permit);
            out.map_err(GutterError::Inner)
        })
    }
}

/// Waits for `svc` to be ready, then calls it.
async fn ready_and_call<S: Service<R>, R>(mut svc: S, req: R) -> Result<S::Response, S::Error> {
    std::future::poll_fn(|cx| svc.poll_ready(cx)).await?;
    svc.call(req).await
}
