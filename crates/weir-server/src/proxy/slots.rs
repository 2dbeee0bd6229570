//! Upstream slots per client address: no address (an IPv4 address, or an IPv6 /64, which one
//! host commonly owns whole) holds more than its bound of the upstream requests in flight,
//! so one client — however many connections it opens — cannot take every slot.
//!
//! The table holds one entry per address with a request in flight, so it is bounded by the
//! total of upstream requests in flight. It is split in [`SHARDS`] locks by address, so
//! requests from different clients rarely meet on one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

/// Locks the table is split in.
pub const SHARDS: usize = 16;

/// Upstream requests in flight per client address.
#[derive(Debug)]
pub struct AddressSlots {
    max: usize,
    shards: [Mutex<Table>; SHARDS],
}

/// One shard: requests in flight by address (foldhash with a random seed per process: one
/// table lookup costs a few nanoseconds, and chosen addresses cannot be aimed at one bucket).
type Table = HashMap<IpAddr, usize, foldhash::fast::RandomState>;

/// One slot of one address, given back when dropped.
#[derive(Debug)]
pub struct AddressSlot {
    slots: Arc<AddressSlots>,
    key: IpAddr,
}

impl AddressSlots {
    /// At most `max` (≥ 1) requests in flight per address.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            shards: std::array::from_fn(|_| Mutex::new(Table::default())),
        })
    }

    fn shard(&self, key: &IpAddr) -> &Mutex<Table> {
        use std::hash::BuildHasher;
        // A fixed hasher: the shard only spreads contention, it bounds nothing.
        let h = foldhash::fast::FixedState::with_seed(0).hash_one(key);
        &self.shards[h as usize % SHARDS]
    }

    /// A slot for a client at `ip`, unless its address holds its bound already.
    pub fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        let key = key(ip);
        let mut held = self.shard(&key).lock();
        let n = held.entry(key).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            slots: self.clone(),
            key,
        })
    }

    /// Addresses with a request in flight.
    #[cfg(test)]
    pub fn addresses(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut held = self.slots.shard(&self.key).lock();
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

/// The address a bound applies to: IPv4 as is, IPv6 by its /64 (an IPv4-mapped IPv6
/// address as its IPv4 address).
fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_bound_and_gets_slots_back() {
        let slots = AddressSlots::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let (s1, s2) = (slots.try_acquire(a).unwrap(), slots.try_acquire(a).unwrap());
        assert!(slots.try_acquire(a).is_none());
        assert!(
            slots.try_acquire(b).is_some(),
            "another address is not affected"
        );
        drop(s1);
        let s3 = slots.try_acquire(a).unwrap();
        drop((s2, s3));
        assert_eq!(
            slots.addresses(),
            0,
            "no entry for an address with nothing in flight"
        );
        // One IPv6 /64 is one address; its IPv4-mapped form is the IPv4 address.
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        let _x = slots.try_acquire(v6("2001:db8::1")).unwrap();
        let _y = slots.try_acquire(v6("2001:db8::ffff:2")).unwrap();
        assert!(slots.try_acquire(v6("2001:db8::3")).is_none());
        assert!(slots.try_acquire(v6("2001:db8:0:1::1")).is_some());
        let _m = slots.try_acquire(v6("::ffff:10.0.0.2")).unwrap();
        let _n = slots.try_acquire(b).unwrap();
        assert!(slots.try_acquire(b).is_none());
    }
}
