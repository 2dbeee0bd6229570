//! Weir as tower middleware for axum, hyper and tonic services.
//!
//! - [`criticality`]: read and write the request criticality in HTTP headers and gRPC metadata
//!   (`x-weir-criticality`), so it propagates from call to call.
//! - [`shed`]: overload shedding with BBR ([`shed::BbrLayer`]): a dropped request gets 503 with
//!   an `application/problem+json` body, lower criticality first.

pub mod criticality;
pub mod shed;
