//! Settlements on `weir serve`: what a caller may give back or charge after the fact.
//!
//! Envoy's stream-end rate-limit calls settle a cost (`deploy/envoy/tokens.yaml`): the estimate
//! given back (`is_negative_hits`) and the actual cost charged (a descriptor ending with
//! `weir_cost=settle`). Any caller of the rate-limit service can send those, so a settlement
//! only counts on a rule that opted in (`cost:` in its `rate_limit`), and only within bounds:
//!
//! - a charge counts for at most the rule's `cost.max`;
//! - a refund counts as its ask did (`cost.min` to `cost.max`) and at most what this instance
//!   charged the same key's asks in the last [`REFUND_HORIZON`] and has not given back since
//!   ([`Ledger`]): a caller can undo its own asks, never create room nobody paid for.
//!
//! Settlements on rules without `cost:`, and the part of a refund beyond what was charged, are
//! refused: nothing changes, and they are counted (`weir_rls_settlements_refused_total`).

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use weir_core::Nanos;

/// How long an ask's units stay refundable: the longest a stream's end may come after its
/// start and still give back its estimate.
pub const REFUND_HORIZON: Duration = Duration::from_secs(15 * 60);

/// Keys one rule's ledger remembers per generation; two generations are kept, so at most
/// twice this many (about 100 bytes each). A key forgotten has nothing to give back.
pub const LEDGER_KEYS: usize = 100_000;

/// Units charged per key by asks on one rule and not yet given back, forgotten after
/// [`REFUND_HORIZON`] (in two generations: each step costs O(1), memory stays bounded whatever
/// keys callers send).
#[derive(Debug, Default)]
pub struct Ledger {
    inner: Mutex<Generations>,
}

#[derive(Debug, Default)]
struct Generations {
    current: HashMap<Box<str>, u64>,
    previous: HashMap<Box<str>, u64>,
    /// When `current` was started.
    started: Nanos,
}

impl Generations {
    /// Retires `current` once it is a horizon old or full; `previous` (two horizons old at
    /// most) is forgotten.
    fn turn(&mut self, now: Nanos) {
        let horizon = REFUND_HORIZON.as_nanos() as Nanos;
        let age = now.saturating_sub(self.started);
        if age >= 2 * horizon {
            // Idle for two horizons: nothing is refundable any more.
            self.current.clear();
            self.previous.clear();
            self.started = now;
        } else if age >= horizon || self.current.len() >= LEDGER_KEYS {
            self.previous = std::mem::take(&mut self.current);
            self.started = now;
        }
    }
}

impl Ledger {
    /// `key`'s ask of `units` was admitted at `now`.
    pub fn charged(&self, key: &str, units: u64, now: Nanos) {
        let mut g = self.inner.lock();
        g.turn(now);
        let carried = g.previous.remove(key).unwrap_or(0);
        let held = g.current.entry(key.into()).or_insert(0);
        *held = held.saturating_add(units).saturating_add(carried);
    }

    /// Takes up to `units` of what `key` has refundable at `now`: the units that may be given
    /// back (0 when nothing was charged).
    pub fn refundable(&self, key: &str, units: u64, now: Nanos) -> u64 {
        let mut guard = self.inner.lock();
        let g = &mut *guard;
        g.turn(now);
        let mut left = units;
        for map in [&mut g.current, &mut g.previous] {
            if left == 0 {
                break;
            }
            if let Some(held) = map.get_mut(key) {
                let take = left.min(*held);
                *held -= take;
                left -= take;
                if *held == 0 {
                    map.remove(key);
                }
            }
        }
        units - left
    }

    /// Keys remembered now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        let g = self.inner.lock();
        g.current.len() + g.previous.len()
    }

    /// Whether no key is remembered.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Nanos = 60_000_000_000;

    #[test]
    fn refunds_never_pass_what_was_charged() {
        let l = Ledger::default();
        assert_eq!(l.refundable("alice", 5, 0), 0, "nothing charged");
        l.charged("alice", 3, 0);
        l.charged("alice", 4, MIN);
        assert_eq!(l.refundable("bob", 1, MIN), 0, "another key's charge");
        assert_eq!(l.refundable("alice", 5, 2 * MIN), 5);
        assert_eq!(l.refundable("alice", 5, 2 * MIN), 2);
        assert_eq!(l.refundable("alice", 1, 2 * MIN), 0);
        assert!(l.is_empty());
    }

    #[test]
    fn charges_are_forgotten_after_the_horizon() {
        let l = Ledger::default();
        let h = REFUND_HORIZON.as_nanos() as Nanos;
        l.charged("a", 10, 0);
        // Carried into the next generation when the key asks again.
        l.charged("b", 1, h);
        assert_eq!(l.refundable("a", 4, h + 1), 4);
        l.charged("a", 1, h + 2);
        assert_eq!(l.refundable("a", 100, h + 3), 7);
        // Two horizons without a word: forgotten.
        l.charged("c", 9, h + 3);
        assert_eq!(l.refundable("c", 9, 3 * h + 4), 0);
    }

    #[test]
    fn memory_is_bounded_whatever_keys_come() {
        let l = Ledger::default();
        for i in 0..(3 * LEDGER_KEYS) {
            l.charged(&format!("k{i}"), 1, 0);
        }
        assert!(l.len() <= 2 * LEDGER_KEYS, "{} keys", l.len());
        // The newest keys are still refundable.
        let last = format!("k{}", 3 * LEDGER_KEYS - 1);
        assert_eq!(l.refundable(&last, 1, 0), 1);
    }
}
