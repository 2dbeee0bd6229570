//! Forwarding to the upstream (and the gutter): the upstream clients, the bounds in flight
//! (total, per client connection, per client address), timeouts, paced bodies and the answers
//! the proxy writes when the upstream fails.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Service, ServiceBuilder};
use weir_core::concurrency::{ConcurrencyLimiter, Permit};
use weir_tower::key::PeerAddr;
use weir_tower::rules::RulesLayer;

use super::headers::{
    append_forwarded_for, append_hop, refuse, strip_hop_by_hop, via_token, Peer, ViaHops,
};
use super::metrics::ProxyStats;
use super::paced::PacedBody;
use super::settings::{parse_upstream, setting, Settings, StartError, UpstreamProtocol};
use super::slots::{AddressSlot, AddressSlots};
use super::{ahead, h1_client, paced};
use http_body_util::combinators::BoxBody;

/// A body from the upstream or one the proxy wrote.
pub(super) type ProxyBody = BoxBody<Bytes, crate::net::conn::BoxError>;

/// A client's request body past the rules: as it came, or with its first bytes read for a
/// cost estimate ([`weir_tower::cost::ReadJsonLayer`]).
pub(super) type ClientBody = weir_tower::cost::ReplayBody<Incoming>;

/// Most upstream requests in flight for one client connection (an h2c client multiplexing
/// hundreds of streams would otherwise open as many HTTP/1.1 upstream connections).
pub const MAX_UPSTREAM_PER_CLIENT: usize = 64;

/// Forwards requests to the upstream: what a worker's client connections share, and the
/// connection's own bound. Two reference counts to clone (the service stack clones it for
/// every request).
#[derive(Clone)]
pub(super) struct Forward {
    pub(super) to: Arc<ForwardTo>,
    /// Upstream requests in flight for this client connection.
    per_client: ConcurrencyLimiter,
    /// The client connection's peer (none in the workers' prototypes).
    peer: Option<Peer>,
    /// The connection's share of the bytes bodies may hold before their request takes an
    /// upstream slot (none in the workers' prototypes).
    budget: Option<Arc<crate::net::budget::ConnectionBudget>>,
    /// The rules: whose client address a request from a trusted proxy is.
    rules: Option<RulesLayer<weir_core::AnyClock>>,
}

/// The upstream side a worker's client connections share (see [`Forward`]).
#[derive(Clone)]
pub(super) struct ForwardTo {
    /// Bodiless requests over HTTP/1.1, on the calling task.
    pub(super) bodiless: h1_client::H1Client,
    pub(super) http1: PooledClient,
    pub(super) h2c: PooledClient,
    pub(super) protocol: UpstreamProtocol,
    pub(super) upstream: Uri,
    pub(super) timeout: Duration,
    pub(super) stats: Arc<ProxyStats>,
    /// This process's token in `Via`: a request carrying it has come round in a loop.
    pub(super) via: HeaderValue,
    /// Its hops in `Via`, per request version.
    pub(super) hops: ViaHops,
    /// Upstream requests in flight, all clients together.
    pub(super) total: ConcurrencyLimiter,
    /// Upstream requests in flight per client address.
    pub(super) per_address: Arc<AddressSlots>,
    /// How a request body must keep arriving.
    pub(super) pace: paced::Pace,
}

/// What an upstream request holds until its response body ends: its places in the total, the
/// client connection's and the client address's bounds.
pub(super) struct UpstreamPermits(
    #[allow(dead_code)] Permit,
    #[allow(dead_code)] Permit,
    #[allow(dead_code)] Option<AddressSlot>,
);

impl weir_tower::body::Held for UpstreamPermits {
    fn end(self, _: bool) {}
}

pub(super) fn problem(status: StatusCode, detail: &str) -> Response<ProxyBody> {
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
        let Some(permits) = self.permits(&req) else {
            return busy(to);
        };
        let head_request = req.method() == http::Method::HEAD;
        // The body must keep arriving while it streams to the upstream.
        let pace = to.pace;
        let mut req = req.map(|b| PacedBody::new(b, pace));
        let uri = match upstream_uri(to, &req) {
            Ok(u) => u,
            Err((status, why)) => return problem(status, why),
        };
        self.rewrite_headers(&mut req);
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
        answer(to, sent, permits, head_request, h2)
    }

    /// The places an upstream request takes (in all, on this client connection, for this
    /// client's address); `None` when one is full.
    fn permits<B>(&self, req: &Request<B>) -> Option<UpstreamPermits> {
        let to = &*self.to;
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
        match (
            to.total.try_acquire(1),
            self.per_client.try_acquire(1),
            address,
        ) {
            (Ok(a), Ok(b), Ok(c)) => Some(UpstreamPermits(a, b, c)),
            _ => None,
        }
    }

    /// The headers a proxy owns: `Host` from an h2 request's authority, hop-by-hop ones
    /// removed, the client in `X-Forwarded-For`, this hop in `Via`.
    fn rewrite_headers<B>(&self, req: &mut Request<B>) {
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
        append_hop(req.headers_mut(), &self.to.hops.of(version));
    }
}

/// The 503 of a request that found a bound on requests in flight full.
fn busy(to: &ForwardTo) -> Response<ProxyBody> {
    busy_text(to).map(|s| Full::new(Bytes::from(s)).map_err(|e| match e {}).boxed())
}

/// The 503 of a request that found a bound on requests in flight full (counted).
pub(super) fn busy_text(to: &ForwardTo) -> Response<String> {
    to.stats.upstream_busy.fetch_add(1, Ordering::Relaxed);
    let mut r = weir_tower::problem::problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "too many requests in flight to the upstream",
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Where the request goes: its path and query on the upstream, or on the fallback upstream
/// its route names when it was refused; the status and reason when that cannot be built.
fn upstream_uri<B>(to: &ForwardTo, req: &Request<B>) -> Result<Uri, (StatusCode, &'static str)> {
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
            Err(_) => return Err((StatusCode::BAD_GATEWAY, "bad fallback upstream")),
        },
        None => to.upstream.clone(),
    };
    let mut parts = base.into_parts();
    parts.path_and_query = Some(path);
    Uri::from_parts(parts).map_err(|_| (StatusCode::BAD_REQUEST, "cannot build the upstream URL"))
}

/// The client's answer to what the upstream did: its response (holding `permits` until the
/// body ends), or the proxy's own 408/502/504 saying why not.
fn answer(
    to: &ForwardTo,
    sent: Result<
        Result<Response<ProxyBody>, crate::net::conn::BoxError>,
        tokio::time::error::Elapsed,
    >,
    permits: UpstreamPermits,
    head_request: bool,
    h2: bool,
) -> Response<ProxyBody> {
    match sent {
        Ok(Ok(mut r)) => {
            to.stats.forwarded.add(1);
            strip_hop_by_hop(r.headers_mut());
            weir_tower::body::HeldBody::wrap(r, Some(permits), head_request).map(BodyExt::boxed)
        }
        Ok(Err(e)) if too_slow(&*e).is_some() => body_failed(to, &*e),
        Ok(Err(e)) => problem(StatusCode::BAD_GATEWAY, &unreachable(to, &*e, h2)),
        Err(_) => problem(StatusCode::GATEWAY_TIMEOUT, &timed_out(to)),
    }
}

/// Counts and logs an upstream that failed with `e` (spoken to over h2c when `h2`): the 502's
/// detail.
pub(super) fn unreachable(
    to: &ForwardTo,
    e: &(dyn std::error::Error + 'static),
    h2: bool,
) -> String {
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
    format!("upstream {} failed: {}{hint}", to.upstream, error_chain(e))
}

/// Counts an upstream that sent no response head in time: the 504's detail.
pub(super) fn timed_out(to: &ForwardTo) -> String {
    to.stats.upstream_timeout.fetch_add(1, Ordering::Relaxed);
    format!(
        "upstream {} sent no response within {} ms",
        to.upstream,
        to.timeout.as_millis()
    )
}

/// Whether `req` has no body to send: its body has ended and it states none.
pub(super) fn is_bodiless<B: http_body::Body>(req: &Request<B>) -> bool {
    req.body().is_end_stream()
        && req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_none_or(|v| v.as_bytes() == b"0")
}

/// The answer to a request whose body failed: 408 (the connection closed) when it was too
/// slow, else 400.
pub(super) fn body_failed(
    to: &ForwardTo,
    e: &(dyn std::error::Error + 'static),
) -> Response<ProxyBody> {
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
pub(super) fn too_slow<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a paced::TooSlow> {
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
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

/// The checks made before anything else (rules included): requests a careful proxy refuses
/// ([`refuse`]) are answered here and never charged to a limit.
#[derive(Clone)]
pub(super) struct Precheck<S> {
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
pub(super) enum Upstreams {
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

/// hyper's pooled client, for requests with a body and h2c.
pub(super) type PooledClient =
    Client<HttpConnector, PacedBody<weir_tower::cost::ReplayBody<ClientBody>>>;

/// Clients to an upstream with idle connections of their own: bodiless HTTP/1.1, pooled
/// HTTP/1.1 and h2c.
pub(super) fn clients(s: &Settings) -> (h1_client::H1Client, PooledClient, PooledClient) {
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
    pub(super) fn with_own_pools(&self, s: &Settings) -> Self {
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

/// At most `max` requests in flight (at least one), taken without waiting.
pub(super) fn bound(max: usize) -> ConcurrencyLimiter {
    let max = u64::try_from(max).unwrap_or(u64::MAX);
    ConcurrencyLimiter::bounded(std::num::NonZeroU64::new(max).unwrap_or(std::num::NonZeroU64::MIN))
}

/// The forwarder to the upstream: pooled HTTP/1.1 and h2c clients and the bounds on requests
/// in flight.
pub(super) fn primary(s: &Settings, upstream: Uri, stats: &Arc<ProxyStats>) -> Forward {
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
            total: bound(s.max_upstream_requests),
            per_address: AddressSlots::new(s.max_upstream_per_address),
            pace: s.body_pace,
        }),
        per_client: bound(MAX_UPSTREAM_PER_CLIENT),
        peer: None,
        budget: None,
        rules: None,
    }
}

/// The forwarder to `--gutter`, its breakers and bounds shared through `stats` (none without
/// a gutter).
pub(super) fn gutter(
    s: &Settings,
    primary: &Forward,
    stats: &ProxyStats,
) -> Result<Option<Forward>, StartError> {
    let Some(url) = &s.gutter else {
        return Ok(None);
    };
    let uri = parse_upstream(url)
        .map_err(|e| setting(e.to_string().replace("--upstream", "--gutter")))?;
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
            total: bound(s.gutter_max_requests),
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
pub(super) fn client_service(
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
    let per_client = bound(MAX_UPSTREAM_PER_CLIENT);
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
