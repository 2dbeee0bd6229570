//! The `weir` binary's tests, in one test binary: what needs the binary itself — arguments,
//! exit codes, signals, the servers, proxy and simulators as real processes beside real Redis
//! and Envoy, and the documentation's examples. The libraries' behaviour is tested in their
//! own crates (weir-server's in-process through its builders).
//!
//! One module per area; `cargo test -p weir --test cli AREA::` runs one of them (for example
//! `cargo test -p weir --test cli cost_long_streams:: -- --nocapture`).

#[path = "../../weir-redis/tests/support/mod.rs"]
mod support;

#[path = "../../weir-server/tests/ads/mod.rs"]
mod ads;

mod common;

mod cost_e2e;
mod cost_long_streams;
mod dashboard;
mod degradation;
mod deploy;
mod doc_examples;
mod envoy_e2e;
mod fuzz_smoke;
mod lyft_compat;
mod otlp_cli;
mod overload_cli;
mod proxy_cli;
/// The proxy's suites again on its other HTTP/1.1 path (`--http1 hyper`): both paths pass them
/// (each copy reads its path from its module's name).
#[allow(clippy::duplicate_mod)]
#[path = "proxy_cli.rs"]
mod proxy_cli_hyper;
mod proxy_upstream;
#[allow(clippy::duplicate_mod)]
#[path = "proxy_upstream.rs"]
mod proxy_upstream_hyper;
mod quota_cli;
mod quota_failover;
mod quota_tree;
mod report_cli;
mod rlqs_e2e;
mod serve_cli;
mod simulate_cli;
mod traces_e2e;
mod xds_e2e;
