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
use weir_server::rls::{MemoryStore, Request, RequestDescriptor};
use weir_server::serve::Server;
use weir_server::xds::proto::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, TYPE_URL};
use weir_server::xds::{Settings, XdsClient};

mod ads;
use ads::{next, serve, Ads};

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
