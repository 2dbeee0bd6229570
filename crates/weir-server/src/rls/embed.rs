//! The rate-limit service for any tokio program: [`Server::builder`], then
//! [`Server::serve_grpc`] (what Envoy calls) and [`Server::serve_http`] (the JSON API, health,
//! `/metrics` and the dashboard), each until a future of the caller's completes.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;

use super::engine::{EngineOptions, HeaderStyle};
use super::server::{Admin, Service};
use super::store::{MemoryStore, Store};
use crate::admin::metrics::Metrics;
use crate::net::accept::Limits;
use crate::net::budget::{BodyLimits, Budget};
use crate::quota::api::QuotaApi;

/// Envoy's rate-limit service, ready to serve on listeners the caller opened.
pub struct Server {
    service: Arc<Service>,
    limits: Limits,
    bodies: Arc<Budget>,
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
}

/// Why a [`Server`] could not be built: every error of the configuration, each with its file,
/// line and column.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct BuildError(pub Vec<String>);

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
        }
    }

    /// The service itself (decisions, reloads, the engine's counters).
    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// Serves gRPC (`ShouldRateLimit`, health, reflection) on `listener` until `stop`
    /// completes, then lets the calls in flight finish.
    pub async fn serve_grpc(&self, listener: TcpListener, stop: impl Future<Output = ()>) {
        let (trigger, shutdown) = crate::net::accept::shutdown();
        let serve = crate::grpc::router::serve_grpc(
            self.service.clone(),
            listener,
            self.limits,
            self.bodies.clone(),
            shutdown,
        );
        until(serve, stop, trigger).await;
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
        let dashboard = super::dashboard::dashboard(self.service.clone());
        dashboard.spawn_sampler();
        let (trigger, shutdown) = crate::net::accept::shutdown();
        let serve = super::server::serve_http(
            self.service.clone(),
            listener,
            self.limits,
            self.bodies.clone(),
            Admin { dashboard, token },
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
    /// [`super::RedisStore`] for one limit across instances, or any [`Store`]).
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

    /// Loads the configuration and builds the engine.
    pub fn build(self) -> Result<Server, BuildError> {
        let mut service = Service::new(self.config, self.store, self.options, self.metrics)
            .map_err(BuildError)?
            .with_headers(self.headers);
        if let Some(q) = self.quota {
            service = service.with_quota(q);
        }
        let service = Arc::new(service);
        let metrics = service.metrics();
        metrics.register(super::metrics::RlsCollector(Arc::downgrade(&service)));
        if let Some(q) = service.quota() {
            metrics.register(crate::quota::api::Collector(Arc::downgrade(q)));
        }
        let bodies = Budget::new(self.bodies);
        service
            .metrics()
            .register(super::metrics::BufferedBodies(bodies.clone()));
        Ok(Server {
            service,
            limits: self.limits,
            bodies,
        })
    }
}
