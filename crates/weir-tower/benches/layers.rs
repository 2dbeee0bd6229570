//! What a rate-limit layer adds to a request on its pass path, side by side in one run:
//! `cargo bench -p weir-tower --bench layers`.
//!
//! Every case calls a trivial handler (an empty `axum::body::Body`) through `poll_ready` +
//! `call`, polled once with a no-op waker inside a tokio runtime context, and drops the
//! response. Limits are far above what the run reaches, so every request passes:
//! - `handler`: the handler alone (the baseline to subtract);
//! - `weir_rules_route`: `RulesLayer` with one flow rule (GCRA) on a route of the rule file;
//! - `weir_rules_closure`: the same rule, the resource chosen by a closure;
//! - `weir_rules_route_coarse`: `weir_rules_route` on a `CoarseClock` (1 ms);
//! - `weir_rate_limit`: `RateLimitLayer` (GCRA, one global key), `RateLimit-Policy` and
//!   `RateLimit` headers on every response; `…_no_success_headers`: only on refusals;
//! - `tower_governor`: `GovernorLayer` with its global key extractor (governor's GCRA);
//! - `tower_resilience`: `tower-resilience-ratelimiter`'s fixed-window layer.

// criterion_group! defines an undocumented function.
#![allow(missing_docs)]

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tower::Layer;
use weir_core::{Gcra, KeyedLimiter, Quota};
use weir_tower::key::Global;
use weir_tower::limit::RateLimitLayer;
use weir_tower::rules::{ClassifyFn, RulesLayer, Target};

mod fixture;
use fixture::{handler, once};

fn layers(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _ctx = rt.enter();
    let rules = fixture::rules();
    let mut g = c.benchmark_group("layer");
    let mut plain = handler();
    g.bench_function("handler", |b| b.iter(|| once(&mut plain)));
    let mut routed = RulesLayer::new(rules.clone()).layer(handler());
    g.bench_function("weir_rules_route", |b| b.iter(|| once(&mut routed)));
    let mut closure = RulesLayer::with_classifier(
        rules,
        ClassifyFn::new(|_: weir_tower::rules::Head<'_>| {
            Some(Target {
                resource: "api",
                origin: "",
                criticality: weir_core::Criticality::Critical,
                params: Vec::new(),
            })
        }),
    )
    .layer(handler());
    g.bench_function("weir_rules_closure", |b| b.iter(|| once(&mut closure)));
    let coarse = weir_core::CoarseClock::new(Duration::from_millis(1)).expect("clock");
    let mut routed_coarse = RulesLayer::new(fixture::rules_on(coarse)).layer(handler());
    g.bench_function("weir_rules_route_coarse", |b| {
        b.iter(|| once(&mut routed_coarse))
    });
    let limiter = KeyedLimiter::new(
        Gcra::from_quota(Quota::per_second(1_000_000_000).expect("quota")).expect("gcra"),
        16,
    )
    .expect("limiter");
    let layer = RateLimitLayer::new(limiter, Global);
    let mut weir_rate = layer.clone().layer(handler());
    g.bench_function("weir_rate_limit", |b| b.iter(|| once(&mut weir_rate)));
    let mut weir_rate_quiet = layer.headers_on_success(false).layer(handler());
    g.bench_function("weir_rate_limit_no_success_headers", |b| {
        b.iter(|| once(&mut weir_rate_quiet))
    });
    let mut governor = fixture::governor();
    g.bench_function("tower_governor", |b| b.iter(|| once(&mut governor)));
    let mut resilience = fixture::resilience();
    g.bench_function("tower_resilience", |b| b.iter(|| once(&mut resilience)));
    g.finish();
}

criterion_group!(benches, layers);
criterion_main!(benches);
