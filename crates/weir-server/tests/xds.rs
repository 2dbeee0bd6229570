//! `weir serve`'s rate-limit service configured over xDS, in-process, against the ADS server
//! of `tests/ads`, which follows the state-of-the-world protocol and checks the client's side
//! of it (its points 1–4).
//!
//! Pushed limits apply within 1 s with the counters kept, a bad push is NACKed while the
//! previous configuration keeps serving, and decisions go on while the server is away.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use prost::Message;
use tokio::sync::watch;
use weir_server::rls::config::Unit;
use weir_server::rls::{MemoryStore, Request, RequestDescriptor};
use weir_server::serve::Server;
use weir_server::xds::proto::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, TYPE_URL};
use weir_server::xds::{Settings, XdsClient};

mod ads;
use ads::{next, serve, serve_tls, Ads, Certs};

/// One resource, encoded: `per_minute` calls per `unit` for each `remote_address`.
fn config(name: &str, per_minute: u32, unit: i32) -> Vec<u8> {
    RateLimitConfig {
        name: name.into(),
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "remote_address".into(),
            rate_limit: Some(RateLimitPolicy {
                unit,
                requests_per_unit: per_minute,
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
    }
    .encode_to_vec()
}

/// Whether the next call for 10.0.0.1 is OVER_LIMIT.
async fn over(server: &Server) -> bool {
    let request = Request {
        domain: "edge".into(),
        descriptors: vec![RequestDescriptor {
            entries: vec![("remote_address".into(), "10.0.0.1".into())],
            ..RequestDescriptor::default()
        }],
        hits_addend: 1,
    };
    server.service().decide(&request).await.unwrap().over_limit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_limits_apply_with_counters_kept_and_bad_pushes_are_nacked() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    const MINUTE: i32 = 2;
    let (push, snapshot) = watch::channel(("v1".to_string(), vec![config("edge", 2, MINUTE)]));
    let (ads, mut seen) = Ads::new(snapshot);
    let addr: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let stop = serve(ads.clone(), addr);

    let server = Server::builder()
        .store(MemoryStore::default())
        .pushed()
        .build()
        .unwrap();
    assert!(
        !over(&server).await,
        "no configuration yet: every request is OK"
    );
    let mut settings = Settings::new(&addr.to_string(), "weir-test-node").unwrap();
    settings.backoff_initial = Duration::from_millis(100);
    let client = XdsClient::spawn(server.service().clone(), settings);

    // Point 1.
    let first = next(&mut seen).await;
    assert_eq!(first.node, "weir-test-node");
    assert_eq!(first.type_url, TYPE_URL);
    assert_eq!((first.version.as_str(), first.nonce.as_str()), ("", ""));
    // Point 3: the ACK of v1.
    let ack = next(&mut seen).await;
    assert_eq!((ack.version.as_str(), ack.error.as_deref()), ("v1", None));
    assert_eq!(server.service().domains(), ["edge"]);
    // Two a minute: the third is over (and counted, as Lyft counts it).
    assert_eq!(
        [
            over(&server).await,
            over(&server).await,
            over(&server).await
        ],
        [false, false, true]
    );

    // Four a minute, pushed: in force within 1 s, the three hits kept — one more passes.
    let pushed = Instant::now();
    push.send(("v2".into(), vec![config("edge", 4, MINUTE)]))
        .unwrap();
    let ack = next(&mut seen).await;
    assert!(
        pushed.elapsed() < Duration::from_secs(1),
        "{:?}",
        pushed.elapsed()
    );
    assert_eq!((ack.version.as_str(), ack.error.as_deref()), ("v2", None));
    assert_eq!([over(&server).await, over(&server).await], [false, true]);

    // A unit that is none: NACKed with the resource and field named, v2 kept.
    push.send(("v3".into(), vec![config("broken", 100, 0)]))
        .unwrap();
    let nack = next(&mut seen).await;
    assert_eq!(nack.version, "v2", "a NACK names the version in force");
    let error = nack.error.expect("an error_detail");
    assert!(
        error.starts_with("xds:broken: descriptors[0].rate_limit"),
        "{error}"
    );
    assert!(over(&server).await, "v2's limit and counters still decide");
    assert_eq!(client.rejected(), 1);

    // The server goes away: decisions go on; it comes back on the same port with v4.
    drop(stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(over(&server).await);
    let (push4, snapshot4) = watch::channel(("v4".to_string(), vec![config("edge", 1000, MINUTE)]));
    let (again, mut seen) = Ads::new(snapshot4);
    let _stop = serve(again, addr);
    // Point 4, and point 1 on the new stream: the version last accepted.
    let first = next(&mut seen).await;
    assert_eq!((first.version.as_str(), first.nonce.as_str()), ("v2", ""));
    let ack = next(&mut seen).await;
    assert_eq!((ack.version.as_str(), ack.error.as_deref()), ("v4", None));
    assert!(
        !over(&server).await,
        "v4's limit, the counters kept (6 of 1000)"
    );
    assert!(client.applied() >= 3);
    drop(push4);
    drop(push);

    let text = server.metrics().render();
    for line in [
        r#"weir_xds_updates_total{result="rejected"} 1"#,
        "weir_xds_connected 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
}

/// Mutual TLS both ways, as Envoy Gateway runs it: the xDS stream with a client certificate,
/// and `ShouldRateLimit` over TLS with one; a client without a certificate gets no answer, and
/// a renewed server certificate is served from the next connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_over_mutual_tls() {
    use weir_server::net::tls::{ServerTls, TlsFiles};
    let dir = std::env::temp_dir().join(format!("weir-server-xds-tls-{}", std::process::id()));
    let certs = Certs::new(&dir);
    let (push, snapshot) = watch::channel(("v1".to_string(), vec![config("edge", 2, 2)]));
    let (ads, mut seen) = Ads::new(snapshot);
    let addr: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let _ads = serve_tls(ads, addr, certs.server_mtls());

    let mut server = Server::builder()
        .store(MemoryStore::default())
        .pushed()
        .build()
        .unwrap();
    let tls = ServerTls::load(TlsFiles {
        cert: certs.server_cert.clone(),
        key: certs.server_key.clone(),
        client_ca: Some(certs.ca.clone()),
    })
    .unwrap();
    tls.watch(Duration::from_millis(50));
    server.grpc_tls(tls);
    let settings = Settings::new(&format!("localhost:{}", addr.port()), "tls-node")
        .unwrap()
        .with_tls(weir_server::xds::ClientTls {
            ca: certs.ca.clone(),
            identity: Some((certs.client_cert.clone(), certs.client_key.clone())),
            server_name: None,
        });
    settings.check().unwrap();
    let _client = XdsClient::spawn(server.service().clone(), settings);
    let first = next(&mut seen).await;
    assert_eq!(first.node, "tls-node");
    let ack = next(&mut seen).await;
    assert_eq!((ack.version.as_str(), ack.error.as_deref()), ("v1", None));
    // The client's certificate file renewed (its contents changed): the stream starts again
    // with it, asking with the version in force.
    let mut pem = std::fs::read_to_string(&certs.client_cert).unwrap();
    pem.push('\n');
    std::fs::write(&certs.client_cert, pem).unwrap();
    let again = next(&mut seen).await;
    assert_eq!((again.version.as_str(), again.nonce.as_str()), ("v1", ""));
    assert_eq!(next(&mut seen).await.version, "v1");
    drop(push);

    // ShouldRateLimit over mutual TLS, through tonic's own client.
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc.local_addr().unwrap();
    let server = std::sync::Arc::new(server);
    {
        let server = server.clone();
        tokio::spawn(async move { server.serve_grpc(grpc, std::future::pending()).await });
    }
    let read = |p: &std::path::Path| std::fs::read(p).unwrap();
    let client_tls = |identity: bool| {
        let mut c = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(read(&certs.ca)))
            .domain_name("localhost");
        if identity {
            c = c.identity(tonic::transport::Identity::from_pem(
                read(&certs.client_cert),
                read(&certs.client_key),
            ));
        }
        c
    };
    let call = |identity: bool| {
        let tls = client_tls(identity);
        async move {
            use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
                rate_limit_descriptor::Entry, RateLimitDescriptor,
            };
            use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
            use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
            let channel = tonic::transport::Endpoint::from_shared(format!(
                "https://localhost:{}",
                grpc_addr.port()
            ))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .map_err(|e| e.to_string())?;
            let answer = RateLimitServiceClient::new(channel)
                .should_rate_limit(RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "remote_address".into(),
                            value: "10.9.9.9".into(),
                        }],
                        ..Default::default()
                    }],
                    hits_addend: 1,
                })
                .await
                .map_err(|e| e.to_string())?;
            Ok::<i32, String>(answer.into_inner().overall_code)
        }
    };
    assert_eq!(call(true).await, Ok(1), "OK over mutual TLS");
    assert!(call(false).await.is_err(), "no client certificate: refused");

    // A renewed certificate (a new key) is served from the next connection.
    let renewed = Certs::new(&dir.join("renewed"));
    std::fs::copy(&renewed.ca, &certs.ca).unwrap();
    std::fs::copy(&renewed.server_cert, &certs.server_cert).unwrap();
    std::fs::copy(&renewed.server_key, &certs.server_key).unwrap();
    std::fs::copy(&renewed.client_cert, &certs.client_cert).unwrap();
    std::fs::copy(&renewed.client_key, &certs.client_key).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = server.metrics().render();
        if text.contains(r#"weir_tls_reloads_total{result="applied"} "#)
            && !text.contains(r#"weir_tls_reloads_total{result="applied"} 0"#)
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no reload:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        call(true).await,
        Ok(1),
        "the renewed chain, from the next connection"
    );
}

/// A `RateLimitConfig` of `domain` with one descriptor per `(key, unit, requests)`, encoded.
fn domain(domain: &str, limits: &[(&str, i32, u32)]) -> Vec<u8> {
    RateLimitConfig {
        name: domain.into(),
        domain: domain.into(),
        descriptors: limits
            .iter()
            .map(|&(key, unit, n)| RateLimitDescriptor {
                key: key.into(),
                rate_limit: Some(RateLimitPolicy {
                    unit,
                    requests_per_unit: n,
                    ..RateLimitPolicy::default()
                }),
                ..RateLimitDescriptor::default()
            })
            .collect(),
    }
    .encode_to_vec()
}

/// envoyproxy/ratelimit's `initialXdsBasicConfig` (test/integration/xds_sotw_integration_test.go).
fn ratelimits_initial_config() -> Vec<Vec<u8>> {
    let (second, minute, hour, day) = (1, 2, 3, 4);
    vec![
        domain(
            "basic",
            &[
                ("key1", second, 50),
                ("key1_local", second, 50),
                ("one_per_minute", minute, 1),
            ],
        ),
        domain(
            "another",
            &[
                ("key2", minute, 20),
                ("key3", hour, 10),
                ("key2_local", minute, 20),
                ("key3_local", hour, 10),
                ("key4", day, 20),
                ("key4_local", day, 20),
            ],
        ),
    ]
}

/// A request of `descriptors` (each a list of entries), one hit each.
async fn ask(
    server: &Server,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> weir_server::rls::Response {
    let request = Request {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|d| RequestDescriptor {
                entries: d
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..RequestDescriptor::default()
            })
            .collect(),
        hits_addend: 1,
    };
    server.service().decide(&request).await.unwrap()
}

/// A status as (over, requests per unit, unit, remaining); `None` for no limit.
fn limit_of(s: &weir_server::rls::Status) -> Option<(bool, u64, Unit, u64)> {
    let l = s.limit.as_ref()?;
    Some((s.over_limit, l.requests_per_unit, l.unit, s.remaining))
}

/// envoyproxy/ratelimit's xDS integration test (`testXdsProviderBasicConfig` running
/// `testBasicBaseConfig`, then `testXdsProviderBasicConfigReload` running `testConfigReload`),
/// its expectations ported: the configuration its test pushes, the answers it expects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyproxy_ratelimits_xds_expectations() {
    // Minute and hour windows on the wall clock: the counting must not straddle a minute's end.
    let into_minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 60;
    if into_minute > 45 {
        tokio::time::sleep(Duration::from_secs(61 - into_minute)).await;
    }
    let (push, snapshot) = watch::channel(("1".to_string(), ratelimits_initial_config()));
    let (ads, mut seen) = Ads::new(snapshot);
    let addr: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let _ads = serve(ads, addr);
    let server = Server::builder()
        .store(MemoryStore::default())
        .pushed()
        .build()
        .unwrap();
    let _client = XdsClient::spawn(
        server.service().clone(),
        Settings::new(&addr.to_string(), "init-test-node").unwrap(),
    );
    next(&mut seen).await;
    assert_eq!(next(&mut seen).await.version, "1");

    // testBasicBaseConfig: an unknown domain has no limit.
    let r = ask(&server, "foo", &[&[("hello", "world")]]).await;
    assert!(!r.over_limit && r.statuses[0].limit.is_none());
    let r = ask(&server, "basic", &[&[("key1", "foo")]]).await;
    assert_eq!(
        limit_of(&r.statuses[0]),
        Some((false, 50, Unit::Second, 49))
    );
    // 25 hits on 20 a minute: 19 … 0 left, then OVER_LIMIT with 0.
    for i in 0..25u64 {
        let r = ask(&server, "another", &[&[("key2", "4242")]]).await;
        let over = i >= 20;
        let left = if over { 0 } else { 20 - (i + 1) };
        assert_eq!(r.over_limit, over, "hit {i}");
        assert_eq!(
            limit_of(&r.statuses[0]),
            Some((over, 20, Unit::Minute, left)),
            "hit {i}"
        );
    }
    // Two keys of one domain: key3 (10 an hour) goes over first; key2 keeps counting.
    for i in 0..15u64 {
        let r = ask(&server, "another", &[&[("key2", "77")], &[("key3", "77")]]).await;
        let over = i >= 10;
        assert_eq!(r.over_limit, over, "hit {i}");
        assert_eq!(
            limit_of(&r.statuses[0]),
            Some((false, 20, Unit::Minute, 20 - (i + 1)))
        );
        let left = if over { 0 } else { 10 - (i + 1) };
        assert_eq!(
            limit_of(&r.statuses[1]),
            Some((over, 10, Unit::Hour, left)),
            "hit {i}"
        );
    }
    // The time until reset counts down between two hits of one key.
    let first = ask(&server, "another", &[&[("key4", "durTest")]])
        .await
        .statuses[0]
        .reset;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = ask(&server, "another", &[&[("key4", "durTest")]])
        .await
        .statuses[0]
        .reset;
    assert!(second < first, "{second:?} < {first:?}");

    // testConfigReload: the domain `reload` comes with version 2 and goes with version 3.
    let r = ask(&server, "reload", &[&[("block", "foo")]]).await;
    assert!(!r.over_limit && r.statuses[0].limit.is_none());
    let mut with_reload = ratelimits_initial_config();
    with_reload.push(domain(
        "reload",
        &[("key1", 1, 50), ("block", 1, 0), ("one_per_minute", 2, 1)],
    ));
    push.send(("2".into(), with_reload)).unwrap();
    assert_eq!(next(&mut seen).await.version, "2");
    let r = ask(&server, "reload", &[&[("key1", "foo")]]).await;
    assert_eq!(
        limit_of(&r.statuses[0]),
        Some((false, 50, Unit::Second, 49))
    );
    assert!(
        ask(&server, "reload", &[&[("block", "foo")]])
            .await
            .over_limit
    );
    push.send(("3".into(), ratelimits_initial_config()))
        .unwrap();
    assert_eq!(next(&mut seen).await.version, "3");
    let r = ask(&server, "reload", &[&[("key1", "foo")]]).await;
    assert!(
        r.statuses[0].limit.is_none(),
        "the domain went with version 3"
    );
    // The other domains' counters were kept through both pushes.
    let r = ask(&server, "another", &[&[("key2", "4242")]]).await;
    assert_eq!(limit_of(&r.statuses[0]), Some((true, 20, Unit::Minute, 0)));
}

/// A push of 45 000 rules (a large deployment's configuration) is compiled off the runtime's
/// worker: decisions on that one worker keep answering while it is, and the push is ACKed.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_push_of_45_000_rules_never_stalls_decisions() {
    let limits: Vec<(String, i32, u32)> = (0..45_000)
        .map(|i| (format!("k{i:05}"), 2, 1_000))
        .collect();
    let refs: Vec<(&str, i32, u32)> = limits
        .iter()
        .map(|(k, u, n)| (k.as_str(), *u, *n))
        .collect();
    let big = domain("edge", &refs);
    let (push, snapshot) = watch::channel(("small".to_string(), vec![config("edge", 1_000, 2)]));
    let (ads, mut seen) = Ads::new(snapshot);
    let addr: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let _ads = serve(ads, addr);
    let server = std::sync::Arc::new(
        Server::builder()
            .store(MemoryStore::default())
            .pushed()
            .build()
            .unwrap(),
    );
    let _client = XdsClient::spawn(
        server.service().clone(),
        Settings::new(&addr.to_string(), "big").unwrap(),
    );
    next(&mut seen).await;
    assert_eq!(next(&mut seen).await.version, "small");
    // Decisions in a loop on the runtime's only worker, the slowest round kept.
    let deciding = {
        let server = server.clone();
        tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            loop {
                // A round: a 1 ms wait and a decision; a stalled worker shows as a long round.
                let t = Instant::now();
                tokio::time::sleep(Duration::from_millis(1)).await;
                let _ = over(&server).await;
                slowest = slowest.max(t.elapsed());
                if server.service().domains().len() == 1
                    && ask(&server, "edge", &[&[("k44999", "x")]]).await.statuses[0]
                        .limit
                        .is_some()
                {
                    return slowest;
                }
            }
        })
    };
    push.send(("big".into(), vec![big])).unwrap();
    let ack = tokio::time::timeout(Duration::from_secs(120), seen.recv())
        .await
        .expect("an ACK within 120 s")
        .unwrap();
    assert_eq!((ack.version.as_str(), ack.error.as_deref()), ("big", None));
    let slowest = tokio::time::timeout(Duration::from_secs(30), deciding)
        .await
        .expect("the new rules answer")
        .unwrap();
    assert!(
        slowest < Duration::from_millis(250),
        "a decision waited {slowest:?}"
    );
}
