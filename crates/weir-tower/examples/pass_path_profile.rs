//! The `RulesLayer` pass path in a loop, for counting instructions with callgrind (exact and
//! repeatable on this noisy shared machine, unlike timings):
//!
//! ```text
//! cargo build --release -p weir-tower --example pass_path_profile
//! valgrind --tool=callgrind target/release/examples/pass_path_profile rules 200000
//! ```
//!
//! Run each mode (`plain`: the handler alone; `rules`: one GCRA flow rule on a route) with two
//! counts N and subtract, so one-time costs (runtime, clock calibration) cancel out:
//! instructions per request = (Ir(2N) − Ir(N)) / N. Readings in docs/tower.md.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use http::{Request, Response};
use tower::{Layer, Service};
use weir_rules::config::RuleSet;
use weir_rules::engine::Rules;
use weir_tower::rules::RulesLayer;

type Handler =
    fn(Request<()>) -> std::future::Ready<Result<Response<Body>, std::convert::Infallible>>;

fn handler(_: Request<()>) -> std::future::Ready<Result<Response<Body>, std::convert::Infallible>> {
    std::future::ready(Ok(Response::new(Body::empty())))
}

fn run<S: Service<Request<()>>>(svc: &mut S, n: usize)
where
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..n {
        if svc.poll_ready(&mut cx).is_pending() {
            panic!("not ready at once");
        }
        let req = Request::get("/api/x").body(()).expect("request");
        let mut fut = std::pin::pin!(svc.call(req));
        if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
            drop(std::hint::black_box(r));
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "rules".into());
    let n: usize = args.next().map_or(100_000, |s| s.parse().expect("a count"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _ctx = rt.enter();
    let set = RuleSet::from_yaml(
        Path::new("profile.yaml"),
        "resources:\n  - name: api\n    flow:\n      - {id: api-qps, qps: 1000000000, algorithm: gcra}\nhttp:\n  routes:\n    - {resource: api, prefix: /api}\n",
    )
    .expect("rules");
    let rules = Arc::new(Rules::new(&set).expect("rules"));
    let service = tower::service_fn(handler as Handler);
    match mode.as_str() {
        "plain" => run(&mut { service }, n),
        "rules" => run(&mut RulesLayer::new(rules).layer(service), n),
        other => {
            eprintln!("usage: pass_path_profile plain|rules [N] (got {other:?})");
            std::process::exit(2);
        }
    }
}
