//! A weir-rules rule set as a tower layer: each request is mapped to a resource and a call
//! context (origin, criticality, parameters) by a [`Classify`] — the rule file's `http.routes`
//! ([`Routes`]) or a closure — then admitted by [`Rules::entry`].
//!
//! - Admitted: the inner service is called (after the wait of a paced rule); the guard is held
//!   by the response body and completed when the body ends (5xx or a body error = error), or
//!   dropped with it (a client that disconnects frees its slot).
//! - Blocked: flow and hot-parameter rules answer 429 with `Retry-After` (seconds, rounded up),
//!   `RateLimit-Policy` / `RateLimit` and a problem body; authority 403; breaker and system
//!   rules 503 (with `Retry-After` when known).
//! - gRPC requests (`content-type: application/grpc…`) are answered the gRPC way instead:
//!   HTTP 200 with trailers-only `grpc-status` RESOURCE_EXHAUSTED (rate rules),
//!   PERMISSION_DENIED (authority) or UNAVAILABLE (breaker, system), `grpc-message`, and
//!   `grpc-retry-pushback-ms` when the wait is known.
//! - Request paths are normalised first ([`crate::path`]): the inner service sees the path
//!   that was matched; an ambiguous path (`%2F`, `\\`, `%00`, …) is answered 400.
//! - Requests no route matches pass untouched.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{
    header, Extensions, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode,
    Uri,
};
use http_body::Body;
use tower::{Layer, Service};
use weir_core::stats::Outcome;
use weir_core::{Clock, Criticality, MonotonicClock};
use weir_rules::config::EstimateFrom;
use weir_rules::config::Param;
use weir_rules::engine::{Block, Context as CallContext, Guard, Resolved, RuleKind, Rules};

use crate::key::ClientIp;
use crate::problem;

/// What a request is, for the rules: the resource and the call's context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    /// The resource.
    pub resource: &'a str,
    /// The caller (`""`: unknown).
    pub origin: &'a str,
    /// The criticality.
    pub criticality: Criticality,
    /// Parameters by position (hot-parameter rules).
    pub params: Vec<std::borrow::Cow<'a, str>>,
}

/// A request's head, borrowed (the request is not taken apart to classify it).
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    /// The method.
    pub method: &'a Method,
    /// The URI.
    pub uri: &'a Uri,
    /// The headers.
    pub headers: &'a HeaderMap,
    /// The extensions (peer address, …).
    pub extensions: &'a Extensions,
}

impl<'a> Head<'a> {
    /// The head of `req`.
    pub fn of<B>(req: &'a Request<B>) -> Self {
        Self {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }
}

/// Maps a request head to a [`Target`] (`None`: not limited).
pub trait Classify: Send + Sync + 'static {
    /// Classifies the request whose head is `req` (the body is not available).
    fn classify<'a>(&'a self, req: Head<'a>) -> Option<Target<'a>>;
}

/// A closure as a classifier: build it with [`ClassifyFn::new`], which pins the closure's
/// signature to `for<'a> Fn(Head<'a>) -> Option<Target<'a>>`.
#[derive(Clone)]
pub struct ClassifyFn<F>(F);

impl<F> ClassifyFn<F>
where
    F: for<'a> Fn(Head<'a>) -> Option<Target<'a>> + Send + Sync + 'static,
{
    /// Wraps `f`.
    pub fn new(f: F) -> Self {
        Self(f)
    }
}

impl<F> Classify for ClassifyFn<F>
where
    F: for<'a> Fn(Head<'a>) -> Option<Target<'a>> + Send + Sync + 'static,
{
    fn classify<'a>(&'a self, req: Head<'a>) -> Option<Target<'a>> {
        (self.0)(req)
    }
}

/// One compiled route.
#[derive(Debug)]
struct Route<C: Clock> {
    resource: Box<str>,
    /// The resource looked up in the rules the table was compiled from.
    resolved: Resolved<C>,
    prefix: Box<str>,
    methods: Vec<Method>,
    headers: Vec<(HeaderName, Option<HeaderValue>)>,
    params: Vec<RouteParam>,
    fallback: Option<Arc<Fallback>>,
    /// [`Resolved::reads_criticality`], once per compile: otherwise the header is not read.
    reads_criticality: bool,
}

/// A route's compiled fallback (the rule file's `fallback`).
#[derive(Debug)]
pub struct Fallback {
    resource: Box<str>,
    kinds: Vec<RuleKind>,
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
    /// Forward to the fallback upstream instead of answering (the request then carries
    /// [`Degraded`]).
    upstream: Option<Arc<str>>,
}

impl Fallback {
    fn compile(resource: &str, f: &weir_rules::config::Fallback) -> Self {
        Self {
            resource: resource.into(),
            kinds: RuleKind::ALL
                .into_iter()
                .filter(|k| f.covers(k.as_str()))
                .collect(),
            status: StatusCode::from_u16(f.status).unwrap_or(StatusCode::OK),
            headers: f
                .headers
                .iter()
                .filter_map(|(k, v)| {
                    Some((
                        HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()).ok()?,
                        HeaderValue::from_str(v).ok()?,
                    ))
                })
                .collect(),
            body: Bytes::copy_from_slice(f.body_bytes()),
            upstream: f.upstream.as_deref().map(Arc::from),
        }
    }

    /// The configured answer to `block` (rate-limit headers kept for rate limits).
    fn respond(&self, block: &Block) -> Response<Bytes> {
        let plain: Response<String> = blocked_response(block);
        let mut r = Response::new(self.body.clone());
        *r.status_mut() = self.status;
        if matches!(block.kind, RuleKind::Flow | RuleKind::HotParam) {
            for name in ["retry-after", "ratelimit-policy", "ratelimit"] {
                if let Some(v) = plain.headers().get(name) {
                    r.headers_mut().insert(name, v.clone());
                }
            }
        }
        for (k, v) in &self.headers {
            r.headers_mut().insert(k.clone(), v.clone());
        }
        r
    }
}

/// Set on a blocked request that is passed on to be answered by a fallback instead of being
/// refused: a route's fallback `upstream` (`weir proxy` forwards such requests there), or any
/// block when the layer was built [`RulesLayer::with_fallback`] (route it with [`OnBlocked`]).
#[derive(Debug, Clone)]
pub struct Degraded {
    /// Why it was blocked.
    pub block: Block,
    /// `http://HOST:PORT` of the route's fallback upstream, if it names one.
    pub upstream: Option<Arc<str>>,
}

/// Sends requests carrying [`Degraded`] (blocked, see [`RulesLayer::with_fallback`]) to
/// `fallback` and the rest to `main`: Hystrix's `getFallback` for tower. The fallback reads
/// why from the request's `Degraded` extension.
#[derive(Clone, Debug)]
pub struct OnBlocked<S, F> {
    main: S,
    fallback: F,
}

impl<S, F> OnBlocked<S, F> {
    /// `main` for admitted requests, `fallback` for blocked ones.
    pub fn new(main: S, fallback: F) -> Self {
        Self { main, fallback }
    }
}

impl<S, F, B> Service<Request<B>> for OnBlocked<S, F>
where
    S: Service<Request<B>>,
    F: Service<Request<B>, Response = S::Response, Error = S::Error>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = OnBlockedFuture<S::Future, F::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Both: which one a request needs is known only at the call.
        std::task::ready!(self.main.poll_ready(cx))?;
        self.fallback.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if req.extensions().get::<Degraded>().is_some() {
            OnBlockedFuture::Fallback {
                f: self.fallback.call(req),
            }
        } else {
            OnBlockedFuture::Main {
                f: self.main.call(req),
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`OnBlocked`]: the main service's or the fallback's.
    #[project = OnBlockedProj]
    pub enum OnBlockedFuture<A, B> {
        /// Admitted.
        Main { #[pin] f: A },
        /// Blocked.
        Fallback { #[pin] f: B },
    }
}

impl<A: Future, B: Future<Output = A::Output>> Future for OnBlockedFuture<A, B> {
    type Output = A::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<A::Output> {
        match self.project() {
            OnBlockedProj::Main { f } => f.poll(cx),
            OnBlockedProj::Fallback { f } => f.poll(cx),
        }
    }
}

#[derive(Debug)]
enum RouteParam {
    ClientIp,
    Method,
    Path,
    Header(HeaderName),
}

/// Compiled `http` section of a rule set.
#[derive(Debug)]
struct Table<C: Clock> {
    generation: u64,
    routes: Vec<Route<C>>,
    origin_header: Option<HeaderName>,
    client_ip: ClientIp,
}

impl<C: Clock + Clone> Table<C> {
    /// Compiles the `http` section of the rules in force (read after `generation`, so a table
    /// is never newer than its generation says; an older one is recompiled at the next call).
    fn compile(rules: &Rules<C>, generation: u64) -> Self {
        let set = rules.rule_set();
        let Some(http) = set.http.as_ref() else {
            return Self {
                generation,
                routes: Vec::new(),
                origin_header: None,
                client_ip: ClientIp::default(),
            };
        };
        // The rule set was validated (names, CIDRs); anything still unparsable is skipped.
        let name = |n: &str| HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()).ok();
        let trusted: Vec<&str> = http.trusted_proxies.iter().map(String::as_str).collect();
        Self {
            generation,
            origin_header: http.origin_header.as_deref().and_then(name),
            client_ip: ClientIp::trusting(&trusted).unwrap_or_default(),
            routes: http
                .routes
                .iter()
                .map(|r| (r, rules.resolve(&r.resource)))
                .map(|(r, resolved)| Route {
                    resource: r.resource.as_str().into(),
                    reads_criticality: resolved.reads_criticality(),
                    resolved,
                    prefix: r.prefix.trim_end_matches('/').into(),
                    methods: r
                        .methods
                        .iter()
                        .filter_map(|m| Method::from_bytes(m.as_bytes()).ok())
                        .collect(),
                    headers: r
                        .headers
                        .iter()
                        .filter_map(|(k, v)| {
                            let value = (v != "*").then(|| HeaderValue::from_str(v).ok()).flatten();
                            Some((name(k)?, value))
                        })
                        .collect(),
                    params: r
                        .params
                        .iter()
                        .filter_map(|p| {
                            Some(match p {
                                Param::ClientIp => RouteParam::ClientIp,
                                Param::Method => RouteParam::Method,
                                Param::Path => RouteParam::Path,
                                Param::Header(h) => RouteParam::Header(name(h)?),
                            })
                        })
                        .collect(),
                    fallback: r
                        .fallback
                        .as_ref()
                        .map(|f| Arc::new(Fallback::compile(&r.resource, f))),
                })
                .collect(),
        }
    }
}

/// Whether `path` is `prefix` or below it, segment-wise (`/api` matches `/api` and `/api/x`,
/// not `/apiary`); `prefix` has no trailing slash (`""` = everything).
fn under(path: &str, prefix: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || prefix.is_empty(),
        None => false,
    }
}

/// The rule file's `http` section as a classifier: first matching route wins; the origin is
/// read from `origin_header`, the criticality from `x-weir-criticality`. Follows reloads of
/// the rules (recompiled when [`Rules::generation`] changes).
pub struct Routes<C: Clock + Clone = MonotonicClock> {
    rules: Arc<Rules<C>>,
    table: ArcSwap<Table<C>>,
}

impl<C: Clock + Clone> Routes<C> {
    /// Routes of the rules in force in `rules`.
    pub fn new(rules: Arc<Rules<C>>) -> Self {
        let table = Table::compile(&rules, rules.generation());
        Self {
            rules,
            table: ArcSwap::from_pointee(table),
        }
    }

    /// The table of the rules in force, kept in `cache` between calls: while the rules'
    /// generation is unchanged a call reads one atomic word and takes no reference (no
    /// reference count or `ArcSwap` guard on the pass path).
    fn table<'c>(&self, cache: &'c mut Option<Arc<Table<C>>>) -> &'c Table<C> {
        let generation = self.rules.generation();
        let table = match cache.take() {
            Some(t) if t.generation == generation => t,
            _ => {
                let mut t = self.table.load_full();
                if t.generation != generation {
                    t = Arc::new(Table::compile(&self.rules, generation));
                    self.table.store(t.clone());
                }
                t
            }
        };
        cache.insert(table)
    }
}

impl<C: Clock + Clone> Table<C> {
    /// The first route matching `req`, whose path as routes match it is `path`.
    fn find(&self, req: Head<'_>, path: &str) -> Option<usize> {
        self.routes.iter().position(|r| {
            under(path, &r.prefix)
                && (r.methods.is_empty() || r.methods.contains(req.method))
                && r.headers
                    .iter()
                    .all(|(name, want)| match (req.headers.get(name), want) {
                        (Some(v), Some(w)) => v == w,
                        (Some(_), None) => true,
                        (None, _) => false,
                    })
        })
    }
}

/// The call derived from a route, owning its strings (the table guard lives in the future).
fn target_of<'a, C: Clock>(
    table: &'a Table<C>,
    route: usize,
    req: Head<'a>,
    path: &'a str,
) -> Target<'a> {
    let r = &table.routes[route];
    let origin = table
        .origin_header
        .as_ref()
        .and_then(|h| req.headers.get(h))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let params = if r.params.is_empty() {
        Vec::new()
    } else {
        r.params
            .iter()
            .map(|p| match p {
                RouteParam::ClientIp => table
                    .client_ip
                    .client_of(req.headers, req.extensions)
                    .map(|ip: IpAddr| crate::key::ip_string(ip).into())
                    .unwrap_or_default(),
                RouteParam::Method => req.method.as_str().into(),
                RouteParam::Path => path.into(),
                RouteParam::Header(h) => req
                    .headers
                    .get(h)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .into(),
            })
            .collect()
    };
    Target {
        resource: &r.resource,
        origin,
        criticality: if r.reads_criticality {
            crate::criticality::read(req.headers)
        } else {
            weir_core::Criticality::default()
        },
        params,
    }
}

/// How the layer classifies: the rule file's routes or a user's classifier.
enum Classifier<C: Clock + Clone> {
    Routes(Routes<C>),
    Custom(Box<dyn Classify>),
}

/// Wraps services with a rule set.
pub struct RulesLayer<C: Clock + Clone = MonotonicClock> {
    rules: Arc<Rules<C>>,
    classifier: Arc<Classifier<C>>,
    /// Blocked requests go on to the inner service with [`Degraded`] (see `with_fallback`).
    pass_blocked: bool,
}

impl<C: Clock + Clone> Clone for RulesLayer<C> {
    fn clone(&self) -> Self {
        Self {
            rules: self.rules.clone(),
            classifier: self.classifier.clone(),
            pass_blocked: self.pass_blocked,
        }
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> RulesLayer<C> {
    /// Classifies requests by the rule file's `http.routes` (following reloads).
    pub fn new(rules: Arc<Rules<C>>) -> Self {
        Self {
            classifier: Arc::new(Classifier::Routes(Routes::new(rules.clone()))),
            rules,
            pass_blocked: false,
        }
    }

    /// Classifies requests with `classify` (e.g. [`ClassifyFn`]).
    pub fn with_classifier(rules: Arc<Rules<C>>, classify: impl Classify) -> Self {
        Self {
            rules,
            classifier: Arc::new(Classifier::Custom(Box::new(classify))),
            pass_blocked: false,
        }
    }

    /// Blocked requests are not answered by the layer but passed on to the inner service with
    /// a [`Degraded`] extension saying why (unless their route's `fallback` answers them):
    /// wrap the inner service in [`OnBlocked`] to give them a fallback service. Counted as
    /// answered by a fallback.
    pub fn with_fallback(mut self) -> Self {
        self.pass_blocked = true;
        self
    }

    /// The rules (apply new sets, read snapshots).
    pub fn rules(&self) -> &Arc<Rules<C>> {
        &self.rules
    }

    /// The client address of a request from the connection's `peer` (headers `headers`): the
    /// peer, unless it is one of the rule file's `http.trusted_proxies` — then the address
    /// `X-Forwarded-For` names ([`ClientIp`]). What per-address bounds in front of the
    /// service should count by.
    pub fn client_ip(&self, peer: std::net::IpAddr, headers: &HeaderMap) -> std::net::IpAddr {
        let Classifier::Routes(routes) = &*self.classifier else {
            return peer;
        };
        // The table last compiled (a reload's trusted proxies apply from the next routed
        // request): one atomic load, no reference count, on every proxied request.
        routes.table.load().client_ip.client_from(peer, headers)
    }

    /// Whether the request with head `parts` goes to a resource whose `cost:` rules take their
    /// estimate from a JSON request body: the requests a
    /// [`ReadJsonLayer`](crate::cost::ReadJsonLayer) in front should read, and no others
    /// (an unrouted request's body is never held).
    pub fn reads_request_json(&self, parts: &http::request::Parts) -> bool {
        if !self.rules.reads_request_json() {
            return false;
        }
        let json = |sources: Option<&weir_rules::config::CostSources>| {
            sources.is_some_and(|s| matches!(s.estimate, Some(EstimateFrom::Json(_))))
        };
        let head = Head {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
            extensions: &parts.extensions,
        };
        match &*self.classifier {
            Classifier::Routes(routes) => {
                let mut cache = None;
                let table = routes.table(&mut cache);
                let path = crate::path::match_path(parts.uri.path());
                table
                    .find(head, &path)
                    .is_some_and(|i| json(table.routes[i].resolved.cost_sources()))
            }
            Classifier::Custom(c) => c
                .classify(head)
                .is_some_and(|t| json(self.rules.resolve(t.resource).cost_sources())),
        }
    }
}

impl<S, C: Clock + Clone> Layer<S> for RulesLayer<C> {
    type Service = RulesService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RulesService {
            inner,
            layer: self.clone(),
            table: None,
        }
    }
}

/// A service behind a rule set.
pub struct RulesService<S, C: Clock + Clone = MonotonicClock> {
    inner: S,
    layer: RulesLayer<C>,
    /// The route table last used (see `Routes::table`).
    table: Option<Arc<Table<C>>>,
}

impl<S: Clone, C: Clock + Clone> Clone for RulesService<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
            table: self.table.clone(),
        }
    }
}

impl<S, C, ReqB, ResB> Service<Request<ReqB>> for RulesService<S, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    C: Clock + Clone + Send + Sync + 'static,
    ResB: Body<Data = Bytes>,
{
    type Response = Response<GuardBody<ResB, C>>;
    type Error = S::Error;
    type Future = RulesFuture<S, Request<ReqB>, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        // Plain paths (the common case) are their own normal and route forms: one scan.
        let plain = crate::path::is_plain(req.uri().path());
        if !plain {
            match crate::path::normalize(req.uri().path()) {
                Ok(std::borrow::Cow::Borrowed(_)) => {}
                Ok(std::borrow::Cow::Owned(normal)) => {
                    if set_path(req.uri_mut(), &normal).is_err() {
                        return RulesFuture::Invalid {
                            detail: Some("the normalised path is not a valid URI"),
                        };
                    }
                }
                Err(e) => {
                    return RulesFuture::Invalid {
                        detail: Some(e.as_str()),
                    }
                }
            }
        }
        let head = Head::of(&req);
        let path = if plain {
            std::borrow::Cow::Borrowed(req.uri().path())
        } else {
            crate::path::match_path(req.uri().path())
        };
        let mut fallback = None;
        let rules = &self.layer.rules;
        // With `with_fallback`, a block no route fallback answers goes on to the inner service
        // (counted as answered by a fallback).
        let passed_on = |t: &Target<'_>, r: Result<Guard<C>, Block>, route: Option<&Fallback>| {
            if let Err(b) = &r {
                if self.layer.pass_blocked && !route.is_some_and(|f| f.kinds.contains(&b.kind)) {
                    rules.fallback_served(t.resource);
                }
            }
            r
        };
        // The estimate the request states, for resources whose cost rules say where (noting
        // whether it came from the body's JSON, which is then dropped below).
        let read_json = std::cell::Cell::new(false);
        let estimate = |sources: Option<&weir_rules::config::CostSources>| {
            let from = sources?.estimate.as_ref()?;
            read_json.set(matches!(from, EstimateFrom::Json(_)));
            crate::cost::request_estimate(head.headers, head.extensions, from)
        };
        let entry = match &*self.layer.classifier {
            Classifier::Routes(routes) => {
                let table = routes.table(&mut self.table);
                table.find(head, &path).map(|i| {
                    let t = target_of(table, i, head, &path);
                    let route = &table.routes[i];
                    fallback = route.fallback.clone();
                    let cost = estimate(route.resolved.cost_sources());
                    passed_on(
                        &t,
                        admit(rules, Some(&route.resolved), &t, cost),
                        fallback.as_deref(),
                    )
                })
            }
            Classifier::Custom(c) => c.classify(head).map(|t| {
                let cost = if rules.states_costs() {
                    estimate(rules.resolve(t.resource).cost_sources())
                } else {
                    None
                };
                passed_on(&t, admit(rules, None, &t, cost), None)
            }),
        };
        drop(path);
        // The body's JSON was read for the estimate: not held any longer than the decision.
        if read_json.get() {
            req.extensions_mut().remove::<crate::cost::RequestJson>();
        }
        let head = req.method() == Method::HEAD;
        match entry {
            None => RulesFuture::Pass {
                inner: self.inner.call(req),
                guard: Pending(None),
                head,
            },
            Some(Ok(guard)) if guard.has_shared() => {
                // Shared rules decide in the shared store: wait for it, then call the service
                // that was made ready (boxed: rare).
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                RulesFuture::Deciding {
                    deciding: Some(Box::new(Deciding {
                        decide: Box::pin(decide_shared(guard)),
                        svc: ready,
                        req,
                        fallback,
                        layer: self.layer.clone(),
                    })),
                }
            }
            Some(Ok(guard)) if guard.wait().is_zero() => RulesFuture::Pass {
                inner: self.inner.call(req),
                guard: Pending(Some(guard)),
                head,
            },
            Some(Ok(guard)) => {
                // Paced: wait, then call the service that was made ready (boxed: rare, and
                // it keeps the common future small).
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                RulesFuture::Waiting {
                    paced: Some(Box::new(Paced {
                        sleep: Box::pin(tokio::time::sleep(guard.wait())),
                        svc: ready,
                        req,
                        guard,
                    })),
                }
            }
            // (A block passed on was counted at the entry.)
            Some(Err(block)) => match on_block(&self.layer, fallback, req, block) {
                Ok((req, _)) => RulesFuture::Pass {
                    inner: self.inner.call(req),
                    guard: Pending(None),
                    head,
                },
                Err(answer) => RulesFuture::Blocked {
                    grpc: answer.grpc,
                    block: Some(Box::new(answer.block)),
                    fallback: answer.fallback,
                },
            },
        }
    }
}

/// A blocked request the layer answers itself: with its route's fallback, or the block.
struct Answer {
    block: Block,
    fallback: Option<Arc<Fallback>>,
    grpc: bool,
}

/// What becomes of a request `block` refused, whatever refused it (a local rule, a cost rule, a
/// cluster rule, a `shared: true` rule deciding later): `Ok` — the request to call the inner
/// service with, carrying [`Degraded`] — when its route's `fallback` (covering the block's
/// kind) names an upstream, or the layer passes blocked requests on (`with_fallback`; then
/// `true`: the caller counts it as served by a fallback); otherwise the answer (the route's
/// fallback response, or the block's). A route's fallback serving it is counted here.
fn on_block<C: Clock + Clone, B>(
    layer: &RulesLayer<C>,
    fallback: Option<Arc<Fallback>>,
    mut req: Request<B>,
    block: Block,
) -> Result<(Request<B>, bool), Answer> {
    let fallback = fallback.filter(|f| f.kinds.contains(&block.kind));
    if let Some(f) = &fallback {
        layer.rules.fallback_served(&f.resource);
        if let Some(upstream) = &f.upstream {
            req.extensions_mut().insert(Degraded {
                block,
                upstream: Some(upstream.clone()),
            });
            return Ok((req, false));
        }
    }
    if fallback.is_none() && layer.pass_blocked {
        req.extensions_mut().insert(Degraded {
            block,
            upstream: None,
        });
        return Ok((req, true));
    }
    Err(Answer {
        grpc: is_grpc(&req),
        block,
        fallback,
    })
}

/// Whether `req` is a gRPC call (answered the gRPC way when blocked).
fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The guard once its shared rules decided, or the block (with the guard, which gave back
/// what the call held).
async fn decide_shared<C: Clock + Clone>(mut guard: Guard<C>) -> SharedDecision<C> {
    match guard.decide_shared().await {
        Ok(()) => Ok(guard),
        Err(block) => Err((block, guard)),
    }
}

/// Replaces the path of `uri`, keeping its query (and scheme and authority, if any).
fn set_path(uri: &mut Uri, path: &str) -> Result<(), http::Error> {
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let mut parts = std::mem::take(uri).into_parts();
    parts.path_and_query = Some(pq.parse()?);
    *uri = Uri::from_parts(parts)?;
    Ok(())
}

fn admit<C: Clock + Clone>(
    rules: &Rules<C>,
    resolved: Option<&Resolved<C>>,
    t: &Target<'_>,
    cost: Option<u64>,
) -> Result<Guard<C>, Block> {
    let entry = |ctx: &CallContext<'_>| match resolved {
        Some(r) => rules.entry_resolved(r, t.resource, ctx),
        None => rules.entry(t.resource, ctx),
    };
    let mut ctx = CallContext {
        origin: t.origin,
        criticality: t.criticality,
        params: &[],
        inbound: true,
        cost,
    };
    if t.params.is_empty() {
        return entry(&ctx);
    }
    // Hot-parameter rules index the first 8 parameters.
    let mut params = [""; 8];
    let n = t.params.len().min(params.len());
    for (slot, p) in params.iter_mut().zip(&t.params) {
        *slot = p;
    }
    ctx.params = &params[..n];
    entry(&ctx)
}

/// The guard of a call whose service is answering: dropped before the answer (the client
/// went away while the upstream worked), the call is abandoned: charged the rules' `max`.
pub struct Pending<C: Clock + Clone>(Option<Guard<C>>);

impl<C: Clock + Clone> Drop for Pending<C> {
    fn drop(&mut self) {
        if let Some(guard) = self.0.as_mut() {
            abandoned(guard, None);
        }
    }
}

/// The guard once its shared rules admitted the call, or the block with the guard.
type SharedDecision<C> = Result<Guard<C>, (Block, Guard<C>)>;

/// A call waiting for its shared rules' decision.
pub struct Deciding<S, Req, C: Clock + Clone> {
    decide: Pin<Box<dyn Future<Output = SharedDecision<C>> + Send>>,
    svc: S,
    req: Req,
    /// What a refusal of the shared rules becomes: the route's fallback, the layer's pass-on.
    fallback: Option<Arc<Fallback>>,
    layer: RulesLayer<C>,
}

/// A paced call waiting for its turn.
pub struct Paced<S, Req, C: Clock> {
    sleep: Pin<Box<tokio::time::Sleep>>,
    svc: S,
    req: Req,
    guard: Guard<C>,
}

pin_project_lite::pin_project! {
    /// The response of a [`RulesService`].
    #[project = RulesProj]
    pub enum RulesFuture<S, Req, C> where S: Service<Req>, C: Clock, C: Clone {
        /// Admitted (or not classified): the inner call.
        Pass {
            #[pin]
            inner: S::Future,
            guard: Pending<C>,
            head: bool,
        },
        /// Admitted by a paced rule: waiting for its turn.
        Waiting {
            paced: Option<Box<Paced<S, Req, C>>>,
        },
        /// Admitted by the local rules: waiting for the shared ones.
        Deciding {
            deciding: Option<Box<Deciding<S, Req, C>>>,
        },
        /// Blocked: answered without calling the service.
        Blocked {
            block: Option<Box<Block>>,
            grpc: bool,
            fallback: Option<Arc<Fallback>>,
        },
        /// A path refused by [`crate::path::normalize`]: answered 400.
        Invalid {
            detail: Option<&'static str>,
        },
    }
}

impl<S, ReqB, ResB, C> Future for RulesFuture<S, Request<ReqB>, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    C: Clock + Clone,
    ResB: Body<Data = Bytes>,
{
    type Output = Result<Response<GuardBody<ResB, C>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                RulesProj::Pass { inner, guard, head } => {
                    let out = std::task::ready!(inner.poll(cx));
                    let guard = guard.0.take();
                    return Poll::Ready(match out {
                        Ok(mut r) => {
                            let held = guard.map(|g| Admitted::new(g, &mut r));
                            Ok(GuardBody::wrap(r, held, *head))
                        }
                        Err(e) => {
                            if let Some(g) = guard {
                                g.complete(Outcome::Error);
                            }
                            Err(e)
                        }
                    });
                }
                RulesProj::Waiting { paced } => {
                    let Some(p) = paced else {
                        // Polled after completion: nothing sensible left to do.
                        return Poll::Pending;
                    };
                    std::task::ready!(p.sleep.as_mut().poll(cx));
                    let Some(p) = paced.take() else {
                        return Poll::Pending;
                    };
                    let Paced {
                        mut svc,
                        req,
                        guard,
                        ..
                    } = *p;
                    let head = req.method() == Method::HEAD;
                    let inner = svc.call(req);
                    self.set(RulesFuture::Pass {
                        inner,
                        guard: Pending(Some(guard)),
                        head,
                    });
                }
                RulesProj::Deciding { deciding } => {
                    let Some(d) = deciding else {
                        return Poll::Pending;
                    };
                    let decided = std::task::ready!(d.decide.as_mut().poll(cx));
                    let Some(d) = deciding.take() else {
                        return Poll::Pending;
                    };
                    let Deciding {
                        mut svc,
                        req,
                        fallback,
                        layer,
                        ..
                    } = *d;
                    match decided {
                        Ok(guard) if guard.wait().is_zero() => {
                            let head = req.method() == Method::HEAD;
                            let inner = svc.call(req);
                            self.set(RulesFuture::Pass {
                                inner,
                                guard: Pending(Some(guard)),
                                head,
                            });
                        }
                        Ok(guard) => self.set(RulesFuture::Waiting {
                            paced: Some(Box::new(Paced {
                                sleep: Box::pin(tokio::time::sleep(guard.wait())),
                                svc,
                                req,
                                guard,
                            })),
                        }),
                        // Refused by a shared rule: the route's fallback as for any block.
                        Err((block, guard)) => match on_block(&layer, fallback, req, block) {
                            Ok((req, passed)) => {
                                if passed {
                                    guard.count_fallback();
                                }
                                drop(guard);
                                let head = req.method() == Method::HEAD;
                                let inner = svc.call(req);
                                self.set(RulesFuture::Pass {
                                    inner,
                                    guard: Pending(None),
                                    head,
                                });
                            }
                            Err(answer) => self.set(RulesFuture::Blocked {
                                block: Some(Box::new(answer.block)),
                                grpc: answer.grpc,
                                fallback: answer.fallback,
                            }),
                        },
                    }
                }
                RulesProj::Blocked {
                    block,
                    grpc,
                    fallback,
                } => {
                    let Some(block) = block.take() else {
                        return Poll::Pending;
                    };
                    if let Some(f) = fallback {
                        return Poll::Ready(Ok(f.respond(&block).map(GuardBody::refused)));
                    }
                    let r: Response<String> = if *grpc {
                        blocked_grpc_response(&block)
                    } else {
                        blocked_response(&block)
                    };
                    return Poll::Ready(Ok(r.map(GuardBody::refused)));
                }
                RulesProj::Invalid { detail } => {
                    let Some(detail) = detail.take() else {
                        return Poll::Pending;
                    };
                    let r: Response<String> = problem::problem(StatusCode::BAD_REQUEST, detail);
                    return Poll::Ready(Ok(r.map(GuardBody::refused)));
                }
            }
        }
    }
}

/// The answer to a blocked request: 429 for rate rules, 403 for authority, 503 for breakers
/// and system rules; `Retry-After` in whole seconds rounded up when the wait is known; rate
/// rules add `RateLimit-Policy` / `RateLimit`; always an `application/problem+json` body.
pub fn blocked_response<B: From<String>>(block: &Block) -> Response<B> {
    let (status, what) = match block.kind {
        RuleKind::Flow | RuleKind::HotParam => (StatusCode::TOO_MANY_REQUESTS, "rate limit"),
        RuleKind::Authority => (StatusCode::FORBIDDEN, "caller not allowed by"),
        RuleKind::Breaker => (StatusCode::SERVICE_UNAVAILABLE, "circuit breaker open:"),
        RuleKind::System => (StatusCode::SERVICE_UNAVAILABLE, "overloaded:"),
        RuleKind::Switch => (StatusCode::SERVICE_UNAVAILABLE, "switched off:"),
    };
    let retry = block.retry_after.map(|r| problem::ceil_secs(r).max(1));
    // A rate rule that had room left yet refused with no retry time: the call asked for more
    // than the rule can ever hold (a cost estimate above its burst). Waiting will not help.
    let never = block.rate.is_some() && retry.is_none() && block.remaining.is_some_and(|r| r > 0);
    let detail = match retry {
        Some(s) => format!("{what} {} exceeded; retry in {s} s", block.rule),
        None if never => format!(
            "{what} {}: the call asks for more than the rule can ever hold ({} left now); lower its estimate (max_tokens) — no wait lets it pass",
            block.rule,
            block.remaining.unwrap_or(0)
        ),
        None => format!("{what} {}", block.rule),
    };
    let mut r = problem::problem(status, &detail);
    if let Some(s) = retry {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    if let Some((limit, window)) = block.rate {
        let policy = format!(
            "\"{}\";q={limit};w={}",
            block.rule,
            problem::ceil_secs(window).max(1)
        );
        let now = format!(
            "\"{}\";r={};t={}",
            block.rule,
            block.remaining.unwrap_or(0),
            retry.unwrap_or(0)
        );
        if let (Ok(p), Ok(n)) = (HeaderValue::from_str(&policy), HeaderValue::from_str(&now)) {
            r.headers_mut().insert("ratelimit-policy", p);
            r.headers_mut().insert("ratelimit", n);
        }
    }
    r
}

/// The gRPC answer to a blocked call: HTTP 200, trailers-only (empty body, the status in the
/// headers) with `grpc-status` 8 RESOURCE_EXHAUSTED for rate rules, 7 PERMISSION_DENIED for
/// authority, 14 UNAVAILABLE for breakers and system rules; `grpc-message` (percent-encoded);
/// `grpc-retry-pushback-ms` when the wait is known (gRPC's retry pushback).
pub fn blocked_grpc_response<B: From<String>>(block: &Block) -> Response<B> {
    let code = match block.kind {
        RuleKind::Flow | RuleKind::HotParam => 8,
        RuleKind::Authority => 7,
        RuleKind::Breaker | RuleKind::System | RuleKind::Switch => 14,
    };
    let message = format!("blocked by {} rule {}", block.kind.as_str(), block.rule);
    let mut r = Response::new(B::from(String::new()));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert("grpc-status", HeaderValue::from(code));
    if let Ok(v) = HeaderValue::from_str(&crate::problem::grpc_message(&message)) {
        h.insert("grpc-message", v);
    }
    if let Some(wait) = block.retry_after {
        let ms = u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        h.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
    }
    r
}

/// A response body holding the rules' guard until it ends (completed: success, or error for
/// a 5xx or a body error) or is dropped (released without an outcome).
pub type GuardBody<B, C> = crate::body::HeldBody<B, Admitted<C>>;

/// What an admitted request holds until its response ends: the rules' guard and, for rules
/// with `cost:`, the reader of the actual cost.
///
/// Settlement when the response ends: the cost the response stated (header, trailer, JSON
/// field, last Server-Sent Event); a response stating none that failed (5xx, a broken body)
/// or was refused upstream (4xx) gives the estimate back; any other keeps it. A response
/// dropped before its end (the client went away, the connection closed) settles with the cost
/// read so far (a usage event already passed), else with the rules' `max`: a client cannot
/// leave early to pay less than its call cost.
pub struct Admitted<C: Clock + Clone = MonotonicClock> {
    /// `None` once ended.
    guard: Option<Guard<C>>,
    /// Reads the actual cost from the body (`None`: nothing to read, or already settled).
    reader: Option<Box<crate::cost::ActualReader>>,
    /// A 4xx: the upstream refused the call.
    refused: bool,
}

impl<C: Clock + Clone> Admitted<C> {
    /// Holds `guard` for the response `r`: settles a cost stated in its head, prepares the
    /// reader of one stated in its body, and tells the caller its budget (`RateLimit`).
    fn new<B>(guard: Guard<C>, r: &mut Response<B>) -> Self {
        if let Some(rule) = guard.over_budget() {
            mark_over_budget(rule, r);
        }
        if !guard.holds_cost() {
            return Self {
                guard: Some(guard),
                reader: None,
                refused: false,
            };
        }
        Self::costed(guard, r)
    }

    #[cold]
    fn costed<B>(mut guard: Guard<C>, r: &mut Response<B>) -> Self {
        // What was left once the estimate was held (before a settlement below).
        if let Some(b) = guard.budget() {
            let h = r.headers_mut();
            if let Some(v) = problem::policy_text(&b.rule, b.limit, b.window) {
                h.insert(problem::RATELIMIT_POLICY, v);
            }
            if let Some(v) = problem::ratelimit_text(&b.rule, b.remaining, b.reset_after) {
                h.insert(problem::RATELIMIT, v);
            }
        }
        let mut reader = None;
        if let Some(from) = guard.cost_sources().and_then(|s| s.actual.clone()) {
            match crate::cost::response_header_cost(r.headers(), &from) {
                Some(n) => guard.settle_cost(n),
                None => reader = crate::cost::ActualReader::new(&from).map(Box::new),
            }
        }
        Self {
            guard: Some(guard),
            reader,
            refused: r.status().is_client_error(),
        }
    }
}

/// Header marking a response a soft calendar budget admitted past its limit; the value is the
/// budget's rule id.
pub const BUDGET_EXCEEDED: &str = "weir-budget-exceeded";

#[cold]
fn mark_over_budget<B>(rule: &str, r: &mut Response<B>) {
    if let Ok(v) = http::HeaderValue::from_str(rule) {
        r.headers_mut()
            .insert(http::HeaderName::from_static(BUDGET_EXCEEDED), v);
    }
}

impl<C: Clock + Clone> crate::body::Held for Admitted<C> {
    fn end(mut self, failed: bool) {
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        if guard.holds_cost() {
            match self.reader.take().and_then(|r| r.finish()) {
                Some(actual) => guard.settle_cost(actual),
                None if failed || self.refused => guard.settle_cost(0),
                None => {}
            }
        }
        guard.end(failed);
    }

    #[inline]
    fn frame(&mut self, frame: &http_body::Frame<Bytes>) {
        if let Some(r) = &mut self.reader {
            r.frame(frame);
        }
    }
}

impl<C: Clock + Clone> Drop for Admitted<C> {
    /// The response was dropped before its end: the call is charged the cost read so far, else
    /// the rules' `max`.
    fn drop(&mut self) {
        if let Some(guard) = self.guard.as_mut() {
            abandoned(guard, self.reader.as_deref().and_then(|r| r.known()));
        }
    }
}

/// Settles a call whose response will not end (the client went away): with `known`, the
/// cost read so far, else with what bounds it (each rule's `max`) when the response was to
/// state its cost. A call whose rules read no actual cost keeps its estimates.
pub(crate) fn abandoned<C: Clock + Clone>(guard: &mut Guard<C>, known: Option<u64>) {
    if !guard.holds_cost() {
        return;
    }
    let states_cost = guard.cost_sources().is_some_and(|s| s.actual.is_some());
    match known {
        Some(actual) => guard.settle_cost(actual),
        None if states_cost => guard.settle_abandoned(),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::under;

    #[test]
    fn prefixes_match_whole_segments() {
        assert!(under("/api", "/api"));
        assert!(under("/api/x", "/api"));
        assert!(!under("/apiary", "/api"));
        assert!(under("/anything", ""));
        assert!(!under("/other", "/api"));
    }

    /// The criticality header is read for the calls whose rules use it (the system rule, a
    /// concurrency rule), and only for them.
    #[test]
    fn criticality_is_read_when_a_rule_uses_it() {
        use weir_core::Criticality;
        let target = |yaml: &str| {
            let set = weir_rules::config::RuleSet::from_yaml(std::path::Path::new("r.yaml"), yaml)
                .expect("rule set");
            let rules = super::Rules::new(&set).expect("rules");
            let table = super::Table::compile(&rules, rules.generation());
            let req = super::Request::get("/a")
                .header("x-weir-criticality", "SHEDDABLE")
                .body(())
                .expect("request");
            let head = super::Head::of(&req);
            let i = table.find(head, "/a").expect("routed");
            super::target_of(&table, i, head, "/a").criticality
        };
        let routes = "http:\n  routes:\n    - {resource: a, prefix: /a}\n";
        let rate = "resources:\n  - name: a\n    flow:\n      - {id: q, qps: 5}\n";
        let concurrency = "resources:\n  - name: a\n    flow:\n      - {id: c, concurrency: 5}\n";
        let system = format!("{rate}system: {{max_in_flight: 5}}\n");
        assert_eq!(target(&format!("{rate}{routes}")), Criticality::Critical);
        assert_eq!(
            target(&format!("{concurrency}{routes}")),
            Criticality::Sheddable
        );
        assert_eq!(target(&format!("{system}{routes}")), Criticality::Sheddable);
    }
}
