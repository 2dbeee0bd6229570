//! Rules with `cost:` behind the rules layer, in process on a manual clock: the estimate read
//! from a request header or a JSON body field, the actual cost from a response header, a
//! trailer, a JSON body or the last Server-Sent Event (read as the body passes), the budget
//! in the `RateLimit` headers, a failed stream given back, a bad cost counted as the estimate,
//! and a client leaving early charged the cost read so far or the rule's `max`.

use std::collections::VecDeque;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use weir_core::ManualClock;
use weir_rules::config::RuleSet;
use weir_rules::engine::Rules;
use weir_tower::cost::ReadJsonLayer;
use weir_tower::prefix::ReadBudget;
use weir_tower::rules::RulesLayer;

/// Per user, 1 000 units a minute (fixed window: what is left is exact).
const RULES: &str = "
resources:
  - name: sse
    hot_params:
      - {id: sse-user, param: 0, threshold: 1000, window: 1m, algorithm: fixed_window,
         cost: {estimate: 100, max: 900, estimate_from: {header: x-max-tokens}, actual_from: {sse: usage.total_tokens}}}
  - name: trailer
    hot_params:
      - {id: trailer-user, param: 0, threshold: 1000, window: 1m, algorithm: fixed_window,
         cost: {estimate: 100, actual_from: {trailer: x-tokens}}}
  - name: json
    hot_params:
      - {id: json-user, param: 0, threshold: 1000, window: 1m, algorithm: fixed_window,
         cost: {estimate: 100, estimate_from: {json: max_tokens}, actual_from: {json: usage.total_tokens}}}
  - name: header
    hot_params:
      - {id: header-user, param: 0, threshold: 1000, window: 1m, algorithm: fixed_window,
         cost: {estimate: 100, max: 900, estimate_from: {header: x-max-tokens}, actual_from: {header: x-tokens}}}
http:
  routes:
    - {resource: sse, prefix: /sse, params: [{header: x-user}]}
    - {resource: trailer, prefix: /trailer, params: [{header: x-user}]}
    - {resource: json, prefix: /json, params: [{header: x-user}]}
    - {resource: header, prefix: /header, params: [{header: x-user}]}
";

/// A body of given frames (an error where `None`).
struct Frames(VecDeque<Option<Frame<Bytes>>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(
            self.0
                .pop_front()
                .map(|f| f.ok_or_else(|| std::io::Error::other("cut"))),
        )
    }
}

fn data(s: &str) -> Option<Frame<Bytes>> {
    Some(Frame::data(Bytes::from(s.to_string())))
}

/// The upstream: `?n=N` is what the call costs; `?fail` cuts the stream midway.
async fn upstream(
    req: Request<weir_tower::cost::ReplayBody<Full<Bytes>>>,
) -> Result<Response<Frames>, std::convert::Infallible> {
    let q = req.uri().query().unwrap_or("").to_string();
    let q = q.as_str();
    let n: u64 = q
        .split('&')
        .find_map(|kv| kv.strip_prefix("n="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let fail = q.contains("fail");
    // The request body reaches the upstream whole.
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut frames = VecDeque::new();
    let mut r = Response::builder();
    match () {
        _ if q.contains("sse") || fail => {
            frames.push_back(data("data: {\"choices\":[{\"delta\":\"a\"}]}\n\n"));
            if fail {
                frames.push_back(None);
            } else {
                frames.push_back(data(&format!(
                    "data: {{\"usage\":{{\"total_tokens\":{n}}}}}\n\ndata: [DONE]\n\n"
                )));
            }
        }
        _ if q.contains("trailer") => {
            frames.push_back(data("partial"));
            let mut t = HeaderMap::new();
            t.insert("x-tokens", HeaderValue::from_str(&n.to_string()).unwrap());
            frames.push_back(Some(Frame::trailers(t)));
        }
        _ if q.contains("json") => {
            frames.push_back(data(&format!(
                "{{\"echo\": {}, \"usage\": {{\"total_tokens\"",
                body.len()
            )));
            frames.push_back(data(&format!(": {n}}}}}")));
        }
        _ => {
            r = r.header(
                "x-tokens",
                q.split('&')
                    .find_map(|kv| kv.strip_prefix("h="))
                    .unwrap_or("0"),
            );
            frames.push_back(data("ok"));
        }
    }
    Ok(r.body(Frames(frames)).unwrap())
}

fn rules() -> (Arc<Rules<Arc<ManualClock>>>, Arc<ManualClock>) {
    let set = RuleSet::from_yaml(Path::new("rules.yaml"), RULES).unwrap_or_else(|e| panic!("{e}"));
    let clock = Arc::new(ManualClock::new(0));
    let rules = Arc::new(Rules::with_clock(&set, clock.clone()).unwrap());
    (rules, clock)
}

/// Calls `path` as `user` with `headers` and `body`; (status, RateLimit header, body).
async fn call(
    rules: &Arc<Rules<Arc<ManualClock>>>,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, String, Result<Bytes, String>) {
    call_within(rules, path, headers, body, None).await
}

/// [`call`] with the JSON reader's bytes counted against `budget`.
async fn call_within(
    rules: &Arc<Rules<Arc<ManualClock>>>,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
    budget: Option<Arc<Budget>>,
) -> (StatusCode, String, Result<Bytes, String>) {
    let layer = RulesLayer::new(rules.clone());
    let routes = layer.clone();
    let mut read = ReadJsonLayer::new(
        move |parts| routes.reads_request_json(parts),
        Duration::from_secs(5),
    );
    if let Some(b) = budget {
        read = read.with_budget(b);
    }
    let svc = ServiceBuilder::new()
        .layer(read)
        .layer(layer)
        .service(service_fn(upstream));
    let mut req = Request::post(path).header("x-user", "ann");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = svc
        .oneshot(req.body(Full::new(Bytes::from(body.to_string()))).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let limit = resp
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| e.to_string());
    (status, limit, body)
}

/// A byte budget that counts what it lent at most.
#[derive(Default)]
struct Budget {
    cap: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
}

impl ReadBudget for Budget {
    fn take(&self, n: usize) -> bool {
        let ok = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u + n <= self.cap).then_some(u + n)
            })
            .is_ok();
        self.peak
            .fetch_max(self.used.load(Ordering::Acquire), Ordering::AcqRel);
        ok
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Only requests routed to a resource taking its estimate from the body have it read, and the
/// bytes read count against the budget: past it, the body passes unread (the rule's estimate
/// holds) and everything lent comes back.
#[tokio::test]
async fn bodies_are_read_only_for_their_routes_and_within_the_budget() {
    let (rules, _clock) = rules();
    let body = "{\"model\": \"m\", \"max_tokens\": 250, \"messages\": []}";
    let json = [("content-type", "application/json")];
    let budget = Arc::new(Budget {
        cap: 1 << 20,
        ..Budget::default()
    });
    // No route, or a route whose rules read no JSON: not read.
    for path in ["/anything", "/sse?sse&n=1"] {
        let _ = call_within(&rules, path, &json, body, Some(budget.clone())).await;
        assert_eq!(budget.peak.load(Ordering::Acquire), 0, "{path} was read");
    }
    // The JSON route: read (250 held), and given back once handed on.
    let (_, limit, _) = call_within(
        &rules,
        "/json?json&n=250",
        &json,
        body,
        Some(budget.clone()),
    )
    .await;
    assert_eq!(limit, "\"json-user\";r=750;t=60");
    // (A frame's room is reserved before each read, then what did not come given back.)
    let peak = budget.peak.load(Ordering::Acquire);
    assert!(
        peak >= body.len() && peak <= weir_tower::prefix::FRAME + body.len(),
        "{peak}"
    );
    assert_eq!(budget.used.load(Ordering::Acquire), 0);
    // A budget too small: passed on unread, the rule's estimate (100) held.
    let small = Arc::new(Budget {
        cap: 10,
        ..Budget::default()
    });
    let (status, limit, reply) =
        call_within(&rules, "/json?json&n=100", &json, body, Some(small.clone())).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(limit, "\"json-user\";r=650;t=60");
    assert!(String::from_utf8(reply.unwrap().to_vec())
        .unwrap()
        .starts_with(&format!("{{\"echo\": {}", body.len())));
    assert_eq!(small.used.load(Ordering::Acquire), 0);
}

fn cost(rules: &Rules<Arc<ManualClock>>, resource: &str) -> (u64, u64, u64) {
    let snap = rules.snapshot();
    let c = &snap.resource(resource).unwrap().cost;
    (c.admitted, c.refunded, c.owed)
}

#[tokio::test]
async fn sse_usage_settles_and_the_budget_is_told() {
    let (rules, _clock) = rules();
    // 300 held at once: 700 left, said in RateLimit; the stream's usage says 120.
    let (status, limit, body) =
        call(&rules, "/sse?sse&n=120", &[("x-max-tokens", "300")], "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(limit, "\"sse-user\";r=700;t=60");
    assert!(body.unwrap().ends_with(b"[DONE]\n\n"));
    assert_eq!(cost(&rules, "sse"), (300, 180, 0));
    // 880 left: 900 (the max) does not fit; 880 does.
    let (status, _, _) = call(&rules, "/sse?sse&n=1", &[("x-max-tokens", "5000")], "").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let (status, limit, _) = call(&rules, "/sse?sse&n=880", &[("x-max-tokens", "880")], "").await;
    assert_eq!(
        (status, limit.as_str()),
        (StatusCode::OK, "\"sse-user\";r=0;t=60")
    );
}

#[tokio::test]
async fn a_failed_stream_gives_its_estimate_back() {
    let (rules, _clock) = rules();
    let (status, _, body) = call(&rules, "/sse?fail", &[("x-max-tokens", "400")], "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.is_err(), "the stream was cut");
    assert_eq!(cost(&rules, "sse"), (400, 400, 0));
    // All 1 000 are there again.
    let (_, limit, _) = call(&rules, "/sse?sse&n=0", &[("x-max-tokens", "900")], "").await;
    assert_eq!(limit, "\"sse-user\";r=100;t=60");
}

#[tokio::test]
async fn bad_costs_count_as_the_estimate_or_the_max() {
    let (rules, _clock) = rules();
    // Not a number, negative: the rule's estimate (100) is held; the response's bad actual
    // keeps it. Above the max: the max.
    for (estimate, actual) in [("ten", "lots"), ("-5", "-7"), ("1e400", "NaN")] {
        let (status, _, _) = call(
            &rules,
            &format!("/header?h={actual}"),
            &[("x-max-tokens", estimate)],
            "",
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(cost(&rules, "header"), (300, 0, 0));
    // 700 left: an estimate above the max counts as the max (900), which does not fit.
    let (status, _, _) = call(&rules, "/header?h=1", &[("x-max-tokens", "99999")], "").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let (status, limit, _) = call(&rules, "/header?h=99999", &[("x-max-tokens", "600")], "").await;
    // 600 held (100 left), then settled at the max (900): 300 owed, nothing left.
    assert_eq!(
        (status, limit.as_str()),
        (StatusCode::OK, "\"header-user\";r=100;t=60")
    );
    assert_eq!(cost(&rules, "header"), (900, 0, 300));
}

#[tokio::test]
async fn trailers_and_json_bodies_state_costs() {
    let (rules, _clock) = rules();
    let (status, _, _) = call(&rules, "/trailer?trailer&n=40", &[], "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cost(&rules, "trailer"), (100, 60, 0));
    // The estimate from the JSON request body, which still reaches the upstream whole.
    let body = "{\"model\": \"m\", \"max_tokens\": 250, \"messages\": []}";
    let (status, limit, reply) = call(
        &rules,
        "/json?json&n=75",
        &[("content-type", "application/json")],
        body,
    )
    .await;
    assert_eq!(
        (status, limit.as_str()),
        (StatusCode::OK, "\"json-user\";r=750;t=60")
    );
    let reply = String::from_utf8(reply.unwrap().to_vec()).unwrap();
    assert!(
        reply.starts_with(&format!("{{\"echo\": {}", body.len())),
        "{reply}"
    );
    assert_eq!(cost(&rules, "json"), (250, 175, 0));
    // Not JSON by its content type: the rule's estimate.
    let _ = call(
        &rules,
        "/json?json&n=100",
        &[("content-type", "text/plain")],
        body,
    )
    .await;
    assert_eq!(cost(&rules, "json"), (350, 175, 0));
}

/// `n` frames of the answer to an SSE call holding 200, then the client goes away.
async fn leave_after(rules: &Arc<Rules<Arc<ManualClock>>>, frames: usize) {
    let svc = RulesLayer::new(rules.clone()).layer(service_fn(upstream));
    let req = Request::get("/sse?sse&n=5")
        .header("x-user", "ann")
        .header("x-max-tokens", "200")
        .body(weir_tower::cost::ReplayBody::whole(Full::new(Bytes::new())))
        .unwrap();
    let resp = svc.oneshot(req).await.unwrap();
    let mut body = resp.into_body();
    for _ in 0..frames {
        let _ = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
    }
    drop(body);
}

/// A client that leaves mid-stream pays what the stream had said it cost, or — before the
/// cost was known — what bounds one call (the rule's `max`), never only its own estimate.
#[tokio::test]
async fn a_client_leaving_early_pays_the_cost_read_or_the_max() {
    let (early, _clock) = rules();
    // One frame read (no usage yet): charged the max, 900 (700 owed).
    leave_after(&early, 1).await;
    assert_eq!(cost(&early, "sse"), (200, 0, 700));
    // The usage event read (5 tokens), the stream not ended: charged 5.
    let (late, _clock) = rules();
    leave_after(&late, 2).await;
    assert_eq!(cost(&late, "sse"), (200, 195, 0));
}

/// A client that leaves before the response's head (the upstream still working) pays the max.
#[tokio::test]
async fn a_client_leaving_before_the_answer_pays_the_max() {
    let (rules, _clock) = rules();
    let never = service_fn(|_req: Request<weir_tower::cost::ReplayBody<Full<Bytes>>>| {
        std::future::pending::<Result<Response<Frames>, std::convert::Infallible>>()
    });
    let svc = RulesLayer::new(rules.clone()).layer(never);
    let req = Request::get("/sse")
        .header("x-user", "ann")
        .header("x-max-tokens", "0")
        .body(weir_tower::cost::ReplayBody::whole(Full::new(Bytes::new())))
        .unwrap();
    let call = svc.oneshot(req);
    assert!(
        tokio::time::timeout(Duration::from_millis(20), call)
            .await
            .is_err(),
        "never answers"
    );
    // Stated 0: held the floor (the rule's estimate, 100), then charged the max.
    assert_eq!(cost(&rules, "sse"), (100, 0, 800));
}

/// An estimate above what the burst can ever hold is refused saying so — what is left is not
/// 0, and no wait helps: lower `max_tokens`.
#[tokio::test]
async fn an_estimate_the_burst_can_never_hold_is_refused_saying_so() {
    let yaml = "resources:
  - name: chat
    hot_params:
      - {id: tokens-per-user, param: 0, threshold: 10000, window: 1m, algorithm: gcra, burst: 2000,
         cost: {estimate: 500, max: 4000, estimate_from: {header: x-max-tokens}}}
http:
  routes:
    - {resource: chat, prefix: /chat, params: [{header: x-user}]}
";
    let set = RuleSet::from_yaml(Path::new("rules.yaml"), yaml).unwrap();
    let rules = Arc::new(Rules::with_clock(&set, Arc::new(ManualClock::new(0))).unwrap());
    let svc = RulesLayer::new(rules).layer(service_fn(upstream));
    let req = Request::get("/chat?sse&n=5")
        .header("x-user", "ann")
        .header("x-max-tokens", "2500")
        .body(weir_tower::cost::ReplayBody::whole(Full::new(Bytes::new())))
        .unwrap();
    let resp = svc.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let limit = resp.headers()["ratelimit"].to_str().unwrap().to_string();
    assert!(resp.headers().get("retry-after").is_none());
    let body = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert_eq!(limit, "\"tokens-per-user\";r=2000;t=0");
    assert!(
        body.contains("asks for more than the rule can ever hold")
            && body.contains("lower its estimate"),
        "{body}"
    );
}
