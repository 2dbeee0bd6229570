//! A future its task polls only after the future's own waker has fired.
//!
//! A connection's task waits for its I/O and, beside it, for signals that almost never come
//! (shutdown, the idle timeout). `select!` polls every branch on every wake-up, so each read
//! and write of a busy connection would also poll those signals (a lock in `Notify`, a timer
//! check). Wrapped in [`Dormant`], a signal is polled once to register its wakers, then only
//! when one of them has been woken.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// `inner`, polled on its first poll and then only after its own waker fired.
pub struct Dormant<F> {
    inner: Pin<Box<F>>,
    signal: Arc<Signal>,
    /// The waker `inner` is polled with (wakes `signal`), made once.
    waker: Waker,
}

/// Whether the wrapped future was woken, and the task to wake when it is.
struct Signal {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: Future> Dormant<F> {
    /// Wraps `inner`.
    pub fn new(inner: F) -> Self {
        let signal = Arc::new(Signal {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        Self {
            inner: Box::pin(inner),
            waker: Waker::from(signal.clone()),
            signal,
        }
    }
}

impl<F: Future> Future for Dormant<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Registered before the flag is read: a wake between the two is not lost.
        self.signal.task.register(cx.waker());
        if !self.signal.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let this = &mut *self;
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts its polls; ready once `ready` is set, then woken through the waker it kept.
    struct Probe {
        polls: Arc<AtomicUsize>,
        ready: Arc<AtomicBool>,
        waker: Arc<parking_lot::Mutex<Option<Waker>>>,
    }

    impl Future for Probe {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            if self.ready.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *self.waker.lock() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    struct CountWakes(AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_inner_future_is_polled_first_and_then_only_when_woken() {
        let polls = Arc::new(AtomicUsize::new(0));
        let ready = Arc::new(AtomicBool::new(false));
        let kept = Arc::new(parking_lot::Mutex::new(None::<Waker>));
        let mut d = Dormant::new(Probe {
            polls: polls.clone(),
            ready: ready.clone(),
            waker: kept.clone(),
        });
        let task = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let mut d = Pin::new(&mut d);
        assert!(d.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        // The task is woken for other reasons: the inner future is left alone.
        for _ in 0..10 {
            assert!(d.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        // Its own waker fires: the task is woken and the inner future polled once more.
        ready.store(true, Ordering::SeqCst);
        kept.lock().take().unwrap().wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        assert!(d.as_mut().poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_inside_still_fires() {
        let start = tokio::time::Instant::now();
        let sleep = Dormant::new(tokio::time::sleep(std::time::Duration::from_secs(5)));
        let busy = async {
            // Wakes its task often, as a busy connection's I/O does.
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            () = sleep => {}
            () = busy => unreachable!(),
        }
        assert_eq!(start.elapsed(), std::time::Duration::from_secs(5));
    }
}
