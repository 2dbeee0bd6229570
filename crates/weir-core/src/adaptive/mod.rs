//! Adaptive concurrency limits: the limit follows live latency signals instead of a guess.
//!
//! A [`LimitAlgorithm`] (AIMD, Gradient2, Vegas — Netflix concurrency-limits semantics and
//! defaults) turns each completed call's sample (RTT, in-flight when it started, dropped?) into
//! a new limit; [`AdaptiveLimiter`] enforces it with a [`ConcurrencyLimiter`], by rejecting or
//! with a bounded FIFO/LIFO wait queue, optionally partitioned by criticality.

mod aimd;
pub mod bbr;
pub mod codel;
pub mod cpu;
mod gradient2;
mod vegas;
mod windowed;

pub use aimd::Aimd;
pub use gradient2::Gradient2;
pub use vegas::Vegas;
pub use windowed::Windowed;

use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::Nanos;
use crate::concurrency::{ConcurrencyConfig, ConcurrencyLimiter, Permit};
use crate::criticality::Criticality;
use crate::decision::Decision;
use crate::error::ConfigError;

/// One completed call, as the limit algorithms see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Response time in ns.
    pub rtt: Nanos,
    /// Calls in flight when this one started (including it).
    pub in_flight: u64,
    /// The call was dropped / timed out / rejected downstream (a congestion signal).
    pub dropped: bool,
    /// When the call completed.
    pub at: Nanos,
}

/// Estimates a concurrency limit from samples.
pub trait LimitAlgorithm: Send + std::fmt::Debug {
    /// The current limit.
    fn limit(&self) -> u64;
    /// Updates the estimate with one sample and returns the new limit.
    fn on_sample(&mut self, sample: Sample) -> u64;
}

#[derive(Debug)]
struct Shared {
    bulkhead: ConcurrencyLimiter,
    algorithm: Mutex<Box<dyn LimitAlgorithm>>,
}

/// A concurrency limiter whose maximum is set by a [`LimitAlgorithm`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AdaptiveLimiter {
    shared: Arc<Shared>,
}

/// An admitted call. Report how it ended with [`AdaptivePermit::success`] or
/// [`AdaptivePermit::dropped`]; dropping it unreported releases the slot without a sample.
#[derive(Debug)]
#[must_use = "report the call with success() or dropped()"]
pub struct AdaptivePermit {
    shared: Arc<Shared>,
    permit: Option<Permit>,
    started: Nanos,
    in_flight: u64,
}

impl AdaptivePermit {
    fn finish(mut self, now: Nanos, dropped: bool) {
        drop(self.permit.take());
        let sample = Sample {
            rtt: now.saturating_sub(self.started),
            in_flight: self.in_flight,
            dropped,
            at: now,
        };
        let limit = self.shared.algorithm.lock().on_sample(sample);
        self.shared.bulkhead.set_max_in_flight(limit);
    }

    /// The call succeeded at `now`: its RTT is a sample.
    pub fn success(self, now: Nanos) {
        self.finish(now, false);
    }

    /// The call was dropped or timed out at `now`: a congestion signal.
    pub fn dropped(self, now: Nanos) {
        self.finish(now, true);
    }
}

impl AdaptiveLimiter {
    /// Enforces `algorithm`'s limit with the options of `config` (its `max_in_flight` is
    /// replaced by the algorithm's initial limit).
    pub fn new(
        algorithm: impl LimitAlgorithm + 'static,
        config: ConcurrencyConfig,
    ) -> Result<Self, ConfigError> {
        let bulkhead = ConcurrencyLimiter::with_config(ConcurrencyConfig {
            max_in_flight: algorithm.limit().max(1),
            ..config
        })?;
        Ok(Self {
            shared: Arc::new(Shared {
                bulkhead,
                algorithm: Mutex::new(Box::new(algorithm)),
            }),
        })
    }

    /// The current limit.
    pub fn limit(&self) -> u64 {
        self.shared.bulkhead.max_in_flight()
    }

    /// Calls in flight.
    pub fn in_flight(&self) -> u64 {
        self.shared.bulkhead.in_flight()
    }

    fn permit(&self, permit: Permit, now: Nanos) -> AdaptivePermit {
        AdaptivePermit {
            in_flight: self.shared.bulkhead.in_flight(),
            shared: self.shared.clone(),
            permit: Some(permit),
            started: now,
        }
    }

    /// Admits a call of `level` at `now` if under its share of the limit; never waits.
    pub fn try_acquire(&self, level: Criticality, now: Nanos) -> Result<AdaptivePermit, Decision> {
        let permit = self.shared.bulkhead.try_acquire_as(1, level)?;
        Ok(self.permit(permit, now))
    }

    /// Admits a call of `level`, waiting in the queue if one is configured; `now` is read from
    /// `clock` when the call is admitted.
    pub async fn acquire(
        &self,
        level: Criticality,
        clock: &impl crate::clock::Clock,
    ) -> Result<AdaptivePermit, Decision> {
        let permit = self.shared.bulkhead.acquire_as(1, level).await?;
        Ok(self.permit(permit, clock.now()))
    }
}

/// `max(1, log10(x))`, the step function of Netflix's Vegas.
pub(crate) fn log10_root(x: f64) -> f64 {
    x.log10().max(1.0)
}

#[cfg(test)]
mod tests;
