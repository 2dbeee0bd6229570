//! The bytes the lean path writes: the upstream request from the client's head, the client's
//! response head from the upstream's, chunked body framing, and the proxy's own answers.

use http::Response;
use weir_tower::problem::push_decimal;

use super::request::{is_hop_by_hop, Head};
use crate::proxy::h1_client::RawHead;

/// Writes the upstream request for `head` into `out`: the request line (HTTP/1.1), every
/// header but the hop-by-hop ones in the client's order and spelling, then `X-Forwarded-For`
/// with `client` appended to the values sent and `Via` with `hop` appended (each one line).
pub fn upstream_request(out: &mut Vec<u8>, head: &Head<'_, '_>, client: &[u8], hop: &[u8]) {
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(head.target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let (mut forwarded, mut via) = (false, false);
    for h in head.headers {
        let name = h.name.as_bytes();
        if is_hop_by_hop(name) {
            continue;
        }
        if name.eq_ignore_ascii_case(b"x-forwarded-for") {
            forwarded = true;
            continue;
        }
        if name.eq_ignore_ascii_case(b"via") {
            via = true;
            continue;
        }
        line(out, name, h.value);
    }
    joined(out, b"x-forwarded-for", head, forwarded, client);
    joined(out, b"via", head, via, hop);
    out.extend_from_slice(b"\r\n");
}

/// `name: v1, v2, last` from every `name` header of `head` (when `any`) and `last`.
fn joined(out: &mut Vec<u8>, name: &[u8], head: &Head<'_, '_>, any: bool, last: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    if any {
        for h in head.headers {
            if h.name.as_bytes().eq_ignore_ascii_case(name) {
                out.extend_from_slice(h.value.trim_ascii());
                out.extend_from_slice(b", ");
            }
        }
    }
    out.extend_from_slice(last);
    out.extend_from_slice(b"\r\n");
}

fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// How the client's response body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body follows whatever the head says (`HEAD`, 204, 304): framing headers pass as
    /// they came.
    None,
    /// Exactly this many bytes (`Content-Length`).
    Length(u64),
    /// Chunked (the upstream's chunks, or a body read until the upstream closed).
    Chunked,
}

impl Framing {
    /// The client's framing of a response with `raw`'s head, to a request that was `HEAD`
    /// when `head_only`.
    pub fn of(raw: &RawHead, head_only: bool) -> Self {
        let s = raw.status.as_u16();
        if head_only || s == 204 || s == 304 {
            return Framing::None;
        }
        match raw.length() {
            Some(n) => Framing::Length(n),
            None => Framing::Chunked,
        }
    }
}

/// Writes the client's response head for the upstream's `raw` into `out`: HTTP/1.1 with the
/// upstream's status and reason, every header but the hop-by-hop ones (and those the
/// upstream's `Connection` names) in the upstream's order, the body's `framing`, then
/// `extra` lines, and `Connection: close` when `close`.
pub fn response_head(
    out: &mut Vec<u8>,
    raw: &RawHead,
    framing: Framing,
    extra: &[(&[u8], &[u8])],
    close: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    // The status line's code and reason, after `HTTP/1.x `.
    let status_line = raw.head.split(|b| *b == b'\n').next().unwrap_or_default();
    let rest = status_line.get(9..).unwrap_or_default().trim_ascii_end();
    if rest.len() >= 3 {
        out.extend_from_slice(rest);
    } else {
        out.extend_from_slice(raw.status.as_str().as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    // Names the upstream's `Connection` lists are its hop-by-hop headers too.
    let mut listed: Vec<Vec<u8>> = Vec::new();
    if raw.names_hops {
        raw.for_each_header(|name, value| {
            if name.eq_ignore_ascii_case(b"connection") {
                for token in value.split(|b| *b == b',') {
                    let t = token.trim_ascii();
                    let keeps = t.eq_ignore_ascii_case(b"host")
                        || t.eq_ignore_ascii_case(b"content-length");
                    if !t.is_empty() && !keeps {
                        listed.push(t.to_ascii_lowercase());
                    }
                }
            }
        });
    }
    // As hyper writes a response: no `Trailer` without a chunked body, no `Content-Length` on
    // a 204 or 304 (a HEAD's answer keeps the length it states).
    let status = raw.status.as_u16();
    let no_length = framing != Framing::None || status == 204 || status == 304;
    raw.for_each_header(|name, value| {
        if is_hop_by_hop(name) || listed.iter().any(|l| name.eq_ignore_ascii_case(l)) {
            return;
        }
        if no_length && name.eq_ignore_ascii_case(b"content-length") {
            return;
        }
        if framing != Framing::Chunked && name.eq_ignore_ascii_case(b"trailer") {
            return;
        }
        line(out, name, value);
    });
    match framing {
        Framing::None => {}
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            push_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    for (n, v) in extra {
        line(out, n, v);
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// One chunk of a chunked body (nothing for empty `data`: an empty chunk would end it).
pub fn chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let mut hex = [0u8; 16];
    let mut i = hex.len();
    let mut n = data.len();
    loop {
        i -= 1;
        hex[i] = b"0123456789abcdef"[n % 16];
        n /= 16;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&hex[i..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The end of a chunked body: the last chunk and the trailer lines of `trailers` among those
/// `declared` (names in lower case).
pub fn last_chunk(out: &mut Vec<u8>, trailers: Option<&http::HeaderMap>, declared: &[String]) {
    out.extend_from_slice(b"0\r\n");
    for (n, v) in trailers.into_iter().flatten() {
        if declared.iter().any(|d| d == n.as_str()) {
            line(out, n.as_str().as_bytes(), v.as_bytes());
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// The trailer fields a response's `Trailer` header declares (lower case), less those no
/// trailer may carry (framing, routing, authentication and content fields, as hyper does).
pub fn declared_trailers(raw: &RawHead) -> Vec<String> {
    const NEVER: [&str; 12] = [
        "authorization",
        "cache-control",
        "content-encoding",
        "content-length",
        "content-range",
        "content-type",
        "host",
        "max-forwards",
        "set-cookie",
        "trailer",
        "transfer-encoding",
        "te",
    ];
    let mut declared = Vec::new();
    raw.for_each_header(|name, value| {
        if name.eq_ignore_ascii_case(b"trailer") {
            for n in value.split(|b| *b == b',') {
                let n = String::from_utf8_lossy(n.trim_ascii()).to_ascii_lowercase();
                if !n.is_empty() && !NEVER.contains(&n.as_str()) {
                    declared.push(n);
                }
            }
        }
    });
    declared
}

/// Writes a response the proxy makes itself (a refusal, a 502 / 503 / 504): its head with
/// `Content-Length`, `Connection: close` when `close`, and its body. A `HEAD` request
/// (`head_only`) gets the head alone.
pub fn own_response(out: &mut Vec<u8>, r: &Response<String>, head_only: bool, close: bool) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(r.status().as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(r.status().canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (n, v) in r.headers() {
        line(out, n.as_str().as_bytes(), v.as_bytes());
    }
    out.extend_from_slice(b"content-length: ");
    push_decimal(out, r.body().len() as u64);
    out.extend_from_slice(b"\r\n");
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !head_only {
        out.extend_from_slice(r.body().as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::super::request::{parse, slots, Parse};
    use super::*;

    fn forwarded(raw: &[u8]) -> String {
        let mut slots = slots();
        let Parse::Head(h) = parse(raw, &mut slots, b"weir-x") else {
            panic!("lean")
        };
        let mut out = Vec::new();
        upstream_request(&mut out, &h, b"10.0.0.9", b"1.1 weir-x");
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_upstream_request_keeps_order_and_spelling_and_joins_the_proxy_headers() {
        let got = forwarded(
            b"GET /a?b=1 HTTP/1.1\r\nHost: h\r\nX-One: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\nX-Forwarded-For: 1.1.1.1\r\nConnection: keep-alive\r\nVia: 1.0 a\r\nx-forwarded-for: 2.2.2.2 \r\nX-One: 2\r\n\r\n",
        );
        assert_eq!(
            got,
            "GET /a?b=1 HTTP/1.1\r\nHost: h\r\nX-One: 1\r\nX-One: 2\r\nx-forwarded-for: 1.1.1.1, 2.2.2.2, 10.0.0.9\r\nvia: 1.0 a, 1.1 weir-x\r\n\r\n"
        );
        assert_eq!(
            forwarded(b"HEAD / HTTP/1.1\r\nhost: h\r\n\r\n"),
            "HEAD / HTTP/1.1\r\nhost: h\r\nx-forwarded-for: 10.0.0.9\r\nvia: 1.1 weir-x\r\n\r\n"
        );
    }

    fn raw(head: &'static [u8]) -> RawHead {
        RawHead::parse_for_tests(head)
    }

    #[test]
    fn the_response_head_drops_hop_by_hop_headers_and_states_its_own_framing() {
        let r = raw(b"HTTP/1.0 200 Fine\r\nA: 1\r\nConnection: x-drop, keep-alive\r\nX-Drop: 1\r\nContent-Length: 5\r\nKeep-Alive: t=1\r\n\r\n");
        let mut out = Vec::new();
        response_head(
            &mut out,
            &r,
            Framing::of(&r, false),
            &[(b"weir-budget-exceeded", b"b")],
            true,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 Fine\r\nA: 1\r\ncontent-length: 5\r\nweir-budget-exceeded: b\r\nconnection: close\r\n\r\n"
        );
        let r = raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n");
        let mut out = Vec::new();
        response_head(&mut out, &r, Framing::of(&r, false), &[], false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        // A HEAD's answer keeps the length it states.
        let r = raw(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n");
        let mut out = Vec::new();
        response_head(&mut out, &r, Framing::of(&r, true), &[], false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"
        );
    }

    #[test]
    fn chunks_and_numbers_are_written_exactly() {
        let mut out = Vec::new();
        chunk(&mut out, b"");
        chunk(&mut out, &[b'a'; 26]);
        let mut t = http::HeaderMap::new();
        t.insert("x-cost", http::HeaderValue::from_static("7"));
        t.insert("x-other", http::HeaderValue::from_static("1"));
        last_chunk(&mut out, Some(&t), &["x-cost".to_string()]);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("1a\r\n{}\r\n0\r\nx-cost: 7\r\n\r\n", "a".repeat(26))
        );
        let r = raw(b"HTTP/1.1 200 OK\r\nTrailer: X-Cost, content-length\r\ntrailer: x-b\r\n\r\n");
        assert_eq!(declared_trailers(&r), ["x-cost", "x-b"]);
        for n in [0u64, 9, 10, 12345, u64::MAX] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
        }
    }
}
