//! Envoy's rate-limit service (RLS v3) on Lyft's configuration format: `config` (the file),
//! `store` (the seam: where counters live, memory or Redis), `engine` (matching and Lyft's
//! answers, one clock read per request), `service` (the engine in force, reloads), and its
//! front ends `grpc` (`ShouldRateLimit` on the wire) and `json` (Lyft's `POST /json`). The
//! `weir serve` process that puts them on ports is [`crate::serve`].

pub mod config;
pub mod engine;
pub mod grpc;
pub mod json;
pub(crate) mod latency;
pub(crate) mod metrics;
pub mod options;
pub mod request;
pub mod service;
pub(crate) mod settlement;
pub mod store;
pub mod tree;

pub use options::EngineOptions;
pub use request::{BadRequest, HeaderStyle, Request, Response};
pub use service::{load, LoadError, Service, EXAMPLE};
pub use store::{Counter, CounterError, MemoryStore, RedisStore, Store};
pub use tree::EngineError;
