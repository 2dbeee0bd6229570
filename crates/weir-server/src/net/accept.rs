//! The one accept loop behind every listener of the binary (`weir serve`'s gRPC and HTTP,
//! `weir proxy` and its admin port).
//!
//! - At most `max_connections` connections are open at once per listener. At the cap the next
//!   connection is accepted and the connection idle the longest (no request in flight) is asked
//!   to close to make room; when every connection has a request in flight, the new one waits
//!   for a slot (and further ones in the kernel's backlog). Idle connections — including ones
//!   that never send a request — close on their own after a timeout ([`crate::net::conn`]), so a
//!   flood of them costs a bounded number of descriptors and tasks and locks no one out.
//! - `TCP_NODELAY` on every socket: Nagle + delayed ACK otherwise stall a caller that
//!   multiplexes streams on one connection (Envoy opens one per worker) for 40 ms.
//! - An accept error (out of file descriptors and the like) is logged and retried after 50 ms;
//!   the listener keeps serving.
//! - Graceful stop: once a [`Shutdown`] says stop, the loop closes its listener, every
//!   connection is asked to finish what it has in flight (HTTP/2 GOAWAY; HTTP/1.1 closes after
//!   the current response) and [`serve`] returns when the last one has ended.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use crate::net::conn::{Connection, Timeouts, Tracked};
use crate::net::dormant::Dormant;

/// Says "stop" to every [`Shutdown`] made with it.
pub struct ShutdownTrigger(watch::Sender<bool>, Arc<AtomicBool>);

impl ShutdownTrigger {
    /// Asks every listener and connection to finish.
    pub fn stop(&self) {
        self.1.store(true, Ordering::Release);
        self.0.send_replace(true);
    }
}

/// Learns when to stop; cheap to clone, one per listener and connection. The flag beside the
/// channel answers [`Shutdown::is_stopping`] with one load (a request asks it, and the
/// channel's value sits behind a lock every worker would share).
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>, Arc<AtomicBool>);

impl Shutdown {
    /// Completes once [`ShutdownTrigger::stop`] was called (never, if the trigger is dropped
    /// without it).
    pub async fn stopping(&mut self) {
        if self.0.wait_for(|stop| *stop).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether [`ShutdownTrigger::stop`] was called.
    pub fn is_stopping(&self) -> bool {
        self.1.load(Ordering::Acquire)
    }
}

/// Completes at the first SIGINT (Ctrl-C) or SIGTERM (what `kill`, systemd and Kubernetes send).
pub async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Runs `servers` until a stop signal, then stops them through `trigger` and gives them up to
/// `grace` (or until a second signal) to finish the requests in flight. `what` names the
/// command in the messages.
pub async fn run_until_stopped(
    what: &str,
    servers: impl Future<Output = ()>,
    trigger: ShutdownTrigger,
    grace: Duration,
) {
    tokio::pin!(servers);
    tokio::select! {
        () = &mut servers => return,
        () = stop_signal() => {}
    }
    tracing::info!(
        "{what}: stopping: finishing the requests in flight (at most {grace:?}; a second signal stops at once)"
    );
    trigger.stop();
    tokio::select! {
        r = tokio::time::timeout(grace, servers) => {
            if r.is_err() {
                tracing::warn!("{what}: connections still open after {grace:?}, closing them");
            }
        }
        () = stop_signal() => tracing::warn!("{what}: second stop signal, closing the connections"),
    }
}

/// A trigger and the first [`Shutdown`] listening to it.
pub fn shutdown() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    let flag = Arc::new(AtomicBool::new(false));
    (ShutdownTrigger(tx, flag.clone()), Shutdown(rx, flag))
}

/// The bounds of a listener's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// First-request and idle timeouts.
    pub timeouts: Timeouts,
}

impl Default for Limits {
    /// The command's defaults: 10 000 connections, 10 s for a first request, 60 s idle.
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            timeouts: crate::net::conn::Timeouts::default(),
        }
    }
}

/// The connection slots of a listener — or of several listeners that count together (one per
/// worker thread on the same address): at most `max` connections open, the one idle the
/// longest closed to make room at the cap.
#[derive(Clone)]
pub struct Slots {
    max: usize,
    slots: Arc<Semaphore>,
    open: Arc<Mutex<Slab>>,
}

impl Slots {
    /// At most `max_connections` open at once (0 is treated as 1).
    pub fn new(max_connections: usize) -> Self {
        let max = max_connections.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        Self {
            max,
            slots: Arc::new(Semaphore::new(max)),
            open: Arc::default(),
        }
    }
}

/// Accepts connections on `listener` until `shutdown` says stop, handing each to `handle`
/// (with its own [`Shutdown`] and [`Connection`]) on its own task; then returns once every
/// connection has ended.
///
/// The connection's slot is held until the future `handle` returns completes. `what` names the
/// listener in logs. `max_connections` of 0 is treated as 1.
pub async fn serve<F, Fut>(
    listener: TcpListener,
    max_connections: usize,
    what: &'static str,
    shutdown: Shutdown,
    handle: F,
) where
    F: FnMut(TcpStream, SocketAddr, Shutdown, Arc<Connection>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    serve_in(
        listener,
        &Slots::new(max_connections),
        what,
        shutdown,
        handle,
    )
    .await;
}

/// [`serve`] with `slots` shared with other listeners; returns once every connection of every
/// listener sharing them has ended.
pub async fn serve_in<F, Fut>(
    listener: TcpListener,
    slots: &Slots,
    what: &'static str,
    mut shutdown: Shutdown,
    mut handle: F,
) where
    F: FnMut(TcpStream, SocketAddr, Shutdown, Arc<Connection>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Slots { max, slots, open } = slots.clone();
    let for_connections = shutdown.clone();
    let accept = async {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, listener = what, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let slot = match slots.clone().try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    // At the cap: make room by closing the connection idle the longest.
                    if let Some(idle) = open.lock().longest_idle() {
                        idle.close();
                    }
                    // The semaphore is never closed, so this only waits.
                    let Ok(slot) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    slot
                }
            };
            let _ = stream.set_nodelay(true);
            let conn = Connection::new();
            let key = open.lock().insert(conn.clone());
            let connection = handle(stream, peer, for_connections.clone(), conn);
            let open = open.clone();
            tokio::spawn(async move {
                connection.await;
                open.lock().remove(key);
                drop(slot);
            });
        }
    };
    tokio::select! {
        () = accept => {}
        () = shutdown.stopping() => {}
    }
    drop(listener);
    // Every slot back: every connection has ended. `max` fits in u32 (clamped above).
    let _ = slots.acquire_many(max as u32).await;
}

/// The open connections of a listener.
#[derive(Default)]
struct Slab {
    next: u64,
    open: std::collections::HashMap<u64, Arc<Connection>>,
}

impl Slab {
    fn insert(&mut self, c: Arc<Connection>) -> u64 {
        self.next += 1;
        self.open.insert(self.next, c);
        self.next
    }

    fn remove(&mut self, key: u64) {
        self.open.remove(&key);
    }

    /// The connection with no request in flight for the longest time, not already closing.
    fn longest_idle(&self) -> Option<Arc<Connection>> {
        self.open
            .values()
            .filter(|c| !c.is_closing())
            .filter_map(|c| Some((c.idle_since()?, c)))
            .min_by_key(|(since, _)| *since)
            .map(|(_, c)| c.clone())
    }
}

/// Serves HTTP/1.1 and h2c (prior knowledge) on one accepted connection with a tower service
/// (an axum `Router`, the proxy's stack) until the client closes it, `shutdown` says stop
/// (then the requests in flight finish first) or `connection` is to close ([`Timeouts`]: no
/// first request, idle, or room needed at the cap). A client that takes longer than
/// `timeouts.first_request` to send a request head is disconnected; HTTP/2 clients are pinged
/// every `timeouts.idle` and dropped when they do not answer.
pub async fn serve_http<S, B, I>(
    stream: I,
    service: S,
    timeouts: Timeouts,
    mut shutdown: Shutdown,
    connection: Arc<Connection>,
) where
    S: tower::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<crate::net::conn::BoxError>,
    B: crate::net::conn::ResponseBody,
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(stream);
    let service = Tracked::new(
        hyper_util::service::TowerToHyperService::new(service),
        connection.clone(),
    );
    let mut builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(timeouts.first_request);
    builder
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Some(timeouts.idle))
        .keep_alive_timeout(timeouts.first_request)
        .max_header_list_size(MAX_HEADER_LIST);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    // Polled only when they fire, not on each of the connection's reads and writes.
    let stopping = Dormant::new(shutdown.stopping());
    let closed = Dormant::new(connection.closed(timeouts));
    let ended = tokio::select! {
        biased;
        r = conn.as_mut() => r,
        () = stopping => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = closed => {
            // Never carried a request: nothing to finish, drop it. Else finish what is in
            // flight (a request may have begun since), within the first-request timeout.
            if !connection.served() {
                return;
            }
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(timeouts.first_request, conn.as_mut()).await {
                Ok(r) => r,
                Err(_) => return,
            }
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Largest HTTP/2 header block accepted per request (hyper's default is 16 MiB): with up to
/// `max_concurrent_streams` requests per connection, this bounds header memory.
pub const MAX_HEADER_LIST: u32 = 16 << 10;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Each handled connection gets one greeting byte and is held until the client closes it.
    async fn greet_and_hold(mut s: TcpStream, live: Arc<AtomicUsize>, peak: Arc<AtomicUsize>) {
        let now = live.fetch_add(1, Ordering::SeqCst) + 1;
        peak.fetch_max(now, Ordering::SeqCst);
        let _ = s.write_all(b"!").await;
        let mut buf = [0u8; 16];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        live.fetch_sub(1, Ordering::SeqCst);
    }

    async fn greeting(c: &mut TcpStream) -> bool {
        let mut b = [0u8; 1];
        matches!(c.read(&mut b).await, Ok(1))
    }

    /// A greeting server (see [`greet_and_hold`]) with cap `max` on a free port: its address,
    /// live and peak connection counts, stop trigger and task.
    async fn greeter(
        max: usize,
    ) -> (
        SocketAddr,
        Arc<AtomicUsize>,
        Arc<AtomicUsize>,
        ShutdownTrigger,
        tokio::task::JoinHandle<()>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (live, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (l, p) = (live.clone(), peak.clone());
        let (trigger, shutdown) = shutdown();
        let server = tokio::spawn(serve(listener, max, "test", shutdown, move |s, _, _, _| {
            greet_and_hold(s, l.clone(), p.clone())
        }));
        (addr, live, peak, trigger, server)
    }

    #[tokio::test]
    async fn at_the_cap_accepting_waits_for_a_closed_connection() {
        let (addr, _live, peak, _keep, _server) = greeter(2).await;
        let limit = Duration::from_secs(10);
        let mut a = TcpStream::connect(addr).await.unwrap();
        let mut b = TcpStream::connect(addr).await.unwrap();
        assert!(tokio::time::timeout(limit, greeting(&mut a)).await.unwrap());
        assert!(tokio::time::timeout(limit, greeting(&mut b)).await.unwrap());
        // The third connection completes in the kernel's backlog but is not served: with the
        // cap no greeting can come, so this wait only proves its absence for a while.
        let mut c = TcpStream::connect(addr).await.unwrap();
        let early = tokio::time::timeout(Duration::from_millis(300), greeting(&mut c)).await;
        assert!(
            early.is_err(),
            "a third connection was served past the cap of 2"
        );
        drop(a);
        assert!(tokio::time::timeout(limit, greeting(&mut c)).await.unwrap());
        assert_eq!(peak.load(Ordering::SeqCst), 2);
        drop((b, c));
    }

    #[tokio::test]
    async fn zero_means_one() {
        let (addr, _live, _peak, _keep, _server) = greeter(0).await;
        let mut a = TcpStream::connect(addr).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), greeting(&mut a)).await;
        assert!(got.unwrap(), "a cap of 0 must still serve one connection");
    }

    #[tokio::test]
    async fn stop_closes_the_listener_and_waits_for_open_connections() {
        // Its connections end only when their client closes, whatever the stop says.
        let (addr, live, _peak, trigger, server) = greeter(8).await;
        let limit = Duration::from_secs(10);
        let mut a = TcpStream::connect(addr).await.unwrap();
        assert!(tokio::time::timeout(limit, greeting(&mut a)).await.unwrap());
        trigger.stop();
        // The listener closes: a new connection is refused (bounded wait for the stop to land).
        let deadline = tokio::time::Instant::now() + limit;
        while TcpStream::connect(addr).await.is_ok() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "listener still open"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            !server.is_finished(),
            "returned with a connection still open"
        );
        drop(a);
        tokio::time::timeout(limit, server)
            .await
            .expect("returns once the last connection ended")
            .unwrap();
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn stop_lets_an_http_request_in_flight_finish() {
        use http_body_util::{BodyExt, Empty};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (trigger, shutdown) = shutdown();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let gate = Arc::new(parking_lot::Mutex::new(Some((started_tx, release_rx))));
        let app = tower::service_fn(move |_req: http::Request<hyper::body::Incoming>| {
            let gate = gate.lock().take();
            async move {
                if let Some((started, release)) = gate {
                    let _ = started.send(());
                    let _ = release.await;
                }
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(b"done"),
                )))
            }
        });
        let server = tokio::spawn(serve(listener, 8, "test", shutdown, move |s, _, sd, c| {
            serve_http(s, app.clone(), Timeouts::default(), sd, c)
        }));
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = http::Request::get("http://x/")
            .body(Empty::<bytes::Bytes>::new())
            .unwrap();
        let call = tokio::spawn(async move { sender.send_request(req).await });
        let limit = Duration::from_secs(10);
        tokio::time::timeout(limit, started_rx)
            .await
            .unwrap()
            .unwrap();
        trigger.stop();
        // The request is in flight when the stop comes; it still gets its answer.
        release_tx.send(()).unwrap();
        let res = tokio::time::timeout(limit, call)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"done");
        tokio::time::timeout(limit, server)
            .await
            .expect("the connection closes after its last response")
            .unwrap();
    }
}
