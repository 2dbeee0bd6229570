//! Retries that cannot multiply an outage: exponential backoff with jitter, honouring a
//! server's `Retry-After`, and a retry budget; with the `tokio` feature, an async [`retry`]
//! helper combining both with a classifier of retryable outcomes.
//!
//! Defaults are gRPC's connection backoff: 1 s initial, × 1.6 per attempt, ± 20 % jitter,
//! at most 120 s. Full jitter (uniform in [0, d]) and decorrelated jitter
//! (uniform in [initial, 3 × previous], capped) are options.

use std::time::Duration;

use crate::clock::Nanos;
use crate::error::ConfigError;
use crate::pair_window::PairWindow;

/// How the delay is randomised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// `d × (1 ± fraction)`, uniformly (gRPC: 0.2).
    Proportional(f64),
    /// Uniform in `[0, d]` (AWS "full jitter").
    Full,
    /// Uniform in `[initial, 3 × previous delay]`, capped (AWS "decorrelated jitter").
    Decorrelated,
    /// No randomness.
    None,
}

/// Exponential backoff parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay before the first retry (before jitter).
    pub initial: Duration,
    /// Growth per attempt.
    pub multiplier: f64,
    /// Largest delay.
    pub max: Duration,
    /// Randomisation.
    pub jitter: Jitter,
}

impl Default for Backoff {
    /// gRPC's: 1 s, × 1.6, ± 20 %, max 120 s.
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            multiplier: 1.6,
            max: Duration::from_secs(120),
            jitter: Jitter::Proportional(0.2),
        }
    }
}

impl Backoff {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return bad(format!(
                "backoff multiplier must be ≥ 1, got {}",
                self.multiplier
            ));
        }
        if self.initial.is_zero() || self.max < self.initial {
            return bad("backoff needs 0 < initial ≤ max".into());
        }
        if let Jitter::Proportional(f) = self.jitter {
            if !(0.0..1.0).contains(&f) {
                return bad(format!("jitter fraction must be in [0, 1), got {f}"));
            }
        }
        Ok(())
    }

    /// The delays of one retry sequence, drawn from a generator seeded with `seed`.
    pub fn delays(&self, seed: u64) -> Delays {
        Delays {
            backoff: *self,
            attempt: 0,
            previous: self.initial,
            rng: SplitMix64(seed),
        }
    }
}

/// Successive backoff delays (an infinite iterator).
#[derive(Debug, Clone)]
pub struct Delays {
    backoff: Backoff,
    attempt: u32,
    previous: Duration,
    rng: SplitMix64,
}

impl Delays {
    /// The next delay, at least `retry_after` when the server gave one (a server's `Retry-After`
    /// is a floor, never shortened by jitter).
    pub fn next_with(&mut self, retry_after: Option<Duration>) -> Duration {
        let b = &self.backoff;
        let base = b.initial.as_secs_f64() * b.multiplier.powi(self.attempt.min(1000) as i32);
        let base = base.min(b.max.as_secs_f64());
        let u = self.rng.next_f64();
        let secs = match b.jitter {
            Jitter::Proportional(f) => base * (1.0 - f + 2.0 * f * u),
            Jitter::Full => base * u,
            Jitter::Decorrelated => {
                let lo = b.initial.as_secs_f64();
                let hi = (self.previous.as_secs_f64() * 3.0).max(lo);
                lo + (hi - lo) * u
            }
            Jitter::None => base,
        };
        let d = Duration::from_secs_f64(secs.clamp(0.0, b.max.as_secs_f64()));
        self.attempt = self.attempt.saturating_add(1);
        self.previous = d;
        d.max(retry_after.unwrap_or(Duration::ZERO))
    }
}

impl Iterator for Delays {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.next_with(None))
    }
}

/// A small, seedable generator (SplitMix64) so retry timing is reproducible in tests.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Retries ≤ `ratio` × requests over a sliding window, plus `min_per_second` (so a service with
/// little traffic can still retry). Sheds retries, never first attempts.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    min_per_second: f64,
    /// (requests, retries) per bucket.
    counts: PairWindow,
}

impl RetryBudget {
    /// Default window 10 s, 10 buckets.
    pub fn new(ratio: f64, min_per_second: f64) -> Result<Self, ConfigError> {
        Self::with_window(ratio, min_per_second, Duration::from_secs(10), 10)
    }

    /// A budget over `window` split into `buckets`.
    pub fn with_window(
        ratio: f64,
        min_per_second: f64,
        window: Duration,
        buckets: u32,
    ) -> Result<Self, ConfigError> {
        if !(ratio.is_finite()
            && ratio >= 0.0
            && min_per_second.is_finite()
            && min_per_second >= 0.0)
        {
            return Err(ConfigError::Invalid(format!(
                "retry budget ratio and minimum must be finite and ≥ 0, got {ratio}, {min_per_second}"
            )));
        }
        Ok(Self {
            ratio,
            min_per_second,
            counts: PairWindow::new(window, buckets)?,
        })
    }

    /// Records a first attempt.
    pub fn record_request(&self, now: Nanos) {
        self.counts.add(now, 1, 0);
    }

    /// Takes permission for one retry: true (and counted) if the budget allows it.
    pub fn try_retry(&self, now: Nanos) -> bool {
        let window_secs = self.counts.window().as_secs_f64();
        self.counts.add_if(now, |requests, retries| {
            let allowed = self.ratio * requests as f64 + self.min_per_second * window_secs;
            ((retries as f64) < allowed.floor()).then_some((0, 1))
        })
    }
}

/// What a classifier says about an attempt's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryVerdict {
    /// Return this result.
    Done,
    /// Retry; the server may have said when (`Retry-After`).
    Retry(Option<Duration>),
}

/// How many attempts and how to space them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Total attempts including the first (Resilience4j's default: 3).
    pub max_attempts: u32,
    /// Spacing.
    pub backoff: Backoff,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            backoff: Backoff::default(),
        }
    }
}

/// Runs `op` until the classifier says done, attempts run out, or the budget refuses a retry;
/// returns the last result. Sleeps the backoff (or the server's `Retry-After` if longer)
/// between attempts on tokio's timer; the budget reads `clock`.
#[cfg(feature = "tokio")]
pub async fn retry<T, E, F, Fut>(
    policy: &RetryPolicy,
    budget: Option<&RetryBudget>,
    clock: &impl crate::clock::Clock,
    seed: u64,
    mut op: F,
    classify: impl Fn(&Result<T, E>) -> RetryVerdict,
) -> Result<T, E>
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut delays = policy.backoff.delays(seed);
    if let Some(b) = budget {
        b.record_request(clock.now());
    }
    let mut attempt = 1;
    loop {
        let result = op(attempt).await;
        let RetryVerdict::Retry(after) = classify(&result) else {
            return result;
        };
        if attempt >= policy.max_attempts {
            return result;
        }
        if let Some(b) = budget {
            if !b.try_retry(clock.now()) {
                return result;
            }
        }
        tokio::time::sleep(delays.next_with(after)).await;
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_defaults_grow_by_1_6_within_20_percent_up_to_120s() {
        let mut d = Backoff::default().delays(7);
        let mut base = 1.0f64;
        for _ in 0..20 {
            let got = d.next().unwrap().as_secs_f64();
            let b = base.min(120.0);
            assert!(
                got >= b * 0.8 - 1e-9 && got <= (b * 1.2).min(120.0) + 1e-9,
                "{got} vs {b}"
            );
            base *= 1.6;
        }
    }

    #[test]
    fn jitter_modes_and_retry_after_floor() {
        let full = Backoff {
            jitter: Jitter::Full,
            ..Backoff::default()
        };
        for d in full.delays(1).take(50) {
            assert!(d <= Duration::from_secs(120));
        }
        let dec = Backoff {
            jitter: Jitter::Decorrelated,
            ..Backoff::default()
        };
        let mut prev = dec.initial;
        let mut seq = dec.delays(3);
        for _ in 0..50 {
            let d = seq.next().unwrap();
            assert!(d >= dec.initial && d <= (prev * 3).min(dec.max).max(dec.initial));
            prev = d;
        }
        let mut seq = Backoff::default().delays(9);
        assert_eq!(
            seq.next_with(Some(Duration::from_secs(30))),
            Duration::from_secs(30)
        );
        assert!(Backoff {
            multiplier: 0.5,
            ..Backoff::default()
        }
        .validate()
        .is_err());
        assert!(Backoff::default().validate().is_ok());
        // Same seed, same delays.
        let a: Vec<_> = Backoff::default().delays(5).take(5).collect();
        let b: Vec<_> = Backoff::default().delays(5).take(5).collect();
        assert_eq!(a, b);
    }

    #[test]
    fn budget_caps_retries_at_the_ratio() {
        let budget = RetryBudget::new(0.2, 0.0).unwrap();
        let ms = 1_000_000;
        let mut granted = 0;
        for i in 0..1000u64 {
            budget.record_request(i * ms);
            // Every request fails and wants a retry.
            if budget.try_retry(i * ms) {
                granted += 1;
            }
        }
        assert_eq!(granted, 200, "20 % of 1000 requests");
        // Long after, the window has slid: nothing left, no requests → no retries.
        assert!(!budget.try_retry(100_000 * ms));
        // The minimum per second lets a quiet client retry a little.
        let quiet = RetryBudget::new(0.1, 1.0).unwrap();
        let granted = (0..100).filter(|i| quiet.try_retry(i * ms)).count();
        assert_eq!(granted, 10, "1 per second over a 10 s window");
    }
}
