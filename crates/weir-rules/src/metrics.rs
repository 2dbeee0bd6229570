//! Counters kept by the rules engine: per rule (passes, blocks, shadow blocks, evictions,
//! values refused at the bound) and per resource (passes, blocks, in flight, completions,
//! errors, a response-time histogram). Lock-free atomics on the call path; read them with
//! [`crate::engine::Rules::snapshot`] and expose them as you like (`weir proxy` serves them as
//! Prometheus text).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use weir_core::stats::{Outcome, StatsWindow};
use weir_core::striped::{Striped, StripedCounter};
use weir_core::Nanos;

/// Upper bounds of the response-time histogram's buckets, in seconds (the last bucket, +Inf, is
/// implicit).
pub const RT_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The same bounds in nanoseconds.
const RT_BUCKETS_NS: [u64; RT_BUCKETS.len()] = bounds_ns(RT_BUCKETS);

/// Histogram bounds in seconds as whole nanoseconds (rounded), computed at compile time so the
/// two lists cannot drift apart.
pub const fn bounds_ns<const N: usize>(seconds: [f64; N]) -> [u64; N] {
    let mut out = [0u64; N];
    let mut i = 0;
    while i < N {
        out[i] = (seconds[i] * 1e9 + 0.5) as u64;
        i += 1;
    }
    out
}

/// Counters of one rule.
#[derive(Debug, Default)]
pub struct RuleStats {
    /// Calls it let through (counted on every pass: striped per thread).
    pub passes: StripedCounter,
    /// Calls it blocked.
    pub blocks: AtomicU64,
    /// Calls it would have blocked in shadow mode.
    pub shadow_blocks: AtomicU64,
    /// Hot-parameter rules: calls whose value found the table full (`on_full: reject/allow`).
    pub full: AtomicU64,
    /// Soft budgets: calls admitted past the limit.
    pub over: AtomicU64,
    /// Budgets: warnings logged (a key reached a threshold first in its period).
    pub warnings: AtomicU64,
}

/// Slots of the histogram's counters: one per bucket (with +Inf), then the sum in nanoseconds.
const RT_SLOTS: usize = RT_BUCKETS.len() + 2;

/// A response-time histogram with fixed buckets ([`RT_BUCKETS`]), striped per thread (an
/// observation is two plain stores on the calling thread's stripe).
#[derive(Debug, Default)]
pub struct RtHistogram {
    slots: Striped<RT_SLOTS>,
}

impl RtHistogram {
    /// Records one response time.
    #[inline]
    pub fn observe(&self, rt: Nanos) {
        let i = RT_BUCKETS_NS.partition_point(|b| *b < rt);
        self.slots.add_each([(i, 1), (RT_SLOTS - 1, rt)]);
    }

    /// Cumulative counts per bucket bound (the last entry is +Inf, i.e. the total) and the sum.
    pub fn read(&self) -> (Vec<(f64, u64)>, Duration) {
        let slots = self.slots.read();
        let mut total = 0;
        let mut out = Vec::with_capacity(RT_SLOTS - 1);
        for (i, c) in slots[..RT_SLOTS - 1].iter().enumerate() {
            total += c;
            out.push((RT_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY), total));
        }
        (out, Duration::from_nanos(slots[RT_SLOTS - 1]))
    }
}

/// Counters of one resource, kept across reloads while the resource is declared. Three
/// additions per call (passes, one histogram bucket, the RT sum), striped per thread;
/// completions are the histogram's total and in flight is passes − completions.
#[derive(Debug)]
pub struct ResourceStats {
    /// The last second's passes in 10 buckets, kept only when a relate rule reads them.
    pub(crate) window: StatsWindow,
    pub(crate) related: std::sync::atomic::AtomicBool,
    passes: StripedCounter,
    /// Blocks by [`RuleKind`] (its discriminant).
    blocks: [AtomicU64; RuleKind::COUNT],
    errors: AtomicU64,
    fallbacks: AtomicU64,
    rt: RtHistogram,
    /// A call came, was blocked or ended since the dashboard last sampled this resource (so
    /// a sampler reads only resources that changed).
    touched: std::sync::atomic::AtomicBool,
    /// What calls under `cost:` rules cost.
    cost: CostStats,
    /// What its calls recently cost, for `estimate: learned` (made on the first settlement of
    /// a resource that learns; kept across reloads with the stats).
    learned: std::sync::OnceLock<Box<weir_core::learned::LearnedCost>>,
}

/// How many of a resource's heaviest spenders are kept.
pub const TOP_SPENDERS: usize = 10;

/// What the calls of a resource with `cost:` rules cost, counted when each call's cost is
/// known (settled, or ended without a settlement: its estimate).
#[derive(Debug)]
struct CostStats {
    admitted: AtomicU64,
    refunded: AtomicU64,
    owed: AtomicU64,
    /// Spenders by units charged (a hot-parameter value, else the origin).
    top: parking_lot::Mutex<weir_core::TopK>,
    /// What each call whose cost became known used, per [`USAGE_BUCKETS`] bucket (+Inf last).
    usage: [AtomicU64; USAGE_BUCKETS.len() + 1],
    /// Their sum.
    usage_sum: AtomicU64,
}

/// Upper bounds of the usage histogram's buckets, in the rules' units (tokens for LLM calls):
/// the powers of 4 from 1 to 4^13 that OpenTelemetry's GenAI semantic conventions advise for
/// `gen_ai.client.token.usage` (+Inf implicit).
pub const USAGE_BUCKETS: [u64; 14] = [
    1, 4, 16, 64, 256, 1_024, 4_096, 16_384, 65_536, 262_144, 1_048_576, 4_194_304, 16_777_216,
    67_108_864,
];

impl Default for CostStats {
    fn default() -> Self {
        Self {
            admitted: AtomicU64::new(0),
            refunded: AtomicU64::new(0),
            owed: AtomicU64::new(0),
            top: parking_lot::Mutex::new(weir_core::TopK::new(TOP_SPENDERS)),
            usage: Default::default(),
            usage_sum: AtomicU64::new(0),
        }
    }
}

/// What the calls of a resource with `cost:` rules cost, in the rules' units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CostSnapshot {
    /// Estimates held by calls admitted (and not given back because a later rule blocked).
    pub admitted: u64,
    /// Units given back when calls cost less than their estimates (or failed).
    pub refunded: u64,
    /// Units charged beyond estimates when calls cost more (debts later calls waited out).
    pub owed: u64,
    /// The heaviest spenders by units charged (a hot-parameter value, else the origin), most
    /// first.
    pub top: Vec<weir_core::top_k::Heavy>,
    /// Calls whose cost became known, per [`USAGE_BUCKETS`] bucket by what they used (+Inf
    /// last; not cumulative). Calls abandoned before their cost was known are not in it.
    pub usage: Vec<u64>,
    /// What those calls used, in all.
    pub usage_sum: u64,
    /// What the resource's `actual_from` counts: `input` or `output` tokens when its field or
    /// header names them (`prompt_tokens`, `input_tokens`, `completion_tokens`,
    /// `output_tokens`), else `total`; `None` without `actual_from`.
    pub usage_kind: Option<&'static str>,
}

impl CostSnapshot {
    /// Nothing was held, settled or used yet (a resource without `cost:` rules stays so).
    pub fn is_empty(&self) -> bool {
        self.admitted == 0
            && self.refunded == 0
            && self.owed == 0
            && self.top.is_empty()
            && self.usage.iter().all(|&n| n == 0)
    }
}

impl ResourceStats {
    pub(crate) fn new() -> Self {
        Self {
            window: second_window(),
            related: std::sync::atomic::AtomicBool::new(false),
            passes: StripedCounter::default(),
            blocks: Default::default(),
            errors: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            rt: RtHistogram::default(),
            touched: std::sync::atomic::AtomicBool::new(true),
            cost: CostStats::default(),
            learned: std::sync::OnceLock::new(),
        }
    }

    /// A call's cost became known: `estimate: learned` learns it.
    pub(crate) fn learn(&self, actual: u64) {
        self.learned.get_or_init(Box::default).record(actual);
    }

    /// What its calls recently cost (`None` until enough settled).
    pub(crate) fn learned(&self) -> Option<weir_core::learned::Quantiles> {
        self.learned.get()?.quantiles()
    }

    /// A call under `cost:` rules that held `estimate` cost `actual` (charged to `spender`;
    /// `known`: what it really used, not a bound charged for a call abandoned).
    pub(crate) fn cost(&self, spender: &str, estimate: u64, actual: u64, known: bool) {
        let c = &self.cost;
        self.touch();
        if known {
            let bucket = USAGE_BUCKETS.partition_point(|&b| b < actual);
            c.usage[bucket].fetch_add(1, Ordering::Relaxed);
            c.usage_sum.fetch_add(actual, Ordering::Relaxed);
        }
        c.admitted.fetch_add(estimate, Ordering::Relaxed);
        if actual < estimate {
            c.refunded.fetch_add(estimate - actual, Ordering::Relaxed);
        } else if actual > estimate {
            c.owed.fetch_add(actual - estimate, Ordering::Relaxed);
        }
        if actual > 0 {
            c.top.lock().record_n(spender, actual);
        }
    }

    /// Marks the resource changed: one relaxed load per call, a store only on the first
    /// call after a sample (the line is then shared again until the next second).
    #[inline]
    fn touch(&self) {
        if !self.touched.load(Ordering::Relaxed) {
            self.touched.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the resource changed since the last call of this, which clears the mark.
    pub(crate) fn take_touched(&self) -> bool {
        self.touched.load(Ordering::Relaxed) && self.touched.swap(false, Ordering::Relaxed)
    }

    /// Marks the resource to be sampled again (calls still in flight).
    pub(crate) fn keep_touched(&self) {
        self.touched.store(true, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn pass(&self, now: Nanos) {
        self.touch();
        self.passes.add(1);
        if self.related.load(Ordering::Relaxed) {
            self.window.add_pass(now, 1);
        }
    }

    /// A blocked call was answered by a fallback.
    pub(crate) fn fallback(&self) {
        self.touch();
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn block(&self, kind: RuleKind) {
        self.touch();
        self.blocks[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The call ended (`outcome` None: dropped unreported, counted without an error).
    #[inline]
    pub(crate) fn end(&self, rt: Nanos, outcome: Option<Outcome>) {
        self.touch();
        if outcome == Some(Outcome::Error) {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.rt.observe(rt);
    }

    /// The counters of the resource `name` now.
    pub(crate) fn snapshot(&self, name: &str) -> ResourceSnapshot {
        // Completions first: passes only grow, so passes read after them are never fewer.
        let (rt_buckets, rt_sum) = self.rt.read();
        let completed = rt_buckets.last().map_or(0, |b| b.1);
        let passes = self.passes.get().max(completed);
        let in_flight = passes - completed;
        let blocked_by = self.blocks.each_ref().map(|b| b.load(Ordering::Relaxed));
        ResourceSnapshot {
            name: name.to_string(),
            passes,
            blocks: blocked_by.iter().sum(),
            blocked_by,
            shadow_blocks: 0,
            in_flight,
            completed,
            errors: self.errors.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            rt_buckets,
            rt_sum,
            cost: CostSnapshot {
                admitted: self.cost.admitted.load(Ordering::Relaxed),
                refunded: self.cost.refunded.load(Ordering::Relaxed),
                owed: self.cost.owed.load(Ordering::Relaxed),
                top: self.cost.top.lock().top(),
                usage: self
                    .cost
                    .usage
                    .iter()
                    .map(|u| u.load(Ordering::Relaxed))
                    .collect(),
                usage_sum: self.cost.usage_sum.load(Ordering::Relaxed),
                usage_kind: None,
            },
        }
    }
}

/// A one-second window of ten buckets.
pub(crate) fn second_window() -> StatsWindow {
    // Constant, valid arguments (1 s / 10 = 100 ms buckets): cannot fail.
    StatsWindow::new(Duration::from_secs(1), 10, Duration::MAX)
        .expect("a 1 s window of 10 buckets is valid")
}

/// The kind of a rule, as blocks and snapshots name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RuleKind {
    /// A flow rule (rate or concurrency).
    Flow,
    /// A hot-parameter rule.
    HotParam,
    /// An authority rule.
    Authority,
    /// A circuit breaker.
    Breaker,
    /// A system rule (all inbound traffic).
    System,
    /// A switch turned on (the resource degraded by hand).
    Switch,
}

impl RuleKind {
    /// How many kinds there are.
    pub const COUNT: usize = 6;
    /// Every kind, in the order of [`ResourceSnapshot::blocked_by`].
    pub const ALL: [RuleKind; Self::COUNT] = [
        RuleKind::Flow,
        RuleKind::HotParam,
        RuleKind::Authority,
        RuleKind::Breaker,
        RuleKind::System,
        RuleKind::Switch,
    ];

    /// Lower-case name (`flow`, `hot_param`, `authority`, `breaker`, `system`, `switch`).
    pub fn as_str(self) -> &'static str {
        match self {
            RuleKind::Flow => "flow",
            RuleKind::HotParam => "hot_param",
            RuleKind::Authority => "authority",
            RuleKind::Breaker => "breaker",
            RuleKind::System => "system",
            RuleKind::Switch => "switch",
        }
    }
}

/// One rule's counters at one time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSnapshot {
    /// The rule's id.
    pub id: String,
    /// Its kind.
    pub kind: RuleKind,
    /// Its resource (`""` for system rules).
    pub resource: String,
    /// Calls it let through.
    pub passes: u64,
    /// Calls it blocked.
    pub blocks: u64,
    /// Calls it would have blocked (shadow mode).
    pub shadow_blocks: u64,
    /// Keys evicted at the bound (hot parameters, `origin: other`).
    pub evictions: u64,
    /// Calls whose value found the table full (hot parameters, `on_full: reject/allow`).
    pub full: u64,
    /// Calls a soft budget admitted past its limit.
    pub over_budget: u64,
    /// Warnings a budget logged: a key reached a threshold (80 %, 100 %) first in its period
    /// (thresholds reached by one call or settlement count once).
    pub budget_warnings: u64,
}

/// One resource's counters at one time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResourceSnapshot {
    /// The resource.
    pub name: String,
    /// Calls admitted.
    pub passes: u64,
    /// Calls blocked by any rule.
    pub blocks: u64,
    /// Calls blocked, per kind of the rule that blocked them ([`RuleKind::ALL`] order).
    pub blocked_by: [u64; RuleKind::COUNT],
    /// Calls the resource's shadow rules would have blocked (they passed).
    pub shadow_blocks: u64,
    /// Calls admitted and not ended.
    pub in_flight: u64,
    /// Calls ended.
    pub completed: u64,
    /// Calls ended with an error.
    pub errors: u64,
    /// Blocked calls answered by a fallback (a configured response or upstream) instead of
    /// the block's status; also counted in `blocks`.
    pub fallbacks: u64,
    /// Response-time histogram: cumulative counts per upper bound in seconds (+Inf last).
    pub rt_buckets: Vec<(f64, u64)>,
    /// Sum of response times.
    pub rt_sum: Duration,
    /// What calls under `cost:` rules cost (zero without such rules).
    pub cost: CostSnapshot,
}

/// A circuit breaker's state at one time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerSnapshot {
    /// The breaker rule's id.
    pub rule: String,
    /// Its resource.
    pub resource: String,
    /// Its state.
    pub state: weir_core::breaker::BreakerState,
}

/// The values a hot-parameter rule blocked most (a fixed-size sketch: see weir-core's `TopK`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeavySnapshot {
    /// The hot-parameter rule's id.
    pub rule: String,
    /// Its resource.
    pub resource: String,
    /// Blocked values, most blocked first.
    pub top: Vec<weir_core::top_k::Heavy>,
}

/// The system rule's protection at one time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SystemSnapshot {
    /// CPU usage, 0..1 (when a part reads it: `max_cpu` or `bbr`).
    pub cpu: Option<f64>,
    /// Inbound calls in flight (every resource).
    pub in_flight: u64,
    /// `max_in_flight`, if set.
    pub max_in_flight: Option<u64>,
    /// `max_cpu`, if set.
    pub max_cpu: Option<f64>,
    /// BBR's current limit on calls in flight (its estimate of max pass × min RT).
    pub bbr_limit: Option<u64>,
    /// The adaptive limiter's current limit.
    pub adaptive_limit: Option<u64>,
    /// Calls in flight under the adaptive limiter.
    pub adaptive_in_flight: Option<u64>,
}

/// Every counter of a rule set.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    /// Per resource, by name.
    pub resources: Vec<ResourceSnapshot>,
    /// Per rule, by resource then id.
    pub rules: Vec<RuleSnapshot>,
    /// Per circuit breaker, by resource.
    pub breakers: Vec<BreakerSnapshot>,
    /// Per hot-parameter rule, by resource.
    pub heavy: Vec<HeavySnapshot>,
    /// The system rule, if one is set.
    pub system: Option<SystemSnapshot>,
}

impl Snapshot {
    /// The rule `id`, if any.
    pub fn rule(&self, id: &str) -> Option<&RuleSnapshot> {
        self.rules.iter().find(|r| r.id == id)
    }

    /// The resource `name`, if declared.
    pub fn resource(&self, name: &str) -> Option<&ResourceSnapshot> {
        self.resources.iter().find(|r| r.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_in_nanoseconds_are_exact() {
        assert_eq!(RT_BUCKETS_NS[0], 500_000);
        assert_eq!(RT_BUCKETS_NS[2], 2_500_000);
        assert_eq!(RT_BUCKETS_NS[13], 10_000_000_000);
        assert_eq!(
            bounds_ns([0.000_005, 0.000_01, 0.001]),
            [5_000, 10_000, 1_000_000]
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_bounded_inclusively() {
        let h = RtHistogram::default();
        h.observe(400_000); // 0.4 ms
        h.observe(1_000_000); // exactly 1 ms: the 1 ms bucket (le)
        h.observe(30_000_000_000); // 30 s: +Inf
        let (b, sum) = h.read();
        assert_eq!(b[0], (0.0005, 1));
        assert_eq!(b[1], (0.001, 2));
        assert_eq!(b[13], (10.0, 2));
        assert_eq!(b[14].1, 3);
        assert!(b[14].0.is_infinite());
        assert_eq!(sum, Duration::from_nanos(30_001_400_000));
    }

    #[test]
    fn usage_counts_known_costs_only_in_inclusive_buckets() {
        let r = ResourceStats::new();
        r.cost("ann", 100, 4, true); // exactly 4: the ≤ 4 bucket
        r.cost("ann", 100, 5, true); // ≤ 16
        r.cost("bob", 100, 100_000_000, true); // past 4^13: +Inf
        r.cost("bob", 100, 4_000, false); // abandoned: charged, not used
        let c = r.snapshot("r").cost;
        assert_eq!(c.usage[1], 1);
        assert_eq!(c.usage[2], 1);
        assert_eq!(c.usage[USAGE_BUCKETS.len()], 1);
        assert_eq!(c.usage.iter().sum::<u64>(), 3);
        assert_eq!(c.usage_sum, 100_000_009);
        assert!(!c.is_empty());
        assert!(ResourceStats::new().snapshot("s").cost.is_empty());
    }

    #[test]
    fn the_kind_of_usage_is_read_from_the_sources_name() {
        use crate::config::ActualFrom;
        for (from, kind) in [
            (ActualFrom::Sse("usage.total_tokens".into()), "total"),
            (ActualFrom::Json("usage.completion_tokens".into()), "output"),
            (ActualFrom::Json("usage.output_tokens".into()), "output"),
            (ActualFrom::Sse("usage.prompt_tokens".into()), "input"),
            (ActualFrom::Header("x-input-tokens".into()), "input"),
            (ActualFrom::Trailer("x-tokens-used".into()), "total"),
        ] {
            assert_eq!(from.usage_kind(), kind, "{from:?}");
        }
    }
}
