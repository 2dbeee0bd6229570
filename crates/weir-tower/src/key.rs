//! Which key a request is limited under: client IP (with trusted proxies), a header, the
//! method and route, or a closure.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use http::Request;

/// Maps a request to the key it is counted under (`None`: the request is not limited by this
/// layer, e.g. a missing header). Borrow from the request or a constant where possible: no
/// allocation on the pass path.
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// The key of `req`.
    fn key<'r, B>(&self, req: &'r Request<B>) -> Option<Cow<'r, str>>;
}

pub use weir_rules::cidr::Cidr;

/// The peer address of a connection, as servers put it in request extensions: insert
/// `PeerAddr` yourself, or use axum's `ConnectInfo<SocketAddr>` (read when the `axum` feature is
/// on — see [`ClientIp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The client's IP: the connection's peer, unless the peer is a trusted proxy; then
/// `X-Forwarded-For` is read **from the right**, skipping trusted proxies, and the first
/// untrusted address is the client. The leftmost entry is never believed blindly: anyone can
/// send `X-Forwarded-For: 1.2.3.4`.
#[derive(Debug, Clone, Default)]
pub struct ClientIp {
    trusted: Vec<Cidr>,
}

impl ClientIp {
    /// No trusted proxies: the peer address is the client.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts proxies in these CIDR blocks.
    pub fn trusting(cidrs: &[&str]) -> Result<Self, weir_rules::cidr::CidrError> {
        Ok(Self {
            trusted: cidrs
                .iter()
                .map(|c| Cidr::parse(c))
                .collect::<Result<_, _>>()?,
        })
    }

    fn trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// Whether any proxy is trusted: only then is `X-Forwarded-For` read.
    pub fn reads_forwarded_for(&self) -> bool {
        !self.trusted.is_empty()
    }

    /// The client address of `req`.
    pub fn client<B>(&self, req: &Request<B>) -> Option<IpAddr> {
        self.client_of(req.headers(), req.extensions())
    }

    /// The client address of a request head (`http::request::Parts`).
    pub fn client_parts(&self, parts: &http::request::Parts) -> Option<IpAddr> {
        self.client_of(&parts.headers, &parts.extensions)
    }

    /// The client address from a request's headers and extensions.
    pub fn client_of(&self, headers: &http::HeaderMap, ext: &http::Extensions) -> Option<IpAddr> {
        Some(self.client_from(peer(ext)?, headers))
    }

    /// The client address of a request from `peer` with `headers`.
    pub fn client_from(&self, peer: IpAddr, headers: &http::HeaderMap) -> IpAddr {
        self.forwarded(peer, headers).unwrap_or(peer)
    }

    fn forwarded(&self, peer: IpAddr, headers: &http::HeaderMap) -> Option<IpAddr> {
        if !self.trusted(peer) {
            return Some(peer);
        }
        let mut client = peer;
        for value in headers.get_all("x-forwarded-for").iter().rev() {
            let Ok(text) = value.to_str() else {
                return Some(client);
            };
            for hop in text.rsplit(',') {
                let Ok(ip) = hop.trim().parse::<IpAddr>() else {
                    return Some(client);
                };
                client = ip;
                if !self.trusted(ip) {
                    return Some(ip);
                }
            }
        }
        Some(client)
    }
}

fn peer(ext: &http::Extensions) -> Option<IpAddr> {
    if let Some(PeerAddr(a)) = ext.get::<PeerAddr>() {
        return Some(a.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(a)) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(a.ip());
    }
    ext.get::<SocketAddr>().map(SocketAddr::ip)
}

impl KeyExtractor for ClientIp {
    fn key<'r, B>(&self, req: &'r Request<B>) -> Option<Cow<'r, str>> {
        self.client(req).map(|ip| Cow::Owned(ip_string(ip)))
    }
}

/// `ip` as text, exactly as `Display` writes it; an IPv4 address without the formatting
/// machinery (a per-client key is made for every request).
pub fn ip_string(ip: IpAddr) -> String {
    let IpAddr::V4(v4) = ip else {
        return ip.to_string();
    };
    let mut s = String::with_capacity(15);
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        if octet >= 100 {
            s.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            s.push(char::from(b'0' + octet / 10 % 10));
        }
        s.push(char::from(b'0' + octet % 10));
    }
    s
}

/// The value of a header (requests without it are not limited by this layer).
#[derive(Debug, Clone)]
pub struct Header(pub http::HeaderName);

impl KeyExtractor for Header {
    fn key<'r, B>(&self, req: &'r Request<B>) -> Option<Cow<'r, str>> {
        req.headers()
            .get(&self.0)
            .and_then(|v| v.to_str().ok())
            .map(Cow::Borrowed)
    }
}

/// `METHOD path` (the route; query strings excluded).
#[derive(Debug, Clone, Copy, Default)]
pub struct MethodPath;

impl KeyExtractor for MethodPath {
    fn key<'r, B>(&self, req: &'r Request<B>) -> Option<Cow<'r, str>> {
        // The path as routes match it (`weir_rules::path`): `/a//b`, `/a/./b`, `/%61/b` and
        // `/a;x/b` share `/a/b`'s counter instead of each getting a quota of its own. A path
        // the normaliser refuses keys as sent.
        let raw = req.uri().path();
        let key = match crate::path::normalize(raw) {
            Ok(normal) => format!("{} {}", req.method(), crate::path::match_path(&normal)),
            Err(_) => format!("{} {raw}", req.method()),
        };
        Some(Cow::Owned(key))
    }
}

/// One key for every request (a global limit).
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl KeyExtractor for Global {
    fn key<'r, B>(&self, _: &'r Request<B>) -> Option<Cow<'r, str>> {
        // Not "": comparing empty Strings (dangling pointers) is ≈ 75 ns in glibc's AVX-512
        // memcmp here (weir-rules benches/entry.rs).
        Some(Cow::Borrowed("global"))
    }
}

/// A closure over the request parts (method, URI, headers, extensions).
#[derive(Clone)]
pub struct FromParts<F>(pub F);

impl<F> KeyExtractor for FromParts<F>
where
    F: Fn(&http::Method, &http::Uri, &http::HeaderMap, &http::Extensions) -> Option<String>
        + Clone
        + Send
        + Sync
        + 'static,
{
    fn key<'r, B>(&self, req: &'r Request<B>) -> Option<Cow<'r, str>> {
        (self.0)(req.method(), req.uri(), req.headers(), req.extensions()).map(Cow::Owned)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ip_string_writes_what_display_writes() {
        let mut ips: Vec<IpAddr> = (0..=255u8)
            .flat_map(|o| {
                [
                    IpAddr::from([o, 0, 0, 0]),
                    IpAddr::from([0, o, 0, 0]),
                    IpAddr::from([10, 0, o, 0]),
                    IpAddr::from([255, 255, 255, o]),
                ]
            })
            .collect();
        ips.push("::1".parse().unwrap());
        ips.push("2001:db8::ff00:42:8329".parse().unwrap());
        ips.push("::ffff:192.0.2.1".parse().unwrap());
        for ip in ips {
            assert_eq!(super::ip_string(ip), ip.to_string());
        }
    }

    use super::*;

    fn req(peer: &str, xff: &[&str]) -> Request<()> {
        let mut b = Request::builder();
        for v in xff {
            b = b.header("x-forwarded-for", *v);
        }
        let mut r = b.body(()).unwrap();
        r.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
        r
    }

    #[test]
    fn method_path_keys_every_spelling_of_a_path_alike() {
        let key = |p: &str| {
            let req = Request::get(p).body(()).unwrap();
            MethodPath.key(&req).unwrap().into_owned()
        };
        for p in ["/a//b", "/a/./b", "/%61/b", "/a;x=1/b", "/c/../a/b"] {
            assert_eq!(key(p), "GET /a/b", "{p}");
        }
    }

    #[test]
    fn cidrs() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains("10.9.8.7".parse().unwrap()));
        assert!(c.contains("::ffff:10.1.1.1".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(Cidr::parse("::1").unwrap().contains("::1".parse().unwrap()));
        assert!(Cidr::parse("fd00::/8")
            .unwrap()
            .contains("fd12::1".parse().unwrap()));
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("nope/8").is_err());
    }

    #[test]
    fn forwarded_for_is_read_from_the_right_and_only_behind_trusted_proxies() {
        let ip = ClientIp::trusting(&["10.0.0.0/8"]).unwrap();
        let key = |r: &Request<()>| ip.key(r).unwrap().into_owned();
        // untrusted peer: its own address, whatever it claims
        assert_eq!(key(&req("203.0.113.9:1", &["1.2.3.4"])), "203.0.113.9");
        // trusted proxy: the rightmost untrusted hop
        assert_eq!(
            key(&req("10.0.0.2:1", &["1.2.3.4, 198.51.100.7, 10.0.0.5"])),
            "198.51.100.7"
        );
        // several headers: the last one is the nearest
        assert_eq!(
            key(&req("10.0.0.2:1", &["1.2.3.4", "198.51.100.8"])),
            "198.51.100.8"
        );
        // garbage stops the walk at the last trusted hop
        assert_eq!(key(&req("10.0.0.2:1", &["1.2.3.4, junk"])), "10.0.0.2");
        // no trust configured: the peer
        assert_eq!(
            ClientIp::new()
                .key(&req("10.0.0.2:1", &["1.2.3.4"]))
                .unwrap(),
            "10.0.0.2"
        );
    }
}
