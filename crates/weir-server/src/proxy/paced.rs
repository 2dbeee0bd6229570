//! A request body streamed to the upstream that must keep arriving: a client trickling its
//! body (a byte every few seconds, with a huge `Content-Length`) would otherwise hold an
//! upstream slot, and an upstream connection, until the upstream timeout.
//!
//! [`PacedBody`] fails the body — so the upstream request is abandoned and its slot freed — when
//! no data came for `idle`, or when, past the first `idle`, fewer than `min_rate` bytes a
//! second have arrived on average since the body began: a body of `n` bytes so far must be
//! complete, or have grown, by `start + idle + n / min_rate`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// How a request body must keep arriving.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Longest gap without data (also the grace period before the rate counts).
    pub idle: Duration,
    /// Least average rate after the grace period, bytes a second (0: no rate).
    pub min_rate: u64,
}

/// Why a request body was cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TooSlow {
    /// Nothing arrived for the idle timeout.
    #[error("request body: nothing received for {0:?}")]
    Idle(Duration),
    /// The body fell behind the least rate.
    #[error("request body: slower than {0} bytes/s on average")]
    Rate(u64),
}

pin_project_lite::pin_project! {
    /// `B`, failing with [`TooSlow`] when it does not keep its [`Pace`].
    pub struct PacedBody<B> {
        #[pin]
        inner: B,
        pace: Pace,
        // When the body was first polled, and its last data.
        started: Option<Instant>,
        received: u64,
        last: Option<Instant>,
        // Made when the body first has to wait (a body read in one go costs no timer).
        timer: Option<Pin<Box<Sleep>>>,
        done: bool,
    }
}

impl<B> PacedBody<B> {
    /// Wraps `inner`; its clock starts when it is first read.
    pub fn new(inner: B, pace: Pace) -> Self {
        Self {
            inner,
            pace,
            started: None,
            received: 0,
            last: None,
            timer: None,
            done: false,
        }
    }
}

impl<B> PacedBody<B> {
    /// The body inside (its pace forgotten).
    pub fn into_inner(self) -> B {
        self.inner
    }
}

fn deadline(pace: Pace, started: Instant, received: u64, last: Instant) -> (Instant, TooSlow) {
    let idle = (last + pace.idle, TooSlow::Idle(pace.idle));
    if pace.min_rate == 0 {
        return idle;
    }
    let behind = Duration::from_secs_f64(received as f64 / pace.min_rate as f64);
    let rate = (
        started + pace.idle + behind.min(Duration::from_secs(86_400 * 365)),
        TooSlow::Rate(pace.min_rate),
    );
    if rate.0 < idle.0 {
        rate
    } else {
        idle
    }
}

impl<B> Body for PacedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        if *this.done {
            return this.inner.poll_frame(cx).map_err(Into::into);
        }
        let started = *this.started.get_or_insert_with(Instant::now);
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    *this.received += data.len() as u64;
                    let now = Instant::now();
                    *this.last = Some(now);
                    if let Some(t) = this.timer.as_mut() {
                        t.as_mut()
                            .reset(deadline(*this.pace, started, *this.received, now).0);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                *this.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Pending => {
                let last = this.last.unwrap_or(started);
                let (at, why) = deadline(*this.pace, started, *this.received, last);
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                if timer.as_mut().poll(cx).is_ready() {
                    *this.done = true;
                    return Poll::Ready(Some(Err(Box::new(why))));
                }
                Poll::Pending
            }
        }
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
    use http_body_util::BodyExt;

    /// A body sending `chunks` of one byte, `gap` apart.
    fn trickle(chunks: usize, gap: Duration) -> impl Body<Data = Bytes, Error = std::io::Error> {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        tokio::spawn(async move {
            for _ in 0..chunks {
                tokio::time::sleep(gap).await;
                if tx
                    .send(Ok(Frame::data(Bytes::from_static(b"x"))))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        let frames =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
            );
        http_body_util::StreamBody::new(frames)
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_body_is_cut_off_a_steady_one_is_not() {
        let pace = Pace {
            idle: Duration::from_secs(10),
            min_rate: 1024,
        };
        // A byte every 3 s: never idle for 10 s, but far below 1 KiB/s once the 10 s of grace
        // are over.
        let started = Instant::now();
        let e = PacedBody::new(trickle(100, Duration::from_secs(3)), pace)
            .collect()
            .await
            .unwrap_err();
        assert_eq!(e.downcast_ref::<TooSlow>(), Some(&TooSlow::Rate(1024)));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(10) && took < Duration::from_secs(11),
            "{took:?}"
        );
        // A gap longer than the idle timeout.
        let e = PacedBody::new(trickle(1, Duration::from_secs(11)), pace)
            .collect()
            .await
            .unwrap_err();
        assert_eq!(
            e.downcast_ref::<TooSlow>(),
            Some(&TooSlow::Idle(Duration::from_secs(10)))
        );
        // Without a rate, only the gaps count: 5 bytes, 3 s apart, arrive whole.
        let no_rate = Pace {
            min_rate: 0,
            ..pace
        };
        let body = PacedBody::new(trickle(5, Duration::from_secs(3)), no_rate)
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&body[..], b"xxxxx");
    }
}
