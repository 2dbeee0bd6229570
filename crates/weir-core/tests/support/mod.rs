//! Helpers shared by tests (and by other crates' tests, through `#[path]`).

pub mod cost_bound;
