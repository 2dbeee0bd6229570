//! `weir proxy`: a reverse proxy applying a weir-rules file to every request.
//!
//! Accepts HTTP/1.1 and h2c (prior knowledge) on `--listen`, maps each request to a resource by
//! the rule file's `http.routes`, answers blocked requests itself (429 / 403 / 503 with
//! `Retry-After`, `RateLimit-*` and a problem body, see `weir_tower::rules`), and forwards the
//! rest to `--upstream` over pooled HTTP/1.1 connections. The rule file is re-read when it
//! changes (state kept; an invalid file is reported and the old rules stay). An unreachable
//! upstream gets 502, a slow one 504 after `--upstream-timeout`: never a hang. `--admin`
//! serves the live dashboard (weir-tower's `dashboard`), `/metrics` (Prometheus text) and
//! `/healthz`; `--admin-token` puts the dashboard's data and `/metrics` behind a bearer token.

mod ahead;
pub mod budget_file;
mod h1_client;
mod metrics;
pub mod paced;
mod shared;
mod slots;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Service, ServiceBuilder};
use weir_rules::engine::Rules;
use weir_rules::watch::{Event, Watcher};
use weir_tower::key::PeerAddr;
use weir_tower::rules::RulesLayer;

use crate::admin::switches;
use paced::PacedBody;
use slots::{AddressSlot, AddressSlots};

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
    /// (each connection at most [`BodyLimits::default`]'s per-connection bytes).
    pub max_buffered_bytes: usize,
    /// The quota server (`http://HOST:PORT` of `weir serve --quota`) for `cluster` flow rules.
    pub quota_server: Option<String>,
    /// This proxy's client id at the quota server.
    pub quota_client_id: String,
    /// The bearer token presented to the quota server, if it asks for one.
    pub quota_token: Option<String>,
    /// How to speak to the upstream.
    pub upstream_protocol: UpstreamProtocol,
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

/// Counters of the proxy itself (beside the rules' own).
#[derive(Default)]
pub struct ProxyStats {
    forwarded: AtomicU64,
    upstream_unreachable: AtomicU64,
    upstream_timeout: AtomicU64,
    upstream_busy: AtomicU64,
    body_too_slow: AtomicU64,
    loops: AtomicU64,
    reloads_applied: AtomicU64,
    reloads_rejected: AtomicU64,
    switch_changes: Arc<AtomicU64>,
    /// The gutter's decisions and breakers, when there is one.
    gutter: std::sync::OnceLock<weir_tower::gutter::Gutter<(), ()>>,
}

/// A body from the upstream or one the proxy wrote.
type ProxyBody = BoxBody<Bytes, crate::net::conn::BoxError>;

/// A client's request body past the rules: as it came, or with its first bytes read for a
/// cost estimate ([`weir_tower::cost::ReadJsonLayer`]).
type ClientBody = weir_tower::cost::ReplayBody<Incoming>;

/// Parses `http://HOST:PORT` (no path).
pub fn parse_upstream(s: &str) -> Result<Uri, String> {
    let uri: Uri = s
        .parse()
        .map_err(|e| format!("--upstream {s:?}: not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!(
            "--upstream {s:?}: expected http://HOST:PORT (https upstreams are not supported)"
        ));
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(format!(
            "--upstream {s:?}: give no path, only http://HOST:PORT"
        ));
    }
    Ok(uri)
}

/// Most upstream requests in flight for one client connection (an h2c client multiplexing
/// hundreds of streams would otherwise open as many HTTP/1.1 upstream connections).
pub const MAX_UPSTREAM_PER_CLIENT: usize = 64;

/// Forwards requests to the upstream: what a worker's client connections share, and the
/// connection's own bound. Two reference counts to clone (the service stack clones it for
/// every request).
#[derive(Clone)]
struct Forward {
    to: Arc<ForwardTo>,
    /// Upstream requests in flight for this client connection.
    per_client: Arc<Semaphore>,
    /// The client connection's peer (none in the workers' prototypes).
    peer: Option<Peer>,
    /// The connection's share of the bytes bodies may hold before their request takes an
    /// upstream slot (none in the workers' prototypes).
    budget: Option<Arc<crate::net::budget::ConnectionBudget>>,
    /// The rules: whose client address a request from a trusted proxy is.
    rules: Option<RulesLayer<weir_core::AnyClock>>,
}

/// A client connection's address, and its text for `X-Forwarded-For` (formatted once per
/// connection).
#[derive(Clone)]
struct Peer {
    ip: IpAddr,
    text: HeaderValue,
}

impl Peer {
    fn new(ip: IpAddr) -> Self {
        let text = HeaderValue::from_str(&weir_tower::key::ip_string(ip))
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        Self { ip, text }
    }
}

/// The upstream side a worker's client connections share (see [`Forward`]).
#[derive(Clone)]
struct ForwardTo {
    /// Bodiless requests over HTTP/1.1, on the calling task.
    bodiless: h1_client::H1Client,
    http1: PooledClient,
    h2c: PooledClient,
    protocol: UpstreamProtocol,
    upstream: Uri,
    timeout: Duration,
    stats: Arc<ProxyStats>,
    /// This process's token in `Via`: a request carrying it has come round in a loop.
    via: HeaderValue,
    /// Its hops in `Via`, per request version.
    hops: ViaHops,
    /// Upstream requests in flight, all clients together.
    total: Arc<Semaphore>,
    /// Upstream requests in flight per client address.
    per_address: Arc<AddressSlots>,
    /// How a request body must keep arriving.
    pace: paced::Pace,
}

/// What an upstream request holds until its response body ends: its places in the total, the
/// client connection's and the client address's bounds.
struct UpstreamPermits(
    #[allow(dead_code)] OwnedSemaphorePermit,
    #[allow(dead_code)] OwnedSemaphorePermit,
    #[allow(dead_code)] Option<AddressSlot>,
);

impl weir_tower::body::Held for UpstreamPermits {
    fn end(self, _: bool) {}
}

/// Why a request is refused before it is forwarded (answered by the proxy itself).
pub fn refuse<B>(req: &Request<B>, via: &HeaderValue) -> Option<(StatusCode, &'static str)> {
    if req.method() == http::Method::CONNECT {
        return Some((
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT is not supported: this is a reverse proxy",
        ));
    }
    let hosts = req.headers().get_all(header::HOST).iter().count();
    if hosts > 1 {
        return Some((StatusCode::BAD_REQUEST, "more than one Host header"));
    }
    if hosts == 0 && req.version() == Version::HTTP_11 {
        return Some((StatusCode::BAD_REQUEST, "HTTP/1.1 request without Host"));
    }
    let token = via.as_bytes();
    let looped = req.headers().get_all(header::VIA).iter().any(|v| {
        v.as_bytes()
            .split(|b| *b == b',')
            .any(|hop| hop.trim_ascii().ends_with(token))
    });
    if looped {
        return Some((
            StatusCode::LOOP_DETECTED,
            "request loop: this proxy already forwarded it (check --upstream)",
        ));
    }
    None
}

/// A token naming this process in `Via` (`1.1 weir-<hex>`), unique per start.
fn via_token(listen: SocketAddr) -> HeaderValue {
    use std::hash::BuildHasher;
    let seed = (std::process::id(), listen, std::time::SystemTime::now());
    let token = std::collections::hash_map::RandomState::new().hash_one(seed);
    HeaderValue::from_str(&format!("weir-{token:016x}")).unwrap_or(HeaderValue::from_static("weir"))
}

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// `X-Forwarded-For`.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Removes hop-by-hop headers (and those `Connection` names, except `Host` and
/// `Content-Length`).
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    // Most messages carry none: one pass over the names, no hashing, decides.
    if !h.keys().any(|n| HOP_BY_HOP.contains(n)) {
        return;
    }
    // `Connection: close, host` must not make the request lose its Host: end-to-end headers
    // the proxy relies on are never removed through `Connection`.
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .filter(|n| *n != header::HOST && *n != header::CONTENT_LENGTH)
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
}

fn problem(status: StatusCode, detail: &str) -> Response<ProxyBody> {
    let r: Response<String> = weir_tower::problem::problem(status, detail);
    r.map(|s| Full::new(Bytes::from(s)).map_err(|e| match e {}).boxed())
}

impl Forward {
    async fn forward(self, req: Request<ClientBody>) -> Response<ProxyBody> {
        let to = &*self.to;
        // A body's first bytes before any upstream slot (see `ahead`): a slow body holds none.
        let req = if is_bodiless(&req) || !req.headers().contains_key(header::CONTENT_LENGTH) {
            // Nothing to read, or a stream of unknown length (a gRPC or chunked stream may
            // wait for the answer before sending more): passed on as it comes.
            req.map(weir_tower::cost::ReplayBody::whole)
        } else {
            let (parts, body) = req.into_parts();
            match ahead::read_ahead(body, to.pace, self.budget.as_ref()).await {
                Ok(body) => Request::from_parts(parts, body),
                Err(e) => return body_failed(to, &*e),
            }
        };
        let address: Result<Option<AddressSlot>, ()> = match &self.peer {
            Some(p) => {
                // Behind a trusted proxy (a load balancer), the client it names.
                let ip = match &self.rules {
                    Some(r) => r.client_ip(p.ip, req.headers()),
                    None => p.ip,
                };
                to.per_address.try_acquire(ip).map(Some).ok_or(())
            }
            None => Ok(None),
        };
        let permits = match (
            to.total.clone().try_acquire_owned(),
            self.per_client.clone().try_acquire_owned(),
            address,
        ) {
            (Ok(a), Ok(b), Ok(c)) => UpstreamPermits(a, b, c),
            _ => {
                to.stats.upstream_busy.fetch_add(1, Ordering::Relaxed);
                let mut r = problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too many requests in flight to the upstream",
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return r;
            }
        };
        let head_request = req.method() == http::Method::HEAD;
        // The body must keep arriving while it streams to the upstream.
        let pace = to.pace;
        let mut req = req.map(|b| PacedBody::new(b, pace));
        // Shared with the request's URI (no copy).
        let path = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        // A blocked request whose route falls back to another upstream goes there.
        let fallback = req
            .extensions()
            .get::<weir_tower::rules::Degraded>()
            .and_then(|d| d.upstream.as_ref());
        let base = match fallback {
            Some(u) => match u.parse::<Uri>() {
                Ok(u) => u,
                Err(_) => return problem(StatusCode::BAD_GATEWAY, "bad fallback upstream"),
            },
            None => to.upstream.clone(),
        };
        let mut parts = base.into_parts();
        parts.path_and_query = Some(path);
        let Ok(uri) = Uri::from_parts(parts) else {
            return problem(StatusCode::BAD_REQUEST, "cannot build the upstream URL");
        };
        if !req.headers().contains_key(header::HOST) {
            // h2 requests carry the host in :authority.
            if let Some(v) = req
                .uri()
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            {
                req.headers_mut().insert(header::HOST, v);
            }
        }
        strip_hop_by_hop(req.headers_mut());
        if let Some(p) = &self.peer {
            append_forwarded_for(req.headers_mut(), &p.text);
        }
        let version = req.version();
        append_hop(req.headers_mut(), &to.hops.of(version));
        *req.uri_mut() = uri;
        let grpc = req
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let h2 = match to.protocol {
            UpstreamProtocol::Auto => req.version() == Version::HTTP_2 && grpc,
            UpstreamProtocol::Http1 => false,
            UpstreamProtocol::H2c => true,
        };
        let sent = if !h2 && is_bodiless(&req) {
            // The common case: no body to stream, on this task (see `h1_client`).
            *req.version_mut() = Version::HTTP_11;
            let (head, _) = req.into_parts();
            tokio::time::timeout(to.timeout, async {
                let r = to.bodiless.send(&head).await?;
                Ok::<_, crate::net::conn::BoxError>(
                    r.map(|b| b.map_err(crate::net::conn::BoxError::from).boxed()),
                )
            })
            .await
        } else {
            let client = if h2 {
                *req.version_mut() = Version::HTTP_2;
                // HTTP/2 carries the authority in the URI; a Host header would be a duplicate.
                req.headers_mut().remove(header::HOST);
                &to.h2c
            } else {
                *req.version_mut() = Version::HTTP_11;
                &to.http1
            };
            tokio::time::timeout(to.timeout, async {
                let r = client.request(req).await?;
                Ok::<_, crate::net::conn::BoxError>(
                    r.map(|b| b.map_err(crate::net::conn::BoxError::from).boxed()),
                )
            })
            .await
        };
        match sent {
            Ok(Ok(mut r)) => {
                to.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                strip_hop_by_hop(r.headers_mut());
                weir_tower::body::HeldBody::wrap(r, Some(permits), head_request).map(BodyExt::boxed)
            }
            Ok(Err(e)) if too_slow(&*e).is_some() => body_failed(to, &*e),
            Ok(Err(e)) => {
                to.stats
                    .upstream_unreachable
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(upstream = %to.upstream, error = %e, "upstream failed");
                let hint = if h2 {
                    " (spoken to over h2c: if the upstream only speaks HTTP/1.1, run with \
                     --upstream-protocol http1)"
                } else {
                    ""
                };
                problem(
                    StatusCode::BAD_GATEWAY,
                    &format!(
                        "upstream {} failed: {}{hint}",
                        to.upstream,
                        error_chain(&*e)
                    ),
                )
            }
            Err(_) => {
                to.stats.upstream_timeout.fetch_add(1, Ordering::Relaxed);
                problem(
                    StatusCode::GATEWAY_TIMEOUT,
                    &format!(
                        "upstream {} sent no response within {} ms",
                        to.upstream,
                        to.timeout.as_millis()
                    ),
                )
            }
        }
    }
}

/// Whether `req` has no body to send: its body has ended and it states none.
fn is_bodiless<B: http_body::Body>(req: &Request<B>) -> bool {
    req.body().is_end_stream()
        && req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_none_or(|v| v.as_bytes() == b"0")
}

/// The answer to a request whose body failed: 408 (the connection closed) when it was too
/// slow, else 400.
fn body_failed(to: &ForwardTo, e: &(dyn std::error::Error + 'static)) -> Response<ProxyBody> {
    let (status, why) = match too_slow(e) {
        Some(t) => {
            to.stats.body_too_slow.fetch_add(1, Ordering::Relaxed);
            (StatusCode::REQUEST_TIMEOUT, t.to_string())
        }
        None => (
            StatusCode::BAD_REQUEST,
            format!("request body: {}", error_chain(e)),
        ),
    };
    let mut r = problem(status, &why);
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The request body's [`paced::TooSlow`], if that is what failed the upstream request.
fn too_slow<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a paced::TooSlow> {
    let mut source = Some(e);
    while let Some(c) = source {
        if let Some(t) = c.downcast_ref::<paced::TooSlow>() {
            return Some(t);
        }
        source = c.source();
    }
    None
}

/// `error: cause: cause` on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

/// Appends this hop to `Via` (RFC 9110 §7.6.3): `1.1 weir-<token>`.
pub fn append_via(h: &mut HeaderMap, version: Version, token: &HeaderValue) {
    append_hop(h, &ViaHops::new(token).of(version));
}

/// This process's hop in `Via` for each request version, built once.
#[derive(Clone)]
struct ViaHops([HeaderValue; 3]);

impl ViaHops {
    fn new(token: &HeaderValue) -> Self {
        let token = token.to_str().unwrap_or("weir");
        let hop = |proto: &str| {
            HeaderValue::from_str(&format!("{proto} {token}"))
                .unwrap_or(HeaderValue::from_static("1.1 weir"))
        };
        Self([hop("1.0"), hop("1.1"), hop("2")])
    }

    fn of(&self, version: Version) -> HeaderValue {
        self.0[match version {
            Version::HTTP_10 => 0,
            Version::HTTP_2 => 2,
            _ => 1,
        }]
        .clone()
    }
}

/// Appends `hop` to `Via`: the hop alone (no copy) when the request has none.
fn append_hop(h: &mut HeaderMap, hop: &HeaderValue) {
    let value = match h.get(header::VIA).map(HeaderValue::as_bytes) {
        None => {
            h.insert(header::VIA, hop.clone());
            return;
        }
        Some(prev) => [prev, b", ", hop.as_bytes()].concat(),
    };
    if let Ok(v) = HeaderValue::from_bytes(&value) {
        h.insert(header::VIA, v);
    }
}

/// Appends the client's address (`ip`, as text) to `X-Forwarded-For`: the address alone (no
/// copy) when the request has none (or one that is not text).
fn append_forwarded_for(h: &mut HeaderMap, ip: &HeaderValue) {
    let value = match h.get(X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        None => {
            h.insert(X_FORWARDED_FOR, ip.clone());
            return;
        }
        Some(prev) => [prev.as_bytes(), b", ", ip.as_bytes()].concat(),
    };
    if let Ok(v) = HeaderValue::from_bytes(&value) {
        h.insert(X_FORWARDED_FOR, v);
    }
}

/// The checks made before anything else (rules included): requests a careful proxy refuses
/// ([`refuse`]) are answered here and never charged to a limit.
#[derive(Clone)]
struct Precheck<S> {
    inner: S,
    via: HeaderValue,
    stats: Arc<ProxyStats>,
}

impl<S, B> Service<Request<Incoming>> for Precheck<S>
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes, Error = crate::net::conn::BoxError> + Send + Sync + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        if let Some((status, why)) = refuse(&req, &self.via) {
            if status == StatusCode::LOOP_DETECTED {
                self.stats.loops.fetch_add(1, Ordering::Relaxed);
            }
            let mut r = problem(status, why);
            if status == StatusCode::METHOD_NOT_ALLOWED {
                r.headers_mut().insert(
                    header::ALLOW,
                    HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
                );
            }
            return Box::pin(std::future::ready(Ok(r)));
        }
        let call = self.inner.call(req);
        Box::pin(async move {
            let r = call.await?;
            Ok(r.map(BodyExt::boxed))
        })
    }
}

impl Service<Request<ClientBody>> for Forward {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ClientBody>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}

/// The upstream side of the proxy: one upstream, or a primary with a gutter.
#[derive(Clone)]
enum Upstreams {
    One(Box<Forward>),
    /// Boxed: two upstream clients.
    Gutter(Box<weir_tower::gutter::Gutter<Forward, Forward>>),
}

impl Service<Request<ClientBody>> for Upstreams {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ClientBody>) -> Self::Future {
        use weir_tower::gutter::GutterError;
        match self {
            Upstreams::One(f) => f.call(req),
            Upstreams::Gutter(g) => {
                let fut = g.call(req);
                Box::pin(async move {
                    Ok(match fut.await {
                        Ok(r) => r,
                        Err(GutterError::Inner(never)) => match never {},
                        Err(GutterError::Rejected { retry_after }) => {
                            let mut r = problem(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "the upstream and its gutter are both unavailable",
                            );
                            let secs = weir_tower::problem::ceil_secs(retry_after).max(1);
                            r.headers_mut()
                                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
                            r
                        }
                    })
                })
            }
        }
    }
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

fn setting(e: impl std::fmt::Display) -> StartError {
    StartError::Setting(e.to_string())
}

fn file(e: impl std::fmt::Display) -> StartError {
    StartError::File(e.to_string())
}

/// A proxy ready to serve: its rules loaded and watched, its leases started, its upstream
/// clients made. [`Proxy::build`] from [`Settings`], [`Proxy::connect_store`], then
/// [`Proxy::serve`] on listeners the caller opened ([`bind_shared`] for the clients' one, so
/// that every worker thread listens on its own) and [`Proxy::release_leases`] once stopped.
pub struct Proxy {
    rules: Arc<Rules<weir_core::AnyClock>>,
    quota: Option<weir_quota::net::LeaseClient>,
    stats: Arc<ProxyStats>,
    dashboard: Arc<weir_tower::dashboard::Dashboard>,
    forward: Forward,
    gutter: Option<Forward>,
    switch_file: PathBuf,
    settings: Settings,
    _watcher: Watcher,
}

impl Proxy {
    /// Loads the rule file (and the switch states saved beside it), starts the leases of its
    /// cluster rules and the file's watcher, and makes the upstream clients.
    pub fn build(s: Settings) -> Result<Self, StartError> {
        let upstream = parse_upstream(&s.upstream).map_err(setting)?;
        if crate::net::points_at(&upstream, s.listen) {
            return Err(setting(format_args!(
                "--upstream {} is this proxy's own --listen address: every request would loop",
                s.upstream
            )));
        }
        let (rules, switch_file) = load_rules(&s)?;
        let quota = lease_client(&s, &rules)?;
        let stats = Arc::new(ProxyStats::default());
        let dashboard = weir_tower::dashboard::Dashboard::for_rules(
            "weir proxy",
            rules.clone(),
            Some(s.rules.clone()),
        );
        let watcher = watch_rules(&s, &rules, quota.clone(), &dashboard, &stats)?;
        let forward = primary(&s, upstream, &stats);
        let gutter = gutter(&s, &forward, &stats)?;
        Ok(Self {
            rules,
            quota,
            stats,
            dashboard,
            forward,
            gutter,
            switch_file,
            settings: s,
            _watcher: watcher,
        })
    }

    /// Serves clients on `listener` and, when given, the dashboard, `/metrics` and the switch
    /// API on `admin`, until `shutdown` says stop and the connections have finished.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        admin: Option<tokio::net::TcpListener>,
        shutdown: crate::net::accept::Shutdown,
    ) {
        let s = &self.settings;
        // Budget counts are written while serving and once more on the way out (awaited
        // below, so a stopped proxy has saved them).
        let keeping = tokio::spawn(budget_file::keep(
            self.rules.clone(),
            budget_file::state_path(&s.rules),
            shutdown.clone(),
        ));
        if let Some(admin) = admin {
            self.dashboard.spawn_sampler();
            tokio::spawn(serve_admin(
                admin,
                Admin {
                    rules: self.rules.clone(),
                    stats: self.stats.clone(),
                    dashboard: self.dashboard.clone(),
                    token: s.admin_token.clone(),
                    switch_file: self.switch_file.clone(),
                },
                s.limits.timeouts,
                shutdown.clone(),
            ));
        }
        let (forward, gutter) = (self.forward.clone(), self.gutter.clone());
        let layer = RulesLayer::new(self.rules.clone());
        // JSON request bodies are read first only while a rule takes its estimate from one.
        // Only for routes whose resource takes its estimate from the body, and within the
        // budgets every connection draws on.
        let routes = layer.clone();
        let read_json = weir_tower::cost::ReadJsonLayer::new(
            move |parts| routes.reads_request_json(parts),
            s.body_pace.idle,
        );
        let budget = crate::net::budget::Budget::new(crate::net::budget::BodyLimits {
            total: s.max_buffered_bytes,
            ..crate::net::budget::BodyLimits::default()
        });
        // One worker thread per core, each a current-thread runtime with its own listener
        // (SO_REUSEPORT) and upstream pools: a request is served start to end on one thread,
        // without cross-thread wake-ups (docs/proxy.md, "Where the time goes").
        let (limits, workers) = (s.limits, s.workers.max(1));
        let slots = crate::net::accept::Slots::new(limits.max_connections);
        let local = listener.local_addr().ok();
        let Ok(given) = listener.into_std() else {
            keeping.abort();
            return;
        };
        let mut given = Some(given);
        let mut done = Vec::with_capacity(workers);
        for i in 0..workers {
            // The first worker takes the given listener; the others a listener of their own
            // when the given one allows sharing its address, else a handle on the given one.
            // (No handle stays here: on shutdown the workers' closing is the listener's.)
            let std_listener = if i == 0 {
                None
            } else {
                local.and_then(|addr| listener_beside(addr).ok())
            };
            let std_listener = match (std_listener, given.as_ref()) {
                (Some(l), _) => l,
                (None, Some(g)) if i + 1 < workers => match g.try_clone() {
                    Ok(l) => l,
                    Err(_) => continue,
                },
                (None, _) => match given.take() {
                    Some(g) => g,
                    None => continue,
                },
            };
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            done.push(rx);
            let worker = Worker {
                forward: forward.with_own_pools(s),
                gutter: gutter.as_ref().map(|g| g.with_own_pools(s)),
                layer: layer.clone(),
                read_json: read_json.clone(),
                budget: budget.clone(),
            };
            let (slots, shutdown) = (slots.clone(), shutdown.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("weir-proxy-{i}"))
                .spawn(move || {
                    worker.run(std_listener, slots, limits.timeouts, shutdown);
                    let _ = tx.send(());
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a proxy worker thread");
            }
        }
        // A listener no worker took (they all have their own) closes now.
        drop(given);
        for rx in done {
            let _ = rx.await;
        }
        let _ = keeping.await;
    }

    /// Connects the shared store (`--store`), where `shared: true` rules count from then on.
    /// A store that cannot be reached at start is an error (a Redis Cluster is not: its
    /// rules' local fallbacks decide until it answers); later outages fall back the same way.
    pub async fn connect_store(&self) -> Result<(), StartError> {
        let Some(url) = &self.settings.store else {
            return Ok(());
        };
        let limiter = weir_redis::RedisLimiter::connect(url, weir_redis::RedisConfig::default())
            .await
            .map_err(|e| StartError::Store(format!("--store {url:?}: {e}")))?;
        let keys = 100_000;
        self.rules.set_shared(shared::RedisShared::new(
            limiter,
            self.settings.instances,
            keys,
        ));
        Ok(())
    }

    /// The upstream requests go to.
    pub fn upstream(&self) -> &Uri {
        &self.forward.to.upstream
    }

    /// The gutter upstream refused and failing requests go to, if any.
    pub fn gutter(&self) -> Option<&Uri> {
        self.gutter.as_ref().map(|g| &g.to.upstream)
    }

    /// The rule file.
    pub fn rules_file(&self) -> &std::path::Path {
        &self.settings.rules
    }

    /// Gives the cluster rules' leases back, so that other proxies get the capacity at once.
    pub async fn release_leases(&self) {
        if let Some(q) = &self.quota {
            q.clone().shutdown().await;
        }
    }
}

/// The rule file's rules on `--clock`, with the switch states saved beside it (set over the
/// admin API before a restart); answers the switch state file too.
fn load_rules(s: &Settings) -> Result<(Arc<Rules<weir_core::AnyClock>>, PathBuf), StartError> {
    let set = weir_rules::watch::load(&s.rules).map_err(file)?;
    if set.http.as_ref().is_none_or(|h| h.routes.is_empty()) {
        tracing::warn!(
            file = %s.rules.display(),
            "the rule file has no http.routes: every request passes unlimited"
        );
    }
    let clock = s
        .clock
        .build()
        .map_err(|e| setting(format_args!("--clock: {e}")))?;
    let rules = Rules::with_clock(&set, clock)
        .map_err(|e| file(format_args!("{}: {e}", s.rules.display())))?;
    let switch_file = switches::state_path(&s.rules);
    let saved = switches::load(&switch_file).map_err(file)?;
    if !saved.is_empty() {
        tracing::info!(file = %switch_file.display(), "switch states restored: {saved:?}");
        rules.restore_switches(&saved);
    }
    let budget_file = budget_file::state_path(&s.rules);
    let restored = budget_file::restore(&rules, &budget_file).map_err(file)?;
    if restored > 0 {
        tracing::info!(file = %budget_file.display(), "budget counts restored: {restored}");
    }
    Ok((Arc::new(rules), switch_file))
}

/// The lease client of the rules' cluster resources (none without cluster rules; an error
/// without `--quota-server`).
fn lease_client(
    s: &Settings,
    rules: &Rules<weir_core::AnyClock>,
) -> Result<Option<weir_quota::net::LeaseClient>, StartError> {
    let cluster = rules.cluster_resources();
    match (&s.quota_server, cluster.is_empty()) {
        (_, true) => Ok(None),
        (None, false) => {
            let names: Vec<&str> = cluster.iter().map(|(n, _)| n.as_str()).collect();
            Err(setting(format_args!(
                "{}: cluster flow rules ({}) need --quota-server http://HOST:PORT",
                s.rules.display(),
                names.join(", ")
            )))
        }
        (Some(server), false) => {
            let mut b = weir_quota::net::LeaseClient::builder(server, &s.quota_client_id)
                .token(s.quota_token.clone());
            for (name, safe) in &cluster {
                b = b.resource(name, *safe);
            }
            let client = b
                .start()
                .map_err(|e| setting(format_args!("--quota-server: {e}")))?;
            rules.set_cluster(client.clone());
            Ok(Some(client))
        }
    }
}

/// Applies the rule file's changes as they come: new cluster resources are leased too, the
/// dashboard and the counters see each outcome.
fn watch_rules(
    s: &Settings,
    rules: &Arc<Rules<weir_core::AnyClock>>,
    leases: Option<weir_quota::net::LeaseClient>,
    dashboard: &Arc<weir_tower::dashboard::Dashboard>,
    stats: &Arc<ProxyStats>,
) -> Result<Watcher, StartError> {
    let (reloaded, file, dash, st) = (
        rules.clone(),
        s.rules.clone(),
        dashboard.clone(),
        stats.clone(),
    );
    Watcher::start(rules.clone(), s.rules.clone(), s.reload_interval, move |e| {
        match e {
            Event::Applied => {
                // Cluster resources new in this file are leased too; without a quota server
                // their rules enforce their safe capacity.
                for (name, safe) in reloaded.cluster_resources() {
                    match &leases {
                        Some(q) => {
                            q.add_resource(&name, safe);
                        }
                        None => tracing::warn!(
                            file = %file.display(),
                            "cluster resource {name:?} without --quota-server: enforcing its safe capacity ({safe}/s) locally"
                        ),
                    }
                }
                dash.note_reload(Ok(()));
                st.reloads_applied.fetch_add(1, Ordering::Relaxed)
            }
            // The watcher logged it (one warning line with file, line and column).
            Event::Rejected(e) => {
                dash.note_reload(Err(e.to_string()));
                st.reloads_rejected.fetch_add(1, Ordering::Relaxed)
            }
        };
    })
    .map_err(StartError::Watcher)
}

/// What one worker thread serves clients with.
struct Worker {
    forward: Forward,
    gutter: Option<Forward>,
    layer: RulesLayer<weir_core::AnyClock>,
    read_json: weir_tower::cost::ReadJsonLayer,
    /// The process's budget of read request bytes (shared by every worker).
    budget: Arc<crate::net::budget::Budget>,
}

impl Worker {
    /// Serves `listener` on this thread's own current-thread runtime until `shutdown` says
    /// stop and its connections have ended (those of every worker: `slots` are shared).
    fn run(
        self,
        listener: std::net::TcpListener,
        slots: crate::net::accept::Slots,
        timeouts: crate::net::conn::Timeouts,
        shutdown: crate::net::accept::Shutdown,
    ) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot start a proxy worker's runtime");
                return;
            }
        };
        runtime.block_on(async move {
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "a proxy worker cannot use its listener");
                    return;
                }
            };
            let Worker {
                forward,
                gutter,
                layer,
                read_json,
                budget,
            } = self;
            // Idle upstream connections close on their age or the upstream's close even when no
            // request comes to take them.
            tokio::spawn(forward.to.bodiless.clone().keep_pruned());
            if let Some(g) = &gutter {
                tokio::spawn(g.to.bodiless.clone().keep_pruned());
            }
            crate::net::accept::serve_in(
                listener,
                &slots,
                "proxy",
                shutdown,
                move |stream, peer, sd, conn| {
                    let conn_budget = budget.connection();
                    let read_json = read_json.clone().with_budget(conn_budget.clone());
                    let svc = client_service(
                        &forward,
                        gutter.as_ref(),
                        &layer,
                        &read_json,
                        &conn_budget,
                        peer,
                    );
                    crate::net::accept::serve_http(stream, svc, timeouts, sd, conn)
                },
            )
            .await;
        });
    }
}

/// A listener on `addr` beside one already there (SO_REUSEPORT: the kernel spreads new
/// connections among them); fails when that one does not share its address.
fn listener_beside(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    bind_shared(addr)?.into_std()
}

/// A listener on `addr` whose address other listeners of this process may share
/// (SO_REUSEPORT), one per worker thread.
pub fn bind_shared(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// hyper's pooled client, for requests with a body and h2c.
type PooledClient = Client<HttpConnector, PacedBody<weir_tower::cost::ReplayBody<ClientBody>>>;

/// Clients to an upstream with idle connections of their own: bodiless HTTP/1.1, pooled
/// HTTP/1.1 and h2c.
fn clients(s: &Settings) -> (h1_client::H1Client, PooledClient, PooledClient) {
    // A worker keeps idle as many connections as its share of the requests in flight may
    // use: fewer, and a steady load larger than the idle set would close connections only to
    // open new ones.
    let share = s.max_upstream_requests.div_ceil(s.workers.max(1));
    let bodiless = h1_client::H1Client::new(
        share.max(MAX_IDLE_UPSTREAM),
        Duration::from_secs(60),
        s.upstream_timeout,
    );
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(s.upstream_timeout));
    let http1 = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(MAX_IDLE_UPSTREAM)
        .build(connector.clone());
    let h2c = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(MAX_IDLE_UPSTREAM)
        .http2_only(true)
        .build(connector);
    (bodiless, http1, h2c)
}

impl Forward {
    /// The same forwarder (its bounds shared) with connection pools of its own (a worker
    /// thread's: pooled connections are driven by the runtime that opened them).
    fn with_own_pools(&self, s: &Settings) -> Self {
        let (bodiless, http1, h2c) = clients(s);
        Self {
            to: Arc::new(ForwardTo {
                bodiless,
                http1,
                h2c,
                ..(*self.to).clone()
            }),
            per_client: self.per_client.clone(),
            peer: self.peer.clone(),
            budget: self.budget.clone(),
            rules: self.rules.clone(),
        }
    }
}

/// The forwarder to the upstream: pooled HTTP/1.1 and h2c clients and the bounds on requests
/// in flight.
fn primary(s: &Settings, upstream: Uri, stats: &Arc<ProxyStats>) -> Forward {
    let (bodiless, http1, h2c) = clients(s);
    let via = via_token(s.listen);
    Forward {
        to: Arc::new(ForwardTo {
            bodiless,
            http1,
            h2c,
            protocol: s.upstream_protocol,
            upstream,
            timeout: s.upstream_timeout,
            stats: stats.clone(),
            hops: ViaHops::new(&via),
            via,
            total: Arc::new(Semaphore::new(s.max_upstream_requests.max(1))),
            per_address: AddressSlots::new(s.max_upstream_per_address),
            pace: s.body_pace,
        }),
        per_client: Arc::new(Semaphore::new(MAX_UPSTREAM_PER_CLIENT)),
        peer: None,
        budget: None,
        rules: None,
    }
}

/// The forwarder to `--gutter`, its breakers and bounds shared through `stats` (none without
/// a gutter).
fn gutter(
    s: &Settings,
    primary: &Forward,
    stats: &ProxyStats,
) -> Result<Option<Forward>, StartError> {
    let Some(url) = &s.gutter else {
        return Ok(None);
    };
    let uri = parse_upstream(url).map_err(|e| setting(e.replace("--upstream", "--gutter")))?;
    let lane = |max: usize| weir_tower::gutter::LaneConfig {
        breaker: s.upstream_breaker.clone(),
        max_in_flight: max.max(1) as u64,
    };
    let g = weir_tower::gutter::Gutter::new(
        (),
        (),
        &lane(s.max_upstream_requests),
        &lane(s.gutter_max_requests),
    )
    .map_err(|e| setting(format_args!("--upstream-breaker: {e}")))?;
    let _ = stats.gutter.set(g);
    Ok(Some(Forward {
        to: Arc::new(ForwardTo {
            upstream: uri,
            total: Arc::new(Semaphore::new(s.gutter_max_requests.max(1))),
            ..(*primary.to).clone()
        }),
        per_client: primary.per_client.clone(),
        peer: None,
        budget: None,
        rules: None,
    }))
}

/// The service of one client connection from `peer`: the rules, then the upstream (or the
/// gutter), with this connection's own bound on upstream requests in flight.
fn client_service(
    forward: &Forward,
    gutter: Option<&Forward>,
    layer: &RulesLayer<weir_core::AnyClock>,
    read_json: &weir_tower::cost::ReadJsonLayer,
    budget: &Arc<crate::net::budget::ConnectionBudget>,
    peer: SocketAddr,
) -> impl Service<
    Request<Incoming>,
    Response = Response<ProxyBody>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + 'static {
    let per_client = Arc::new(Semaphore::new(MAX_UPSTREAM_PER_CLIENT));
    let client = Peer::new(peer.ip());
    let primary = Forward {
        per_client: per_client.clone(),
        peer: Some(client.clone()),
        budget: Some(budget.clone()),
        rules: Some(layer.clone()),
        ..forward.clone()
    };
    let via = primary.to.via.clone();
    let stats = primary.to.stats.clone();
    let forward = match (gutter, stats.gutter.get()) {
        (Some(g), Some(shared)) => Upstreams::Gutter(Box::new(shared.with_services(
            primary,
            Forward {
                per_client,
                peer: Some(client),
                budget: Some(budget.clone()),
                rules: Some(layer.clone()),
                ..g.clone()
            },
        ))),
        _ => Upstreams::One(Box::new(primary)),
    };
    let rules = ServiceBuilder::new()
        .map_request(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(PeerAddr(peer));
            req
        })
        .layer(read_json.clone())
        .layer(layer.clone())
        .service(forward);
    Precheck {
        inner: rules,
        via,
        stats,
    }
}

/// Idle pooled connections kept to the upstream per worker (for bodiless requests: at least
/// this many, or the worker's share of `--max-upstream-requests`).
pub const MAX_IDLE_UPSTREAM: usize = 256;

/// Most connections to the admin listener at once.
pub const ADMIN_CONNECTIONS: usize = 64;

/// What the admin listener serves.
struct Admin {
    rules: Arc<Rules<weir_core::AnyClock>>,
    stats: Arc<ProxyStats>,
    dashboard: Arc<weir_tower::dashboard::Dashboard>,
    token: Option<String>,
    switch_file: PathBuf,
}

async fn serve_admin(
    listener: tokio::net::TcpListener,
    admin: Admin,
    timeouts: crate::net::conn::Timeouts,
    shutdown: crate::net::accept::Shutdown,
) {
    use axum::routing::get;
    use weir_tower::dashboard;
    let Admin {
        rules,
        stats,
        dashboard: dash,
        token,
        switch_file,
    } = admin;
    let mut data = axum::Router::new();
    if token.is_some() {
        // Changes need the token: without one the routes do not exist.
        data = data.merge(switches::routes(switches::Switches {
            rules: rules.clone(),
            path: switch_file,
            changes: stats.switch_changes.clone(),
            lock: Default::default(),
        }));
    }
    let registry = Arc::new(crate::admin::metrics::Metrics::new());
    registry.register(metrics::ProxyCollector { rules, stats });
    let data = data
        .route(
            "/metrics",
            get(move || {
                let text = registry.render();
                async move {
                    (
                        [(header::CONTENT_TYPE, crate::admin::metrics::CONTENT_TYPE)],
                        text,
                    )
                }
            }),
        )
        .merge(dash.api_router());
    let app = dashboard::require_bearer(data, token.as_deref())
        .merge(dashboard::page_router())
        .route("/healthz", get(|| async { "ok\n" }));
    // A handful of scrapers and probes at most: a small cap keeps a connection flood off the
    // proxy; at the cap the connection idle the longest makes room, so health checks get in.
    crate::net::accept::serve(
        listener,
        ADMIN_CONNECTIONS,
        "admin",
        shutdown,
        move |stream, _, sd, conn| {
            crate::net::accept::serve_http(stream, app.clone(), timeouts, sd, conn)
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_go_host_and_length_stay() {
        let mut h = map(&[
            ("host", "a"),
            ("content-length", "0"),
            ("connection", "close, x-secret, host"),
            ("connection", "content-length"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authenticate", "Basic"),
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("accept", "*/*"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(
            h,
            map(&[("host", "a"), ("content-length", "0"), ("accept", "*/*")])
        );
        // Each hop-by-hop header alone is found too.
        for n in HOP_BY_HOP {
            let mut h = map(&[("accept", "*/*"), (n.as_str(), "x")]);
            strip_hop_by_hop(&mut h);
            assert_eq!(h, map(&[("accept", "*/*")]), "{n}");
        }
        // A message with none is left as it is.
        let plain = map(&[("host", "a"), ("x-forwarded-for", "10.0.0.1")]);
        let mut h = plain.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, plain);
    }

    #[test]
    fn the_client_address_joins_x_forwarded_for() {
        let ip = Peer::new("10.0.0.2".parse().unwrap()).text;
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, &ip);
        assert_eq!(h[X_FORWARDED_FOR], "10.0.0.2");
        append_forwarded_for(&mut h, &ip);
        assert_eq!(h[X_FORWARDED_FOR], "10.0.0.2, 10.0.0.2");
        let v6 = Peer::new("2001:db8::1".parse().unwrap()).text;
        let mut h = map(&[("x-forwarded-for", "1.2.3.4")]);
        append_forwarded_for(&mut h, &v6);
        assert_eq!(h[X_FORWARDED_FOR], "1.2.3.4, 2001:db8::1");
    }
}
