//! Cost-aware limits: hold an estimate against a limit, settle what the work cost.
//!
//! A request whose cost is known only at its end (an LLM call's tokens, a query's rows) asks
//! for its **estimate** up front ([`Limiter::reserve_cost`]): admitted only if the estimate
//! fits, so concurrent requests cannot overrun the limit on the strength of costs nobody has
//! counted yet. When the cost is known, [`CostReservation::settle`] charges the difference:
//!
//! - actual < estimate: the rest is given back ([`Settle::refund`]) whenever the work ends,
//!   unless the limiter is already full (it never holds more than its burst); a fixed window
//!   that ended has nothing to give back;
//! - actual > estimate: the excess is charged whatever the limit ([`Settle::charge`]): a
//!   debt later requests wait out, never a negative count that admits more;
//! - [`CostReservation::cancel`]: everything back (the work failed before it cost anything).
//!
//! A reservation dropped unsettled keeps its estimate charged.
//!
//! ```
//! use std::time::Duration;
//! use weir_core::{Gcra, Limiter, ManualClock, Quota};
//!
//! // 10 000 tokens per minute, at most 2 000 at once.
//! let clock = ManualClock::new(0);
//! let quota = Quota::new(10_000, Duration::from_secs(60)).unwrap();
//! let tokens = Limiter::with_clock(Gcra::new(quota, 2_000).unwrap(), &clock);
//! let call = tokens.reserve_cost(1_500).unwrap(); // the request's max_tokens
//! assert!(tokens.reserve_cost(1_000).is_err()); // 500 left of the burst
//! call.settle(200); // its usage: 1 300 given back
//! assert!(tokens.reserve_cost(1_000).is_ok());
//! ```
//!
//! **Bound.** Count each unit when it is charged: estimates when admitted, excesses when
//! settled, less refunds. From any moment `t0` the limiter was full (for GCRA and the token
//! bucket), the units charged since, net of refunds, are at most `burst + rate × (t − t0)`
//! plus the excesses settled since — admissions fit the algorithm's own bound, a refund frees
//! no more than it took, and a full limiter takes none. Equivalently, the tokens the calls
//! admitted since `t0` actually cost (their actual costs, and the estimates of those still
//! running) are at most `burst + rate × (t − t0)` plus the excesses settled since, plus the
//! refunds since of calls admitted before `t0` (their room was charged before). The same holds
//! over any window `[t1, t)` whether or not the limiter was full at `t1`: what the window's
//! calls cost is at most `burst + rate × (t − t1)` + the window's excesses + the estimates
//! outstanding at `t1`. A fixed window: `limit` per aligned window, plus its excesses (its
//! refunds come only from calls of the same window). With one request in flight per key the
//! excess is one call's; with `c` in flight at most `c` excesses. `tests/cost.rs` checks these
//! on random timelines with calls lasting from 1 ms to 100 × (estimate ÷ rate).

use crate::algorithm::Algorithm;
use crate::cell::StateCell;
use crate::clock::{Clock, Nanos};
use crate::decision::Decision;
use crate::keyed::KeyedLimiter;
use crate::limiter::Limiter;

use std::borrow::Borrow;
use std::hash::Hash;

/// Algorithms whose charges can be corrected after the fact.
pub trait Settle: Algorithm {
    /// Charges `units` at `now` whatever the state: the excess of an actual cost over its
    /// estimate. Past the limit it is a debt later requests wait out.
    fn charge(&self, state: &mut Self::State, units: u64, now: Nanos);

    /// Gives back `units` of `charge`: what the request did not use, whenever it ends. Never
    /// more than the charge, never past a full state (a limiter holds at most its burst), and
    /// nothing from a window that ended.
    fn refund(&self, state: &mut Self::State, units: u64, charge: Held, now: Nanos);
}

/// A charge a reservation holds: its estimate, taken at `taken`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Units charged.
    pub estimate: u64,
    /// When (the limiter's clock base).
    pub taken: Nanos,
}

impl Held {
    /// The charge of `estimate` at `taken` when `decision` admitted it; else the refusal.
    pub fn admitted(decision: Decision, estimate: u64, taken: Nanos) -> Result<Self, Decision> {
        if decision.allowed() {
            Ok(Self { estimate, taken })
        } else {
            Err(decision)
        }
    }
}

/// An estimate held against a [`Limiter`]: [`CostReservation::settle`] it with the actual
/// cost, or [`CostReservation::cancel`] it. Dropped unsettled, the estimate stays charged.
#[must_use = "settle the reservation with the actual cost (dropping it keeps the estimate)"]
pub struct CostReservation<'a, A: Settle, C: Clock> {
    limiter: &'a Limiter<A, C>,
    estimate: u64,
    taken: Nanos,
    decision: Decision,
}

impl<A: Settle, C: Clock> CostReservation<'_, A, C> {
    /// The admission's decision (remaining, reset as of the reservation).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The estimate held.
    pub fn estimate(&self) -> u64 {
        self.estimate
    }

    /// Charges `actual` instead of the estimate, now.
    pub fn settle(self, actual: u64) {
        let now = self.limiter.clock().now();
        self.settle_at(actual, now);
    }

    /// [`CostReservation::settle`] at an explicit time (the limiter's clock base).
    pub fn settle_at(self, actual: u64, now: Nanos) {
        let held = Held {
            estimate: self.estimate,
            taken: self.taken,
        };
        self.limiter.settle_held(held, actual, now);
    }

    /// Gives the whole estimate back (the work failed before it cost anything).
    pub fn cancel(self) {
        let now = self.limiter.clock().now();
        self.settle_at(0, now);
    }
}

impl<A: Settle, C: Clock> Limiter<A, C> {
    /// Holds `estimate` units now: a reservation to settle with the actual cost, or the
    /// refusal (the estimate does not fit).
    pub fn reserve_cost(&self, estimate: u64) -> Result<CostReservation<'_, A, C>, Decision> {
        self.reserve_cost_at(estimate, self.clock().now())
    }

    /// [`Limiter::reserve_cost`] at an explicit time.
    pub fn reserve_cost_at(
        &self,
        estimate: u64,
        now: Nanos,
    ) -> Result<CostReservation<'_, A, C>, Decision> {
        let decision = self.acquire_at(estimate, now);
        if !decision.allowed() {
            return Err(decision);
        }
        Ok(CostReservation {
            limiter: self,
            estimate,
            taken: now,
            decision,
        })
    }

    /// Corrects `held` to `actual` at `now` (what [`CostReservation::settle_at`] does, for a
    /// caller that keeps the charge itself, e.g. across an await point without a borrow).
    pub fn settle_held(&self, held: Held, actual: u64, now: Nanos) {
        let algorithm = self.algorithm();
        if actual > held.estimate {
            let excess = actual - held.estimate;
            self.cell()
                .update(|state| algorithm.charge(state, excess, now));
        } else if actual < held.estimate {
            let unused = held.estimate - actual;
            self.cell()
                .update(|state| algorithm.refund(state, unused, held, now));
        }
    }
}

impl<K, A, C> KeyedLimiter<K, A, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Settle + Clone,
    C: Clock,
{
    /// Holds `estimate` units for `key` at `now`: the charge to settle with
    /// [`KeyedLimiter::settle_at`], or the refusal.
    pub fn reserve_cost_at<Q>(&self, key: &Q, estimate: u64, now: Nanos) -> Result<Held, Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        Held::admitted(self.acquire_at(key, estimate, now), estimate, now)
    }

    /// Corrects `key`'s charge `held` to `actual` at `now`: an excess is charged (the key
    /// stored if it was evicted meanwhile, evicting another if need be), a refund given back
    /// only to a key still tracked.
    pub fn settle_at<Q>(&self, key: &Q, held: Held, actual: u64, now: Nanos)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if actual > held.estimate {
            let excess = actual - held.estimate;
            let _ = self.on_state(key, now, true, |a, state| a.charge(state, excess, now));
        } else if actual < held.estimate {
            let unused = held.estimate - actual;
            // A fresh state has nothing to give back: the refund never stores a key.
            let _ = self.on_state(key, now, false, |a, state| {
                a.refund(state, unused, held, now)
            });
        }
    }
}

/// Charges `units` to a "next free time" state (GCRA's TAT, the token bucket's full time):
/// `interval` each, from `now` at the earliest; at most a quarter of the clock's range ahead.
pub(crate) fn charge_time(state: &mut u64, units: u64, interval: Nanos, now: Nanos) {
    let span = units.saturating_mul(interval).min(u64::MAX / 4);
    *state = (*state)
        .max(now)
        .saturating_add(span)
        .min(now.saturating_add(u64::MAX / 4));
}

/// Refunds `units` of `held` (at most its estimate) to a "next free time" state: the time
/// they took is given back whenever the call ends — a call that ran for minutes gives back what
/// it did not use as one that ran for milliseconds — but never past `now`: a limiter already
/// full (its state at or before `now`) stays full, it never holds more than its burst.
pub(crate) fn refund_time(state: &mut u64, units: u64, held: Held, interval: Nanos, now: Nanos) {
    if *state > now {
        let span = units.min(held.estimate).saturating_mul(interval);
        *state = state.saturating_sub(span).max(now);
    }
}
