//! Connection plumbing shared by every server: [`accept`] (listeners, connection caps per
//! process and per address, graceful stop), [`conn`] (per-connection idle and header
//! timeouts), [`budget`] (request-body bounds per body and in all), `dormant` (signals waited
//! for beside a connection's I/O without polling them on every wake-up), [`tls`] (TLS on a
//! listener, reloaded with its files), [`rewind`] (bytes read put back in front of a
//! connection), and [`points_at`]
//! (whether an address a server is told to call is its own).

pub mod accept;
pub mod budget;
pub mod conn;
pub(crate) mod dormant;
pub mod rewind;
pub mod tls;

/// Whether `target` (an `http://HOST:PORT` URI) names `listen`, an address this process
/// listens on: the same port on the same IP, or on a loopback or unspecified listen address.
/// A server told to call itself (a proxy's upstream, a lease server's parent) would loop.
pub fn points_at(target: &http::Uri, listen: std::net::SocketAddr) -> bool {
    let port = target.port_u16().unwrap_or(80);
    if port != listen.port() {
        return false;
    }
    let host = target.host().unwrap_or("").trim_matches(['[', ']']);
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip == listen.ip() || (ip.is_loopback() && listen.ip().is_unspecified()),
        Err(_) => {
            host == "localhost" && (listen.ip().is_loopback() || listen.ip().is_unspecified())
        }
    }
}
