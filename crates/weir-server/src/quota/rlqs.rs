//! Envoy's Rate Limit Quota Service on `weir serve`'s gRPC port
//! (`envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`), served
//! when the quota file has an `rlqs` section: one bidirectional stream per Envoy, driven by a
//! [`weir_quota::rlqs::Session`] on the lease server of [`super::api::QuotaApi`] (docs/rlqs.md).
//!
//! Tonic's generated server handles the stream (a long-lived bidirectional call is not worth
//! framing by hand; the hot path of `ShouldRateLimit` stays hand-framed). Each stream's task
//! answers reports as they come and ticks every second (shares pushed as they move, idle
//! buckets abandoned). A stream is refused (`UNAVAILABLE`) by a server that is not the quota
//! leader, and ended when this server stops leading, so Envoy reconnects — to the leader, as
//! the health check below steers it. `grpc.health.v1.Health/Check` answers `SERVING` on the
//! leader (or a server without failover) and `NOT_SERVING` on the others.
//!
//! A stream's id at the allocator is its `weir-client-id` metadata when Envoy sends one (set
//! `initial_metadata` on the RLQS cluster's gRPC service: then a reconnecting Envoy, or one
//! moving to a new leader, takes up its own leases again), else a per-stream id.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use parking_lot::Mutex;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use weir_core::Clock;
use weir_quota::rlqs::{RlqsTotals, Session};

use weir_core::MonotonicClock;
use weir_quota::server::LeaseServer;

use crate::quota::ha::Ha;

/// The RLQS method's path.
pub const PATH: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// Largest usage report accepted (10 000 buckets of ≈ 100 bytes fit).
pub const MAX_MESSAGE: usize = 4 << 20;

/// Longest `weir-client-id` accepted.
const MAX_CLIENT_ID: usize = 128;

/// The RLQS service of one `weir serve`.
pub struct Rlqs {
    server: Arc<LeaseServer>,
    clock: MonotonicClock,
    /// The failover, when several servers share the quota: only the leader serves streams.
    ha: Option<Arc<Ha>>,
    totals: RlqsTotals,
    /// Client ids of the open streams (a duplicate gets a suffix: never two streams as one
    /// client, which would hide one's grant from the allocator).
    ids: Mutex<HashSet<String>>,
    next: AtomicU64,
}

impl Rlqs {
    /// The service on `server` (read on `clock`), leading or following with `ha`.
    pub fn new(server: Arc<LeaseServer>, clock: MonotonicClock, ha: Option<Arc<Ha>>) -> Arc<Self> {
        Arc::new(Self {
            server,
            clock,
            ha,
            totals: RlqsTotals::default(),
            ids: Mutex::new(HashSet::new()),
            next: AtomicU64::new(1),
        })
    }

    /// Whether another server leads the quota at `now` (streams are then refused and ended).
    fn following(&self, now: weir_core::Nanos) -> bool {
        crate::quota::ha::elsewhere(self.ha.as_deref(), now).is_some()
    }

    /// The tonic service to route RLQS calls to.
    pub fn server(self: &Arc<Self>) -> RateLimitQuotaServiceServer<Handler> {
        RateLimitQuotaServiceServer::new(Handler(self.clone()))
            .max_decoding_message_size(MAX_MESSAGE)
    }

    /// Counts, for `/metrics`.
    pub fn totals(&self) -> &RlqsTotals {
        &self.totals
    }

    /// Whether `client` is the allocator id of a bucket of an open stream (`STREAM/BUCKET`):
    /// the lease API refuses such ids, so no caller can release or take over an Envoy's share.
    pub fn owns(&self, client: &str) -> bool {
        client
            .split_once('/')
            .is_some_and(|(stream, _)| self.ids.lock().contains(stream))
    }

    /// A unique client id for a new stream.
    pub(crate) fn claim(&self, wanted: Option<&str>) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut ids = self.ids.lock();
        let id = match wanted {
            Some(w) if !ids.contains(w) => w.to_string(),
            Some(w) => format!("{w}#{n}"),
            None => format!("rlqs-{n}"),
        };
        ids.insert(id.clone());
        id
    }

    /// Writes the RLQS families.
    pub fn encode(&self, enc: &mut crate::admin::metrics::Encoder) -> std::fmt::Result {
        use crate::admin::metrics::{counter, gauge};
        let t = &self.totals;
        gauge(
            enc,
            "weir_rlqs_streams",
            "RLQS streams open.",
            t.streams.load(Ordering::Relaxed) as f64,
        )?;
        gauge(
            enc,
            "weir_rlqs_buckets",
            "RLQS buckets tracked.",
            t.buckets.load(Ordering::Relaxed) as f64,
        )?;
        counter(
            enc,
            "weir_rlqs_reports",
            "Bucket usage reports received.",
            t.reports.load(Ordering::Relaxed),
        )?;
        counter(
            enc,
            "weir_rlqs_assignments",
            "Quota assignments sent.",
            t.assignments.load(Ordering::Relaxed),
        )?;
        counter(
            enc,
            "weir_rlqs_abandoned_idle",
            "Buckets abandoned after their idle time.",
            t.abandoned_idle.load(Ordering::Relaxed),
        )?;
        counter(
            enc,
            "weir_rlqs_refused",
            "Buckets refused (abandoned at once): a bound reached, or an id too long.",
            t.refused.load(Ordering::Relaxed),
        )?;
        counter(
            enc,
            "weir_rlqs_unmatched",
            "Buckets no rule matches (no assignment sent).",
            t.unmatched.load(Ordering::Relaxed),
        )?;
        Ok(())
    }
}

/// The tonic handler (a handle on [`Rlqs`]).
pub struct Handler(Arc<Rlqs>);

#[tonic::async_trait]
impl RateLimitQuotaService for Handler {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let rlqs = self.0.clone();
        if rlqs.server.rlqs_config().is_none() {
            return Err(Status::unimplemented(
                "this server's quota file has no rlqs section",
            ));
        }
        if rlqs.following(rlqs.clock.now()) {
            return Err(Status::unavailable("this server is not the quota leader"));
        }
        let wanted = request
            .metadata()
            .get("weir-client-id")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= MAX_CLIENT_ID && !v.contains('/'))
            .map(str::to_string);
        let client = rlqs.claim(wanted.as_deref());
        let inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(run(rlqs, client, inbound, tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// One stream, until it ends (or this server stops leading).
async fn run(
    rlqs: Arc<Rlqs>,
    client: String,
    mut inbound: Streaming<RateLimitQuotaUsageReports>,
    tx: tokio::sync::mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
) {
    let totals = &rlqs.totals;
    totals.streams.fetch_add(1, Ordering::Relaxed);
    tracing::info!(client = %client, "RLQS stream opened");
    let mut session = Session::new(&client);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end: Option<Status> = loop {
        let actions = tokio::select! {
            m = inbound.message() => match m {
                Ok(Some(reports)) => {
                    let Some(config) = rlqs.server.rlqs_config() else {
                        break Some(Status::unavailable("RLQS is no longer configured"));
                    };
                    let now = rlqs.clock.now();
                    match session.on_report(reports, now, &rlqs.server, &config, totals) {
                        Ok(a) => a,
                        Err(e) => break Some(Status::invalid_argument(e.to_string())),
                    }
                }
                Ok(None) => break None,
                Err(e) => {
                    tracing::debug!(client = %client, error = %e, "RLQS stream failed");
                    break None;
                }
            },
            _ = tick.tick() => {
                let now = rlqs.clock.now();
                if rlqs.following(now) {
                    break Some(Status::unavailable("this server is no longer the quota leader"));
                }
                let Some(config) = rlqs.server.rlqs_config() else {
                    break Some(Status::unavailable("RLQS is no longer configured"));
                };
                session.tick(now, &rlqs.server, &config, totals)
            }
            () = tx.closed() => break None,
        };
        if !actions.is_empty() {
            tracing::debug!(client = %client, actions = ?actions, "RLQS assignments");
        }
        if !actions.is_empty()
            && tx
                .send(Ok(RateLimitQuotaResponse {
                    bucket_action: actions,
                }))
                .await
                .is_err()
        {
            break None;
        }
    };
    if let Some(status) = end {
        let _ = tx.send(Err(status)).await;
    }
    let buckets = session.len();
    session.close(&rlqs.server, totals);
    totals.streams.fetch_sub(1, Ordering::Relaxed);
    rlqs.ids.lock().remove(&client);
    tracing::info!(client = %client, buckets, "RLQS stream closed; its grants released");
}

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckRequest {
    /// The service asked about (any name gets the same answer).
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResponse {
    /// 1 SERVING, 2 NOT_SERVING.
    #[prost(int32, tag = "1")]
    pub status: i32,
}

/// `grpc.health.v1.Health/Check`.
pub const HEALTH_PATH: &str = "/grpc.health.v1.Health/Check";

/// The health answer: SERVING unless this server is a quota `follower`.
pub fn health(follower: bool) -> HealthCheckResponse {
    HealthCheckResponse {
        status: if follower { 2 } else { 1 },
    }
}
