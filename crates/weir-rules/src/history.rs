//! [`History`]: the last minutes of a rule set, second by second, for dashboards.
//!
//! Fed one [`Snapshot`] per second (by whoever owns a timer: weir-tower's dashboard router runs
//! one task), it keeps per resource a ring of [`Point`]s — calls passed and blocked in that
//! second (blocks split by kind), errors, calls in flight, p50 / p99 response time — and per
//! circuit breaker its state changes. Only seconds with activity are stored (a resource idle
//! all along costs its name): [`Point`] is 64 bytes, so the default 300 seconds cost at most
//! ≈ 19 KiB per resource busy every second, and at most [`MAX_TRANSITIONS`] state changes are
//! kept per breaker; [`History::points_since`] gives every second, idle ones as zeros.
//! Recording a second costs time linear in the resources listed: a full snapshot
//! ([`History::record`]) or only those that changed ([`History::record_changed`], with
//! [`History::retain`] when the rule set changes). Resources that leave the rule set leave
//! the history. Counters come from the same atomics as `/metrics`; nothing here touches
//! the decision path.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use serde::Serialize;
use weir_core::breaker::BreakerState;

use crate::metrics::{BreakerSnapshot, ResourceSnapshot, Snapshot};

/// Seconds kept by [`History::default`] (5 minutes).
pub const DEFAULT_SECONDS: usize = 300;
/// State changes kept per breaker.
pub const MAX_TRANSITIONS: usize = 64;

/// Calls blocked in one second, by the kind of rule that blocked them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct BlockedBy {
    /// Flow rules (rate, concurrency, cluster).
    pub flow: u32,
    /// Hot-parameter rules.
    pub hot_param: u32,
    /// Authority rules.
    pub authority: u32,
    /// Circuit breakers.
    pub breaker: u32,
    /// The system rule.
    pub system: u32,
    /// Switches turned on.
    pub switch: u32,
    /// Calls a shadow rule would have blocked (they passed: not in `blocked`).
    pub shadow: u32,
}

/// One resource during one second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    /// The second (Unix time) the counts end at.
    pub t: u64,
    /// Calls admitted.
    pub passed: u32,
    /// Calls blocked by any rule.
    pub blocked: u32,
    /// Blocks per kind.
    pub blocked_by: BlockedBy,
    /// Calls that ended with an error.
    pub errors: u32,
    /// Calls admitted and not ended at the end of the second.
    pub in_flight: u32,
    /// Median response time of the calls that ended, in milliseconds (0 when none ended).
    pub p50_ms: f32,
    /// 99th percentile response time, in milliseconds.
    pub p99_ms: f32,
}

impl Point {
    /// Second `t` with nothing passed, blocked, ended or in flight.
    pub fn idle(t: u64) -> Self {
        Self {
            t,
            passed: 0,
            blocked: 0,
            blocked_by: BlockedBy::default(),
            errors: 0,
            in_flight: 0,
            p50_ms: 0.0,
            p99_ms: 0.0,
        }
    }

    /// Whether nothing happened in this second (it is then not stored).
    pub fn is_idle(&self) -> bool {
        *self == Self::idle(self.t)
    }
}

/// A breaker's change of state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Transition {
    /// When it was seen (Unix seconds; within a second of when it happened).
    pub t: u64,
    /// The state before.
    pub from: &'static str,
    /// The state after.
    pub to: &'static str,
}

/// A breaker's current state and its recent changes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BreakerTrack {
    /// The breaker rule's id.
    pub rule: String,
    /// Its resource.
    pub resource: String,
    /// Its state now.
    pub state: &'static str,
    /// Recent changes, oldest first.
    pub transitions: VecDeque<Transition>,
}

/// A state's lower-case name (`closed`, `open`, `half_open`, `ramping`).
pub fn state_name(s: BreakerState) -> &'static str {
    match s {
        BreakerState::Closed => "closed",
        BreakerState::Open => "open",
        BreakerState::HalfOpen => "half_open",
        BreakerState::Ramping => "ramping",
    }
}

/// Per-second history of a rule set (see the module documentation).
#[derive(Debug)]
pub struct History {
    seconds: usize,
    /// The seconds recorded, oldest first (at most `seconds`).
    recorded: VecDeque<u64>,
    /// The last second recorded (or the baseline's).
    last: Option<u64>,
    /// Each resource's counters when it was last recorded.
    previous: HashMap<String, ResourceSnapshot>,
    series: BTreeMap<String, VecDeque<Point>>,
    breakers: BTreeMap<String, BreakerTrack>,
}

impl Default for History {
    fn default() -> Self {
        Self::new(DEFAULT_SECONDS)
    }
}

impl History {
    /// A history keeping `seconds` points per resource (at least 1).
    pub fn new(seconds: usize) -> Self {
        Self {
            seconds: seconds.max(1),
            recorded: VecDeque::new(),
            last: None,
            previous: HashMap::new(),
            series: BTreeMap::new(),
            breakers: BTreeMap::new(),
        }
    }

    /// Adds the second ending at `t` (Unix seconds) from `resources`, every resource's
    /// counters then (a rule set's [`Snapshot::resources`], or any source's counters in that
    /// shape), and the breakers' states: resources and breakers not listed leave the history.
    /// The first call only sets the baseline; a call for the same second as the last or an
    /// earlier one is ignored.
    pub fn record(
        &mut self,
        t: u64,
        resources: Vec<ResourceSnapshot>,
        breakers: &[BreakerSnapshot],
    ) {
        if self.last.is_some_and(|last| t <= last) {
            return;
        }
        let names: HashSet<&str> = resources.iter().map(|r| r.name.as_str()).collect();
        let rules: HashSet<&str> = breakers.iter().map(|b| b.rule.as_str()).collect();
        self.retain(|name| names.contains(name), |rule| rules.contains(rule));
        self.record_changed(t, resources, breakers);
    }

    /// Adds the second ending at `t` from the resources and breakers that changed since the
    /// last second (a rule set's [`crate::engine::Rules::changed_snapshot`]); the others had
    /// an idle second. Costs time linear in what is listed, whatever the number of resources.
    /// The first call only sets the baseline; a call for the same second as the last or an
    /// earlier one is ignored.
    pub fn record_changed(
        &mut self,
        t: u64,
        resources: Vec<ResourceSnapshot>,
        breakers: &[BreakerSnapshot],
    ) {
        if self.last.is_some_and(|last| t <= last) {
            return;
        }
        self.track_breakers(t, breakers);
        let baseline = self.last.is_none();
        self.last = Some(t);
        if !baseline {
            if self.recorded.len() == self.seconds {
                self.recorded.pop_front();
            }
            self.recorded.push_back(t);
        }
        let oldest = self.recorded.front().copied().unwrap_or(t);
        for r in resources {
            if !self.series.contains_key(&r.name) {
                self.series.insert(r.name.clone(), VecDeque::new());
            }
            if let Some(ring) = self.series.get_mut(&r.name) {
                while ring.front().is_some_and(|p| p.t < oldest) {
                    ring.pop_front();
                }
                if !baseline {
                    let p = point(t, &r, self.previous.get(&r.name));
                    if !p.is_idle() {
                        ring.push_back(p);
                    }
                }
            }
            match self.previous.get_mut(&r.name) {
                Some(before) => *before = r,
                None => {
                    self.previous.insert(r.name.clone(), r);
                }
            }
        }
    }

    /// Keeps only the resources and breaker rules for which `resource` and `breaker` hold
    /// (the rule set changed).
    pub fn retain(&mut self, resource: impl Fn(&str) -> bool, breaker: impl Fn(&str) -> bool) {
        self.series.retain(|name, _| resource(name));
        self.previous.retain(|name, _| resource(name));
        self.breakers.retain(|rule, _| breaker(rule));
    }

    /// [`History::record`] of a rule set's snapshot.
    pub fn record_snapshot(&mut self, t: u64, snap: Snapshot) {
        self.record(t, snap.resources, &snap.breakers);
    }

    fn track_breakers(&mut self, t: u64, breakers: &[BreakerSnapshot]) {
        for b in breakers {
            let now = state_name(b.state);
            let track = self
                .breakers
                .entry(b.rule.clone())
                .or_insert_with(|| BreakerTrack {
                    rule: b.rule.clone(),
                    resource: b.resource.clone(),
                    state: now,
                    transitions: VecDeque::new(),
                });
            if track.state != now {
                if track.transitions.len() == MAX_TRANSITIONS {
                    track.transitions.pop_front();
                }
                track.transitions.push_back(Transition {
                    t,
                    from: track.state,
                    to: now,
                });
                track.state = now;
            }
        }
    }

    /// The first second of the window (points before it are no longer shown).
    fn oldest(&self) -> u64 {
        self.recorded.front().copied().unwrap_or(u64::MAX)
    }

    /// The resources with history, by name, each with its seconds that had activity within
    /// the window (idle seconds are not stored; [`History::points_since`] fills them in).
    pub fn resources(&self) -> impl Iterator<Item = (&str, impl Iterator<Item = &Point>)> {
        let oldest = self.oldest();
        self.series
            .iter()
            .map(move |(k, v)| (k.as_str(), v.iter().filter(move |p| p.t >= oldest)))
    }

    /// Points of `resource`, one per second recorded after second `since` (all with
    /// `since = 0`), idle seconds as zeros; none for a resource without history.
    pub fn points_since(&self, resource: &str, since: u64) -> Vec<Point> {
        let Some(ring) = self.series.get(resource) else {
            return Vec::new();
        };
        let from = since.max(self.oldest().saturating_sub(1));
        let mut stored = ring.iter().filter(|p| p.t > from).peekable();
        self.recorded
            .iter()
            .filter(|t| **t > since)
            .map(|&t| match stored.next_if(|p| p.t == t) {
                Some(p) => *p,
                None => Point::idle(t),
            })
            .collect()
    }

    /// Every breaker's state and recent changes.
    pub fn breakers(&self) -> impl Iterator<Item = &BreakerTrack> {
        self.breakers.values()
    }

    /// The second last recorded.
    pub fn last_second(&self) -> Option<u64> {
        self.last
    }

    /// Seconds kept per resource.
    pub fn seconds(&self) -> usize {
        self.seconds
    }
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The second of `now` against `before` (counters that went back, after a rebuild, count
/// from zero).
fn point(t: u64, now: &ResourceSnapshot, before: Option<&ResourceSnapshot>) -> Point {
    let delta = |f: &dyn Fn(&ResourceSnapshot) -> u64| {
        let n = f(now);
        clamp(n - before.map_or(0, |b| f(b).min(n)))
    };
    let kind = |i: usize| delta(&|r| r.blocked_by[i]);
    let buckets: Vec<(f64, u64)> = now
        .rt_buckets
        .iter()
        .enumerate()
        .map(|(i, &(le, c))| {
            let old = before
                .and_then(|b| b.rt_buckets.get(i))
                .map_or(0, |o| o.1.min(c));
            (le, c - old)
        })
        .collect();
    Point {
        t,
        passed: delta(&|r| r.passes),
        blocked: delta(&|r| r.blocks),
        blocked_by: BlockedBy {
            flow: kind(0),
            hot_param: kind(1),
            authority: kind(2),
            breaker: kind(3),
            system: kind(4),
            switch: kind(5),
            shadow: delta(&|r| r.shadow_blocks),
        },
        errors: delta(&|r| r.errors),
        in_flight: clamp(now.in_flight),
        p50_ms: microseconds(quantile(&buckets, 0.5)),
        p99_ms: microseconds(quantile(&buckets, 0.99)),
    }
}

/// Milliseconds rounded to whole microseconds (the histogram is no finer).
fn microseconds(ms: f64) -> f32 {
    ((ms * 1000.0).round() / 1000.0) as f32
}

/// The `q` quantile in milliseconds of a cumulative histogram (upper bounds in seconds),
/// interpolated linearly inside its bucket; 0 when empty. Beyond the last finite bound it is
/// that bound.
fn quantile(cumulative: &[(f64, u64)], q: f64) -> f64 {
    let Some(&(_, total)) = cumulative.last() else {
        return 0.0;
    };
    if total == 0 {
        return 0.0;
    }
    let rank = q * total as f64;
    let mut lower = (0.0, 0u64);
    for &(le, c) in cumulative {
        if c as f64 >= rank {
            if le.is_infinite() {
                return lower.0 * 1000.0;
            }
            let inside = (c - lower.1) as f64;
            let f = if inside > 0.0 {
                (rank - lower.1 as f64) / inside
            } else {
                1.0
            };
            return (lower.0 + (le - lower.0) * f) * 1000.0;
        }
        lower = (le, c);
    }
    lower.0 * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_is_64_bytes_as_documented() {
        assert_eq!(std::mem::size_of::<Point>(), 64);
    }

    #[test]
    fn quantiles_interpolate_inside_buckets() {
        // 100 calls: 50 under 1 ms, 49 in (1, 10] ms, 1 in +Inf.
        let h = [(0.001, 50), (0.01, 99), (f64::INFINITY, 100)];
        assert!((quantile(&h, 0.5) - 1.0).abs() < 1e-3);
        let p99 = quantile(&h, 0.99);
        assert!((p99 - 10.0).abs() < 1e-3, "{p99}");
        assert_eq!(quantile(&[(0.001, 0), (f64::INFINITY, 0)], 0.5), 0.0);
        assert_eq!(quantile(&[(0.001, 0), (f64::INFINITY, 4)], 0.5), 1.0);
    }
}
