//! The client side of one resource, without I/O: what to ask for, when to ask, and the local
//! limiter that enforces what was granted. A network client (or the simulator) drives it:
//!
//! 1. [`ResourceClient::acquire`] on every request: a weir-core GCRA at the rate in force —
//!    the grant while the lease lasts, the safe capacity after it expires (never 0 by
//!    accident). Lock-free: one atomic add for the demand count, then weir-core's
//!    [`RetunableGcra`] (a GCRA whose rate changes in place at each lease).
//! 2. When [`ResourceClient::due`], send [`ResourceClient::ask`] (the demand measured since
//!    the last ask, with headroom so that growth shows), then report the answer with
//!    [`ResourceClient::on_lease`] or the failure with [`ResourceClient::on_failure`].
//!    Refreshes come every refresh interval ± jitter; failed ones are retried with
//!    exponential backoff (1 s → 30 s by default) plus jitter.
//! 3. [`ResourceClient::poll`] every second or so (the driver's timer): samples the demand,
//!    makes a refresh due at once when the demand moved by more than a fifth since the last
//!    ask (at most once a second), and switches to the safe capacity once the lease has
//!    expired.
//!
//! Every switch between granted, expired and unreachable is counted ([`Counters`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use weir_core::gcra::{Gcra, RetunableGcra};
use weir_core::{Criticality, Decision, Nanos, Quota};

use crate::lease::{Ask, Lease};

/// How a client estimates its demand and retries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientConfig {
    /// `wants` = measured rate × this (≥ 1), so a growing client asks for more than it used.
    pub headroom: f64,
    /// Added to `wants` (units/s), so a client held at 0 can still be seen wanting.
    pub min_wants: f64,
    /// Refresh times vary by ± this fraction of the interval.
    pub jitter: f64,
    /// First retry delay after a failed refresh.
    pub min_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
    /// The local limiter lets this much time's worth of the rate through at once, and at
    /// least two units: with a burst of one, requests arriving a little late (a scheduler's
    /// jitter) waste the slot, and a client held at 100/s admitted only ≈ 81/s.
    pub burst: Duration,
    /// Weight sent with each ask.
    pub weight: f64,
    /// Priority sent with each ask.
    pub priority: Criticality,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            headroom: 1.2,
            min_wants: 1.0,
            jitter: 0.1,
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            burst: Duration::from_millis(10),
            weight: 1.0,
            priority: Criticality::Critical,
        }
    }
}

/// Where the rate in force comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A lease from the server, unexpired.
    Granted,
    /// The lease expired (or none was ever had): the safe capacity.
    Safe,
}

/// Transitions, for logs and metrics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Leases received.
    pub leases: AtomicU64,
    /// Refreshes that failed.
    pub failures: AtomicU64,
    /// Switches to the safe capacity (a lease expired without a refresh).
    pub expirations: AtomicU64,
}

/// The refresh schedule and what was last granted.
struct Control {
    granted: f64,
    expires_at: Nanos,
    safe: f64,
    source: Source,
    next_at: Nanos,
    failures: u32,
    /// (time, demand count) samples, at least a second apart, newest last: the demand rate
    /// is measured over the most recent second or more, so a shift shows at the next ask.
    samples: [(Nanos, u64); 2],
    /// `wants` of the last ask, and when it was sent.
    last_wants: f64,
    last_ask_at: Option<Nanos>,
    rng: crate::rng::Rng,
    /// The id of the last lease (proof of holding it, sent back with each ask).
    lease_id: u64,
}

/// One resource as a client sees it (see the module documentation).
pub struct ResourceClient {
    name: String,
    config: ClientConfig,
    demand: AtomicU64,
    /// The local limiter at the rate in force (retuned in place at each lease).
    limiter: RetunableGcra,
    /// The rate in force, as f64 bits; 0 while it admits nothing (a grant of 0).
    rate: AtomicU64,
    /// The grant in force lapses then (`Nanos::MAX` on the safe capacity): a decision at or
    /// after it switches to the safe capacity first, so a lapsed grant is never used, however
    /// late the next poll.
    lapses_at: AtomicU64,
    control: Mutex<Control>,
    counters: Counters,
}

impl ResourceClient {
    /// A client of resource `name` at `now`, enforcing `safe` units/s until its first lease
    /// (the operator's fallback when the server has never been reached); the first refresh is
    /// due at once. `seed` varies the jitter between clients.
    pub fn new(name: &str, config: ClientConfig, safe: f64, seed: u64, now: Nanos) -> Self {
        let gcra = Gcra::per_second(safe, config.burst);
        let placeholder = Gcra::per_second(1.0, config.burst);
        Self {
            name: name.to_string(),
            config,
            demand: AtomicU64::new(0),
            limiter: RetunableGcra::new(gcra.or(placeholder).unwrap_or_else(unreachable_gcra)),
            rate: AtomicU64::new(if gcra.is_some() { safe } else { 0.0 }.to_bits()),
            lapses_at: AtomicU64::new(Nanos::MAX),
            control: Mutex::new(Control {
                granted: 0.0,
                expires_at: 0,
                safe,
                source: Source::Safe,
                next_at: now,
                failures: 0,
                samples: [(now, 0); 2],
                last_wants: 0.0,
                last_ask_at: None,
                rng: crate::rng::Rng::new(seed),
                lease_id: 0,
            }),
            counters: Counters::default(),
        }
    }

    /// The resource's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The transition counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Takes `n` units at `now` under the rate in force.
    #[inline]
    pub fn acquire(&self, n: u64, now: Nanos) -> Decision {
        self.demand.fetch_add(n, Ordering::Relaxed);
        if now >= self.lapses_at.load(Ordering::Acquire) {
            self.lapse(now);
        }
        if self.rate.load(Ordering::Acquire) == 0 {
            return Decision::never(0, 0, 0);
        }
        self.limiter.acquire_at(n, now)
    }

    /// Corrects `held` (a charge of `acquire`, units being costs) to `actual` at `now`: the
    /// rest given back to the local limiter, an excess charged as a debt. The demand reported
    /// to the server (estimates asked for) grows by an excess too, so a client whose calls
    /// cost more than their estimates asks for more; a refund leaves it (the estimates were
    /// what admission needed).
    pub fn settle(&self, held: weir_core::cost::Held, actual: u64, now: Nanos) {
        if actual > held.estimate {
            self.demand
                .fetch_add(actual - held.estimate, Ordering::Relaxed);
        }
        self.limiter.settle_at(held, actual, now);
    }

    /// The rate enforced now (units/s) and where it comes from.
    pub fn rate(&self) -> (f64, Source) {
        let c = self.control.lock().unwrap_or_else(|e| e.into_inner());
        (f64::from_bits(self.rate.load(Ordering::Relaxed)), c.source)
    }

    /// Whether a refresh should be sent at `now`.
    pub fn due(&self, now: Nanos) -> bool {
        now >= self.control().next_at
    }

    /// When the next refresh is due.
    pub fn next_refresh_at(&self) -> Nanos {
        self.control().next_at
    }

    fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the demand count at `now` (at most one sample a second; [`Self::poll`] and
    /// [`Self::ask`] call it).
    fn sample(&self, c: &mut Control, now: Nanos) {
        let demand = self.demand.load(Ordering::Relaxed);
        if now.saturating_sub(c.samples[1].0) >= 1_000_000_000 {
            c.samples = [c.samples[1], (now, demand)];
        }
    }

    /// The ask to send at `now`: the demand rate (units requested, admitted or not) over the
    /// most recent second or two — needed — with headroom wanted above it, and what is held.
    pub fn ask(&self, now: Nanos) -> Ask {
        let mut c = self.control();
        self.sample(&mut c, now);
        let measured = self.measured(&c, now);
        let wants = measured * self.config.headroom + self.config.min_wants;
        c.last_wants = wants;
        c.last_ask_at = Some(now);
        let has = if c.source == Source::Granted && now < c.expires_at {
            c.granted
        } else {
            0.0
        };
        Ask {
            // The headroom above the measured rate comes only from capacity nobody needs.
            needs: Some(measured.min(wants)),
            wants,
            has,
            safe: c.safe,
            weight: self.config.weight,
            priority: self.config.priority,
            lease_id: c.lease_id,
            holds: None,
            term: 0,
        }
    }

    /// The id of the lease last granted (0: none yet), to send with a release.
    pub fn lease_id(&self) -> u64 {
        self.control().lease_id
    }

    /// The demand rate (units/s) over the most recent second or two before `now`; 0 before
    /// anything was measured.
    fn measured(&self, c: &Control, now: Nanos) -> f64 {
        let demand = self.demand.load(Ordering::Relaxed);
        let (t0, d0) = if now.saturating_sub(c.samples[1].0) >= 500_000_000 {
            c.samples[1]
        } else {
            c.samples[0]
        };
        let elapsed = now.saturating_sub(t0);
        if elapsed > 0 {
            demand.saturating_sub(d0) as f64 / (elapsed as f64 / 1_000_000_000.0)
        } else {
            0.0
        }
    }

    /// A uniform draw in [1 − jitter, 1 + jitter].
    fn jittered(c: &mut Control, jitter: f64, d: Duration) -> Nanos {
        let u = c.rng.unit();
        (d.as_nanos() as f64 * (1.0 - jitter + 2.0 * jitter * u)) as Nanos
    }

    /// The server answered at `now` with `lease`. A learning server that grants nothing does
    /// not replace the safe capacity of a client that holds no lease (it would drop to nothing
    /// until the server knows every client); any grant it makes is a share counted against
    /// the capacity, and replaces the safe capacity.
    pub fn on_lease(&self, lease: Lease, now: Nanos) {
        let mut c = self.control();
        c.lease_id = lease.lease_id;
        if lease.learning && c.source == Source::Safe && lease.granted == 0.0 {
            let wait = Self::jittered(&mut c, self.config.jitter, lease.refresh);
            c.next_at = now.saturating_add(wait);
            c.failures = 0;
            return;
        }
        c.granted = lease.granted;
        c.expires_at = lease.expires_at;
        c.safe = lease.safe_capacity;
        c.source = Source::Granted;
        c.failures = 0;
        self.lapses_at.store(lease.expires_at, Ordering::Release);
        // The first asks go out before a second of demand was measured: ask again after one.
        let measured_span = now.saturating_sub(c.samples[0].0);
        let refresh = if measured_span < 2_000_000_000 {
            lease.refresh.min(Duration::from_secs(1))
        } else {
            lease.refresh
        };
        let wait = Self::jittered(&mut c, self.config.jitter, refresh);
        c.next_at = now.saturating_add(wait);
        self.enforce(lease.granted, now);
        self.counters.leases.fetch_add(1, Ordering::Relaxed);
    }

    /// A refresh failed at `now` (unreachable, refused): retry with backoff; the lease in hand
    /// stays in force until it expires.
    pub fn on_failure(&self, now: Nanos) {
        let mut c = self.control();
        c.failures = c.failures.saturating_add(1);
        let doubling = 2u32.saturating_pow(c.failures - 1).min(1 << 16);
        let backoff = self
            .config
            .min_backoff
            .saturating_mul(doubling)
            .min(self.config.max_backoff);
        let wait = Self::jittered(&mut c, self.config.jitter, backoff);
        c.next_at = now.saturating_add(wait);
        self.counters.failures.fetch_add(1, Ordering::Relaxed);
        drop(c);
        self.poll(now);
    }

    /// Switches to the safe capacity if the lease has expired at `now`; answers the source in
    /// force.
    pub fn poll(&self, now: Nanos) -> Source {
        let mut c = self.control();
        self.sample(&mut c, now);
        // Demand moved by more than a fifth since the last ask: ask now (at most once a
        // second), instead of waiting out the refresh interval.
        if let Some(at) = c.last_ask_at {
            let wants = self.measured(&c, now) * self.config.headroom + self.config.min_wants;
            let moved = (wants - c.last_wants).abs() > 0.2 * c.last_wants + self.config.min_wants;
            if moved && now.saturating_sub(at) >= 1_000_000_000 && c.failures == 0 {
                c.next_at = c.next_at.min(now);
            }
        }
        if c.source == Source::Granted && now >= c.expires_at {
            drop(c);
            self.lapse(now);
            return Source::Safe;
        }
        c.source
    }

    /// The grant lapsed at `now` (if it still is in force): the safe capacity from now on.
    #[cold]
    fn lapse(&self, now: Nanos) {
        let mut c = self.control();
        if c.source == Source::Granted && now >= c.expires_at {
            c.source = Source::Safe;
            let safe = c.safe;
            self.lapses_at.store(Nanos::MAX, Ordering::Release);
            drop(c);
            self.enforce(safe, now);
            self.counters.expirations.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn enforce(&self, rate: f64, now: Nanos) {
        let current = f64::from_bits(self.rate.load(Ordering::Relaxed));
        if (current - rate).abs() <= f64::EPSILON * rate.abs().max(1.0) {
            return;
        }
        match Gcra::per_second(rate, self.config.burst) {
            Some(g) => {
                self.limiter.retune_at(g, now);
                self.rate.store(rate.to_bits(), Ordering::Release);
            }
            None => self.rate.store(0.0f64.to_bits(), Ordering::Release),
        }
    }
}

/// One unit per second: the limiter's parameters while the rate in force admits nothing
/// (never consulted then; valid by construction).
fn unreachable_gcra() -> Gcra {
    Gcra::from_quota(Quota::per_second(1).expect("1 per second is a valid quota"))
        .expect("a burst of one is valid")
}

impl std::fmt::Debug for ResourceClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (rate, source) = self.rate();
        f.debug_struct("ResourceClient")
            .field("name", &self.name)
            .field("rate", &rate)
            .field("source", &source)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn lease(granted: f64, now: Nanos) -> Lease {
        Lease {
            granted,
            expires_at: now + 30 * S,
            refresh: Duration::from_secs(5),
            safe_capacity: 2.0,
            learning: false,
            lease_id: 7,
        }
    }

    /// Units admitted out of `n` one-unit requests spread evenly over `secs` from `from`.
    fn admitted(c: &ResourceClient, from: Nanos, secs: u64, n: u64) -> u64 {
        (0..n)
            .filter(|i| c.acquire(1, from + secs * S * i / n).allowed())
            .count() as u64
    }

    /// Units are costs: an estimate held, then settled — the rest back to the local limiter,
    /// an excess a debt, and the demand asked for grows by the excess.
    #[test]
    fn costs_settle_on_the_local_limiter() {
        use weir_core::cost::Held;
        let config = ClientConfig {
            burst: Duration::from_secs(1),
            ..ClientConfig::default()
        };
        let c = ResourceClient::new("r", config, 5.0, 7, 0);
        c.on_lease(lease(100.0, 0), 0);
        // 100/s with a second's burst: 80 held, 20 left.
        assert!(c.acquire(80, 0).allowed());
        assert!(!c.acquire(30, 0).allowed());
        c.settle(
            Held {
                estimate: 80,
                taken: 0,
            },
            10,
            0,
        );
        assert!(c.acquire(80, 0).allowed(), "70 given back");
        // 90 held, used 150: a debt of 60 is waited out.
        c.settle(
            Held {
                estimate: 80,
                taken: 0,
            },
            140,
            0,
        );
        assert!(!c.acquire(1, S / 2).allowed());
        assert!(c.acquire(1, S).allowed());
        let before = c.demand.load(Ordering::Relaxed);
        c.settle(
            Held {
                estimate: 1,
                taken: S,
            },
            41,
            S,
        );
        assert_eq!(c.demand.load(Ordering::Relaxed), before + 40);
    }

    #[test]
    fn the_grant_is_enforced_then_the_safe_capacity_after_expiry() {
        let c = ResourceClient::new("r", ClientConfig::default(), 5.0, 7, 0);
        assert!(c.due(0));
        // Before any lease: the safe capacity given at start.
        assert_eq!(c.rate(), (5.0, Source::Safe));
        c.on_lease(lease(100.0, S), S);
        assert_eq!(c.rate(), (100.0, Source::Granted));
        let a = admitted(&c, 2 * S, 10, 5_000);
        assert!(
            (995..=1_006).contains(&a),
            "{a} admitted at 100/s over 10 s"
        );
        // The server is gone: the lease holds until it expires, then 2/s (its safe capacity).
        c.on_failure(20 * S);
        assert_eq!(c.poll(30 * S), Source::Granted);
        assert_eq!(c.poll(31 * S), Source::Safe);
        assert_eq!(c.rate(), (2.0, Source::Safe));
        let a = admitted(&c, 40 * S, 10, 1_000);
        assert!((19..=22).contains(&a), "{a} admitted at 2/s over 10 s");
        assert_eq!(c.counters().expirations.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn refreshes_are_jittered_and_failures_back_off() {
        let c = ResourceClient::new("r", ClientConfig::default(), 1.0, 42, 0);
        // The first lease comes before a second of demand was measured: ask again after ~1 s.
        c.on_lease(lease(10.0, 0), 0);
        let next = c.next_refresh_at();
        assert!((900_000_000..=1_100_000_000).contains(&next), "{next}");
        // Later ones: the refresh interval (5 s) ± 10 %.
        c.on_lease(lease(10.0, 10 * S), 10 * S);
        let next = c.next_refresh_at() - 10 * S;
        assert!((4_500_000_000..=5_500_000_000).contains(&next), "{next}");
        let mut now = 10 * S + next;
        let mut waits = Vec::new();
        for _ in 0..8 {
            c.on_failure(now);
            let at = c.next_refresh_at();
            waits.push((at - now) as f64 / S as f64);
            now = at;
        }
        // 1, 2, 4, 8, 16, 30, 30, 30 s, each ± 10 %.
        for (w, want) in waits
            .iter()
            .zip([1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0])
        {
            assert!((w - want).abs() <= want * 0.1 + 1e-9, "{waits:?}");
        }
        c.on_lease(lease(10.0, now), now);
        assert!(c.next_refresh_at() - now <= 5_500_000_000, "backoff reset");
    }

    #[test]
    fn asks_follow_the_recent_demand_with_headroom() {
        let c = ResourceClient::new("r", ClientConfig::default(), 1000.0, 1, 0);
        // 100/s for 5 s, polled every second as a driver does.
        for i in 0..500 {
            c.acquire(1, i * S / 100);
            if i % 100 == 99 {
                c.poll((i + 1) * S / 100);
            }
        }
        let a = c.ask(5 * S);
        assert!((a.wants - 121.0).abs() < 1e-6, "100/s × 1.2 + 1: {a:?}");
        assert_eq!(a.has, 0.0);
        c.on_lease(lease(80.0, 5 * S), 5 * S);
        // 300/s from then on: the next ask sees it, not an average with the past.
        for i in 0..600 {
            c.acquire(1, 5 * S + i * S / 300);
            if i % 300 == 299 {
                c.poll(5 * S + (i + 1) * S / 300);
            }
        }
        let a = c.ask(7 * S);
        assert!((a.wants - 361.0).abs() < 1e-6, "300/s × 1.2 + 1: {a:?}");
        assert_eq!(a.has, 80.0);
    }

    #[test]
    fn a_learning_server_does_not_take_the_safe_capacity_away() {
        let c = ResourceClient::new("r", ClientConfig::default(), 10.0, 3, 0);
        c.on_lease(
            Lease {
                learning: true,
                ..lease(0.0, 0)
            },
            0,
        );
        assert_eq!(c.rate(), (10.0, Source::Safe));
        // Once it grants, the grant rules.
        c.on_lease(lease(4.0, S), S);
        assert_eq!(c.rate(), (4.0, Source::Granted));
    }

    #[test]
    fn a_huge_grant_is_enforced_at_the_fastest_rate_never_as_zero() {
        let c = ResourceClient::new("r", ClientConfig::default(), 1.0, 3, 0);
        c.on_lease(lease(1e15, 0), 0);
        assert!((0..1_000u64).all(|i| c.acquire(1, S + i * 1_000).allowed()));
    }

    #[test]
    fn a_zero_grant_denies_and_a_new_rate_keeps_the_limiter_state() {
        let c = ResourceClient::new("r", ClientConfig::default(), 10.0, 3, 0);
        c.on_lease(lease(0.0, 0), 0);
        assert!(!c.acquire(1, S).allowed());
        c.on_lease(lease(1.0, S), S);
        assert!(c.acquire(1, 2 * S).allowed());
        assert!(c.acquire(1, 2 * S).allowed());
        assert!(!c.acquire(1, 2 * S).allowed(), "1/s with a burst of 2");
    }
}
