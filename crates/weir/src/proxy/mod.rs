//! `weir proxy`: a reverse proxy applying a weir-rules file to every request.
//!
//! Accepts HTTP/1.1 and h2c (prior knowledge) on `--listen`, maps each request to a resource by
//! the rule file's `http.routes`, answers blocked requests itself (429 / 403 / 503 with
//! `Retry-After`, `RateLimit-*` and a problem body, see `weir_tower::rules`), and forwards the
//! rest to `--upstream` over pooled HTTP/1.1 connections. The rule file is re-read when it
//! changes (state kept; an invalid file is reported and the old rules stay). An unreachable
//! upstream gets 502, a slow one 504 after `--upstream-timeout`: never a hang. `--admin`
//! serves `/metrics` (Prometheus text) and `/healthz`.

mod prom;

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
use tower::{Service, ServiceBuilder};
use weir_rules::engine::Rules;
use weir_rules::watch::{Event, Watcher};
use weir_tower::key::PeerAddr;
use weir_tower::rules::RulesLayer;

/// What `weir proxy` was asked to do.
pub struct Settings {
    /// The rule file.
    pub rules: PathBuf,
    /// Where to accept requests.
    pub listen: SocketAddr,
    /// `http://HOST:PORT` of the upstream.
    pub upstream: String,
    /// Where to serve `/metrics` and `/healthz` (none: not served).
    pub admin: Option<SocketAddr>,
    /// Longest wait for the upstream's response head.
    pub upstream_timeout: Duration,
    /// How often the rule file is checked for changes.
    pub reload_interval: Duration,
    /// Client connections: how many at once, first-request and idle timeouts.
    pub limits: crate::accept::Limits,
    /// How to speak to the upstream.
    pub upstream_protocol: UpstreamProtocol,
    /// On SIGTERM or Ctrl-C, how long the requests in flight get to finish.
    pub drain_timeout: Duration,
}

/// The protocol spoken to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// As the client spoke: HTTP/2 (h2c) requests go out over h2c (gRPC needs it), HTTP/1.x
    /// over HTTP/1.1.
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
    reloads_applied: AtomicU64,
    reloads_rejected: AtomicU64,
}

/// A body from the upstream or one the proxy wrote.
type ProxyBody = BoxBody<Bytes, hyper::Error>;

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

/// Forwards requests to the upstream.
#[derive(Clone)]
struct Forward {
    http1: Client<HttpConnector, Incoming>,
    h2c: Client<HttpConnector, Incoming>,
    protocol: UpstreamProtocol,
    upstream: Uri,
    timeout: Duration,
    stats: Arc<ProxyStats>,
}

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
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
    async fn forward(self, mut req: Request<Incoming>) -> Response<ProxyBody> {
        let peer = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let mut parts = self.upstream.clone().into_parts();
        parts.path_and_query = path.parse().ok();
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
        if let Some(ip) = peer {
            append_forwarded_for(req.headers_mut(), ip);
        }
        *req.uri_mut() = uri;
        let h2 = match self.protocol {
            UpstreamProtocol::Auto => req.version() == Version::HTTP_2,
            UpstreamProtocol::Http1 => false,
            UpstreamProtocol::H2c => true,
        };
        let client = if h2 {
            *req.version_mut() = Version::HTTP_2;
            // HTTP/2 carries the authority in the URI; a Host header would be a duplicate.
            req.headers_mut().remove(header::HOST);
            &self.h2c
        } else {
            *req.version_mut() = Version::HTTP_11;
            &self.http1
        };
        match tokio::time::timeout(self.timeout, client.request(req)).await {
            Ok(Ok(mut r)) => {
                self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                strip_hop_by_hop(r.headers_mut());
                r.map(BodyExt::boxed)
            }
            Ok(Err(e)) => {
                self.stats
                    .upstream_unreachable
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(upstream = %self.upstream, error = %e, "upstream failed");
                problem(
                    StatusCode::BAD_GATEWAY,
                    &format!("upstream {} failed: {}", self.upstream, error_chain(&e)),
                )
            }
            Err(_) => {
                self.stats.upstream_timeout.fetch_add(1, Ordering::Relaxed);
                problem(
                    StatusCode::GATEWAY_TIMEOUT,
                    &format!(
                        "upstream {} sent no response within {} ms",
                        self.upstream,
                        self.timeout.as_millis()
                    ),
                )
            }
        }
    }
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

fn append_forwarded_for(h: &mut HeaderMap, ip: IpAddr) {
    let value = match h.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {ip}"),
        None => ip.to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        h.insert("x-forwarded-for", v);
    }
}

impl Service<Request<Incoming>> for Forward {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}

/// Runs the proxy until interrupted. Errors are one line; `Err((2, …))` for bad usage or
/// configuration.
pub async fn run(s: Settings) -> Result<(), (u8, String)> {
    let upstream = parse_upstream(&s.upstream).map_err(|e| (2, e))?;
    let set = weir_rules::watch::load(&s.rules).map_err(|e| (2, e.to_string()))?;
    if set.http.as_ref().is_none_or(|h| h.routes.is_empty()) {
        eprintln!(
            "weir proxy: warning: {} has no http.routes: every request passes unlimited",
            s.rules.display()
        );
    }
    let rules = Arc::new(Rules::new(&set).map_err(|e| (2, format!("{}: {e}", s.rules.display())))?);
    let stats = Arc::new(ProxyStats::default());
    let st = stats.clone();
    let _watcher = Watcher::start(
        rules.clone(),
        s.rules.clone(),
        s.reload_interval,
        move |e| {
            match e {
                Event::Applied => st.reloads_applied.fetch_add(1, Ordering::Relaxed),
                // The watcher logged it (one warning line with file, line and column).
                Event::Rejected(_) => st.reloads_rejected.fetch_add(1, Ordering::Relaxed),
            };
        },
    )
    .map_err(|e| (1, format!("cannot start the rule watcher: {e}")))?;
    let listener = tokio::net::TcpListener::bind(s.listen)
        .await
        .map_err(|e| (2, format!("cannot listen on {}: {e}", s.listen)))?;
    let admin = match s.admin {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| (2, format!("cannot listen for --admin on {addr}: {e}")))?,
        ),
        None => None,
    };
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(s.upstream_timeout));
    let http1 = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .build(connector.clone());
    let h2c = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .http2_only(true)
        .build(connector);
    let forward = Forward {
        http1,
        h2c,
        protocol: s.upstream_protocol,
        upstream: upstream.clone(),
        timeout: s.upstream_timeout,
        stats: stats.clone(),
    };
    let layer = RulesLayer::new(rules.clone());
    let local = listener.local_addr().map_or(s.listen, |a| a);
    println!(
        "weir proxy: http://{local} -> {upstream} (rules: {}{})",
        s.rules.display(),
        admin
            .as_ref()
            .and_then(|a| a.local_addr().ok())
            .map(|a| format!(", metrics: http://{a}/metrics"))
            .unwrap_or_default()
    );
    let (trigger, shutdown) = crate::accept::shutdown();
    if let Some(admin) = admin {
        tokio::spawn(serve_admin(
            admin,
            rules.clone(),
            stats.clone(),
            s.limits.timeouts,
            shutdown.clone(),
        ));
    }
    let limits = s.limits;
    let accept = crate::accept::serve(
        listener,
        limits.max_connections,
        "proxy",
        shutdown,
        move |stream, peer, sd, conn| {
            let svc = ServiceBuilder::new()
                .map_request(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(PeerAddr(peer));
                    req
                })
                .layer(layer.clone())
                .service(forward.clone());
            crate::accept::serve_http(stream, svc, limits.timeouts, sd, conn)
        },
    );
    crate::accept::run_until_stopped("weir proxy", accept, trigger, s.drain_timeout).await;
    Ok(())
}

/// Most connections to the admin listener at once.
pub const ADMIN_CONNECTIONS: usize = 64;

async fn serve_admin(
    listener: tokio::net::TcpListener,
    rules: Arc<Rules>,
    stats: Arc<ProxyStats>,
    timeouts: crate::conn::Timeouts,
    shutdown: crate::accept::Shutdown,
) {
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let text = prom::render(rules.snapshot(), &stats);
                async move { ([(header::CONTENT_TYPE, prom::CONTENT_TYPE)], text) }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }));
    // A handful of scrapers and probes at most: a small cap keeps a connection flood off the
    // proxy; at the cap the connection idle the longest makes room, so health checks get in.
    crate::accept::serve(
        listener,
        ADMIN_CONNECTIONS,
        "admin",
        shutdown,
        move |stream, _, sd, conn| {
            crate::accept::serve_http(stream, app.clone(), timeouts, sd, conn)
        },
    )
    .await;
}
