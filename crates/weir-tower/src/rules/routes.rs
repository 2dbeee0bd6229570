//! Which resource and call context a request is: the rule file's `http.routes` compiled into
//! a table ([`Routes`]), or a user's [`Classify`].

use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use weir_core::{Clock, Criticality, MonotonicClock};
use weir_rules::config::Param;
use weir_rules::engine::{Resolved, Rules};

use crate::key::ClientIp;

use super::fallback::Fallback;

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

/// What route tables read of a request besides its path: its method, headers and extensions
/// (never the URI, so a server that has no `Uri` built need not build one).
#[derive(Debug, Clone, Copy)]
pub(super) struct Asked<'a> {
    pub(super) method: &'a Method,
    pub(super) headers: &'a HeaderMap,
    pub(super) extensions: &'a Extensions,
}

impl<'a> From<Head<'a>> for Asked<'a> {
    fn from(h: Head<'a>) -> Self {
        Self {
            method: h.method,
            headers: h.headers,
            extensions: h.extensions,
        }
    }
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
pub struct ClassifyFn<F>(pub(super) F);

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
pub(super) struct Route<C: Clock> {
    pub(super) resource: Box<str>,
    /// The resource looked up in the rules the table was compiled from.
    pub(super) resolved: Resolved<C>,
    pub(super) prefix: Box<str>,
    pub(super) methods: Vec<Method>,
    pub(super) headers: Vec<(HeaderName, Option<HeaderValue>)>,
    pub(super) params: Vec<RouteParam>,
    pub(super) fallback: Option<Arc<Fallback>>,
    /// [`Resolved::reads_criticality`], once per compile: otherwise the header is not read.
    pub(super) reads_criticality: bool,
}

#[derive(Debug)]
pub(super) enum RouteParam {
    ClientIp,
    Method,
    Path,
    Header(HeaderName),
}

/// Compiled `http` section of a rule set.
#[derive(Debug)]
pub(super) struct Table<C: Clock> {
    pub(super) generation: u64,
    pub(super) routes: Vec<Route<C>>,
    pub(super) origin_header: Option<HeaderName>,
    pub(super) client_ip: ClientIp,
    /// Every header a route's match, parameters, origin, criticality or client address reads
    /// (see [`super::Decider::reads`]).
    pub(super) reads: Vec<HeaderName>,
}

impl<C: Clock + Clone> Table<C> {
    /// Compiles the `http` section of the rules in force (read after `generation`, so a table
    /// is never newer than its generation says; an older one is recompiled at the next call).
    pub(super) fn compile(rules: &Rules<C>, generation: u64) -> Self {
        let set = rules.rule_set();
        let Some(http) = set.http.as_ref() else {
            return Self {
                generation,
                routes: Vec::new(),
                origin_header: None,
                client_ip: ClientIp::default(),
                reads: Vec::new(),
            };
        };
        // The rule set was validated (names, CIDRs); anything still unparsable is skipped.
        let name = |n: &str| HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()).ok();
        let trusted: Vec<&str> = http.trusted_proxies.iter().map(String::as_str).collect();
        let mut table = Self {
            generation,
            origin_header: http.origin_header.as_deref().and_then(name),
            client_ip: ClientIp::trusting(&trusted).unwrap_or_default(),
            reads: Vec::new(),
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
        };
        table.reads = table.headers_read();
        table
    }

    /// The headers classifying a request may read.
    fn headers_read(&self) -> Vec<HeaderName> {
        let mut reads: Vec<HeaderName> = self.origin_header.iter().cloned().collect();
        for r in &self.routes {
            reads.extend(r.headers.iter().map(|(n, _)| n.clone()));
            reads.extend(r.params.iter().filter_map(|p| match p {
                RouteParam::Header(h) => Some(h.clone()),
                _ => None,
            }));
            if r.reads_criticality {
                reads.push(crate::criticality::HEADER_NAME);
            }
        }
        if self.client_ip.reads_forwarded_for() {
            reads.push(HeaderName::from_static("x-forwarded-for"));
        }
        reads.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        reads.dedup();
        reads
    }
}

/// Whether `path` is `prefix` or below it, segment-wise (`/api` matches `/api` and `/api/x`,
/// not `/apiary`); `prefix` has no trailing slash (`""` = everything).
pub(super) fn under(path: &str, prefix: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || prefix.is_empty(),
        None => false,
    }
}

/// The rule file's `http` section as a classifier: first matching route wins; the origin is
/// read from `origin_header`, the criticality from `x-weir-criticality`. Follows reloads of
/// the rules (recompiled when [`Rules::generation`] changes).
pub struct Routes<C: Clock + Clone = MonotonicClock> {
    pub(super) rules: Arc<Rules<C>>,
    pub(super) table: ArcSwap<Table<C>>,
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
    pub(super) fn table<'c>(&self, cache: &'c mut Option<Arc<Table<C>>>) -> &'c Table<C> {
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
    pub(super) fn find<'a>(&self, req: impl Into<Asked<'a>>, path: &str) -> Option<usize> {
        let req = req.into();
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
pub(super) fn target_of<'a, C: Clock>(
    table: &'a Table<C>,
    route: usize,
    req: impl Into<Asked<'a>>,
    path: &'a str,
) -> Target<'a> {
    let req = req.into();
    let r = &table.routes[route];
    let params = r
        .params
        .iter()
        .map(|p| match p {
            RouteParam::ClientIp => table
                .client_ip
                .client_of(req.headers, req.extensions)
                .map(|ip: IpAddr| crate::key::ip_string(ip).into())
                .unwrap_or_default(),
            p => std::borrow::Cow::Borrowed(p.of(req, path, "")),
        })
        .collect();
    Target {
        resource: &r.resource,
        origin: table.origin_of(req.headers),
        criticality: r.criticality_of(req.headers),
        params,
    }
}

impl RouteParam {
    /// The parameter's value for the request `req` to `path`, whose client address is
    /// `client` (as text).
    pub(super) fn of<'a>(&self, req: Asked<'a>, path: &'a str, client: &'a str) -> &'a str {
        match self {
            RouteParam::ClientIp => client,
            RouteParam::Method => req.method.as_str(),
            RouteParam::Path => path,
            RouteParam::Header(h) => req
                .headers
                .get(h)
                .and_then(|v| v.to_str().ok())
                .unwrap_or(""),
        }
    }
}

impl<C: Clock> Table<C> {
    /// The caller named by the origin header (`""`: none).
    pub(super) fn origin_of<'a>(&self, headers: &'a HeaderMap) -> &'a str {
        self.origin_header
            .as_ref()
            .and_then(|h| headers.get(h))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

impl<C: Clock> Route<C> {
    /// The call's criticality (read only when the route's rules use it).
    pub(super) fn criticality_of(&self, headers: &HeaderMap) -> Criticality {
        if self.reads_criticality {
            crate::criticality::read(headers)
        } else {
            Criticality::default()
        }
    }
}
