//! The rate-limit and concurrency layers on a real axum server, driven over real TCP:
//! exact headers, Retry-After never below the true wait (rounded up), spoofed X-Forwarded-For
//! ignored unless the peer is a trusted proxy, 503 when full, permits released when a client
//! disconnects mid-body.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_core::{
    ConcurrencyConfig, ConcurrencyLimiter, FixedWindow, KeyedLimiter, ManualClock, QueueOrder,
    Quota,
};
use weir_tower::concurrency::ConcurrencyLayer;
use weir_tower::key::ClientIp;
use weir_tower::limit::RateLimitLayer;

mod support;
use support::{get_raw, header, peer, serve, Endless};

#[tokio::test]
async fn rate_limit_answers_429_with_exact_headers_and_rounded_up_retry_after() {
    let clock = Arc::new(ManualClock::new(0));
    let limiter = KeyedLimiter::with_clock(
        FixedWindow::new(Quota::new(2, Duration::from_secs(10)).unwrap()).unwrap(),
        1_000,
        clock.clone(),
    )
    .unwrap();
    let layer = RateLimitLayer::new(limiter, ClientIp::new()).policy("api");
    let app = Router::new()
        .route("/x", get(|| async { "hello" }))
        .layer(layer)
        .layer(axum::middleware::from_fn(peer));
    let port = serve(app).await;
    let (code, head, body) = get_raw(port, &[]).await;
    assert_eq!((code, body.as_str()), (200, "hello"));
    assert_eq!(header(&head, "ratelimit-policy"), Some("\"api\";q=2;w=10"));
    assert_eq!(header(&head, "ratelimit"), Some("\"api\";r=1;t=10"));
    assert_eq!(get_raw(port, &[]).await.0, 200);
    let (code, head, body) = get_raw(port, &[]).await;
    assert_eq!(code, 429);
    assert_eq!(header(&head, "retry-after"), Some("10"));
    assert_eq!(header(&head, "ratelimit"), Some("\"api\";r=0;t=10"));
    assert_eq!(
        header(&head, "content-type"),
        Some("application/problem+json")
    );
    assert!(body.contains("\"status\":429"), "{body}");
    // 9.5 s later the true wait is 0.5 s: Retry-After says 1, never 0.
    clock.advance(Duration::from_millis(9_500));
    let (code, head, _) = get_raw(port, &[]).await;
    assert_eq!(code, 429);
    assert_eq!(header(&head, "retry-after"), Some("1"));
    clock.advance(Duration::from_millis(500));
    assert_eq!(
        get_raw(port, &[]).await.0,
        200,
        "allowed exactly when Retry-After said"
    );
}

#[tokio::test]
async fn spoofed_forwarded_for_is_ignored_unless_the_peer_is_trusted() {
    let make = |ip: ClientIp| {
        let limiter = KeyedLimiter::with_clock(
            FixedWindow::new(Quota::new(1, Duration::from_secs(60)).unwrap()).unwrap(),
            1_000,
            Arc::new(ManualClock::new(0)),
        )
        .unwrap();
        Router::new()
            .route("/x", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(limiter, ip))
            .layer(axum::middleware::from_fn(peer))
    };
    // Nothing trusted: every claimed address is the same client (127.0.0.1).
    let port = serve(make(ClientIp::new())).await;
    assert_eq!(
        get_raw(port, &[("x-forwarded-for", "1.1.1.1")]).await.0,
        200
    );
    assert_eq!(
        get_raw(port, &[("x-forwarded-for", "2.2.2.2")]).await.0,
        429
    );
    // Loopback trusted as a proxy: the forwarded client is the key.
    let port = serve(make(ClientIp::trusting(&["127.0.0.0/8"]).unwrap())).await;
    assert_eq!(
        get_raw(port, &[("x-forwarded-for", "1.1.1.1")]).await.0,
        200
    );
    assert_eq!(
        get_raw(port, &[("x-forwarded-for", "2.2.2.2")]).await.0,
        200
    );
    assert_eq!(
        get_raw(port, &[("x-forwarded-for", "1.1.1.1")]).await.0,
        429
    );
}

#[tokio::test]
async fn concurrency_sheds_with_503_and_a_disconnect_frees_the_slot() {
    let limiter = ConcurrencyLimiter::with_config(ConcurrencyConfig {
        max_in_flight: 1,
        max_queue: 0,
        order: QueueOrder::Fifo,
        shares: None,
    })
    .unwrap();
    let app = Router::new()
        .route("/x", get(|| async { Body::new(Endless(false)) }))
        .layer(ConcurrencyLayer::new(limiter.clone()));
    let port = serve(app).await;
    // A: holds the only slot while its body streams.
    let mut a = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    a.write_all(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = a.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert_eq!(limiter.in_flight(), 1);
    // B: shed at once.
    let (code, head, body) = get_raw(port, &[]).await;
    assert_eq!(code, 503);
    assert_eq!(
        header(&head, "content-type"),
        Some("application/problem+json")
    );
    assert!(body.contains("\"status\":503"), "{body}");
    // A disconnects mid-body: the permit returns.
    drop(a);
    let mut freed = false;
    for _ in 0..200 {
        if limiter.in_flight() == 0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "permit not released after the client disconnected");
}
