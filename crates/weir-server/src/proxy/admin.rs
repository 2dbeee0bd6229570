//! The proxy's admin port: the dashboard, `/metrics`, `/healthz` and the switch API.

use std::path::PathBuf;
use std::sync::Arc;

use weir_rules::engine::Rules;

use super::metrics::ProxyStats;
use crate::admin::switches;

/// Most connections to the admin listener at once.
pub const ADMIN_CONNECTIONS: usize = 64;

/// What the admin listener serves.
pub(super) struct Admin {
    pub(super) rules: Arc<Rules<weir_core::AnyClock>>,
    pub(super) stats: Arc<ProxyStats>,
    pub(super) dashboard: Arc<weir_tower::dashboard::Dashboard>,
    pub(super) token: Option<String>,
    pub(super) switch_file: PathBuf,
    /// The process's metrics registry (the proxy's collector registered).
    pub(super) registry: Arc<crate::admin::metrics::Metrics>,
}

pub(super) async fn serve_admin(
    listener: tokio::net::TcpListener,
    admin: Admin,
    timeouts: crate::net::conn::Timeouts,
    shutdown: crate::net::accept::Shutdown,
) {
    use axum::routing::get;
    use weir_tower::dashboard;
    let Admin {
        rules,
        stats,
        dashboard: dash,
        token,
        switch_file,
        registry,
    } = admin;
    let mut data = axum::Router::new();
    if token.is_some() {
        // Changes need the token: without one the routes do not exist.
        data = data.merge(switches::routes(switches::Switches {
            rules: rules.clone(),
            path: switch_file,
            changes: stats.switch_changes.clone(),
            lock: Default::default(),
        }));
    }
    let data = data
        .route(
            "/metrics",
            get(move |headers: http::HeaderMap| {
                let answer = crate::admin::metrics::answer(&registry, &headers);
                async move { answer }
            }),
        )
        .merge(dash.api_router());
    let app = dashboard::require_bearer(data, token.as_deref())
        .merge(dashboard::page_router())
        .route("/healthz", get(|| async { "ok\n" }));
    // A handful of scrapers and probes at most: a small cap keeps a connection flood off the
    // proxy; at the cap the connection idle the longest makes room, so health checks get in.
    crate::net::accept::serve(
        listener,
        ADMIN_CONNECTIONS,
        "admin",
        shutdown,
        move |stream, _, sd, conn| {
            crate::net::accept::serve_http(stream, app.clone(), timeouts, sd, conn)
        },
    )
    .await;
}
