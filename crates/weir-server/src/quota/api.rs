//! The cluster-quota lease API over HTTP/JSON, served by `weir serve --quota FILE` on its HTTP
//! port (for clients in any language; a gRPC API is to come):
//!
//! - `POST /quota/v1/refresh` `{"client": ID, "resources": [{"resource": NAME, "wants": W,
//!   "has": H, "leaseId": "…", "weight": 1, "priority": "CRITICAL"}, …]}` →
//!   `{"leases": [{"resource": NAME, "granted": G, "expiresInMs": E, "refreshInMs": R,
//!   "safeCapacity": S, "learning": L, "leaseId": "…"} | {"resource": NAME, "error": "…"},
//!   …]}` in request order. `has`, `leaseId`, `weight` and `priority` are optional; weight and
//!   priority count only where the quota file's `clients` section allows them.
//! - `POST /quota/v1/release` `{"client": ID, "resources": [NAME, …], "leaseIds": ["…", …]}`
//!   → 204. A grant released without its lease id counts until it would have expired.
//!
//! With a `clients` section, each call carries `Authorization: Bearer TOKEN` where an entry
//! asks for one: 401 without an accepted token, 403 for a client id no entry covers.
//! - `GET /quota/v1/allocations` → every resource in use: capacity, demands, grants, clients.
//!
//! Times are relative (ms from now): clients and server need not share a clock. The quota file
//! is checked every second and reloaded when its contents change (leases kept); an invalid
//! file is logged with its locations and the previous configuration stays.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use weir_core::{Clock, Criticality, MonotonicClock};
use weir_quota::config::QuotaConfig;
use weir_quota::server::LeaseServer;
use weir_quota::Ask;
use weir_rules::yaml::LocatedErrors;

use crate::net::budget::ConnectionBudget;

/// Largest request body of the quota API.
const MAX_BODY: usize = 1 << 20;
/// Most per-client series in `/metrics` (the allocation table lists every client).
pub const MAX_CLIENT_SERIES: usize = 10_000;
/// Most resources in one refresh.
pub const MAX_RESOURCES_PER_CALL: usize = 1_000;

/// Why a lease-API call is refused as a whole.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// A malformed or invalid request (400, INVALID_ARGUMENT).
    #[error("{0}")]
    Bad(String),
    /// The caller is not allowed (401/403, UNAUTHENTICATED/PERMISSION_DENIED).
    #[error(transparent)]
    Denied(#[from] weir_quota::clients::Denied),
}

impl From<String> for CallError {
    fn from(s: String) -> Self {
        Self::Bad(s)
    }
}

/// Why a lease server could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The quota file's problems, one per line, each with its file, line and column.
    #[error("{0}")]
    Config(#[from] LocatedErrors),
    /// The parent lease server's address.
    #[error("the parent lease server: {0}")]
    Parent(weir_quota::net::NetError),
}

/// The lease server, its clock and its file.
pub struct QuotaApi {
    pub(crate) server: Arc<LeaseServer>,
    pub(crate) clock: MonotonicClock,
    path: PathBuf,
    /// Failover through Redis, when several servers share the quota.
    pub(crate) ha: Option<Arc<crate::quota::ha::Ha>>,
    /// Envoy's RLQS on this lease server (made on first use).
    rlqs: std::sync::OnceLock<Arc<crate::quota::rlqs::Rlqs>>,
    /// The quota file's watcher, once [`QuotaApi::watch`] started it.
    watcher: parking_lot::Mutex<Option<weir_rules::watch::Watcher>>,
    /// Changes of the quota file seen.
    reloads: Arc<crate::reload::Reloads>,
    /// Capacities leased from a parent lease server (a tree of servers), while it runs.
    parent: parking_lot::Mutex<Option<weir_quota::net::ParentLink>>,
}

/// A parent lease server: this one leases its capacities from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Parent {
    /// `http://HOST:PORT` of its HTTP API (several sharing a quota: comma-separated).
    pub endpoint: String,
    /// This server's client id there (stable across restarts).
    pub client_id: String,
    /// The bearer token to present, if its quota file asks for one.
    pub token: Option<String>,
}

/// Builds a [`QuotaApi`]: [`QuotaApi::builder`].
pub struct Builder {
    path: PathBuf,
    failover: Option<crate::quota::ha::Ha>,
    watch: Option<Duration>,
    parent: Option<Parent>,
}

impl Builder {
    /// Shares the quota with other servers through Redis: only the elected leader allocates
    /// ([`crate::quota::ha`]); the others name it. Started by [`Builder::build`].
    pub fn failover(mut self, ha: crate::quota::ha::Ha) -> Self {
        self.failover = Some(ha);
        self
    }

    /// Reloads the file every `interval` when its contents changed ([`QuotaApi::watch`]).
    pub fn watch(mut self, interval: Duration) -> Self {
        self.watch = Some(interval);
        self
    }

    /// Leases every capacity from `parent` instead of taking the file's (at most the file's):
    /// a regional server of a tree of lease servers ([`weir_quota::upstream`]). Only the
    /// leader of a failover group leases.
    pub fn parent(mut self, parent: Parent) -> Self {
        self.parent = Some(parent);
        self
    }

    /// Loads the file, starts the lease server (learning for one lease length), its watcher,
    /// its failover and its leases from a parent. Errors are the file's (one per line) or the
    /// parent's address. Must run inside a tokio runtime when a parent is given.
    pub fn build(self) -> Result<Arc<QuotaApi>, OpenError> {
        let api = QuotaApi::open(self.path, self.failover)?;
        if let Some(p) = self.parent {
            let ha = api.ha.clone();
            let link = weir_quota::net::ParentLink::start(
                api.server.clone(),
                api.clock.clone(),
                &p.endpoint,
                &p.client_id,
                p.token,
                move |now| crate::quota::ha::term(ha.as_deref(), now),
            )
            .map_err(OpenError::Parent)?;
            *api.parent.lock() = Some(link);
        }
        if let Some(interval) = self.watch {
            api.watch(interval);
        }
        api.start_failover();
        Ok(api)
    }
}

impl QuotaApi {
    /// A lease server of the quota file at `path`.
    pub fn builder(path: PathBuf) -> Builder {
        Builder {
            path,
            failover: None,
            watch: None,
            parent: None,
        }
    }

    /// Loads `path` and starts the lease server (learning for one lease length).
    pub fn load(path: PathBuf) -> Result<Arc<Self>, OpenError> {
        Self::open(path, None)
    }

    /// Loads `path` for one of several servers sharing the quota through Redis: only the
    /// elected leader allocates ([`crate::quota::ha`]); the others name it.
    pub fn load_with_failover(
        path: PathBuf,
        ha: crate::quota::ha::Ha,
    ) -> Result<Arc<Self>, OpenError> {
        Self::open(path, Some(ha))
    }

    fn open(path: PathBuf, ha: Option<crate::quota::ha::Ha>) -> Result<Arc<Self>, OpenError> {
        let config = QuotaConfig::load(&path)?;
        for w in config.warnings() {
            tracing::warn!("{}: {w}", path.display());
        }
        let clock = MonotonicClock::new();
        Ok(Arc::new(Self {
            server: Arc::new(LeaseServer::new(config, clock.now())),
            clock,
            path,
            ha: ha.map(Arc::new),
            rlqs: std::sync::OnceLock::new(),
            reloads: Arc::default(),
            watcher: parking_lot::Mutex::new(None),
            parent: parking_lot::Mutex::new(None),
        }))
    }

    /// Refuses the id of an open RLQS stream's bucket ([`crate::quota::rlqs::Rlqs::owns`]).
    fn not_an_envoy(&self, client: &str) -> Result<(), String> {
        match self.rlqs.get() {
            Some(r) if r.owns(client) => Err(format!(
                "client: {client:?} is an Envoy's RLQS bucket; the lease API cannot act for it"
            )),
            _ => Ok(()),
        }
    }

    /// `None` when this server may allocate now; otherwise where the quota leader is
    /// (`Some(None)`: no leader known yet).
    pub fn elsewhere(&self, now: weir_core::Nanos) -> Option<Option<crate::quota::ha::Leader>> {
        crate::quota::ha::elsewhere(self.ha.as_deref(), now)
    }

    /// Starts campaigning for the leadership, when this server shares the quota through
    /// Redis (until it is dropped or resigns).
    pub fn start_failover(&self) {
        if let Some(ha) = &self.ha {
            crate::quota::ha::start(&self.server, self.clock.clone(), ha);
        }
    }

    /// A stopping leader steps down ([`crate::quota::ha::resign`]).
    pub async fn resign(&self) {
        if let Some(ha) = &self.ha {
            crate::quota::ha::resign(&self.server, &self.clock, ha).await;
        }
    }

    /// The lease server.
    pub fn lease_server(&self) -> &LeaseServer {
        &self.server
    }

    /// Whether the quota file in force has an `rlqs` section.
    pub fn serves_rlqs(&self) -> bool {
        self.server.rlqs_config().is_some()
    }

    /// The `rlqs` section in force.
    pub fn rlqs_config(&self) -> Option<Arc<weir_quota::rlqs::RlqsConfig>> {
        self.server.rlqs_config()
    }

    /// The RLQS service on this lease server.
    pub fn rlqs(self: &Arc<Self>) -> Arc<crate::quota::rlqs::Rlqs> {
        self.rlqs
            .get_or_init(|| {
                crate::quota::rlqs::Rlqs::new(
                    self.server.clone(),
                    self.clock.clone(),
                    self.ha.clone(),
                )
            })
            .clone()
    }

    /// Reloads the file every `interval` when its contents changed, off the request path
    /// ([`crate::reload::watch`]); the lease tables keep their leases.
    pub fn watch(self: &Arc<Self>, interval: Duration) {
        match crate::reload::watch(
            self,
            self.path.clone(),
            interval,
            self.reloads.clone(),
            "quota configuration",
            Self::reload,
        ) {
            Ok(w) => *self.watcher.lock() = Some(w),
            Err(e) => tracing::error!(error = %e, "cannot watch the quota file for changes"),
        }
    }

    /// Reads the quota file again and applies it.
    fn reload(&self) -> Result<(), LocatedErrors> {
        let config = QuotaConfig::load(&self.path)?;
        for w in config.warnings() {
            tracing::warn!("{}: {w}", self.path.display());
        }
        self.server.reload(config);
        Ok(())
    }

    /// The lease routes (refresh, release), to merge into the HTTP API.
    pub fn routes(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/quota/v1/refresh", post(refresh))
            .route("/quota/v1/release", post(release))
            .with_state(self.clone())
    }

    /// `GET /quota/v1/allocations`: every client's id, demand and grant — data for
    /// operators, served beside the dashboard's data (behind `--admin-token` when set).
    pub fn data_routes(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/quota/v1/allocations", get(allocations))
            .with_state(self.clone())
    }

    /// One refresh of `client` presenting `bearer` (`count` resources asked, `asks` the
    /// first of them, `parts` the demand of each ask in parts when a lease server below sends
    /// them) at `now`, whatever the protocol: the checks of the call, the caller's weight and
    /// priority from the quota file, then the lease server. A server below's `parts`, `holds`
    /// and `term` are honoured only for a caller whose `clients` entry lets it choose its own
    /// values, `own_values: true` — otherwise each ask counts as one client.
    fn refresh(
        &self,
        client: &str,
        bearer: Option<&str>,
        count: usize,
        asks: &mut [(String, Ask)],
        mut parts: Vec<Vec<weir_quota::lease::Part>>,
        now: weir_core::Nanos,
    ) -> Result<Vec<Result<weir_quota::Lease, weir_quota::server::Refusal>>, CallError> {
        check_client(client)?;
        self.not_an_envoy(client)?;
        let rule = self.server.admit(client, bearer)?;
        if count > MAX_RESOURCES_PER_CALL {
            return Err(CallError::Bad(format!(
                "resources: at most {MAX_RESOURCES_PER_CALL} per call"
            )));
        }
        for (_, ask) in asks.iter_mut() {
            rule.apply(ask);
        }
        if !rule.own_values {
            // A server's statements about its clients count only from a trusted server.
            parts.clear();
            for (_, ask) in asks.iter_mut() {
                ask.holds = None;
                ask.term = 0;
            }
        }
        Ok(self.server.refresh_parts(client, asks, &parts, now))
    }

    /// The one refresh both front ends run, on asks they decoded and [`checked`]: the lease
    /// server's answer to each ask, with the ask's resource, in order.
    pub(crate) fn refresh_checked(
        &self,
        client: &str,
        bearer: Option<&str>,
        checked: CheckedAsks,
        now: weir_core::Nanos,
    ) -> Result<Vec<Answer>, CallError> {
        let CheckedAsks {
            count,
            mut asks,
            parts,
        } = checked;
        let answers = self.refresh(client, bearer, count, &mut asks, parts, now)?;
        warn_of_stale_ids(self, now);
        Ok(asks.into_iter().map(|(r, _)| r).zip(answers).collect())
    }

    /// Gives `client`'s leases on `resources` (each with the lease id the caller holds) back.
    pub(crate) fn release(
        &self,
        client: &str,
        bearer: Option<&str>,
        resources: &[(String, u64)],
    ) -> Result<(), CallError> {
        check_client(client)?;
        self.not_an_envoy(client)?;
        self.server.admit(client, bearer)?;
        self.server.release(client, resources);
        Ok(())
    }

    /// The allocation table for the dashboard: per resource its capacity, the clients'
    /// demands and grants (units/s) and how many clients hold a lease.
    pub fn table(&self) -> Vec<serde_json::Value> {
        self.server
            .allocations(self.clock.now())
            .into_iter()
            .map(|a| {
                serde_json::json!({
                    "resource": a.resource,
                    "capacity": a.capacity,
                    "wants": a.wants,
                    "granted": a.granted,
                    "clients": a.clients.len(),
                    "learning": a.learning,
                })
            })
            .collect()
    }

    /// Writes the lease server's families: every resource in use, its clients (at most
    /// [`MAX_CLIENT_SERIES`] series), reloads, the failover role and RLQS.
    pub fn encode(&self, enc: &mut crate::admin::metrics::Encoder) -> std::fmt::Result {
        use crate::admin::metrics::{counters, gauges};
        let now = self.clock.now();
        let all = self.server.allocations(now);
        let gauge_fields: [(&str, &str, Field<f64>); 4] = [
            (
                "weir_quota_capacity",
                "Units per second of the resource.",
                |a| a.capacity,
            ),
            (
                "weir_quota_wants",
                "Sum of the clients' demands (units/s).",
                |a| a.wants,
            ),
            (
                "weir_quota_granted",
                "Sum of unexpired grants (units/s).",
                |a| a.granted,
            ),
            ("weir_quota_clients", "Clients holding a lease.", |a| {
                a.clients.len() as f64
            }),
        ];
        for (name, help, field) in gauge_fields {
            let rows = all
                .iter()
                .map(|a| ([("resource", a.resource.as_str())], field(a)));
            gauges(enc, name, help, rows)?;
        }
        let counter_fields: [(&str, &str, Field<u64>); 2] = [
            ("weir_quota_refreshes", "Lease refreshes answered.", |a| {
                a.refreshes
            }),
            (
                "weir_quota_expirations",
                "Leases that lapsed without a refresh.",
                |a| a.expirations,
            ),
        ];
        for (name, help, field) in counter_fields {
            let rows = all
                .iter()
                .map(|a| ([("resource", a.resource.as_str())], field(a)));
            counters(enc, name, help, rows)?;
        }
        for (i, (name, help)) in [
            ("weir_quota_client_wants", "A client's demand (units/s)."),
            ("weir_quota_client_granted", "A client's grant (units/s)."),
        ]
        .into_iter()
        .enumerate()
        {
            let labels: Vec<([(&str, &str); 2], f64)> = all
                .iter()
                .flat_map(|a| a.clients.iter().map(move |c| (&a.resource, c)))
                .take(MAX_CLIENT_SERIES)
                .map(|(resource, (client, wants, granted, _))| {
                    let v = if i == 0 { *wants } else { *granted };
                    (
                        [("resource", resource.as_str()), ("client", client.as_str())],
                        v,
                    )
                })
                .collect();
            gauges(enc, name, help, labels)?;
        }
        self.reloads.encode(
            enc,
            "weir_quota_reloads",
            "Quota file changes seen, by result.",
        )?;
        if let Some(ha) = &self.ha {
            ha.encode(now, enc)?;
        }
        if let Some(r) = self.rlqs.get() {
            r.encode(enc)?;
        }
        Ok(())
    }
}

/// A client's ask for `resource` as the front ends read it from the wire (HTTP/JSON or gRPC),
/// all of `wants` needed until [`server_fields`] reads a `needs`.
fn client_ask(
    resource: &str,
    wants: f64,
    has: f64,
    safe: f64,
    weight: f64,
    priority: Criticality,
    lease_id: u64,
) -> (String, Ask) {
    let ask = Ask {
        needs: None,
        wants,
        has,
        safe,
        weight,
        priority,
        lease_id,
        holds: None,
        term: 0,
    };
    (resource.to_string(), ask)
}

/// The lease server's answer to one ask of a refresh, with the ask's resource.
pub(crate) type Answer = (
    String,
    Result<weir_quota::Lease, weir_quota::server::Refusal>,
);

/// One resource's ask as a front end (HTTP/JSON or gRPC) decoded it from its wire, before any
/// check: what both protocols hand the one refresh ([`QuotaApi::refresh_checked`]).
pub(crate) struct DecodedAsk {
    pub resource: String,
    pub wants: f64,
    pub has: f64,
    pub safe: f64,
    pub weight: f64,
    /// Its band, or why it could not be read.
    pub priority: Result<Criticality, String>,
    /// Its lease id, or why it could not be read.
    pub lease_id: Result<u64, String>,
    /// What a measured rate or a lease server below adds.
    pub fields: ServerFields,
}

/// The asks of one refresh, checked: each with its parts, and how many the call carried.
pub(crate) struct CheckedAsks {
    count: usize,
    asks: Vec<(String, Ask)>,
    parts: Vec<Vec<weir_quota::lease::Part>>,
}

/// Checks the asks of one refresh, whatever the protocol: at most [`MAX_RESOURCES_PER_CALL`]
/// are read (the call is refused past it), stopping at the first that is wrong, the error
/// naming its field (`resources[3].parts[1].weight: …`).
pub(crate) fn checked(decoded: &[DecodedAsk]) -> Result<CheckedAsks, String> {
    let read = &decoded[..decoded.len().min(MAX_RESOURCES_PER_CALL)];
    let mut asks = Vec::with_capacity(read.len());
    let mut parts = Vec::with_capacity(read.len());
    for (i, d) in read.iter().enumerate() {
        let priority = d
            .priority
            .clone()
            .map_err(|e| format!("resources[{i}].priority: {e}"))?;
        let lease_id = d
            .lease_id
            .clone()
            .map_err(|e| format!("resources[{i}].leaseId: {e}"))?;
        let mut ask = client_ask(
            &d.resource,
            d.wants,
            d.has,
            d.safe,
            d.weight,
            priority,
            lease_id,
        );
        parts.push(server_fields(i, &d.fields, &mut ask.1)?);
        asks.push(ask);
    }
    Ok(CheckedAsks {
        count: decoded.len(),
        asks,
        parts,
    })
}

/// One value of a resource's allocation.
type Field<T> = fn(&weir_quota::server::Allocation) -> T;

/// The lease server's metrics collector (holds the API weakly: a dropped API reports none).
#[derive(Debug)]
pub struct Collector(pub std::sync::Weak<QuotaApi>);

impl crate::admin::metrics::Collector for Collector {
    fn encode(&self, mut enc: crate::admin::metrics::Encoder) -> std::fmt::Result {
        match self.0.upgrade() {
            Some(api) => api.encode(&mut enc),
            None => Ok(()),
        }
    }
}

/// The fields of an ask that a lease client's measured rate or a lease server below adds, as
/// a front end (HTTP/JSON or gRPC) read them.
pub(crate) struct ServerFields {
    /// Of `wants`, what is needed now.
    pub needs: Option<f64>,
    /// What a server below has granted its clients.
    pub holds: Option<f64>,
    /// A server below's election term.
    pub term: u64,
    /// A server below's demand in parts.
    pub parts: Vec<WirePart>,
}

/// One part of a server-below's demand as a front end read it; its band as read, or why it
/// could not be.
pub(crate) struct WirePart {
    pub wants: f64,
    pub needs: Option<f64>,
    pub weight: f64,
    pub priority: Result<Criticality, String>,
}

/// A band as the JSON API sends it (absent: `CRITICAL`), or why it is none.
fn band(text: Option<&str>) -> Result<Criticality, String> {
    text.map_or(Ok(Criticality::Critical), |p| {
        p.parse().map_err(|e| format!("{e}"))
    })
}

/// A JSON ask as decoded: the fields as sent, the band and lease id read or why not.
fn decoded_json(r: &weir_quota::wire::ResourceAsk) -> DecodedAsk {
    DecodedAsk {
        resource: r.resource.clone(),
        wants: r.wants,
        has: r.has,
        safe: r.safe,
        weight: r.weight,
        priority: band(r.priority.as_deref()),
        lease_id: lease_id(r.lease_id.as_deref()),
        fields: ServerFields {
            needs: r.needs,
            holds: r.holds,
            term: r.term,
            parts: r
                .parts
                .iter()
                .map(|p| WirePart {
                    wants: p.wants,
                    needs: p.needs,
                    weight: p.weight,
                    priority: band(p.priority.as_deref()),
                })
                .collect(),
        },
    }
}

/// Reads `f` (of the `i`-th ask) into `ask`; answers the parts. Errors name the field.
fn server_fields(
    i: usize,
    f: &ServerFields,
    ask: &mut Ask,
) -> Result<Vec<weir_quota::lease::Part>, String> {
    let number = |field: &str, v: f64| {
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(format!("resources[{i}].{field}: {v}: a finite number ≥ 0"))
        }
    };
    if let Some(n) = f.needs {
        ask.needs = Some(number("needs", n)?);
    }
    if let Some(h) = f.holds {
        ask.holds = Some(number("holds", h)?);
    }
    ask.term = f.term;
    if f.parts.len() > weir_quota::lease::MAX_PARTS {
        return Err(format!(
            "resources[{i}].parts: at most {}",
            weir_quota::lease::MAX_PARTS
        ));
    }
    f.parts
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let at = |field: &str| format!("resources[{i}].parts[{j}].{field}");
            let priority = p
                .priority
                .clone()
                .map_err(|e| format!("{}: {e}", at("priority")))?;
            if !(p.weight.is_finite()
                && p.weight > 0.0
                && p.weight <= weir_quota::lease::MAX_WEIGHT)
            {
                return Err(format!(
                    "{}: {}: a finite number > 0 and ≤ {}",
                    at("weight"),
                    p.weight,
                    weir_quota::lease::MAX_WEIGHT
                ));
            }
            let wants = number(&format!("parts[{j}].wants"), p.wants)?;
            let needs = number(&format!("parts[{j}].needs"), p.needs.unwrap_or(wants))?;
            Ok(weir_quota::lease::Part {
                wants,
                needs: needs.min(wants),
                weight: p.weight,
                priority,
            })
        })
        .collect()
}

/// A lease id as the JSON API writes it (16 hex digits; absent or empty: none).
fn lease_id(text: Option<&str>) -> Result<u64, String> {
    let t = text.unwrap_or_default();
    weir_quota::wire::parse_lease_id(t)
        .ok_or_else(|| format!("{t:?}: expected at most 16 hex digits"))
}

/// A client id: 1 to 256 bytes, no control characters (ids become metric labels and log
/// fields).
fn check_client(client: &str) -> Result<(), String> {
    if client.is_empty() || client.len() > 256 {
        return Err("client: 1 to 256 bytes".into());
    }
    if client.chars().any(char::is_control) {
        return Err("client: no control characters".into());
    }
    Ok(())
}

fn bad(message: String) -> axum::response::Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({"error": message})),
    )
        .into_response()
}

/// Warnings of refreshes presenting stale lease ids: at most one a minute.
static STALE_IDS_LOG: weir_core::log_gate::LogGate =
    weir_core::log_gate::LogGate::new(60_000_000_000);

/// Warns (at most once a minute) when refreshes presented lease ids other than their rows':
/// two lease servers (or clients) sharing one client id take the row from each other in
/// turn and waste most of the capacity.
fn warn_of_stale_ids(api: &QuotaApi, now: weir_core::Nanos) {
    if STALE_IDS_LOG.open(now).is_none() {
        return;
    }
    if let Some((n, client)) = api.server.take_stale_ids() {
        tracing::warn!(
            client = %client,
            "{n} refreshes presented a lease id that is not their row's (last from {client:?}): two processes may share one client id (give each its own: --parent-client-id, --quota-client-id)"
        );
    }
}

/// The answer when the lease server's work did not complete (it panicked).
fn failed() -> axum::response::Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        axum::Json(json!({"error": "the lease server failed"})),
    )
        .into_response()
}

/// The answer to a call refused as a whole.
fn refused(e: CallError) -> axum::response::Response {
    use weir_quota::clients::Denied;
    let status = match &e {
        CallError::Bad(_) => StatusCode::BAD_REQUEST,
        CallError::Denied(Denied::Unauthenticated(_)) => StatusCode::UNAUTHORIZED,
        CallError::Denied(Denied::NotAllowed(_)) => StatusCode::FORBIDDEN,
    };
    let mut r = (status, axum::Json(json!({"error": e.to_string()}))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer"),
        );
    }
    r
}

/// The caller's bearer token, if any.
fn bearer(request: &axum::extract::Request) -> Option<String> {
    weir_tower::dashboard::bearer_token(request.headers())
        .map(|b| String::from_utf8_lossy(b).into_owned())
}

/// Reads and parses a JSON body within the connection's budget, naming the field at fault.
async fn body<T: serde::de::DeserializeOwned>(
    budget: &Arc<ConnectionBudget>,
    request: axum::extract::Request,
) -> Result<T, axum::response::Response> {
    let b = budget
        .read(request.into_body(), MAX_BODY)
        .await
        .map_err(|e| bad(e.to_string()))?;
    let mut de = serde_json::Deserializer::from_slice(&b.bytes);
    serde_path_to_error::deserialize(&mut de)
        .map_err(|e| bad(format!("request body: {}: {}", e.path(), e.inner())))
}

async fn refresh(
    State(api): State<Arc<QuotaApi>>,
    axum::Extension(budget): axum::Extension<Arc<ConnectionBudget>>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let token = bearer(&request);
    let b: weir_quota::wire::RefreshRequest = match body(&budget, request).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let decoded: Vec<DecodedAsk> = b.resources.iter().map(decoded_json).collect();
    let checked = match checked(&decoded) {
        Ok(c) => c,
        Err(e) => return bad(e),
    };
    let now = api.clock.now();
    if let Some(r) = crate::quota::ha::not_leader(api.ha.as_deref(), now) {
        return r;
    }
    // Off the workers that decisions run on: lease-server work never stalls them.
    let work = {
        let (api, client) = (api.clone(), b.client);
        move || api.refresh_checked(&client, token.as_deref(), checked, now)
    };
    let Some(answers) = crate::quota::off_the_workers(work).await else {
        return failed();
    };
    let answers = match answers {
        Ok(a) => a,
        Err(e) => return refused(e),
    };
    let leases = answers
        .iter()
        .map(|(resource, a)| match a {
            Ok(l) => weir_quota::wire::LeaseAnswer::granted(resource, l, now),
            Err(e) => weir_quota::wire::LeaseAnswer::refused(e.resource(), e.to_string()),
        })
        .collect();
    axum::Json(weir_quota::wire::RefreshResponse { leases }).into_response()
}

async fn release(
    State(api): State<Arc<QuotaApi>>,
    axum::Extension(budget): axum::Extension<Arc<ConnectionBudget>>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let token = bearer(&request);
    let b: weir_quota::wire::ReleaseRequest = match body(&budget, request).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if b.lease_ids.len() > b.resources.len() {
        return bad("leaseIds: at most one per resource".into());
    }
    let mut resources = Vec::with_capacity(b.resources.len());
    for (i, r) in b.resources.into_iter().enumerate() {
        match lease_id(b.lease_ids.get(i).map(String::as_str)) {
            Ok(id) => resources.push((r, id)),
            Err(e) => return bad(format!("leaseIds[{i}]: {e}")),
        }
    }
    if let Some(r) = crate::quota::ha::not_leader(api.ha.as_deref(), api.clock.now()) {
        return r;
    }
    match api.release(&b.client, token.as_deref(), &resources) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refused(e),
    }
}

async fn allocations(State(api): State<Arc<QuotaApi>>) -> axum::response::Response {
    let now = api.clock.now();
    let all: Vec<Value> = api
        .server
        .allocations(now)
        .into_iter()
        .map(|a| {
            json!({
                "resource": a.resource,
                "capacity": a.capacity,
                "wants": a.wants,
                "granted": a.granted,
                "learning": a.learning,
                "refreshes": a.refreshes,
                "expirations": a.expirations,
                "clients": a.clients.iter().map(|(c, w, g, e)| json!({
                    "client": c, "wants": w, "granted": g,
                    "expiresInMs": e.saturating_sub(now) / 1_000_000,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut out = json!({ "resources": all });
    if let Some(ha) = &api.ha {
        out["failover"] = ha.status(now);
    }
    axum::Json(out).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_api_cannot_act_for_an_envoys_bucket() {
        let dir = std::env::temp_dir().join(format!("weir-rlqs-owns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("q.yaml");
        std::fs::write(&file, "resources:\n  - {name: search, capacity: 10}\n").unwrap();
        let api = QuotaApi::load(file).unwrap();
        let rlqs = api.rlqs();
        let id = rlqs.claim(Some("envoy-1"));
        let bucket = format!("{id}/3:name4:open");
        assert!(rlqs.owns(&bucket));
        assert!(!rlqs.owns("envoy-2/k") && !rlqs.owns(&id));
        let e = api
            .release(&bucket, None, &[("search".to_string(), 0)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("RLQS bucket"), "{e}");
        let ask = ("search".to_string(), weir_quota::Ask::wants(1.0));
        let e = api
            .refresh(&bucket, None, 1, &mut [ask], Vec::new(), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("RLQS bucket"), "{e}");
        assert!(api.release("envoy-2/k", None, &[]).is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }
}
