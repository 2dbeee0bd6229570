//! Response bodies that hold what a layer admitted a request with — a concurrency permit, a
//! rules guard — until the body ends (the last frame, or `is_end_stream`) or is dropped (the
//! client went away), and the bodies of refusals.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use weir_core::stats::Outcome;
use weir_core::{Clock, Permit};
use weir_rules::engine::Guard;

/// Something released when a response ends: told whether the exchange failed (a 5xx status
/// or a body error). Dropping it unreleased (the client went away) releases it without an
/// outcome.
pub trait Held: Send {
    /// The response ended; `failed`: 5xx or a body error.
    fn end(self, failed: bool);

    /// Sees each frame of the body as it passes (a cost read from the body); nothing by
    /// default.
    #[inline]
    fn frame(&mut self, _frame: &Frame<Bytes>) {}
}

impl Held for Permit {
    fn end(self, _: bool) {}
}

impl<C: Clock + Clone> Held for Guard<C> {
    fn end(self, failed: bool) {
        self.complete(if failed {
            Outcome::Error
        } else {
            Outcome::Success
        });
    }
}

pin_project_lite::pin_project! {
    /// A response body holding `H` until it ends or is dropped, or a refusal's problem body.
    // pin-project-lite takes no documentation on variant fields: the states are what
    // the variants' own documentation says.
    #[allow(missing_docs)]
    #[project = HeldProj]
    pub enum HeldBody<B, H> {
        /// The inner service's body.
        Passing {
            #[pin]
            inner: B,
            held: Option<H>,
            failed: bool,
        },
        /// A refusal's body (problem JSON; empty for gRPC).
        Refused {
            text: Option<Bytes>,
        },
    }
}

impl<B, H> HeldBody<B, H> {
    /// A refusal's body.
    pub fn refused(text: impl Into<Bytes>) -> Self {
        Self::Refused {
            text: Some(text.into()),
        }
    }
}

impl<B: Body<Data = Bytes>, H: Held> HeldBody<B, H> {
    /// The response `r` with its body holding `held` until it ends; failed when the status is
    /// a 5xx. A response that has no body to poll — already at its end (`Content-Length: 0`,
    /// an empty 500), a 1xx / 204 / 304, or the answer to a HEAD request (`head_request`),
    /// which servers send without polling the body — ends `held` at once: a server never
    /// polls such a body, and the outcome (an error for an empty 5xx, the success that closes
    /// a half-open breaker) would otherwise be lost with it.
    pub fn wrap(r: http::Response<B>, held: Option<H>, head_request: bool) -> http::Response<Self> {
        let status = r.status();
        let failed = status.is_server_error();
        let bodiless = head_request
            || status.is_informational()
            || status == http::StatusCode::NO_CONTENT
            || status == http::StatusCode::NOT_MODIFIED
            || r.body().is_end_stream();
        let held = match held {
            Some(h) if bodiless => {
                h.end(failed);
                None
            }
            h => h,
        };
        r.map(|inner| Self::Passing {
            inner,
            held,
            failed,
        })
    }
}

impl<B: Body<Data = Bytes>, H: Held> Body for HeldBody<B, H> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project() {
            HeldProj::Passing {
                mut inner,
                held,
                failed,
            } => {
                let frame = std::task::ready!(inner.as_mut().poll_frame(cx));
                if let (Some(Ok(f)), Some(h)) = (&frame, held.as_mut()) {
                    h.frame(f);
                }
                // Servers stop polling once `is_end_stream` says so (a sized body): the end
                // is the last frame or `None`, whichever comes first.
                let error = matches!(frame, Some(Err(_)));
                if error || frame.is_none() || inner.is_end_stream() {
                    if let Some(h) = held.take() {
                        h.end(*failed || error);
                    }
                }
                Poll::Ready(frame)
            }
            HeldProj::Refused { text } => Poll::Ready(text.take().map(|t| Ok(Frame::data(t)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Passing { inner, .. } => inner.is_end_stream(),
            Self::Refused { text } => text.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Passing { inner, .. } => inner.size_hint(),
            Self::Refused { text } => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
        }
    }
}
