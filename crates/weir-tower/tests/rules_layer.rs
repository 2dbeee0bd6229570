//! The rules layer on a real axum server over real TCP: routes map requests to resources, each
//! rule kind answers with its status and headers, Retry-After is never below the true wait,
//! X-Forwarded-For counts only from trusted proxies, paced calls wait their turn, a client
//! disconnect frees a concurrency slot, 5xx responses feed the breaker, a reload changes the
//! routes and keeps state; and the client-side layers (breaker, SRE throttling, retry) against
//! a failing server.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower::{Service, ServiceBuilder, ServiceExt};
use weir_core::breaker::{Breaker, BreakerConfig};
use weir_core::retry::{Backoff, RetryBudget, RetryPolicy};
use weir_core::throttle::SreThrottle;
use weir_core::ManualClock;
use weir_rules::config::RuleSet;
use weir_rules::engine::Rules;
use weir_tower::client::{BreakerLayer, ClientError, RetryLayer, ThrottleLayer};
use weir_tower::rules::{ClassifyFn, RulesLayer, Target};

mod support;
use support::{header, peer, request, serve, Endless};

const RULES: &str = "
resources:
  - name: orders
    flow:
      - {id: orders-qps, qps: 2, window: 10s, algorithm: fixed_window}
  - name: search
    hot_params:
      - {id: per-ip, param: 0, threshold: 1, window: 1m}
  - name: admin
    authority: {id: ops-only, allow: [ops]}
  - name: flaky
    breaker: {id: flaky-breaker, error_ratio: 0.5, min_calls: 2, open_for: 30s}
  - name: tenant
    hot_params:
      - {id: per-tenant, param: 0, threshold: 1, window: 1m}
  - name: tenant-shared
    hot_params:
      - {id: per-tenant-shared, param: 0, threshold: 1, window: 1m, absent: shared}
  - name: empty
    breaker: {id: empty-breaker, error_ratio: 0.5, min_calls: 2, open_for: 30s}
  - name: stream
    flow:
      - {id: one-stream, concurrency: 1}
  - name: paced
    flow:
      - {id: paced-10, qps: 10, behavior: pace, max_wait: 2s}
http:
  origin_header: x-caller
  trusted_proxies: [TRUSTED]
  routes:
    - {resource: orders, prefix: /orders, methods: [POST]}
    - {resource: search, prefix: /search, params: [client_ip]}
    - {resource: admin, prefix: /admin}
    - {resource: flaky, prefix: /flaky}
    - {resource: empty, prefix: /empty}
    - {resource: tenant, prefix: /tenant, params: [{header: x-tenant}]}
    - {resource: tenant-shared, prefix: /shared, params: [{header: x-tenant}]}
    - {resource: stream, prefix: /stream}
    - {resource: paced, prefix: /paced}
";

fn rule_set(trusted: &str) -> RuleSet {
    RuleSet::from_yaml(Path::new("rules.yaml"), &RULES.replace("TRUSTED", trusted))
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn app(trusted: &str) -> (u16, Arc<Rules<Arc<ManualClock>>>, Arc<ManualClock>) {
    // At 0: the fixed window of 10 s starts now.
    let clock = Arc::new(ManualClock::new(0));
    let rules = Arc::new(Rules::with_clock(&rule_set(trusted), clock.clone()).unwrap());
    let router = Router::new()
        .route(
            "/orders",
            post(|| async { "created" }).get(|| async { "list" }),
        )
        .route("/search", get(|| async { "found" }))
        .route("/admin", get(|| async { "secret" }))
        .route(
            "/flaky",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") }),
        )
        .route(
            "/empty",
            get(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
        )
        .route("/stream", get(|| async { Body::new(Endless(false)) }))
        .route("/paced", get(|| async { "paced" }))
        .route("/tenant", get(|| async { "tenant" }))
        .route("/shared", get(|| async { "shared" }))
        .route("/free", get(|| async { "free" }))
        .layer(RulesLayer::new(rules.clone()))
        .layer(axum::middleware::from_fn(peer));
    (serve(router).await, rules, clock)
}

#[tokio::test]
async fn flow_rules_answer_429_with_policy_headers_and_honest_retry_after() {
    let (port, rules, clock) = app("10.0.0.0/8").await;
    for _ in 0..2 {
        assert_eq!(request(port, "POST", "/orders", &[]).await.0, 200);
    }
    let (code, head, body) = request(port, "POST", "/orders", &[]).await;
    assert_eq!(code, 429, "{head}");
    assert_eq!(header(&head, "retry-after"), Some("10"));
    assert_eq!(
        header(&head, "ratelimit-policy"),
        Some("\"orders-qps\";q=2;w=10")
    );
    assert_eq!(header(&head, "ratelimit"), Some("\"orders-qps\";r=0;t=10"));
    assert_eq!(
        header(&head, "content-type"),
        Some("application/problem+json")
    );
    assert!(
        body.contains("\"status\":429") && body.contains("orders-qps"),
        "{body}"
    );
    // Another method or path is not this route: not limited.
    assert_eq!(request(port, "GET", "/orders", &[]).await.0, 200);
    assert_eq!(request(port, "GET", "/ordersx", &[]).await.0, 404);
    assert_eq!(request(port, "GET", "/free", &[]).await.0, 200);
    // 9.4 s later the true wait is 0.6 s: Retry-After says 1, never 0.
    clock.advance(Duration::from_millis(9_400));
    let (code, head, _) = request(port, "POST", "/orders", &[]).await;
    assert_eq!((code, header(&head, "retry-after")), (429, Some("1")));
    clock.advance(Duration::from_millis(600));
    assert_eq!(request(port, "POST", "/orders", &[]).await.0, 200);
    let snap = rules.snapshot();
    let orders = snap.resource("orders").unwrap();
    assert_eq!((orders.passes, orders.blocks, orders.in_flight), (3, 2, 0));
}

#[tokio::test]
async fn authority_answers_403_by_origin_header() {
    let (port, _, _) = app("10.0.0.0/8").await;
    assert_eq!(
        request(port, "GET", "/admin", &[("x-caller", "ops")])
            .await
            .0,
        200
    );
    let (code, head, body) = request(port, "GET", "/admin", &[("x-caller", "web")]).await;
    assert_eq!((code, header(&head, "retry-after")), (403, None));
    assert!(body.contains("ops-only"), "{body}");
    assert_eq!(request(port, "GET", "/admin", &[]).await.0, 403);
}

#[tokio::test]
async fn forwarded_for_counts_only_from_trusted_proxies() {
    // Loopback untrusted: every claimed address is the peer, one per minute.
    let (port, _, _) = app("10.0.0.0/8").await;
    let xff = |ip| [("x-forwarded-for", ip)];
    assert_eq!(
        request(port, "GET", "/search", &xff("1.1.1.1")).await.0,
        200
    );
    assert_eq!(
        request(port, "GET", "/search", &xff("2.2.2.2")).await.0,
        429
    );
    // Loopback trusted: the forwarded client is the parameter.
    let (port, _, _) = app("127.0.0.0/8").await;
    assert_eq!(
        request(port, "GET", "/search", &xff("1.1.1.1")).await.0,
        200
    );
    assert_eq!(
        request(port, "GET", "/search", &xff("2.2.2.2")).await.0,
        200
    );
    assert_eq!(
        request(port, "GET", "/search", &xff("1.1.1.1")).await.0,
        429
    );
}

#[tokio::test]
async fn server_errors_open_the_breaker_which_answers_503() {
    let (port, rules, _) = app("10.0.0.0/8").await;
    for _ in 0..2 {
        assert_eq!(request(port, "GET", "/flaky", &[]).await.0, 500);
    }
    let (code, head, body) = request(port, "GET", "/flaky", &[]).await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(header(&head, "retry-after"), Some("30"));
    assert!(body.contains("flaky-breaker"), "{body}");
    let flaky = rules.snapshot().resource("flaky").unwrap().clone();
    assert_eq!((flaky.completed, flaky.errors), (2, 2));
}

#[tokio::test]
async fn empty_5xx_bodies_and_head_answers_record_their_outcome() {
    // A 500 with `Content-Length: 0` ends before its body is polled.
    let (port, rules, _) = app("10.0.0.0/8").await;
    for _ in 0..2 {
        assert_eq!(request(port, "GET", "/empty", &[]).await.0, 500);
    }
    assert_eq!(request(port, "GET", "/empty", &[]).await.0, 503);
    let empty = rules.snapshot().resource("empty").unwrap().clone();
    assert_eq!((empty.completed, empty.errors), (2, 2));
    // A HEAD answer is sent without its body ever being polled.
    let (port, rules, _) = app("10.0.0.0/8").await;
    for _ in 0..2 {
        assert_eq!(request(port, "HEAD", "/flaky", &[]).await.0, 500);
    }
    assert_eq!(request(port, "HEAD", "/flaky", &[]).await.0, 503);
    let flaky = rules.snapshot().resource("flaky").unwrap().clone();
    assert_eq!((flaky.completed, flaky.errors), (2, 2));
    let orders = rules.snapshot().resource("orders").unwrap().clone();
    assert_eq!(orders.in_flight, 0);
}

#[tokio::test]
async fn hot_params_skip_calls_without_the_parameter_unless_told_to_share() {
    let (port, _, _) = app("10.0.0.0/8").await;
    let tenant = [("x-tenant", "acme")];
    assert_eq!(request(port, "GET", "/tenant", &tenant).await.0, 200);
    assert_eq!(request(port, "GET", "/tenant", &tenant).await.0, 429);
    // Without the header (or with it empty) the per-tenant rule does not apply: callers
    // without a tenant are not all squeezed into one tenant's quota.
    for _ in 0..3 {
        assert_eq!(request(port, "GET", "/tenant", &[]).await.0, 200);
        assert_eq!(
            request(port, "GET", "/tenant", &[("x-tenant", "")]).await.0,
            200
        );
    }
    // `absent: shared`: they share one counter of the threshold.
    assert_eq!(request(port, "GET", "/shared", &[]).await.0, 200);
    assert_eq!(request(port, "GET", "/shared", &[]).await.0, 429);
    assert_eq!(request(port, "GET", "/shared", &tenant).await.0, 200);
}

#[tokio::test]
async fn every_spelling_of_a_limited_path_is_the_limited_path() {
    let (port, rules, _) = app("10.0.0.0/8").await;
    // Admitted under other spellings (axum's router, which ran before this route layer,
    // answers them 404; `weir proxy` forwards the normalised path), they use the quota.
    request(port, "POST", "//orders", &[]).await;
    request(port, "POST", "/%6frders", &[]).await;
    for p in [
        "/orders",
        "//orders",
        "/./orders",
        "/x/../orders",
        "/%6frders",
        "/%6Frders?q=1",
        "/orders;jsessionid=1",
        "/x/..;y/orders",
    ] {
        let (code, head, _) = request(port, "POST", p, &[]).await;
        assert_eq!(code, 429, "{p}: {head}");
    }
    for p in [
        "/orders%2f",
        "/orders%2Fx",
        "/orders%00",
        "/orders%zz",
        "/a\\orders",
    ] {
        let (code, _, body) = request(port, "POST", p, &[]).await;
        assert_eq!(code, 400, "{p}: {body}");
    }
    assert_eq!(
        rules.snapshot().resource("orders").unwrap().passes,
        2,
        "only the two admitted calls were counted as passes"
    );
}

#[tokio::test]
async fn a_disconnect_mid_body_frees_the_concurrency_slot() {
    let (port, rules, _) = app("10.0.0.0/8").await;
    let mut a = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    a.write_all(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = a.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let (code, _, body) = request(port, "GET", "/stream", &[]).await;
    assert_eq!(code, 429, "{body}");
    drop(a);
    let mut freed = false;
    for _ in 0..500 {
        if rules.snapshot().resource("stream").unwrap().in_flight == 0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "slot not released after the client disconnected");
    assert_eq!(request(port, "GET", "/stream-not-this", &[]).await.0, 404);
}

#[tokio::test]
async fn paced_requests_wait_their_turn() {
    // The rules' clock is manual and does not move: three calls get waits 0, 100, 200 ms,
    // which the layer sleeps for real. Lower bounds only (a sleep never ends early).
    let (port, _, _) = app("10.0.0.0/8").await;
    let start = Instant::now();
    let calls =
        (0..3).map(|_| tokio::spawn(async move { request(port, "GET", "/paced", &[]).await }));
    let mut codes = Vec::new();
    for c in calls {
        codes.push(c.await.unwrap().0);
    }
    assert_eq!(codes, [200, 200, 200]);
    assert!(
        start.elapsed() >= Duration::from_millis(200),
        "the third call did not wait: {:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn reload_changes_routes_and_keeps_counters() {
    let (port, rules, _) = app("10.0.0.0/8").await;
    assert_eq!(request(port, "POST", "/orders", &[]).await.0, 200);
    // Route /free to orders too; orders-qps keeps its one used unit (2 per 10 s).
    let mut set = rule_set("10.0.0.0/8");
    let http = set.http.as_mut().unwrap();
    http.routes[0].methods.clear();
    http.routes.push(weir_rules::config::Route {
        resource: "orders".into(),
        prefix: "/free".into(),
        methods: vec![],
        headers: Default::default(),
        params: vec![],
        fallback: None,
    });
    rules.apply(&set).unwrap();
    assert_eq!(request(port, "GET", "/free", &[]).await.0, 200);
    assert_eq!(request(port, "GET", "/orders", &[]).await.0, 429);
}

/// One service instance (not a clone per request, as axum makes) keeps its route table between
/// calls: a reload must still reach it at the next call.
#[tokio::test]
async fn one_service_instance_follows_a_reload_at_its_next_call() {
    let yaml = |prefix: &str| {
        format!(
            "resources:\n  - name: api\n    flow:\n      - {{id: api-qps, qps: 1, window: 1h}}\nhttp:\n  routes:\n    - {{resource: api, prefix: {prefix}}}\n"
        )
    };
    let set = |prefix: &str| RuleSet::from_yaml(Path::new("r.yaml"), &yaml(prefix)).unwrap();
    let rules = Arc::new(Rules::new(&set("/a")).unwrap());
    let handler = tower::service_fn(|_: http::Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    });
    let mut svc = tower::Layer::layer(&RulesLayer::new(rules.clone()), handler);
    let mut status = async |path: &str| {
        let req = http::Request::get(path).body(Body::empty()).unwrap();
        svc.ready().await.unwrap().call(req).await.unwrap().status()
    };
    assert_eq!(status("/a").await, StatusCode::OK);
    assert_eq!(status("/a").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status("/b").await, StatusCode::OK, "not routed yet");
    rules.apply(&set("/b")).unwrap();
    assert_eq!(status("/a").await, StatusCode::OK, "no longer routed");
    assert_eq!(
        status("/b").await,
        StatusCode::TOO_MANY_REQUESTS,
        "routed to api, whose counter was kept"
    );
}

#[tokio::test]
async fn a_closure_can_classify() {
    let rules = Arc::new(Rules::new(&rule_set("10.0.0.0/8")).unwrap());
    let layer = RulesLayer::with_classifier(
        rules,
        ClassifyFn::new(|p: weir_tower::rules::Head<'_>| {
            p.uri.path().starts_with("/admin").then(|| Target {
                resource: "admin",
                origin: p.uri.query().unwrap_or(""),
                criticality: weir_core::Criticality::Critical,
                params: vec![],
            })
        }),
    );
    let router = Router::new()
        .route("/admin", get(|| async { "secret" }))
        .layer(layer);
    let port = serve(router).await;
    assert_eq!(request(port, "GET", "/admin?ops", &[]).await.0, 200);
    assert_eq!(request(port, "GET", "/admin?web", &[]).await.0, 403);
}

/// A server answering 503 with Retry-After: 1 to the first `fail` requests, then 200.
async fn failing_server(fail: u32) -> (u16, Arc<AtomicU32>) {
    let hits = Arc::new(AtomicU32::new(0));
    let h = hits.clone();
    let router = Router::new().route(
        "/",
        get(move || {
            let n = h.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < fail {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [("retry-after", "1")],
                        "down",
                    )
                        .into_response()
                } else {
                    (StatusCode::OK, "up").into_response()
                }
            }
        }),
    );
    (serve(router).await, hits)
}

fn get_req(port: u16) -> http::Request<Full<bytes::Bytes>> {
    http::Request::get(format!("http://127.0.0.1:{port}/"))
        .body(Full::default())
        .unwrap()
}

/// `n` requests through `svc`, one at a time: each one's status or the layer's refusal.
async fn outcomes<S, E>(mut svc: S, port: u16, n: usize) -> Vec<Result<StatusCode, ClientError<E>>>
where
    S: Service<
        http::Request<Full<bytes::Bytes>>,
        Response = http::Response<hyper::body::Incoming>,
        Error = ClientError<E>,
    >,
{
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let r = match svc.ready().await {
            Ok(s) => s.call(get_req(port)).await,
            Err(e) => Err(e),
        };
        out.push(r.map(|r| r.status()));
    }
    out
}

#[tokio::test]
async fn client_breaker_stops_sending_to_a_failing_server() {
    let (port, hits) = failing_server(u32::MAX).await;
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let breaker = Arc::new(
        Breaker::new(BreakerConfig {
            min_calls: 4,
            error_ratio: Some(0.5),
            ..BreakerConfig::resilience4j()
        })
        .unwrap(),
    );
    let svc = ServiceBuilder::new()
        .layer(BreakerLayer::new(breaker))
        .service(http);
    let out = outcomes(svc, port, 20).await;
    assert!(out.iter().all(|r| matches!(
        r,
        Ok(StatusCode::SERVICE_UNAVAILABLE) | Err(ClientError::BreakerOpen { .. })
    )));
    let open = out.iter().filter(|r| r.is_err()).count();
    assert_eq!(
        hits.load(Ordering::SeqCst),
        4,
        "sent only until the breaker tripped"
    );
    assert_eq!(open, 16);
}

#[tokio::test]
async fn client_throttle_rejects_locally_when_the_server_rejects() {
    let (port, hits) = failing_server(u32::MAX).await;
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let clock = Arc::new(ManualClock::new(0));
    let throttle = Arc::new(SreThrottle::with(2.0, Duration::from_secs(120), 120, 7).unwrap());
    let svc = ServiceBuilder::new()
        .layer(ThrottleLayer::with_clock(throttle.clone(), clock))
        .service(http);
    let out = outcomes(svc, port, 200).await;
    assert!(out.iter().all(|r| matches!(
        r,
        Ok(StatusCode::SERVICE_UNAVAILABLE) | Err(ClientError::Throttled)
    )));
    let local = out.iter().filter(|r| r.is_err()).count();
    // With no accepts the rejection probability climbs to n / (n + 1): almost all local.
    assert!(local >= 150, "only {local} rejected locally");
    assert_eq!(hits.load(Ordering::SeqCst) as usize + local, 200);
}

#[tokio::test]
async fn client_retry_honours_retry_after_and_the_budget() {
    let (port, hits) = failing_server(2).await;
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let policy = RetryPolicy {
        max_attempts: 4,
        backoff: Backoff {
            initial: Duration::from_millis(10),
            ..Backoff::default()
        },
    };
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(policy, None))
        .service(http.clone());
    let start = Instant::now();
    let r = svc.oneshot(get_req(port)).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.into_body().collect().await.unwrap().to_bytes(), "up");
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    // Two retries, each waiting the server's Retry-After (1 s) rather than 10 ms.
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    // A budget with no allowance: no retries at all.
    let (port, hits) = failing_server(u32::MAX).await;
    let budget = Arc::new(RetryBudget::new(0.0, 0.0).unwrap());
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(policy, Some(budget)))
        .service(http);
    let r = svc.oneshot(get_req(port)).await.unwrap();
    assert_eq!(
        (r.status(), hits.load(Ordering::SeqCst)),
        (StatusCode::SERVICE_UNAVAILABLE, 1)
    );
}

#[tokio::test]
async fn grpc_calls_get_grpc_statuses_with_retry_pushback() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let set = RuleSet::from_yaml(
        Path::new("rules.yaml"),
        "resources:\n  - name: health\n    flow:\n      - {id: health-qps, qps: 1, window: 10s, algorithm: fixed_window}\nhttp:\n  routes:\n    - {resource: health, prefix: /grpc.health.v1.Health}\n",
    )
    .unwrap();
    let clock = Arc::new(ManualClock::new(0));
    let rules = Arc::new(Rules::with_clock(&set, clock).unwrap());
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(RulesLayer::new(rules))
            .add_service(health)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(l)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let check = || HealthCheckRequest {
        service: String::new(),
    };
    assert!(client.check(check()).await.is_ok());
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(status.message().contains("health-qps"), "{status:?}");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "10000"
    );
}

#[tokio::test]
async fn criticality_propagates_from_the_served_request_to_outgoing_calls() {
    use weir_tower::criticality::{CriticalityLayer, PropagateLayer};
    // Downstream: echoes the criticality header it received.
    let downstream = serve(Router::new().route(
        "/",
        get(|h: http::HeaderMap| async move {
            h.get("x-weir-criticality")
                .map_or("-".to_string(), |v| v.to_str().unwrap_or("?").to_string())
        }),
    ))
    .await;
    // Frontend: calls downstream through a propagating client.
    let client = ServiceBuilder::new()
        .layer(PropagateLayer)
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>());
    let frontend = Router::new()
        .route(
            "/",
            get(move || {
                let client = client.clone();
                async move {
                    let r = client.oneshot(get_req(downstream)).await.unwrap();
                    let body = r.into_body().collect().await.unwrap().to_bytes();
                    String::from_utf8_lossy(&body).into_owned()
                }
            }),
        )
        .layer(CriticalityLayer);
    let port = serve(frontend).await;
    let (code, _, body) = request(port, "GET", "/", &[("x-weir-criticality", "SHEDDABLE")]).await;
    assert_eq!((code, body.as_str()), (200, "SHEDDABLE"));
    let (_, _, body) = request(port, "GET", "/", &[]).await;
    assert_eq!(
        body, "CRITICAL",
        "an unmarked request is CRITICAL and says so downstream"
    );
    // Outside a served request nothing is added.
    let r = ServiceBuilder::new()
        .layer(PropagateLayer)
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>())
        .oneshot(get_req(downstream))
        .await
        .unwrap();
    assert_eq!(r.into_body().collect().await.unwrap().to_bytes(), "-");
}

#[tokio::test]
async fn system_overload_answers_503_and_frees_the_slot_on_disconnect() {
    let set = RuleSet::from_yaml(
        Path::new("rules.yaml"),
        "resources:\n  - name: all\nsystem: {max_in_flight: 1}\nhttp:\n  routes:\n    - {resource: all, prefix: /}\n",
    )
    .unwrap();
    let rules = Arc::new(Rules::new(&set).unwrap());
    let router = Router::new()
        .route("/stream", get(|| async { Body::new(Endless(false)) }))
        .layer(RulesLayer::new(rules.clone()));
    let port = serve(router).await;
    let mut a = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    a.write_all(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = a.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let (code, head, body) = request(port, "GET", "/stream", &[]).await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(header(&head, "retry-after"), Some("1"));
    assert!(body.contains("system:max_in_flight"), "{body}");
    drop(a);
    let mut freed = false;
    for _ in 0..500 {
        if rules.stats("system:max_in_flight").is_some()
            && rules.snapshot().resource("all").unwrap().in_flight == 0
        {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "in-flight slot not released after the disconnect");
    // Admitted again (404: past the rules, no such route in the app).
    assert_eq!(request(port, "GET", "/other", &[]).await.0, 404);
}
