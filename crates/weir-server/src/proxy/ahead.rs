//! A request body's first bytes, read before the request takes an upstream slot.
//!
//! A slot held while a body trickles in (a byte a second from a thousand uploads) is a slot a
//! ready request cannot have: behind one load-balancer address, slow uploads would starve every
//! other client of that address. So the proxy reads up to [`READ_AHEAD`] bytes of a body first
//! — paced as every body is ([`super::paced`]: cut with 408 when it stalls) — and takes the
//! slots only then: a small body is complete before it holds anything upstream, and only a
//! large one streams its rest while holding a slot. Only bodies of a stated length
//! (`Content-Length`) are read ahead: a stream of unknown length (gRPC, chunked) may wait for
//! the answer before sending more, so it is passed on as it comes. The bytes read count against the
//! connection's and the process's budgets (`--max-buffered-bytes`); past them a body is read no
//! further before it takes its slot.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use weir_tower::prefix::{read_prefix, BudgetHold, ReadBudget};

use super::paced::{Pace, PacedBody};
use super::ClientBody;
use crate::net::budget::ConnectionBudget;
use crate::net::conn::BoxError;

/// Most bytes of a body read before its request takes an upstream slot.
pub const READ_AHEAD: usize = 64 * 1024;

/// A client's body: the bytes read ahead, then the rest.
pub struct AheadBody {
    prefix: Option<Bytes>,
    /// What the bytes read hold of the budgets until they are handed on.
    hold: Option<BudgetHold>,
    trailers: Option<HeaderMap>,
    rest: Option<ClientBody>,
}

impl AheadBody {
    /// `body`, nothing read.
    pub fn whole(body: ClientBody) -> Self {
        Self {
            prefix: None,
            hold: None,
            trailers: None,
            rest: Some(body),
        }
    }

    /// Reads `body` until its end or [`READ_AHEAD`] bytes, as fast as `pace` demands, the
    /// bytes held against `budget`; the error of a body that failed (a [`super::paced::TooSlow`]
    /// when it stalled).
    pub async fn read(
        body: ClientBody,
        pace: Pace,
        budget: Option<&Arc<ConnectionBudget>>,
    ) -> Result<Self, BoxError> {
        let mut paced = PacedBody::new(body, pace);
        let budget = budget.map(|b| b.clone() as Arc<dyn ReadBudget>);
        let read = read_prefix(&mut paced, READ_AHEAD, budget, None).await;
        if let Some(e) = read.failed {
            return Err(e);
        }
        Ok(Self {
            prefix: Some(read.bytes),
            hold: read.hold,
            trailers: read.trailers,
            rest: (!read.ended).then(|| paced.into_inner()),
        })
    }
}

impl Body for AheadBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let prefix = this.prefix.take();
        // Handed on: the budgets are free again.
        this.hold.take();
        if let Some(p) = prefix.filter(|p| !p.is_empty()) {
            return Poll::Ready(Some(Ok(Frame::data(p))));
        }
        if let Some(t) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        match &mut this.rest {
            Some(b) => Pin::new(b).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.as_ref().is_none_or(Bytes::is_empty)
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let p = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let rest = self
            .rest
            .as_ref()
            .map_or(SizeHint::with_exact(0), Body::size_hint);
        let mut h = SizeHint::new();
        if let Some(u) = rest.upper() {
            h.set_upper(u.saturating_add(p));
        }
        h.set_lower(rest.lower().saturating_add(p));
        h
    }
}
