//! The cluster-quota lease server's front ends over weir-quota's sans-I/O core: [`api`] (the
//! lease API over HTTP/JSON, its state and metrics), `grpc` (the same calls over gRPC),
//! [`ha`] (failover through Redis: election, snapshots, redirects), `rlqs` (Envoy's RLQS
//! streams). Protocol code lives here; allocation, leases and RLQS sessions live in
//! weir-quota.

pub mod api;
pub(crate) mod grpc;
pub mod ha;
pub(crate) mod rlqs;

/// Runs lease-server work (a refresh: allocation under the server's locks) on tokio's blocking
/// pool, so that however long it takes it never holds a worker thread the rate-limit decisions
/// of `weir serve` need; `None` if the work panicked.
pub(crate) async fn off_the_workers<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    tokio::task::spawn_blocking(work).await.ok()
}
