//! What operators reach on a server's admin port: [`metrics`] (the one metrics exporter of
//! every process), [`switches`] (degradation switches: file values, overrides, the HTTP API
//! that sets them).

pub mod metrics;
pub mod switches;
