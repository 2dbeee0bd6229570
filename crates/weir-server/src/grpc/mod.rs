//! gRPC transport every gRPC service here shares: [`frame`] frames unary calls by hand on
//! hyper, `batch` runs a connection's streams on its task and writes their answers together,
//! [`reflection`] serves the descriptors. Which service answers which path is the process's
//! business (`crate::serve`).

pub(crate) mod batch;
pub mod frame;
pub mod reflection;
