//! Cluster quota: one capacity (units per second) shared by many clients, each leasing a
//! share sized from its demand and enforcing it locally — no round trip per decision.
//!
//! - [`allocate`]: the division itself — `static`, `proportional_share` and `fair_share`
//!   (exact weighted max-min by water-filling, with strict priority bands). Pure, no I/O.

pub mod allocate;

pub use allocate::{allocate, Algorithm, Demand, QuotaError};
