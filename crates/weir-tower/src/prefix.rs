//! A request body's first bytes, read into memory within a byte budget: what
//! [`crate::cost::ReadJsonLayer`] reads for a JSON cost estimate, and what `weir proxy` reads of
//! a body before its request takes an upstream slot.
//!
//! Each read first reserves [`FRAME`] bytes of the [`ReadBudget`] (per connection and per
//! process in `weir proxy`) and stops when it cannot: a flood of bodies that never end holds at
//! most the budget, not a frame per stream beyond it. The bytes read are held against the
//! budget until the prefix is handed on ([`Prefix::hold`]).

use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::Body;

/// Where the bytes read ahead of a request are counted — per connection and per process in
/// `weir proxy` — so that requests whose bodies arrive slowly (or never end) cannot make a
/// server hold more than a budget, whatever their number.
pub trait ReadBudget: Send + Sync + 'static {
    /// Takes `n` more bytes; `false`: over budget, nothing taken.
    fn take(&self, n: usize) -> bool;
    /// Gives back `n` bytes taken.
    fn give(&self, n: usize);
}

/// Bytes reserved before each read of a frame: an HTTP/2 frame's default largest size. A larger
/// frame (HTTP/1.1 reads) takes the rest after it arrived.
pub const FRAME: usize = 16 * 1024;

/// Bytes held against a [`ReadBudget`], given back when dropped.
pub struct BudgetHold {
    budget: Arc<dyn ReadBudget>,
    bytes: usize,
}

impl BudgetHold {
    /// Nothing held yet of `budget`.
    pub fn new(budget: Arc<dyn ReadBudget>) -> Self {
        Self { budget, bytes: 0 }
    }

    /// Takes `n` more bytes; `false`: over budget.
    fn take(&mut self, n: usize) -> bool {
        let ok = self.budget.take(n);
        if ok {
            self.bytes += n;
        }
        ok
    }

    /// Gives `n` of the bytes held back.
    fn give(&mut self, n: usize) {
        let n = n.min(self.bytes);
        self.budget.give(n);
        self.bytes -= n;
    }
}

impl Drop for BudgetHold {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
    }
}

/// What [`read_prefix`] read.
pub struct Prefix<E> {
    /// The bytes read.
    pub bytes: Bytes,
    /// What they hold of the budget (drop it once they are handed on).
    pub hold: Option<BudgetHold>,
    /// The body's trailers, when they ended the read.
    pub trailers: Option<HeaderMap>,
    /// The body ended (its last frame, or its trailers, were read).
    pub ended: bool,
    /// The read stopped short of `max` because the budget had no room.
    pub over_budget: bool,
    /// The error that ended the read.
    pub failed: Option<E>,
}

/// Reads `body` until it ends, fails, `max` bytes were read or `within` has passed (then what
/// came is kept: nothing read is ever lost) — each frame within `budget` when there is one (the
/// read stops when the budget has no room for another).
pub async fn read_prefix<B>(
    body: &mut B,
    max: usize,
    budget: Option<Arc<dyn ReadBudget>>,
    within: Option<std::time::Duration>,
) -> Prefix<B::Error>
where
    B: Body<Data = Bytes> + Unpin,
{
    // Sized once from a stated length; else grown as frames come (at most twice the bytes).
    let hint = body.size_hint().upper().unwrap_or(0);
    let mut bytes = BytesMut::with_capacity(hint.min(max as u64) as usize);
    let mut hold = budget.map(BudgetHold::new);
    let deadline = within.map(|w| tokio::time::Instant::now() + w);
    let mut out = Prefix {
        bytes: Bytes::new(),
        hold: None,
        trailers: None,
        ended: false,
        over_budget: false,
        failed: None,
    };
    while bytes.len() < max {
        // Room for a frame first: past the budget, nothing more is pulled from the client.
        if let Some(h) = &mut hold {
            if !h.take(FRAME) {
                out.over_budget = true;
                break;
            }
        }
        let next = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx));
        let frame = match deadline {
            Some(d) => match tokio::time::timeout_at(d, next).await {
                Ok(f) => f,
                Err(_) => {
                    if let Some(h) = &mut hold {
                        h.give(FRAME);
                    }
                    break;
                }
            },
            None => next.await,
        };
        let got = match frame {
            None => {
                out.ended = true;
                0
            }
            Some(Err(e)) => {
                out.failed = Some(e);
                0
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    bytes.extend_from_slice(&data);
                    data.len()
                }
                Err(frame) => {
                    out.trailers = frame.into_trailers().ok();
                    out.ended = true;
                    0
                }
            },
        };
        if let Some(h) = &mut hold {
            if got <= FRAME {
                h.give(FRAME - got);
            } else if !h.take(got - FRAME) {
                // A frame larger than reserved, past the budget: kept (it was read), and no
                // more read.
                out.over_budget = true;
                break;
            }
        }
        if out.ended || out.failed.is_some() {
            break;
        }
    }
    out.bytes = bytes.freeze();
    out.hold = hold;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counted {
        cap: usize,
        used: AtomicUsize,
    }

    impl ReadBudget for Counted {
        fn take(&self, n: usize) -> bool {
            self.used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                    (u + n <= self.cap).then_some(u + n)
                })
                .is_ok()
        }
        fn give(&self, n: usize) {
            self.used.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// A body of frames of [`FRAME`] bytes that never ends.
    struct Endless;

    impl Body for Endless {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(vec![
                b'x';
                FRAME
            ])))))
        }
    }

    #[tokio::test]
    async fn reads_hold_what_they_read_and_stop_at_the_budget() {
        let budget = Arc::new(Counted {
            cap: 2 * FRAME,
            used: AtomicUsize::new(0),
        });
        // A whole small body: read, and what it holds is its length.
        let mut small = http_body_util::Full::new(Bytes::from_static(b"{\"n\": 1}"));
        let p = read_prefix(&mut small, 1 << 20, Some(budget.clone()), None).await;
        assert!(p.ended && !p.over_budget);
        assert_eq!(budget.used.load(Ordering::Acquire), 8);
        drop(p);
        assert_eq!(budget.used.load(Ordering::Acquire), 0);
        // Bodies that never end: the first two read a frame each; the third finds no room for
        // a frame and reads nothing.
        let frames = || Endless;
        let mut a = frames();
        let pa = read_prefix(&mut a, FRAME, Some(budget.clone()), None).await;
        let mut b = frames();
        let pb = read_prefix(&mut b, 2 * FRAME, Some(budget.clone()), None).await;
        assert_eq!((pa.bytes.len(), pb.bytes.len()), (FRAME, FRAME));
        assert!(pb.over_budget);
        let mut c = frames();
        let pc = read_prefix(&mut c, FRAME, Some(budget.clone()), None).await;
        assert!(pc.over_budget && pc.bytes.is_empty());
        assert_eq!(budget.used.load(Ordering::Acquire), 2 * FRAME);
    }
}
