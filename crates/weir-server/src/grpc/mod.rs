//! The gRPC port: [`frame`] frames unary calls by hand on hyper, [`router`] sends each call to
//! its service (rate limit, lease API, RLQS, health, reflection) and serves the port.

pub mod batch;
pub mod frame;
pub mod reflection;
pub mod router;
