//! `weir serve` as an xDS client of rate-limit configuration, as envoyproxy/ratelimit is with
//! `CONFIG_TYPE=GRPC_XDS_SOTW` (what Envoy Gateway runs): the state of the world of
//! `ratelimit.config.ratelimit.v3.RateLimitConfig` resources over
//! `envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources`.
//!
//! - `proto`: the resource; `convert`: resources into the configuration files give (same
//!   parser, same checks); `client`: the stream.
//! - Each response is the whole configuration: it is compiled and put in force as a file's
//!   reload is (counters of the rules it keeps kept) and ACKed; one that does not compile is
//!   NACKed with its errors (`xds:NAME: descriptors[0].rate_limit: …`) and the previous
//!   configuration keeps serving.
//! - A stream that ends or cannot be opened is opened again after a backoff (exponential,
//!   jittered); decisions go on with the configuration in force meanwhile, and the new
//!   stream asks with the version last accepted.
//! - Counted in `weir_xds_updates_total{result="applied|rejected"}`, `weir_xds_streams_total`
//!   and `weir_xds_connected`.
//!
//! Who may call it: the management server the operator names. Its responses are bounded
//! (`Settings::max_message`, 4 MiB by default); a resource of another type, or one that
//! does not decode, is NACKed like a bad configuration.

mod client;
mod convert;
pub mod proto;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use client::XdsClient;
pub use convert::domains;

use crate::admin::metrics::{counter, counters, gauge, Collector, Encoder};

/// Where and how to ask for configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The management server, `http://HOST:PORT`.
    pub server: http::Uri,
    /// The node id sent (Envoy Gateway's snapshot is keyed by it).
    pub node_id: String,
    /// The node's metadata (`key=value` pairs).
    pub node_metadata: Vec<(String, String)>,
    /// Request metadata sent with the stream (`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`).
    pub headers: Vec<(String, String)>,
    /// Wait before the first reconnection; doubled each time, up to `backoff_max`.
    pub backoff_initial: Duration,
    /// Longest wait between reconnections.
    pub backoff_max: Duration,
    /// Each wait is drawn within ± this share of itself (0: none).
    pub backoff_jitter: f64,
    /// Largest response taken.
    pub max_message: usize,
    /// One domain in two resources joins them (`MERGE_DOMAIN_CONFIG`); else it is an error.
    pub merge_domains: bool,
    /// TLS to the management server (`None`: plain gRPC).
    pub tls: Option<ClientTls>,
}

/// TLS to the management server: the CA its certificate must chain to and, for mutual TLS
/// (what Envoy Gateway asks), this client's certificate and key. The files are read at each
/// connection and checked every second: a renewed file ends the stream, and the next one
/// (after the first backoff wait, 0.5 s ± 50 %) connects with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// The CA, PEM.
    pub ca: std::path::PathBuf,
    /// This client's certificate chain and key, PEM (both or neither).
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The name the server's certificate must carry (default: the server's host).
    pub server_name: Option<String>,
}

impl Settings {
    /// Asks `server` (`http://HOST:PORT`, or `HOST:PORT` as envoyproxy/ratelimit takes it) as
    /// the node `node_id`, reconnecting after 0.5 s doubling to 30 s, ± 50 %.
    pub fn new(server: &str, node_id: &str) -> Result<Self, XdsError> {
        let with_scheme = if server.contains("://") {
            server.to_string()
        } else {
            format!("http://{server}")
        };
        let server: http::Uri = with_scheme
            .parse()
            .map_err(|e: http::uri::InvalidUri| XdsError::Server(format!("{server:?}: {e}")))?;
        match server.scheme_str() {
            Some("http") if server.host().is_some_and(|h| !h.is_empty()) => {}
            Some("https") => {
                return Err(XdsError::Server(format!(
                "{server}: TLS to the management server is not supported yet; use its plain port"
            )))
            }
            _ => return Err(XdsError::Server(format!("{server}: expected HOST:PORT"))),
        }
        Ok(Self {
            server,
            node_id: node_id.to_string(),
            node_metadata: Vec::new(),
            headers: Vec::new(),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            backoff_jitter: 0.5,
            max_message: 4 << 20,
            merge_domains: false,
            tls: None,
        })
    }

    /// Speaks TLS to the server as `tls` says.
    pub fn with_tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Checks what cannot be known before connecting: an `https://` server needs TLS files.
    pub fn check(&self) -> Result<(), XdsError> {
        if self.server.scheme_str() == Some("https") && self.tls.is_none() {
            return Err(XdsError::Server(format!(
                "{}: https needs the CA its certificate chains to (--xds-tls-ca)",
                self.server
            )));
        }
        if let Some(t) = &self.tls {
            let mut files = vec![&t.ca];
            if let Some((c, k)) = &t.identity {
                files.extend([c, k]);
            }
            for f in files {
                std::fs::metadata(f).map_err(|e| XdsError::Tls(format!("{}: {e}", f.display())))?;
            }
        }
        Ok(())
    }
}

/// A bad xDS setting.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum XdsError {
    /// The management server's address cannot be used.
    #[error("xDS server {0}")]
    Server(String),
    /// A TLS file that cannot be read.
    #[error("xDS TLS {0}")]
    Tls(String),
}

/// What the client did, counted.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) applied: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) streams: AtomicU64,
    pub(crate) connected: AtomicBool,
}

#[derive(Debug)]
struct StatsCollector(Arc<Stats>);

impl Collector for StatsCollector {
    fn encode(&self, mut enc: Encoder) -> std::fmt::Result {
        let s = &self.0;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counters(
            &mut enc,
            "weir_xds_updates",
            "Configurations pushed over xDS, by result (applied and ACKed; rejected: NACKed, the previous one kept).",
            [("applied", load(&s.applied)), ("rejected", load(&s.rejected))]
                .map(|(result, v)| ([("result", result)], v)),
        )?;
        counter(
            &mut enc,
            "weir_xds_streams",
            "Streams opened to the xDS management server.",
            load(&s.streams),
        )?;
        gauge(
            &mut enc,
            "weir_xds_connected",
            "1 while a stream to the xDS management server is open.",
            f64::from(u8::from(s.connected.load(Ordering::Relaxed))),
        )
    }
}
