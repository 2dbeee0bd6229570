//! # weir-core
//!
//! Weir's pure flow-control logic: no I/O, no async runtime (an optional `tokio` feature adds
//! sleeping helpers). Every algorithm reads time from a [`Clock`] and answers with the same
//! [`Decision`], so servers, middleware and the simulator never special-case one.
//!
//! - Rate algorithms ([`Algorithm`]): [`FixedWindow`], [`SlidingWindow`] (bucketed),
//!   [`SlidingLog`] (exact), [`SlidingCounter`], [`Gcra`], [`TokenBucket`] (Guava
//!   SmoothBursty), [`WarmupTokenBucket`] (Guava SmoothWarmingUp), [`Pacing`] (leaky bucket as a
//!   queue).
//! - [`Limiter`]: one algorithm + its state (lock-free CAS for one-word states) + a clock.
//! - [`KeyedLimiter`]: a limiter per key with a hard cap on keys and O(1) eviction.
//! - [`rate`]: the one algorithm vocabulary ([`RateAlgorithm`]) and limiters chosen at run
//!   time from a [`RateSpec`] ([`KeyedRate`], [`SingleRate`]).
//! - [`cost`]: cost-aware limits — hold an estimate ([`Limiter::reserve_cost`]), settle the
//!   actual cost (refund or debt) on GCRA, the token bucket and the fixed window;
//!   [`learned`]: estimates learned from recent costs; [`log_gate`]: at most one log line per
//!   interval for input an attacker controls.
//! - [`budget`]: calendar budgets — units per day, week or month from a local time in a named
//!   time zone ([`calendar`]), hard or soft, with thresholds, settlements and counts that
//!   survive a restart.
//! - [`ConcurrencyLimiter`]: a bulkhead with an optional FIFO queue and RAII permits.
//!
//! Every module, by axis:
//!
//! - Time and answers: [`clock`], [`coarse_clock`] (one atomic load per reading),
//!   [`decision`] (the one [`Decision`]), [`error`] (typed configuration errors),
//!   [`duration`] (the one duration grammar), [`calendar`].
//! - The contract and its state: [`algorithm`] (parameters and a pure step), [`cell`] (one
//!   CAS word or a mutex), [`limiter`], [`keyed`], [`rate`], `sync` (inside the crate: the
//!   atomics loom swaps).
//! - Rate algorithms, one per module: [`fixed_window`], [`sliding_window`], [`sliding_log`],
//!   [`sliding_counter`], [`gcra`], [`token_bucket`], [`warmup`], [`pacing`].
//! - Costs and budgets: [`cost`], [`learned`], [`budget`], [`top_k`] (heavy spenders),
//!   [`log_gate`].
//! - Overload protection: [`concurrency`], [`adaptive`], [`breaker`], [`throttle`] (SRE
//!   client throttling), [`criticality`], [`retry`].
//! - Statistics and arithmetic: [`stats`] (the sliding metrics ring), [`pair_window`],
//!   [`striped`] (per-thread counters), [`divide`] (exact division by multiplication).
//! - Distributed terms: [`election`] (a leader's term).
//!
//! ```
//! use std::time::Duration;
//! use weir_core::{Gcra, Limiter, ManualClock, Quota};
//!
//! let clock = ManualClock::new(0);
//! let gcra = Gcra::new(Quota::new(10, Duration::from_secs(1)).unwrap(), 2).unwrap();
//! let limiter = Limiter::with_clock(gcra, &clock);
//! assert!(limiter.acquire(1).allowed());
//! assert!(limiter.acquire(1).allowed());
//! let denied = limiter.acquire(1);
//! assert!(!denied.allowed());
//! assert_eq!(denied.retry_after(), Some(Duration::from_millis(100)));
//! ```

#![warn(missing_docs)]

pub mod adaptive;
pub mod algorithm;
pub mod breaker;
pub mod budget;
pub mod calendar;
pub mod cell;
pub mod clock;
pub mod coarse_clock;
pub mod concurrency;
pub mod cost;
pub mod criticality;
pub mod decision;
pub mod divide;
pub mod duration;
pub mod election;
pub mod error;
pub mod fixed_window;
pub mod gcra;
pub mod keyed;
pub mod learned;
pub mod limiter;
pub mod log_gate;
pub mod pacing;
pub mod pair_window;
pub mod rate;
pub mod retry;
pub mod sliding_counter;
pub mod sliding_log;
pub mod sliding_window;
pub mod stats;
pub mod striped;
mod sync;
pub mod throttle;
pub mod token_bucket;
pub mod top_k;
pub mod warmup;

pub use algorithm::{Algorithm, Quota, Reserving};
pub use clock::{Clock, ManualClock, MonotonicClock, Nanos, SystemClock};
pub use coarse_clock::{AnyClock, ClockKind, CoarseClock};
pub use concurrency::{ConcurrencyConfig, ConcurrencyLimiter, Permit, QueueOrder};
pub use cost::{CostReservation, Settle};
pub use criticality::Criticality;
pub use decision::{Decision, Remaining};
pub use error::ConfigError;
pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use keyed::KeyedLimiter;
pub use limiter::Limiter;
pub use pacing::Pacing;
pub use rate::{KeyedRate, RateAlgorithm, RateSpec, SingleRate};
pub use sliding_counter::SlidingCounter;
pub use sliding_log::SlidingLog;
pub use sliding_window::SlidingWindow;
pub use token_bucket::TokenBucket;
pub use top_k::TopK;
pub use warmup::WarmupTokenBucket;
