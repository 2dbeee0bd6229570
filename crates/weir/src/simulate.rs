//! `weir simulate`: runs a trace of requests through an algorithm on virtual time.
//!
//! Input: CSV lines `t_ms,key,cost` (t_ms relative and non-decreasing, may have a decimal
//! fraction; cost a non-negative integer; an optional header line `t_ms,key,cost`; blank lines
//! and lines starting with `#` are skipped). Each key has its own limiter. The whole input is
//! validated before anything is printed, so a bad line yields one error and no partial output.
//!
//! Output: a CSV line per event on stdout; a summary on stderr with the most units admitted in
//! any window-length span per key (counted when they proceed, i.e. at t + wait).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, BufRead, Write};
use std::time::Duration;

use weir_core::rate::RateAlgorithm;
use weir_core::{
    Algorithm, ConfigError, FixedWindow, Gcra, Nanos, Pacing, Quota, SlidingCounter, SlidingLog,
    SlidingWindow, TokenBucket, WarmupTokenBucket,
};

use crate::duration::{format_ms, scaled_decimal};

/// The algorithms `--algorithm` accepts, by the names it accepts (weir-core's, but
/// `warmup_token_bucket` for the warming-up token bucket).
pub const ALGORITHMS: [(&str, RateAlgorithm); 8] = [
    ("fixed_window", RateAlgorithm::FixedWindow),
    ("sliding_window", RateAlgorithm::SlidingWindow),
    ("sliding_log", RateAlgorithm::SlidingLog),
    ("sliding_counter", RateAlgorithm::SlidingCounter),
    ("gcra", RateAlgorithm::Gcra),
    ("token_bucket", RateAlgorithm::TokenBucket),
    ("warmup_token_bucket", RateAlgorithm::WarmUp),
    ("pacing", RateAlgorithm::Pacing),
];

/// Longest key accepted in a trace.
pub const MAX_KEY_LEN: usize = 1024;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Algorithm name (one of [`ALGORITHMS`]).
    pub algorithm: String,
    /// Units per window.
    pub limit: u64,
    /// The window.
    pub window: Duration,
    /// Units admitted at once (gcra, token_bucket); default = limit.
    pub burst: Option<u64>,
    /// Sub-windows (sliding_window); default 10.
    pub buckets: Option<u32>,
    /// Warm-up period (warmup_token_bucket); default 10 s.
    pub warmup: Option<Duration>,
    /// Longest wait an admitted request may be given (token buckets, pacing); default 0.
    pub max_wait: Option<Duration>,
}

/// Why a simulation could not run. Every variant is a usage or input error (exit code 2).
#[derive(Debug)]
pub enum SimError {
    /// A bad option or option combination.
    Usage(String),
    /// A bad input line.
    Input {
        /// Where the input came from.
        source: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The input could not be read.
    Read(String),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Usage(m) | SimError::Read(m) => f.write_str(m),
            SimError::Input {
                source,
                line,
                message,
            } => write!(f, "{source} line {line}: {message}"),
        }
    }
}

fn usage(e: ConfigError) -> SimError {
    SimError::Usage(e.to_string())
}

/// One parsed request.
#[derive(Debug, Clone, Copy)]
struct Event {
    t: Nanos,
    key: u32,
    cost: u64,
}

/// A parsed, validated trace.
#[derive(Debug, Default)]
pub struct Trace {
    keys: Vec<String>,
    events: Vec<Event>,
}

/// Reads and validates a whole trace.
pub fn parse_trace(reader: impl BufRead, source: &str) -> Result<Trace, SimError> {
    let mut trace = Trace::default();
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut previous: Option<(Nanos, String)> = None;
    let mut seen_data = false;
    for (i, line) in reader.lines().enumerate() {
        let line_no = i + 1;
        let err = |message: String| SimError::Input {
            source: source.to_string(),
            line: line_no,
            message,
        };
        let line = line.map_err(|e| match e.kind() {
            io::ErrorKind::InvalidData => err("not valid UTF-8".into()),
            _ => SimError::Read(format!("{source}: {e}")),
        })?;
        let text = line.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        if !seen_data && text.replace(' ', "") == "t_ms,key,cost" {
            seen_data = true;
            continue;
        }
        seen_data = true;
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.len() != 3 {
            return Err(err(format!(
                "expected 3 fields t_ms,key,cost, found {}: '{}'",
                fields.len(),
                truncate(text)
            )));
        }
        let t = scaled_decimal(fields[0], 1_000_000)
            .and_then(|ns| u64::try_from(ns).ok())
            .ok_or_else(|| {
                err(format!(
                    "t_ms '{}' is not a non-negative number of milliseconds",
                    truncate(fields[0])
                ))
            })?;
        if let Some((prev, ref prev_text)) = previous {
            if t < prev {
                return Err(err(format!(
                    "time goes backwards: t_ms {} is before the previous line's {}",
                    fields[0], prev_text
                )));
            }
        }
        let key = fields[1];
        if key.len() > MAX_KEY_LEN {
            return Err(err(format!("key is longer than {MAX_KEY_LEN} bytes")));
        }
        let cost: u64 = fields[2].parse().map_err(|_| {
            err(format!(
                "cost '{}' is not a non-negative integer",
                truncate(fields[2])
            ))
        })?;
        let next_id = ids.len();
        let id = *ids.entry(key.to_string()).or_insert_with(|| {
            trace.keys.push(key.to_string());
            next_id as u32
        });
        trace.events.push(Event { t, key: id, cost });
        previous = Some((t, fields[0].to_string()));
    }
    Ok(trace)
}

fn truncate(s: &str) -> String {
    if s.len() <= 60 {
        s.to_string()
    } else {
        let cut = (0..=60).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
        format!("{}…", &s[..cut])
    }
}

/// Totals printed on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Events in the trace.
    pub events: u64,
    /// Admitted events.
    pub allowed: u64,
    /// Denied events.
    pub denied: u64,
    /// Per key (in first-seen order): the most units admitted in any window-length span.
    pub max_in_window: Vec<(String, u64)>,
    /// All keys together, over time: units offered and admitted per slice of the trace.
    pub timeline: Timeline,
}

/// Units offered and admitted per slice of time, all keys together (what `--report` draws).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timeline {
    /// Start of the first slice (the first event's time), ns.
    pub start: Nanos,
    /// Length of a slice, ns: a tenth of the window, or longer to keep at most
    /// [`MAX_SLICES`] slices.
    pub slice: Nanos,
    /// Per slice: (units offered, units admitted — counted when they proceed).
    pub units: Vec<(u64, u64)>,
}

/// Most slices a timeline keeps (a longer trace gets longer slices).
pub const MAX_SLICES: u64 = 2_000;

impl Timeline {
    fn new(trace: &Trace, window: Nanos) -> Self {
        let (start, end) = match (trace.events.first(), trace.events.last()) {
            (Some(a), Some(b)) => (a.t, b.t),
            _ => (0, 0),
        };
        let slice = (window / 10).max(1).max((end - start) / MAX_SLICES + 1);
        Self {
            start,
            slice,
            units: Vec::new(),
        }
    }

    fn add(&mut self, t: Nanos, offered: u64, admitted: u64) {
        let i = usize::try_from(t.saturating_sub(self.start) / self.slice).unwrap_or(usize::MAX);
        // Admitted units proceed at most a wait later: past the last slice, they are kept in it.
        let i = i.min(MAX_SLICES as usize + 16);
        if self.units.len() <= i {
            self.units.resize(i + 1, (0, 0));
        }
        self.units[i].0 += offered;
        self.units[i].1 += admitted;
    }
}

/// Validates the settings and runs the trace, writing the CSV to `out`.
pub fn simulate(
    settings: &Settings,
    trace: &Trace,
    out: &mut dyn Write,
) -> Result<Summary, SimError> {
    let s = settings;
    let name = |a: RateAlgorithm| {
        ALGORITHMS
            .iter()
            .find(|(_, b)| *b == a)
            .map_or("", |(n, _)| n)
    };
    let Some(&(_, algorithm)) = ALGORITHMS.iter().find(|(n, _)| *n == s.algorithm) else {
        let names: Vec<&str> = ALGORITHMS.iter().map(|(n, _)| *n).collect();
        return Err(SimError::Usage(format!(
            "unknown algorithm '{}' (expected one of: {})",
            s.algorithm,
            names.join(", ")
        )));
    };
    let only = |given: bool, option: &str, algorithms: &[RateAlgorithm]| {
        if given && !algorithms.contains(&algorithm) {
            let names: Vec<&str> = algorithms.iter().map(|a| name(*a)).collect();
            Err(SimError::Usage(format!(
                "{option} does not apply to {} (only to {})",
                s.algorithm,
                names.join(", ")
            )))
        } else {
            Ok(())
        }
    };
    use RateAlgorithm as A;
    only(s.burst.is_some(), "--burst", &[A::Gcra, A::TokenBucket])?;
    only(s.buckets.is_some(), "--buckets", &[A::SlidingWindow])?;
    only(s.warmup.is_some(), "--warmup", &[A::WarmUp])?;
    only(
        s.max_wait.is_some(),
        "--max-wait",
        &[A::TokenBucket, A::WarmUp, A::Pacing],
    )?;
    let quota = Quota::new(s.limit, s.window).map_err(usage)?;
    let burst = s.burst.unwrap_or(s.limit);
    let max_wait = s.max_wait.unwrap_or(Duration::ZERO);
    match algorithm {
        A::FixedWindow => run(&FixedWindow::new(quota).map_err(usage)?, trace, out),
        A::SlidingWindow => run(
            &SlidingWindow::new(
                quota,
                s.buckets
                    .unwrap_or(weir_core::sliding_window::DEFAULT_BUCKETS),
            )
            .map_err(usage)?,
            trace,
            out,
        ),
        A::SlidingLog => run(&SlidingLog::new(quota).map_err(usage)?, trace, out),
        A::SlidingCounter => run(&SlidingCounter::new(quota).map_err(usage)?, trace, out),
        A::Gcra => run(&Gcra::new(quota, burst).map_err(usage)?, trace, out),
        A::TokenBucket => run(
            &TokenBucket::new(quota, burst)
                .map_err(usage)?
                .with_max_wait(max_wait),
            trace,
            out,
        ),
        A::WarmUp => run(
            &WarmupTokenBucket::new(quota, s.warmup.unwrap_or(Duration::from_secs(10)))
                .map_err(usage)?
                .with_max_wait(max_wait),
            trace,
            out,
        ),
        A::Pacing => run(&Pacing::new(quota, max_wait).map_err(usage)?, trace, out),
    }
}

/// Tracks the most units admitted in any half-open span of one window for one key.
#[derive(Debug, Default)]
struct SpanMax {
    recent: VecDeque<(Nanos, u64)>,
    sum: u64,
    best: u64,
}

impl SpanMax {
    /// Records `n` units proceeding at `t` (non-decreasing per key).
    fn record(&mut self, t: Nanos, n: u64, window: Nanos) {
        self.recent.push_back((t, n));
        self.sum += n;
        while let Some(&(t0, n0)) = self.recent.front() {
            if t - t0 < window {
                break;
            }
            self.sum -= n0;
            self.recent.pop_front();
        }
        self.best = self.best.max(self.sum);
    }
}

fn run<A: Algorithm>(alg: &A, trace: &Trace, out: &mut dyn Write) -> Result<Summary, SimError> {
    let window = weir_core::clock::duration_to_nanos(alg.window());
    let mut states: Vec<Option<A::State>> = vec![None; trace.keys.len()];
    let mut spans: Vec<SpanMax> = (0..trace.keys.len()).map(|_| SpanMax::default()).collect();
    let mut summary = Summary {
        events: 0,
        allowed: 0,
        denied: 0,
        max_in_window: Vec::new(),
        timeline: Timeline::new(trace, window),
    };
    let mut write = |line: fmt::Arguments<'_>| -> bool {
        // A closed pipe (e.g. `| head`) ends the output quietly; the summary still prints.
        out.write_fmt(line).is_ok()
    };
    let mut writing = write(format_args!(
        "t_ms,key,cost,allowed,remaining,retry_after_ms,wait_ms\n"
    ));
    for e in &trace.events {
        let key = e.key as usize;
        let state = states[key].get_or_insert_with(|| alg.initial_state(e.t));
        let d = alg.decide(state, e.cost, e.t);
        summary.events += 1;
        summary.timeline.add(e.t, e.cost, 0);
        if d.allowed() {
            summary.allowed += 1;
            let proceed =
                e.t.saturating_add(weir_core::clock::duration_to_nanos(d.wait()));
            if e.cost > 0 {
                spans[key].record(proceed, e.cost, window);
                summary.timeline.add(proceed, 0, e.cost);
            }
        } else {
            summary.denied += 1;
        }
        if writing {
            let retry = d
                .retry_after()
                .map(|r| format_ms(r.as_nanos()))
                .unwrap_or_default();
            writing = write(format_args!(
                "{},{},{},{},{},{},{}\n",
                format_ms(u128::from(e.t)),
                trace.keys[key],
                e.cost,
                d.allowed(),
                d.remaining(),
                retry,
                format_ms(d.wait().as_nanos()),
            ));
        }
    }
    let _ = out.flush();
    summary.max_in_window = trace
        .keys
        .iter()
        .zip(&spans)
        .map(|(k, s)| (k.clone(), s.best))
        .collect();
    Ok(summary)
}

/// Writes the summary for humans.
pub fn write_summary(
    settings: &Settings,
    summary: &Summary,
    err: &mut dyn Write,
) -> io::Result<()> {
    writeln!(
        err,
        "events: {}  allowed: {}  denied: {}  ({} {} per {})",
        summary.events,
        summary.allowed,
        summary.denied,
        settings.algorithm,
        settings.limit,
        humantime(settings.window)
    )?;
    writeln!(
        err,
        "most units admitted in any {} span, per key:",
        humantime(settings.window)
    )?;
    let mut keys = summary.max_in_window.clone();
    keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    const SHOWN: usize = 20;
    for (key, max) in keys.iter().take(SHOWN) {
        let key = if key.is_empty() { "(empty key)" } else { key };
        writeln!(err, "  {key}: {max}")?;
    }
    if keys.len() > SHOWN {
        writeln!(err, "  … and {} more keys", keys.len() - SHOWN)?;
    }
    Ok(())
}

fn humantime(d: Duration) -> String {
    let ns = d.as_nanos();
    for (unit, scale) in [
        ("d", 86_400_000_000_000u128),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ] {
        if ns >= scale && ns % scale == 0 {
            return format!("{}{unit}", ns / scale);
        }
    }
    format!("{ns}ns")
}

/// The report's column for one run (`--report`): its settings, its totals, and the units
/// offered and admitted in every window-length span ending at each slice, beside the limit.
pub fn report_section(
    settings: &Settings,
    trace_keys: usize,
    summary: &Summary,
) -> crate::report::Section {
    use crate::report::{Chart, Section, Series};
    let s = settings;
    let window = weir_core::clock::duration_to_nanos(s.window).max(1);
    let t = &summary.timeline;
    // Spans of one window (k slices); a timeline of slices longer than the window sums one.
    let k = usize::try_from((window / t.slice.max(1)).max(1)).unwrap_or(1);
    let span = t.slice.saturating_mul(k as u64);
    let rolling = |pick: fn(&(u64, u64)) -> u64| -> Vec<(f64, f64)> {
        let mut sum = 0u64;
        t.units
            .iter()
            .enumerate()
            .map(|(i, u)| {
                sum += pick(u);
                if i >= k {
                    sum -= pick(&t.units[i - k]);
                }
                let end = (i as u64 + 1) * t.slice;
                (end as f64 / 1e9, sum as f64)
            })
            .collect()
    };
    let end = t.units.len() as f64 * t.slice as f64 / 1e9;
    let keys = trace_keys.max(1) as f64;
    let limit = s.limit as f64 * span as f64 / window as f64 * keys;
    let limit_name = if trace_keys > 1 {
        format!("limit × {trace_keys} keys")
    } else {
        "limit".to_string()
    };
    let most = summary
        .max_in_window
        .iter()
        .map(|(_, m)| *m)
        .max()
        .unwrap_or(0);
    let mut title = format!("{} {} per {}", s.algorithm, s.limit, humantime(s.window));
    if let Some(b) = s.burst {
        title.push_str(&format!(", burst {b}"));
    }
    if let Some(w) = s.max_wait {
        title.push_str(&format!(", max wait {}", humantime(w)));
    }
    Section {
        title,
        facts: vec![
            ("events".into(), summary.events.to_string()),
            ("allowed".into(), summary.allowed.to_string()),
            ("denied".into(), summary.denied.to_string()),
            (
                format!("most admitted in any {} span, one key", humantime(s.window)),
                format!(
                    "{most} ({:.2} × the limit)",
                    most as f64 / s.limit.max(1) as f64
                ),
            ),
        ],
        charts: vec![Chart {
            title: format!(
                "Units per {} span, all keys (offered, admitted when they proceed)",
                humantime(Duration::from_nanos(span))
            ),
            x: "seconds from the first event".into(),
            y: format!("units per {}", humantime(Duration::from_nanos(span))),
            series: vec![
                Series::line("offered", rolling(|u| u.0)),
                Series::line("admitted", rolling(|u| u.1)),
                Series::reference(&limit_name, vec![(0.0, limit), (end, limit)]),
            ],
            bars: None,
        }],
    }
}

impl Trace {
    /// How many keys the trace has.
    pub fn keys(&self) -> usize {
        self.keys.len()
    }
}
