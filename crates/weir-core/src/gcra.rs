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

    fn carry(&self, from: &Self, tat: &mut u64, now: Nanos) {
        crate::algorithm::carry_time(tat, now, from.interval, self.interval);
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
        self.gcra_seq().0
    }

    /// The parameters in force and the sequence number they were read at.
    #[inline]
    fn gcra_seq(&self) -> (Gcra, u64) {
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
                    let g = Gcra {
                        quota: Quota::from_parts(w[0], w[1]),
                        burst: w[2],
                        interval: w[3],
                        tolerance: w[4],
                    };
                    return (g, before);
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Runs `gcra` from `now` on; what was admitted is kept, counted in units at the new
    /// interval ([`Algorithm::carry`]): a rate raised from a very low one admits at once.
    pub fn retune_at(&self, gcra: Gcra, now: Nanos) {
        use crate::cell::StateCell;
        let _one_writer = self.writer.lock();
        let old = self.gcra();
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (word, v) in self.words.iter().zip(Self::words_of(&gcra)) {
            word.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq + 2, Ordering::Release);
        self.tat.update(|tat| gcra.carry(&old, tat, now));
    }

    /// Takes `n` units at `now`, as [`Limiter::acquire_at`](crate::limiter::Limiter::acquire_at)
    /// with the parameters in force.
    #[inline]
    pub fn acquire_at(&self, n: u64, now: Nanos) -> Decision {
        use crate::cell::StateCell;
        let (gcra, seq) = self.gcra_seq();
        let verdict = self.tat.update(|tat| gcra.step(tat, n, now));
        if self.seq.load(Ordering::Acquire) != seq {
            self.raced(now);
        }
        gcra.finish(verdict, n, now)
    }

    /// A decision read the parameters before a retune and updated the TAT after it, possibly
    /// after the retune carried it: its units may be spaced at the old interval. The TAT is
    /// held to one burst ahead at the new parameters (at most a burst, never more, counts).
    #[cold]
    fn raced(&self, now: Nanos) {
        use crate::cell::StateCell;
        let _one_writer = self.writer.lock();
        let g = self.gcra();
        self.tat
            .update(|tat| *tat = (*tat).min(now.saturating_add(g.tolerance)));
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
        r.retune_at(gcra(1, 1), 0);
        assert!(!r.acquire_at(1, 50_000_000).allowed(), "the TAT was kept");
        assert!(r.acquire_at(1, 1_000_000_000).allowed());
        assert_eq!(r.gcra(), gcra(1, 1));
    }

    #[test]
    fn a_rate_raised_from_a_trickle_admits_at_once() {
        // 0.02/s (one unit per 50 s) with a burst of 2: two units taken put the TAT 100 s
        // ahead. Raised to 20/s a second later, the two units count as 0.1 s of the new rate.
        let slow = Gcra::per_second(0.02, Duration::ZERO).unwrap();
        let fast = Gcra::per_second(20.0, Duration::ZERO).unwrap();
        let r = RetunableGcra::new(slow);
        assert!(r.acquire_at(1, 0).allowed() && r.acquire_at(1, 0).allowed());
        assert!(!r.acquire_at(1, 1_000_000_000).allowed());
        r.retune_at(fast, 1_000_000_000);
        // 2 units ahead of 1 s at 50 ms each (the TAT at 1.1 s), burst 2: the next unit waits
        // until 1.05 s — not 100 s.
        assert!(!r.acquire_at(1, 1_000_000_000).allowed());
        let admitted = (0..20u64)
            .filter(|k| r.acquire_at(1, 1_050_000_000 + k * 50_000_000).allowed())
            .count();
        assert_eq!(admitted, 20, "20/s from 1.05 s on");
        // Lowered again: what was admitted keeps counting, at the slow interval.
        r.retune_at(slow, 2_000_000_000);
        assert!(!r.acquire_at(1, 3_000_000_000).allowed());
    }

    #[test]
    fn a_keyed_limiter_and_a_reload_carry_each_state() {
        use crate::clock::ManualClock;
        use crate::keyed::KeyedLimiter;
        let slow = Gcra::new(Quota::new(1, Duration::from_secs(3600)).unwrap(), 1).unwrap();
        let fast = gcra(100, 1);
        let clock = std::sync::Arc::new(ManualClock::new(0));
        let keyed = KeyedLimiter::with_clock(slow, 16, clock.clone()).unwrap();
        let single = Limiter::with_clock(slow, clock.clone());
        assert!(keyed.acquire("a", 1).allowed() && single.acquire(1).allowed());
        clock.advance(Duration::from_secs(1));
        assert!(!keyed.acquire("a", 1).allowed() && !single.acquire(1).allowed());
        // Raised from one an hour to 100/s: admitted within 10 ms, not in an hour.
        keyed.set_algorithm(fast);
        let single = single.retuned(fast);
        clock.advance(Duration::from_millis(10));
        assert!(
            keyed.acquire("a", 1).allowed(),
            "the keyed state was carried"
        );
        assert!(
            single.acquire(1).allowed(),
            "the limiter's state was carried"
        );
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
                    r.retune_at(if i % 2 == 0 { b } else { a }, i);
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
