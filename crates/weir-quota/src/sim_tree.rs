//! A tree of lease servers on virtual time (`weir simulate quota --tree 1x10x100`): the real
//! [`LeaseServer`]s and [`Upstream`]s at every level, and clients of the leaf servers, with
//! the measures that say whether the tree works — utilisation under excess demand, peak,
//! fairness against one flat server over all the clients, convergence after a demand change,
//! and what happens while a region is cut off from the root.
//!
//! Every 100 ms: clients whose refresh is due ask their leaf server (needing their demand,
//! wanting 1.2 × it + 1, as the lease client does) and admit `min(demand, rate in force)`
//! (the grant while it lasts, then the safe capacity) — a fluid model of the local limiter,
//! which the flat simulator ([`crate::sim`]) exercises request by request. Every 500 ms each
//! server below the root asks its parent what is due ([`Upstream::asks`]), answered at once,
//! except for the server cut off, whose asks fail. Deterministic for a seed.

use std::time::Duration;

use weir_core::Nanos;

use crate::allocate::needs_first;
use crate::config::QuotaConfig;
use crate::lease::{Ask, Part};
use crate::server::LeaseServer;
use crate::upstream::Upstream;

const S: Nanos = 1_000_000_000;
const TICK: Nanos = 100_000_000;
/// Servers ask their parents this often.
const UP_TICK: Nanos = 500_000_000;
const RESOURCE: &str = "r";

/// What to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeSettings {
    /// Servers per level, the root's first (`[1, 10, 100]`); each level a whole multiple of
    /// the one above.
    pub shape: Vec<usize>,
    /// Clients in all, spread evenly over the servers of the last level.
    pub clients: usize,
    /// Units per second of the one resource.
    pub capacity: f64,
    /// Lease length at every level.
    pub lease: Duration,
    /// Refresh interval at every level.
    pub refresh: Duration,
    /// Simulated time.
    pub duration: Duration,
    /// The first server of the second level cannot reach the root from .. to.
    pub cut: Option<(Duration, Duration)>,
    /// Demands and jitter.
    pub seed: u64,
}

/// The measures of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeReport {
    /// Units admitted ÷ capacity, averaged over the seconds whose demand exceeds capacity
    /// (outside the cut and the first three lease lengths).
    pub utilisation: f64,
    /// The most units admitted in any second ÷ capacity (outside the cut).
    pub peak_ratio: f64,
    /// Largest distance of a client's grant from its share under one flat server, in units/s,
    /// outside the convergence windows after each change.
    pub max_fairness_error: f64,
    /// The capacity misplaced — half the sum over the clients of the distance of their grant
    /// from their flat share, ÷ capacity — at most, outside the convergence windows (with
    /// many clients, each client's error is small however wrong the division: this is the
    /// measure of the division as a whole).
    pub max_misplaced_ratio: f64,
    /// Per demand change (but those whose minute after overlaps a cut): ms until at most 1 %
    /// of the capacity was misplaced, and stayed.
    pub converge_ms: Vec<u64>,
    /// After a cut ends: ms until at most 1 % of the capacity was misplaced, and stayed.
    pub reconverge_ms: Option<u64>,
    /// The largest of `converge_ms`.
    pub converge_ms_max: u64,
    /// The convergence bound: 3 refresh intervals per level of servers below the root and for
    /// the clients, in ms.
    pub bound_ms: u64,
    /// During the cut: the most admitted in a second ÷ capacity.
    pub cut_peak_ratio: Option<f64>,
    /// During the cut: the mean admitted per second ÷ capacity.
    pub cut_mean_ratio: Option<f64>,
}

/// Why a text is not a tree's shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// Not counts separated by `x`.
    #[error("{0:?}: expected counts of servers per level, like 1x10x100")]
    Counts(String),
    /// Fewer than 2 or more than 6 levels.
    #[error("{0:?}: 2 to 6 levels")]
    Levels(String),
    /// A level that is not a whole multiple of the one above.
    #[error("{0:?}: each level must be a whole multiple of the one above")]
    Multiple(String),
    /// More than 10 000 servers.
    #[error("{0:?}: at most 10 000 servers")]
    TooMany(String),
}

/// Reads a shape `1x10x100`: at least two levels, each a whole multiple of the one above.
pub fn parse_shape(text: &str) -> Result<Vec<usize>, ShapeError> {
    let shape: Vec<usize> = text
        .split('x')
        .map(|n| n.trim().parse::<usize>().ok().filter(|n| *n > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| ShapeError::Counts(text.to_string()))?;
    if shape.len() < 2 || shape.len() > 6 {
        return Err(ShapeError::Levels(text.to_string()));
    }
    if shape.windows(2).any(|w| w[1] % w[0] != 0) {
        return Err(ShapeError::Multiple(text.to_string()));
    }
    if shape.iter().sum::<usize>() > 10_000 {
        return Err(ShapeError::TooMany(text.to_string()));
    }
    Ok(shape)
}

struct Node {
    server: LeaseServer,
    upstream: Upstream,
    /// Its parent (index into the level above), and its client id there.
    parent: usize,
    id: String,
}

struct Client {
    id: String,
    server: usize,
    demand: f64,
    granted: f64,
    expires_at: Nanos,
    safe: f64,
    lease_id: u64,
    next_at: Nanos,
}

/// A small deterministic generator.
fn nanos(d: Duration) -> Nanos {
    Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX)
}

/// Runs the tree and measures it.
pub fn run(s: &TreeSettings) -> Result<TreeReport, weir_rules::yaml::LocatedErrors> {
    let yaml = format!(
        "resources:\n  - {{name: {RESOURCE}, capacity: {}, lease: {}ms, refresh: {}ms}}\n",
        s.capacity,
        s.lease.as_millis(),
        s.refresh.as_millis()
    );
    let config = QuotaConfig::from_yaml(std::path::Path::new("tree.yaml"), &yaml)?;
    let mut levels = levels(s, &config);
    let mut rng = crate::rng::Rng::new(s.seed);
    let mut clients = clients(s, &mut rng);
    // Demand changes: at a third and two thirds of the run, a tenth of the clients triple
    // their demand, then go back.
    let duration = nanos(s.duration);
    let changes = [duration / 3, 2 * duration / 3];
    let changed: Vec<usize> = (0..s.clients).filter(|i| i % 10 == 3).collect();
    let cut = s.cut.map(|(a, b)| (nanos(a), nanos(b)));
    // (demand, admitted, largest error, misplaced, cut)
    let mut seconds: Vec<(f64, f64, f64, f64, bool)> = Vec::new();
    let mut admitted = 0.0;
    let mut now: Nanos = 0;
    while now < duration {
        for (k, &at) in changes.iter().enumerate() {
            if now == at - at % TICK {
                for &i in &changed {
                    clients[i].demand *= if k == 0 { 3.0 } else { 1.0 / 3.0 };
                }
            }
        }
        let leaves = &levels[levels.len() - 1];
        admitted += clients_tick(leaves, &mut clients, &mut rng, now);
        // Servers below the root ask their parents, the lowest level first.
        if now % UP_TICK == 0 {
            servers_tick(&mut levels, cut, now);
        }
        now += TICK;
        if now % S == 0 {
            let needs: Vec<f64> = clients.iter().map(|c| c.demand).collect();
            let wants: Vec<f64> = needs.iter().map(|d| d * 1.2 + 1.0).collect();
            let shares = needs_first(s.capacity, &needs, &wants);
            let (mut error, mut misplaced) = (0.0f64, 0.0);
            for (c, share) in clients.iter().zip(&shares) {
                let g = if c.expires_at > now { c.granted } else { 0.0 };
                error = error.max((g - share).abs());
                misplaced += (g - share).abs() / 2.0;
            }
            let in_cut = cut.is_some_and(|(a, b)| now > a && now <= b + nanos(s.lease));
            seconds.push((needs.iter().sum(), admitted, error, misplaced, in_cut));
            admitted = 0.0;
        }
    }
    Ok(summarise(s, &seconds, &changes))
}

/// The tree's levels of servers for `s.shape`, each below the root leasing from its parent.
fn levels(s: &TreeSettings, config: &QuotaConfig) -> Vec<Vec<Node>> {
    let mut levels: Vec<Vec<Node>> = Vec::new();
    for (l, &count) in s.shape.iter().enumerate() {
        let per = if l == 0 {
            count
        } else {
            count / s.shape[l - 1]
        };
        let nodes = (0..count)
            .map(|i| {
                let server = LeaseServer::new(config.clone(), 0);
                server.restore(Vec::new(), 0);
                if l > 0 {
                    server.under_parent();
                }
                Node {
                    server,
                    upstream: Upstream::new(),
                    parent: i / per.max(1),
                    id: format!("s{l}-{i}"),
                }
            })
            .collect();
        levels.push(nodes);
    }
    levels
}

/// The clients, spread over the leaf servers: skewed demands (Pareto, shape 1.5) summing to
/// about 1.5 × the capacity, first refreshes spread over one refresh interval.
fn clients(s: &TreeSettings, rng: &mut crate::rng::Rng) -> Vec<Client> {
    let leaves = *s.shape.last().unwrap_or(&1);
    let raw: Vec<f64> = (0..s.clients)
        .map(|_| (1.0 - rng.unit()).max(1e-9).powf(-1.0 / 1.5).min(50.0))
        .collect();
    let scale = 1.5 * s.capacity / raw.iter().sum::<f64>().max(1e-9);
    let refresh = nanos(s.refresh);
    raw.iter()
        .enumerate()
        .map(|(i, r)| Client {
            id: format!("c{i}"),
            server: i % leaves,
            demand: r * scale,
            granted: 0.0,
            expires_at: 0,
            safe: 0.0,
            lease_id: 0,
            next_at: (rng.unit() * refresh as f64) as Nanos,
        })
        .collect()
}

/// One tick of the clients at `now`: each whose refresh is due refreshes at its leaf server;
/// answers the units admitted in the tick (each client's demand up to its grant, or its safe
/// capacity once the grant lapsed).
fn clients_tick(
    leaves: &[Node],
    clients: &mut [Client],
    rng: &mut crate::rng::Rng,
    now: Nanos,
) -> f64 {
    let mut admitted = 0.0;
    for c in clients.iter_mut() {
        if now >= c.next_at {
            let ask = Ask {
                needs: Some(c.demand),
                has: if c.expires_at > now { c.granted } else { 0.0 },
                safe: c.safe,
                lease_id: c.lease_id,
                ..Ask::wants(c.demand * 1.2 + 1.0)
            };
            let answer = leaves[c.server]
                .server
                .refresh(&c.id, &[(RESOURCE.to_string(), ask)], now)
                .pop();
            if let Some(Ok(l)) = answer {
                c.granted = l.granted;
                c.expires_at = l.expires_at;
                c.safe = l.safe_capacity;
                c.lease_id = l.lease_id;
                let jitter = 0.9 + 0.2 * rng.unit();
                c.next_at = now + (nanos(l.refresh) as f64 * jitter) as Nanos;
            } else {
                c.next_at = now + S;
            }
        }
        let rate = if c.expires_at > now {
            c.granted
        } else {
            c.safe
        };
        admitted += c.demand.min(rate) * (TICK as f64 / S as f64);
    }
    admitted
}

/// The servers below the root ask their parents at `now`, the lowest level first (the first
/// server of the second level cut off from its parent while `now` is in `cut`), and put what
/// they lease in force.
fn servers_tick(levels: &mut [Vec<Node>], cut: Option<(Nanos, Nanos)>, now: Nanos) {
    for l in (1..levels.len()).rev() {
        let (above, below) = levels.split_at_mut(l);
        let parents = &above[l - 1];
        for (i, node) in below[0].iter_mut().enumerate() {
            let totals = node
                .server
                .totals_parted(now, |r, w| node.upstream.due(r, w, now));
            let asks = node.upstream.asks(&totals, |_| 0.0, now);
            let cut_off = l == 1 && i == 0 && cut.is_some_and(|(a, b)| now >= a && now < b);
            if !asks.is_empty() {
                if cut_off {
                    for a in &asks {
                        node.upstream
                            .failed(&a.resource, Duration::from_secs(1), now);
                    }
                } else {
                    let pairs: Vec<(String, Ask)> =
                        asks.iter().map(|a| (a.resource.clone(), a.ask)).collect();
                    let parts: Vec<Vec<Part>> = asks.iter().map(|a| a.parts.clone()).collect();
                    let answers = parents[node.parent]
                        .server
                        .refresh_parts(&node.id, &pairs, &parts, now);
                    for (a, answer) in asks.iter().zip(answers) {
                        match answer {
                            Ok(lease) => {
                                let expires_in =
                                    Duration::from_nanos(lease.expires_at.saturating_sub(now));
                                node.upstream
                                    .answered(&a.resource, &lease, expires_in, now, now);
                            }
                            Err(_) => {
                                node.upstream
                                    .failed(&a.resource, Duration::from_secs(1), now)
                            }
                        }
                    }
                }
            }
            for (name, capacity, grant) in node.upstream.capacities(now) {
                node.server.lease_from_parent(&name, capacity, grant);
            }
        }
    }
}

fn summarise(
    s: &TreeSettings,
    seconds: &[(f64, f64, f64, f64, bool)],
    changes: &[Nanos],
) -> TreeReport {
    let levels_below_root = s.shape.len() as u64; // the servers below the root, and the clients
    let bound_ms = 3 * levels_below_root * s.refresh.as_millis() as u64;
    let warmup = (3 * s.lease.as_secs()).max(1) as usize;
    let threshold = 0.01 * s.capacity;
    // ms from second `from` until misplacing at most 1 % and staying so (within `span` s).
    let settle = |from: usize, span: usize| -> u64 {
        let to = (from + span).min(seconds.len());
        let window = &seconds[from.min(to)..to];
        (0..window.len())
            .find(|&i| window[i..].iter().all(|x| x.3 <= threshold))
            .map_or(u64::MAX, |i| (i as u64 + 1) * 1000)
    };
    let mut converge_ms = Vec::new();
    let mut excluded = vec![false; seconds.len()];
    let cut_seconds = s
        .cut
        .map(|(a, b)| (a.as_secs() as usize, (b + s.lease).as_secs() as usize));
    for (k, &at) in changes.iter().enumerate() {
        let from = (at / S) as usize;
        // Up to the next change, at most a minute.
        let span = changes.get(k + 1).map_or(60, |&next| {
            ((next / S) as usize).saturating_sub(from).min(60)
        });
        let until = (from + (bound_ms / 1000) as usize + 1).min(seconds.len());
        for e in &mut excluded[from..until] {
            *e = true;
        }
        if cut_seconds.is_some_and(|(a, b)| from < b && from + 60 > a) {
            continue;
        }
        converge_ms.push(settle(from, span));
    }
    let reconverge_ms = s.cut.map(|(_, b)| settle(b.as_secs() as usize, 120));
    let steady = |i: usize| i >= warmup && !excluded[i] && !seconds[i].4;
    let over: Vec<f64> = (0..seconds.len())
        .filter(|&i| steady(i) && seconds[i].0 > s.capacity)
        .map(|i| seconds[i].1 / s.capacity)
        .collect();
    let utilisation = if over.is_empty() {
        0.0
    } else {
        over.iter().sum::<f64>() / over.len() as f64
    };
    let peak_ratio = (0..seconds.len())
        .filter(|&i| i >= warmup && !seconds[i].4)
        .map(|i| seconds[i].1 / s.capacity)
        .fold(0.0, f64::max);
    let max_fairness_error = (0..seconds.len())
        .filter(|&i| steady(i))
        .map(|i| seconds[i].2)
        .fold(0.0, f64::max);
    let max_misplaced_ratio = (0..seconds.len())
        .filter(|&i| steady(i))
        .map(|i| seconds[i].3 / s.capacity)
        .fold(0.0, f64::max);
    let during: Vec<f64> = seconds
        .iter()
        .filter(|x| x.4)
        .map(|x| x.1 / s.capacity)
        .collect();
    let (cut_peak_ratio, cut_mean_ratio) = if during.is_empty() {
        (None, None)
    } else {
        (
            Some(during.iter().copied().fold(0.0, f64::max)),
            Some(during.iter().sum::<f64>() / during.len() as f64),
        )
    };
    TreeReport {
        utilisation,
        peak_ratio,
        max_fairness_error,
        max_misplaced_ratio,
        converge_ms_max: converge_ms.iter().copied().max().unwrap_or(0),
        converge_ms,
        reconverge_ms,
        bound_ms,
        cut_peak_ratio,
        cut_mean_ratio,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> TreeSettings {
        TreeSettings {
            shape: vec![1, 3, 9],
            clients: 900,
            capacity: 10_000.0,
            lease: Duration::from_secs(10),
            refresh: Duration::from_secs(2),
            duration: Duration::from_secs(150),
            cut: None,
            seed: 1,
        }
    }

    #[test]
    fn a_small_tree_meets_the_goals() {
        let r = run(&settings()).unwrap();
        assert!(r.utilisation >= 0.98, "{r:?}");
        assert!(r.peak_ratio <= 1.01, "{r:?}");
        assert!(r.max_fairness_error <= 0.01 * 10_000.0, "{r:?}");
        assert!(r.max_misplaced_ratio <= 0.01, "{r:?}");
        assert!(r.converge_ms_max <= r.bound_ms, "{r:?}");
    }

    #[test]
    fn shapes_are_checked() {
        assert_eq!(parse_shape("1x10x100"), Ok(vec![1, 10, 100]));
        assert!(parse_shape("1x3x10")
            .unwrap_err()
            .to_string()
            .contains("whole multiple"));
        assert!(parse_shape("10").is_err() && parse_shape("1xx2").is_err());
        assert!(parse_shape("0x2").is_err());
    }
}
