//! What operators reach on a server's admin port: [`switches`] (degradation switches: file
//! values, overrides, the HTTP API that sets them).

pub mod switches;
