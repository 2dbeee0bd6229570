//! `weir proxy`'s two HTTP/1.1 paths side by side: the same randomised requests (methods,
//! header sets in mixed case with repeated and hop-by-hop fields, bodies by length and chunked,
//! pipelined batches, `Connection: close`, paths needing normalisation, refused callers, client
//! addresses from `X-Forwarded-For` behind a trusted peer) go
//! through a proxy on the lean path and one on hyper's (`Settings::http1`), each in front of
//! its own recording upstream answering with every framing (length, chunks with extensions and
//! trailers, until close, 204, 304, an interim 103, a 500, headers its `Connection` names,
//! repeated fields). What each upstream receives and what the client receives must be the
//! same: the start line, every header value and every body byte for byte.
//!
//! Compared after these normalisations only, each a difference of spelling, not of meaning:
//! header names in lower case (hyper lowers them; the lean path keeps the sender's), fields
//! grouped by name with each name's values in order (hyper's header map groups them; the lean
//! path keeps the sender's order and writes `X-Forwarded-For` and `Via` last), the proxies'
//! own random `Via` tokens, the `Date` hyper adds, and the reason phrase after the status code
//! (hyper writes the canonical one; the lean path passes the upstream's).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use weir_server::net::accept;
use weir_server::proxy::{Http1, Proxy, Settings};

mod common;

/// A message as compared: start line, headers (lower-case names, grouped by name), body,
/// trailers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Message {
    start: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    trailers: Vec<(String, String)>,
}

/// Reads HTTP/1.1 messages from a stream.
struct Reader {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Reader {
    fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    /// Reads more; false at the end of the stream (or an error, or 10 s of silence).
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        match tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            _ => false,
        }
    }

    /// The bytes up to and with the first CRLF CRLF.
    async fn head(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                return Some(self.buf.drain(..end + 4).collect());
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    async fn exact(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill().await {
                return None;
            }
        }
        Some(self.buf.drain(..n).collect())
    }

    async fn line(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf.drain(..end + 2).take(end).collect();
                return Some(line);
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// A chunked body's data and trailers.
    async fn chunked(&mut self) -> Option<(Vec<u8>, Vec<(String, String)>)> {
        let mut data = Vec::new();
        loop {
            let line = self.line().await?;
            let line = String::from_utf8(line).ok()?;
            let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
            if size == 0 {
                break;
            }
            data.extend(self.exact(size).await?);
            self.exact(2).await?;
        }
        let mut trailers = Vec::new();
        loop {
            let line = self.line().await?;
            if line.is_empty() {
                return Some((data, trailers));
            }
            let text = String::from_utf8(line).ok()?;
            let (n, v) = text.split_once(':')?;
            trailers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }

    async fn rest(&mut self) -> Vec<u8> {
        while self.fill().await {}
        std::mem::take(&mut self.buf)
    }
}

/// The start line and headers of a head (names in lower case, in order).
fn parse_head(head: &[u8]) -> (String, Vec<(String, String)>) {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let start = lines.next().unwrap_or_default().to_string();
    let headers = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (start, headers)
}

fn value<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn chunked(headers: &[(String, String)]) -> bool {
    value(headers, "transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
}

/// The normal form compared: names grouped (stable), `Date` dropped, `Via` tokens masked.
fn normal(mut headers: Vec<(String, String)>) -> Vec<(String, String)> {
    headers.retain(|(n, _)| n != "date");
    for (n, v) in &mut headers {
        if n == "via" {
            *v = mask_tokens(v);
        }
    }
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    headers
}

/// `weir-` and 16 hex digits → `weir-TOKEN`.
fn mask_tokens(v: &str) -> String {
    let mut out = String::new();
    let mut rest = v;
    while let Some(i) = rest.find("weir-") {
        out.push_str(&rest[..i + 5]);
        let tail = &rest[i + 5..];
        let hex = tail.chars().take_while(char::is_ascii_hexdigit).count();
        out.push_str(if hex == 16 { "TOKEN" } else { &tail[..hex] });
        rest = &tail[hex..];
    }
    out.push_str(rest);
    out
}

type Seen = Arc<Mutex<BTreeMap<String, Message>>>;

/// An upstream recording every request by its `x-id` and answering with the shape `x-reply`
/// names.
async fn upstream(seen: Seen) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut r = Reader::new(s);
                while let Some(head) = r.head().await {
                    let (start, headers) = parse_head(&head);
                    let body = if chunked(&headers) {
                        match r.chunked().await {
                            Some((data, _)) => data,
                            None => return,
                        }
                    } else if let Some(n) = value(&headers, "content-length") {
                        match r.exact(n.parse().unwrap_or(0)).await {
                            Some(b) => b,
                            None => return,
                        }
                    } else {
                        Vec::new()
                    };
                    let id = value(&headers, "x-id").unwrap_or("?").to_string();
                    let shape: u32 = value(&headers, "x-reply")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let head_only = start.starts_with("HEAD ");
                    let message = Message {
                        start,
                        headers: normal(headers),
                        body,
                        trailers: Vec::new(),
                    };
                    seen.lock().unwrap().insert(id.clone(), message);
                    let (reply, close) = reply(shape, &id, head_only);
                    if r.stream.write_all(&reply).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// The upstream's answer of shape `shape` to request `id`; whether it then closes.
fn reply(shape: u32, id: &str, head_only: bool) -> (Vec<u8>, bool) {
    let body = format!("reply to {id}");
    let len = body.len();
    let (head, body, close) = match shape % 9 {
        0 => (format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nX-A: 1\r\n\r\n"), body, false),
        1 => (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-cost\r\n\r\n".to_string(),
            format!("5;ext=1\r\n{}\r\n{:x}\r\n{}\r\n0\r\nx-cost: 7\r\n\r\n", &body[..5], len - 5, &body[5..]),
            false,
        ),
        2 => ("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_string(), body, true),
        3 => ("HTTP/1.1 204 No Content\r\nX-B: 2\r\n\r\n".to_string(), String::new(), false),
        4 => (
            "HTTP/1.1 304 Not Modified\r\nETag: \"e1\"\r\nContent-Length: 40\r\n\r\n".to_string(),
            String::new(),
            false,
        ),
        5 => (
            format!("HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n"),
            body,
            false,
        ),
        6 => (format!("HTTP/1.1 500 Internal Server Error\r\nContent-Length: {len}\r\n\r\n"), body, false),
        7 => (
            format!("HTTP/1.1 200 OK\r\nConnection: X-Hop, keep-alive\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: {len}\r\n\r\n"),
            body,
            false,
        ),
        _ => (
            format!("HTTP/1.1 201 Created\r\nSet-Cookie: a=1\r\nX-Mixed: 1\r\nset-cookie: b=2\r\nCONTENT-LENGTH: {len}\r\n\r\n"),
            body,
            false,
        ),
    };
    let mut out = head.into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    (out, close)
}

/// One request of a batch: its bytes, and whether its answer has no body (HEAD).
struct Req {
    bytes: Vec<u8>,
    head_only: bool,
}

/// A random request `id` (the last of a batch may close the connection).
fn request(rng: &mut fastrand::Rng, id: &str, last: bool) -> Req {
    let method = ["GET", "GET", "HEAD", "DELETE", "OPTIONS", "POST", "PUT"][rng.usize(..7)];
    let path = [
        "/",
        "/api/items",
        "/api/items?x=1&y=%41",
        "/a//b",
        "/a/./b",
        "/%61pi/x",
        "/deep/path/under/it",
    ][rng.usize(..7)];
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    let case = |rng: &mut fastrand::Rng, name: &str| -> String {
        name.chars()
            .map(|c| {
                if rng.bool() {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect()
    };
    let mut lines: Vec<String> = vec![format!("{}: proxy.test", case(rng, "host"))];
    lines.push(format!("x-id: {id}"));
    let shape = if method == "HEAD" {
        [0, 1, 8][rng.usize(..3)]
    } else {
        rng.u32(..9)
    };
    lines.push(format!("x-reply: {shape}"));
    let optional: [&str; 11] = [
        "accept: */*",
        "user-agent: differential/1.0",
        "x-forwarded-for: 192.0.2.1",
        "x-forwarded-for: 198.51.100.7, 203.0.113.9",
        "via: 1.1 edge",
        "te: trailers",
        "keep-alive: timeout=5",
        "proxy-connection: keep-alive",
        "connection: keep-alive",
        "x-caller: blocked",
        "x-repeat: one",
    ];
    for line in optional {
        if rng.u8(..3) == 0 {
            let (n, v) = line.split_once(": ").unwrap();
            lines.push(format!("{}: {v}", case(rng, n)));
        }
    }
    if rng.u8(..4) == 0 {
        lines.push("X-Repeat: two".into());
    }
    // Lines in a random order (Host among them).
    rng.shuffle(&mut lines);
    let body_kind = if matches!(method, "POST" | "PUT") {
        rng.u8(..3)
    } else {
        3
    };
    let body: String = (0..rng.usize(1..300))
        .map(|_| char::from(b'a' + rng.u8(..26)))
        .collect();
    match body_kind {
        0 => lines.push(format!("content-length: {}", body.len())),
        1 => lines.push("transfer-encoding: chunked".into()),
        2 => lines.push("content-length: 0".into()),
        _ => {}
    }
    if last && rng.u8(..3) == 0 {
        lines.push("connection: close".into());
    }
    for l in lines {
        head.push_str(&l);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    match body_kind {
        0 => bytes.extend_from_slice(body.as_bytes()),
        1 => {
            let cut = body.len() / 2;
            for part in [&body[..cut], &body[cut..]] {
                if !part.is_empty() {
                    bytes.extend_from_slice(format!("{:x}\r\n{part}\r\n", part.len()).as_bytes());
                }
            }
            bytes.extend_from_slice(b"0\r\n\r\n");
        }
        _ => {}
    }
    Req {
        bytes,
        head_only: method == "HEAD",
    }
}

/// Sends `batch` pipelined in one write to `addr` and reads the answers in order (until one
/// closes the connection).
async fn exchange(addr: SocketAddr, batch: &[Req]) -> Vec<Message> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let all: Vec<u8> = batch.iter().flat_map(|r| r.bytes.clone()).collect();
    s.write_all(&all).await.unwrap();
    let mut r = Reader::new(s);
    let mut answers = Vec::new();
    for req in batch {
        let (start, headers) = loop {
            let Some(head) = r.head().await else {
                return answers;
            };
            let (start, headers) = parse_head(&head);
            if !start.starts_with("HTTP/1.1 1") {
                break (start, headers);
            }
        };
        let status = start.get(9..12).unwrap_or_default().to_string();
        let none = req.head_only || status == "204" || status == "304";
        let (body, trailers) = if none {
            (Vec::new(), Vec::new())
        } else if chunked(&headers) {
            r.chunked().await.unwrap_or_default()
        } else if let Some(n) = value(&headers, "content-length") {
            (
                r.exact(n.parse().unwrap_or(0)).await.unwrap_or_default(),
                Vec::new(),
            )
        } else {
            (r.rest().await, Vec::new())
        };
        let close = value(&headers, "connection").is_some_and(|v| v.contains("close"));
        answers.push(Message {
            start: format!("HTTP/1.1 {status}"),
            headers: normal(headers),
            body,
            trailers,
        });
        if close {
            break;
        }
    }
    answers
}

const RULES: &str = "resources:
  - name: all
    authority: {id: callers, deny: [blocked]}
    flow:
      - {id: all-qps, qps: 1000000000, algorithm: gcra}
    hot_params:
      - {id: per-ip, param: 0, threshold: 1000000000, max_values: 1000}
http:
  origin_header: x-caller
  trusted_proxies: [127.0.0.1/32]
  routes:
    - {resource: all, prefix: /, params: [client_ip]}
";

/// A proxy on `path` in front of a recording upstream: its address and what the upstream saw.
async fn proxy(path: Http1) -> (SocketAddr, SocketAddr, Seen, accept::ShutdownTrigger) {
    let seen = Seen::default();
    let up = upstream(seen.clone()).await;
    let file = common::file("proxy-paths", &format!("{path:?}.yaml"), RULES);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    let p = Proxy::build(Settings {
        workers: 1,
        http1: path,
        ..Settings::new(&file, addr, format!("http://{up}"))
    })
    .unwrap();
    let (trigger, shutdown) = accept::shutdown();
    tokio::spawn(async move { p.serve(listener, Some(admin), shutdown).await });
    (addr, admin_addr, seen, trigger)
}

/// The value of the sample `name` on `admin`'s `/metrics`.
async fn metric(admin: SocketAddr, name: &str) -> u64 {
    let text = common::request(admin, "GET", "/metrics", &[], "").await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_paths_send_and_answer_the_same_bytes() {
    let (lean, lean_admin, lean_seen, _a) = proxy(Http1::Lean).await;
    let (hyper, hyper_admin, hyper_seen, _b) = proxy(Http1::Hyper).await;
    // A fixed seed replays a failure; `WEIR_DIFF_SEED` explores others.
    let seed = std::env::var("WEIR_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut answers = 0;
    for round in 0..400 {
        let n = rng.usize(1..5);
        let batch: Vec<Req> = (0..n)
            .map(|i| request(&mut rng, &format!("{round}-{i}"), i + 1 == n))
            .collect();
        let a = exchange(lean, &batch).await;
        let b = exchange(hyper, &batch).await;
        let shown: Vec<String> = batch
            .iter()
            .map(|r| String::from_utf8_lossy(&r.bytes).into_owned())
            .collect();
        assert_eq!(a, b, "the client's answers differ for {shown:#?}");
        assert!(!a.is_empty(), "answered: {shown:#?}");
        answers += a.len();
    }
    let (a, b) = (
        lean_seen.lock().unwrap().clone(),
        hyper_seen.lock().unwrap().clone(),
    );
    assert_eq!(a.len(), b.len(), "as many requests reached each upstream");
    for (id, m) in &a {
        assert_eq!(
            Some(m),
            b.get(id),
            "request {id} reached the upstreams differently"
        );
    }
    assert!(answers >= 300, "{answers} answers compared");
    assert!(a.len() >= 200, "{} requests forwarded", a.len());
    // Both paths were taken: the lean one answered many, and handed connections to hyper.
    let served = metric(lean_admin, "weir_proxy_lean_requests_total").await;
    let handoffs = metric(lean_admin, "weir_proxy_lean_handoffs_total").await;
    eprintln!(
        "{answers} answers and {} upstream requests compared; the lean path answered {served}, \
         hyper took {handoffs} connections over",
        a.len()
    );
    assert!(served >= 100, "the lean path answered {served}");
    assert!(handoffs >= 30, "{handoffs} connections handed to hyper");
    assert_eq!(
        metric(hyper_admin, "weir_proxy_lean_requests_total").await,
        0
    );
}
