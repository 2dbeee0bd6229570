//! A coarse clock: a reading is one relaxed atomic load, the time being kept by a background
//! thread that stores the monotonic clock every `resolution` (as quanta's `recent()` or a
//! kernel's coarse clocks, with the resolution chosen by the caller).
//!
//! What it costs in exactness, for every algorithm of this crate: a reading lags the true time
//! by at most the resolution plus the updater's scheduling delay, and never goes back. Every
//! algorithm is monotone in time — a later `now` is never less permissive — so a lagging
//! reading can only make a decision more conservative, never admit more: over any real-time
//! interval of length `w`, a limiter on a coarse clock admits at most what the same limiter on
//! an exact clock may admit over `w + resolution` (and, under a steady excess of requests, at
//! least what it admits over `w − resolution`). docs/clock.md has the numbers;
//! `tests/coarse_clock.rs` checks the bound on a manual clock that lags the same way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{duration_to_nanos, Clock, MonotonicClock, Nanos};
use crate::error::ConfigError;

/// Finest resolution accepted (a thread waking more often costs more than it saves).
pub const MIN_RESOLUTION: Duration = Duration::from_micros(100);
/// Coarsest resolution accepted.
pub const MAX_RESOLUTION: Duration = Duration::from_secs(1);

/// A clock read with one atomic load (see the module documentation). Clones share one
/// updater thread, which ends after the last clone is dropped (at its next tick).
#[derive(Debug, Clone)]
pub struct CoarseClock {
    now: Arc<AtomicU64>,
    resolution: Duration,
}

impl CoarseClock {
    /// A clock updated every `resolution` (from 100 µs to 1 s) by a background thread.
    pub fn new(resolution: Duration) -> Result<Self, ConfigError> {
        if !(MIN_RESOLUTION..=MAX_RESOLUTION).contains(&resolution) {
            return Err(ConfigError::Invalid(format!(
                "coarse clock resolution {resolution:?}: from {MIN_RESOLUTION:?} to {MAX_RESOLUTION:?}"
            )));
        }
        let exact = MonotonicClock::new();
        let now = Arc::new(AtomicU64::new(exact.now()));
        let weak = Arc::downgrade(&now);
        std::thread::Builder::new()
            .name("weir-coarse-clock".into())
            .spawn(move || loop {
                std::thread::sleep(resolution);
                let Some(now) = weak.upgrade() else { return };
                now.fetch_max(exact.now(), Ordering::Relaxed);
            })
            .map_err(|e| ConfigError::Invalid(format!("coarse clock thread: {e}")))?;
        Ok(Self { now, resolution })
    }

    /// How often the time is updated.
    pub fn resolution(&self) -> Duration {
        self.resolution
    }

    /// The resolution in nanoseconds.
    pub fn resolution_nanos(&self) -> Nanos {
        duration_to_nanos(self.resolution)
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> Nanos {
        self.now.load(Ordering::Relaxed)
    }
}

/// Which clock a server's limiters read, as a setting (`Copy`, comparable, cheap to pass in
/// option structs). [`ClockKind::build`] makes the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ClockKind {
    /// [`MonotonicClock`]: exact to the nanosecond (the default).
    #[default]
    Exact,
    /// [`CoarseClock`] at this resolution: one atomic load per reading, decisions up to one
    /// resolution conservative (module documentation).
    Coarse(Duration),
}

impl ClockKind {
    /// The clock. Coarse clocks of one resolution are shared process-wide (one updater thread
    /// per resolution, kept for the life of the process), so every limiter built from the same
    /// setting reads the same clock.
    pub fn build(self) -> Result<AnyClock, ConfigError> {
        Ok(match self {
            ClockKind::Exact => AnyClock::Exact(MonotonicClock::new()),
            ClockKind::Coarse(resolution) => AnyClock::Coarse(shared(resolution)?),
        })
    }
}

impl std::fmt::Display for ClockKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClockKind::Exact => f.write_str("exact"),
            ClockKind::Coarse(r) => write!(f, "coarse ({r:?})"),
        }
    }
}

/// The process-wide coarse clock of `resolution`.
fn shared(resolution: Duration) -> Result<CoarseClock, ConfigError> {
    static CLOCKS: std::sync::Mutex<Vec<CoarseClock>> = std::sync::Mutex::new(Vec::new());
    let mut clocks = CLOCKS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = clocks.iter().find(|c| c.resolution == resolution) {
        return Ok(c.clone());
    }
    let clock = CoarseClock::new(resolution)?;
    clocks.push(clock.clone());
    Ok(clock)
}

/// A clock chosen at run time ([`ClockKind::build`]): one predictable branch more per reading
/// than the clock itself.
#[derive(Debug, Clone)]
pub enum AnyClock {
    /// Exact.
    Exact(MonotonicClock),
    /// Coarse.
    Coarse(CoarseClock),
}

impl Default for AnyClock {
    fn default() -> Self {
        AnyClock::Exact(MonotonicClock::new())
    }
}

impl Clock for AnyClock {
    #[inline]
    fn now(&self) -> Nanos {
        match self {
            AnyClock::Exact(c) => c.now(),
            AnyClock::Coarse(c) => c.now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_resolution_shares_one_clock() {
        let a = ClockKind::Coarse(Duration::from_millis(3)).build().unwrap();
        let b = ClockKind::Coarse(Duration::from_millis(3)).build().unwrap();
        match (&a, &b) {
            (AnyClock::Coarse(a), AnyClock::Coarse(b)) => assert!(Arc::ptr_eq(&a.now, &b.now)),
            _ => panic!("coarse expected"),
        }
        assert!(matches!(
            ClockKind::Exact.build().unwrap(),
            AnyClock::Exact(_)
        ));
        assert!(ClockKind::Coarse(Duration::from_secs(5)).build().is_err());
        let exact = MonotonicClock::new();
        let t = a.now();
        assert!(t <= exact.now() && exact.now() - t < 1_000_000_000);
    }

    #[test]
    fn it_follows_the_monotonic_clock_within_its_resolution() {
        assert!(CoarseClock::new(Duration::from_micros(10)).is_err());
        assert!(CoarseClock::new(Duration::from_secs(2)).is_err());
        let exact = MonotonicClock::new();
        let c = CoarseClock::new(Duration::from_millis(1)).unwrap();
        let first = c.now();
        // Moves on by itself (within a generous time, whatever the machine's load).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while c.now() == first {
            assert!(std::time::Instant::now() < deadline, "never updated");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Never ahead of the exact clock, and never goes back.
        let mut last = 0;
        for _ in 0..1000 {
            let (t, e) = (c.now(), exact.now());
            assert!(t <= e && t >= last);
            last = t;
        }
        assert_eq!(c.clone().resolution(), Duration::from_millis(1));
    }
}
