//! The running service: gRPC RLS v3, the HTTP API, metrics, hot reload.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    self as pbr, rate_limit::Unit as PbUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use parking_lot::RwLock;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

use super::config::{self, DomainConfig, Unit};
use super::engine::{
    BadRequest, Engine, EngineOptions, HeaderStyle, Request, RequestDescriptor, Response,
};
use super::store::Store;
use crate::admin::metrics::{Metrics, CONTENT_TYPE};
use crate::net::budget::{BodyError, Budget, ConnectionBudget};
use crate::reload::Reloads;

/// The bundled example configuration (served without `--config`).
pub const EXAMPLE: &str = include_str!("../../config/example.yaml");

/// Shared state of the service.
pub struct Service {
    engine: RwLock<Arc<Engine>>,
    options: EngineOptions,
    config: Option<PathBuf>,
    /// The process's metrics registry (served at `/metrics`).
    metrics: Arc<Metrics>,
    /// Requests refused as invalid.
    bad_requests: AtomicU64,
    /// Changes of the configuration seen.
    reloads: Arc<Reloads>,
    headers: HeaderStyle,
    latency: super::latency::Latency,
    quota: Option<Arc<crate::quota::api::QuotaApi>>,
    last_reload: parking_lot::Mutex<Option<weir_tower::dashboard::Reload>>,
    /// The configuration's watcher, once [`Service::watch`] started it.
    watcher: parking_lot::Mutex<Option<weir_rules::watch::Watcher>>,
}

impl Service {
    /// Builds from the configuration at `config` (or the bundled example), with counters in
    /// `store`; its metrics go to `metrics` (the builder registers its collector,
    /// [`super::metrics::RlsCollector`]).
    pub fn new(
        config: Option<PathBuf>,
        store: Arc<dyn Store>,
        options: EngineOptions,
        metrics: Arc<Metrics>,
    ) -> Result<Self, Vec<String>> {
        let domains = load(config.as_deref(), options.merge_domains)?;
        let engine = Engine::build(&domains, options, store, None).map_err(|e| vec![e])?;
        Ok(Self {
            engine: RwLock::new(Arc::new(engine)),
            options,
            config,
            metrics,
            bad_requests: AtomicU64::new(0),
            reloads: Arc::default(),
            headers: HeaderStyle::None,
            latency: super::latency::Latency::default(),
            quota: None,
            last_reload: parking_lot::Mutex::new(None),
            watcher: parking_lot::Mutex::new(None),
        })
    }

    /// Asks Envoy to add rate-limit headers of `style` to responses.
    pub fn with_headers(mut self, style: HeaderStyle) -> Self {
        self.headers = style;
        self
    }

    /// The cluster-quota lease API, if served.
    pub fn quota(&self) -> Option<&Arc<crate::quota::api::QuotaApi>> {
        self.quota.as_ref()
    }

    /// Also serves the cluster-quota lease API (`quota_api`) on the HTTP and gRPC ports.
    pub fn with_quota(mut self, quota: Arc<crate::quota::api::QuotaApi>) -> Self {
        self.quota = Some(quota);
        self
    }

    /// The process's metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Requests refused as invalid so far.
    pub fn bad_requests(&self) -> u64 {
        self.bad_requests.load(Ordering::Relaxed)
    }

    /// Counts a request refused as invalid.
    pub(crate) fn refused(&self) {
        self.bad_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Changes of the configuration seen so far.
    pub fn reloads(&self) -> &Reloads {
        &self.reloads
    }

    /// The decision-latency histogram.
    pub fn latency(&self) -> &super::latency::Latency {
        &self.latency
    }

    /// The style of rate-limit headers asked of Envoy.
    pub fn header_style(&self) -> HeaderStyle {
        self.headers
    }

    /// The current engine.
    pub fn engine(&self) -> Arc<Engine> {
        self.engine.read().clone()
    }

    /// Decides a request, recording the latency.
    pub async fn decide(&self, request: &Request) -> Result<Response, BadRequest> {
        let start = self.latency.start();
        let engine = self.engine();
        let r = engine.decide(request).await;
        self.latency.since(start);
        if r.is_err() {
            self.refused();
        }
        r
    }

    /// Reloads the configuration file(s); on error the previous configuration stays.
    pub fn reload(&self) -> Result<(), Vec<String>> {
        let result = self.try_reload();
        *self.last_reload.lock() = Some(weir_tower::dashboard::Reload {
            t: weir_tower::dashboard::unix_now(),
            ok: result.is_ok(),
            error: result.as_ref().err().map(|e| e.join("; ")),
        });
        result
    }

    fn try_reload(&self) -> Result<(), Vec<String>> {
        let domains = load(self.config.as_deref(), self.options.merge_domains)?;
        let current = self.engine();
        let store = current.store().clone();
        let engine =
            Engine::build(&domains, self.options, store, Some(&current)).map_err(|e| vec![e])?;
        *self.engine.write() = Arc::new(engine);
        Ok(())
    }

    /// The last reload's time and result (none before the first).
    pub fn last_reload(&self) -> Option<weir_tower::dashboard::Reload> {
        self.last_reload.lock().clone()
    }

    /// Where decisions are counted.
    pub fn store(&self) -> Arc<dyn Store> {
        self.engine().store().clone()
    }

    /// The configuration file or directory (none: the bundled example).
    pub fn config_path(&self) -> Option<&std::path::Path> {
        self.config.as_deref()
    }

    /// Checks the configuration every `interval` and reloads it when its contents changed
    /// ([`crate::reload::watch`]: by content, off the request path).
    pub fn watch(self: &Arc<Self>, interval: Duration) {
        let Some(path) = self.config.clone() else {
            return;
        };
        match crate::reload::watch(
            self,
            path,
            interval,
            self.reloads.clone(),
            "configuration",
            Self::reload,
        ) {
            Ok(w) => *self.watcher.lock() = Some(w),
            Err(e) => tracing::error!(error = %e, "cannot watch the configuration for changes"),
        }
    }
}

/// Loads the configuration at `path`, or the bundled example.
pub fn load(
    path: Option<&std::path::Path>,
    merge_domains: bool,
) -> Result<Vec<DomainConfig>, Vec<String>> {
    match path {
        Some(p) => {
            config::load(p, merge_domains).map_err(|es| es.iter().map(|e| e.to_string()).collect())
        }
        None => config::parse(std::path::Path::new("<bundled example>"), EXAMPLE)
            .map(|d| vec![d])
            .map_err(|es| es.iter().map(|e| e.to_string()).collect()),
    }
}

fn pb_unit(u: Unit) -> PbUnit {
    match u {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn unit_from_pb(u: i32) -> Option<Unit> {
    Some(match PbUnit::try_from(u).ok()? {
        PbUnit::Second => Unit::Second,
        PbUnit::Minute => Unit::Minute,
        PbUnit::Hour => Unit::Hour,
        PbUnit::Day => Unit::Day,
        PbUnit::Week => Unit::Week,
        PbUnit::Month => Unit::Month,
        PbUnit::Year => Unit::Year,
        PbUnit::Unknown => return None,
    })
}

pub(super) fn from_proto(r: RateLimitRequest) -> Result<Request, BadRequest> {
    let descriptors = r
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d): (usize, RateLimitDescriptor)| {
            let limit = match d.limit {
                Some(l) => Some((
                    l.requests_per_unit,
                    unit_from_pb(l.unit).ok_or_else(|| {
                        BadRequest(format!(
                            "descriptors[{i}].limit.unit: unknown unit {}",
                            l.unit
                        ))
                    })?,
                )),
                None => None,
            };
            Ok(RequestDescriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit,
                hits_addend: d.hits_addend.map(|h| h.value),
                negative: d.is_negative_hits,
            })
        })
        .collect::<Result<_, BadRequest>>()?;
    Ok(Request {
        domain: r.domain,
        descriptors,
        hits_addend: r.hits_addend,
    })
}

/// The gRPC answer of `r`, its headers in `style`.
pub(crate) fn to_proto(r: &Response, style: HeaderStyle) -> RateLimitResponse {
    let code = |over: bool| if over { pbr::Code::OverLimit } else { pbr::Code::Ok } as i32;
    RateLimitResponse {
        overall_code: code(r.over_limit),
        statuses: r
            .statuses
            .iter()
            .map(|s| pbr::DescriptorStatus {
                code: code(s.over_limit),
                current_limit: s.limit.as_ref().map(|l| pbr::RateLimit {
                    name: l.name.as_deref().unwrap_or_default().to_string(),
                    requests_per_unit: u32::try_from(l.requests_per_unit).unwrap_or(u32::MAX),
                    unit: pb_unit(l.unit) as i32,
                }),
                limit_remaining: u32::try_from(s.remaining).unwrap_or(u32::MAX),
                duration_until_reset: s.limit.as_ref().map(|_| prost_types_duration(s.reset)),
                quota: None,
            })
            .collect(),
        dynamic_metadata: r.metadata.as_ref().map(pb_struct),
        response_headers_to_add: r
            .headers(style)
            .into_iter()
            .map(
                |(key, value)| envoy_types::pb::envoy::config::core::v3::HeaderValue {
                    key,
                    value,
                    ..Default::default()
                },
            )
            .collect(),
        ..Default::default()
    }
}

/// `duration_until_reset` in whole seconds, rounded up (Lyft's answers: from 1 up to the
/// unit while a window runs).
fn prost_types_duration(d: Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(whole_seconds(d)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// Seconds rounded up.
fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// JSON → `google.protobuf.Struct`.
fn pb_struct(m: &serde_json::Map<String, Value>) -> envoy_types::pb::google::protobuf::Struct {
    envoy_types::pb::google::protobuf::Struct {
        fields: m.iter().map(|(k, v)| (k.clone(), pb_value(v))).collect(),
    }
}

fn pb_value(v: &Value) -> envoy_types::pb::google::protobuf::Value {
    use envoy_types::pb::google::protobuf::{value::Kind, ListValue};
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(pb_value).collect(),
        }),
        Value::Object(m) => Kind::StructValue(pb_struct(m)),
    };
    envoy_types::pb::google::protobuf::Value { kind: Some(kind) }
}

// ---- HTTP: proto3 JSON ----

fn u64_any<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error;
    Ok(match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(
            n.as_u64()
                .ok_or_else(|| D::Error::custom("expected an unsigned integer"))?,
        ),
        Some(Value::String(s)) => {
            Some(s.parse().map_err(|_| {
                D::Error::custom(format!("expected an unsigned integer, got {s:?}"))
            })?)
        }
        Some(other) => {
            return Err(D::Error::custom(format!(
                "expected an unsigned integer, got {other}"
            )))
        }
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(
        alias = "requests_per_unit",
        rename = "requestsPerUnit",
        default,
        deserialize_with = "u64_any"
    )]
    requests_per_unit: Option<u64>,
    unit: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    limit: Option<JsonOverride>,
    #[serde(
        alias = "hits_addend",
        rename = "hitsAddend",
        default,
        deserialize_with = "u64_any"
    )]
    hits_addend: Option<u64>,
    #[serde(alias = "is_negative_hits", rename = "isNegativeHits", default)]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(
        alias = "hits_addend",
        rename = "hitsAddend",
        default,
        deserialize_with = "u64_any"
    )]
    hits_addend: Option<u64>,
}

/// The request in a `/json` body (proto3 JSON of `RateLimitRequest`), checked.
pub fn from_json(body: &[u8]) -> Result<Request, BadRequest> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let r: JsonRequest = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| {
            let inner = e.inner();
            let mut reason = inner.to_string();
            // serde_json's words for a \uD800–\uDFFF escape without its pair ("unexpected end
            // of hex escape", "lone leading surrogate") say nothing a client can act on.
            if reason.contains("hex escape") || reason.contains("surrogate") {
                reason = format!(
                    "invalid \\u escape: a UTF-16 surrogate (\\ud800–\\udfff) must be followed by its pair; a lone one is not a character (line {} column {})",
                    inner.line(),
                    inner.column()
                );
            }
            BadRequest(format!("request body: {}: {reason}", e.path()))
        })?;
    // The JSON form is the proto's: map it onto the proto types and decode once.
    let descriptors = r
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let limit = match d.limit {
                Some(l) => Some(RateLimitOverride {
                    requests_per_unit: u32::try_from(l.requests_per_unit.unwrap_or(0)).map_err(
                        |_| {
                            BadRequest(format!("descriptors[{i}].limit.requestsPerUnit: too large"))
                        },
                    )?,
                    unit: Unit::parse(&l.unit)
                        .map(|u| pb_unit(u) as i32)
                        .ok_or_else(|| {
                            BadRequest(format!(
                                "descriptors[{i}].limit.unit: unknown unit {:?}",
                                l.unit
                            ))
                        })?,
                }),
                None => None,
            };
            Ok(RateLimitDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                limit,
                hits_addend: d
                    .hits_addend
                    .map(|value| envoy_types::pb::google::protobuf::UInt64Value { value }),
                is_negative_hits: d.is_negative_hits,
            })
        })
        .collect::<Result<_, BadRequest>>()?;
    from_proto(RateLimitRequest {
        domain: r.domain,
        descriptors,
        hits_addend: u32::try_from(r.hits_addend.unwrap_or(0))
            .map_err(|_| BadRequest("hitsAddend: too large".into()))?,
    })
}

fn to_json(r: &Response, style: HeaderStyle) -> Value {
    let code = |over: bool| if over { "OVER_LIMIT" } else { "OK" };
    let headers: Vec<Value> = r
        .headers(style)
        .into_iter()
        .map(|(k, v)| json!({"key": k, "value": v}))
        .collect();
    let mut out = json!({
        "overallCode": code(r.over_limit),
        "statuses": r.statuses.iter().map(|s| {
            let mut v = json!({"code": code(s.over_limit)});
            if let Some(l) = &s.limit {
                // proto3 JSON leaves out an empty name, as Lyft's answer does.
                v["currentLimit"] = match &l.name {
                    Some(name) => json!({"name": &**name, "requestsPerUnit": l.requests_per_unit, "unit": l.unit.proto_name()}),
                    None => json!({"requestsPerUnit": l.requests_per_unit, "unit": l.unit.proto_name()}),
                };
                v["limitRemaining"] = json!(s.remaining);
                v["durationUntilReset"] = json!(format!("{}s", whole_seconds(s.reset)));
            } else if s.remaining > 0 {
                // an unlimited descriptor
                v["limitRemaining"] = json!(s.remaining);
            }
            v
        }).collect::<Vec<_>>(),
    });
    if !headers.is_empty() {
        out["responseHeadersToAdd"] = Value::Array(headers);
    }
    if let Some(m) = &r.metadata {
        out["dynamicMetadata"] = Value::Object(m.clone());
    }
    out
}

/// Largest `/json` body (the gRPC message limit).
const MAX_JSON_BODY: usize = crate::grpc::frame::MAX_MESSAGE;

async fn json_handler(
    State(service): State<Arc<Service>>,
    axum::Extension(budget): axum::Extension<Arc<ConnectionBudget>>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let error =
        |status: StatusCode, e: String| (status, axum::Json(json!({"error": e}))).into_response();
    let body = match budget.read(request.into_body(), MAX_JSON_BODY).await {
        Ok(b) => b,
        Err(e) => {
            service.refused();
            let status = match e {
                BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                BodyError::ConnectionFull(_) | BodyError::ProcessFull(_) => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                BodyError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
                BodyError::Read(_) => StatusCode::BAD_REQUEST,
            };
            return error(status, e.to_string());
        }
    };
    let request = match from_json(&body.bytes) {
        Ok(r) => r,
        Err(e) => {
            service.refused();
            return error(StatusCode::BAD_REQUEST, e.0);
        }
    };
    match service.decide(&request).await {
        Ok(r) => {
            let status = if r.over_limit {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(to_json(&r, service.headers))).into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, axum::Json(json!({"error": e.0}))).into_response(),
    }
}

async fn metrics_handler(State(service): State<Arc<Service>>) -> axum::response::Response {
    (
        [(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)],
        service.metrics.render(),
    )
        .into_response()
}

/// What the HTTP listener serves besides the rate-limit API.
pub struct Admin {
    /// The live dashboard (page at `/`, data at `/api/v1/dashboard`).
    pub dashboard: Arc<weir_tower::dashboard::Dashboard>,
    /// The bearer token the dashboard's data and `/metrics` require (none: open).
    pub token: Option<String>,
}

/// Serves the HTTP API (`POST /json`, `GET /healthz`, `GET /metrics`) and the dashboard over
/// HTTP/1.1 and h2c until `shutdown` says stop and its connections have finished, within
/// `limits` (connections, their timeouts) and `bodies` (request bodies buffered).
pub async fn serve_http(
    service: Arc<Service>,
    listener: tokio::net::TcpListener,
    limits: crate::net::accept::Limits,
    bodies: Arc<Budget>,
    admin: Admin,
    shutdown: crate::net::accept::Shutdown,
) {
    use weir_tower::dashboard;
    let quota = service.quota.as_ref().map(|q| q.routes());
    let mut data = Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(service.clone())
        .merge(admin.dashboard.api_router());
    if let Some(q) = &service.quota {
        data = data.merge(q.data_routes());
    }
    let mut app = Router::new()
        .route("/json", post(json_handler))
        .route("/healthz", get(|| async { "OK\n" }))
        .route("/healthcheck", get(|| async { "OK\n" }))
        .with_state(service)
        .merge(dashboard::require_bearer(data, admin.token.as_deref()))
        .merge(dashboard::page_router());
    if let Some(q) = quota {
        app = app.merge(q);
    }
    crate::net::accept::serve(
        listener,
        limits.max_connections,
        "HTTP",
        shutdown,
        move |stream, _, sd, conn| {
            let app = app.clone().layer(axum::Extension(bodies.connection()));
            crate::net::accept::serve_http(stream, app, limits.timeouts, sd, conn)
        },
    )
    .await;
}

/// Binds an address, naming it in the error.
pub async fn bind(addr: SocketAddr, what: &str) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        // Another server on this host has the port: say which flag moves this one.
        let hint = match (e.kind(), what) {
            (std::io::ErrorKind::AddrInUse, "gRPC") => {
                " (another server has it: choose another port with --grpc-addr)"
            }
            (std::io::ErrorKind::AddrInUse, "HTTP") => {
                " (another server has it: choose another port with --http-addr)"
            }
            _ => "",
        };
        format!("cannot listen for {what} on {addr}: {e}{hint}")
    })
}
