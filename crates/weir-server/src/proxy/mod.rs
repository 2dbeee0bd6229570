//! `weir proxy`: a reverse proxy applying a weir-rules file to every request.
//!
//! Accepts HTTP/1.1 and h2c (prior knowledge) on `--listen`, maps each request to a resource by
//! the rule file's `http.routes`, answers blocked requests itself (429 / 403 / 503 with
//! `Retry-After`, `RateLimit-*` and a problem body, see `weir_tower::rules`), and forwards the
//! rest to `--upstream` over pooled HTTP/1.1 connections. The rule file is re-read when it
//! changes (state kept; an invalid file is reported and the old rules stay). An unreachable
//! upstream gets 502, a slow one 504 after `--upstream-timeout`: never a hang. `--admin`
//! serves the live dashboard (weir-tower's `dashboard`), `/metrics` (Prometheus text) and
//! `/healthz`; `--admin-token` puts the dashboard's data and `/metrics` behind a bearer token.

mod admin;
mod ahead;
pub mod budget_file;
mod forward;
mod h1_client;
mod headers;
pub mod lean;
mod metrics;
pub mod paced;
mod settings;
mod shared;
mod slots;

pub use admin::ADMIN_CONNECTIONS;
pub use forward::{MAX_IDLE_UPSTREAM, MAX_UPSTREAM_PER_CLIENT};
pub use headers::{append_via, refuse, strip_hop_by_hop};
pub use metrics::ProxyStats;
pub use settings::{parse_upstream, Http1, Settings, StartError, UpstreamError, UpstreamProtocol};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::Uri;
use weir_rules::engine::Rules;
use weir_rules::watch::{Event, Watcher};
use weir_tower::rules::RulesLayer;

use crate::admin::switches;

use admin::{serve_admin, Admin};
use forward::{client_service, gutter, primary, Forward};
use settings::{file, setting};

/// A proxy ready to serve: its rules loaded and watched, its leases started, its upstream
/// clients made. [`Proxy::build`] from [`Settings`], [`Proxy::connect_store`], then
/// [`Proxy::serve`] on listeners the caller opened ([`bind_shared`] for the clients' one, so
/// that every worker thread listens on its own) and [`Proxy::release_leases`] once stopped.
pub struct Proxy {
    rules: Arc<Rules<weir_core::AnyClock>>,
    quota: Option<weir_quota::net::LeaseClient>,
    stats: Arc<ProxyStats>,
    dashboard: Arc<weir_tower::dashboard::Dashboard>,
    forward: Forward,
    gutter: Option<Forward>,
    switch_file: PathBuf,
    registry: Arc<crate::admin::metrics::Metrics>,
    settings: Settings,
    /// Records a span of sampled decisions (see [`Proxy::trace`]).
    tracer: Option<Arc<crate::otlp::Tracer>>,
    _watcher: Watcher,
}

impl Proxy {
    /// Loads the rule file (and the switch states saved beside it), starts the leases of its
    /// cluster rules and the file's watcher, and makes the upstream clients.
    pub fn build(s: Settings) -> Result<Self, StartError> {
        let upstream = parse_upstream(&s.upstream).map_err(setting)?;
        if crate::net::points_at(&upstream, s.listen) {
            return Err(setting(format_args!(
                "--upstream {} is this proxy's own --listen address: every request would loop",
                s.upstream
            )));
        }
        let (rules, switch_file) = load_rules(&s)?;
        let quota = lease_client(&s, &rules)?;
        let stats = Arc::new(ProxyStats::default());
        let dashboard = weir_tower::dashboard::Dashboard::for_rules(
            "weir proxy",
            rules.clone(),
            Some(s.rules.clone()),
        );
        let watcher = watch_rules(&s, &rules, quota.clone(), &dashboard, &stats)?;
        let forward = primary(&s, upstream, &stats);
        let gutter = gutter(&s, &forward, &stats)?;
        let registry = Arc::new(crate::admin::metrics::Metrics::new());
        registry.register(metrics::ProxyCollector {
            rules: rules.clone(),
            stats: stats.clone(),
        });
        Ok(Self {
            rules,
            quota,
            stats,
            dashboard,
            forward,
            gutter,
            switch_file,
            registry,
            settings: s,
            tracer: None,
            _watcher: watcher,
        })
    }

    /// Records a span of each decision `tracer` samples: a child of the span the request's
    /// `traceparent` names, lasting until the response ends (when a `cost:` rule settles);
    /// an admitted request traced goes on with the decision's span as its `traceparent`'s
    /// parent. For the workers [`Proxy::serve`] starts from then on.
    pub fn trace(&mut self, tracer: Arc<crate::otlp::Tracer>) {
        self.tracer = Some(tracer);
    }

    /// Serves clients on `listener` and, when given, the dashboard, `/metrics` and the switch
    /// API on `admin`, until `shutdown` says stop and the connections have finished.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        admin: Option<tokio::net::TcpListener>,
        shutdown: crate::net::accept::Shutdown,
    ) {
        let s = &self.settings;
        // Budget counts are written while serving and once more on the way out (awaited
        // below, so a stopped proxy has saved them).
        let keeping = tokio::spawn(budget_file::keep(
            self.rules.clone(),
            budget_file::state_path(&s.rules),
            shutdown.clone(),
        ));
        if let Some(admin) = admin {
            self.spawn_admin(admin, shutdown.clone());
        }
        let first = self.worker();
        // One worker thread per core, each a current-thread runtime with its own listener
        // (SO_REUSEPORT) and upstream pools: a request is served start to end on one thread,
        // without cross-thread wake-ups (docs/proxy.md, "Where the time goes").
        let (limits, workers) = (s.limits, s.workers.max(1));
        let slots = crate::net::accept::Slots::new(limits.max_connections);
        let local = listener.local_addr().ok();
        let Ok(given) = listener.into_std() else {
            keeping.abort();
            return;
        };
        let mut given = Some(given);
        let mut done = Vec::with_capacity(workers);
        for i in 0..workers {
            let Some(std_listener) = worker_listener(i, workers, local, &mut given) else {
                continue;
            };
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            done.push(rx);
            let forward = first.forward.with_own_pools(s);
            let worker = Worker {
                lean: first.lean.as_ref().map(|l| {
                    Arc::new(lean::Lean {
                        forward: forward.clone(),
                        layer: l.layer.clone(),
                        timeouts: limits.timeouts,
                    })
                }),
                forward,
                gutter: first.gutter.as_ref().map(|g| g.with_own_pools(s)),
                layer: first.layer.clone(),
                read_json: first.read_json.clone(),
                budget: first.budget.clone(),
            };
            let (slots, shutdown) = (slots.clone(), shutdown.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("weir-proxy-{i}"))
                .spawn(move || {
                    worker.run(std_listener, slots, limits.timeouts, shutdown);
                    let _ = tx.send(());
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a proxy worker thread");
            }
        }
        // A listener no worker took (they all have their own) closes now.
        drop(given);
        for rx in done {
            let _ = rx.await;
        }
        let _ = keeping.await;
    }

    /// Serves the dashboard, `/metrics` and the switch API on `admin` until `shutdown`.
    fn spawn_admin(&self, admin: tokio::net::TcpListener, shutdown: crate::net::accept::Shutdown) {
        let s = &self.settings;
        self.dashboard.spawn_sampler();
        tokio::spawn(serve_admin(
            admin,
            Admin {
                rules: self.rules.clone(),
                stats: self.stats.clone(),
                dashboard: self.dashboard.clone(),
                token: s.admin_token.clone(),
                switch_file: self.switch_file.clone(),
                registry: self.registry.clone(),
            },
            s.limits.timeouts,
            shutdown,
        ));
    }

    /// What every worker serves with: the upstreams (each worker makes its own pools), the
    /// rules' layer, the JSON body reader and the process's body budget.
    fn worker(&self) -> Worker {
        let s = &self.settings;
        let mut layer = RulesLayer::new(self.rules.clone());
        if let Some(t) = &self.tracer {
            layer = layer.with_tracer(Arc::new(crate::otlp::trace::LayerTracer(t.clone())));
        }
        // JSON request bodies are read first only for routes whose resource takes its
        // estimate from the body, and within the budgets every connection draws on.
        let routes = layer.clone();
        let read_json = weir_tower::cost::ReadJsonLayer::new(
            move |parts| routes.reads_request_json(parts),
            s.body_pace.idle,
        );
        let budget = crate::net::budget::Budget::new(crate::net::budget::BodyLimits {
            total: s.max_buffered_bytes,
            ..crate::net::budget::BodyLimits::default()
        });
        // The lean path serves what it can unless a gutter (its breakers and lanes) or a tracer
        // must see every request (see `lean`).
        let lean =
            (s.http1 == Http1::Lean && self.gutter.is_none() && self.tracer.is_none()).then(|| {
                Arc::new(lean::Lean {
                    forward: self.forward.clone(),
                    layer: layer.clone(),
                    timeouts: s.limits.timeouts,
                })
            });
        Worker {
            forward: self.forward.clone(),
            gutter: self.gutter.clone(),
            lean,
            layer,
            read_json,
            budget,
        }
    }

    /// The process's metrics registry: what the admin port's `/metrics` renders, and what
    /// [`crate::otlp::spawn`] exports.
    pub fn metrics(&self) -> &Arc<crate::admin::metrics::Metrics> {
        &self.registry
    }

    /// Connects the shared store (`--store`), where `shared: true` rules count from then on.
    /// A store that cannot be reached at start is an error (a Redis Cluster is not: its
    /// rules' local fallbacks decide until it answers); later outages fall back the same way.
    pub async fn connect_store(&self) -> Result<(), StartError> {
        let Some(url) = &self.settings.store else {
            return Ok(());
        };
        let limiter = weir_redis::RedisLimiter::connect(url, weir_redis::RedisConfig::default())
            .await
            .map_err(|e| StartError::Store(format!("--store {url:?}: {e}")))?;
        let keys = 100_000;
        self.rules.set_shared(shared::RedisShared::new(
            limiter,
            self.settings.instances,
            keys,
        ));
        Ok(())
    }

    /// The upstream requests go to.
    pub fn upstream(&self) -> &Uri {
        &self.forward.to.upstream
    }

    /// The gutter upstream refused and failing requests go to, if any.
    pub fn gutter(&self) -> Option<&Uri> {
        self.gutter.as_ref().map(|g| &g.to.upstream)
    }

    /// The rule file.
    pub fn rules_file(&self) -> &std::path::Path {
        &self.settings.rules
    }

    /// Gives the cluster rules' leases back, so that other proxies get the capacity at once.
    pub async fn release_leases(&self) {
        if let Some(q) = &self.quota {
            q.clone().shutdown().await;
        }
    }
}

/// The rule file's rules on `--clock`, with the switch states saved beside it (set over the
/// admin API before a restart); answers the switch state file too.
fn load_rules(s: &Settings) -> Result<(Arc<Rules<weir_core::AnyClock>>, PathBuf), StartError> {
    let set = weir_rules::watch::load(&s.rules).map_err(file)?;
    if set.http.as_ref().is_none_or(|h| h.routes.is_empty()) {
        tracing::warn!(
            file = %s.rules.display(),
            "the rule file has no http.routes: every request passes unlimited"
        );
    }
    let clock = s
        .clock
        .build()
        .map_err(|e| setting(format_args!("--clock: {e}")))?;
    let rules = Rules::with_clock(&set, clock)
        .map_err(|e| file(format_args!("{}: {e}", s.rules.display())))?;
    let switch_file = switches::state_path(&s.rules);
    let saved = switches::load(&switch_file).map_err(file)?;
    if !saved.is_empty() {
        tracing::info!(file = %switch_file.display(), "switch states restored: {saved:?}");
        rules.restore_switches(&saved);
    }
    let budget_file = budget_file::state_path(&s.rules);
    let restored = budget_file::restore(&rules, &budget_file).map_err(file)?;
    if restored > 0 {
        tracing::info!(file = %budget_file.display(), "budget counts restored: {restored}");
    }
    Ok((Arc::new(rules), switch_file))
}

/// The lease client of the rules' cluster resources (none without cluster rules; an error
/// without `--quota-server`).
fn lease_client(
    s: &Settings,
    rules: &Rules<weir_core::AnyClock>,
) -> Result<Option<weir_quota::net::LeaseClient>, StartError> {
    let cluster = rules.cluster_resources();
    match (&s.quota_server, cluster.is_empty()) {
        (_, true) => Ok(None),
        (None, false) => {
            let names: Vec<&str> = cluster.iter().map(|(n, _)| n.as_str()).collect();
            Err(setting(format_args!(
                "{}: cluster flow rules ({}) need --quota-server http://HOST:PORT",
                s.rules.display(),
                names.join(", ")
            )))
        }
        (Some(server), false) => {
            let mut b = weir_quota::net::LeaseClient::builder(server, &s.quota_client_id)
                .token(s.quota_token.clone());
            for (name, safe) in &cluster {
                b = b.resource(name, *safe);
            }
            let client = b
                .start()
                .map_err(|e| setting(format_args!("--quota-server: {e}")))?;
            rules.set_cluster(client.clone());
            Ok(Some(client))
        }
    }
}

/// Applies the rule file's changes as they come: new cluster resources are leased too, the
/// dashboard and the counters see each outcome.
fn watch_rules(
    s: &Settings,
    rules: &Arc<Rules<weir_core::AnyClock>>,
    leases: Option<weir_quota::net::LeaseClient>,
    dashboard: &Arc<weir_tower::dashboard::Dashboard>,
    stats: &Arc<ProxyStats>,
) -> Result<Watcher, StartError> {
    let (reloaded, file, dash, st) = (
        rules.clone(),
        s.rules.clone(),
        dashboard.clone(),
        stats.clone(),
    );
    Watcher::start(rules.clone(), s.rules.clone(), s.reload_interval, move |e| {
        match e {
            Event::Applied => {
                // Cluster resources new in this file are leased too; without a quota server
                // their rules enforce their safe capacity.
                for (name, safe) in reloaded.cluster_resources() {
                    match &leases {
                        Some(q) => {
                            q.add_resource(&name, safe);
                        }
                        None => tracing::warn!(
                            file = %file.display(),
                            "cluster resource {name:?} without --quota-server: enforcing its safe capacity ({safe}/s) locally"
                        ),
                    }
                }
                dash.note_reload(Ok(()));
                st.reloads_applied.fetch_add(1, Ordering::Relaxed)
            }
            // The watcher logged it (one warning line with file, line and column).
            Event::Rejected(e) => {
                dash.note_reload(Err(e.to_string()));
                st.reloads_rejected.fetch_add(1, Ordering::Relaxed)
            }
        };
    })
    .map_err(StartError::Watcher)
}

/// Worker `i`'s listener (of `workers`): the first takes the given listener; the others a
/// listener of their own when the given one allows sharing its address (`local`), else a
/// handle on the given one. No handle stays here: on shutdown the workers' closing is the
/// listener's.
fn worker_listener(
    i: usize,
    workers: usize,
    local: Option<std::net::SocketAddr>,
    given: &mut Option<std::net::TcpListener>,
) -> Option<std::net::TcpListener> {
    let own = if i == 0 {
        None
    } else {
        local.and_then(|addr| listener_beside(addr).ok())
    };
    match (own, given.as_ref()) {
        (Some(l), _) => Some(l),
        (None, Some(g)) if i + 1 < workers => g.try_clone().ok(),
        (None, _) => given.take(),
    }
}

/// What one worker thread serves clients with.
struct Worker {
    forward: Forward,
    gutter: Option<Forward>,
    /// The lean HTTP/1.1 path (none: hyper serves every connection).
    lean: Option<Arc<lean::Lean>>,
    layer: RulesLayer<weir_core::AnyClock>,
    read_json: weir_tower::cost::ReadJsonLayer,
    /// The process's budget of read request bytes (shared by every worker).
    budget: Arc<crate::net::budget::Budget>,
}

impl Worker {
    /// Serves `listener` on this thread's own current-thread runtime until `shutdown` says
    /// stop and its connections have ended (those of every worker: `slots` are shared).
    fn run(
        self,
        listener: std::net::TcpListener,
        slots: crate::net::accept::Slots,
        timeouts: crate::net::conn::Timeouts,
        shutdown: crate::net::accept::Shutdown,
    ) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot start a proxy worker's runtime");
                return;
            }
        };
        runtime.block_on(async move {
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "a proxy worker cannot use its listener");
                    return;
                }
            };
            let Worker {
                forward,
                gutter,
                lean,
                layer,
                read_json,
                budget,
            } = self;
            // Idle upstream connections close on their age or the upstream's close even when no
            // request comes to take them.
            tokio::spawn(forward.to.bodiless.clone().keep_pruned());
            if let Some(g) = &gutter {
                tokio::spawn(g.to.bodiless.clone().keep_pruned());
            }
            crate::net::accept::serve_in(
                listener,
                &slots,
                "proxy",
                shutdown,
                move |stream, peer, sd, conn| {
                    let (forward, gutter, layer) = (forward.clone(), gutter.clone(), layer.clone());
                    let (read_json, budget) = (read_json.clone(), budget.clone());
                    // hyper's service for this connection, made only when hyper serves it.
                    let hyper = {
                        let (sd, conn) = (sd.clone(), conn.clone());
                        move |io| {
                            let conn_budget = budget.connection();
                            let read_json = read_json.with_budget(conn_budget.clone());
                            let svc = client_service(
                                &forward,
                                gutter.as_ref(),
                                &layer,
                                &read_json,
                                &conn_budget,
                                peer,
                            );
                            crate::net::accept::serve_http(io, svc, timeouts, sd, conn)
                        }
                    };
                    let lean = lean.clone();
                    async move {
                        match lean {
                            Some(lean) => lean::serve(stream, peer, lean, sd, conn, hyper).await,
                            None => {
                                hyper(crate::net::rewind::Rewind::new(bytes::Bytes::new(), stream))
                                    .await
                            }
                        }
                    }
                },
            )
            .await;
        });
    }
}

/// A listener on `addr` beside one already there (SO_REUSEPORT: the kernel spreads new
/// connections among them); fails when that one does not share its address.
fn listener_beside(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    bind_shared(addr)?.into_std()
}

/// A listener on `addr` whose address other listeners of this process may share
/// (SO_REUSEPORT), one per worker thread.
pub fn bind_shared(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}
