//! `weir serve`'s rate-limit service configured over xDS, in-process, against an ADS server of
//! this test that follows the state-of-the-world protocol and checks the client's side of it:
//!
//! 1. the stream's first request names the node and the type URL, with no nonce and the
//!    version last accepted (none on the first stream);
//! 2. every later request echoes the nonce of the response it answers;
//! 3. an ACK carries the version just sent and no error; a NACK the version accepted before and
//!    an `error_detail` with the configuration's errors;
//! 4. after the server goes away and comes back, the client opens a new stream on its own.
//!
//! Pushed limits apply within 1 s with the counters kept, a bad push is NACKed while the
//! previous configuration keeps serving, and decisions go on while the server is away.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use futures_util::{Stream, StreamExt};
use prost::Message;
use tokio::sync::{mpsc, watch};
use weir_server::rls::{MemoryStore, Request, RequestDescriptor};
use weir_server::serve::Server;
use weir_server::xds::proto::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, TYPE_URL};
use weir_server::xds::{Settings, XdsClient};

/// The snapshot the server pushes: its version and resources.
type Snapshot = (String, Vec<RateLimitConfig>);

/// A request the server took, as the protocol points see it.
#[derive(Debug, Clone)]
struct Seen {
    node: String,
    type_url: String,
    version: String,
    nonce: String,
    /// The nonce of the response this request answers (empty for a stream's first).
    sent: String,
    error: Option<String>,
}

#[derive(Clone)]
struct Ads {
    snapshot: watch::Receiver<Snapshot>,
    seen: mpsc::UnboundedSender<Seen>,
    nonces: Arc<Mutex<u64>>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, tonic::Status>> + Send>>;
type DeltaResponses =
    Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        let mut requests = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let (mut snapshot, seen, nonces) = (
            self.snapshot.clone(),
            self.seen.clone(),
            self.nonces.clone(),
        );
        tokio::spawn(async move {
            // Point 1: the first request, before anything is sent.
            let Some(Ok(first)) = requests.next().await else {
                return;
            };
            let _ = seen.send(seen_of(&first));
            loop {
                let (version, resources) = snapshot.borrow_and_update().clone();
                let nonce = {
                    let mut n = nonces.lock().unwrap();
                    *n += 1;
                    n.to_string()
                };
                let response = DiscoveryResponse {
                    version_info: version,
                    type_url: TYPE_URL.into(),
                    nonce: nonce.clone(),
                    resources: resources
                        .iter()
                        .map(|r| Any {
                            type_url: TYPE_URL.into(),
                            value: r.encode_to_vec(),
                        })
                        .collect(),
                    ..DiscoveryResponse::default()
                };
                if tx.send(Ok(response)).await.is_err() {
                    return;
                }
                // Point 2: the answer to this response echoes its nonce.
                let Some(Ok(answer)) = requests.next().await else {
                    return;
                };
                let _ = seen.send(Seen {
                    sent: nonce,
                    ..seen_of(&answer)
                });
                if snapshot.changed().await.is_err() {
                    return;
                }
            }
        });
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        Ok(tonic::Response::new(Box::pin(stream)))
    }

    async fn delta_aggregated_resources(
        &self,
        _: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<DeltaResponses>, tonic::Status> {
        Err(tonic::Status::unimplemented("state of the world only"))
    }
}

fn seen_of(r: &DiscoveryRequest) -> Seen {
    Seen {
        node: r.node.as_ref().map(|n| n.id.clone()).unwrap_or_default(),
        type_url: r.type_url.clone(),
        version: r.version_info.clone(),
        nonce: r.response_nonce.clone(),
        sent: String::new(),
        error: r.error_detail.as_ref().map(|e| e.message.clone()),
    }
}

/// Serves `ads` on `addr` on a runtime of its own; dropping the handle kills the server
/// (its runtime dropped: every connection closed at once, as a process killed).
struct Killable(
    Option<std::sync::mpsc::Sender<()>>,
    Option<std::thread::JoinHandle<()>>,
);

impl Drop for Killable {
    fn drop(&mut self) {
        drop(self.0.take());
        if let Some(t) = self.1.take() {
            let _ = t.join();
        }
    }
}

fn serve(ads: Ads, addr: SocketAddr) -> Killable {
    let (kill, killed) = std::sync::mpsc::channel::<()>();
    let (ready, bound) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.spawn(async move {
            let listener = loop {
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => break l,
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            };
            let _ = ready.send(());
            let incoming = futures_util::stream::unfold(listener, |l| async move {
                let accepted = l.accept().await.map(|(s, _)| s);
                Some((accepted, l))
            });
            let _ = tonic::transport::Server::builder()
                .add_service(AggregatedDiscoveryServiceServer::new(ads))
                .serve_with_incoming(incoming)
                .await;
        });
        let _ = killed.recv();
        runtime.shutdown_background();
    });
    bound
        .recv_timeout(Duration::from_secs(10))
        .expect("the ADS server listens");
    Killable(Some(kill), Some(thread))
}

fn config(name: &str, per_minute: u32, unit: i32) -> RateLimitConfig {
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

/// The next request the server saw, within 10 s; point 2 checked on it.
async fn next(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    let s = tokio::time::timeout(Duration::from_secs(10), seen.recv())
        .await
        .expect("a request within 10 s")
        .expect("the server runs");
    assert_eq!(s.nonce, s.sent, "a request echoes the nonce it answers");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_limits_apply_with_counters_kept_and_bad_pushes_are_nacked() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    const MINUTE: i32 = 2;
    let (push, snapshot) = watch::channel(("v1".to_string(), vec![config("edge", 2, MINUTE)]));
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let ads = Ads {
        snapshot,
        seen: seen_tx,
        nonces: Arc::default(),
    };
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
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let again = Ads {
        snapshot: snapshot4,
        seen: seen_tx,
        nonces: Arc::default(),
    };
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
