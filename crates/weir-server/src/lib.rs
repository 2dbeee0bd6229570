//! Weir's servers as a library: what `weir serve` and `weir proxy` run, for any tokio program
//! to embed. The `weir` binary only parses its command line and wires these together.
//!
//! The layout, one concept per module, dependencies pointing down this list:
//!
//! - [`net`]: connection plumbing every server shares — `accept` (listeners, connection caps
//!   per process and per address, graceful stop), `conn` (idle and header timeouts), `budget`
//!   (request-body bounds). Nothing above it is known here.
//! - [`reload`]: the configuration files' watcher, applying a changed file to its owner.
//! - [`state_file`]: state kept beside a configuration file across restarts (JSON, written
//!   atomically).
//! - [`admin`]: the admin port's parts — `switches` (degradation switches and their API).
//! - [`otlp`]: every metric family of a process's registry pushed to an OpenTelemetry
//!   collector (HTTP/protobuf or gRPC), beside the Prometheus scrape.
//! - [`grpc`]: gRPC transport — `frame` (unary calls framed by hand on hyper), `batch`
//!   (streams run on their connection's task, answers written together), `reflection`.
//! - [`rls`]: Envoy's rate-limit service (RLS v3) on Lyft's configuration — `config` (the
//!   file), `store` (the seam: where counters live, memory or Redis), `engine` (matching and
//!   Lyft's answers, one clock read per request), `service` (the engine in force and its
//!   reloads), its front ends `grpc` (`ShouldRateLimit` on the wire) and `json` (`POST /json`),
//!   `latency`, `metrics`, `settlement`.
//! - [`quota`]: the cluster-quota lease server's front ends over weir-quota's sans-I/O core —
//!   `api` (HTTP/JSON), `grpc`, `ha` (failover through Redis), `rlqs` (Envoy's RLQS streams).
//!   `rls` and `quota` know nothing of each other.
//! - [`proxy`]: the reverse proxy applying weir-rules to any HTTP service, with its metrics,
//!   per-address upstream slots, paced request bodies and `h1_client` (bodiless requests to
//!   the upstream on the caller's task).
//! - [`xds`]: `weir serve` as an xDS client of rate-limit configuration (envoyproxy/ratelimit's
//!   `RateLimitConfig` over the aggregated stream, as Envoy Gateway pushes it), put in force
//!   in the rate-limit service as a file's reload is.
//! - [`serve`]: the top floor, the `weir serve` process — [`serve::Server::builder`] composes
//!   the rate-limit service and a lease server on one gRPC port (one router for every gRPC
//!   service) and one HTTP port (JSON API, health, `/metrics`, the dashboard, the lease API).
//!
//! The entry points are re-exported at the root: [`Server`] (`weir serve`), [`Proxy`]
//! (`weir proxy`), [`QuotaApi`] (a lease server) and [`Metrics`] (a process's registry).
//!
//! A new server goes in its own module beside `rls`, `quota` and `proxy`, built on `net`, and
//! is composed into a process at the top floor; a new gRPC service of `weir serve` is a module
//! of its server routed in `serve`'s gRPC router; a new store for the rate-limit service
//! implements `rls::store::Store`.
//!
//! Embedding the rate-limit service in an existing tokio program (Envoy would call the gRPC
//! listener; here the JSON API answers one request):
//!
//! ```
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use weir_server::rls::MemoryStore;
//! use weir_server::serve::Server;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // The bundled example configuration (`.config_file(path)` for yours), in memory.
//! let server = std::sync::Arc::new(Server::builder().store(MemoryStore::default()).build().unwrap());
//! let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! let addr = http.local_addr().unwrap();
//! let (stop, stopped) = tokio::sync::watch::channel(false);
//! let serving = {
//!     let (server, mut a, mut b) = (server.clone(), stopped.clone(), stopped);
//!     tokio::spawn(async move {
//!         tokio::join!(
//!             server.serve_grpc(grpc, async move { let _ = a.wait_for(|s| *s).await; }),
//!             server.serve_http(http, None, async move { let _ = b.wait_for(|s| *s).await; }),
//!         );
//!     })
//! };
//! // One decision, as `POST /json` (Lyft's HTTP API).
//! let body = r#"{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}"#;
//! let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
//! let head = format!("POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
//! s.write_all(head.as_bytes()).await.unwrap();
//! s.write_all(body.as_bytes()).await.unwrap();
//! let mut answer = String::new();
//! s.read_to_string(&mut answer).await.unwrap();
//! assert!(answer.starts_with("HTTP/1.1 200") && answer.contains(r#""overallCode":"OK""#), "{answer}");
//! stop.send_replace(true);
//! serving.await.unwrap();
//! # }
//! ```

pub mod admin;
pub mod grpc;
pub mod net;
pub mod otlp;
pub mod proxy;
pub mod quota;
pub mod reload;
pub mod rls;
pub mod serve;
pub mod state_file;
pub mod xds;

pub use admin::metrics::Metrics;
pub use proxy::Proxy;
pub use quota::api::QuotaApi;
pub use serve::Server;
