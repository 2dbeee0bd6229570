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
