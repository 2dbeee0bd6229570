//! Concurrency limiter (bulkhead): at most N units in flight, with an optional bounded FIFO wait
//! queue (Tomcat `maxThreads` + `acceptCount`, nginx `limit_conn`).
//!
//! - [`ConcurrencyLimiter::try_acquire`] never waits: a CAS on the in-flight count.
//! - [`ConcurrencyLimiter::acquire`] (async, any executor) and
//!   [`ConcurrencyLimiter::acquire_blocking`] join the FIFO queue when no permit is free and the
//!   queue has room; a freed permit is handed to the oldest waiter first, and new callers do not
//!   overtake queued ones. Dropping an `acquire` future is cancellation-safe: a queued waiter
//!   leaves the queue, and a permit handed to it just before is passed on.
//! - A [`Permit`] returns its units when dropped.
//!
//! Decisions: `limit` = N, `remaining` = free units. A denial's `retry_after` is zero: when a
//! permit frees depends on other requests, not on time (a request for more than N is `never`).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::decision::Decision;
use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};

/// A bulkhead: at most `max` units in flight, optionally a bounded FIFO queue of waiters.
/// Cheap to clone (shares one state).
#[derive(Clone, Debug)]
pub struct ConcurrencyLimiter {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    max: u64,
    max_queue: usize,
    in_flight: AtomicU64,
    /// Number of queued waiters; read by releasers to decide whether to hand off.
    waiting: AtomicU64,
    queue: Mutex<VecDeque<Arc<Waiter>>>,
}

#[derive(Debug)]
struct Waiter {
    n: u64,
    granted: AtomicBool,
    wake: Mutex<Wake>,
}

#[derive(Debug)]
enum Wake {
    None,
    Task(Waker),
    Thread(Thread),
}

/// Units held in flight; returned when dropped.
#[derive(Debug)]
#[must_use = "the permit is released as soon as it is dropped"]
pub struct Permit {
    inner: Arc<Inner>,
    n: u64,
}

impl Permit {
    /// Units this permit holds.
    pub fn units(&self) -> u64 {
        self.n
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.inner.release(self.n);
    }
}

enum Enqueued {
    Done(Result<Permit, Decision>),
    Queued(Arc<Waiter>),
}

impl ConcurrencyLimiter {
    /// At most `max_in_flight` units at once, no queue.
    pub fn new(max_in_flight: u64) -> Result<Self, ConfigError> {
        Self::with_queue(max_in_flight, 0)
    }

    /// At most `max_in_flight` units at once and at most `max_queue` waiters.
    pub fn with_queue(max_in_flight: u64, max_queue: usize) -> Result<Self, ConfigError> {
        if max_in_flight == 0 {
            return Err(ConfigError::ZeroPermits);
        }
        Ok(Self {
            inner: Arc::new(Inner {
                max: max_in_flight,
                max_queue,
                in_flight: AtomicU64::new(0),
                waiting: AtomicU64::new(0),
                queue: Mutex::new(VecDeque::new()),
            }),
        })
    }

    /// Units in flight now.
    pub fn in_flight(&self) -> u64 {
        self.inner.in_flight.load(Ordering::Acquire)
    }

    /// Waiters queued now.
    pub fn queued(&self) -> usize {
        self.inner.queue.lock().len()
    }

    /// The most units in flight.
    pub fn max_in_flight(&self) -> u64 {
        self.inner.max
    }

    /// Takes `n` units if free now and nobody is queued; never waits. `n = 0` peeks.
    pub fn try_acquire(&self, n: u64) -> Result<Permit, Decision> {
        let inner = &self.inner;
        if n > inner.max {
            return Err(Decision::never(inner.max, inner.free(), 0));
        }
        if inner.waiting.load(Ordering::SeqCst) > 0 {
            return Err(inner.denial());
        }
        if inner.try_take(n.max(1), n == 0) {
            Ok(Permit {
                inner: self.inner.clone(),
                n,
            })
        } else {
            Err(inner.denial())
        }
    }

    /// The decision `try_acquire(n)` would give, consuming nothing.
    pub fn peek(&self, n: u64) -> Decision {
        let inner = &self.inner;
        let free = inner.free();
        if n > inner.max {
            Decision::never(inner.max, free, 0)
        } else if n.max(1) <= free && inner.waiting.load(Ordering::SeqCst) == 0 {
            Decision::allow(inner.max, free, 0, 0)
        } else {
            inner.denial()
        }
    }

    fn enqueue(&self, n: u64) -> Enqueued {
        let inner = &self.inner;
        if n > inner.max {
            return Enqueued::Done(Err(Decision::never(inner.max, inner.free(), 0)));
        }
        let mut queue = inner.queue.lock();
        inner.waiting.fetch_add(1, Ordering::SeqCst);
        // Re-check after announcing ourselves: a release that ran before saw no waiter.
        if queue.is_empty() && inner.try_take(n.max(1), n == 0) {
            inner.waiting.fetch_sub(1, Ordering::SeqCst);
            return Enqueued::Done(Ok(Permit {
                inner: self.inner.clone(),
                n,
            }));
        }
        if queue.len() >= inner.max_queue {
            inner.waiting.fetch_sub(1, Ordering::SeqCst);
            return Enqueued::Done(Err(inner.denial()));
        }
        let waiter = Arc::new(Waiter {
            n,
            granted: AtomicBool::new(false),
            wake: Mutex::new(Wake::None),
        });
        queue.push_back(waiter.clone());
        Enqueued::Queued(waiter)
    }

    /// Takes `n` units, waiting in the FIFO queue if needed (any async executor). Denied at once
    /// when the queue is full or `n` exceeds the maximum. Dropping the future gives up the place
    /// in the queue without taking a permit. Bound the wait with a timeout of your runtime (or
    /// `acquire_timeout` with the `tokio` feature).
    pub async fn acquire(&self, n: u64) -> Result<Permit, Decision> {
        let waiter = match self.enqueue(n) {
            Enqueued::Done(result) => return result,
            Enqueued::Queued(waiter) => waiter,
        };
        let mut guard = Cancel {
            inner: &self.inner,
            waiter: &waiter,
            armed: true,
        };
        poll_fn(|cx| {
            if waiter.granted.load(std::sync::atomic::Ordering::Acquire) {
                return Poll::Ready(());
            }
            *waiter.wake.lock() = Wake::Task(cx.waker().clone());
            if waiter.granted.load(std::sync::atomic::Ordering::Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        guard.armed = false;
        Ok(Permit {
            inner: self.inner.clone(),
            n,
        })
    }

    /// Async acquire bounded by `timeout` (tokio timer).
    #[cfg(feature = "tokio")]
    pub async fn acquire_timeout(&self, n: u64, timeout: Duration) -> Result<Permit, Decision> {
        match tokio::time::timeout(timeout, self.acquire(n)).await {
            Ok(result) => result,
            Err(_) => Err(self.inner.denial()),
        }
    }

    /// Takes `n` units, blocking this thread in the FIFO queue for at most `timeout`.
    pub fn acquire_blocking(&self, n: u64, timeout: Duration) -> Result<Permit, Decision> {
        let waiter = match self.enqueue(n) {
            Enqueued::Done(result) => return result,
            Enqueued::Queued(waiter) => waiter,
        };
        let mut guard = Cancel {
            inner: &self.inner,
            waiter: &waiter,
            armed: true,
        };
        *waiter.wake.lock() = Wake::Thread(std::thread::current());
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if waiter.granted.load(std::sync::atomic::Ordering::Acquire) {
                guard.armed = false;
                return Ok(Permit {
                    inner: self.inner.clone(),
                    n,
                });
            }
            match deadline {
                None => std::thread::park(),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        drop(guard);
                        return Err(self.inner.denial());
                    }
                    std::thread::park_timeout(d - now);
                }
            }
        }
    }
}

impl Inner {
    fn free(&self) -> u64 {
        self.max
            .saturating_sub(self.in_flight.load(Ordering::Acquire))
    }

    fn denial(&self) -> Decision {
        Decision::deny(self.max, self.free(), 0, 0)
    }

    /// CAS `n` more units in flight if they fit (`peek` checks without taking).
    fn try_take(&self, n: u64, peek: bool) -> bool {
        let mut current = self.in_flight.load(Ordering::SeqCst);
        loop {
            if current + n > self.max {
                return false;
            }
            if peek {
                return true;
            }
            match self.in_flight.compare_exchange_weak(
                current,
                current + n,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    fn release(&self, n: u64) {
        if n == 0 {
            return;
        }
        self.in_flight.fetch_sub(n, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.hand_off();
        }
    }

    /// Grants queued waiters, oldest first, while their units fit.
    fn hand_off(&self) {
        let mut queue = self.queue.lock();
        while let Some(front) = queue.front() {
            if !self.try_take(front.n.max(1), front.n == 0) {
                break;
            }
            let Some(waiter) = queue.pop_front() else {
                break;
            };
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            waiter
                .granted
                .store(true, std::sync::atomic::Ordering::Release);
            let wake = std::mem::replace(&mut *waiter.wake.lock(), Wake::None);
            match wake {
                Wake::Task(w) => w.wake(),
                Wake::Thread(t) => t.unpark(),
                Wake::None => {}
            }
        }
    }
}

/// Leaves the queue (or passes on a permit granted meanwhile) when a waiter gives up.
struct Cancel<'a> {
    inner: &'a Inner,
    waiter: &'a Arc<Waiter>,
    armed: bool,
}

impl Drop for Cancel<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut queue = self.inner.queue.lock();
        if let Some(pos) = queue.iter().position(|w| Arc::ptr_eq(w, self.waiter)) {
            queue.remove(pos);
            self.inner.waiting.fetch_sub(1, Ordering::SeqCst);
            drop(queue);
            // Our leaving may let the next waiter (which was behind us) proceed.
            if self.inner.waiting.load(Ordering::SeqCst) > 0 {
                self.inner.hand_off();
            }
        } else {
            // Granted between the last poll and the drop: the units are ours; pass them on.
            drop(queue);
            self.inner.release(self.waiter.n);
        }
    }
}
