//! `weir simulate overload`: a service under X × its capacity, in virtual time, with each
//! protection of weir-core in front of it.
//!
//! Model: W workers (default 16); service times are Erlang-2 with mean W / C (so the service completes
//! C requests/s at full use); requests arrive as a Poisson stream at X × C per second with the
//! criticality mix 10 % CRITICAL_PLUS, 40 % CRITICAL, 30 % SHEDDABLE_PLUS, 20 % SHEDDABLE, and
//! wait in a FIFO queue for a worker. A request is *good* when it completes within the SLO
//! (5 × the unloaded mean latency). Goodput = good requests per second / C. The simulated
//! process's CPU is the share of busy workers, sampled every 500 ms and smoothed like
//! `CpuSampler` (decay 0.5, rises at once). Same seed, same result.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_core::adaptive::bbr::{Bbr, BbrConfig, BbrPermit};
use weir_core::adaptive::codel::{Codel, CodelConfig};
use weir_core::adaptive::{
    AdaptiveLimiter, AdaptivePermit, Aimd, Gradient2, LimitAlgorithm, Vegas, Windowed,
};
use weir_core::concurrency::{ConcurrencyConfig, ConcurrencyLimiter, Permit, QueueOrder};
use weir_core::criticality::Shares;
use weir_core::retry::SplitMix64;
use weir_core::stats::Outcome;
use weir_core::{Criticality, Nanos};

/// Protections `--protection` accepts.
pub const PROTECTIONS: [&str; 7] = [
    "none",
    "static",
    "bbr",
    "gradient2",
    "aimd",
    "vegas",
    "codel",
];

/// Default workers of the simulated service.
pub const DEFAULT_WORKERS: usize = 16;

/// Criticality mix, least critical first (SHEDDABLE, SHEDDABLE_PLUS, CRITICAL, CRITICAL_PLUS).
const MIX: [f64; 4] = [0.2, 0.3, 0.4, 0.1];

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Settings {
    /// One of [`PROTECTIONS`].
    pub protection: String,
    /// Offered load as a multiple of capacity.
    pub load: f64,
    /// Requests per second the service completes at full use.
    pub capacity: f64,
    /// Simulated time.
    pub duration: Duration,
    /// Random seed.
    pub seed: u64,
    /// Workers (threads) of the service.
    pub workers: usize,
}

/// Results per criticality level.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LevelResult {
    /// Requests offered.
    pub offered: u64,
    /// Requests admitted by the protection at arrival.
    pub admitted: u64,
    /// Requests rejected (at arrival, or by CoDel at dequeue).
    pub shed: u64,
    /// Completed within the SLO.
    pub good: u64,
}

impl LevelResult {
    /// good / offered.
    pub fn success_ratio(&self) -> f64 {
        if self.offered == 0 {
            1.0
        } else {
            self.good as f64 / self.offered as f64
        }
    }
}

/// The outcome of one simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Settings it ran with.
    pub protection: String,
    /// Offered load.
    pub load: f64,
    /// Good requests per second / capacity.
    pub goodput_ratio: f64,
    /// Median latency of completed requests, ms.
    pub p50_ms: f64,
    /// 99th percentile latency of completed requests, ms.
    pub p99_ms: f64,
    /// The service's unloaded p99 latency (service time alone), ms.
    pub unloaded_p99_ms: f64,
    /// The SLO, ms.
    pub slo_ms: f64,
    /// Per level, least critical first.
    pub by_level: [LevelResult; 4],
    /// Second by second (what `--report` draws).
    pub seconds: Vec<Second>,
}

/// One second of a simulation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Second {
    /// Requests that arrived.
    pub offered: u64,
    /// Requests the protection admitted at arrival.
    pub admitted: u64,
    /// Requests completed within the SLO.
    pub good: u64,
    /// 99th percentile latency of the requests completed in it, ms (0: none completed).
    pub p99_ms: f64,
}

enum Guard {
    None,
    Static(#[allow(dead_code)] Permit),
    Adaptive(AdaptivePermit),
    Bbr(BbrPermit<&'static Bbr>),
}

struct Request {
    arrived: Nanos,
    level: Criticality,
    guard: Guard,
}

enum Protection {
    None,
    Static(ConcurrencyLimiter),
    Adaptive(AdaptiveLimiter),
    Bbr(&'static Bbr),
    Codel(Codel),
}

fn exp(rng: &mut SplitMix64, mean: f64) -> f64 {
    -mean * (1.0 - rng.next_f64()).ln()
}

fn erlang2(rng: &mut SplitMix64, mean: f64) -> f64 {
    exp(rng, mean / 2.0) + exp(rng, mean / 2.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn adaptive(alg: impl LimitAlgorithm + 'static) -> Result<AdaptiveLimiter, String> {
    AdaptiveLimiter::new(
        alg,
        ConcurrencyConfig {
            max_in_flight: 1,
            max_queue: 0,
            order: QueueOrder::Fifo,
            shares: Some(Shares::default()),
        },
    )
    .map_err(|e| e.to_string())
}

/// Refuses settings out of range (each message names its flag).
fn validate(s: &Settings) -> Result<(), String> {
    if !PROTECTIONS.contains(&s.protection.as_str()) {
        return Err(format!(
            "unknown protection '{}' (expected one of: {})",
            s.protection,
            PROTECTIONS.join(", ")
        ));
    }
    if !(s.load.is_finite() && s.load > 0.0 && s.load <= 100.0) {
        return Err(format!("--load must be in (0, 100], got {}", s.load));
    }
    if !(s.capacity.is_finite() && s.capacity >= 1.0 && s.capacity <= 1e6) {
        return Err(format!(
            "--capacity must be in [1, 1000000], got {}",
            s.capacity
        ));
    }
    if !(1..=10_000).contains(&s.workers) {
        return Err(format!(
            "--workers must be in [1, 10000], got {}",
            s.workers
        ));
    }
    if s.duration.is_zero() || s.duration > Duration::from_secs(3600) {
        return Err("--duration must be in (0, 1h]".into());
    }
    // Bound the work: at most 20 M arrivals.
    if s.load * s.capacity * s.duration.as_secs_f64() > 2e7 {
        return Err("load × capacity × duration exceeds 20 million requests".into());
    }
    Ok(())
}

/// The protection named `name` for `workers` workers; BBR reads the simulated CPU from `cpu`.
fn protection(name: &str, workers: usize, cpu: Arc<AtomicU64>) -> Result<Protection, String> {
    Ok(match name {
        "none" => Protection::None,
        "static" => Protection::Static(
            ConcurrencyLimiter::with_config(ConcurrencyConfig {
                max_in_flight: 2 * workers as u64,
                max_queue: 0,
                order: QueueOrder::Fifo,
                shares: Some(Shares::default()),
            })
            .map_err(|e| e.to_string())?,
        ),
        "bbr" => {
            let source = move || f64::from_bits(cpu.load(Ordering::Relaxed));
            let bbr =
                Bbr::new(BbrConfig::default(), Arc::new(source)).map_err(|e| e.to_string())?;
            // Lives for the rest of the process: permits borrow it.
            Protection::Bbr(Box::leak(Box::new(bbr)))
        }
        "gradient2" => Protection::Adaptive(adaptive(Windowed::new(Gradient2::default()))?),
        "aimd" => Protection::Adaptive(adaptive(Windowed::new(Aimd::default()))?),
        "vegas" => Protection::Adaptive(adaptive(Windowed::new(Vegas::default()))?),
        _ => Protection::Codel(Codel::new(CodelConfig::default())),
    })
}

/// A request's criticality drawn from [`MIX`].
fn draw_level(rng: &mut SplitMix64) -> Criticality {
    let u = rng.next_f64();
    let mut acc = 0.0;
    for (i, share) in MIX.iter().enumerate() {
        acc += share;
        if u < acc {
            return Criticality::ALL[i];
        }
    }
    Criticality::CriticalPlus
}

/// The protection's verdict on an arrival: its guard, or `None` (shed).
fn admit(protection: &Protection, level: Criticality, now: Nanos) -> Option<Guard> {
    match protection {
        Protection::None | Protection::Codel(_) => Some(Guard::None),
        Protection::Static(l) => l.try_acquire_as(1, level).ok().map(Guard::Static),
        Protection::Adaptive(l) => l.try_acquire(level, now).ok().map(Guard::Adaptive),
        Protection::Bbr(b) => b.try_acquire(level, now).ok().map(Guard::Bbr),
    }
}

/// Runs one simulation.
pub fn run(s: &Settings) -> Result<Report, String> {
    validate(s)?;
    let workers = s.workers;
    let mean_service_s = workers as f64 / s.capacity;
    let mut rng = SplitMix64(s.seed);
    let (unloaded_mean, unloaded_p99) = unloaded(&mut rng, mean_service_s);
    let slo = (5.0 * unloaded_mean * 1e9) as Nanos;

    let mut meter = CpuMeter::new(workers);
    let protection = protection(&s.protection, workers, meter.cpu.clone())?;

    let end = (s.duration.as_secs_f64() * 1e9) as Nanos;
    let arrival_mean = 1.0 / (s.load * s.capacity);
    let mut by_level = [LevelResult::default(); 4];
    let mut latencies: Vec<f64> = Vec::new();
    // The second each latency was completed in, and the seconds' counts.
    let mut completed_in: Vec<u64> = Vec::new();
    let mut seconds: Vec<Second> = Vec::new();
    let mut service = Service::new(workers);
    let mut next_arrival: Nanos = 0;

    loop {
        let next_done = service.completions.peek().map(|Reverse((t, _))| *t);
        let arrival_due = next_arrival < end;
        let completion_first = next_done.is_some_and(|d| !arrival_due || d <= next_arrival);
        if !completion_first && !arrival_due {
            break; // no arrivals left and nothing in service (the queue is empty then too)
        }
        let now = match next_done {
            Some(d) if completion_first => d,
            _ => next_arrival,
        };
        meter.advance(now, service.busy_now);
        if completion_first {
            let Some((req, t)) = service.complete() else {
                break;
            };
            let latency = t - req.arrived;
            latencies.push(latency as f64 / 1e6);
            completed_in.push(second_of(t));
            if latency <= slo {
                by_level[req.level.rank()].good += 1;
                second_at(&mut seconds, t).good += 1;
            }
            match req.guard {
                Guard::Adaptive(p) => p.success(t),
                Guard::Bbr(p) => p.finish(t, Outcome::Success),
                Guard::Static(_) | Guard::None => {}
            }
        } else {
            // Arrival.
            let level = draw_level(&mut rng);
            let r = &mut by_level[level.rank()];
            r.offered += 1;
            second_at(&mut seconds, now).offered += 1;
            match admit(&protection, level, now) {
                Some(guard) => {
                    r.admitted += 1;
                    second_at(&mut seconds, now).admitted += 1;
                    service.queue.push_back(Request {
                        arrived: now,
                        level,
                        guard,
                    });
                }
                None => r.shed += 1,
            }
            next_arrival = now + (exp(&mut rng, arrival_mean) * 1e9) as Nanos;
        }
        service.start(&protection, &mut by_level, &mut rng, mean_service_s, now);
    }
    seconds_p99(&mut seconds, &latencies, &completed_in);
    latencies.sort_by(|a, b| a.total_cmp(b));
    let good: u64 = by_level.iter().map(|r| r.good).sum();
    Ok(Report {
        protection: s.protection.clone(),
        load: s.load,
        goodput_ratio: good as f64 / (s.capacity * s.duration.as_secs_f64()),
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        unloaded_p99_ms: unloaded_p99 * 1e3,
        slo_ms: slo as f64 / 1e6,
        by_level,
        seconds,
    })
}

/// The unloaded latency (service time alone) of 100 000 draws: its mean and 99th percentile,
/// in seconds.
fn unloaded(rng: &mut SplitMix64, mean_service_s: f64) -> (f64, f64) {
    let mut unloaded: Vec<f64> = (0..100_000).map(|_| erlang2(rng, mean_service_s)).collect();
    unloaded.sort_by(|a, b| a.total_cmp(b));
    let mean = unloaded.iter().sum::<f64>() / unloaded.len() as f64;
    (mean, percentile(&unloaded, 0.99))
}

/// Each second's p99 from the latencies (ms) completed in it (`completed_in`: the second of
/// each). Completions come in time order: each second's latencies are one run of the list.
fn seconds_p99(seconds: &mut [Second], latencies: &[f64], completed_in: &[u64]) {
    let mut from = 0;
    while from < latencies.len() {
        let sec = completed_in[from];
        let to = from
            + completed_in[from..]
                .iter()
                .take_while(|s| **s == sec)
                .count();
        let mut run = latencies[from..to].to_vec();
        run.sort_by(|a, b| a.total_cmp(b));
        let i = usize::try_from(sec).unwrap_or(usize::MAX);
        if let Some(s) = seconds.get_mut(i) {
            s.p99_ms = percentile(&run, 0.99);
        }
        from = to;
    }
}

/// The simulated CPU: busy worker-time, sampled every 500 ms into a smoothed usage that BBR
/// reads.
struct CpuMeter {
    cpu: Arc<AtomicU64>,
    workers: usize,
    busy_time: f64,
    last_change: Nanos,
    next_sample: Nanos,
    smoothed: f64,
}

impl CpuMeter {
    const SAMPLE: Nanos = 500_000_000;

    fn new(workers: usize) -> Self {
        Self {
            cpu: Arc::new(AtomicU64::new(0f64.to_bits())),
            workers,
            busy_time: 0.0,
            last_change: 0,
            next_sample: Self::SAMPLE,
            smoothed: 0.0,
        }
    }

    /// Time moves to `now` with `busy` workers busy since the last change.
    fn advance(&mut self, now: Nanos, busy: usize) {
        self.busy_time += busy as f64 * (now - self.last_change) as f64;
        self.last_change = now;
        while now >= self.next_sample {
            let usage = (self.busy_time / (self.workers as f64 * Self::SAMPLE as f64)).min(1.0);
            self.smoothed = (self.smoothed * 0.5 + usage * 0.5).max(usage);
            self.cpu
                .store(f64::to_bits(self.smoothed), Ordering::Relaxed);
            self.busy_time = 0.0;
            self.next_sample += Self::SAMPLE;
        }
    }
}

/// The simulated service: admitted requests queued, the workers and what each one serves,
/// and the completion events (time, worker).
struct Service {
    queue: VecDeque<Request>,
    busy: Vec<Option<(Request, Nanos)>>,
    completions: BinaryHeap<Reverse<(Nanos, usize)>>,
    busy_now: usize,
}

impl Service {
    fn new(workers: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            busy: (0..workers).map(|_| None).collect(),
            completions: BinaryHeap::new(),
            busy_now: 0,
        }
    }

    /// The next completion: its request and time (`None`: nothing in service).
    fn complete(&mut self) -> Option<(Request, Nanos)> {
        let Reverse((t, w)) = self.completions.pop()?;
        let (req, _) = self.busy[w].take()?;
        self.busy_now -= 1;
        Some((req, t))
    }

    /// Free workers take queued requests (CoDel sheds those that waited too long).
    fn start(
        &mut self,
        protection: &Protection,
        by_level: &mut [LevelResult; 4],
        rng: &mut SplitMix64,
        mean_service_s: f64,
        now: Nanos,
    ) {
        for (w, slot) in self.busy.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            while let Some(req) = self.queue.pop_front() {
                if let Protection::Codel(c) = protection {
                    if c.should_shed(now - req.arrived, req.level, now) {
                        by_level[req.level.rank()].shed += 1;
                        continue;
                    }
                }
                let done = now + (erlang2(rng, mean_service_s) * 1e9) as Nanos;
                self.completions.push(Reverse((done, w)));
                *slot = Some((req, done));
                self.busy_now += 1;
                break;
            }
        }
    }
}

/// The second `t` falls in.
fn second_of(t: Nanos) -> u64 {
    t / 1_000_000_000
}

/// The counts of the second `t` falls in (added when new).
fn second_at(seconds: &mut Vec<Second>, t: Nanos) -> &mut Second {
    let i = usize::try_from(second_of(t))
        .unwrap_or(usize::MAX)
        .min(3_600);
    if seconds.len() <= i {
        seconds.resize(i + 1, Second::default());
    }
    &mut seconds[i]
}

const LABELS: [&str; 4] = ["SHEDDABLE", "SHEDDABLE_PLUS", "CRITICAL", "CRITICAL_PLUS"];

/// The human report.
pub fn text(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "protection {} at load {}: goodput {:.3} of capacity, p50 {:.1} ms, p99 {:.1} ms \
         (unloaded p99 {:.1} ms, SLO {:.1} ms)",
        r.protection, r.load, r.goodput_ratio, r.p50_ms, r.p99_ms, r.unloaded_p99_ms, r.slo_ms
    );
    let _ = writeln!(
        out,
        "{:<15} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "criticality", "offered", "admitted", "shed", "good", "success"
    );
    let mut total = LevelResult::default();
    for (i, l) in r.by_level.iter().enumerate().rev() {
        let _ = writeln!(
            out,
            "{:<15} {:>9} {:>9} {:>9} {:>9} {:>7.1}%",
            LABELS[i],
            l.offered,
            l.admitted,
            l.shed,
            l.good,
            100.0 * l.success_ratio()
        );
        total.offered += l.offered;
        total.admitted += l.admitted;
        total.shed += l.shed;
        total.good += l.good;
    }
    let _ = writeln!(
        out,
        "{:<15} {:>9} {:>9} {:>9} {:>9} {:>7.1}%",
        "total",
        total.offered,
        total.admitted,
        total.shed,
        total.good,
        100.0 * total.success_ratio()
    );
    out
}

/// The JSON report (one object).
pub fn json(r: &Report) -> String {
    let mut levels = String::new();
    for (i, l) in r.by_level.iter().enumerate().rev() {
        if !levels.is_empty() {
            levels.push(',');
        }
        let _ = write!(
            levels,
            "\"{}\":{{\"offered\":{},\"admitted\":{},\"shed\":{},\"good\":{},\"success_ratio\":{:.6}}}",
            LABELS[i], l.offered, l.admitted, l.shed, l.good, l.success_ratio()
        );
    }
    format!(
        "{{\"protection\":\"{}\",\"load\":{},\"goodput_ratio\":{:.6},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\
         \"unloaded_p99_ms\":{:.3},\"slo_ms\":{:.3},\"by_criticality\":{{{}}}}}",
        r.protection, r.load, r.goodput_ratio, r.p50_ms, r.p99_ms, r.unloaded_p99_ms, r.slo_ms, levels
    )
}

/// The report's column for one run (`--report`): its settings and headline figures, requests
/// per second offered, admitted and good beside the capacity, and the p99 latency beside the
/// SLO, second by second.
pub fn report_section(s: &Settings, r: &Report) -> crate::report::Section {
    use crate::report::{Chart, Section, Series};
    let per = |f: fn(&Second) -> f64| -> Vec<(f64, f64)> {
        r.seconds
            .iter()
            .enumerate()
            .map(|(i, sec)| (i as f64 + 1.0, f(sec)))
            .collect()
    };
    let end = r.seconds.len() as f64;
    let mut facts = vec![
        (
            "goodput ÷ capacity".into(),
            format!("{:.3}", r.goodput_ratio),
        ),
        (
            "p50, p99".into(),
            format!("{:.1} ms, {:.1} ms", r.p50_ms, r.p99_ms),
        ),
        (
            "SLO (5 × unloaded mean)".into(),
            format!("{:.1} ms", r.slo_ms),
        ),
    ];
    for (label, l) in LABELS.iter().zip(&r.by_level) {
        facts.push((
            format!("{label}: good ÷ offered"),
            format!("{:.3}", l.success_ratio()),
        ));
    }
    Section {
        title: format!(
            "{} at {} × {}/s, {} workers",
            s.protection, s.load, s.capacity, s.workers
        ),
        facts,
        charts: vec![
            Chart {
                title: "Requests per second".into(),
                x: "second".into(),
                y: "requests/s".into(),
                series: vec![
                    Series::line("offered", per(|x| x.offered as f64)),
                    Series::line("admitted", per(|x| x.admitted as f64)),
                    Series::line("good (within the SLO)", per(|x| x.good as f64)),
                    Series::reference("capacity", vec![(0.0, s.capacity), (end, s.capacity)]),
                ],
                bars: None,
            },
            Chart {
                title: "p99 latency of the requests completed each second".into(),
                x: "second".into(),
                y: "ms".into(),
                series: vec![
                    Series::line("p99", per(|x| x.p99_ms)),
                    Series::reference("SLO", vec![(0.0, r.slo_ms), (end, r.slo_ms)]),
                ],
                bars: None,
            },
        ],
    }
}
