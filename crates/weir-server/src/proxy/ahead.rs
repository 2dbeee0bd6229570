//! A request body's first bytes, read before the request takes an upstream slot.
//!
//! A slot held while a body trickles in (a byte a second from a thousand uploads) is a slot a
//! ready request cannot have: behind one load-balancer address, slow uploads would starve every
//! other client of that address. So the proxy reads up to [`READ_AHEAD`] bytes of a body first
//! — paced as every body is ([`super::paced`]: cut with 408 when it stalls) — and takes the
//! slots only then: a small body is complete before it holds anything upstream, and only a
//! large one streams its rest while holding a slot. Only bodies of a stated length
//! (`Content-Length`) are read ahead: a stream of unknown length (gRPC, chunked) may wait for
//! the answer before sending more, so it is passed on as it comes. The bytes read count against
//! the connection's and the process's budgets (`--max-buffered-bytes`, weir-tower's `prefix`);
//! past them a body is read no further before it takes its slot. The body is handed on as
//! weir-tower's [`ReplayBody`]: the bytes read, then the rest.

use std::sync::Arc;

use bytes::Bytes;
use http_body::Body;
use weir_tower::cost::ReplayBody;
use weir_tower::prefix::{read_prefix, ReadBudget};

use super::paced::{Pace, PacedBody};
use crate::net::budget::ConnectionBudget;
use crate::net::conn::BoxError;

/// Most bytes of a body read before its request takes an upstream slot.
pub const READ_AHEAD: usize = 64 * 1024;

/// Reads `body` until its end or [`READ_AHEAD`] bytes, as fast as `pace` demands, the bytes
/// held against `budget`: the body to hand on (what was read, then the rest), or the error of
/// a body that failed (a [`super::paced::TooSlow`] when it stalled).
pub async fn read_ahead<B>(
    body: B,
    pace: Pace,
    budget: Option<&Arc<ConnectionBudget>>,
) -> Result<ReplayBody<B>, BoxError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut paced = PacedBody::new(body, pace);
    let budget = budget.map(|b| b.clone() as Arc<dyn ReadBudget>);
    let read = read_prefix(&mut paced, READ_AHEAD, budget, None).await;
    if let Some(e) = read.failed {
        return Err(e);
    }
    Ok(ReplayBody::Replay {
        prefix: Some(read.bytes),
        hold: read.hold.map(Box::new),
        failed: None,
        trailers: read.trailers,
        rest: (!read.ended).then(|| paced.into_inner()),
    })
}
