//! GCRA, the generic cell rate algorithm: the leaky bucket as a meter.
//!
//! State is one word, the theoretical arrival time (TAT) of the next unit, updated by CAS. Units
//! are spaced by the emission interval T = window / limit (rounded up to a nanosecond); `burst`
//! units may arrive at once. A request of n units at `now` passes iff
//! `max(TAT, now) + n·T − now ≤ burst·T`; it then moves TAT there. In any span of one window at
//! most `burst + limit` units pass (the property tests check this).

use std::time::Duration;

use crate::algorithm::{units_to_check, Algorithm, Outcome, Quota};
use crate::cell::AtomicCell;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::sync::{fence, AtomicU64, Ordering};

/// GCRA parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    quota: Quota,
    burst: u64,
    interval: Nanos,
    tolerance: Nanos,
}

impl Gcra {
    /// A GCRA admitting `quota` on average with `burst` units at once (commonly = the limit).
    pub fn new(quota: Quota, burst: u64) -> Result<Self, ConfigError> {
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        let interval = quota.emission_interval();
        let tolerance = interval
            .checked_mul(burst)
            .filter(|t| *t <= u64::MAX / 4)
            .ok_or(ConfigError::TooLarge {
                what: "burst × emission interval (ns)",
                value: burst,
                max: (u64::MAX / 4) / interval,
            })?;
        Ok(Self {
            quota,
            burst,
            interval,
            tolerance,
        })
    }

    /// A GCRA whose burst equals its limit.
    pub fn from_quota(quota: Quota) -> Result<Self, ConfigError> {
        Self::new(quota, quota.limit())
    }

    /// Fastest rate [`Gcra::per_second`] enforces (one unit per nanosecond).
    pub const MAX_RATE: f64 = 1e9;

    /// A GCRA at a fractional `rate` in units/s (a leased share, a safe rate), precise to
    /// 1/1000 unit/s and at most [`Gcra::MAX_RATE`], letting `burst` of the rate through at
    /// once and at least two units: with one, requests arriving a little late (a scheduler's
    /// jitter) waste their slot — ten clients held at 100/s admitted 810/s in total, with two
    /// 999/s. `None` for a rate too small to admit anything (below 1/1000 unit/s, or NaN).
    pub fn per_second(rate: f64, burst: std::time::Duration) -> Option<Self> {
        let rate = rate.min(Self::MAX_RATE);
        let per_1000s = (rate * 1000.0).round();
        if per_1000s.is_nan() || per_1000s < 1.0 {
            return None;
        }
        let quota = Quota::new(per_1000s as u64, std::time::Duration::from_secs(1000)).ok()?;
        let units = (rate * burst.as_secs_f64()).ceil().max(2.0) as u64;
        Self::new(quota, units).ok()
    }

    /// Units admitted at once from idle.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Nanoseconds per unit.
    pub fn emission_interval(&self) -> Nanos {
        self.interval
    }
}

/// What GCRA's CAS step found: the outcome, the TAT it started from and the TAT after.
#[derive(Debug, Clone, Copy)]
pub struct GcraVerdict {
    outcome: Outcome,
    start: Nanos,
    end: Nanos,
}

impl Algorithm for Gcra {
    type Verdict = GcraVerdict;
    type State = u64;
    type Cell = AtomicCell;

    fn initial_state(&self, _now: Nanos) -> u64 {
        0
    }

    #[inline]
    fn step(&self, tat: &mut u64, n: u64, now: Nanos) -> GcraVerdict {
        let start = (*tat).max(now);
        let need = units_to_check(n);
        if need > self.burst {
            return GcraVerdict {
                outcome: Outcome::Never,
                start,
                end: start,
            };
        }
        // need ≤ burst, so need·T ≤ tolerance ≤ u64::MAX / 4: no overflow.
        let new_tat = start.saturating_add(need * self.interval);
        if new_tat > now.saturating_add(self.tolerance) {
            return GcraVerdict {
                outcome: Outcome::Denied,
                start,
                end: new_tat,
            };
        }
        let end = if n == 0 { start } else { new_tat };
        if n > 0 {
            *tat = end;
        }
        GcraVerdict {
            outcome: Outcome::Allowed,
            start,
            end,
        }
    }

    #[inline]
    fn finish(&self, v: GcraVerdict, _n: u64, now: Nanos) -> Decision {
        let limit = self.quota.limit();
        let horizon = now.saturating_add(self.tolerance);
        // remaining = ⌊(horizon − TAT) / T⌋, divided lazily by the decision.
        let span = |t: Nanos| horizon.saturating_sub(t);
        let d = match v.outcome {
            Outcome::Never => Decision::never(limit, 0, v.start - now),
            Outcome::Denied => Decision::deny(limit, 0, v.end - horizon, v.start - now),
            Outcome::Allowed => Decision::allow(limit, 0, v.end - now, 0),
        };
        let at = if v.outcome == Outcome::Allowed {
            v.end
        } else {
            v.start
        };
        d.with_remaining_span(span(at), self.interval)
    }

    fn is_idle(&self, tat: &u64, now: Nanos) -> bool {
        *tat <= now
    }

    fn limit(&self) -> u64 {
        self.quota.limit()
    }

    fn window(&self) -> Duration {
        self.quota.window()
    }
}

/// A GCRA whose rate and burst can change while it is in use (a cluster-quota client retunes
/// its local limiter at every lease), keeping its state (the TAT).
///
/// The parameters sit behind a sequence lock made of atomics: a decision reads them in two
/// loads of the sequence number around five relaxed loads, retrying only if a retune ran at
/// that moment; a retune (rare) takes a mutex against other retunes and bumps the sequence
/// around its stores. No allocation or reference count on the decision path, unlike swapping
/// an `Arc<Limiter>`. The TAT is one atomic word updated by CAS, as in
/// [`Limiter`](crate::limiter::Limiter).
#[derive(Debug)]
pub struct RetunableGcra {
    /// Even: the words are consistent; odd: a retune is writing them.
    seq: AtomicU64,
    /// limit, window (ns), burst, interval (ns), tolerance (ns) of the [`Gcra`] in force.
    words: [AtomicU64; 5],
    tat: AtomicCell,
    writer: parking_lot::Mutex<()>,
}

impl RetunableGcra {
    /// A limiter running `gcra` from an empty state.
    pub fn new(gcra: Gcra) -> Self {
        let w = Self::words_of(&gcra);
        Self {
            seq: AtomicU64::new(0),
            words: w.map(AtomicU64::new),
            tat: <AtomicCell as crate::cell::StateCell<u64>>::new(0),
            writer: parking_lot::Mutex::new(()),
        }
    }

    fn words_of(g: &Gcra) -> [u64; 5] {
        [
            g.quota.limit(),
            g.quota.window_nanos(),
            g.burst,
            g.interval,
            g.tolerance,
        ]
    }

    /// The parameters in force (a consistent copy, never a mix of two retunes).
    #[inline]
    pub fn gcra(&self) -> Gcra {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let w = [
                    self.words[0].load(Ordering::Relaxed),
                    self.words[1].load(Ordering::Relaxed),
                    self.words[2].load(Ordering::Relaxed),
                    self.words[3].load(Ordering::Relaxed),
                    self.words[4].load(Ordering::Relaxed),
                ];
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    // The words were stored together from a valid `Gcra` (see `retune`).
                    return Gcra {
                        quota: Quota::from_parts(w[0], w[1]),
                        burst: w[2],
                        interval: w[3],
                        tolerance: w[4],
                    };
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Runs `gcra` from now on; the TAT (what was admitted) is kept.
    pub fn retune(&self, gcra: Gcra) {
        let _one_writer = self.writer.lock();
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (word, v) in self.words.iter().zip(Self::words_of(&gcra)) {
            word.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq + 2, Ordering::Release);
    }

    /// Takes `n` units at `now`, as [`Limiter::acquire_at`](crate::limiter::Limiter::acquire_at)
    /// with the parameters in force.
    #[inline]
    pub fn acquire_at(&self, n: u64, now: Nanos) -> Decision {
        use crate::cell::StateCell;
        let gcra = self.gcra();
        let verdict = self.tat.update(|tat| gcra.step(tat, n, now));
        gcra.finish(verdict, n, now)
    }

    /// Corrects a charge of `held.estimate` units to `actual` at `now` (weir-core's `cost`
    /// model: the rest given back, only what is still ahead; an excess charged as a debt), at
    /// the rate in force.
    pub fn settle_at(&self, held: crate::cost::Held, actual: u64, now: Nanos) {
        use crate::cell::StateCell;
        use crate::cost::Settle;
        let gcra = self.gcra();
        if actual > held.estimate {
            self.tat
                .update(|tat| gcra.charge(tat, actual - held.estimate, now));
        } else if actual < held.estimate {
            self.tat
                .update(|tat| gcra.refund(tat, held.estimate - actual, held, now));
        }
    }
}

#[cfg(all(test, not(loom)))]
mod retunable_tests {
    use super::*;
    use crate::clock::MonotonicClock;
    use crate::limiter::Limiter;

    fn gcra(limit: u64, burst: u64) -> Gcra {
        Gcra::new(Quota::new(limit, Duration::from_secs(1)).unwrap(), burst).unwrap()
    }

    #[test]
    fn decides_as_a_limiter_and_keeps_its_state_across_retunes() {
        let plain = Limiter::with_clock(gcra(10, 3), MonotonicClock::new());
        let r = RetunableGcra::new(gcra(10, 3));
        for i in 0..200u64 {
            let (n, now) = (i % 3, i * 37_000_000);
            assert_eq!(r.acquire_at(n, now), plain.acquire_at(n, now), "step {i}");
        }
        // Retuned to a slower rate: what was admitted still counts.
        let r = RetunableGcra::new(gcra(10, 1));
        assert!(r.acquire_at(1, 0).allowed());
        r.retune(gcra(1, 1));
        assert!(!r.acquire_at(1, 50_000_000).allowed(), "the TAT was kept");
        assert!(r.acquire_at(1, 1_000_000_000).allowed());
        assert_eq!(r.gcra(), gcra(1, 1));
    }

    #[test]
    fn settles_costs_as_a_limiter_does() {
        use crate::cost::Held;
        let plain = Limiter::with_clock(gcra(10, 10), MonotonicClock::new());
        let r = RetunableGcra::new(gcra(10, 10));
        // 8 held, 2 used; then 5 held, 9 used (a debt): the same answers after each.
        for (estimate, actual, at) in [(8, 2, 0), (5, 9, 100_000_000)] {
            assert_eq!(r.acquire_at(estimate, at), plain.acquire_at(estimate, at));
            let held = Held {
                estimate,
                taken: at,
            };
            r.settle_at(held, actual, at + 10_000_000);
            plain.settle_held(held, actual, at + 10_000_000);
            for probe in [1, 3, 6] {
                let t = at + 20_000_000;
                assert_eq!(
                    r.acquire_at(probe, t),
                    plain.acquire_at(probe, t),
                    "{probe}"
                );
            }
        }
    }

    #[test]
    fn readers_never_see_half_a_retune() {
        let (a, b) = (gcra(10, 1), gcra(1_000_000, 500));
        let r = std::sync::Arc::new(RetunableGcra::new(a));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (r, stop) = (r.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    r.retune(if i % 2 == 0 { b } else { a });
                    i += 1;
                }
            })
        };
        for i in 0..200_000u64 {
            let g = r.gcra();
            assert!(g == a || g == b, "a mix of two parameter sets: {g:?}");
            let _ = r.acquire_at(1, i);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
    }
}
impl crate::cost::Settle for Gcra {
    fn charge(&self, tat: &mut u64, units: u64, now: Nanos) {
        crate::cost::charge_time(tat, units, self.interval, now);
    }

    fn refund(&self, tat: &mut u64, units: u64, held: crate::cost::Held, now: Nanos) {
        crate::cost::refund_time(tat, units, held, self.interval, now);
    }
}
