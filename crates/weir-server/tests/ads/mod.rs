//! An xDS management server for tests: state of the world over
//! `AggregatedDiscoveryService/StreamAggregatedResources`, pushing the snapshot of a `watch`
//! channel (version and `RateLimitConfig` resources) and reporting every request it takes, so a
//! test can check the client's side of the protocol:
//!
//! 1. the stream's first request names the node and the type URL, with no nonce and the
//!    version last accepted (none on the first stream);
//! 2. every later request echoes the nonce of the response it answers ([`next`] checks it);
//! 3. an ACK carries the version just sent and no error; a NACK the version accepted before
//!    and an `error_detail`;
//! 4. after the server goes away ([`Killable`] dropped) and comes back, the client opens a
//!    new stream on its own.
//!
//! Shared by weir-server's `tests/xds.rs` and the `weir` binary's end-to-end test.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use futures_util::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};

/// `ratelimit.config.ratelimit.v3.RateLimitConfig`'s type URL.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The snapshot the server pushes: its version and its resources, encoded.
pub type Snapshot = (String, Vec<Vec<u8>>);

/// A request the server took, as the protocol points see it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub node: String,
    pub type_url: String,
    pub version: String,
    pub nonce: String,
    /// The nonce of the response this request answers (empty for a stream's first).
    pub sent: String,
    pub error: Option<String>,
}

#[derive(Clone)]
pub struct Ads {
    snapshot: watch::Receiver<Snapshot>,
    seen: mpsc::UnboundedSender<Seen>,
    nonces: Arc<Mutex<u64>>,
}

impl Ads {
    /// A server pushing what `snapshot` holds (and each change of it); what it takes comes
    /// out of the receiver.
    pub fn new(snapshot: watch::Receiver<Snapshot>) -> (Self, mpsc::UnboundedReceiver<Seen>) {
        let (seen, rx) = mpsc::unbounded_channel();
        let ads = Self {
            snapshot,
            seen,
            nonces: Arc::default(),
        };
        (ads, rx)
    }
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
                            value: r.clone(),
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
pub struct Killable(
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

pub fn serve(ads: Ads, addr: SocketAddr) -> Killable {
    serve_with(ads, addr, None)
}

/// [`serve`] over TLS (mutual when `tls` names a client CA).
pub fn serve_tls(ads: Ads, addr: SocketAddr, tls: tonic::transport::ServerTlsConfig) -> Killable {
    serve_with(ads, addr, Some(tls))
}

fn serve_with(
    ads: Ads,
    addr: SocketAddr,
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> Killable {
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
            let mut server = tonic::transport::Server::builder();
            if let Some(tls) = tls {
                server = server.tls_config(tls).expect("a TLS configuration");
            }
            let _ = server
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

/// The next request the server saw, within 10 s; point 2 checked on it.
pub async fn next(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    let s = tokio::time::timeout(Duration::from_secs(10), seen.recv())
        .await
        .expect("a request within 10 s")
        .expect("the server runs");
    assert_eq!(s.nonce, s.sent, "a request echoes the nonce it answers");
    s
}

/// A CA, a server certificate for `localhost` and 127.0.0.1 and a client certificate signed by
/// it, written as PEM files into `dir`.
pub struct Certs {
    pub ca: std::path::PathBuf,
    pub server_cert: std::path::PathBuf,
    pub server_key: std::path::PathBuf,
    pub client_cert: std::path::PathBuf,
    pub client_key: std::path::PathBuf,
}

impl Certs {
    pub fn new(dir: &std::path::Path) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        std::fs::create_dir_all(dir).unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "weir test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |names: Vec<String>| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &ca)
                .unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(vec!["localhost".into(), "127.0.0.1".into()]);
        let (client_cert, client_key) = leaf(vec!["envoy-ratelimit".into()]);
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        Self {
            ca: write("ca.crt", &ca.pem()),
            server_cert: write("server.crt", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.crt", &client_cert),
            client_key: write("client.key", &client_key),
        }
    }

    /// A server TLS configuration with these certificates, asking clients for one of the CA's.
    pub fn server_mtls(&self) -> tonic::transport::ServerTlsConfig {
        let read = |p: &std::path::Path| std::fs::read(p).unwrap();
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(
                read(&self.server_cert),
                read(&self.server_key),
            ))
            .client_ca_root(tonic::transport::Certificate::from_pem(read(&self.ca)))
    }
}
