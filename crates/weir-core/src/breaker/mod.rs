//! Circuit breaker: stop calling a failing dependency, probe it, and let traffic back gradually.
//!
//! States: **closed** (calls pass; outcomes recorded in a count- or time-based sliding window),
//! **open** (calls rejected until the open period ends), **half-open** (at most `max_probes`
//! concurrent probe calls; `successes_to_close` successes close it, one failure re-opens it, and a
//! probe that never reports within `probe_timeout` counts as a failure, so the breaker can never
//! stay half-open forever), then optionally **ramping** (after closing, a share of traffic
//! growing linearly over `slow_start` is admitted instead of all at once).
//!
//! It trips — only after `min_calls` calls in the window — when the error ratio, the error count
//! or the slow-call ratio (slow = response time above `slow_call`) reaches its threshold. Each
//! consecutive trip multiplies the open period by `open_backoff` up to `max_open`. The caller
//! classifies outcomes ([`Outcome`]). Transitions are reported to an observer callback, outside
//! the breaker's lock.
//!
//! The closed path is lock-free: one atomic load to admit, and for a time-based window a few
//! relaxed atomic adds to record; the trip condition is evaluated only when an error or a slow
//! call is recorded (a success cannot trip the breaker).

mod config;

pub use config::{BreakerConfig, Window};

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::{duration_to_nanos, Nanos};
use crate::error::ConfigError;
use crate::stats::{Outcome, StatsWindow};

/// The breaker's state, as observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls pass.
    Closed,
    /// Calls are rejected.
    Open,
    /// A few probe calls pass.
    HalfOpen,
    /// Closed again, admitting a growing share of calls.
    Ramping,
}

/// A state change, reported to the observer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// State before.
    pub from: BreakerState,
    /// State after.
    pub to: BreakerState,
    /// When (the `now` of the call that caused it).
    pub at: Nanos,
}

/// Why a call was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected {
    /// The breaker's state.
    pub state: BreakerState,
    /// When a call may be admitted again at the earliest (zero when it depends on probes).
    pub retry_after: Duration,
}

/// An admitted call. Report its outcome with [`Breaker::record`]; a permit that is dropped
/// without a report counts as nothing in closed state and as a timed-out probe in half-open.
#[derive(Debug)]
#[must_use = "report the call's outcome with Breaker::record"]
pub struct Call {
    started: Nanos,
    /// Probe generation (0 = not a probe).
    probe: u64,
}

impl Call {
    /// When the call was admitted.
    pub fn started(&self) -> Nanos {
        self.started
    }
}

type Observer = Arc<dyn Fn(Transition) + Send + Sync>;

const CLOSED: u8 = 0;
const OTHER: u8 = 1;

#[derive(Debug)]
enum Inner {
    Closed,
    Open {
        until: Nanos,
    },
    HalfOpen {
        generation: u64,
        /// Start times of probes in flight.
        probes: Vec<Nanos>,
        successes: u32,
    },
    Ramping {
        since: Nanos,
        seen: u64,
        admitted: u64,
    },
}

#[derive(Debug)]
struct Machine {
    state: Inner,
    /// Consecutive trips without a full recovery (drives the open-period backoff).
    trips: u32,
    generation: u64,
    /// Count-based window: the last N outcomes (error?, slow?) as a ring.
    ring: Vec<(bool, bool)>,
    ring_pos: usize,
}

/// A circuit breaker. `Send + Sync`; share it by reference or `Arc`.
pub struct Breaker {
    config: BreakerConfig,
    fast: AtomicU8,
    machine: Mutex<Machine>,
    stats: Option<StatsWindow>,
    observer: Option<Observer>,
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker")
            .field("config", &self.config)
            .field("state", &self.state())
            .finish()
    }
}

impl Breaker {
    /// A closed breaker with `config`.
    pub fn new(config: BreakerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let stats = match config.window {
            Window::Time { length, buckets } => {
                Some(StatsWindow::new(length, buckets, config.slow_call)?)
            }
            Window::Count(_) => None,
        };
        let ring_len = match config.window {
            Window::Count(n) => n as usize,
            Window::Time { .. } => 0,
        };
        Ok(Self {
            config,
            fast: AtomicU8::new(CLOSED),
            machine: Mutex::new(Machine {
                state: Inner::Closed,
                trips: 0,
                generation: 0,
                ring: Vec::with_capacity(ring_len),
                ring_pos: 0,
            }),
            stats,
            observer: None,
        })
    }

    /// Reports every state change to `observer` (called outside the breaker's lock).
    pub fn with_observer(mut self, observer: impl Fn(Transition) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// The configuration.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// The current state (without advancing time).
    pub fn state(&self) -> BreakerState {
        match self.machine.lock().state {
            Inner::Closed => BreakerState::Closed,
            Inner::Open { .. } => BreakerState::Open,
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
            Inner::Ramping { .. } => BreakerState::Ramping,
        }
    }

    fn notify(&self, transitions: &[Transition]) {
        if let Some(observer) = &self.observer {
            for t in transitions {
                observer(*t);
            }
        }
    }

    /// Asks to make a call at `now`.
    #[inline]
    pub fn try_acquire(&self, now: Nanos) -> Result<Call, Rejected> {
        if self.fast.load(Ordering::Acquire) == CLOSED {
            return Ok(Call {
                started: now,
                probe: 0,
            });
        }
        self.try_acquire_slow(now)
    }

    fn try_acquire_slow(&self, now: Nanos) -> Result<Call, Rejected> {
        let mut changes = Vec::new();
        let result = {
            let mut m = self.machine.lock();
            self.expire_probes(&mut m, now, &mut changes);
            self.advance(&mut m, now, &mut changes);
            let config = &self.config;
            match &mut m.state {
                Inner::Closed => Ok(Call {
                    started: now,
                    probe: 0,
                }),
                Inner::Open { until } => Err(Rejected {
                    state: BreakerState::Open,
                    retry_after: Duration::from_nanos(until.saturating_sub(now)),
                }),
                Inner::HalfOpen {
                    generation, probes, ..
                } => {
                    if probes.len() < config.max_probes as usize {
                        probes.push(now);
                        Ok(Call {
                            started: now,
                            probe: *generation,
                        })
                    } else {
                        let oldest = probes.iter().min().copied().unwrap_or(now);
                        let timeout = duration_to_nanos(config.probe_timeout);
                        Err(Rejected {
                            state: BreakerState::HalfOpen,
                            retry_after: Duration::from_nanos(
                                oldest.saturating_add(timeout).saturating_sub(now),
                            ),
                        })
                    }
                }
                Inner::Ramping {
                    since,
                    seen,
                    admitted,
                } => {
                    let ramp = duration_to_nanos(config.slow_start).max(1);
                    let share = (now.saturating_sub(*since) as f64 / ramp as f64).min(1.0);
                    *seen += 1;
                    if (*admitted as f64) < (*seen as f64) * share {
                        *admitted += 1;
                        Ok(Call {
                            started: now,
                            probe: 0,
                        })
                    } else {
                        Err(Rejected {
                            state: BreakerState::Ramping,
                            retry_after: Duration::ZERO,
                        })
                    }
                }
            }
        };
        self.notify(&changes);
        result
    }

    /// Reports how an admitted call ended at `now`.
    pub fn record(&self, call: Call, now: Nanos, outcome: Outcome) {
        let rt = now.saturating_sub(call.started);
        let slow = rt > duration_to_nanos(self.config.slow_call);
        let bad = outcome == Outcome::Error || slow;
        if call.probe == 0 {
            if let Some(stats) = &self.stats {
                stats.add_complete(now, rt, outcome);
                if !bad {
                    return;
                }
            }
        }
        let mut changes = Vec::new();
        {
            let mut m = self.machine.lock();
            if call.probe == 0 {
                if let Window::Count(n) = self.config.window {
                    let entry = (outcome == Outcome::Error, slow);
                    if m.ring.len() < n as usize {
                        m.ring.push(entry);
                    } else {
                        let pos = m.ring_pos;
                        m.ring[pos] = entry;
                    }
                    m.ring_pos = (m.ring_pos + 1) % n as usize;
                }
                if bad
                    && matches!(m.state, Inner::Closed | Inner::Ramping { .. })
                    && self.should_trip(&m, now)
                {
                    self.open(&mut m, now, &mut changes);
                }
            } else if let Inner::HalfOpen {
                generation,
                probes,
                successes,
            } = &mut m.state
            {
                if *generation == call.probe {
                    if let Some(i) = probes.iter().position(|t| *t == call.started) {
                        probes.swap_remove(i);
                    }
                    if bad {
                        self.open(&mut m, now, &mut changes);
                    } else {
                        *successes += 1;
                        if *successes >= self.config.successes_to_close {
                            self.close(&mut m, now, &mut changes);
                        }
                    }
                }
                // A report from an older probe generation is stale: ignored.
            }
        }
        self.notify(&changes);
    }

    fn should_trip(&self, m: &Machine, now: Nanos) -> bool {
        let c = &self.config;
        let (calls, errors, slow) = match &self.stats {
            Some(stats) => {
                let s = stats.snapshot(now);
                (s.completed, s.error, s.slow)
            }
            None => m
                .ring
                .iter()
                .fold((0u64, 0u64, 0u64), |(n, e, s), (err, sl)| {
                    (n + 1, e + u64::from(*err), s + u64::from(*sl))
                }),
        };
        if calls < c.min_calls || calls == 0 {
            return false;
        }
        let ratio = |x: u64| x as f64 / calls as f64;
        c.error_ratio.is_some_and(|t| ratio(errors) >= t)
            || c.error_count.is_some_and(|t| errors >= t)
            || c.slow_ratio.is_some_and(|t| ratio(slow) >= t)
    }

    fn set(&self, m: &mut Machine, to: Inner, now: Nanos, changes: &mut Vec<Transition>) {
        let from = Self::label(&m.state);
        m.state = to;
        let to = Self::label(&m.state);
        self.fast.store(
            if to == BreakerState::Closed {
                CLOSED
            } else {
                OTHER
            },
            Ordering::Release,
        );
        if from != to {
            changes.push(Transition { from, to, at: now });
        }
    }

    fn label(s: &Inner) -> BreakerState {
        match s {
            Inner::Closed => BreakerState::Closed,
            Inner::Open { .. } => BreakerState::Open,
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
            Inner::Ramping { .. } => BreakerState::Ramping,
        }
    }

    fn open(&self, m: &mut Machine, now: Nanos, changes: &mut Vec<Transition>) {
        let c = &self.config;
        let factor = c.open_backoff.powi(m.trips.min(64) as i32);
        let period = (c.open_duration.as_secs_f64() * factor).min(c.max_open.as_secs_f64());
        m.trips = m.trips.saturating_add(1);
        let until = now.saturating_add(duration_to_nanos(Duration::from_secs_f64(period)));
        self.set(m, Inner::Open { until }, now, changes);
    }

    fn close(&self, m: &mut Machine, now: Nanos, changes: &mut Vec<Transition>) {
        m.trips = 0;
        m.ring.clear();
        m.ring_pos = 0;
        let next = if self.config.slow_start.is_zero() {
            Inner::Closed
        } else {
            Inner::Ramping {
                since: now,
                seen: 0,
                admitted: 0,
            }
        };
        self.set(m, next, now, changes);
    }

    /// Moves open → half-open when the period is over, ramping → closed when the ramp is done.
    fn advance(&self, m: &mut Machine, now: Nanos, changes: &mut Vec<Transition>) {
        match m.state {
            Inner::Open { until } if now >= until => {
                m.generation += 1;
                let generation = m.generation;
                self.set(
                    m,
                    Inner::HalfOpen {
                        generation,
                        probes: Vec::with_capacity(self.config.max_probes as usize),
                        successes: 0,
                    },
                    now,
                    changes,
                );
            }
            Inner::Ramping { since, .. }
                if now.saturating_sub(since) >= duration_to_nanos(self.config.slow_start) =>
            {
                self.set(m, Inner::Closed, now, changes);
            }
            _ => {}
        }
    }

    /// A probe that has not reported within the timeout is a failure: re-open.
    fn expire_probes(&self, m: &mut Machine, now: Nanos, changes: &mut Vec<Transition>) {
        if let Inner::HalfOpen { probes, .. } = &m.state {
            let timeout = duration_to_nanos(self.config.probe_timeout);
            if probes.iter().any(|t| now.saturating_sub(*t) >= timeout) {
                self.open(m, now, changes);
            }
        }
    }
}

#[cfg(test)]
mod tests;
