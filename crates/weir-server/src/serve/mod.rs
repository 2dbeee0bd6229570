//! The `weir serve` process for any tokio program, composed of the services below it: the
//! rate-limit service ([`crate::rls`]) and, when asked, a lease server ([`crate::quota`]) on
//! the same two ports. [`Server::builder`], then [`Server::serve_grpc`] (what Envoy calls:
//! `ShouldRateLimit`, the lease API, RLQS, health, reflection — `serve::grpc`) and
//! [`Server::serve_http`] (Lyft's JSON API, health, `/metrics`, the dashboard, the lease API's
//! routes — `serve::http`), each until a future of the caller's completes. The caller binds the
//! listeners and says where they are.
//!
//! This is the one module that knows every service of the process; `rls` and `quota` know
//! nothing of each other.

mod dashboard;
mod grpc;
mod http;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use grpc::{
    GRPC_CONNECTION_WINDOW, GRPC_MAX_HEADER_LIST, GRPC_MAX_STREAMS, GRPC_STREAM_WINDOW,
};

use crate::admin::metrics::Metrics;
use crate::net::accept::Limits;
use crate::net::budget::{BodyLimits, Budget};
use crate::quota::api::QuotaApi;
use crate::rls::{EngineOptions, HeaderStyle};
use crate::rls::{LoadError, MemoryStore, Service, Store};

/// The `weir serve` process's servers, ready to serve on listeners the caller opened.
pub struct Server {
    service: Arc<Service>,
    quota: Option<Arc<QuotaApi>>,
    limits: Limits,
    bodies: Arc<Budget>,
    /// TLS on the gRPC listener.
    tls: Option<Arc<crate::net::tls::ServerTls>>,
}

/// Builds a [`Server`]: the bundled example configuration, in memory, with the command's
/// bounds, unless told otherwise.
pub struct Builder {
    config: Option<PathBuf>,
    store: Arc<dyn Store>,
    options: EngineOptions,
    headers: HeaderStyle,
    limits: Limits,
    bodies: BodyLimits,
    metrics: Arc<Metrics>,
    quota: Option<Arc<QuotaApi>>,
    /// The configuration is pushed ([`Builder::pushed`]).
    pushed: bool,
}

/// Why a [`Server`] could not be built: every error of the rate-limit configuration, each
/// with its file, line and column, one per line.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct BuildError(#[from] pub LoadError);

impl Server {
    /// A builder with the defaults of `weir serve`.
    pub fn builder() -> Builder {
        Builder {
            config: None,
            store: Arc::new(MemoryStore::default()),
            options: EngineOptions::default(),
            headers: HeaderStyle::None,
            limits: Limits::default(),
            bodies: BodyLimits::default(),
            metrics: Arc::default(),
            quota: None,
            pushed: false,
        }
    }

    /// Records a span of each decision `tracer` samples (`ShouldRateLimit` and `POST /json`),
    /// a child of the span the request's `traceparent` names (see [`crate::otlp::trace`]).
    pub fn trace(&self, tracer: Arc<crate::otlp::Tracer>) {
        self.service.trace(tracer);
    }

    /// The rate-limit service (decisions, reloads, the engine's counters).
    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// The lease server served beside it, if any.
    pub fn quota(&self) -> Option<&Arc<QuotaApi>> {
        self.quota.as_ref()
    }

    /// The process's metrics registry: what `/metrics` renders, and what
    /// [`crate::otlp::spawn`] exports.
    pub fn metrics(&self) -> &Arc<Metrics> {
        self.service.metrics()
    }

    /// Serves gRPC (`ShouldRateLimit`, health, reflection) on `listener` until `stop`
    /// completes, then lets the calls in flight finish.
    pub async fn serve_grpc(&self, listener: TcpListener, stop: impl Future<Output = ()>) {
        let (trigger, shutdown) = crate::net::accept::shutdown();
        let serve = grpc::serve_grpc(
            self.service.clone(),
            self.quota.clone(),
            listener,
            self.limits,
            self.bodies.clone(),
            self.tls.clone(),
            shutdown,
        );
        until(serve, stop, trigger).await;
    }

    /// Serves gRPC over TLS from now on (`serve_grpc` calls after this): the certificates of
    /// `tls`, reloaded as its files change; with a client CA, mutual TLS. Its reloads are
    /// counted in the server's metrics (`weir_tls_reloads_total`).
    pub fn grpc_tls(&mut self, tls: Arc<crate::net::tls::ServerTls>) {
        self.metrics().register(tls.collector());
        self.tls = Some(tls);
    }

    /// Serves the HTTP API (`POST /json`, `GET /healthz`, `GET /metrics`) and the dashboard
    /// on `listener` (the dashboard's data and `/metrics` behind `token` when given) until
    /// `stop` completes, then lets the requests in flight finish.
    pub async fn serve_http(
        &self,
        listener: TcpListener,
        token: Option<String>,
        stop: impl Future<Output = ()>,
    ) {
        let dashboard = dashboard::dashboard(self.service.clone(), self.quota.clone());
        dashboard.spawn_sampler();
        let (trigger, shutdown) = crate::net::accept::shutdown();
        let serve = http::serve_http(
            self.service.clone(),
            self.quota.clone(),
            listener,
            self.limits,
            self.bodies.clone(),
            http::Admin { dashboard, token },
            shutdown,
        );
        until(serve, stop, trigger).await;
    }
}

/// Runs `serve` until it ends, or until `stop` completes: then asks it to finish and waits.
async fn until(
    serve: impl Future<Output = ()>,
    stop: impl Future<Output = ()>,
    trigger: crate::net::accept::ShutdownTrigger,
) {
    tokio::pin!(serve);
    tokio::select! {
        () = &mut serve => return,
        () = stop => trigger.stop(),
    }
    serve.await;
}

impl Builder {
    /// Reads Lyft's configuration from `path` (a file, or a directory of files) instead of the
    /// bundled example; [`Service::watch`] reloads it when it changes.
    pub fn config_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config = Some(path.into());
        self
    }

    /// Where the counters live (default: [`MemoryStore::default`]; a
    /// [`crate::rls::RedisStore`] for one limit across instances, or any [`Store`]).
    pub fn store(self, store: impl Store) -> Self {
        self.store_shared(Arc::new(store))
    }

    /// [`Builder::store`] for a store already shared.
    pub fn store_shared(mut self, store: Arc<dyn Store>) -> Self {
        self.store = store;
        self
    }

    /// Also serves a lease server's API (HTTP/JSON under `/quota/v1/`, gRPC) and, when its
    /// file has an `rlqs` section, Envoy's RLQS, on the same listeners.
    pub fn quota(mut self, quota: Arc<QuotaApi>) -> Self {
        self.quota = Some(quota);
        self
    }

    /// Shadow mode, clock, response metadata, merged domains and the other engine options.
    pub fn options(mut self, options: EngineOptions) -> Self {
        self.options = options;
        self
    }

    /// Asks Envoy to add rate-limit headers of `style` to its responses.
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.headers = style;
        self
    }

    /// Connection bounds of both listeners.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Request-body bounds (per body, and buffered in all).
    pub fn bodies(mut self, bodies: BodyLimits) -> Self {
        self.bodies = bodies;
        self
    }

    /// The metrics registry to report to (default: one of its own); share one with the
    /// program's other servers to serve a single `/metrics`.
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The configuration is pushed, not read: the server starts with no domain (every
    /// request answered OK) until [`crate::xds::XdsClient`] (or [`Service::apply`]) puts one in
    /// force. Takes the place of [`Builder::config_file`].
    pub fn pushed(mut self) -> Self {
        self.pushed = true;
        self
    }

    /// Loads the configuration and builds the engine.
    pub fn build(self) -> Result<Server, BuildError> {
        let service = if self.pushed {
            Service::pushed(self.store, self.options, self.metrics)?
        } else {
            Service::new(self.config, self.store, self.options, self.metrics)?
        }
        .with_headers(self.headers);
        let service = Arc::new(service);
        let metrics = service.metrics();
        metrics.register(crate::rls::metrics::RlsCollector(Arc::downgrade(&service)));
        if let Some(q) = &self.quota {
            metrics.register(crate::quota::api::Collector(Arc::downgrade(q)));
        }
        let bodies = Budget::new(self.bodies);
        metrics.register(crate::rls::metrics::BufferedBodies(bodies.clone()));
        Ok(Server {
            service,
            quota: self.quota,
            limits: self.limits,
            bodies,
            tls: None,
        })
    }
}
