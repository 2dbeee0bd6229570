//! Dividing a capacity among clients by their demands.
//!
//! Every algorithm serves the priority bands strictly in order: CRITICAL_PLUS clients are
//! served from the whole capacity, CRITICAL from what they leave, then SHEDDABLE_PLUS, then
//! SHEDDABLE. Within a band:
//!
//! - [`Division::FairShare`]: exact weighted max-min fairness. No client gets more than it
//!   wants; a client can only get more by taking from one whose share per unit of weight is
//!   smaller or equal. Computed by water-filling: clients sorted by `wants / weight`; each in
//!   turn either fits entirely under the current water level or the level is what is left
//!   divided by the weight left. O(n log n). The seed example — capacity 10, demands 2, 2.6,
//!   4, 5 — gives 2, 2.6, 2.7, 2.7.
//! - [`Division::ProportionalShare`]: the band's capacity divided in proportion to
//!   `wants × weight`, never more than a client wants (what a capped client does not take is
//!   not redistributed: simple and predictable, but not work-conserving).
//! - [`Division::Static`]: each client at most `capacity / clients` (all bands together),
//!   whatever the others want (no borrowing).
//!
//! Shares are `f64` units per second: capacities are rates, and a lease client enforces its
//! share with a weir-core limiter at that rate.

use weir_core::Criticality;

/// How capacity is divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Division {
    /// `min(wants, capacity / clients)`.
    Static,
    /// Proportional to `wants × weight`, capped at `wants`.
    ProportionalShare,
    /// Exact weighted max-min fairness (water-filling).
    #[default]
    FairShare,
}

impl Division {
    /// The configuration and command-line name.
    pub fn as_str(self) -> &'static str {
        match self {
            Division::Static => "static",
            Division::ProportionalShare => "proportional_share",
            Division::FairShare => "fair_share",
        }
    }
}

impl std::str::FromStr for Division {
    type Err = QuotaError;

    fn from_str(s: &str) -> Result<Self, QuotaError> {
        Ok(match s {
            "static" => Division::Static,
            "proportional_share" => Division::ProportionalShare,
            "fair_share" => Division::FairShare,
            _ => return Err(QuotaError::UnknownAlgorithm(s.to_string())),
        })
    }
}

/// Why an allocation cannot be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuotaError {
    /// Capacity negative or not finite.
    #[error("capacity must be a finite number ≥ 0, got {0}")]
    Capacity(f64),
    /// A demand negative or not finite.
    #[error("client {client}: wants must be a finite number ≥ 0, got {value}")]
    Wants {
        /// Index of the client.
        client: usize,
        /// The value given.
        value: f64,
    },
    /// A weight not positive or not finite.
    #[error(
        "client {client}: weight must be a finite number > 0 (a part's at most 10^6), got {value}"
    )]
    Weight {
        /// Index of the client.
        client: usize,
        /// The value given.
        value: f64,
    },
    /// An unknown algorithm name.
    #[error("unknown algorithm {0:?}: expected fair_share, proportional_share or static")]
    UnknownAlgorithm(String),
    /// A lease table already has its most holders ([`crate::lease::MAX_HOLDERS`]).
    #[error("more than {0} clients hold leases on this resource; nothing granted")]
    Full(usize),
    /// A lease server below asked in an older failover term than its group's lease has seen
    /// ([`crate::lease::Ask::term`]): a deposed leader's late ask.
    #[error("term {got} is older than term {newer} of this client's failover group: a newer leader holds the lease")]
    Superseded {
        /// The term of the ask.
        got: u64,
        /// The newest term seen for the row.
        newer: u64,
    },
}

/// One client's demand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// Units per second it would use.
    pub wants: f64,
    /// Its weight within its band (> 0; 1 by default).
    pub weight: f64,
    /// Its band.
    pub priority: Criticality,
}

impl Demand {
    /// `wants` at weight 1, CRITICAL.
    pub fn new(wants: f64) -> Self {
        Self {
            wants,
            weight: 1.0,
            priority: Criticality::Critical,
        }
    }
}

/// Exact max-min of `capacity` among clients of weight 1 that need `needs[i]` and want
/// `wants[i]` (≥ the need): the needs first, then what nobody needs among the headroom above
/// them — the division a lease table makes, as the simulators' reference. Bad numbers count
/// as 0.
pub fn needs_first(capacity: f64, needs: &[f64], wants: &[f64]) -> Vec<f64> {
    let clean = |v: f64| if v.is_finite() && v >= 0.0 { v } else { 0.0 };
    let d: Vec<Demand> = needs.iter().map(|&n| Demand::new(clean(n))).collect();
    let mut shares = Vec::new();
    let _ = allocate(clean(capacity), Division::FairShare, &d, &mut shares);
    let left = clean(capacity) - shares.iter().sum::<f64>();
    if left > 1e-9 {
        let rest: Vec<Demand> = wants
            .iter()
            .zip(&shares)
            .map(|(&w, s)| Demand::new((clean(w) - s).max(0.0)))
            .collect();
        let mut extra = Vec::new();
        let _ = allocate(left, Division::FairShare, &rest, &mut extra);
        for (s, e) in shares.iter_mut().zip(extra) {
            *s += e;
        }
    }
    shares
}

/// Divides `capacity` among `demands` with `algorithm`: `shares[i]` for `demands[i]`.
/// `shares` is cleared and refilled (reuse it to allocate without allocating).
pub fn allocate(
    capacity: f64,
    algorithm: Division,
    demands: &[Demand],
    shares: &mut Vec<f64>,
) -> Result<(), QuotaError> {
    if !(capacity.is_finite() && capacity >= 0.0) {
        return Err(QuotaError::Capacity(capacity));
    }
    for (client, d) in demands.iter().enumerate() {
        if !(d.wants.is_finite() && d.wants >= 0.0) {
            return Err(QuotaError::Wants {
                client,
                value: d.wants,
            });
        }
        if !(d.weight.is_finite() && d.weight > 0.0) {
            return Err(QuotaError::Weight {
                client,
                value: d.weight,
            });
        }
    }
    shares.clear();
    shares.resize(demands.len(), 0.0);
    if algorithm == Division::Static {
        let each = capacity / demands.len().max(1) as f64;
        for (s, d) in shares.iter_mut().zip(demands) {
            *s = d.wants.min(each);
        }
        return Ok(());
    }
    // Band by band, most critical first, each from what the bands before it left; within a
    // band by wants per weight. Keys computed once (a comparison then costs no division).
    let mut keyed: Vec<(usize, f64, usize)> = demands
        .iter()
        .enumerate()
        .map(|(i, d)| (3 - d.priority.rank(), d.wants / d.weight, i))
        .collect();
    keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.total_cmp(&b.1)));
    let order: Vec<usize> = keyed.iter().map(|k| k.2).collect();
    let mut left = capacity;
    for band in order.chunk_by(|&a, &b| demands[a].priority == demands[b].priority) {
        let used = match algorithm {
            Division::FairShare => water_fill(left, band, demands, shares),
            Division::ProportionalShare => proportional(left, band, demands, shares),
            Division::Static => 0.0,
        };
        left = (left - used).max(0.0);
    }
    Ok(())
}

/// Max-min within one band; `band` is sorted by `wants / weight`. Answers what it gave out.
fn water_fill(capacity: f64, band: &[usize], demands: &[Demand], shares: &mut [f64]) -> f64 {
    let mut left = capacity;
    let mut weight_left: f64 = band.iter().map(|&i| demands[i].weight).sum();
    for (k, &i) in band.iter().enumerate() {
        let d = &demands[i];
        // Fits under the level the rest would reach: it gets all it wants.
        if d.wants * weight_left <= left * d.weight {
            shares[i] = d.wants;
            left -= d.wants;
            weight_left -= d.weight;
            continue;
        }
        // The level: everyone from here on is capped by it (they all want more).
        let level = left / weight_left;
        for &j in &band[k..] {
            shares[j] = level * demands[j].weight;
        }
        return capacity;
    }
    capacity - left
}

/// Proportional to `wants × weight` within one band, capped at `wants`.
fn proportional(capacity: f64, band: &[usize], demands: &[Demand], shares: &mut [f64]) -> f64 {
    let total: f64 = band.iter().map(|&i| demands[i].wants).sum();
    if total <= capacity {
        for &i in band {
            shares[i] = demands[i].wants;
        }
        return total;
    }
    let weighted: f64 = band
        .iter()
        .map(|&i| demands[i].wants * demands[i].weight)
        .sum();
    let mut used = 0.0;
    for &i in band {
        let d = &demands[i];
        shares[i] = if weighted > 0.0 {
            (capacity * d.wants * d.weight / weighted).min(d.wants)
        } else {
            0.0
        };
        used += shares[i];
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fair(capacity: f64, wants: &[f64]) -> Vec<f64> {
        let demands: Vec<Demand> = wants.iter().map(|&w| Demand::new(w)).collect();
        let mut out = Vec::new();
        allocate(capacity, Division::FairShare, &demands, &mut out).unwrap();
        out
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn the_seed_example() {
        let s = fair(10.0, &[2.0, 2.6, 4.0, 5.0]);
        assert!(close(&s, &[2.0, 2.6, 2.7, 2.7]), "{s:?}");
        // Order of input does not matter.
        let s = fair(10.0, &[5.0, 2.0, 4.0, 2.6]);
        assert!(close(&s, &[2.7, 2.0, 2.7, 2.6]), "{s:?}");
    }

    #[test]
    fn degenerate_inputs() {
        assert!(close(&fair(10.0, &[]), &[]));
        assert!(close(&fair(10.0, &[0.0, 0.0]), &[0.0, 0.0]));
        assert!(close(&fair(10.0, &[50.0]), &[10.0]));
        assert!(close(&fair(10.0, &[3.0, 3.0, 3.0, 3.0]), &[2.5; 4]));
        assert!(close(&fair(0.0, &[1.0, 2.0]), &[0.0, 0.0]));
        assert!(
            close(&fair(10.0, &[1.0, 2.0]), &[1.0, 2.0]),
            "under capacity"
        );
    }

    #[test]
    fn weights_and_bands() {
        let d = |wants, weight, priority| Demand {
            wants,
            weight,
            priority,
        };
        let demands = [
            d(8.0, 1.0, Criticality::Sheddable),
            d(6.0, 1.0, Criticality::CriticalPlus),
            d(10.0, 1.0, Criticality::Critical),
            d(10.0, 3.0, Criticality::Critical),
        ];
        let mut out = Vec::new();
        allocate(10.0, Division::FairShare, &demands, &mut out).unwrap();
        // CRITICAL_PLUS first (6), then CRITICAL splits 4 by weight 1:3, SHEDDABLE gets 0.
        assert!(close(&out, &[0.0, 6.0, 1.0, 3.0]), "{out:?}");
        allocate(10.0, Division::Static, &demands, &mut out).unwrap();
        assert!(close(&out, &[2.5, 2.5, 2.5, 2.5]), "{out:?}");
        allocate(20.0, Division::ProportionalShare, &demands, &mut out).unwrap();
        // 14 left for CRITICAL: 3.5 and 10.5 capped at 10 by proportion to 10×1 and 10×3;
        // SHEDDABLE gets the 0.5 left.
        assert!(close(&out, &[0.5, 6.0, 3.5, 10.0]), "{out:?}");
    }

    #[test]
    fn bad_input_is_an_error() {
        let mut out = Vec::new();
        let e = allocate(-1.0, Division::FairShare, &[], &mut out).unwrap_err();
        assert_eq!(e, QuotaError::Capacity(-1.0));
        let mut d = Demand::new(1.0);
        d.weight = 0.0;
        assert!(matches!(
            allocate(1.0, Division::FairShare, &[d], &mut out),
            Err(QuotaError::Weight { client: 0, .. })
        ));
        let d = Demand::new(f64::NAN);
        assert!(matches!(
            allocate(1.0, Division::FairShare, &[d], &mut out),
            Err(QuotaError::Wants { client: 0, .. })
        ));
        assert!("fair".parse::<Division>().is_err());
    }
}
