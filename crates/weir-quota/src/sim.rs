//! Cluster quota on virtual time: the real [`LeaseTable`] and [`ResourceClient`]s, clients whose
//! demand follows a scenario, and the measures that say whether it works — utilisation when
//! demand exceeds capacity, overshoot, fairness error, time to converge after a demand shift,
//! and what clients admit while the server is away. Deterministic for a seed; a 5-minute run
//! takes well under a second of wall time.
//!
//! Each 10 ms tick: demand changes due are applied; every present client sends its demand's
//! units as one-unit requests spread over the tick through [`ResourceClient::acquire`]; clients
//! whose refresh is due ask the table (or fail while the server is down); every client polls.
//! A server that comes back after being down has lost its table and learns (see [`crate::lease`]).

use std::time::Duration;

use weir_core::Nanos;

use crate::allocate::needs_first;
use crate::client::{ClientConfig, ResourceClient};
use crate::lease::{LeaseTable, ResourceConfig};

const S: Nanos = 1_000_000_000;
const TICK: Nanos = 10_000_000;

/// One row of a scenario: from `at`, `client` wants `demand` units/s (`None`: it leaves and
/// gives its lease back).
#[derive(Debug, Clone, PartialEq)]
pub struct Shift {
    /// When.
    pub at: Duration,
    /// Which client.
    pub client: String,
    /// Its demand from then on; `None`: it leaves.
    pub demand: Option<f64>,
}

/// What to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The resource (capacity, algorithm, lease, refresh).
    pub resource: ResourceConfig,
    /// The clients' behaviour.
    pub client: ClientConfig,
    /// Simulated time.
    pub duration: Duration,
    /// The server cannot be reached from .. to (and restarts without its table).
    pub server_down: Option<(Duration, Duration)>,
    /// Varies the clients' jitter.
    pub seed: u64,
}

/// One simulated second.
#[derive(Debug, Clone, PartialEq)]
pub struct Second {
    /// Its start (s).
    pub t: u64,
    /// Sum of the present clients' demands (units/s) at its end.
    pub demand: f64,
    /// Sum of outstanding grants at its end.
    pub granted: f64,
    /// Units admitted during it.
    pub admitted: f64,
    /// Largest distance of a grant from its exact max-min share at its end (units/s).
    pub fairness_error: f64,
    /// Whether the server was down during it.
    pub down: bool,
}

/// The outcome of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Per second.
    pub seconds: Vec<Second>,
    /// Mean of granted ÷ capacity over the seconds whose demand exceeded capacity (server up).
    pub utilisation: f64,
    /// Largest admitted units in a second ÷ capacity.
    pub peak_ratio: f64,
    /// Largest fairness error, ignoring the seconds within two refresh intervals after a shift
    /// (and while the server is down or learning).
    pub max_fairness_error: f64,
    /// Per demand shift, ms until the fairness error fell under 1 % of capacity and stayed.
    pub converge_ms: Vec<u64>,
    /// The 99th percentile of `converge_ms`.
    pub converge_ms_p99: u64,
    /// Largest admitted units in a second ÷ capacity while the server was down.
    pub down_peak_ratio: Option<f64>,
    /// Mean admitted units per second ÷ capacity while the server was down.
    pub down_mean_ratio: Option<f64>,
    /// In the last second whose demand exceeded the capacity (else the last second): each
    /// client with demand, its grant and its exact max-min share (units/s).
    pub clients: Vec<ClientShare>,
    /// That second (from the start).
    pub clients_at: u64,
}

/// A client's grant beside its exact max-min fair share, at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientShare {
    /// The client.
    pub name: String,
    /// Its demand.
    pub demand: f64,
    /// What it holds.
    pub granted: f64,
    /// Its exact max-min share (the reference, whatever the algorithm under test).
    pub share: f64,
}

/// The built-in scenario for `clients` clients: demand shifts, clients joining and leaving,
/// total demand both below and above capacity (over 300 s; scaled to `duration`).
pub fn default_scenario(clients: usize, capacity: f64, duration: Duration) -> Vec<Shift> {
    let n = clients.max(2);
    let scale = duration.as_secs_f64() / 300.0;
    let at = |s: f64| Duration::from_secs_f64(s * scale);
    let name = |i: usize| format!("c{i}");
    let per = capacity / n as f64;
    let mut v = Vec::new();
    // 0 s: everyone at half its even share (total 0.5 × capacity); the last client joins later.
    for i in 0..n - 1 {
        v.push(Shift {
            at: at(0.0),
            client: name(i),
            demand: Some(per * 0.5),
        });
    }
    // 40 s: demands spread 0.2×…2× the even share (total ≈ 1.1 × capacity).
    for i in 0..n - 1 {
        let f = 0.2 + 1.8 * i as f64 / (n - 1).max(1) as f64;
        v.push(Shift {
            at: at(40.0),
            client: name(i),
            demand: Some(per * f),
        });
    }
    // 90 s: the last client joins wanting 3 shares (total ≈ 1.4 × capacity).
    v.push(Shift {
        at: at(90.0),
        client: name(n - 1),
        demand: Some(per * 3.0),
    });
    // 140 s: the biggest client drops to a tenth; 180 s: client 0 leaves.
    v.push(Shift {
        at: at(140.0),
        client: name(n - 2),
        demand: Some(per * 0.2),
    });
    v.push(Shift {
        at: at(180.0),
        client: name(0),
        demand: None,
    });
    // 220 s: everyone wants twice its even share (2 × capacity); 270 s: back below capacity.
    for i in 1..n {
        v.push(Shift {
            at: at(220.0),
            client: name(i),
            demand: Some(per * 2.0),
        });
        v.push(Shift {
            at: at(270.0),
            client: name(i),
            demand: Some(per * 0.6),
        });
    }
    v.sort_by_key(|s| s.at);
    v
}

struct SimClient {
    name: String,
    client: ResourceClient,
    demand: Option<f64>,
    /// Fractional units carried to the next tick.
    carry: f64,
}

fn nanos(d: Duration) -> Nanos {
    Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX)
}

/// Runs `scenario` under `settings`.
pub fn run(settings: &Settings, scenario: &[Shift]) -> Report {
    let end = nanos(settings.duration);
    let down = settings
        .server_down
        .map(|(a, b)| (nanos(a), nanos(b)))
        .filter(|(a, b)| a < b);
    let mut table = LeaseTable::resume(settings.resource, Vec::new());
    let mut clients: Vec<SimClient> = Vec::new();
    let mut next_shift = 0;
    let mut seconds: Vec<Second> = Vec::new();
    let mut admitted_this_second = 0.0;
    let mut shift_times: Vec<Nanos> = Vec::new();
    let mut restarted_at: Option<Nanos> = None;
    let mut last_shares: Vec<ClientShare> = Vec::new();
    let (mut clients_at, mut last_excess) = (0, false);
    let mut now: Nanos = 0;
    while now < end {
        let is_down = down.is_some_and(|(a, b)| now >= a && now < b);
        if let Some((_, b)) = down {
            if now == b - b % TICK && restarted_at.is_none() {
                table = LeaseTable::new(settings.resource, now);
                restarted_at = Some(now);
            }
        }
        // Demand shifts due now.
        while next_shift < scenario.len() && nanos(scenario[next_shift].at) <= now {
            let s = &scenario[next_shift];
            let i = client_index(&mut clients, settings, &s.client, now);
            if s.demand.is_none() && !is_down {
                table.release(&s.client, clients[i].client.lease_id());
            }
            clients[i].demand = s.demand;
            shift_times.push(now);
            next_shift += 1;
        }
        admitted_this_second += tick(&mut clients, &mut table, is_down, now);
        now += TICK;
        if now % S == 0 {
            // The second that just ended.
            table.expire(now);
            let (mut second, shares) = second_ended(settings, &clients, &table, now);
            let excess = second.demand > settings.resource.capacity;
            if excess || !last_excess {
                (last_shares, clients_at, last_excess) = (shares, second.t, excess);
            }
            second.admitted = std::mem::take(&mut admitted_this_second);
            second.down = is_down;
            seconds.push(second);
        }
    }
    Report {
        clients: last_shares,
        clients_at,
        ..summarise(settings, seconds, &shift_times, down, restarted_at)
    }
}

/// The index of the client named `name`, which joins now if it is new.
fn client_index(
    clients: &mut Vec<SimClient>,
    settings: &Settings,
    name: &str,
    now: Nanos,
) -> usize {
    if let Some(i) = clients.iter().position(|c| c.name == name) {
        return i;
    }
    let seed = settings.seed ^ (clients.len() as u64 + 1).wrapping_mul(0x9e37);
    clients.push(SimClient {
        name: name.to_string(),
        client: ResourceClient::new(
            name,
            settings.client,
            settings.resource.safe_capacity.unwrap_or(0.0),
            seed,
            now,
        ),
        demand: None,
        carry: 0.0,
    });
    clients.len() - 1
}

/// One tick of every client: its requests spread over the tick, its refresh when due (a
/// failure while the server is down), its lease's expiry; the units admitted.
fn tick(clients: &mut [SimClient], table: &mut LeaseTable, is_down: bool, now: Nanos) -> f64 {
    let mut admitted = 0.0;
    for c in clients.iter_mut() {
        let Some(d) = c.demand else { continue };
        c.carry += d * (TICK as f64 / S as f64);
        let units = c.carry.floor();
        c.carry -= units;
        let units = units as u64;
        for u in 0..units {
            let at = now + TICK * u / units.max(1);
            if c.client.acquire(1, at).allowed() {
                admitted += 1.0;
            }
        }
        if c.client.due(now) {
            if is_down {
                c.client.on_failure(now);
            } else {
                let ask = c.client.ask(now);
                match table.refresh(&c.name, ask, now) {
                    Ok(lease) => c.client.on_lease(lease, now),
                    Err(_) => c.client.on_failure(now),
                }
            }
        }
        c.client.poll(now);
    }
    admitted
}

/// The row of the second ending at `now` (admitted units and downtime filled by the caller):
/// demand, what is granted, and how far the grants are from exact max-min.
fn second_ended(
    settings: &Settings,
    clients: &[SimClient],
    table: &LeaseTable,
    now: Nanos,
) -> (Second, Vec<ClientShare>) {
    let mut needs = Vec::new();
    let mut wants = Vec::new();
    let mut granted_of = Vec::new();
    for c in clients.iter().filter(|c| c.demand.is_some()) {
        let d = c.demand.unwrap_or(0.0);
        // Clients need their rate and want headroom above it.
        needs.push(d);
        wants.push(d * settings.client.headroom + settings.client.min_wants);
        granted_of.push(
            table
                .holders()
                .iter()
                .find(|h| h.client == c.name)
                .map_or(0.0, |h| h.granted),
        );
    }
    // The reference is exact max-min whatever the algorithm under test.
    let shares = needs_first(settings.resource.capacity, &needs, &wants);
    let fairness_error = granted_of
        .iter()
        .zip(&shares)
        .map(|(g, s)| (g - s).abs())
        .fold(0.0, f64::max);
    let second = Second {
        t: now / S - 1,
        demand: clients.iter().filter_map(|c| c.demand).sum(),
        granted: table.outstanding(),
        admitted: 0.0,
        fairness_error,
        down: false,
    };
    let with_demand = clients.iter().filter(|c| c.demand.is_some());
    let each = with_demand
        .zip(needs.iter().zip(granted_of.iter().zip(&shares)))
        .map(|(c, (d, (g, s)))| ClientShare {
            name: c.name.clone(),
            demand: *d,
            granted: *g,
            share: *s,
        })
        .collect();
    (second, each)
}

fn summarise(
    settings: &Settings,
    seconds: Vec<Second>,
    shift_times: &[Nanos],
    down: Option<(Nanos, Nanos)>,
    restarted_at: Option<Nanos>,
) -> Report {
    let capacity = settings.resource.capacity.max(f64::MIN_POSITIVE);
    let refresh = nanos(settings.resource.refresh);
    let lease = nanos(settings.resource.lease);
    let disturbed = |t: Nanos| {
        down.is_some_and(|(a, _)| t >= a)
            && restarted_at.is_none_or(|r| t < r.saturating_add(lease + 2 * refresh))
    };
    let over: Vec<&Second> = seconds
        .iter()
        .filter(|s| s.demand > capacity && !s.down && !disturbed(s.t * S))
        .collect();
    let utilisation = if over.is_empty() {
        1.0
    } else {
        over.iter().map(|s| s.granted / capacity).sum::<f64>() / over.len() as f64
    };
    let peak_ratio = seconds
        .iter()
        .map(|s| s.admitted / capacity)
        .fold(0.0, f64::max);
    let mut shifts: Vec<Nanos> = shift_times.to_vec();
    shifts.dedup();
    let converge_ms = convergence(&seconds, &shifts, down, 0.01 * capacity, &disturbed);
    let max_fairness_error = seconds
        .iter()
        .filter(|s| {
            let t = s.t * S;
            !s.down
                && !disturbed(t)
                && !shifts
                    .iter()
                    .any(|&x| t + S > x && t < x.saturating_add(2 * refresh))
        })
        .map(|s| s.fairness_error)
        .fold(0.0, f64::max);
    let mut sorted = converge_ms.clone();
    sorted.sort_unstable();
    let converge_ms_p99 = sorted
        .get((sorted.len() * 99).div_ceil(100).saturating_sub(1))
        .copied()
        .unwrap_or(0);
    let (down_peak_ratio, down_mean_ratio) = down_ratios(&seconds, capacity);
    Report {
        seconds,
        utilisation,
        peak_ratio,
        max_fairness_error,
        converge_ms,
        converge_ms_p99,
        down_peak_ratio,
        down_mean_ratio,
        clients: Vec::new(),
        clients_at: 0,
    }
}

/// Convergence after each distinct shift time (`shifts`, undisturbed ones): the ms until
/// the fairness error stays under `threshold` until the next shift, the server going away or
/// the end of the run (the whole window when it never settles).
fn convergence(
    seconds: &[Second],
    shifts: &[Nanos],
    down: Option<(Nanos, Nanos)>,
    threshold: f64,
    disturbed: &dyn Fn(Nanos) -> bool,
) -> Vec<u64> {
    let mut converge_ms = Vec::new();
    for (k, &t) in shifts.iter().enumerate() {
        if t == 0 || disturbed(t) {
            continue;
        }
        let run_end = seconds.last().map_or(0, |s| (s.t + 1) * S);
        let next = shifts
            .get(k + 1)
            .copied()
            .unwrap_or(run_end)
            .min(run_end)
            .min(down.map_or(Nanos::MAX, |(a, _)| if a > t { a } else { Nanos::MAX }));
        let window: Vec<&Second> = seconds
            .iter()
            .filter(|s| s.t * S >= t && (s.t + 1) * S <= next)
            .collect();
        let settled =
            (0..window.len()).find(|&i| window[i..].iter().all(|s| s.fairness_error <= threshold));
        if let Some(i) = settled {
            converge_ms.push(((window[i].t + 1) * S - t) / 1_000_000);
        } else {
            converge_ms.push(next.saturating_sub(t) / 1_000_000);
        }
    }
    converge_ms
}

/// While the server was down: the peak and mean admitted, as ratios of the capacity.
fn down_ratios(seconds: &[Second], capacity: f64) -> (Option<f64>, Option<f64>) {
    let down: Vec<&Second> = seconds.iter().filter(|s| s.down).collect();
    if down.is_empty() {
        return (None, None);
    }
    let peak = down
        .iter()
        .map(|s| s.admitted / capacity)
        .fold(0.0, f64::max);
    let mean = down.iter().map(|s| s.admitted).sum::<f64>() / down.len() as f64 / capacity;
    (Some(peak), Some(mean))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocate::Division;

    fn settings() -> Settings {
        Settings {
            resource: ResourceConfig {
                capacity: 1000.0,
                algorithm: Division::FairShare,
                ..ResourceConfig::default()
            },
            client: ClientConfig::default(),
            duration: Duration::from_secs(300),
            server_down: None,
            seed: 1,
        }
    }

    #[test]
    fn the_default_scenario_is_used_fully_fairly_and_without_overshoot() {
        let s = settings();
        let r = run(&s, &default_scenario(10, 1000.0, s.duration));
        assert!(r.utilisation >= 0.99, "utilisation {}", r.utilisation);
        assert!(r.peak_ratio <= 1.01, "peak {}", r.peak_ratio);
        assert!(
            r.max_fairness_error <= 10.0,
            "fairness {}",
            r.max_fairness_error
        );
        assert!(r.converge_ms_p99 <= 10_000, "converge {:?}", r.converge_ms);
        // Same seed, same run.
        assert_eq!(run(&s, &default_scenario(10, 1000.0, s.duration)), r);
    }

    #[test]
    fn while_the_server_is_away_clients_hold_leases_then_safe_capacity() {
        let mut s = settings();
        s.server_down = Some((Duration::from_secs(100), Duration::from_secs(200)));
        let r = run(&s, &default_scenario(10, 1000.0, s.duration));
        let mean = r.down_mean_ratio.unwrap();
        let peak = r.down_peak_ratio.unwrap();
        assert!(mean > 0.5, "clients kept admitting: {mean}");
        assert!(peak <= 1.1, "and stayed near capacity: {peak}");
        // Back without its table, the server learns: clients come back one by one, each
        // granted at most what it used alone, so nothing overshoots.
        assert!(r.peak_ratio <= 1.01, "after the return: {}", r.peak_ratio);
    }
}
