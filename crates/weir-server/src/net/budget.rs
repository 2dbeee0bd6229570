//! Request bodies read into memory (gRPC messages, `/json` bodies), bounded three ways: bytes
//! per connection, bytes for the whole process, and the time a body may take to arrive.
//!
//! Without the bounds, a client can open streams, send each a body just under the message limit
//! and never finish them: every byte stays buffered (250 streams × 4 MiB on one connection took
//! a process from 62 MB to 1.34 GB). With them, a connection holds at most
//! [`BodyLimits::per_connection`] bytes of unfinished bodies, the process at most
//! [`BodyLimits::total`], and a body not complete within [`BodyLimits::timeout`] is dropped
//! with its bytes; the stream is answered with an error naming the bound.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;

/// The bounds on buffered request bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Bytes of request bodies one connection may have buffered at once.
    pub per_connection: usize,
    /// Bytes of request bodies the whole process may have buffered at once.
    pub total: usize,
    /// Longest time from a request's head to the end of its body.
    pub timeout: Duration,
}

impl Default for BodyLimits {
    fn default() -> Self {
        Self {
            per_connection: 4 << 20,
            total: 64 << 20,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Why a body was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The body is larger than the request's limit.
    #[error("request body larger than {0} bytes")]
    TooLarge(usize),
    /// The connection's unfinished bodies would pass [`BodyLimits::per_connection`].
    #[error("request bodies in flight on this connection exceed {0} bytes")]
    ConnectionFull(usize),
    /// The process's unfinished bodies would pass [`BodyLimits::total`].
    #[error("server busy: request bodies in flight exceed {0} bytes")]
    ProcessFull(usize),
    /// The body did not end within [`BodyLimits::timeout`].
    #[error("request body not complete within {0:?}")]
    Timeout(Duration),
    /// The body could not be read (the client reset the stream or went away).
    #[error("reading the request body: {0}")]
    Read(String),
}

/// The process's budget: one per server.
#[derive(Debug)]
pub struct Budget {
    limits: BodyLimits,
    used: AtomicUsize,
}

impl Budget {
    /// A budget with `limits`.
    pub fn new(limits: BodyLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            used: AtomicUsize::new(0),
        })
    }

    /// A connection's share of it (one per connection).
    pub fn connection(self: &Arc<Self>) -> Arc<ConnectionBudget> {
        Arc::new(ConnectionBudget {
            process: self.clone(),
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes buffered now, process-wide.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// One connection's budget.
#[derive(Debug)]
pub struct ConnectionBudget {
    process: Arc<Budget>,
    used: AtomicUsize,
}

/// Takes `n` more from `used` if the sum stays within `cap`.
fn take(used: &AtomicUsize, n: usize, cap: usize) -> bool {
    used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        u.checked_add(n).filter(|t| *t <= cap)
    })
    .is_ok()
}

/// The bytes `weir proxy` reads of JSON request bodies for cost estimates count against the
/// same budgets as every buffered body: a read that would pass either is not made.
impl weir_tower::prefix::ReadBudget for ConnectionBudget {
    fn take(&self, n: usize) -> bool {
        let limits = self.process.limits;
        if !take(&self.used, n, limits.per_connection) {
            return false;
        }
        if !take(&self.process.used, n, limits.total) {
            self.used.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
        self.process.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Bytes held against a connection's and the process's budgets, given back on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<ConnectionBudget>,
    bytes: usize,
}

impl Reservation {
    fn grow(&mut self, n: usize) -> Result<(), BodyError> {
        let limits = self.budget.process.limits;
        if !take(&self.budget.used, n, limits.per_connection) {
            return Err(BodyError::ConnectionFull(limits.per_connection));
        }
        if !take(&self.budget.process.used, n, limits.total) {
            self.budget.used.fetch_sub(n, Ordering::AcqRel);
            return Err(BodyError::ProcessFull(limits.total));
        }
        self.bytes += n;
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        self.budget
            .process
            .used
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A body read whole, still counted against the budgets until dropped.
#[derive(Debug)]
pub struct Buffered {
    /// The body.
    pub bytes: Bytes,
    _held: Reservation,
}

impl ConnectionBudget {
    /// Reads `body` whole (at most `max` bytes) within the budgets and the time bound.
    pub async fn read<B>(self: &Arc<Self>, body: B, max: usize) -> Result<Buffered, BodyError>
    where
        B: Body<Data = Bytes>,
        B::Error: std::fmt::Display,
    {
        let limits = self.process.limits;
        let mut held = Reservation {
            budget: self.clone(),
            bytes: 0,
        };
        let read = async {
            let mut body = std::pin::pin!(body);
            let mut chunks: Vec<Bytes> = Vec::new();
            let mut len = 0usize;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
                let Ok(data) = frame.into_data() else {
                    continue; // trailers: nothing to keep
                };
                len = len.saturating_add(data.len());
                if len > max {
                    return Err(BodyError::TooLarge(max));
                }
                held.grow(data.len())?;
                chunks.push(data);
            }
            Ok(match chunks.len() {
                0 => Bytes::new(),
                1 => chunks.pop().unwrap_or_default(),
                _ => {
                    let mut all = BytesMut::with_capacity(len);
                    for c in chunks {
                        all.extend_from_slice(&c);
                    }
                    all.freeze()
                }
            })
        };
        let bytes = tokio::time::timeout(limits.timeout, read)
            .await
            .map_err(|_| BodyError::Timeout(limits.timeout))??;
        Ok(Buffered { bytes, _held: held })
    }

    /// Bytes this connection has buffered now.
    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The process's budget this connection draws on.
    pub fn process(&self) -> &Budget {
        &self.process
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};

    fn limits() -> BodyLimits {
        BodyLimits {
            per_connection: 100,
            total: 150,
            timeout: Duration::from_secs(5),
        }
    }

    /// A body that sends `first` and then never ends.
    fn stalled(first: usize) -> impl Body<Data = Bytes, Error = std::convert::Infallible> {
        let head =
            futures_util::stream::iter([Ok(http_body::Frame::data(Bytes::from(vec![0u8; first])))]);
        StreamBody::new(futures_util::StreamExt::chain(
            head,
            futures_util::stream::pending(),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn connection_and_process_bounds_hold_and_are_given_back() {
        let process = Budget::new(limits());
        let (a, b) = (process.connection(), process.connection());
        // Two unfinished bodies on `a`: 60 held, the second (60 more) is over its 100.
        let held = tokio::spawn({
            let a = a.clone();
            async move { a.read(stalled(60), 1_000).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(a.used(), 60);
        assert_eq!(
            a.read(Full::new(Bytes::from(vec![1u8; 60])), 1_000)
                .await
                .unwrap_err(),
            BodyError::ConnectionFull(100)
        );
        // `b` may buffer 90 of the process's 150 — 60 + 90 = 150 — but not 91.
        let ok = b.read(Full::new(Bytes::from(vec![2u8; 90])), 1_000).await;
        let ok = ok.unwrap();
        assert_eq!(process.used(), 150);
        assert_eq!(
            b.read(Full::new(Bytes::from(vec![2u8; 1])), 1_000)
                .await
                .unwrap_err(),
            BodyError::ProcessFull(150)
        );
        drop(ok);
        assert_eq!(process.used(), 60);
        // The stalled body runs out of time and gives its bytes back.
        let e = held.await.unwrap().unwrap_err();
        assert_eq!(e, BodyError::Timeout(Duration::from_secs(5)));
        assert_eq!((a.used(), process.used()), (0, 0));
    }

    #[tokio::test]
    async fn a_body_over_the_request_limit_is_refused() {
        let c = Budget::new(limits()).connection();
        let e = c
            .read(Full::new(Bytes::from(vec![0u8; 11])), 10)
            .await
            .unwrap_err();
        assert_eq!(e, BodyError::TooLarge(10));
        assert_eq!(c.used(), 0);
        let ok = c.read(Full::new(Bytes::from_static(b"abc")), 10).await;
        assert_eq!(&ok.unwrap().bytes[..], b"abc");
    }
}
