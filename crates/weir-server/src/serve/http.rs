//! `weir serve`'s HTTP port: Lyft's `POST /json` ([`crate::rls::json`]), health, `/metrics`,
//! the dashboard and, with a lease server, the lease API's routes
//! ([`crate::quota::api::QuotaApi::routes`]); the dashboard's data and `/metrics` behind the
//! admin token when there is one.

use std::sync::Arc;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::admin::metrics::Metrics;
use crate::net::budget::Budget;
use crate::quota::api::QuotaApi;
use crate::rls::Service;

async fn metrics_handler(
    State(metrics): State<Arc<Metrics>>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    crate::admin::metrics::answer(&metrics, &headers).into_response()
}

/// What the HTTP listener serves besides the rate-limit API.
pub(crate) struct Admin {
    /// The live dashboard (page at `/`, data at `/api/v1/dashboard`).
    pub dashboard: Arc<weir_tower::dashboard::Dashboard>,
    /// The bearer token the dashboard's data and `/metrics` require (none: open).
    pub token: Option<String>,
}

/// Serves the HTTP API (`POST /json`, `GET /healthz`, `GET /metrics`) and the dashboard over
/// HTTP/1.1 and h2c until `shutdown` says stop and its connections have finished, within
/// `limits` (connections, their timeouts) and `bodies` (request bodies buffered).
pub(crate) async fn serve_http(
    service: Arc<Service>,
    quota: Option<Arc<QuotaApi>>,
    listener: tokio::net::TcpListener,
    limits: crate::net::accept::Limits,
    bodies: Arc<Budget>,
    admin: Admin,
    shutdown: crate::net::accept::Shutdown,
) {
    use weir_tower::dashboard;
    let mut data = Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(service.metrics().clone())
        .merge(admin.dashboard.api_router());
    if let Some(q) = &quota {
        data = data.merge(q.data_routes());
    }
    let mut app = crate::rls::json::routes(service)
        .route("/healthz", get(|| async { "OK\n" }))
        .route("/healthcheck", get(|| async { "OK\n" }))
        .merge(dashboard::require_bearer(data, admin.token.as_deref()))
        .merge(dashboard::page_router());
    if let Some(q) = &quota {
        app = app.merge(q.routes());
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
