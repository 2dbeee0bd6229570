//! The cluster-quota lease server's front ends over weir-quota's sans-I/O core: [`api`] (the
//! lease API over HTTP/JSON, its state and metrics), [`grpc`] (the same calls over gRPC),
//! [`ha`] (failover through Redis: election, snapshots, redirects), [`rlqs`] (Envoy's RLQS
//! streams). Protocol code lives here; allocation, leases and RLQS sessions live in
//! weir-quota.

pub mod api;
pub mod grpc;
pub mod ha;
pub mod rlqs;
