//! System rules: limits on all inbound calls together (total rate, in flight, average response
//! time, CPU, BBR, adaptive concurrency). Calls made with `Context::inbound == false` (outbound
//! calls to dependencies) are not counted or limited here.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use weir_core::adaptive::bbr::{Bbr, BbrConfig, BbrPermit};
use weir_core::adaptive::cpu::{CpuSampler, CpuSource};
use weir_core::adaptive::{AdaptiveLimiter, AdaptivePermit, Aimd, Gradient2, Vegas};
use weir_core::stats::StatsWindow;
use weir_core::{Clock, ConcurrencyConfig, ConfigError, Criticality, Nanos, QueueOrder};

use crate::config::{AdaptiveAlgorithm, AdaptiveRule, BbrRule, RateAlgorithm, SystemRule};
use crate::metrics::{second_window, RuleStats};
use weir_core::rate::{KeyedRate, RateSpec};

/// The parts of a system rule, in the order they are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    MaxInFlight,
    MaxAvgRt,
    MaxCpu,
    MaxQps,
    Bbr,
    Adaptive,
}

impl Part {
    pub(crate) const ALL: [Part; 6] = [
        Part::MaxInFlight,
        Part::MaxAvgRt,
        Part::MaxCpu,
        Part::MaxQps,
        Part::Bbr,
        Part::Adaptive,
    ];

    /// The id blocks and snapshots use.
    pub(crate) fn id(self) -> &'static str {
        match self {
            Part::MaxQps => "system:max_qps",
            Part::MaxInFlight => "system:max_in_flight",
            Part::MaxAvgRt => "system:max_avg_rt",
            Part::MaxCpu => "system:max_cpu",
            Part::Bbr => "system:bbr",
            Part::Adaptive => "system:adaptive",
        }
    }
}

/// What lives as long as the `Rules`: inbound statistics and the counters of each part.
pub(crate) struct Inbound {
    pub(crate) window: StatsWindow,
    pub(crate) stats: [RuleStats; 6],
    pub(crate) ids: [Arc<str>; 6],
    cpu: CpuHandle,
}

/// The CPU source: injected, or a sampler started the first time a rule needs it.
enum CpuHandle {
    Given(Arc<dyn CpuSource>),
    Lazy(OnceLock<Arc<CpuSampler>>),
}

impl Inbound {
    pub(crate) fn new(cpu: Option<Arc<dyn CpuSource>>) -> Self {
        Self {
            window: second_window(),
            stats: Default::default(),
            ids: Part::ALL.map(|p| Arc::from(p.id())),
            cpu: match cpu {
                Some(c) => CpuHandle::Given(c),
                None => CpuHandle::Lazy(OnceLock::new()),
            },
        }
    }

    pub(crate) fn cpu(&self) -> Arc<dyn CpuSource> {
        match &self.cpu {
            CpuHandle::Given(c) => c.clone(),
            CpuHandle::Lazy(l) => l
                .get_or_init(|| Arc::new(CpuSampler::start(Duration::from_millis(500))))
                .clone(),
        }
    }
}

/// A compiled system rule.
pub(crate) struct System<C: Clock> {
    pub(crate) rule: SystemRule,
    pub(crate) qps: Option<Arc<KeyedRate<C>>>,
    pub(crate) cpu: Option<Arc<dyn CpuSource>>,
    pub(crate) bbr: Option<Arc<Bbr>>,
    pub(crate) adaptive: Option<AdaptiveLimiter>,
}

/// Permits a call admitted by the system rule holds until it ends.
#[derive(Default)]
pub(crate) struct SystemPermits {
    pub(crate) bbr: Option<BbrPermit<Arc<Bbr>>>,
    pub(crate) adaptive: Option<AdaptivePermit>,
}

const QPS_KEY: &str = "system";

impl<C: Clock + Clone> System<C> {
    /// Compiles `rule`, keeping the state of `old` where the parameters allow.
    pub(crate) fn compile(
        rule: &SystemRule,
        old: Option<&System<C>>,
        inbound: &Inbound,
        clock: &C,
    ) -> Result<Self, ConfigError> {
        let qps = match rule.max_qps {
            Some(n) => {
                let spec = RateSpec::new(RateAlgorithm::SlidingWindow, n, Duration::from_secs(1));
                match old.and_then(|o| o.qps.as_ref()) {
                    // Same algorithm and window: keep the counts, retune the limit.
                    Some(q) => {
                        q.retune(&spec)?;
                        Some(q.clone())
                    }
                    None => Some(Arc::new(KeyedRate::new(&spec, 1, clock.clone())?)),
                }
            }
            None => None,
        };
        let cpu = (rule.max_cpu.is_some() || rule.bbr.is_some()).then(|| inbound.cpu());
        let bbr = match &rule.bbr {
            Some(b) => match old.filter(|o| o.rule.bbr.as_ref() == Some(b)) {
                Some(o) => o.bbr.clone(),
                None => Some(Arc::new(Bbr::new(
                    bbr_config(b),
                    cpu.clone().unwrap_or_else(|| inbound.cpu()),
                )?)),
            },
            None => None,
        };
        let adaptive = match &rule.adaptive {
            Some(a) => match old.filter(|o| o.rule.adaptive.as_ref() == Some(a)) {
                Some(o) => o.adaptive.clone(),
                None => Some(adaptive(a)?),
            },
            None => None,
        };
        Ok(Self {
            rule: rule.clone(),
            qps,
            cpu,
            bbr,
            adaptive,
        })
    }

    /// What the rule protects with at `now`, for dashboards.
    pub(crate) fn snapshot(&self, inbound: &Inbound, now: Nanos) -> crate::metrics::SystemSnapshot {
        crate::metrics::SystemSnapshot {
            cpu: self.cpu.as_ref().map(|c| c.usage()),
            in_flight: inbound.window.in_flight(),
            max_in_flight: self.rule.max_in_flight,
            max_cpu: self.rule.max_cpu,
            bbr_limit: self.bbr.as_ref().map(|b| b.max_in_flight(now)),
            adaptive_limit: self.adaptive.as_ref().map(|a| a.limit()),
            adaptive_in_flight: self.adaptive.as_ref().map(|a| a.in_flight()),
        }
    }

    /// Whether the rule has `part`.
    pub(crate) fn has(&self, part: Part) -> bool {
        match part {
            Part::MaxQps => self.rule.max_qps.is_some(),
            Part::MaxInFlight => self.rule.max_in_flight.is_some(),
            Part::MaxAvgRt => self.rule.max_avg_rt.is_some(),
            Part::MaxCpu => self.rule.max_cpu.is_some(),
            Part::Bbr => self.bbr.is_some(),
            Part::Adaptive => self.adaptive.is_some(),
        }
    }

    /// Checks an inbound call at `now`: the first part that blocks, or the permits to hold.
    pub(crate) fn check(
        &self,
        inbound: &Inbound,
        level: Criticality,
        now: Nanos,
    ) -> Result<SystemPermits, (Part, Option<Duration>)> {
        let shadow = self.rule.shadow;
        let verdict = |part: Part, ok: bool, retry: Option<Duration>| {
            let s = &inbound.stats[part as usize];
            if ok {
                s.passes.add(1);
                Ok(())
            } else if shadow {
                s.shadow_blocks.fetch_add(1, Ordering::Relaxed);
                Ok(())
            } else {
                s.blocks.fetch_add(1, Ordering::Relaxed);
                Err((part, retry))
            }
        };
        if let Some(max) = self.rule.max_in_flight {
            verdict(
                Part::MaxInFlight,
                inbound.window.in_flight() < max,
                Some(Duration::ZERO),
            )?;
        }
        if let Some(max) = self.rule.max_avg_rt {
            let avg = inbound.window.snapshot(now).avg_rt();
            verdict(
                Part::MaxAvgRt,
                Duration::from_nanos(avg) <= max,
                Some(inbound.window.bucket_duration()),
            )?;
        }
        if let (Some(max), Some(cpu)) = (self.rule.max_cpu, &self.cpu) {
            verdict(Part::MaxCpu, cpu.usage() < max, None)?;
        }
        // Parts that consume capacity come last, so a call blocked by a signal takes none.
        if let Some(q) = &self.qps {
            let d = q.acquire(QPS_KEY, 1);
            verdict(Part::MaxQps, d.allowed(), d.retry_after())?;
        }
        let mut permits = SystemPermits::default();
        if let Some(b) = &self.bbr {
            match b.try_acquire_owned(level, now) {
                Ok(p) => {
                    verdict(Part::Bbr, true, None)?;
                    permits.bbr = Some(p);
                }
                Err(_) => verdict(Part::Bbr, false, None)?,
            }
        }
        if let Some(a) = &self.adaptive {
            match a.try_acquire(level, now) {
                Ok(p) => {
                    verdict(Part::Adaptive, true, None)?;
                    permits.adaptive = Some(p);
                }
                Err(_) => verdict(Part::Adaptive, false, None)?,
            }
        }
        Ok(permits)
    }
}

fn bbr_config(b: &BbrRule) -> BbrConfig {
    let d = BbrConfig::default();
    BbrConfig {
        cpu_threshold: b.cpu_threshold.unwrap_or(d.cpu_threshold),
        window: b.window.unwrap_or(d.window),
        buckets: b.buckets.unwrap_or(d.buckets),
        cooldown: b.cooldown.unwrap_or(d.cooldown),
        ..d
    }
}

fn adaptive(a: &AdaptiveRule) -> Result<AdaptiveLimiter, ConfigError> {
    let config = ConcurrencyConfig {
        max_in_flight: 1,
        max_queue: 0,
        order: QueueOrder::Fifo,
        shares: None,
    };
    match a.algorithm {
        AdaptiveAlgorithm::Gradient2 => {
            let mut g = Gradient2::default();
            g.min = a.min.unwrap_or(g.min);
            g.max = a.max.unwrap_or(g.max).max(g.min);
            AdaptiveLimiter::new(g, config)
        }
        AdaptiveAlgorithm::Vegas => {
            let mut v = Vegas::default();
            v.max = a.max.unwrap_or(v.max);
            AdaptiveLimiter::new(v, config)
        }
        AdaptiveAlgorithm::Aimd => {
            let mut m = Aimd::default();
            m.min = a.min.unwrap_or(m.min);
            m.max = a.max.unwrap_or(m.max).max(m.min);
            AdaptiveLimiter::new(m, config)
        }
    }
}
