//! Shared by `benches/layers.rs` and `examples/pass_path_profile.rs`: the trivial handler, one
//! request polled to completion, and the one-flow-rule set both measure.

use std::future::Future;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use http::{Request, Response};
use tower::Service;
use weir_rules::config::RuleSet;
use weir_rules::engine::Rules;

/// The handler every case calls: an empty `axum::body::Body`.
pub type Handler = tower::util::ServiceFn<
    fn(Request<()>) -> std::future::Ready<Result<Response<Body>, std::convert::Infallible>>,
>;

/// The trivial handler.
pub fn handler() -> Handler {
    fn h(_: Request<()>) -> std::future::Ready<Result<Response<Body>, std::convert::Infallible>> {
        std::future::ready(Ok(Response::new(Body::empty())))
    }
    tower::service_fn(h as fn(_) -> _)
}

/// One request through `svc`, polled to completion (every case here is ready at once).
pub fn once<S>(svc: &mut S)
where
    S: Service<Request<()>>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    match svc.poll_ready(&mut cx) {
        Poll::Ready(r) => r.expect("ready"),
        Poll::Pending => panic!("not ready at once"),
    }
    let req = Request::get("/api/x").body(()).expect("request");
    let mut fut = std::pin::pin!(svc.call(req));
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(r) => drop(black_box(r.expect("response"))),
        Poll::Pending => panic!("not answered at once"),
    }
}

/// One flow rule (GCRA, a limit never reached) on resource `api`, routed from `/api`.
pub fn rules() -> Arc<Rules> {
    Arc::new(Rules::new(&rule_set()).expect("rules"))
}

/// [`rules`] reading `clock`.
#[allow(dead_code)]
pub fn rules_on<C: weir_core::Clock + Clone + Send + Sync + 'static>(clock: C) -> Arc<Rules<C>> {
    Arc::new(Rules::with_clock(&rule_set(), clock).expect("rules"))
}

fn rule_set() -> RuleSet {
    RuleSet::from_yaml(
        Path::new("bench.yaml"),
        "resources:\n  - name: api\n    flow:\n      - {id: api-qps, qps: 1000000000, algorithm: gcra}\nhttp:\n  routes:\n    - {resource: api, prefix: /api}\n",
    )
    .expect("rules")
}

/// The handler behind tower-resilience-ratelimiter's layer, with a limit never reached.
#[allow(dead_code)]
pub fn resilience() -> impl Service<Request<()>, Error = impl std::fmt::Debug> + 'static {
    let layer = tower_resilience_ratelimiter::RateLimiterLayer::builder()
        .limit_for_period(1_000_000_000)
        .refresh_period(std::time::Duration::from_secs(1))
        .timeout_duration(std::time::Duration::ZERO)
        .build()
        .expect("resilience config");
    tower::Layer::layer(&layer, handler())
}

/// The handler behind tower_governor's layer, one global key, a limit never reached.
#[allow(dead_code)]
pub fn governor() -> impl Service<Request<()>, Error = impl std::fmt::Debug> + 'static {
    let config = tower_governor::governor::GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000_000)
        .key_extractor(tower_governor::key_extractor::GlobalKeyExtractor)
        .finish()
        .expect("governor config");
    tower::Layer::layer(&tower_governor::GovernorLayer::new(config), handler())
}
