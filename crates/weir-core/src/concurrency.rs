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

use crate::criticality::{Criticality, Shares};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};

/// Which queued waiter gets a freed permit first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueOrder {
    /// Oldest first (fair).
    #[default]
    Fifo,
    /// Newest first: under sustained overload the newest requests (whose callers have not given
    /// up yet) are served, and old ones time out.
    Lifo,
}

/// Full configuration of a [`ConcurrencyLimiter`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConcurrencyConfig {
    /// Most units in flight (changeable later with `set_max_in_flight`).
    pub max_in_flight: u64,
    /// Most queued waiters (0 = no queue).
    pub max_queue: usize,
    /// Queue discipline.
    pub order: QueueOrder,
    /// Partitions by criticality: a request of level L may only take in-flight units up to
    /// `max × share(L)`, so sheddable work never uses the capacity kept for critical work.
    pub shares: Option<Shares>,
}

/// A bulkhead: at most `max` units in flight, optionally a bounded FIFO or LIFO queue of
/// waiters, optionally partitioned by criticality. Cheap to clone (shares one state).
#[derive(Clone, Debug)]
pub struct ConcurrencyLimiter {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    max: AtomicU64,
    max_queue: usize,
    order: QueueOrder,
    shares: Option<Shares>,
    in_flight: AtomicU64,
    /// Number of queued waiters; read by releasers to decide whether to hand off.
    waiting: AtomicU64,
    queue: Mutex<VecDeque<Arc<Waiter>>>,
}

#[derive(Debug)]
struct Waiter {
    n: u64,
    level: Criticality,
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

    /// At most `max_in_flight` units at once, no queue: a bound that cannot fail to build.
    pub fn bounded(max_in_flight: std::num::NonZeroU64) -> Self {
        Self::build(ConcurrencyConfig {
            max_in_flight: max_in_flight.get(),
            max_queue: 0,
            order: QueueOrder::Fifo,
            shares: None,
        })
    }

    /// At most `max_in_flight` units at once and at most `max_queue` waiters (FIFO).
    pub fn with_queue(max_in_flight: u64, max_queue: usize) -> Result<Self, ConfigError> {
        Self::with_config(ConcurrencyConfig {
            max_in_flight,
            max_queue,
            order: QueueOrder::Fifo,
            shares: None,
        })
    }

    /// A limiter with every option.
    pub fn with_config(config: ConcurrencyConfig) -> Result<Self, ConfigError> {
        if config.max_in_flight == 0 {
            return Err(ConfigError::ZeroPermits);
        }
        Ok(Self::build(config))
    }

    /// The limiter of a checked `config` (a maximum of at least one).
    fn build(config: ConcurrencyConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                max: AtomicU64::new(config.max_in_flight),
                max_queue: config.max_queue,
                order: config.order,
                shares: config.shares,
                in_flight: AtomicU64::new(0),
                waiting: AtomicU64::new(0),
                queue: Mutex::new(VecDeque::new()),
            }),
        }
    }

    /// Changes the maximum (at least 1); units already in flight stay. A raise serves waiters.
    pub fn set_max_in_flight(&self, max: u64) {
        self.inner.max.store(max.max(1), Ordering::SeqCst);
        if self.inner.waiting.load(Ordering::SeqCst) > 0 {
            self.inner.hand_off();
        }
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
        self.inner.max()
    }

    /// Takes `n` units if free now and nobody is queued; never waits. `n = 0` peeks.
    pub fn try_acquire(&self, n: u64) -> Result<Permit, Decision> {
        self.try_acquire_as(n, Criticality::CriticalPlus)
    }

    /// [`try_acquire`](Self::try_acquire) for a request of `level` (limited to its share).
    pub fn try_acquire_as(&self, n: u64, level: Criticality) -> Result<Permit, Decision> {
        let inner = &self.inner;
        let max = inner.max();
        if n > max {
            return Err(Decision::never(max, inner.free(), 0));
        }
        if inner.waiting.load(Ordering::SeqCst) > 0 {
            return Err(inner.denial());
        }
        if inner.try_take(n.max(1), n == 0, inner.cap(level)) {
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
        let max = inner.max();
        if n > max {
            Decision::never(max, free, 0)
        } else if n.max(1) <= free && inner.waiting.load(Ordering::SeqCst) == 0 {
            Decision::allow(max, free, 0, 0)
        } else {
            inner.denial()
        }
    }

    fn enqueue(&self, n: u64, level: Criticality) -> Enqueued {
        let inner = &self.inner;
        let max = inner.max();
        if n > max {
            return Enqueued::Done(Err(Decision::never(max, inner.free(), 0)));
        }
        let mut queue = inner.queue.lock();
        inner.waiting.fetch_add(1, Ordering::SeqCst);
        // Re-check after announcing ourselves: a release that ran before saw no waiter.
        if queue.is_empty() && inner.try_take(n.max(1), n == 0, inner.cap(level)) {
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
            level,
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
        self.acquire_as(n, Criticality::CriticalPlus).await
    }

    /// [`acquire`](Self::acquire) for a request of `level` (limited to its share).
    pub async fn acquire_as(&self, n: u64, level: Criticality) -> Result<Permit, Decision> {
        let waiter = match self.enqueue(n, level) {
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
        let waiter = match self.enqueue(n, Criticality::CriticalPlus) {
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
    fn max(&self) -> u64 {
        self.max.load(Ordering::Acquire)
    }

    /// The in-flight units requests of `level` may fill.
    fn cap(&self, level: Criticality) -> u64 {
        let max = self.max();
        match &self.shares {
            Some(s) => s.allowance(max, level),
            None => max,
        }
    }

    fn free(&self) -> u64 {
        self.max()
            .saturating_sub(self.in_flight.load(Ordering::Acquire))
    }

    fn denial(&self) -> Decision {
        Decision::deny(self.max(), self.free(), 0, 0)
    }

    /// CAS `n` more units in flight if they fit (`peek` checks without taking).
    fn try_take(&self, n: u64, peek: bool, cap: u64) -> bool {
        let mut current = self.in_flight.load(Ordering::SeqCst);
        loop {
            if n > cap || current > cap - n {
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

    /// Grants queued waiters in queue order (oldest first, or newest first for LIFO) while
    /// their units fit.
    fn hand_off(&self) {
        let mut queue = self.queue.lock();
        loop {
            let next = match self.order {
                QueueOrder::Fifo => queue.front(),
                QueueOrder::Lifo => queue.back(),
            };
            let Some(next) = next else {
                break;
            };
            if !self.try_take(next.n.max(1), next.n == 0, self.cap(next.level)) {
                break;
            }
            let taken = match self.order {
                QueueOrder::Fifo => queue.pop_front(),
                QueueOrder::Lifo => queue.pop_back(),
            };
            let Some(waiter) = taken else {
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
