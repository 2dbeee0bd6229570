//! Answering a socket read's worth of gRPC requests with one socket write.
//!
//! Out of the box, hyper's HTTP/2 server spends most of a memory-store decision in the
//! kernel: it hands each request stream to the executor (tokio's spawner: another task,
//! often another thread, a wake-up back), and h2 flushes after every stream it accepts, so
//! each response leaves in its own `writev`. Measured with h2load, one connection × 64
//! streams: ≈ 12 requests per read but one `writev` per response. Two parts fix that:
//!
//! - [`ConnectionExecutor`]: a hyper executor that runs every stream on the connection's own
//!   task. A new stream is polled once at once: a memory-store decision needs no I/O, so the
//!   whole stream (decode, decide, send headers, message and trailers) finishes there. A
//!   stream still pending (the Redis store, a full flow-control window) joins the
//!   connection's set of streams, polled by [`serve`]'s task whenever one wakes; so the
//!   answers to one batch of Redis replies also leave in one write (spawned as separate
//!   tasks, each answer woke the connection on its own and left in its own write: 0.83
//!   `sendto` per decision to Envoy and Redis together, with `perf stat`).
//! - [`CoalescedIo`] + [`serve`]: the connection writes into a buffer; `poll_flush` only
//!   marks it, and the buffer goes to the socket when the connection task has done all it
//!   can for now (after each poll of the connection future), or earlier when it passes
//!   [`HIGH_WATER`]. Nothing is held back past the end of a poll, so latency does not grow.
//!
//! Results in docs/serve.md.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use futures_util::stream::{FuturesUnordered, Stream};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Buffered bytes above which a write goes to the socket at once (and a writer waits for
/// the socket rather than grow the buffer): memory per connection stays bounded.
pub const HIGH_WATER: usize = 64 * 1024;

/// A stream future adopted by its connection's task.
type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A hyper executor for one connection: polls each future once at once, and hands those still
/// pending to the connection's task (see the module documentation). Made per connection.
#[derive(Clone, Default)]
pub struct ConnectionExecutor {
    /// Pending futures not yet adopted by the connection's stream set.
    adopted: Arc<Mutex<Vec<StreamFuture>>>,
}

impl<F> hyper::rt::Executor<F> for ConnectionExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        let mut fut: Pin<Box<F>> = Box::pin(fut);
        let mut cx = Context::from_waker(Waker::noop());
        if fut.as_mut().poll(&mut cx).is_pending() {
            // Whatever saw the no-op waker sees the real one at the next poll, in the
            // connection's stream set: a future registers its waker again on every poll.
            self.adopted.lock().push(Box::pin(async move {
                let _ = fut.await;
            }));
        }
    }
}

/// The transport (a `TcpStream`, or TLS over one) and the bytes buffered for it.
struct Shared<T> {
    stream: T,
    out: Vec<u8>,
    /// Bytes of `out` already written.
    sent: usize,
    /// A write error seen while draining, reported to the connection's next write.
    failed: Option<io::ErrorKind>,
}

impl<T: AsyncWrite + Unpin> Shared<T> {
    /// Writes buffered bytes until done (Ready) or the socket is full (Pending, waker set).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            match Pin::new(&mut self.stream).poll_write(cx, &self.out[self.sent..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.sent += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.out.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    fn check(&self) -> io::Result<()> {
        match self.failed {
            Some(kind) => Err(kind.into()),
            None => Ok(()),
        }
    }
}

/// The connection's end of a TCP stream whose writes are coalesced (see [`serve`]).
pub struct CoalescedIo<T>(Arc<Mutex<Shared<T>>>);

impl<T: AsyncRead + Unpin> AsyncRead for CoalescedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0.lock().stream).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> CoalescedIo<T> {
    fn poll_room(&self, s: &mut Shared<T>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        s.check()?;
        if s.out.len() >= HIGH_WATER {
            if let Poll::Ready(Err(e)) = s.poll_drain(cx) {
                return Poll::Ready(Err(e));
            }
            if s.out.len() >= HIGH_WATER {
                return Poll::Pending;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CoalescedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut s = self.0.lock();
        std::task::ready!(self.poll_room(&mut s, cx))?;
        s.out.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut s = self.0.lock();
        std::task::ready!(self.poll_room(&mut s, cx))?;
        let mut n = 0;
        for b in bufs {
            s.out.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Sent when the connection task is done for now (see `Drain`).
        Poll::Ready(self.0.lock().check())
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut s = self.0.lock();
        std::task::ready!(s.poll_drain(cx))?;
        Pin::new(&mut s.stream).poll_shutdown(cx)
    }
}

/// Drives a connection future built on a [`CoalescedIo`] and its pending streams, sending the
/// buffered bytes after each poll.
struct Drain<C, T> {
    conn: Pin<Box<C>>,
    shared: Arc<Mutex<Shared<T>>>,
    executor: ConnectionExecutor,
    streams: FuturesUnordered<StreamFuture>,
    done: Option<Result<(), hyper::Error>>,
}

/// Rounds of "connection, then streams" in one poll before yielding to other tasks.
const ROUNDS: usize = 4;

impl<C: Future<Output = Result<(), hyper::Error>>, T: AsyncWrite + Unpin> Future for Drain<C, T> {
    type Output = Result<(), hyper::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        for round in 0.. {
            if this.done.is_none() {
                if let Poll::Ready(r) = this.conn.as_mut().poll(cx) {
                    // Streams left pending end with their connection.
                    this.done = Some(r);
                }
            }
            this.streams
                .extend(std::mem::take(&mut *this.executor.adopted.lock()));
            // Streams that finished queued their frames in the connection: poll it again so
            // they leave in this poll's write.
            let mut finished = false;
            while let Poll::Ready(Some(())) = Pin::new(&mut this.streams).poll_next(cx) {
                finished = true;
            }
            if !finished || this.done.is_some() {
                break;
            }
            if round + 1 == ROUNDS {
                cx.waker().wake_by_ref();
                break;
            }
        }
        let drained = this.shared.lock().poll_drain(cx);
        match drained {
            Poll::Ready(Err(e)) => {
                let mut s = this.shared.lock();
                s.failed = Some(e.kind());
                s.out.clear();
                s.sent = 0;
                drop(s);
                if this.done.is_none() {
                    // Let the connection see the error at its next write and end.
                    cx.waker().wake_by_ref();
                }
            }
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(())) => {}
        }
        match this.done.take() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

/// Serves one HTTP/2 connection on `stream` with a builder from `builder` (given this
/// connection's executor) and `service`, running its streams on this task and coalescing
/// writes (see the module documentation). Once `shutdown` says stop, the connection sends
/// GOAWAY, finishes the streams it has and closes.
pub async fn serve<S, B, T>(
    builder: impl FnOnce(ConnectionExecutor) -> hyper::server::conn::http2::Builder<ConnectionExecutor>,
    stream: T,
    service: S,
    mut shutdown: crate::net::accept::Shutdown,
    connection: Arc<crate::net::conn::Connection>,
    timeouts: crate::net::conn::Timeouts,
) -> Result<(), hyper::Error>
where
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<crate::net::conn::BoxError>,
    B: crate::net::conn::ResponseBody,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let shared = Arc::new(Mutex::new(Shared {
        stream,
        out: Vec::with_capacity(8 * 1024),
        sent: 0,
        failed: None,
    }));
    let executor = ConnectionExecutor::default();
    let io = hyper_util::rt::TokioIo::new(CoalescedIo(shared.clone()));
    let service = crate::net::conn::Tracked::new(service, connection.clone());
    let conn = builder(executor.clone()).serve_connection(io, service);
    let mut drain = Drain {
        conn: Box::pin(conn),
        shared,
        executor,
        streams: FuturesUnordered::new(),
        done: None,
    };
    // Polled only when they fire, not on each of the connection's reads and writes.
    let stopping = crate::net::dormant::Dormant::new(shutdown.stopping());
    let closed = crate::net::dormant::Dormant::new(connection.closed(timeouts));
    tokio::select! {
        biased;
        r = &mut drain => return r,
        () = stopping => {}
        () = closed => {
            // Idle, never used, or making room at the cap: one that never carried a request
            // is dropped; one that did gets GOAWAY and the first-request timeout to finish.
            if !connection.served() {
                return Ok(());
            }
            drain.conn.as_mut().graceful_shutdown();
            return tokio::time::timeout(timeouts.first_request, drain)
                .await
                .unwrap_or(Ok(()));
        }
    }
    drain.conn.as_mut().graceful_shutdown();
    drain.await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use hyper::rt::Executor;

    #[tokio::test]
    async fn ready_futures_run_inline_and_pending_ones_join_the_connection() {
        let executor = ConnectionExecutor::default();
        let polls = Arc::new(AtomicUsize::new(0));
        let p = polls.clone();
        executor.execute(async move {
            p.fetch_add(1, Ordering::SeqCst);
        });
        // Ran to completion inside execute: no yield needed, nothing adopted.
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        assert!(executor.adopted.lock().is_empty());

        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<u32>();
        executor.execute(async move {
            let v = rx.await.unwrap_or(0);
            let _ = done_tx.send(v + 1);
        });
        // Pending at the first poll (no-op waker): adopted, and woken once polled for real.
        let adopted: Vec<StreamFuture> = std::mem::take(&mut *executor.adopted.lock());
        assert_eq!(adopted.len(), 1);
        let mut set: FuturesUnordered<StreamFuture> = adopted.into_iter().collect();
        let drive = tokio::spawn(async move {
            std::future::poll_fn(|cx| Pin::new(&mut set).poll_next(cx)).await;
        });
        tx.send(41).unwrap();
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), done_rx)
            .await
            .expect("adopted future woken")
            .unwrap();
        assert_eq!(got, 42);
        drive.await.unwrap();
    }

    /// A whole connection whose every answer waits on something outside (as a Redis decision
    /// does): all answers are served, over one connection, by the connection's own task.
    #[tokio::test]
    async fn pending_streams_are_answered_on_the_connection_task() {
        use http_body_util::{BodyExt, Empty, Full};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let svc =
                hyper::service::service_fn(|_req: http::Request<hyper::body::Incoming>| async {
                    // Pending at the first poll: a timer stands in for the Redis round trip.
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        bytes::Bytes::from_static(b"answer"),
                    )))
                });
            let (_keep, shutdown) = crate::net::accept::shutdown();
            let _ = serve(
                |e| {
                    let mut b = hyper::server::conn::http2::Builder::new(e);
                    b.timer(hyper_util::rt::TokioTimer::new());
                    b
                },
                s,
                svc,
                shutdown,
                crate::net::conn::Connection::new(),
                crate::net::conn::Timeouts::default(),
            )
            .await;
        });
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let calls = (0..50).map(|_| {
            let mut sender = sender.clone();
            async move {
                let req = http::Request::post("http://x/")
                    .body(Empty::<bytes::Bytes>::new())
                    .unwrap();
                let res = sender.send_request(req).await.unwrap();
                res.into_body().collect().await.unwrap().to_bytes()
            }
        });
        let bodies = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            futures_util::future::join_all(calls),
        )
        .await
        .expect("every call answered");
        assert_eq!(bodies.len(), 50);
        assert!(bodies.iter().all(|b| &b[..] == b"answer"));
    }
}
