//! A client's request head as the lean path reads it: parsed with `httparse` into spans of the
//! connection's read buffer (no header map, no copies), and the one rule saying whether the
//! lean path serves it ([`parse`]; every reason it does not is a [`Hyper`]).

use std::mem::MaybeUninit;

use httparse::Header;

/// Longest request head the lean path reads; a longer one goes to hyper, whose own bound
/// answers it.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header lines the lean path reads; more go to hyper (which answers 431 past its own).
pub const MAX_HEADERS: usize = 100;

/// Room for a head's header lines, written only as [`parse`] reads them (nothing is written
/// beforehand: a request pays for the lines it has, not for the room).
pub type Slots<'b> = [MaybeUninit<Header<'b>>; MAX_HEADERS];

/// Empty [`Slots`].
pub const fn slots<'b>() -> Slots<'b> {
    [const { MaybeUninit::uninit() }; MAX_HEADERS]
}

/// HTTP/2's connection preface (h2c with prior knowledge).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the start of a connection's buffer holds.
#[derive(Debug)]
pub enum Parse<'h, 'b> {
    /// Not a whole head yet: read more.
    Partial,
    /// A request the lean path leaves to hyper, from its first byte on.
    Hyper(Hyper),
    /// A request the lean path serves.
    Head(Head<'h, 'b>),
}

/// Why a request goes to hyper: everything the lean path does not do itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hyper {
    /// HTTP/2 with prior knowledge.
    Http2,
    /// A head longer than [`MAX_HEAD`] or with more than [`MAX_HEADERS`] headers.
    Large,
    /// Not a valid HTTP/1.x request head: hyper answers it.
    Malformed,
    /// HTTP/1.0 (its keep-alive rules differ).
    Http10,
    /// `CONNECT` (refused with 405) or a target not in origin form (`http://…`, `*`).
    Target,
    /// A path needing normalisation (or refused by it): not plain (see `weir_rules::path`),
    /// or not UTF-8.
    Path,
    /// A body (`Transfer-Encoding`, or `Content-Length` other than one `0`).
    Body,
    /// `Upgrade` or `Expect`.
    Upgrade,
    /// No `Host`, or more than one (refused with 400).
    Host,
    /// `Connection` naming headers to remove.
    ConnectionNames,
    /// gRPC (`content-type: application/grpc…`): answered the gRPC way.
    Grpc,
    /// This proxy's own `Via` token: a loop (refused with 508).
    Loop,
}

/// A request head the lean path serves: spans of the read buffer.
#[derive(Debug)]
pub struct Head<'h, 'b> {
    /// The head's length in the buffer (the next request starts there).
    pub len: usize,
    /// The method.
    pub method: &'b str,
    /// The request target: path and query, as sent.
    pub target: &'b str,
    /// The path, without the query: in normal form.
    pub path: &'b str,
    /// The header lines, in order.
    pub headers: &'h [Header<'b>],
    /// `Connection: close`: the connection ends after the response.
    pub close: bool,
    /// `Content-Length: 0` was sent (and is forwarded).
    pub empty_body: bool,
    /// `TE: trailers`: the client takes trailer fields (else a chunked response's trailers
    /// are not passed on, as hyper does).
    pub trailers: bool,
}

/// Parses the request head at the start of `buf` (headers into `slots`) and says who serves it;
/// `via` is this proxy's own token in `Via`.
pub fn parse<'h, 'b>(buf: &'b [u8], slots: &'h mut Slots<'b>, via: &[u8]) -> Parse<'h, 'b> {
    if buf.len() < PREFACE.len() && PREFACE.starts_with(buf) {
        return Parse::Partial;
    }
    if buf.starts_with(PREFACE) {
        return Parse::Hyper(Hyper::Http2);
    }
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, slots) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Parse::Hyper(Hyper::Large)
        }
        Ok(httparse::Status::Partial) => return Parse::Partial,
        Err(httparse::Error::TooManyHeaders) => return Parse::Hyper(Hyper::Large),
        Err(_) => return Parse::Hyper(Hyper::Malformed),
    };
    if len > MAX_HEAD {
        return Parse::Hyper(Hyper::Large);
    }
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Parse::Hyper(Hyper::Malformed);
    };
    if version != 1 {
        return Parse::Hyper(Hyper::Http10);
    }
    if method == "CONNECT" || !target.starts_with('/') {
        return Parse::Hyper(Hyper::Target);
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    if !weir_rules::path::is_plain(path) {
        return Parse::Hyper(Hyper::Path);
    }
    let headers: &'h [Header<'b>] = req.headers;
    match fields(headers, via) {
        Ok(f) => Parse::Head(Head {
            len,
            method,
            target,
            path,
            headers,
            close: f.close,
            empty_body: f.empty_body,
            trailers: f.trailers,
        }),
        Err(why) => Parse::Hyper(why),
    }
}

/// What the headers of a lean request say.
struct Fields {
    close: bool,
    empty_body: bool,
    trailers: bool,
}

/// What the headers say (see [`Fields`]), or why hyper serves the request.
fn fields(headers: &[Header<'_>], via: &[u8]) -> Result<Fields, Hyper> {
    let (mut hosts, mut close, mut length, mut trailers) = (0, false, None, false);
    for h in headers {
        let name = h.name.as_bytes();
        // Dispatch on the length first: most names are none of these.
        match name.len() {
            2 if name.eq_ignore_ascii_case(b"te") => {
                trailers |= h
                    .value
                    .split(|b| *b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"));
            }
            3 if name.eq_ignore_ascii_case(b"via") => {
                let looped = h
                    .value
                    .split(|b| *b == b',')
                    .any(|hop| hop.trim_ascii().ends_with(via));
                if looped {
                    return Err(Hyper::Loop);
                }
            }
            4 if name.eq_ignore_ascii_case(b"host") => hosts += 1,
            6 if name.eq_ignore_ascii_case(b"expect") => return Err(Hyper::Upgrade),
            7 if name.eq_ignore_ascii_case(b"upgrade") => return Err(Hyper::Upgrade),
            10 if name.eq_ignore_ascii_case(b"connection") => {
                for token in h.value.split(|b| *b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if !token.is_empty() && !token.eq_ignore_ascii_case(b"keep-alive") {
                        return Err(Hyper::ConnectionNames);
                    }
                }
            }
            12 if name.eq_ignore_ascii_case(b"content-type") => {
                let v = h.value.trim_ascii_start();
                if v.len() >= 16 && v[..16].eq_ignore_ascii_case(b"application/grpc") {
                    return Err(Hyper::Grpc);
                }
            }
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                if length.is_some() || h.value.trim_ascii() != b"0" {
                    return Err(Hyper::Body);
                }
                length = Some(0);
            }
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => return Err(Hyper::Body),
            _ => {}
        }
    }
    if hosts != 1 {
        return Err(Hyper::Host);
    }
    Ok(Fields {
        close,
        empty_body: length.is_some(),
        trailers,
    })
}

/// Whether `name` (as received, any case) is a hop-by-hop header: one of
/// `proxy::headers::HOP_BY_HOP`, the list both paths remove.
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    crate::proxy::headers::HOP_BY_HOP_NAMES
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(raw: &[u8]) -> Result<(usize, bool, bool), Option<Hyper>> {
        let mut slots = slots();
        match parse(raw, &mut slots, b"weir-0123") {
            Parse::Partial => Err(None),
            Parse::Hyper(w) => Err(Some(w)),
            Parse::Head(h) => Ok((h.len, h.close, h.empty_body || h.trailers)),
        }
    }

    #[test]
    fn a_plain_request_is_lean_and_its_length_known() {
        let raw = b"GET /a/b?x=1 HTTP/1.1\r\nHost: h\r\nAccept: */*\r\n\r\nGET /next";
        assert_eq!(who(raw), Ok((raw.len() - 9, false, false)));
        let mut slots = slots();
        let Parse::Head(h) = parse(raw, &mut slots, b"weir-0123") else {
            panic!("lean")
        };
        assert_eq!((h.method, h.target, h.path), ("GET", "/a/b?x=1", "/a/b"));
        assert_eq!(h.headers.len(), 2);
        let close = b"DELETE /a HTTP/1.1\r\nhost: h\r\nconnection: keep-alive, Close\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(who(close), Ok((close.len(), true, true)));
        let te = b"GET /a HTTP/1.1\r\nhost: h\r\nTE: gzip, Trailers\r\n\r\n";
        assert_eq!(who(te), Ok((te.len(), false, true)));
    }

    #[test]
    fn incomplete_heads_and_prefaces_wait_for_more() {
        assert_eq!(who(b"GET / HTTP/1.1\r\nHost: h\r\n"), Err(None));
        assert_eq!(who(b"PRI * HTTP/2"), Err(None));
        assert_eq!(who(b""), Err(None));
        assert_eq!(
            who(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            Err(Some(Hyper::Http2))
        );
    }

    #[test]
    fn every_case_the_lean_path_leaves_to_hyper_is_named() {
        let cases: &[(&[u8], Hyper)] = &[
            (b"GET / HTTP/1.0\r\nHost: h\r\n\r\n", Hyper::Http10),
            (b"CONNECT h:443 HTTP/1.1\r\nHost: h\r\n\r\n", Hyper::Target),
            (b"GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n", Hyper::Target),
            (b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", Hyper::Target),
            (b"GET /a//b HTTP/1.1\r\nHost: h\r\n\r\n", Hyper::Path),
            (b"GET /%61 HTTP/1.1\r\nHost: h\r\n\r\n", Hyper::Path),
            (b"GET /a/../b HTTP/1.1\r\nHost: h\r\n\r\n", Hyper::Path),
            (
                b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
                Hyper::Body,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: h\r\ncontent-length: 0\r\ncontent-length: 0\r\n\r\n",
                Hyper::Body,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
                Hyper::Body,
            ),
            (
                b"GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n",
                Hyper::Upgrade,
            ),
            (
                b"GET / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n",
                Hyper::Upgrade,
            ),
            (b"GET / HTTP/1.1\r\n\r\n", Hyper::Host),
            (b"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", Hyper::Host),
            (
                b"GET / HTTP/1.1\r\nHost: h\r\nConnection: x-secret\r\n\r\n",
                Hyper::ConnectionNames,
            ),
            (
                b"GET / HTTP/1.1\r\nHost: h\r\nContent-Type: application/grpc+proto\r\n\r\n",
                Hyper::Grpc,
            ),
            (
                b"GET / HTTP/1.1\r\nHost: h\r\nVia: 1.1 a, 1.1 weir-0123\r\n\r\n",
                Hyper::Loop,
            ),
            (b"GET / HTTP/1.1\r\nHost h\r\n\r\n", Hyper::Malformed),
            (b"G\x01T / HTTP/1.1\r\n\r\n", Hyper::Malformed),
        ];
        for (raw, why) in cases {
            assert_eq!(
                who(raw),
                Err(Some(*why)),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
        let mut many = b"GET / HTTP/1.1\r\nHost: h\r\n".to_vec();
        for i in 0..MAX_HEADERS {
            many.extend_from_slice(format!("x-{i}: 1\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(who(&many), Err(Some(Hyper::Large)));
        let mut long = b"GET / HTTP/1.1\r\nHost: h\r\nx-long: ".to_vec();
        long.resize(MAX_HEAD + 10, b'a');
        assert_eq!(who(&long), Err(Some(Hyper::Large)));
    }

    #[test]
    fn hop_by_hop_names_are_known_in_any_case() {
        for n in [
            "TE",
            "upgrade",
            "Connection",
            "keep-alive",
            "Proxy-Connection",
            "transfer-encoding",
            "Proxy-Authenticate",
        ] {
            assert!(is_hop_by_hop(n.as_bytes()), "{n}");
        }
        for n in [
            "host",
            "tes",
            "trailer",
            "content-length",
            "x-forwarded-for",
            "via",
        ] {
            assert!(!is_hop_by_hop(n.as_bytes()), "{n}");
        }
    }
}
