//! The library behind the `weir` command, apart from the servers (the `weir-server` crate):
//! the flag grammar ([`duration`]), the simulators ([`simulate`], [`overload`]) and their HTML
//! reports ([`report`]), `weir quota allocate` ([`quota`]), and [`fuzzing`], the input parsers
//! for the fuzz targets. `main.rs`
//! parses the command line and wires these and the servers together.

pub mod duration;
pub mod fuzzing;
pub mod overload;
pub mod quota;
pub mod report;
pub mod simulate;

/// The README's Rust snippets, compiled (and run, unless marked `no_run`) by `cargo test` as
/// doctests, so the quick starts stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
