//! Time for every algorithm: a [`Clock`] gives monotonic nanoseconds.
//!
//! Algorithms never read the OS clock themselves; they take `now` from a clock (or an explicit
//! argument), so tests and `weir simulate` drive them on virtual time with [`ManualClock`].
//!
//! Real clocks:
//! - [`MonotonicClock`] (the default): the CPU's time-stamp counter scaled to nanoseconds (via
//!   `quanta`, which falls back to `CLOCK_MONOTONIC` when the counter is not invariant), clamped per
//!   thread so that a thread never sees time go backwards, even when it migrates between cores
//!   whose counters disagree (governor#299). See `docs/clock.md` for the measurements.
//! - [`SystemClock`]: `std::time::Instant`, slower (one vDSO call) but the OS's own guarantee.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Nanoseconds since a clock's origin. All limiter state is kept in this unit.
pub type Nanos = u64;

/// A source of monotonic time in nanoseconds since the clock's origin.
pub trait Clock: Send + Sync {
    /// The current time. Successive calls on one thread never decrease.
    fn now(&self) -> Nanos;
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

/// Wall-clock time, for what follows the civil calendar (calendar budgets, [`crate::budget`]);
/// the rate algorithms read a [`Clock`] only, which never jumps.
pub trait WallClock: Send + Sync {
    /// Nanoseconds since the Unix epoch (UTC).
    fn unix_nanos(&self) -> i128;
}

/// The operating system's wall clock (`SystemTime`). It may jump when the host's time is set.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemWallClock;

impl WallClock for SystemWallClock {
    fn unix_nanos(&self) -> i128 {
        match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => i128::try_from(d.as_nanos()).unwrap_or(i128::MAX),
            Err(e) => -i128::try_from(e.duration().as_nanos()).unwrap_or(i128::MAX),
        }
    }
}

/// A manual clock read as Unix nanoseconds (tests set it to a date).
impl WallClock for ManualClock {
    fn unix_nanos(&self) -> i128 {
        i128::from(self.now())
    }
}

impl<W: WallClock + ?Sized> WallClock for std::sync::Arc<W> {
    fn unix_nanos(&self) -> i128 {
        (**self).unix_nanos()
    }
}

/// Converts a duration to nanoseconds, saturating at `u64::MAX` (≈ 584 years).
#[inline]
pub fn duration_to_nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A clock moved by hand: for tests and simulation. Starts at 0 unless told otherwise.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A manual clock reading `start` nanoseconds.
    pub fn new(start: Nanos) -> Self {
        Self {
            now: AtomicU64::new(start),
        }
    }

    /// Moves the clock forward by `d` (saturating).
    pub fn advance(&self, d: Duration) {
        self.advance_nanos(duration_to_nanos(d));
    }

    /// Moves the clock forward by `ns` nanoseconds (saturating).
    pub fn advance_nanos(&self, ns: Nanos) {
        let _ = self
            .now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(ns))
            });
    }

    /// Sets the time; a value earlier than the current reading is ignored (time never goes back).
    pub fn set(&self, t: Nanos) {
        self.now.fetch_max(t, Ordering::AcqRel);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Nanos {
        self.now.load(Ordering::Acquire)
    }
}

/// The OS monotonic clock (`std::time::Instant`), nanoseconds since this clock was made.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A system clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Nanos {
        duration_to_nanos(self.origin.elapsed())
    }
}

struct TscBase {
    clock: quanta::Clock,
    origin_raw: u64,
    /// Whether readings must be clamped per thread (the kernel does not vouch for the TSC).
    clamp: bool,
}

/// True when the OS keeps time with the TSC itself: Linux checks at boot and while running that
/// the counters of all CPUs are synchronised and marks the TSC unstable (and switches
/// clocksource) otherwise, so then a raw TSC read never goes backwards across cores.
fn kernel_trusts_tsc() -> bool {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .map(|s| s.trim() == "tsc")
        .unwrap_or(false)
}

static TSC_BASE: OnceLock<TscBase> = OnceLock::new();

thread_local! {
    /// The highest reading this thread has seen from [`MonotonicClock`].
    static HIGH_WATER: Cell<Nanos> = const { Cell::new(0) };
}

fn tsc_base() -> &'static TscBase {
    TSC_BASE.get_or_init(|| {
        let clock = quanta::Clock::new();
        let origin_raw = clock.raw();
        let clamp = std::env::var_os("WEIR_CLOCK_CLAMP").is_some() || !kernel_trusts_tsc();
        TscBase {
            clock,
            origin_raw,
            clamp,
        }
    })
}

/// The default real clock: the time-stamp counter scaled to nanoseconds since the process's
/// first use of this clock; it never goes backwards.
///
/// - When the kernel keeps time with the TSC (Linux clocksource `tsc`), it has verified that the
///   counters of all CPUs are synchronised, and a reading is the counter read and one
///   multiply-shift.
/// - Otherwise (or with `WEIR_CLOCK_CLAMP` set) each thread also keeps the highest reading it
///   has seen and never returns less, so a thread moved to a core whose counter lags does not
///   see time go back (governor#299). When the CPU has no invariant TSC at all, `quanta` reads
///   `CLOCK_MONOTONIC` instead.
///
/// All instances share one origin, so readings from different instances are comparable. Costs
/// are in `docs/clock.md`: `Instant::now` costs about 2.5 times as much on this kind of machine.
///
/// Across threads, readings are not ordered with memory operations: the counter read is not a
/// serialising instruction, so a thread that has just seen another thread's reading (through
/// an atomic) can read a slightly smaller value (measured here: up to ~1 µs, see
/// `docs/clock.md`; governor's clock behaves the same). Fencing the read would double its cost.
/// Instead every algorithm in this crate treats a `now` earlier than its stored state as "no
/// time has passed", so such a reading can only make a decision more conservative, never admit
/// more (`tests/properties.rs` feeds every algorithm jittered, non-monotonic times).
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    origin_raw: u64,
    clamp: bool,
}

impl MonotonicClock {
    /// The process-wide TSC clock (the first call calibrates it, which takes a few milliseconds).
    pub fn new() -> Self {
        let base = tsc_base();
        Self {
            clock: base.clock.clone(),
            origin_raw: base.origin_raw,
            clamp: base.clamp,
        }
    }

    /// Whether readings are clamped per thread (see the type's documentation).
    pub fn clamps(&self) -> bool {
        self.clamp
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Nanos {
        let t = self.clock.delta_as_nanos(self.origin_raw, self.clock.raw());
        if !self.clamp {
            return t;
        }
        HIGH_WATER.with(|hw| {
            let prev = hw.get();
            if t > prev {
                hw.set(t);
                t
            } else {
                prev
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_forward() {
        let c = ManualClock::new(10);
        c.advance(Duration::from_nanos(5));
        assert_eq!(c.now(), 15);
        c.set(3);
        assert_eq!(c.now(), 15);
        c.set(100);
        assert_eq!(c.now(), 100);
        c.advance_nanos(u64::MAX);
        assert_eq!(c.now(), u64::MAX);
    }

    #[test]
    fn monotonic_clock_never_goes_back_on_a_thread_and_tracks_real_time() {
        let c = MonotonicClock::new();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut prev = c.now();
                    for _ in 0..200_000 {
                        let t = c.now();
                        assert!(t >= prev, "clock went back: {prev} -> {t}");
                        prev = t;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let sys = SystemClock::new();
        let (a, s0) = (c.now(), sys.now());
        std::thread::sleep(Duration::from_millis(50));
        let (b, s1) = (c.now(), sys.now());
        let (dt, ds) = ((b - a) as f64, (s1 - s0) as f64);
        assert!(
            (dt / ds - 1.0).abs() < 0.05,
            "tsc {dt} ns vs system {ds} ns"
        );
    }
}
