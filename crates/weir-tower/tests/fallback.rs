//! `RulesLayer::with_fallback` + `OnBlocked`: blocked requests reach a fallback service that
//! knows why; admitted ones the main service; a route's own `fallback` response still wins.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{Layer, ServiceExt};
use weir_rules::config::RuleSet;
use weir_rules::engine::Rules;
use weir_tower::rules::{Degraded, OnBlocked, RulesLayer};

async fn body<B: http_body::Body>(r: Response<B>) -> (StatusCode, String)
where
    B::Error: std::fmt::Debug,
{
    let status = r.status();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn blocked_requests_reach_the_fallback_service_with_the_reason() {
    let yaml = "resources:
  - name: api
    flow:
      - {id: api-rate, qps: 1, window: 1h}
  - name: page
    flow:
      - {id: page-rate, qps: 1, window: 1h}
http:
  routes:
    - {resource: api, prefix: /api}
    - resource: page
      prefix: /page
      fallback: {body: static page}
";
    let rules =
        Arc::new(Rules::new(&RuleSet::from_yaml(Path::new("r.yaml"), yaml).unwrap()).unwrap());
    let main = tower::service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new("main".to_string()))
    });
    let fallback = tower::service_fn(|req: Request<String>| async move {
        let why = req.extensions().get::<Degraded>().expect("the reason");
        Ok::<_, Infallible>(Response::new(format!(
            "fallback for {} ({})",
            why.block.rule,
            why.block.kind.as_str()
        )))
    });
    let svc = RulesLayer::new(rules.clone())
        .with_fallback()
        .layer(OnBlocked::new(main, fallback));
    let get = |path: &str| {
        let svc = svc.clone();
        let req = Request::get(path).body(String::new()).unwrap();
        async move { body(svc.oneshot(req).await.unwrap()).await }
    };
    assert_eq!(get("/api").await, (StatusCode::OK, "main".into()));
    assert_eq!(
        get("/api").await,
        (StatusCode::OK, "fallback for api-rate (flow)".into())
    );
    // The route's configured response answers its own blocks.
    assert_eq!(get("/page").await, (StatusCode::OK, "main".into()));
    assert_eq!(get("/page").await, (StatusCode::OK, "static page".into()));
    let snap = rules.snapshot();
    for name in ["api", "page"] {
        let r = snap.resource(name).unwrap();
        assert_eq!((r.blocks, r.fallbacks), (1, 1), "{name}");
    }
}

/// A store where every shared rule refuses (a budget other processes spent).
struct Spent;

impl weir_rules::shared::SharedStore for Spent {
    fn acquire<'a>(
        &'a self,
        _: &'a weir_rules::shared::SharedRule,
        _: &'a str,
        _: u64,
        _: bool,
    ) -> weir_rules::shared::Deciding<'a> {
        Box::pin(std::future::ready((
            weir_core::Decision::never(10, 0, 1_000_000_000),
            None,
        )))
    }

    fn settle(
        &self,
        _: &weir_rules::shared::SharedRule,
        _: &str,
        _: weir_rules::shared::SharedHeld,
        _: u64,
    ) {
    }
}

/// A refusal decided by a `shared: true` rule (after the local rules admitted the call) gets
/// the route's fallback as any other block: its fallback upstream (a cheaper model), or its
/// configured answer — not a bare 429 — and is counted as served by a fallback.
#[tokio::test]
async fn a_shared_rules_refusal_gets_the_routes_fallback() {
    let yaml = "resources:
  - name: chat
    hot_params:
      - {id: tokens, param: 0, threshold: 10, window: 1m, algorithm: gcra, shared: true, cost: {estimate: 5}}
  - name: page
    flow:
      - {id: page-rate, qps: 10, window: 1m, algorithm: gcra, shared: true}
http:
  routes:
    - resource: chat
      prefix: /chat
      params: [{header: x-user}]
      fallback: {on: [hot_param], upstream: 'http://127.0.0.1:9001'}
    - resource: page
      prefix: /page
      fallback: {on: [flow], status: 200, body: cached page}
";
    let rules =
        Arc::new(Rules::new(&RuleSet::from_yaml(Path::new("r.yaml"), yaml).unwrap()).unwrap());
    rules.set_shared(Spent);
    let main = tower::service_fn(|req: Request<String>| async move {
        let answer = match req.extensions().get::<Degraded>() {
            Some(d) => format!(
                "degraded to {} ({})",
                d.upstream.as_deref().unwrap_or("-"),
                d.block.rule
            ),
            None => "main".to_string(),
        };
        Ok::<_, Infallible>(Response::new(answer))
    });
    let svc = RulesLayer::new(rules.clone()).layer(main);
    let call = |path: &str| {
        let svc = svc.clone();
        let req = Request::get(path)
            .header("x-user", "ann")
            .body(String::new())
            .unwrap();
        async move { body(svc.oneshot(req).await.unwrap()).await }
    };
    assert_eq!(
        call("/chat").await,
        (
            StatusCode::OK,
            "degraded to http://127.0.0.1:9001 (tokens)".to_string()
        )
    );
    assert_eq!(
        call("/page").await,
        (StatusCode::OK, "cached page".to_string())
    );
    let snap = rules.snapshot();
    for r in ["chat", "page"] {
        assert_eq!(snap.resource(r).unwrap().fallbacks, 1, "{r}");
    }
}
