//! The rate-limit service's state: the engine in force, its configuration (a file, a directory
//! or the bundled example) and its reloads, the decisions' latency and the requests refused.
//! Its front ends are [`super::grpc`] and [`super::json`]; `weir serve` composes them
//! (`crate::serve`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

use super::config::{self, ConfigError, DomainConfig};
use super::engine::Engine;
use super::options::EngineOptions;
use super::request::{BadRequest, HeaderStyle, Request, Response};
use super::store::Store;
use crate::admin::metrics::Metrics;
use crate::otlp::trace::{Begun, Tracer};
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
    last_reload: parking_lot::Mutex<Option<weir_tower::dashboard::Reload>>,
    /// The configuration's watcher, once [`Service::watch`] started it.
    watcher: parking_lot::Mutex<Option<weir_rules::watch::Watcher>>,
    /// Records a span of sampled decisions, once [`Service::trace`] gave it.
    tracer: std::sync::OnceLock<Arc<Tracer>>,
    /// The configuration is pushed ([`Service::apply`]), not read from a file.
    pushed: std::sync::atomic::AtomicBool,
}

impl Service {
    /// Builds from the configuration at `config` (or the bundled example), with counters in
    /// `store`; its metrics go to `metrics` (the builder registers its collector,
    /// its `RlsCollector`).
    pub fn new(
        config: Option<PathBuf>,
        store: Arc<dyn Store>,
        options: EngineOptions,
        metrics: Arc<Metrics>,
    ) -> Result<Self, LoadError> {
        let domains = load(config.as_deref(), options.merge_domains)?;
        let engine = Engine::build(&domains, options, store, None).map_err(LoadError::Engine)?;
        Ok(Self::with_engine(engine, options, config, metrics, false))
    }

    /// A service whose configuration is pushed ([`Service::apply`], by [`crate::xds`]): no
    /// domain until the first push (every request is answered OK, as an unknown domain is).
    pub fn pushed(
        store: Arc<dyn Store>,
        options: EngineOptions,
        metrics: Arc<Metrics>,
    ) -> Result<Self, LoadError> {
        let engine = Engine::build(&[], options, store, None).map_err(LoadError::Engine)?;
        Ok(Self::with_engine(engine, options, None, metrics, true))
    }

    fn with_engine(
        engine: Engine,
        options: EngineOptions,
        config: Option<PathBuf>,
        metrics: Arc<Metrics>,
        pushed: bool,
    ) -> Self {
        Self {
            engine: RwLock::new(Arc::new(engine)),
            options,
            config,
            metrics,
            bad_requests: AtomicU64::new(0),
            reloads: Arc::default(),
            headers: HeaderStyle::None,
            latency: super::latency::Latency::default(),
            last_reload: parking_lot::Mutex::new(None),
            watcher: parking_lot::Mutex::new(None),
            tracer: std::sync::OnceLock::new(),
            pushed: std::sync::atomic::AtomicBool::new(pushed),
        }
    }

    /// Asks Envoy to add rate-limit headers of `style` to responses.
    pub fn with_headers(mut self, style: HeaderStyle) -> Self {
        self.headers = style;
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

    /// Records a span of each decision `tracer` samples from now on, a child of the span the
    /// request's `traceparent` names (see [`crate::otlp::trace`]). Once: a later tracer is
    /// ignored.
    pub fn trace(&self, tracer: Arc<Tracer>) {
        let _ = self.tracer.set(tracer);
    }

    /// The span of a request with `headers`, begun if it may be exported (`None` without a
    /// tracer: one load); [`Service::end_span`] ends it.
    #[inline]
    pub fn begin_span(&self, headers: &http::HeaderMap) -> Option<Begun> {
        let tracer = self.tracer.get()?;
        super::trace::begin(Some(tracer), headers)
    }

    /// Ends the span `begun` of `request`, decided as `answer` (a call of [`Service::decide`]).
    #[cold]
    pub fn end_span(&self, begun: Begun, request: &Request, answer: &Result<Response, BadRequest>) {
        if let Some(t) = self.tracer.get() {
            super::trace::end(t, begun, request, answer);
        }
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
    pub fn reload(&self) -> Result<(), LoadError> {
        let result = self.try_reload();
        self.noted(result)
    }

    /// Keeps `result` as the last reload's (the dashboard shows it), and answers it.
    fn noted(&self, result: Result<(), LoadError>) -> Result<(), LoadError> {
        *self.last_reload.lock() = Some(weir_tower::dashboard::Reload {
            t: weir_tower::dashboard::unix_now(),
            ok: result.is_ok(),
            error: result
                .as_ref()
                .err()
                .map(|e| e.to_string().lines().collect::<Vec<_>>().join("; ")),
        });
        result
    }

    fn try_reload(&self) -> Result<(), LoadError> {
        if self.pushed.load(Ordering::Relaxed) {
            // The configuration is pushed (xDS): there is nothing to read.
            return Ok(());
        }
        let domains = load(self.config.as_deref(), self.options.merge_domains)?;
        self.put_in_force(&domains)
    }

    /// Puts `domains` in force in place of the configuration read so far, the counters of the
    /// rules they keep kept (as a file's reload keeps them); from then on the configuration
    /// is pushed, never read from a file. On error the previous configuration stays. Counted
    /// as a reload (`weir_rls_reloads_total`, the dashboard).
    pub fn apply(&self, domains: &[DomainConfig]) -> Result<(), LoadError> {
        self.pushed.store(true, Ordering::Relaxed);
        let result = self.put_in_force(domains);
        let counter = match &result {
            Ok(()) => &self.reloads.applied,
            Err(_) => &self.reloads.rejected,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.noted(result)
    }

    /// The domains configured now.
    pub fn domains(&self) -> Vec<String> {
        self.engine().domains().map(str::to_string).collect()
    }

    fn put_in_force(&self, domains: &[DomainConfig]) -> Result<(), LoadError> {
        let current = self.engine();
        let store = current.store().clone();
        let engine = Engine::build(domains, self.options, store, Some(&current))
            .map_err(LoadError::Engine)?;
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
) -> Result<Vec<DomainConfig>, LoadError> {
    match path {
        Some(p) => config::load(p, merge_domains).map_err(LoadError::Config),
        None => config::parse(std::path::Path::new("<bundled example>"), EXAMPLE)
            .map(|d| vec![d])
            .map_err(LoadError::Config),
    }
}

/// Why a configuration could not be put in force (at start or on a reload, when the previous
/// one stays): shown one problem per line.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The files' problems, each with its file, line and column, in file order.
    #[error("{}", lines(.0))]
    Config(Vec<ConfigError>),
    /// Valid files the engine could not build (the clock it was asked for, a rule's limit).
    #[error(transparent)]
    Engine(#[from] super::tree::EngineError),
}

fn lines(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}
