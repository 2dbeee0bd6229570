//! Envoy's rate-limit service (RLS v3) on Lyft's configuration format: `config` (the file),
//! `store` (the seam: where counters live, memory or Redis), `engine` (matching and Lyft's
//! answers, one clock read per request), `service` (the engine in force, reloads), and its
//! front ends `grpc` (`ShouldRateLimit` on the wire) and `json` (Lyft's `POST /json`). The
//! `weir serve` process that puts them on ports is [`crate::serve`].

pub mod config;
pub(crate) mod engine;
pub mod grpc;
pub mod json;
pub(crate) mod latency;
pub(crate) mod metrics;
pub(crate) mod options;
pub(crate) mod request;
pub(crate) mod service;
pub(crate) mod settlement;
pub mod store;
mod trace;
pub(crate) mod tree;

pub use engine::{Engine, EngineClock};
pub use options::EngineOptions;
pub use request::{
    AppliedLimit, BadRequest, HeaderStyle, Request, RequestDescriptor, Response, Status,
    MAX_DESCRIPTORS, MAX_ENTRIES, MAX_OVERRIDES, MAX_VALUE_BYTES, SETTLE_ENTRY,
    UNLIMITED_REMAINING,
};
pub use service::{load, LoadError, Service, EXAMPLE};
pub use store::{Counter, CounterError, MemoryStore, RedisStore, Store};
pub use tree::{EngineError, Rule, RuleCounts, RuleMetrics, MAX_METRIC_VALUES, TOP_VALUES};
