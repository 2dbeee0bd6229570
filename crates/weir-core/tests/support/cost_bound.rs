//! The bounds a cost-aware limiter keeps, checked on the ledger of a timeline of calls (one
//! entry per admission and per settlement): shared by the tests of weir-core (in memory),
//! weir-redis (the settle script) and weir-quota (the lease client).

#![allow(dead_code)]

use proptest::prelude::*;

/// A ledger entry: at `t`, `units` charged (negative: refunded), `excess` forced past the
/// limit; `call` numbers the call (its admission and its settlement share it), `estimate` and
/// `actual` are the call's.
pub struct Entry {
    pub t: u64,
    pub units: i64,
    pub excess: u64,
    pub admission: bool,
    pub call: usize,
    pub estimate: u64,
    pub actual: u64,
}

impl Entry {
    /// Call `call` (to cost `actual`) admitted at `t`, holding `estimate`.
    pub fn admitted(t: u64, call: usize, estimate: u64, actual: u64) -> Self {
        Self {
            t,
            units: estimate as i64,
            excess: 0,
            admission: true,
            call,
            estimate,
            actual,
        }
    }

    /// Call `call`, which held `estimate`, settled at `t` to `actual`.
    pub fn settled(t: u64, call: usize, estimate: u64, actual: u64) -> Self {
        Self {
            t,
            units: actual as i64 - estimate as i64,
            excess: actual.saturating_sub(estimate),
            admission: false,
            call,
            estimate,
            actual,
        }
    }
}

/// What the calls admitted in `[t1, t]` cost by `t` — their actual costs once settled, their
/// estimates while running — against `burst + rate × (t − t1)` plus the excesses settled in
/// the window plus the estimates outstanding at `t1` (calls admitted before, settled after:
/// their refunds free room charged before the window). Checked for every admission `t1` and
/// every later event `t`; `credit` is what one grant may take beyond the bound (Guava's token
/// bucket lends its last grant). Answers the first violation.
pub fn tokens_used_within(
    ledger: &[Entry],
    interval: u64,
    burst: u64,
    credit: u64,
) -> Result<(), String> {
    let settled: std::collections::HashMap<usize, u64> = ledger
        .iter()
        .filter(|e| !e.admission)
        .map(|e| (e.call, e.t))
        .collect();
    let admitted: Vec<&Entry> = ledger.iter().filter(|e| e.admission).collect();
    for (i, start) in admitted.iter().enumerate() {
        let t1 = start.t;
        let outstanding: u64 = admitted[..i]
            .iter()
            .filter(|c| c.t < t1 && settled.get(&c.call).is_none_or(|s| *s >= t1))
            .map(|c| c.estimate)
            .sum();
        for end in ledger.iter().filter(|e| e.t >= t1) {
            let t = end.t;
            let used: u64 = admitted[i..]
                .iter()
                .filter(|c| c.t <= t)
                .map(|c| match settled.get(&c.call) {
                    Some(s) if *s <= t => c.actual,
                    _ => c.estimate,
                })
                .sum();
            let excess: u64 = ledger
                .iter()
                .filter(|e| !e.admission && e.t >= t1 && e.t <= t)
                .map(|e| e.excess)
                .sum();
            let bound = burst + (t - t1) / interval + 1 + credit + excess + outstanding;
            if used > bound {
                return Err(format!(
                    "calls admitted in [{t1}, {t}] cost {used}: bound {bound} (excess {excess}, outstanding at the start {outstanding})"
                ));
            }
        }
    }
    Ok(())
}

/// The fixed window's form: in each aligned window, what its calls cost by the window's end is
/// at most the limit plus the window's excesses (a refund never reaches another window).
pub fn tokens_used_per_window(ledger: &[Entry], window: u64, limit: u64) -> Result<(), String> {
    let settled: std::collections::HashMap<usize, u64> = ledger
        .iter()
        .filter(|e| !e.admission)
        .map(|e| (e.call, e.t))
        .collect();
    let mut starts: Vec<u64> = ledger.iter().map(|e| e.t / window * window).collect();
    starts.dedup();
    for w in starts {
        let end = w + window;
        let used: u64 = ledger
            .iter()
            .filter(|e| e.admission && e.t >= w && e.t < end)
            .map(|c| match settled.get(&c.call) {
                Some(s) if *s < end => c.actual,
                _ => c.estimate,
            })
            .sum();
        let excess: u64 = ledger
            .iter()
            .filter(|e| !e.admission && e.t >= w && e.t < end)
            .map(|e| e.excess)
            .sum();
        if used > limit + excess {
            return Err(format!(
                "window {w}: its calls cost {used}, limit {limit} + excess {excess}"
            ));
        }
    }
    Ok(())
}

/// One step of a timeline: wait `dt` ms, then ask for `estimate` (to cost `actual`, settled
/// `hold` ms later).
#[derive(Debug, Clone)]
pub struct Step {
    pub dt: u64,
    pub estimate: u64,
    pub actual: u64,
    pub hold: u64,
}

/// Timelines of up to 300 calls with estimates 1–59 and actual costs 0–119 at 100 units/s,
/// each lasting from 1 ms to 100 × (estimate ÷ rate) — cubed, so short and long calls both
/// come often — so many are in flight at once and many outlast a refill of their estimate.
pub fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0u64..40, 1u64..60, 0u64..120, 0.0f64..1.0).prop_map(|(dt, estimate, actual, x)| {
            // estimate ÷ rate = estimate × 10 ms; 100 × that = estimate × 1 000 ms.
            let longest = estimate * 1_000;
            Step {
                dt,
                estimate,
                actual,
                hold: 1 + (x * x * x * longest as f64) as u64,
            }
        }),
        1..300,
    )
}

/// Runs `steps` from `start` (ns): each step `dt` ms after the last, `admit(estimate, now)`
/// holds the estimate (`None`: refused) and `settle(held, actual, at)` settles it `hold` ms
/// later — settlements due before a step first, in time order. Answers the ledger, in the
/// order things happened (times never decrease).
pub fn run_timeline<H>(
    steps: &[Step],
    start: u64,
    mut admit: impl FnMut(u64, u64) -> Option<H>,
    mut settle: impl FnMut(H, u64, u64),
) -> Vec<Entry> {
    let mut ledger = Vec::new();
    // (due, held, actual, call, estimate)
    let mut open: Vec<(u64, H, u64, usize, u64)> = Vec::new();
    let mut now = start;
    let mut settle_until =
        |open: &mut Vec<(u64, H, u64, usize, u64)>, ledger: &mut Vec<Entry>, until: u64| loop {
            let Some(i) = (0..open.len())
                .filter(|&i| open[i].0 <= until)
                .min_by_key(|&i| open[i].0)
            else {
                return;
            };
            let (at, held, actual, call, estimate) = open.swap_remove(i);
            settle(held, actual, at);
            ledger.push(Entry::settled(at, call, estimate, actual));
        };
    for (call, s) in steps.iter().enumerate() {
        now += s.dt * 1_000_000;
        settle_until(&mut open, &mut ledger, now);
        if let Some(held) = admit(s.estimate, now) {
            ledger.push(Entry::admitted(now, call, s.estimate, s.actual));
            open.push((now + s.hold * 1_000_000, held, s.actual, call, s.estimate));
        }
    }
    settle_until(&mut open, &mut ledger, u64::MAX);
    ledger
}
