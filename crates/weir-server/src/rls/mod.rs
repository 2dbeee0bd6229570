//! `weir serve`: the Envoy rate-limit service (RLS v3) on Lyft's configuration format.

pub mod config;
pub mod dashboard;
pub mod engine;
pub mod grpc;
pub mod latency;
pub mod server;
