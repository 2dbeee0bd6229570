//! Answering a socket read's worth of gRPC requests with one socket write.
//!
//! Out of the box, hyper's HTTP/2 server spends most of a memory-store decision in the
//! kernel: it hands each request stream to the executor (tokio's spawner: another task,
//! often another thread, a wake-up back), and h2 flushes after every stream it accepts, so
//! each response leaves in its own `writev`. Measured with h2load, one connection × 64
//! streams: ≈ 12 requests per read but one `writev` per response. Two parts fix that:
//!
//! - [`FirstPollInline`]: a hyper executor that polls each new stream once on the
//!   connection's own task. A memory-store decision needs no I/O, so the whole stream
//!   (decode, decide, send headers, message and trailers) finishes there. A stream that is
//!   not done after the first poll (the Redis store, a full flow-control window) is spawned
//!   as usual.
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

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Buffered bytes above which a write goes to the socket at once (and a writer waits for
/// the socket rather than grow the buffer): memory per connection stays bounded.
pub const HIGH_WATER: usize = 64 * 1024;

/// A hyper executor that polls each future once inline before spawning it (see the module
/// documentation).
#[derive(Clone, Copy, Debug, Default)]
pub struct FirstPollInline;

impl<F> hyper::rt::Executor<F> for FirstPollInline
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        let mut fut: Pin<Box<F>> = Box::pin(fut);
        let mut cx = Context::from_waker(Waker::noop());
        if fut.as_mut().poll(&mut cx).is_pending() {
            // Whatever saw the no-op waker sees the real one at the spawned task's first
            // poll: a future registers its waker again on every poll.
            tokio::spawn(fut);
        }
    }
}

struct Shared {
    stream: TcpStream,
    out: Vec<u8>,
    /// Bytes of `out` already written.
    sent: usize,
    /// A write error seen while draining, reported to the connection's next write.
    failed: Option<io::ErrorKind>,
}

impl Shared {
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
pub struct CoalescedIo(Arc<Mutex<Shared>>);

impl AsyncRead for CoalescedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0.lock().stream).poll_read(cx, buf)
    }
}

impl CoalescedIo {
    fn poll_room(&self, s: &mut Shared, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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

impl AsyncWrite for CoalescedIo {
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

/// Drives a connection future built on a [`CoalescedIo`], sending its buffered bytes after
/// each poll.
struct Drain<C> {
    conn: Pin<Box<C>>,
    shared: Arc<Mutex<Shared>>,
    done: Option<Result<(), hyper::Error>>,
}

impl<C: Future<Output = Result<(), hyper::Error>>> Future for Drain<C> {
    type Output = Result<(), hyper::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.done.is_none() {
            if let Poll::Ready(r) = self.conn.as_mut().poll(cx) {
                self.done = Some(r);
            }
        }
        let drained = self.shared.lock().poll_drain(cx);
        match drained {
            Poll::Ready(Err(e)) => {
                let mut s = self.shared.lock();
                s.failed = Some(e.kind());
                s.out.clear();
                s.sent = 0;
                drop(s);
                if self.done.is_none() {
                    // Let the connection see the error at its next write and end.
                    cx.waker().wake_by_ref();
                }
            }
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(())) => {}
        }
        match self.done.take() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

/// Serves one HTTP/2 connection on `stream` with `builder` and `service`, coalescing writes
/// (see the module documentation).
pub async fn serve<S, B>(
    builder: &hyper::server::conn::http2::Builder<FirstPollInline>,
    stream: TcpStream,
    service: S,
) -> Result<(), hyper::Error>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let shared = Arc::new(Mutex::new(Shared {
        stream,
        out: Vec::with_capacity(8 * 1024),
        sent: 0,
        failed: None,
    }));
    let io = hyper_util::rt::TokioIo::new(CoalescedIo(shared.clone()));
    let conn = builder.serve_connection(io, service);
    Drain {
        conn: Box::pin(conn),
        shared,
        done: None,
    }
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use hyper::rt::Executor;

    #[tokio::test]
    async fn ready_futures_run_inline_and_pending_ones_are_spawned() {
        let polls = Arc::new(AtomicUsize::new(0));
        let p = polls.clone();
        FirstPollInline.execute(async move {
            p.fetch_add(1, Ordering::SeqCst);
        });
        // Ran to completion inside execute: no yield needed.
        assert_eq!(polls.load(Ordering::SeqCst), 1);

        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<u32>();
        FirstPollInline.execute(async move {
            let v = rx.await.unwrap_or(0);
            let _ = done_tx.send(v + 1);
        });
        // Pending at the first poll (no-op waker): the spawned task must still be woken.
        tx.send(41).unwrap();
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), done_rx)
            .await
            .expect("spawned future woken")
            .unwrap();
        assert_eq!(got, 42);
    }
}
