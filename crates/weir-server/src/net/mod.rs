//! Connection plumbing shared by every server: [`accept`] (listeners, connection caps per
//! process and per address, graceful stop), [`conn`] (per-connection idle and header
//! timeouts), [`budget`] (request-body bounds per body and in all), [`dormant`] (signals waited
//! for beside a connection's I/O without polling them on every wake-up).

pub mod accept;
pub mod budget;
pub mod conn;
pub mod dormant;
