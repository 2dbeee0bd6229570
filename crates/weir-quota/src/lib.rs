//! Cluster quota: one capacity (units per second) shared by many clients, each leasing a
//! share sized from its demand and enforcing it locally — no round trip per decision.
//!
//! - [`allocate`](mod@allocate): the division itself — `static`, `proportional_share` and `fair_share`
//!   (exact weighted max-min by water-filling, with strict priority bands). Pure, no I/O.
//! - [`hierarchy`]: nested quotas (org ⊃ team ⊃ user) — nested weighted max-min with the same
//!   bands, a child never above its capacity and what it cannot use left to its siblings.
//! - [`forest`]: entries naming their parents linked into trees, and a loop of parents named.
//! - [`lease`]: the lease table of one resource — grants that never sum past the capacity,
//!   expire unless refreshed, and are only confirmed while a restarted server learns.
//! - [`client`]: a client's side of one resource without I/O — demand estimate, refresh
//!   schedule with jitter and backoff, and the local GCRA enforcing the grant (then the safe
//!   capacity once a lease expires).
//! - `nested` (inside the crate): the groups above nested resources' tables —
//!   what the leases under each group hold, the room it leaves a refresh, the division of a
//!   whole family.
//! - [`config`]: the quota file (resources, templates and nested resources, located errors).
//! - [`pattern`]: names with one `*` (templates, client ids).
//! - [`clients`]: who may ask (client id patterns, bearer tokens) and with what weight and
//!   priority.
//! - [`server`]: every resource's table behind the protocol front ends.
//! - [`ha`]: failover — one leader among several servers, its fencing token and snapshot.
//! - [`rlqs`]: Envoy's Rate Limit Quota Service on the lease server (buckets → resources,
//!   shares sent as token buckets).
//! - [`proto`]: the gRPC lease API's messages (`proto/weir/quota/v1/quota.proto` in this crate).
//! - [`net`]: the lease client over the network (HTTP/JSON), refreshing every resource of a
//!   process in one call, and [`net::ParentLink`], a server's leases from its parent.
//! - [`upstream`]: a lease server's own leases from its parent (a tree of lease servers):
//!   asks frozen while in flight, grants dated from the send, demand sent in parts.
//! - [`sim`]: all of it on virtual time, with the measures of `weir simulate quota`.
//! - [`sim_tree`]: a tree of lease servers on virtual time (`weir simulate quota --tree`).
//! - [`wire`]: the lease API's HTTP/JSON messages and the lease-id codec, for the server, the
//!   lease client and the parent link alike.
//! - `rng` (inside the crate): the deterministic generator of refresh jitter and simulators.

pub mod allocate;
pub mod client;
pub mod clients;
pub mod config;
pub mod forest;
pub mod ha;
pub mod hierarchy;
pub mod lease;
mod nested;
pub mod net;
pub mod pattern;
pub mod proto;
pub mod rlqs;
mod rng;
pub mod server;
pub mod sim;
pub mod sim_tree;
pub mod upstream;
pub mod wire;

pub use allocate::{allocate, Demand, Division, QuotaError};
pub use client::{ClientConfig, ResourceClient, Source};
pub use lease::{Ask, Holder, Lease, LeaseTable, ResourceConfig};
