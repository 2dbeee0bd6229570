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
//!
//! Embedding the rate-limit service in an existing tokio program (Envoy would call the gRPC
//! listener; here the JSON API answers one request):
//!
//! ```
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use weir_server::rls::{MemoryStore, Server};
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
