//! HTTP/1.1 to the upstream for requests without a body, exchanged on the caller's task.
//!
//! A proxy worker forwards most requests (every `GET`, `HEAD`, `DELETE`, `OPTIONS`) with no
//! request body. hyper's pooled client sends each of them through a channel to a task of its
//! own that drives the connection, and the response back through another: two task wake-ups,
//! a pool lock and a hash of the pool key per request. This client writes the request head and
//! reads the response on the task that calls it, over idle connections kept per worker; the
//! response body reads the same socket as the server polls it, and hands the connection back
//! when its last byte is read. Requests with a body, and h2c, stay with hyper's client.
//!
//! What it does:
//! - the head as given (the proxy has already removed hop-by-hop headers), `Host` from the URI
//!   when the request has none;
//! - the response framed as RFC 9112 §6.3 says: none after `HEAD` or for 204 / 304; chunked
//!   (trailers become a trailers frame); `Content-Length`; else until the upstream closes.
//!   Interim 1xx responses are skipped; `101` is an error (the proxy opens no tunnels);
//! - a connection is reused when its response was framed, HTTP/1.1 and not `Connection:
//!   close`, and read to its end with nothing after it; an idle connection the upstream has
//!   closed is noticed before use (its socket is readable), and a connection that fails
//!   before any byte of the response is replaced once for idempotent methods;
//! - a request that finds no idle connection opens one for the pool on a task of its own and
//!   takes the first connection given back (its own or another request's), so the pool grows
//!   to what the load needs without a request waiting behind a slow connection attempt, and
//!   no attempt is wasted;
//! - bounds: a response head of at most [`MAX_HEAD`] bytes and [`MAX_HEADERS`] headers, chunk
//!   size lines of at most [`MAX_LINE`] bytes, [`H1Client::new`]'s idle count and age (aged
//!   by the clock of the last [`H1Client::prune`], every [`PRUNE_EVERY`]: no clock read per
//!   request).

use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Longest response head (status line and headers) accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most headers in a response head (or in a chunked body's trailers).
pub const MAX_HEADERS: usize = 100;
/// Longest chunk-size line (with extensions) or trailer section of a chunked body.
pub const MAX_LINE: usize = 4096;

/// How often [`H1Client::keep_pruned`] looks over the idle connections.
pub const PRUNE_EVERY: Duration = Duration::from_secs(5);

/// Why an exchange with the upstream failed.
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    /// No connection could be opened.
    #[error("cannot connect to {authority}: {source}")]
    Connect {
        /// The upstream's `host:port`.
        authority: String,
        /// The socket's error.
        source: std::io::Error,
    },
    /// The socket failed while sending the request or reading the response.
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    /// The upstream closed the connection before the response was complete.
    #[error("the upstream closed the connection before the end of the response")]
    Closed,
    /// The response is not valid HTTP/1.1.
    #[error("invalid response: {0}")]
    Invalid(&'static str),
    /// The response head is longer than [`MAX_HEAD`] or has more than [`MAX_HEADERS`]
    /// headers.
    #[error("the response head is larger than {MAX_HEAD} bytes or {MAX_HEADERS} headers")]
    HeadTooLarge,
    /// The URI names no host.
    #[error("the upstream URI has no host")]
    NoHost,
}

/// A connection and the bytes read from it that no response has used yet.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

/// The idle connections to one upstream address, the most recently used last, and the
/// requests waiting for one while they connect.
struct Idle {
    /// Shared with the response bodies that give connections back.
    authority: Arc<str>,
    /// With the time each was given back (see [`Shared::coarse_ms`]).
    conns: Vec<(Conn, u64)>,
    waiters: std::collections::VecDeque<oneshot::Sender<Conn>>,
}

struct Shared {
    idle: Mutex<Vec<Idle>>,
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    epoch: Instant,
    /// Milliseconds from `epoch` to the last [`H1Client::prune`]: what idle connections are
    /// stamped with and aged by, so that a request reads no clock (ages are seen in steps of
    /// [`PRUNE_EVERY`], a connection closed up to one step early).
    coarse_ms: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn idle_ms(&self) -> u64 {
        u64::try_from(self.idle_timeout.as_millis()).unwrap_or(u64::MAX)
    }
}

/// An HTTP/1.1 client for bodiless requests over idle connections of its own (see the module
/// docs). Cheap to clone: clones share the idle connections.
#[derive(Clone)]
pub struct H1Client {
    shared: Arc<Shared>,
}

/// A connection to use: one that was idle, or the promise of the next one given back.
enum Checkout {
    Idle(Conn, Arc<str>),
    Wait(oneshot::Receiver<Conn>, Arc<str>),
}

impl H1Client {
    /// A client keeping at most `max_idle` idle connections per upstream address, each for at
    /// most `idle_timeout`, and giving up a connection attempt after `connect_timeout`.
    pub fn new(max_idle: usize, idle_timeout: Duration, connect_timeout: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                idle: Mutex::new(Vec::new()),
                max_idle,
                idle_timeout,
                connect_timeout,
                epoch: Instant::now(),
                coarse_ms: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// Sends `head` (a request with no body) to the host and port of its URI and reads the
    /// response head; the body follows as the upstream sends it.
    pub async fn send(&self, head: &http::request::Parts) -> Result<Response<H1Body>, H1Error> {
        let authority = match head.uri.authority() {
            Some(a) => a.as_str(),
            None => return Err(H1Error::NoHost),
        };
        let wire = encode_head(head, authority);
        let to = Target {
            uri: &head.uri,
            authority,
            retry: is_idempotent(&head.method),
            head_only: head.method == Method::HEAD,
        };
        let (conn, response, key) = self.exchange_with(&to, &wire, parse_head).await?;
        Ok(self.body_of(conn, response, to.head_only, key))
    }

    /// Sends `wire`, a request head with no body already encoded (its method idempotent when
    /// `retry`, `HEAD` when `head_only`), to `uri`'s host and port (`authority`), and reads the
    /// response head as it came, with its body to follow: for a server that writes the head
    /// back itself rather than through a header map.
    pub async fn send_wire(
        &self,
        uri: &Uri,
        authority: &str,
        wire: &[u8],
        retry: bool,
        head_only: bool,
    ) -> Result<(RawHead, H1Body), H1Error> {
        let to = Target {
            uri,
            authority,
            retry,
            head_only,
        };
        let (conn, raw, key) = self.exchange_with(&to, wire, parse_raw).await?;
        let framing = body_framing(raw.framing, raw.status, head_only);
        let body = self.body(conn, framing, raw.keep_alive, key);
        Ok((raw, body))
    }

    /// Writes `wire` on a connection to `to` and reads the response head with `parse`,
    /// replacing a connection that fails before any byte of the response once when the method
    /// allows it.
    async fn exchange_with<T>(
        &self,
        to: &Target<'_>,
        wire: &[u8],
        parse: impl Fn(&mut BytesMut) -> Result<Option<Parsed<T>>, H1Error> + Copy,
    ) -> Result<(Conn, T, Arc<str>), H1Error> {
        let mut retried = false;
        loop {
            let (mut conn, key) = match self.take(to.authority) {
                Checkout::Idle(c, key) => (c, key),
                Checkout::Wait(given, key) => {
                    let c = self.connect_or_wait(to.uri, &key, given).await?;
                    (c, key)
                }
            };
            match exchange(&mut conn, wire, parse).await {
                Ok(response) => return Ok((conn, response, key)),
                Err(Failure { error, answered }) => {
                    // Once: a connection the upstream closed as it was taken.
                    if to.retry && !answered && !retried {
                        retried = true;
                        continue;
                    }
                    return Err(error);
                }
            }
        }
    }

    /// With no idle connection: opens one for the pool (on a task of its own, so it is not
    /// lost if this request goes on without it) and takes the first connection given back,
    /// which may be another request's. A connection attempt can wait a second for a SYN resent
    /// when the upstream's accept queue overflows; a request need not wait with it.
    async fn connect_or_wait(
        &self,
        uri: &Uri,
        authority: &Arc<str>,
        given: oneshot::Receiver<Conn>,
    ) -> Result<Conn, H1Error> {
        let (failed_tx, failed) = oneshot::channel();
        let client = self.clone();
        let (uri, authority) = (uri.clone(), authority.clone());
        tokio::spawn(async move {
            match client.connect(&uri, &authority).await {
                Ok(conn) => client.put(&authority, conn),
                Err(e) => {
                    let _ = failed_tx.send(e);
                }
            }
        });
        tokio::select! {
            biased;
            Ok(c) = given => Ok(c),
            Ok(e) = failed => Err(e),
            else => Err(H1Error::Closed),
        }
    }

    /// The most recently used idle connection to `authority` the upstream has not closed, or
    /// else a place among those waiting for one.
    fn take(&self, authority: &str) -> Checkout {
        let mut idle = self.shared.idle.lock().unwrap_or_else(|p| p.into_inner());
        let entry = Self::entry(&mut idle, authority);
        let (now, idle_ms) = (self.shared.now_ms(), self.shared.idle_ms());
        // The oldest first: those past their age go.
        let fresh = entry
            .conns
            .iter()
            .position(|(_, since)| now.saturating_sub(*since) < idle_ms)
            .unwrap_or(entry.conns.len());
        entry.conns.drain(..fresh);
        while let Some((conn, _)) = entry.conns.pop() {
            if still_open(&conn.stream) {
                return Checkout::Idle(conn, entry.authority.clone());
            }
        }
        // Waiters whose requests went on (their own connection came first) are dropped, so
        // the queue holds at most one entry per request still connecting.
        if entry.waiters.len() >= 64 {
            entry.waiters.retain(|w| !w.is_closed());
        }
        let (tx, rx) = oneshot::channel();
        entry.waiters.push_back(tx);
        Checkout::Wait(rx, entry.authority.clone())
    }

    /// The idle set of `authority` (made when it has none: [`H1Client::prune`] drops empty
    /// ones, also while their connections are in use).
    fn entry<'a>(idle: &'a mut Vec<Idle>, authority: &str) -> &'a mut Idle {
        let i = match idle.iter().position(|i| *i.authority == *authority) {
            Some(i) => i,
            None => {
                idle.push(Idle {
                    authority: authority.into(),
                    conns: Vec::new(),
                    waiters: std::collections::VecDeque::new(),
                });
                idle.len() - 1
            }
        };
        &mut idle[i]
    }

    /// Gives `conn` to the first request waiting for one, or keeps it for the next request to
    /// `authority` (or closes it when enough are idle).
    fn put(&self, authority: &str, mut conn: Conn) {
        let mut idle = self.shared.idle.lock().unwrap_or_else(|p| p.into_inner());
        let entry = Self::entry(&mut idle, authority);
        while let Some(w) = entry.waiters.pop_front() {
            match w.send(conn) {
                Ok(()) => return,
                Err(back) => conn = back,
            }
        }
        if entry.conns.len() < self.shared.max_idle {
            entry.conns.push((conn, self.shared.now_ms()));
        }
    }

    /// Closes the idle connections past their age or closed by the upstream, forgets the
    /// waiters whose requests went on, and drops upstreams with neither. Without it a quiet
    /// proxy would keep them until the next request: a socket the upstream closed stays in
    /// `CLOSE_WAIT`, holding a descriptor, until it is dropped.
    pub fn prune(&self) {
        let now = u64::try_from(self.shared.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.shared
            .coarse_ms
            .store(now, std::sync::atomic::Ordering::Relaxed);
        let idle_ms = self.shared.idle_ms();
        let mut idle = self.shared.idle.lock().unwrap_or_else(|p| p.into_inner());
        for entry in idle.iter_mut() {
            entry.conns.retain(|(conn, since)| {
                now.saturating_sub(*since) < idle_ms && still_open(&conn.stream)
            });
            entry.waiters.retain(|w| !w.is_closed());
        }
        idle.retain(|e| !e.conns.is_empty() || !e.waiters.is_empty());
    }

    /// Idle connections kept, all upstreams together.
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        let idle = self.shared.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.iter().map(|e| e.conns.len()).sum()
    }

    /// [`H1Client::prune`] every [`PRUNE_EVERY`], for as long as the runtime runs it.
    pub async fn keep_pruned(self) {
        let mut tick = tokio::time::interval(PRUNE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.prune();
        }
    }

    async fn connect(&self, uri: &Uri, authority: &str) -> Result<Conn, H1Error> {
        let host = uri.host().ok_or(H1Error::NoHost)?;
        // An IPv6 literal comes bracketed.
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let port = uri.port_u16().unwrap_or(80);
        let failed = |source| H1Error::Connect {
            authority: authority.to_owned(),
            source,
        };
        let stream = tokio::time::timeout(
            self.shared.connect_timeout,
            TcpStream::connect((host, port)),
        )
        .await
        .map_err(|_| failed(std::io::ErrorKind::TimedOut.into()))?
        .map_err(failed)?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(8 * 1024),
        })
    }

    fn body_of(
        &self,
        conn: Conn,
        r: ResponseHead,
        head_only: bool,
        authority: Arc<str>,
    ) -> Response<H1Body> {
        let ResponseHead {
            status,
            version,
            mut headers,
            framing,
            keep_alive,
        } = r;
        let framing = body_framing(framing, status, head_only);
        if matches!(framing, Framing::Chunked(_)) {
            // Transfer-Encoding wins over Content-Length (RFC 9112 §6.3).
            headers.remove(header::CONTENT_LENGTH);
        }
        let body = self.body(conn, framing, keep_alive, authority);
        let mut response = Response::new(body);
        *response.status_mut() = status;
        *response.version_mut() = version;
        *response.headers_mut() = headers;
        response
    }

    /// The body read from `conn` as `framing` says, its connection given back at its end when
    /// `keep_alive` and the body's end is known.
    fn body(&self, conn: Conn, framing: Framing, keep_alive: bool, authority: Arc<str>) -> H1Body {
        let reuse = keep_alive && !matches!(framing, Framing::Close);
        let mut body = H1Body {
            conn: Some(conn),
            framing,
            home: reuse.then(|| (self.clone(), authority)),
        };
        body.end_if_done();
        body
    }
}

/// Where a request goes and how it may be sent again.
struct Target<'a> {
    uri: &'a Uri,
    authority: &'a str,
    /// The method is idempotent: a connection that fails before answering is replaced once.
    retry: bool,
    /// A `HEAD` request: the response has no body whatever its head says.
    head_only: bool,
}

/// How a response body ends: none after `HEAD` or for 204 / 304 (RFC 9112 §6.3), else as its
/// head said.
fn body_framing(framing: Framing, status: StatusCode, head_only: bool) -> Framing {
    if head_only || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        Framing::Length(0)
    } else {
        framing
    }
}

/// Whether an idle connection is still usable: its socket has nothing to read (a closed one
/// reads end of file). Unless the runtime has seen the socket become readable since it last
/// read it dry, this reads nothing: no system call, no lock.
fn still_open(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Methods a request may be repeated with (RFC 9110 §9.2.2).
fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The request head on the wire.
fn encode_head(head: &http::request::Parts, authority: &str) -> Vec<u8> {
    let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut w = Vec::with_capacity(256);
    w.extend_from_slice(head.method.as_str().as_bytes());
    w.push(b' ');
    w.extend_from_slice(path.as_bytes());
    w.extend_from_slice(b" HTTP/1.1\r\n");
    if !head.headers.contains_key(header::HOST) {
        w.extend_from_slice(b"host: ");
        w.extend_from_slice(authority.as_bytes());
        w.extend_from_slice(b"\r\n");
    }
    for (name, value) in &head.headers {
        // A bodiless request is framed by its lack of framing headers.
        if name == header::TRANSFER_ENCODING {
            continue;
        }
        w.extend_from_slice(name.as_str().as_bytes());
        w.extend_from_slice(b": ");
        w.extend_from_slice(value.as_bytes());
        w.extend_from_slice(b"\r\n");
    }
    w.extend_from_slice(b"\r\n");
    w
}

/// A failed exchange, and whether any byte of the response had come (then it is not retried).
struct Failure {
    error: H1Error,
    answered: bool,
}

/// What the response head says.
struct ResponseHead {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    framing: Framing,
    keep_alive: bool,
}

/// Writes the request and reads the response head with `parse` (skipping interim 1xx
/// responses).
async fn exchange<T>(
    conn: &mut Conn,
    wire: &[u8],
    parse: impl Fn(&mut BytesMut) -> Result<Option<Parsed<T>>, H1Error>,
) -> Result<T, Failure> {
    let quiet = |error: H1Error| Failure {
        error,
        answered: false,
    };
    conn.stream
        .write_all(wire)
        .await
        .map_err(|e| quiet(e.into()))?;
    let mut answered = false;
    loop {
        if !conn.buf.is_empty() {
            answered = true;
            match parse(&mut conn.buf) {
                Ok(Some(Parsed::Interim)) => continue,
                Ok(Some(Parsed::Final(h))) => return Ok(h),
                Ok(None) => {}
                Err(error) => return Err(Failure { error, answered }),
            }
            if conn.buf.len() >= MAX_HEAD {
                return Err(Failure {
                    error: H1Error::HeadTooLarge,
                    answered,
                });
            }
        }
        conn.buf.reserve(8 * 1024);
        match conn.stream.read_buf(&mut conn.buf).await {
            Ok(0) => {
                return Err(Failure {
                    error: H1Error::Closed,
                    answered,
                })
            }
            Ok(_) => {}
            Err(e) => {
                return Err(Failure {
                    error: e.into(),
                    answered,
                })
            }
        }
    }
}

enum Parsed<T> {
    Interim,
    Final(T),
}

/// Parses a response head at the start of `buf`, taking its bytes; `None` while incomplete.
/// The header map shares the head's bytes.
fn parse_head(buf: &mut BytesMut) -> Result<Option<Parsed<ResponseHead>>, H1Error> {
    Ok(match parse_raw(buf)? {
        None => None,
        Some(Parsed::Interim) => Some(Parsed::Interim),
        Some(Parsed::Final(raw)) => Some(Parsed::Final(raw.into_head()?)),
    })
}

/// A response head as it came (for a server writing it back itself): the status, and the
/// bytes of the head with what framing needs read from them.
#[derive(Debug)]
pub struct RawHead {
    /// The status.
    pub status: StatusCode,
    /// The head's bytes: status line, header lines, the blank line.
    pub head: Bytes,
    version: Version,
    framing: Framing,
    keep_alive: bool,
    /// Its `Connection` names headers (besides `close` and `keep-alive`): hop-by-hop ones.
    pub names_hops: bool,
    /// Where the first [`SPANS`] headers' names and values are in `head` (start, length of
    /// each), when it has no more; else the head is parsed again to be read.
    spans: Option<([Span; SPANS], u8)>,
}

/// Headers of a response head whose places are kept (most responses have fewer).
const SPANS: usize = 16;

/// A header's name and value in a head: offsets and lengths.
type Span = [u16; 4];

impl RawHead {
    /// The head with its headers in a map sharing the head's bytes.
    fn into_head(self) -> Result<ResponseHead, H1Error> {
        let base = self.head.as_ptr() as usize;
        let mut headers = HeaderMap::with_capacity(self.spans.as_ref().map_or(0, |s| s.1.into()));
        let mut bad = None;
        self.for_each_header(|name, value| {
            let start = value.as_ptr() as usize - base;
            let value = HeaderValue::from_maybe_shared(self.head.slice(start..start + value.len()));
            match (HeaderName::from_bytes(name), value) {
                (Ok(n), Ok(v)) => {
                    headers.append(n, v);
                }
                _ => bad = Some(H1Error::Invalid("bad header name or value")),
            }
        });
        if let Some(e) = bad {
            return Err(e);
        }
        Ok(ResponseHead {
            status: self.status,
            version: self.version,
            headers,
            framing: self.framing,
            keep_alive: self.keep_alive,
        })
    }

    /// Calls `f` with each header's name and value, in order (names as the upstream wrote
    /// them). The head was parsed once already: this cannot fail.
    pub fn for_each_header(&self, mut f: impl FnMut(&[u8], &[u8])) {
        if let Some((spans, n)) = &self.spans {
            let at = |start: u16, len: u16| {
                let (s, l) = (start as usize, len as usize);
                self.head.get(s..s + l).unwrap_or_default()
            };
            for [n0, nl, v0, vl] in &spans[..usize::from(*n)] {
                f(at(*n0, *nl), at(*v0, *vl));
            }
            return;
        }
        let mut slots = header_room();
        let mut r = httparse::Response::new(&mut []);
        if status_of(&mut r, &self.head, &mut slots).is_ok() {
            for h in r.headers.iter() {
                f(h.name.as_bytes(), h.value);
            }
        }
    }

    /// Whether the body is chunked, of a stated length, or read until the upstream closes
    /// (`Some(n)`: exactly `n` bytes; `None`: a length not known in advance).
    pub fn length(&self) -> Option<u64> {
        match self.framing {
            Framing::Length(n) => Some(n),
            _ => None,
        }
    }
}

#[cfg(test)]
impl RawHead {
    /// The head of `raw`, a whole response head.
    pub fn parse_for_tests(raw: &'static [u8]) -> Self {
        match parse_raw(&mut BytesMut::from(raw)) {
            Ok(Some(Parsed::Final(r))) => r,
            _ => panic!("not a final response head"),
        }
    }
}

/// Parses a response head at the start of `buf` as it came, taking its bytes; `None` while
/// incomplete.
fn parse_raw(buf: &mut BytesMut) -> Result<Option<Parsed<RawHead>>, H1Error> {
    let mut slots = header_room();
    let mut r = httparse::Response::new(&mut []);
    let (len, status, version) = match status_of(&mut r, buf, &mut slots)? {
        Start::Partial => return Ok(None),
        Start::Interim(len) => return Ok(Some(interim(buf, len))),
        Start::Final(len, status, version) => (len, status, version),
    };
    let mut framer = Framer::new(version);
    let base = buf.as_ptr() as usize;
    let mut spans = [[0u16; 4]; SPANS];
    // A place past u16 (a head over 64 KiB) leaves the head to be parsed again when read.
    let mut placed = r.headers.len() <= SPANS;
    let mut at = |n: usize| {
        u16::try_from(n).unwrap_or_else(|_| {
            placed = false;
            0
        })
    };
    for (i, h) in r.headers.iter().enumerate() {
        framer.see(h.name.as_bytes(), h.value)?;
        if let Some(span) = spans.get_mut(i) {
            *span = [
                at(h.name.as_ptr() as usize - base),
                at(h.name.len()),
                at(h.value.as_ptr() as usize - base),
                at(h.value.len()),
            ];
        }
    }
    let count = r.headers.len();
    let spans = u8::try_from(count)
        .ok()
        .filter(|_| placed)
        .map(|n| (spans, n));
    let names_hops = framer.names_hops;
    let (framing, keep_alive) = framer.finish();
    Ok(Some(Parsed::Final(RawHead {
        status,
        version,
        head: buf.split_to(len).freeze(),
        framing,
        keep_alive,
        names_hops,
        spans,
    })))
}

/// Room for a response head's header lines, written only as httparse reads them (a head pays
/// for the lines it has, not for the room).
fn header_room<'b>() -> [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS] {
    [const { MaybeUninit::uninit() }; MAX_HEADERS]
}

/// How a response head starts.
enum Start {
    /// Not whole yet.
    Partial,
    /// An interim 1xx response of this many bytes.
    Interim(usize),
    /// The final response: the head's length, status and version.
    Final(usize, StatusCode, Version),
}

/// Parses the status line and headers of `buf` into `r` (its header lines into `slots`, which
/// need not be written beforehand). A 101 is an error (no upgrade is ever asked).
fn status_of<'h, 'b>(
    r: &mut httparse::Response<'h, 'b>,
    buf: &'b [u8],
    slots: &'h mut [MaybeUninit<httparse::Header<'b>>],
) -> Result<Start, H1Error> {
    let len =
        match httparse::ParserConfig::default().parse_response_with_uninit_headers(r, buf, slots) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(Start::Partial),
            Err(httparse::Error::TooManyHeaders) => return Err(H1Error::HeadTooLarge),
            Err(_) => return Err(H1Error::Invalid("malformed status line or header")),
        };
    let code = r.code.ok_or(H1Error::Invalid("no status code"))?;
    let status = StatusCode::from_u16(code).map_err(|_| H1Error::Invalid("bad status code"))?;
    let version = if r.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(H1Error::Invalid(
            "101 Switching Protocols: no upgrade was asked",
        ));
    }
    if status.is_informational() {
        return Ok(Start::Interim(len));
    }
    Ok(Start::Final(len, status, version))
}

/// An interim response of `len` bytes, skipped.
fn interim<T>(buf: &mut BytesMut, len: usize) -> Parsed<T> {
    buf.advance(len);
    Parsed::Interim
}

/// What a response's headers say of its framing and its connection (RFC 9112 §6.3, §9.3).
struct Framer {
    version: Version,
    chunked: Option<bool>,
    length: Option<u64>,
    close: bool,
    /// `Connection` named a header.
    names_hops: bool,
}

impl Framer {
    fn new(version: Version) -> Self {
        Self {
            version,
            chunked: None,
            length: None,
            close: version == Version::HTTP_10,
            names_hops: false,
        }
    }

    /// Reads one header (`name` in any case; most are none of the three, told by length).
    fn see(&mut self, name: &[u8], value: &[u8]) -> Result<(), H1Error> {
        match name.len() {
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => {
                // Only the last coding decides.
                self.chunked = Some(
                    value
                        .rsplit(|b| *b == b',')
                        .next()
                        .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked")),
                );
            }
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                for part in value.split(|b| *b == b',') {
                    let n = parse_decimal(part.trim_ascii())
                        .ok_or(H1Error::Invalid("bad Content-Length"))?;
                    if self.length.is_some_and(|l| l != n) {
                        return Err(H1Error::Invalid("conflicting Content-Length values"));
                    }
                    self.length = Some(n);
                }
            }
            10 if name.eq_ignore_ascii_case(b"connection") => {
                for token in value.split(|b| *b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        self.close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        if self.version == Version::HTTP_10 {
                            self.close = false;
                        }
                    } else if !token.is_empty() {
                        self.names_hops = true;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The framing, and whether the connection may carry another exchange.
    fn finish(self) -> (Framing, bool) {
        let framing = match (self.chunked, self.length) {
            (Some(true), _) => Framing::Chunked(Chunk::Size),
            (Some(false), _) => Framing::Close,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::Close,
        };
        // A response with both framings must not be followed on the connection (RFC 9112
        // §6.3).
        let both = self.chunked.is_some() && self.length.is_some();
        (framing, !(self.close || both))
    }
}

fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// How the response body ends.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// After this many more bytes.
    Length(u64),
    /// With a zero-size chunk (and its trailers).
    Chunked(Chunk),
    /// When the upstream closes the connection.
    Close,
}

/// Where a chunked body's reader is.
#[derive(Debug, Clone, Copy)]
enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Within a chunk's data: this many bytes left.
    Data(u64),
    /// After a chunk's data, before its CRLF.
    DataEnd,
    /// After the last chunk: the trailer section.
    Trailers,
    /// Read to the end.
    Done,
}

/// A response body read from the upstream connection as the server asks for it; the
/// connection goes back to its client's idle set when the body's last byte is read.
pub struct H1Body {
    conn: Option<Conn>,
    framing: Framing,
    /// Where the connection goes when the body ends (`None`: it is closed).
    home: Option<(H1Client, Arc<str>)>,
}

impl H1Body {
    /// Appends the whole body to `out` when it is all read already (a length stated and that
    /// many bytes in hand, as a small response's are) and gives the connection back; `false`
    /// (nothing appended) otherwise. Saves a small response the frame-by-frame relay.
    pub fn append_whole(&mut self, out: &mut Vec<u8>) -> bool {
        let (Some(conn), Framing::Length(left)) = (self.conn.as_mut(), &mut self.framing) else {
            return false;
        };
        let Some(whole) = usize::try_from(*left).ok().and_then(|n| conn.buf.get(..n)) else {
            return false;
        };
        out.extend_from_slice(whole);
        conn.buf.advance(whole.len());
        *left = 0;
        self.end_if_done();
        true
    }

    /// Gives the connection back once the body is read to its end.
    fn end_if_done(&mut self) {
        let done = match self.framing {
            Framing::Length(n) => n == 0,
            Framing::Chunked(Chunk::Done) => true,
            _ => false,
        };
        if !done {
            return;
        }
        if let (Some(conn), Some((client, authority))) = (self.conn.take(), self.home.take()) {
            // Bytes after the response are not a response to anything: such a connection is
            // closed, not reused.
            if conn.buf.is_empty() {
                client.put(&authority, conn);
            }
        }
        self.conn = None;
    }

    /// Reads more of the connection into its buffer; `Ok(0)` at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<usize, H1Error>> {
        let Some(conn) = self.conn.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        conn.buf.reserve(8 * 1024);
        loop {
            std::task::ready!(conn.stream.poll_read_ready(cx))?;
            match conn.stream.try_read_buf(&mut conn.buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
    }

    /// The next frame of a chunked body, or `None` when it needs more bytes.
    fn step_chunked(&mut self) -> Result<Option<Option<Frame<Bytes>>>, H1Error> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(Some(None));
        };
        let Framing::Chunked(state) = &mut self.framing else {
            return Ok(Some(None));
        };
        let buf = &mut conn.buf;
        loop {
            match *state {
                Chunk::Size => {
                    let Some(end) = find_crlf(buf) else {
                        if buf.len() > MAX_LINE {
                            return Err(H1Error::Invalid("chunk-size line too long"));
                        }
                        return Ok(None);
                    };
                    let line = &buf[..end];
                    let size = line.split(|b| *b == b';').next().unwrap_or_default();
                    let size =
                        parse_hex(size.trim_ascii()).ok_or(H1Error::Invalid("bad chunk size"))?;
                    buf.advance(end + 2);
                    *state = if size == 0 {
                        Chunk::Trailers
                    } else {
                        Chunk::Data(size)
                    };
                }
                Chunk::Data(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(n).freeze();
                    *state = if left == n as u64 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left - n as u64)
                    };
                    return Ok(Some(Some(Frame::data(data))));
                }
                Chunk::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(H1Error::Invalid("chunk data not followed by CRLF"));
                    }
                    buf.advance(2);
                    *state = Chunk::Size;
                }
                Chunk::Trailers => {
                    if buf.starts_with(b"\r\n") {
                        buf.advance(2);
                        *state = Chunk::Done;
                        return Ok(Some(None));
                    }
                    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    let (len, map) = match httparse::parse_headers(buf, &mut slots) {
                        Ok(httparse::Status::Complete((len, parsed))) => {
                            let mut map = HeaderMap::with_capacity(parsed.len());
                            for h in parsed {
                                let (Ok(n), Ok(v)) = (
                                    HeaderName::from_bytes(h.name.as_bytes()),
                                    HeaderValue::from_bytes(h.value),
                                ) else {
                                    return Err(H1Error::Invalid("bad trailer"));
                                };
                                map.append(n, v);
                            }
                            (len, map)
                        }
                        Ok(httparse::Status::Partial) => {
                            if buf.len() > MAX_LINE {
                                return Err(H1Error::Invalid("trailer section too long"));
                            }
                            return Ok(None);
                        }
                        Err(_) => return Err(H1Error::Invalid("bad trailer")),
                    };
                    buf.advance(len);
                    *state = Chunk::Done;
                    return Ok(Some(Some(Frame::trailers(map))));
                }
                Chunk::Done => return Ok(Some(None)),
            }
        }
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 15 {
        return None;
    }
    s.iter().try_fold(0u64, |n, d| {
        let v = char::from(*d).to_digit(16)?;
        Some(n * 16 + u64::from(v))
    })
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = H1Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match &mut this.framing {
                Framing::Length(0) => {
                    this.end_if_done();
                    return Poll::Ready(None);
                }
                Framing::Length(left) => {
                    if !conn.buf.is_empty() {
                        let n = usize::try_from(*left)
                            .unwrap_or(usize::MAX)
                            .min(conn.buf.len());
                        let data = conn.buf.split_to(n).freeze();
                        *left -= n as u64;
                        this.end_if_done();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                Framing::Close => {
                    if !conn.buf.is_empty() {
                        let data = conn.buf.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                Framing::Chunked(_) => match this.step_chunked() {
                    Ok(Some(frame)) => {
                        this.end_if_done();
                        return Poll::Ready(frame.map(Ok));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        this.conn = None;
                        return Poll::Ready(Some(Err(e)));
                    }
                },
            }
            match std::task::ready!(this.poll_fill(cx)) {
                Ok(0) => {
                    this.conn = None;
                    return Poll::Ready(match this.framing {
                        Framing::Close => None,
                        _ => Some(Err(H1Error::Closed)),
                    });
                }
                Ok(_) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self.framing {
            Framing::Length(n) => n == 0,
            Framing::Chunked(Chunk::Done) => true,
            _ => self.conn.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::net::TcpListener;

    /// An upstream that answers each request (read up to its blank line) with the next of
    /// `replies`, on one connection per entry of `conns` (how many replies each connection
    /// gives before it is closed).
    async fn upstream(
        conns: Vec<Vec<&'static [u8]>>,
    ) -> (u16, tokio::task::JoinHandle<Vec<String>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            for replies in conns {
                let (mut s, _) = l.accept().await.unwrap();
                for reply in replies {
                    let mut req = Vec::new();
                    while !req.ends_with(b"\r\n\r\n") {
                        let mut b = [0u8; 1];
                        if s.read(&mut b).await.unwrap() == 0 {
                            return seen;
                        }
                        req.push(b[0]);
                    }
                    seen.push(String::from_utf8(req).unwrap());
                    s.write_all(reply).await.unwrap();
                }
            }
            seen
        });
        (port, task)
    }

    fn get(port: u16, method: Method) -> http::request::Parts {
        let (mut p, ()) = http::Request::builder()
            .method(method)
            .uri(format!("http://127.0.0.1:{port}/a?b=1"))
            .header("x-one", "1")
            .body(())
            .unwrap()
            .into_parts();
        p.headers.append("x-one", HeaderValue::from_static("2"));
        p
    }

    async fn collect(r: Response<H1Body>) -> (Bytes, Option<HeaderMap>) {
        let c = r.into_body().collect().await.unwrap();
        let t = c.trailers().cloned();
        (c.to_bytes(), t)
    }

    #[test]
    fn a_raw_head_gives_its_headers_in_order_whatever_their_number() {
        for n in [0usize, 3, SPANS, SPANS + 1, 40] {
            let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
            for i in 0..n {
                head.extend_from_slice(format!("X-H{i}: v{i}\r\n").as_bytes());
            }
            head.extend_from_slice(b"\r\ntail");
            let mut buf = BytesMut::from(&head[..]);
            let Ok(Some(Parsed::Final(raw))) = parse_raw(&mut buf) else {
                panic!("a head");
            };
            assert_eq!(&buf[..], b"tail", "the head's bytes taken");
            let mut seen = Vec::new();
            raw.for_each_header(|n, v| {
                seen.push(format!(
                    "{}={}",
                    String::from_utf8_lossy(n),
                    String::from_utf8_lossy(v)
                ))
            });
            let want: Vec<String> = (0..n).map(|i| format!("X-H{i}=v{i}")).collect();
            assert_eq!(seen, want, "{n} headers");
        }
    }

    #[tokio::test]
    async fn a_body_in_hand_is_appended_whole_and_its_connection_given_back_at_once() {
        let (port, _seen) = upstream(vec![vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello",
        ]])
        .await;
        let c = H1Client::new(8, Duration::from_secs(60), Duration::from_secs(5));
        let uri: Uri = format!("http://127.0.0.1:{port}/").parse().unwrap();
        let authority = format!("127.0.0.1:{port}");
        let wire = format!("GET / HTTP/1.1\r\nhost: {authority}\r\n\r\n");
        let (raw, mut body) = c
            .send_wire(&uri, &authority, wire.as_bytes(), true, false)
            .await
            .unwrap();
        assert_eq!(raw.length(), Some(5));
        let mut out = b"head;".to_vec();
        assert!(body.append_whole(&mut out));
        assert_eq!(out, b"head;hello");
        assert_eq!(c.idle(), 1, "given back before the body is dropped");
        // Half of the stated length in hand: nothing appended, the body is read as it comes.
        let (_, mut body) = c
            .send_wire(&uri, &authority, wire.as_bytes(), true, false)
            .await
            .unwrap();
        let mut out = Vec::new();
        assert!(!body.append_whole(&mut out));
        assert!(out.is_empty());
        assert_eq!(c.idle(), 0, "still reading the body");
    }

    #[tokio::test]
    async fn a_sized_response_is_read_and_its_connection_reused() {
        let (port, seen) = upstream(vec![vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\nhello",
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
        ]])
        .await;
        let c = H1Client::new(8, Duration::from_secs(60), Duration::from_secs(5));
        let r = c.send(&get(port, Method::GET)).await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-a"], "1");
        assert_eq!(r.body().size_hint().exact(), Some(5));
        assert_eq!(collect(r).await.0, "hello");
        let r = c.send(&get(port, Method::GET)).await.unwrap();
        assert_eq!(r.status(), 404);
        assert!(r.body().is_end_stream());
        drop(r);
        let seen = seen.await.unwrap();
        assert_eq!(seen.len(), 2, "both on one connection");
        assert!(
            seen[0].starts_with("GET /a?b=1 HTTP/1.1\r\nhost: 127.0.0.1:"),
            "{}",
            seen[0]
        );
        assert!(seen[0].contains("x-one: 1\r\nx-one: 2\r\n"), "{}", seen[0]);
    }

    #[tokio::test]
    async fn a_chunked_response_gives_its_data_and_trailers() {
        let (port, _seen) = upstream(vec![vec![
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nx-cost: 7\r\n\r\n",
        ]])
        .await;
        let c = H1Client::new(8, Duration::from_secs(60), Duration::from_secs(5));
        let r = c.send(&get(port, Method::GET)).await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers().get(header::CONTENT_LENGTH).is_none());
        let (data, trailers) = collect(r).await;
        assert_eq!(data, "hello world");
        assert_eq!(trailers.unwrap()["x-cost"], "7");
    }

    #[tokio::test]
    async fn a_response_without_length_ends_when_the_upstream_closes() {
        let (port, _seen) = upstream(vec![vec![b"HTTP/1.1 200 OK\r\n\r\nuntil close"]]).await;
        let c = H1Client::new(8, Duration::from_secs(60), Duration::from_secs(5));
        let r = c.send(&get(port, Method::GET)).await.unwrap();
        assert_eq!(collect(r).await.0, "until close");
        assert!(
            matches!(c.take(&format!("127.0.0.1:{port}")), Checkout::Wait(..)),
            "not reused"
        );
    }

    #[tokio::test]
    async fn head_and_no_content_responses_have_no_body() {
        let (port, seen) = upstream(vec![vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        ]])
        .await;
        let c = H1Client::new(8, Duration::from_secs(60), Duration::from_secs(5));
        let r = c.send(&get(port, Method::HEAD)).await.unwrap();
        assert_eq!(r.headers()[header::CONTENT_LENGTH], "10");
        assert_eq!(collect(r).await.0, "");
        let r = c.send(&get(port, Method::DELETE)).await.unwrap();
        assert_eq!(r.status(), 204);
        assert_eq!(collect(r).await.0, "");
        let r = c.send(&get(port, Method::GET)).await.unwrap();
        assert_eq!(collect(r).await.0, "ok");
        assert_eq!(seen.await.unwrap().len(), 3, "all on one connection");
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_is_replaced() {
        // The first connection answers once and closes; the second request goes on a new one.
        let (port, seen) = upstream(vec![
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\na"],
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nb"],
        ])
        .await;
        let c = H1Client::new(8, Duration::from_secs(60), Duration::from_secs(5));
        let r = c.send(&get(port, Method::GET)).await.unwrap();
        assert_eq!(collect(r).await.0, "a");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let r = c.send(&get(port, Method::GET)).await.unwrap();
        assert_eq!(collect(r).await.0, "b");
        assert_eq!(seen.await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn idle_connections_the_upstream_closed_or_past_their_age_are_closed_unasked() {
        // Two connections: one the upstream closes after its answer, one it keeps open.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (kept_tx, kept) = oneshot::channel::<TcpStream>();
        tokio::spawn(async move {
            let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\na";
            let mut held = Some(kept_tx);
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                let mut req = [0u8; 1024];
                let _ = s.read(&mut req).await.unwrap();
                s.write_all(reply).await.unwrap();
                match held.take() {
                    Some(tx) => drop(tx.send(s)),
                    None => drop(s),
                }
            }
        });
        let c = H1Client::new(8, Duration::from_secs(60), Duration::from_secs(5));
        let (ha, hb) = (get(port, Method::GET), get(port, Method::GET));
        let (a, b) = tokio::join!(c.send(&ha), c.send(&hb));
        let (a, b) = (a.unwrap(), b.unwrap());
        collect(a).await;
        collect(b).await;
        assert_eq!(c.idle(), 2);
        let mut kept = kept.await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.prune();
        assert_eq!(c.idle(), 1, "the one the upstream closed is gone");
        // Past its age, the other is closed too: the upstream reads end of file.
        tokio::time::pause();
        tokio::time::advance(Duration::from_secs(61)).await;
        tokio::time::resume();
        c.prune();
        assert_eq!(c.idle(), 0);
        let mut rest = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), kept.read(&mut rest))
            .await
            .expect("closed at once")
            .unwrap();
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn a_connection_in_use_while_its_upstream_is_pruned_comes_back_to_the_pool() {
        let (port, seen) = upstream(vec![vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\na",
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nb",
        ]])
        .await;
        let c = H1Client::new(8, Duration::from_secs(60), Duration::from_secs(5));
        let r = c.send(&get(port, Method::GET)).await.unwrap();
        // Nothing idle and nobody waiting: the upstream's idle set goes.
        c.prune();
        assert_eq!(collect(r).await.0, "a");
        assert_eq!(c.idle(), 1, "given back all the same");
        let r = c.send(&get(port, Method::GET)).await.unwrap();
        assert_eq!(collect(r).await.0, "b");
        assert_eq!(seen.await.unwrap().len(), 2, "both on one connection");
    }

    #[tokio::test]
    async fn a_connection_closed_by_its_response_is_not_reused() {
        let (port, seen) = upstream(vec![
            vec![b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\na"],
            vec![b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\nb"],
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nc"],
        ])
        .await;
        let c = H1Client::new(8, Duration::from_secs(60), Duration::from_secs(5));
        for want in ["a", "b", "c"] {
            let r = c.send(&get(port, Method::GET)).await.unwrap();
            assert_eq!(collect(r).await.0, want);
        }
        assert_eq!(seen.await.unwrap().len(), 3);
    }

    #[tokio::test]
    async fn a_connection_given_back_goes_to_a_request_waiting_for_one() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let authority = format!("127.0.0.1:{port}");
        let c = H1Client::new(8, Duration::from_secs(60), Duration::from_secs(5));
        let Checkout::Wait(first, _) = c.take(&authority) else {
            panic!("nothing is idle yet");
        };
        let Checkout::Wait(second, _) = c.take(&authority) else {
            panic!("nothing is idle yet");
        };
        // The first waiter went on with a connection of its own.
        drop(first);
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let local = stream.local_addr().unwrap();
        c.put(
            &authority,
            Conn {
                stream,
                buf: BytesMut::new(),
            },
        );
        let given = second.await.expect("the second waiter gets it");
        assert_eq!(given.stream.local_addr().unwrap(), local);
        assert!(
            matches!(c.take(&authority), Checkout::Wait(..)),
            "not also kept idle"
        );
    }

    #[tokio::test]
    async fn bad_responses_are_errors() {
        let cases: [&'static [u8]; 6] = [
            b"HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
            b"NOT HTTP\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort",
        ];
        for (i, reply) in cases.into_iter().enumerate() {
            let (port, _seen) = upstream(vec![vec![reply]]).await;
            let c = H1Client::new(8, Duration::from_secs(60), Duration::from_secs(5));
            let failed = match c.send(&get(port, Method::GET)).await {
                Err(_) => true,
                Ok(r) => r.into_body().collect().await.is_err(),
            };
            assert!(failed, "case {i}");
        }
    }

    #[tokio::test]
    async fn a_head_too_large_is_refused_and_a_refused_connection_named() {
        let big: &'static [u8] = Box::leak(
            format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(MAX_HEAD))
                .into_bytes()
                .into_boxed_slice(),
        );
        let (port, _seen) = upstream(vec![vec![big]]).await;
        let c = H1Client::new(8, Duration::from_secs(60), Duration::from_secs(5));
        let e = c.send(&get(port, Method::GET)).await.err().unwrap();
        assert!(matches!(e, H1Error::HeadTooLarge), "{e}");
        let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let e = c.send(&get(port, Method::GET)).await.err().unwrap();
        assert!(e.to_string().contains("Connection refused"), "{e}");
    }
}
