//! One client connection on the lean path: request heads read into a buffer and parsed in
//! place, decided by the rules, written to the upstream as bytes over the worker's idle
//! connections, and the response head and body written back with only what framing needs
//! parsed; the connection handed to hyper at the first request the lean path leaves to it.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;

use bytes::{Buf, BytesMut};
use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, Response, Version};
use http_body::Body;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use weir_core::AnyClock;
use weir_rules::engine::{Block, Guard};
use weir_tower::key::PeerAddr;
use weir_tower::rules::{blocked_response, Call, Decider, RulesLayer, Verdict};

use super::request::{self, Parse};
use super::wire::{self, Framing};
use crate::net::accept::Shutdown;
use crate::net::conn::{Connection, Timeouts};
use crate::net::dormant::Dormant;
use crate::net::rewind::Rewind;
use crate::proxy::forward::{busy_text, timed_out, unreachable, Forward, ForwardTo};
use crate::proxy::h1_client::H1Body;

/// What a worker's lean connections share: the upstream side and the rules.
pub struct Lean {
    /// The worker's forwarder (its own upstream pools; the bounds shared by all workers).
    pub forward: Forward,
    /// The rules, deciding through a [`Decider`] per connection.
    pub layer: RulesLayer<AnyClock>,
    /// First-request (each head) and idle timeouts.
    pub timeouts: Timeouts,
}

/// Bytes of a response held before they are written (a larger body is written as it comes).
const WRITE_AT: usize = 64 * 1024;

/// Serves the connection `stream` from `peer` on the lean path until it ends, `shutdown` says
/// stop or `connection` is to close; `hyper` serves it from the first request the lean path
/// leaves to hyper (with the bytes read so far put back in front).
pub async fn serve<H, F>(
    stream: TcpStream,
    peer: SocketAddr,
    lean: Arc<Lean>,
    shutdown: Shutdown,
    connection: Arc<Connection>,
    hyper: H,
) where
    H: FnOnce(Rewind<TcpStream>) -> F,
    F: Future<Output = ()>,
{
    let Some(decider) = lean.layer.decider() else {
        return hyper(Rewind::new(bytes::Bytes::new(), stream)).await;
    };
    let mut c = Client::new(stream, peer, &lean, decider, shutdown, connection);
    if let Some(rest) = c.run().await {
        lean.forward
            .to
            .stats
            .lean_handoffs
            .fetch_add(1, Ordering::Relaxed);
        // Only the socket goes on: the lean path's buffers and timer are given back first.
        let Client { stream, .. } = c;
        hyper(Rewind::new(rest, stream)).await;
    }
}

/// A lean connection's state between requests.
struct Client<'l> {
    stream: TcpStream,
    lean: &'l Lean,
    decider: Decider<AnyClock>,
    /// The peer's address.
    peer: std::net::IpAddr,
    /// [`PeerAddr`], for the rules' client address.
    extensions: Extensions,
    /// The peer's address as text (the rules' `client_ip` parameter, `X-Forwarded-For`).
    peer_text: String,
    /// The upstream's `host:port`.
    authority: String,
    /// This proxy's hop in `Via`.
    hop: HeaderValue,
    /// Fires at the latest at the request in flight's `--upstream-timeout` (see `exchange`;
    /// made at the first request).
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Read from the client, not yet used.
    buf: BytesMut,
    /// The upstream request being sent.
    wire: Vec<u8>,
    /// Response bytes not yet written.
    out: Vec<u8>,
    shutdown: Shutdown,
    connection: Arc<Connection>,
}

/// A request head read, decided and encoded (the buffer's borrow over).
struct Prepared {
    len: usize,
    head_only: bool,
    close: bool,
    /// The client takes trailer fields (`TE: trailers`).
    trailers: bool,
    idempotent: bool,
    client_ip: std::net::IpAddr,
    verdict: Verdict<AnyClock>,
}

/// What the start of the buffer is.
enum Step {
    Partial,
    Hyper,
    Lean(Prepared),
}

/// How relaying a response ended early.
enum Broken {
    /// The upstream's body failed: the client's response is cut short.
    Upstream,
    /// The client's socket failed.
    Client,
}

impl<'l> Client<'l> {
    fn new(
        stream: TcpStream,
        peer: SocketAddr,
        lean: &'l Lean,
        decider: Decider<AnyClock>,
        shutdown: Shutdown,
        connection: Arc<Connection>,
    ) -> Self {
        let mut extensions = Extensions::new();
        extensions.insert(PeerAddr(peer));
        Self {
            stream,
            authority: lean
                .forward
                .to
                .upstream
                .authority()
                .map_or_else(String::new, |a| a.as_str().to_owned()),
            hop: lean.forward.to.hops.of(Version::HTTP_11),
            deadline: None,
            lean,
            decider,
            peer: peer.ip(),
            peer_text: weir_tower::key::ip_string(peer.ip()),
            extensions,
            buf: BytesMut::with_capacity(8 * 1024),
            // Made at the first request the lean path serves (an h2c connection needs neither).
            wire: Vec::new(),
            out: Vec::new(),
            shutdown,
            connection,
        }
    }

    /// Serves requests until the connection ends (`None`) or hyper is to take it over: then
    /// the bytes read and not used.
    async fn run(&mut self) -> Option<bytes::Bytes> {
        let mut stop = self.shutdown.clone();
        let stopping = Dormant::new(async move { stop.stopping().await });
        let connection = self.connection.clone();
        let closed = Dormant::new(connection.closed(self.lean.timeouts));
        tokio::pin!(stopping, closed);
        loop {
            let mut started: Option<Instant> = None;
            let prepared = loop {
                if !self.buf.is_empty() {
                    match self.prepare() {
                        Step::Partial => {}
                        Step::Hyper => return Some(self.buf.split().freeze()),
                        Step::Lean(p) => break p,
                    }
                }
                if self.buf.capacity() - self.buf.len() < 4096 {
                    self.buf.reserve(8 * 1024);
                }
                // Between requests the connection may idle (until `closed`); once a head has
                // begun it must be whole within the first-request timeout.
                let first = self.lean.timeouts.first_request;
                let deadline = if self.buf.is_empty() {
                    None
                } else {
                    Some(*started.get_or_insert_with(Instant::now) + first)
                };
                let idle = self.buf.is_empty();
                let head_timer = deadline.map(tokio::time::sleep_until);
                tokio::pin!(head_timer);
                let read = self.stream.read_buf(&mut self.buf);
                tokio::pin!(read);
                // The read first; the signals (each polled only once woken) and the head's
                // timer end the connection.
                let read = std::future::poll_fn(|cx| {
                    if let Poll::Ready(r) = read.as_mut().poll(cx) {
                        return Poll::Ready(Some(r));
                    }
                    let ended = (idle && stopping.as_mut().poll(cx).is_ready())
                        || closed.as_mut().poll(cx).is_ready()
                        || head_timer
                            .as_mut()
                            .as_pin_mut()
                            .is_some_and(|t| t.poll(cx).is_ready());
                    if ended {
                        Poll::Ready(None)
                    } else {
                        Poll::Pending
                    }
                })
                .await;
                match read {
                    Some(Ok(n)) if n > 0 => {}
                    _ => return None,
                }
            };
            self.buf.advance(prepared.len);
            if !self.exchange(prepared).await {
                return None;
            }
        }
    }

    /// Reads the head at the start of the buffer: decided and encoded into `wire`, or left to
    /// hyper (nothing counted), or incomplete.
    fn prepare(&mut self) -> Step {
        let mut slots = request::slots();
        let to = &*self.lean.forward.to;
        let head = match request::parse(&self.buf, &mut slots, to.via.as_bytes()) {
            Parse::Partial => return Step::Partial,
            Parse::Hyper(_) => return Step::Hyper,
            Parse::Head(h) => h,
        };
        let Ok(method) = Method::from_bytes(head.method.as_bytes()) else {
            return Step::Hyper;
        };
        let routes = self.decider.routes();
        // Only the headers the rules read become a header map.
        let mut read = HeaderMap::new();
        if !routes.reads_none() {
            for h in head.headers {
                if routes.reads(h.name.as_bytes()) {
                    if let (Ok(n), Ok(v)) = (
                        HeaderName::from_bytes(h.name.as_bytes()),
                        HeaderValue::from_bytes(h.value),
                    ) {
                        read.append(n, v);
                    }
                }
            }
        }
        let verdict = routes.decide(Call {
            method: &method,
            path: head.path,
            headers: &read,
            extensions: &self.extensions,
            peer_text: Some(&self.peer_text),
        });
        if let Verdict::Service = verdict {
            return Step::Hyper;
        }
        self.wire.clear();
        wire::upstream_request(
            &mut self.wire,
            &head,
            self.peer_text.as_bytes(),
            self.hop.as_bytes(),
        );
        Step::Lean(Prepared {
            len: head.len,
            head_only: method == Method::HEAD,
            close: head.close,
            trailers: head.trailers,
            idempotent: matches!(
                method,
                Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::DELETE
            ),
            // The peer, unless trusted proxies are configured (then the routes read
            // X-Forwarded-For, and it is in `read`).
            client_ip: if read.is_empty() {
                self.peer
            } else {
                self.lean.layer.client_ip(self.peer, &read)
            },
            verdict,
        })
    }

    /// Answers one request; whether the connection carries on.
    async fn exchange(&mut self, p: Prepared) -> bool {
        self.lean.forward.to.stats.lean_requests.add(1);
        let head_only = p.head_only;
        let _in_flight = self.connection.begin();
        let close = p.close || self.shutdown.is_stopping() || self.connection.is_closing();
        let guard = match p.verdict {
            // Most calls have neither shared rules to ask nor a pacing wait.
            Verdict::Admitted(g) if !g.has_shared() && g.wait().is_zero() => Some(g),
            Verdict::Admitted(g) => match admitted(g).await {
                Ok(g) => Some(g),
                Err(block) => {
                    return self
                        .own(&blocked_response(&block), head_only, None, close)
                        .await
                }
            },
            Verdict::Refused(block) => {
                return self
                    .own(&blocked_response(&block), head_only, None, close)
                    .await
            }
            Verdict::Unrouted | Verdict::Service => None,
        };
        let to: &ForwardTo = &self.lean.forward.to;
        let permits = match (
            to.total.try_acquire(1),
            to.per_address.try_acquire(p.client_ip),
        ) {
            (Ok(total), Some(address)) => (total, address),
            _ => return self.own(&busy_text(to), head_only, guard, close).await,
        };
        // One timer per connection, re-armed only when it fires (at most once per
        // --upstream-timeout): a request's deadline costs a clock read, not a timer.
        let started = Instant::now();
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(started + to.timeout)));
        let sent = {
            let send = to.bodiless.send_wire(
                &to.upstream,
                &self.authority,
                &self.wire,
                p.idempotent,
                p.head_only,
            );
            tokio::pin!(send);
            let due = started + to.timeout;
            std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = send.as_mut().poll(cx) {
                    return Poll::Ready(Some(r));
                }
                // The timer fires at the deadline it was armed with: this request's own may be
                // later.
                while deadline.as_mut().poll(cx).is_ready() {
                    if Instant::now() >= due {
                        return Poll::Ready(None);
                    }
                    deadline.as_mut().reset(due);
                }
                Poll::Pending
            })
            .await
        };
        let (raw, mut body) = match sent {
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                let r = weir_tower::problem::problem(
                    http::StatusCode::BAD_GATEWAY,
                    &unreachable(to, &e, false),
                );
                return self.own(&r, head_only, guard, close).await;
            }
            None => {
                let r =
                    weir_tower::problem::problem(http::StatusCode::GATEWAY_TIMEOUT, &timed_out(to));
                return self.own(&r, head_only, guard, close).await;
            }
        };
        to.stats.forwarded.add(1);
        let framing = Framing::of(&raw, p.head_only);
        let over = guard.as_ref().and_then(|g| g.over_budget());
        let extra: &[(&[u8], &[u8])] = match over {
            Some(rule) => &[(
                weir_tower::rules::BUDGET_EXCEEDED.as_bytes(),
                rule.as_bytes(),
            )],
            None => &[],
        };
        self.out.clear();
        wire::response_head(&mut self.out, &raw, framing, extra, close);
        // Trailer fields go on when the client takes them and the response declared them.
        let declared = if p.trailers && framing == Framing::Chunked {
            wire::declared_trailers(&raw)
        } else {
            Vec::new()
        };
        let relayed = if framing != Framing::Chunked && body.append_whole(&mut self.out) {
            flush(&mut self.stream, &mut self.out).await
        } else {
            relay(&mut self.stream, &mut self.out, body, framing, &declared).await
        };
        drop(permits);
        match relayed {
            Ok(()) => {
                end(guard, raw.status.is_server_error());
                !close
            }
            Err(Broken::Upstream) => {
                end(guard, true);
                false
            }
            // Released without an outcome, as when a client leaves a response early.
            Err(Broken::Client) => false,
        }
    }

    /// Writes a response the proxy made (a refusal, a 502 / 503 / 504), ending `guard` with
    /// its status; whether the connection carries on.
    async fn own(
        &mut self,
        r: &Response<String>,
        head_only: bool,
        guard: Option<Guard<AnyClock>>,
        close: bool,
    ) -> bool {
        self.out.clear();
        wire::own_response(&mut self.out, r, head_only, close);
        let written = self.stream.write_all(&self.out).await.is_ok();
        if written {
            end(guard, r.status().is_server_error());
        }
        written && !close
    }
}

/// An admitted call's guard once its shared rules decided and its pacing wait passed, or the
/// block of the shared rules.
async fn admitted(mut g: Guard<AnyClock>) -> Result<Guard<AnyClock>, Block> {
    if g.has_shared() {
        g.decide_shared().await?;
    }
    if !g.wait().is_zero() {
        tokio::time::sleep(g.wait()).await;
    }
    Ok(g)
}

/// Completes `guard` (an error when `failed`).
fn end(guard: Option<Guard<AnyClock>>, failed: bool) {
    if let Some(g) = guard {
        weir_tower::body::Held::end(g, failed);
    }
}

/// Writes the response head in `out` and the body as `framing` says (the trailer fields of
/// `declared`), holding bytes while more are ready at once (a small response goes in one
/// write).
async fn relay(
    stream: &mut TcpStream,
    out: &mut Vec<u8>,
    mut body: H1Body,
    framing: Framing,
    declared: &[String],
) -> Result<(), Broken> {
    let mut ended = framing == Framing::None;
    while !ended {
        // A frame ready now joins the bytes held; otherwise they are written before waiting.
        let polled =
            std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await;
        let frame = match polled {
            Poll::Ready(f) => f,
            Poll::Pending => {
                flush(stream, out).await?;
                std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
            }
        };
        match frame {
            None => {
                if framing == Framing::Chunked {
                    wire::last_chunk(out, None, declared);
                }
                ended = true;
            }
            Some(Ok(f)) => match f.into_data() {
                Ok(data) if framing == Framing::Chunked => wire::chunk(out, &data),
                Ok(data) => out.extend_from_slice(&data),
                Err(f) => {
                    if framing == Framing::Chunked {
                        wire::last_chunk(out, f.into_trailers().ok().as_ref(), declared);
                    }
                    ended = true;
                }
            },
            Some(Err(e)) => {
                tracing::debug!(error = %e, "upstream response body failed");
                // What came is the client's; the response ends there.
                let _ = flush(stream, out).await;
                return Err(Broken::Upstream);
            }
        }
        if out.len() >= WRITE_AT {
            flush(stream, out).await?;
        }
    }
    flush(stream, out).await
}

async fn flush(stream: &mut TcpStream, out: &mut Vec<u8>) -> Result<(), Broken> {
    if out.is_empty() {
        return Ok(());
    }
    stream.write_all(out).await.map_err(|_| Broken::Client)?;
    out.clear();
    Ok(())
}
