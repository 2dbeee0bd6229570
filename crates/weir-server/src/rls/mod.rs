//! `weir serve`: the Envoy rate-limit service (RLS v3) on Lyft's configuration format. To embed
//! it, start from [`Server::builder`].

pub mod config;
pub mod dashboard;
pub mod embed;
pub mod engine;
pub mod grpc;
pub mod latency;
pub mod metrics;
pub mod server;
pub mod settlement;
pub mod store;

pub use embed::{BuildError, Builder, Server};
pub use store::{Counter, MemoryStore, RedisStore, Store};
