//! What the accept loop knows of each open connection: whether a request is in flight, when
//! it last was, and a way to ask it to close. With it, connections that hold a slot without
//! using it go away:
//!
//! - a connection that sends no request within the first-request timeout (nothing at all, or
//!   only an HTTP/2 preface) is closed;
//! - a connection with no request in flight for the idle timeout is closed (gracefully: HTTP/2
//!   GOAWAY, HTTP/1.1 after the current response);
//! - when a listener is at its connection cap, the connection idle the longest is closed to
//!   make room for the new one, so idle connections can never lock real clients out.
//!
//! A request is in flight from the moment the service is called until its response body ends
//! or is dropped ([`Tracked`], [`TrackedBody`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Any error a connection's service or body may end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What hyper needs of a response body to send it from a connection's task (one bound for
/// every server's connections).
pub trait ResponseBody: Body<Data: Send, Error: Into<BoxError>> + Send + 'static {}

impl<B: Body<Data: Send, Error: Into<BoxError>> + Send + 'static> ResponseBody for B {}

/// Time limits of a listener's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Longest wait for a connection's first request (and, over HTTP/1.1, for each request head).
    pub first_request: Duration,
    /// Longest time a connection may stay open with no request in flight.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            first_request: Duration::from_secs(10),
            idle: Duration::from_secs(60),
        }
    }
}

/// One open connection, shared by the accept loop and the connection's task.
#[derive(Debug)]
pub struct Connection {
    opened: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `opened` of the last request's end.
    last_ms: AtomicU64,
    served: AtomicBool,
    close: Notify,
    closing: AtomicBool,
}

impl Connection {
    /// A connection opened now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
            served: AtomicBool::new(false),
            close: Notify::new(),
            closing: AtomicBool::new(false),
        })
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// A request started (see [`InFlight`]). The clock is read at its end only: while a
    /// request is in flight the connection is not idle, whatever `last_ms` says.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.served.store(true, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// Whether any request was ever started on this connection.
    pub fn served(&self) -> bool {
        self.served.load(Ordering::Relaxed)
    }

    /// Since when the connection has had no request in flight; `None` while one is.
    pub fn idle_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.opened + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }

    /// Asks the connection's task to close it (see [`Connection::closed`]).
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.close.notify_one();
    }

    /// Whether [`Connection::close`] was called.
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Completes when the connection should close: asked to by [`Connection::close`], no first
    /// request within `t.first_request`, or no request in flight for `t.idle`.
    pub async fn closed(&self, t: Timeouts) {
        loop {
            let limit = if self.served() {
                t.idle
            } else {
                t.first_request
            };
            let wait = match self.idle_since() {
                Some(since) if since.elapsed() >= limit => return,
                Some(since) => limit - since.elapsed(),
                None => limit,
            };
            // Requests start and end without waking this loop: it looks again at least every
            // min(first_request, idle), which also picks up the switch from one limit to the
            // other when the first request comes.
            let wait = wait.min(t.first_request.min(t.idle));
            tokio::select! {
                () = self.close.notified() => return,
                () = tokio::time::sleep(wait) => {}
            }
            if self.is_closing() {
                return;
            }
        }
    }
}

/// A request in flight on a connection; its end (drop) makes the connection idle again when it
/// was the last one.
#[derive(Debug)]
pub struct InFlight(Arc<Connection>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A hyper service whose requests are tracked on their [`Connection`] until their response
/// body ends.
#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    conn: Arc<Connection>,
}

impl<S> Tracked<S> {
    /// `inner`, tracked on `conn`.
    pub fn new(inner: S, conn: Arc<Connection>) -> Self {
        Self { inner, conn }
    }
}

impl<S, ReqB, ResB> hyper::service::Service<http::Request<ReqB>> for Tracked<S>
where
    S: hyper::service::Service<http::Request<ReqB>, Response = http::Response<ResB>>,
{
    type Response = http::Response<TrackedBody<ResB>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn call(&self, req: http::Request<ReqB>) -> Self::Future {
        TrackedFuture {
            guard: Some(self.conn.begin()),
            inner: self.inner.call(req),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of a [`Tracked`] service.
    pub struct TrackedFuture<F> {
        #[pin]
        inner: F,
        guard: Option<InFlight>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = std::task::ready!(this.inner.poll(cx));
        let guard = this.guard.take();
        Poll::Ready(out.map(|r| r.map(|inner| TrackedBody { inner, guard })))
    }
}

pin_project_lite::pin_project! {
    /// A response body keeping its request in flight until it ends or is dropped.
    pub struct TrackedBody<B> {
        #[pin]
        inner: B,
        guard: Option<InFlight>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        if frame.is_none() {
            this.guard.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_a_request_closes_after_the_first_request_timeout() {
        let c = Connection::new();
        let t = Timeouts {
            first_request: Duration::from_secs(10),
            idle: Duration::from_secs(60),
        };
        let start = Instant::now();
        c.closed(t).await;
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_holds_it_open_then_the_idle_timeout_runs_from_its_end() {
        let c = Connection::new();
        let t = Timeouts {
            first_request: Duration::from_secs(10),
            idle: Duration::from_secs(60),
        };
        let start = Instant::now();
        let request = c.begin();
        let closing = tokio::spawn({
            let c = c.clone();
            async move { c.closed(t).await }
        });
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(!closing.is_finished(), "closed with a request in flight");
        drop(request);
        closing.await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(160));
    }

    #[tokio::test(start_paused = true)]
    async fn close_is_heard_at_once() {
        let c = Connection::new();
        let start = Instant::now();
        let closing = tokio::spawn({
            let c = c.clone();
            async move { c.closed(Timeouts::default()).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.close();
        closing.await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert!(c.is_closing());
    }
}
