//! Weir's servers as a library: what `weir serve` and `weir proxy` run, for any tokio program
//! to embed. The `weir` binary only parses its command line and wires these together.
//!
//! - [`grpc`]: the gRPC port — `frame` (unary calls framed by hand on hyper), `router` (each
//!   call to its service: rate limit, lease API, RLQS, health, reflection; and the port's
//!   server), `batch` (streams run on their connection's task, answers written together).
//! - [`rls`]: Envoy's rate-limit service (RLS v3) on Lyft's configuration — `config` (the
//!   file), `engine` (decisions, one clock read per request), `server` (the service and its
//!   HTTP API), `grpc` (the method and its request message), `latency`, `dashboard`.
//! - [`quota_api`], [`quota_grpc`], [`quota_ha`], [`rlqs`]: the cluster-quota lease server's
//!   front ends — HTTP/JSON, gRPC, failover through Redis, Envoy's RLQS — over weir-quota's
//!   sans-I/O core.
//! - [`proxy`]: the reverse proxy applying weir-rules to any HTTP service, with its switches,
//!   metrics, per-address upstream slots and paced request bodies.
//! - Connection plumbing shared by all: [`accept`] (listeners, connection caps, graceful
//!   stop), [`conn`] (per-connection timeouts), [`budget`] (request-body budgets), [`reload`]
//!   (file watching), [`reflection`] (gRPC server reflection).

pub mod accept;
pub mod budget;
pub mod conn;
pub mod grpc;
pub mod proxy;
pub mod quota_api;
pub mod quota_grpc;
pub mod quota_ha;
pub mod reflection;
pub mod reload;
pub mod rlqs;
pub mod rls;
