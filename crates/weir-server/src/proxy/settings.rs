//! What `weir proxy` is asked to do ([`Settings`]) and the upstream's address and protocol.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::Uri;

use super::paced;

/// What `weir proxy` was asked to do.
pub struct Settings {
    /// The rule file.
    pub rules: PathBuf,
    /// Where to accept requests.
    pub listen: SocketAddr,
    /// `http://HOST:PORT` of the upstream.
    pub upstream: String,
    /// Where to serve the dashboard, `/metrics` and `/healthz` (none: not served).
    pub admin: Option<SocketAddr>,
    /// The bearer token the dashboard's data and `/metrics` require (none: open).
    pub admin_token: Option<String>,
    /// Longest wait for the upstream's response head.
    pub upstream_timeout: Duration,
    /// How often the rule file is checked for changes.
    pub reload_interval: Duration,
    /// Client connections: how many at once, first-request and idle timeouts.
    pub limits: crate::net::accept::Limits,
    /// Most upstream requests in flight, all clients together (then 503).
    pub max_upstream_requests: usize,
    /// Most upstream requests in flight from one client address (an IPv6 /64); then 503.
    pub max_upstream_per_address: usize,
    /// How a request body streamed to the upstream must keep arriving (then 408).
    pub body_pace: paced::Pace,
    /// Most bytes of request bodies held at once, process-wide, to read JSON cost estimates
    /// (each connection at most [`crate::net::budget::BodyLimits::default`]'s per-connection bytes).
    pub max_buffered_bytes: usize,
    /// The quota server (`http://HOST:PORT` of `weir serve --quota`) for `cluster` flow rules.
    pub quota_server: Option<String>,
    /// This proxy's client id at the quota server.
    pub quota_client_id: String,
    /// The bearer token presented to the quota server, if it asks for one.
    pub quota_token: Option<String>,
    /// How to speak to the upstream.
    pub upstream_protocol: UpstreamProtocol,
    /// Which HTTP/1.1 server reads the clients' requests (see [`super::lean`]).
    pub http1: Http1,
    /// On SIGTERM or Ctrl-C, how long the requests in flight get to finish.
    pub drain_timeout: Duration,
    /// The clock the rules read.
    pub clock: weir_core::ClockKind,
    /// `http://HOST:PORT` of a gutter: a small upstream serving what the primary's breaker
    /// sheds (weir-tower's `gutter`).
    pub gutter: Option<String>,
    /// Most requests in flight to the gutter.
    pub gutter_max_requests: usize,
    /// The breaker of each upstream (with a gutter).
    pub upstream_breaker: weir_core::breaker::BreakerConfig,
    /// `redis://HOST:PORT[/DB]` or `redis+cluster://…`: where `shared: true` rules count,
    /// together with every proxy on it (none: they count locally).
    pub store: Option<String>,
    /// Proxies sharing the store (while Redis is unreachable each allows limit / N).
    pub instances: u64,
    /// Worker threads serving clients, each with its own runtime, listener and upstream
    /// pools (0 is treated as 1).
    pub workers: usize,
}

impl Settings {
    /// A proxy of `rules` on `listen` in front of `upstream` (`http://HOST:PORT`), every other
    /// setting at the default of `weir proxy`'s flag: no admin port, a 30 s upstream timeout,
    /// the rule file checked every second, [`crate::net::accept::Limits::default`], 1 024
    /// upstream requests in flight (a quarter of them per client address), request bodies
    /// cut off after 10 s without data or under 1 KiB/s, 64 MiB of bodies held for JSON
    /// estimates, no quota server, store or gutter (its breakers: Resilience4j's defaults), a
    /// 10 s drain, the exact clock, and one worker thread per core.
    ///
    /// Who may call it: the program embedding the proxy; nothing here is read from a client.
    pub fn new(rules: impl Into<PathBuf>, listen: SocketAddr, upstream: impl Into<String>) -> Self {
        Self {
            rules: rules.into(),
            listen,
            upstream: upstream.into(),
            admin: None,
            admin_token: None,
            upstream_timeout: Duration::from_secs(30),
            reload_interval: Duration::from_secs(1),
            limits: crate::net::accept::Limits::default(),
            max_upstream_requests: 1_024,
            max_upstream_per_address: 256,
            body_pace: paced::Pace {
                idle: Duration::from_secs(10),
                min_rate: 1_024,
            },
            max_buffered_bytes: 64 << 20,
            quota_server: None,
            quota_client_id: format!("weir-proxy-{}", std::process::id()),
            quota_token: None,
            upstream_protocol: UpstreamProtocol::Auto,
            http1: Http1::Lean,
            drain_timeout: Duration::from_secs(10),
            clock: weir_core::ClockKind::default(),
            gutter: None,
            gutter_max_requests: 64,
            upstream_breaker: weir_core::breaker::BreakerConfig::resilience4j(),
            store: None,
            instances: 1,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// Which server reads the clients' HTTP/1.1 requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Http1 {
    /// The proxy's own reader for the common request, hyper for the rest (the rule is in
    /// [`super::lean`]).
    Lean,
    /// hyper for every request.
    Hyper,
}

impl std::str::FromStr for Http1 {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lean" => Ok(Self::Lean),
            "hyper" => Ok(Self::Hyper),
            _ => Err(format!("{s:?}: expected lean or hyper")),
        }
    }
}

/// The protocol spoken to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// gRPC calls (`content-type: application/grpc…` over HTTP/2) go out over h2c, which gRPC
    /// needs; everything else over HTTP/1.1, which every upstream speaks (an HTTP/2 client in
    /// front of an HTTP/1-only upstream just works).
    Auto,
    /// Always HTTP/1.1.
    Http1,
    /// Always h2c (prior knowledge).
    H2c,
}

impl std::str::FromStr for UpstreamProtocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "http1" => Ok(Self::Http1),
            "h2c" => Ok(Self::H2c),
            _ => Err(format!("{s:?}: expected auto, http1 or h2c")),
        }
    }
}

/// Why a text is not an upstream's address (named as `weir proxy`'s `--upstream` names it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// Not a URL.
    #[error("--upstream {text:?}: not a URL: {reason}")]
    Url {
        /// The text given.
        text: String,
        /// Why it is not a URL.
        reason: String,
    },
    /// Not `http://HOST:PORT`.
    #[error("--upstream {0:?}: expected http://HOST:PORT (https upstreams are not supported)")]
    Scheme(String),
    /// A URL with a path.
    #[error("--upstream {0:?}: give no path, only http://HOST:PORT")]
    Path(String),
}

/// Parses `http://HOST:PORT` (no path).
pub fn parse_upstream(s: &str) -> Result<Uri, UpstreamError> {
    let uri: Uri = s
        .parse()
        .map_err(|e: http::uri::InvalidUri| UpstreamError::Url {
            text: s.to_string(),
            reason: e.to_string(),
        })?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(UpstreamError::Scheme(s.to_string()));
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(UpstreamError::Path(s.to_string()));
    }
    Ok(uri)
}

/// Why a proxy could not start: one line naming the setting (by `weir proxy`'s flag) or the
/// file at fault. Every variant but [`StartError::Watcher`] is a mistake of configuration.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting is invalid or contradicts another.
    #[error("{0}")]
    Setting(String),
    /// The rule file, or a state file beside it, cannot be read or is invalid.
    #[error("{0}")]
    File(String),
    /// The shared store (`store`) cannot be reached.
    #[error("{0}")]
    Store(String),
    /// The rule file's watcher could not start (the system refused a thread).
    #[error("cannot start the rule watcher: {0}")]
    Watcher(#[source] std::io::Error),
}

pub(super) fn setting(e: impl std::fmt::Display) -> StartError {
    StartError::Setting(e.to_string())
}

pub(super) fn file(e: impl std::fmt::Display) -> StartError {
    StartError::File(e.to_string())
}
