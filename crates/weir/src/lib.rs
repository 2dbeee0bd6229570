//! The library behind the `weir` command: the rate-limit service (`rls`), the reverse proxy
//! (`proxy`), the simulators, and the connection handling they share. `main.rs` only parses the
//! command line and wires these together; [`fuzzing`] exposes the input parsers to the fuzz
//! targets.

pub mod accept;
pub mod budget;
pub mod conn;
pub mod duration;
pub mod fuzzing;
pub mod overload;
pub mod proxy;
pub mod quota;
pub mod quota_api;
pub mod quota_grpc;
pub mod quota_ha;
pub mod reflection;
pub mod reload;
pub mod rlqs;
pub mod rls;
pub mod simulate;

/// The README's Rust snippets, compiled (and run, unless marked `no_run`) by `cargo test` as
/// doctests, so the quick starts stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
