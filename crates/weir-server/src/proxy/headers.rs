//! The headers a proxy owns: hop-by-hop ones removed, `Via` (and the loops it reveals),
//! `X-Forwarded-For`.

use std::net::{IpAddr, SocketAddr};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, StatusCode, Version};

/// Why a request is refused before it is forwarded (answered by the proxy itself).
pub fn refuse<B>(req: &Request<B>, via: &HeaderValue) -> Option<(StatusCode, &'static str)> {
    if req.method() == http::Method::CONNECT {
        return Some((
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT is not supported: this is a reverse proxy",
        ));
    }
    let hosts = req.headers().get_all(header::HOST).iter().count();
    if hosts > 1 {
        return Some((StatusCode::BAD_REQUEST, "more than one Host header"));
    }
    if hosts == 0 && req.version() == Version::HTTP_11 {
        return Some((StatusCode::BAD_REQUEST, "HTTP/1.1 request without Host"));
    }
    let token = via.as_bytes();
    let looped = req.headers().get_all(header::VIA).iter().any(|v| {
        v.as_bytes()
            .split(|b| *b == b',')
            .any(|hop| hop.trim_ascii().ends_with(token))
    });
    if looped {
        return Some((
            StatusCode::LOOP_DETECTED,
            "request loop: this proxy already forwarded it (check --upstream)",
        ));
    }
    None
}

/// A token naming this process in `Via` (`1.1 weir-<hex>`), unique per start.
pub(super) fn via_token(listen: SocketAddr) -> HeaderValue {
    use std::hash::BuildHasher;
    let seed = (std::process::id(), listen, std::time::SystemTime::now());
    let token = std::collections::hash_map::RandomState::new().hash_one(seed);
    HeaderValue::from_str(&format!("weir-{token:016x}")).unwrap_or(HeaderValue::from_static("weir"))
}

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded. `Trailer` is not one (RFC 9110
/// §6.6.2): it declares the trailer fields a chunked response carries, and HTTP/1.1 servers
/// (hyper included) send only the fields it declares.
pub(crate) const HOP_BY_HOP: [HeaderName; 7] = [
    HeaderName::from_static(HOP_BY_HOP_NAMES[0]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[1]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[2]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[3]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[4]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[5]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[6]),
];

/// [`HOP_BY_HOP`]'s names as text, for a path that reads header names as bytes.
pub(crate) const HOP_BY_HOP_NAMES: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "transfer-encoding",
    "upgrade",
];

/// `X-Forwarded-For`.
pub(super) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Removes hop-by-hop headers (and those `Connection` names, except `Host` and
/// `Content-Length`).
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    // Most messages carry none: one pass over the names, no hashing, decides.
    if !h.keys().any(|n| HOP_BY_HOP.contains(n)) {
        return;
    }
    // `Connection: close, host` must not make the request lose its Host: end-to-end headers
    // the proxy relies on are never removed through `Connection`.
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .filter(|n| *n != header::HOST && *n != header::CONTENT_LENGTH)
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
}

/// Appends this hop to `Via` (RFC 9110 §7.6.3): `1.1 weir-<token>`.
pub fn append_via(h: &mut HeaderMap, version: Version, token: &HeaderValue) {
    append_hop(h, &ViaHops::new(token).of(version));
}

/// This process's hop in `Via` for each request version, built once.
#[derive(Clone)]
pub(super) struct ViaHops([HeaderValue; 3]);

impl ViaHops {
    pub(super) fn new(token: &HeaderValue) -> Self {
        let token = token.to_str().unwrap_or("weir");
        let hop = |proto: &str| {
            HeaderValue::from_str(&format!("{proto} {token}"))
                .unwrap_or(HeaderValue::from_static("1.1 weir"))
        };
        Self([hop("1.0"), hop("1.1"), hop("2")])
    }

    pub(super) fn of(&self, version: Version) -> HeaderValue {
        self.0[match version {
            Version::HTTP_10 => 0,
            Version::HTTP_2 => 2,
            _ => 1,
        }]
        .clone()
    }
}

/// Appends `hop` to `Via`: the hop alone (no copy) when the request has none.
pub(super) fn append_hop(h: &mut HeaderMap, hop: &HeaderValue) {
    append_joined(h, header::VIA, hop);
}

/// Appends `last` to the header `name` as one line: every value sent, in order, then `last`,
/// joined by `, ` (`last` alone, no copy, when there is none).
fn append_joined(h: &mut HeaderMap, name: HeaderName, last: &HeaderValue) {
    let mut values = h.get_all(&name).iter();
    let Some(first) = values.next() else {
        h.insert(name, last.clone());
        return;
    };
    let mut joined = first.as_bytes().trim_ascii().to_vec();
    for v in values {
        joined.extend_from_slice(b", ");
        joined.extend_from_slice(v.as_bytes().trim_ascii());
    }
    joined.extend_from_slice(b", ");
    joined.extend_from_slice(last.as_bytes());
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        h.insert(name, v);
    }
}

/// A client connection's address, and its text for `X-Forwarded-For` (formatted once per
/// connection).
#[derive(Clone)]
pub(super) struct Peer {
    pub(super) ip: IpAddr,
    pub(super) text: HeaderValue,
}

impl Peer {
    pub(super) fn new(ip: IpAddr) -> Self {
        let text = HeaderValue::from_str(&weir_tower::key::ip_string(ip))
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        Self { ip, text }
    }
}

/// Appends the client's address (`ip`, as text) to `X-Forwarded-For`, after every address the
/// request named (its lines joined into one); the address alone (no copy) when it named none.
pub(super) fn append_forwarded_for(h: &mut HeaderMap, ip: &HeaderValue) {
    append_joined(h, X_FORWARDED_FOR, ip);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_go_host_and_length_stay() {
        let mut h = map(&[
            ("host", "a"),
            ("content-length", "0"),
            ("connection", "close, x-secret, host"),
            ("connection", "content-length"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authenticate", "Basic"),
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("accept", "*/*"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(
            h,
            map(&[
                ("host", "a"),
                ("content-length", "0"),
                ("trailer", "x-sum"),
                ("accept", "*/*")
            ])
        );
        // Each hop-by-hop header alone is found too.
        for n in HOP_BY_HOP {
            let mut h = map(&[("accept", "*/*"), (n.as_str(), "x")]);
            strip_hop_by_hop(&mut h);
            assert_eq!(h, map(&[("accept", "*/*")]), "{n}");
        }
        // A message with none is left as it is.
        let plain = map(&[("host", "a"), ("x-forwarded-for", "10.0.0.1")]);
        let mut h = plain.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, plain);
    }

    #[test]
    fn the_client_address_joins_x_forwarded_for() {
        let ip = Peer::new("10.0.0.2".parse().unwrap()).text;
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, &ip);
        assert_eq!(h[X_FORWARDED_FOR], "10.0.0.2");
        append_forwarded_for(&mut h, &ip);
        assert_eq!(h[X_FORWARDED_FOR], "10.0.0.2, 10.0.0.2");
        let v6 = Peer::new("2001:db8::1".parse().unwrap()).text;
        let mut h = map(&[("x-forwarded-for", "1.2.3.4")]);
        append_forwarded_for(&mut h, &v6);
        assert_eq!(h[X_FORWARDED_FOR], "1.2.3.4, 2001:db8::1");
        // Every line the client sent is kept, joined into one.
        let mut h = map(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2 "),
        ]);
        append_forwarded_for(&mut h, &ip);
        assert_eq!(h.get_all(X_FORWARDED_FOR).iter().count(), 1);
        assert_eq!(h[X_FORWARDED_FOR], "1.1.1.1, 2.2.2.2, 10.0.0.2");
    }
}
