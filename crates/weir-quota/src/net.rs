//! The lease client over the network: one process's [`ResourceClient`]s refreshed together
//! against a lease server's HTTP/JSON API (`weir serve --quota`, docs/quota.md).
//!
//! ```no_run
//! # async fn demo() -> Result<(), weir_quota::net::NetError> {
//! use weir_quota::net::LeaseClient;
//! let quota = LeaseClient::builder("http://127.0.0.1:8080", "host-7")
//!     .resource("search", 50.0) // safe capacity until the server is first reached
//!     .start()?;
//! if quota.acquire("search", 1).is_some_and(|d| d.allowed()) {
//!     // serve the request
//! }
//! quota.shutdown().await; // gives the leases back
//! # Ok(()) }
//! ```
//!
//! A background task refreshes every resource in one call whenever one is due (refresh
//! interval ± jitter, sooner after start or a demand change), polls each resource every
//! second (demand samples, lease expiry → safe capacity), and backs off 1 s → 30 s while no
//! server can be reached (keep-alive HTTP/1.1 connections, re-established as needed).
//! Every transition is logged (`tracing`) and counted ([`ResourceClient::counters`]).
//!
//! Several servers sharing a quota (failover through Redis) are given as a comma-separated
//! list: the client calls the one that answered last; a follower's `421` names the leader,
//! which the client then calls directly; an unreachable server or a `503` (no leader known
//! yet) moves the call on to the next server of the list, within the same refresh.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use weir_core::{Clock, Decision, MonotonicClock, Nanos};

use crate::client::{ClientConfig, ResourceClient, Source};
use crate::lease::Lease;
use crate::wire::lease_id_text;

mod parent;
pub use parent::ParentLink;

/// Why a lease client cannot start.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A server address is not `http://HOST:PORT`.
    #[error("lease server {0:?}: expected http://HOST:PORT[,http://HOST:PORT…]")]
    Endpoint(String),
    /// No resource was declared.
    #[error("a lease client needs at least one resource")]
    NoResource,
    /// More resources than one client leases.
    #[error("a lease client leases at most {MAX_RESOURCES} resources")]
    TooManyResources,
    /// Not inside a tokio runtime.
    #[error("the lease client must be started inside a tokio runtime")]
    NoRuntime,
}

/// Builds a [`LeaseClient`].
pub struct Builder {
    endpoint: String,
    client_id: String,
    token: Option<String>,
    config: ClientConfig,
    resources: Vec<(String, f64)>,
}

impl Builder {
    /// Leases `name`, enforcing `safe` units/s until the server is first reached.
    pub fn resource(mut self, name: &str, safe: f64) -> Self {
        self.resources.push((name.to_string(), safe));
        self
    }

    /// Sends `Authorization: Bearer TOKEN` with every call (a server whose quota file's
    /// `clients` section asks for a token for this client id).
    pub fn token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    /// Demand estimate, jitter, backoff, burst, weight and priority of every resource.
    pub fn config(mut self, config: ClientConfig) -> Self {
        self.config = config;
        self
    }

    /// Starts the refresh task on the current tokio runtime.
    pub fn start(self) -> Result<LeaseClient, NetError> {
        let link = Transport::new(&self.endpoint, &self.client_id, self.token.clone())?;
        if self.resources.is_empty() {
            return Err(NetError::NoResource);
        }
        if self.resources.len() > MAX_RESOURCES {
            return Err(NetError::TooManyResources);
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| NetError::NoRuntime)?;
        let clock = MonotonicClock::new();
        let now = clock.now();
        let seed = self
            .client_id
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            });
        let resources: Vec<Arc<ResourceClient>> = self
            .resources
            .iter()
            .enumerate()
            .map(|(i, (name, safe))| {
                Arc::new(ResourceClient::new(
                    name,
                    self.config,
                    *safe,
                    seed ^ i as u64,
                    now,
                ))
            })
            .collect();
        let table = Table::new(resources);
        let inner = Arc::new(Inner {
            link,
            clock,
            table: arc_swap::ArcSwap::from_pointee(table),
            seed,
            config: self.config,
            stop: tokio::sync::Notify::new(),
            wake: tokio::sync::Notify::new(),
            task: parking_lot::Mutex::new(None),
        });
        let task = runtime.spawn(refresh_loop(inner.clone()));
        *inner.task.lock() = Some(task);
        Ok(LeaseClient { inner })
    }
}

/// One server's URIs.
#[derive(Clone, Debug, PartialEq)]
struct Target {
    base: String,
    refresh: http::Uri,
    release: http::Uri,
}

impl Target {
    fn parse(endpoint: &str) -> Result<Self, NetError> {
        let base = endpoint.trim_end_matches('/').to_string();
        let bad = || NetError::Endpoint(endpoint.to_string());
        let refresh: http::Uri = format!("{base}/quota/v1/refresh")
            .parse()
            .map_err(|_| bad())?;
        if refresh.scheme_str() != Some("http") || refresh.authority().is_none() {
            return Err(bad());
        }
        let release = format!("{base}/quota/v1/release")
            .parse()
            .map_err(|_| bad())?;
        Ok(Self {
            base,
            refresh,
            release,
        })
    }
}

/// The server called first.
#[derive(Clone, Debug)]
enum Current {
    /// The i-th of the list.
    Listed(usize),
    /// The leader a follower named.
    Leader(Target),
}

/// The resources leased, indexed by name (replaced whole when one is added).
struct Table {
    resources: Vec<Arc<ResourceClient>>,
    /// By name, with foldhash (names come from the configuration, and SipHash was most of
    /// the cost of a decision by name).
    index: HashMap<String, usize, foldhash::fast::RandomState>,
}

impl Table {
    fn new(resources: Vec<Arc<ResourceClient>>) -> Self {
        let index = resources
            .iter()
            .enumerate()
            .map(|(i, r)| (r.name().to_string(), i))
            .collect();
        Self { resources, index }
    }
}

/// Most resources one client leases (the server takes at most this many per call).
pub const MAX_RESOURCES: usize = 1_000;

/// The servers called and how: the client id, its token, the list and the one called first.
pub(crate) struct Transport {
    pub(crate) client_id: String,
    /// `Bearer TOKEN`, when the server asks for one.
    authorization: Option<http::HeaderValue>,
    targets: Vec<Target>,
    current: parking_lot::Mutex<Current>,
    http: Client<HttpConnector, Full<Bytes>>,
}

impl Transport {
    /// A transport to `endpoint` (`http://HOST:PORT[,…]`) as `client_id`, sending `token`.
    pub(crate) fn new(
        endpoint: &str,
        client_id: &str,
        token: Option<String>,
    ) -> Result<Self, NetError> {
        let targets = endpoint
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(Target::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if targets.is_empty() {
            return Err(NetError::Endpoint(endpoint.to_string()));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        Ok(Self {
            client_id: client_id.to_string(),
            authorization: token
                .and_then(|t| http::HeaderValue::try_from(format!("Bearer {t}")).ok())
                .map(|mut v| {
                    v.set_sensitive(true);
                    v
                }),
            targets,
            current: parking_lot::Mutex::new(Current::Listed(0)),
            http: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(90))
                .build(connector),
        })
    }

    /// The server called first now (for a release).
    fn current_target(&self) -> Target {
        match self.current.lock().clone() {
            Current::Listed(i) => self.targets[i].clone(),
            Current::Leader(t) => t,
        }
    }
}

struct Inner {
    link: Transport,
    clock: MonotonicClock,
    table: arc_swap::ArcSwap<Table>,
    /// For resources added later.
    seed: u64,
    config: ClientConfig,
    stop: tokio::sync::Notify,
    /// A resource was added: refresh now.
    wake: tokio::sync::Notify,
    task: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// A process's leases on a lease server (see the module documentation). Clones share them.
#[derive(Clone)]
pub struct LeaseClient {
    inner: Arc<Inner>,
}

impl LeaseClient {
    /// A client identified as `client_id` of the lease server at `endpoint`
    /// (`http://HOST:PORT`, the HTTP port of `weir serve --quota`; several servers sharing
    /// the quota as a comma-separated list).
    pub fn builder(endpoint: &str, client_id: &str) -> Builder {
        Builder {
            endpoint: endpoint.to_string(),
            client_id: client_id.to_string(),
            token: None,
            config: ClientConfig::default(),
            resources: Vec::new(),
        }
    }

    /// Takes `n` units of `resource` now (on the client's own clock); `None` for a resource
    /// not declared.
    #[inline]
    pub fn acquire(&self, resource: &str, n: u64) -> Option<Decision> {
        self.acquire_at(resource, n, self.inner.clock.now())
    }

    /// Takes `n` units of `resource` at `now`, read on the caller's clock — one clock for all
    /// the decisions on a resource (the local limiter keeps its state in that clock's time).
    #[inline]
    pub fn acquire_at(&self, resource: &str, n: u64, now: Nanos) -> Option<Decision> {
        let table = self.inner.table.load();
        let i = *table.index.get(resource)?;
        Some(table.resources[i].acquire(n, now))
    }

    /// Corrects a charge `held` of `resource` (units being costs: see
    /// [`ResourceClient::settle`]) to `actual` at `now`, on the clock `acquire_at` was given.
    pub fn settle_at(&self, resource: &str, held: weir_core::cost::Held, actual: u64, now: Nanos) {
        let table = self.inner.table.load();
        if let Some(&i) = table.index.get(resource) {
            table.resources[i].settle(held, actual, now);
        }
    }

    /// The state of `resource` (rate in force, counters).
    pub fn resource(&self, name: &str) -> Option<Arc<ResourceClient>> {
        let table = self.inner.table.load();
        table.index.get(name).map(|&i| table.resources[i].clone())
    }

    /// Leases `name` too (a reloaded configuration uses a new resource), enforcing `safe`
    /// units/s until its first lease, which is asked for at once. Answers whether it was
    /// added (`false`: already leased, or [`MAX_RESOURCES`] reached — then logged).
    pub fn add_resource(&self, name: &str, safe: f64) -> bool {
        let mut added = false;
        self.inner.table.rcu(|t| {
            added = false;
            if t.index.contains_key(name) || t.resources.len() >= MAX_RESOURCES {
                return Arc::clone(t);
            }
            added = true;
            let mut resources = t.resources.clone();
            resources.push(Arc::new(ResourceClient::new(
                name,
                self.inner.config,
                safe,
                self.inner.seed ^ resources.len() as u64,
                self.inner.clock.now(),
            )));
            Arc::new(Table::new(resources))
        });
        if added {
            tracing::info!(client = %self.inner.link.client_id, resource = name, "lease client: new resource");
            self.inner.wake.notify_one();
        } else if self.inner.table.load().resources.len() >= MAX_RESOURCES
            && !self.inner.table.load().index.contains_key(name)
        {
            tracing::warn!(client = %self.inner.link.client_id, resource = name, "lease client: at most {MAX_RESOURCES} resources; this one keeps its safe capacity");
        }
        added
    }

    /// Stops refreshing and gives every lease back to the server (best effort, 2 s at most).
    pub async fn shutdown(self) {
        self.inner.stop.notify_one();
        let task = self.inner.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
        let table = self.inner.table.load();
        let body = crate::wire::ReleaseRequest {
            client: self.inner.link.client_id.clone(),
            resources: table
                .resources
                .iter()
                .map(|r| r.name().to_string())
                .collect(),
            lease_ids: table
                .resources
                .iter()
                .map(|r| lease_id_text(r.lease_id()))
                .collect(),
        };
        let body = serde_json::to_string(&body).unwrap_or_default();
        let target = self.inner.link.current_target();
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            post(&self.inner.link, &target.release, body),
        )
        .await;
    }
}

/// Cluster flow rules of weir-rules decide through the lease client.
impl weir_rules::engine::ClusterQuota for LeaseClient {
    fn acquire_at(&self, resource: &str, n: u64, now: Nanos) -> Option<Decision> {
        LeaseClient::acquire_at(self, resource, n, now)
    }

    fn settle_at(&self, resource: &str, held: weir_core::cost::Held, actual: u64, now: Nanos) {
        LeaseClient::settle_at(self, resource, held, actual, now);
    }
}

pub(crate) async fn post(
    inner: &Transport,
    uri: &http::Uri,
    body: String,
) -> Result<(u16, Bytes), String> {
    let mut req = http::Request::post(uri.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    if let Some(auth) = &inner.authorization {
        req.headers_mut()
            .insert(http::header::AUTHORIZATION, auth.clone());
    }
    let r = inner.http.request(req).await.map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let bytes = http_body_util::Limited::new(r.into_body(), 1 << 20)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, bytes))
}

/// One refresh of every resource: their leases, in order, or why not.
async fn refresh_all(
    inner: &Inner,
    table: &Table,
    now: Nanos,
) -> Result<Vec<Option<Lease>>, String> {
    let resources = table
        .resources
        .iter()
        .map(|r| {
            let a = r.ask(now);
            crate::wire::ResourceAsk {
                resource: r.name().to_string(),
                wants: a.wants,
                has: a.has,
                safe: a.safe,
                lease_id: Some(lease_id_text(a.lease_id)),
                weight: a.weight,
                priority: Some(a.priority.as_str().to_string()),
                needs: a.needs,
                holds: None,
                term: 0,
                parts: Vec::new(),
            }
        })
        .collect();
    let request = crate::wire::RefreshRequest {
        client: inner.link.client_id.clone(),
        resources,
    };
    let body = serde_json::to_string(&request).map_err(|e| e.to_string())?;
    let v = call_leader(&inner.link, body).await?;
    let answer: crate::wire::RefreshResponse =
        serde_json::from_value(v).map_err(|e| format!("the answer: {e}"))?;
    // One validation for every reader of the lease API (crate::wire::LeaseAnswer::lease).
    Ok(answer
        .leases
        .iter()
        .map(|l| l.lease(now).map(|(lease, _)| lease))
        .collect())
}

/// Sends a refresh to the server called first, following a follower's `421` to the leader
/// it names and moving on to the next listed server when one cannot answer: at most every
/// listed server and two redirects per refresh.
pub(crate) async fn call_leader(
    inner: &Transport,
    body: String,
) -> Result<serde_json::Value, String> {
    let first = inner.current.lock().clone();
    let n = inner.targets.len();
    let (mut at, mut next_listed) = match &first {
        Current::Listed(i) => (first.clone(), (i + 1) % n),
        Current::Leader(_) => (first.clone(), 0),
    };
    let mut listed_tried = usize::from(matches!(first, Current::Listed(_)));
    let mut redirects = 0;
    let mut last_error: String;
    loop {
        let target = match &at {
            Current::Listed(i) => &inner.targets[*i],
            Current::Leader(t) => t,
        };
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            post(inner, &target.refresh, body.clone()),
        )
        .await
        .map_err(|_| "no answer within 5 s".to_string())
        .and_then(|r| r);
        match answer {
            Ok((200, bytes)) => {
                *inner.current.lock() = at;
                return serde_json::from_slice(&bytes).map_err(|e| e.to_string());
            }
            Ok((421, bytes)) if redirects < 2 => {
                let leader = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|v| v["leader"].as_str().map(str::to_string))
                    .and_then(|l| Target::parse(&l).ok());
                if let Some(t) = leader {
                    if t.base != target.base {
                        tracing::info!(client = %inner.client_id, leader = %t.base, "lease server: following the leader");
                        redirects += 1;
                        at = match inner.targets.iter().position(|x| x.base == t.base) {
                            Some(i) => Current::Listed(i),
                            None => Current::Leader(t),
                        };
                        continue;
                    }
                }
                last_error = format!("{}: not the leader, and names no other", target.base);
            }
            Ok((status, bytes)) => {
                last_error = format!(
                    "{}: HTTP {status}: {}",
                    target.base,
                    String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                );
            }
            Err(e) => last_error = format!("{}: {e}", target.base),
        }
        if listed_tried >= n {
            // Start from the next listed server on the next refresh.
            *inner.current.lock() = Current::Listed(next_listed);
            return Err(last_error);
        }
        at = Current::Listed(next_listed);
        next_listed = (next_listed + 1) % n;
        listed_tried += 1;
    }
}

async fn refresh_loop(inner: Arc<Inner>) {
    let mut reachable: Option<bool> = None;
    loop {
        let now = inner.clock.now();
        // The table as of this round: the answers come in its order.
        let table = inner.table.load_full();
        if table.resources.iter().any(|r| r.due(now)) {
            match refresh_all(&inner, &table, now).await {
                Ok(leases) => {
                    if reachable != Some(true) {
                        tracing::info!(client = %inner.link.client_id, "lease server reached");
                    }
                    reachable = Some(true);
                    let now = inner.clock.now();
                    for (r, lease) in table.resources.iter().zip(leases) {
                        match lease {
                            Some(l) => r.on_lease(l, now),
                            None => r.on_failure(now),
                        }
                    }
                }
                Err(e) => {
                    if reachable != Some(false) {
                        tracing::warn!(client = %inner.link.client_id, error = %e, "lease server unreachable; leases kept until they expire");
                    }
                    reachable = Some(false);
                    let now = inner.clock.now();
                    for r in &table.resources {
                        r.on_failure(now);
                    }
                }
            }
        }
        let now = inner.clock.now();
        for r in &table.resources {
            let before = r.rate().1;
            if r.poll(now) == Source::Safe && before == Source::Granted {
                tracing::warn!(
                    resource = r.name(),
                    "lease expired: using the safe capacity"
                );
            }
        }
        let next = table
            .resources
            .iter()
            .map(|r| r.next_refresh_at())
            .min()
            .unwrap_or(now)
            .saturating_sub(now)
            .min(1_000_000_000);
        tokio::select! {
            () = inner.stop.notified() => return,
            () = inner.wake.notified() => {}
            () = tokio::time::sleep(Duration::from_nanos(next.max(1_000_000))) => {}
        }
    }
}
