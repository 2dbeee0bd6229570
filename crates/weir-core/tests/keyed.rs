//! Keyed limiter: per-key state, hard cap with idle-first eviction, overrides, runtime changes.

use std::time::Duration;

use weir_core::{FixedWindow, Gcra, KeyedLimiter, ManualClock, Quota, SlidingLog};

fn gcra(limit: u64) -> Gcra {
    Gcra::from_quota(Quota::new(limit, Duration::from_secs(1)).unwrap()).unwrap()
}

#[test]
fn keys_are_independent() {
    let clock = ManualClock::new(0);
    let keyed = KeyedLimiter::<String, _, _>::with_clock(gcra(2), 100, &clock).unwrap();
    assert!(keyed.acquire("a", 2).allowed());
    assert!(!keyed.acquire("a", 1).allowed());
    assert!(keyed.acquire("b", 2).allowed());
    assert_eq!(keyed.len(), 2);
}

#[test]
fn cap_is_never_exceeded_and_evictions_are_counted() {
    let clock = ManualClock::new(0);
    let keyed = KeyedLimiter::<u64, _, _>::with_clock(gcra(10), 1000, &clock).unwrap();
    for k in 0..50_000u64 {
        assert!(keyed.acquire(&k, 1).allowed());
        assert!(keyed.len() <= 1000);
    }
    assert!(keyed.len() <= keyed.capacity());
    assert!(keyed.capacity() <= 1000 && keyed.capacity() >= 900);
    assert_eq!(keyed.evictions() as usize + keyed.len(), 50_000);
}

#[test]
fn idle_keys_are_evicted_before_busy_ones() {
    let clock = ManualClock::new(0);
    // One shard of 16 keys so the sweep sees every key.
    let keyed = KeyedLimiter::<u64, _, _>::with_clock(gcra(1), 16, &clock).unwrap();
    assert_eq!(keyed.capacity(), 16);
    // 16 busy keys exhaust their quota now.
    for k in 0..16u64 {
        assert!(keyed.acquire(&k, 1).allowed());
    }
    // Let all but key 3 recover (GCRA: 1 s per unit), then make key 3 busy again.
    clock.advance(Duration::from_secs(2));
    assert!(keyed.acquire(&3, 1).allowed());
    // A newcomer evicts an idle key, never key 3, whose state matters.
    for k in 100..110u64 {
        assert!(keyed.acquire(&k, 1).allowed());
    }
    assert!(!keyed.acquire(&3, 1).allowed(), "key 3 lost its state");
}

#[test]
fn denied_or_peeking_newcomers_take_no_slot() {
    let clock = ManualClock::new(0);
    let keyed = KeyedLimiter::<u64, _, _>::with_clock(gcra(1), 4, &clock).unwrap();
    for k in 0..1000u64 {
        let _ = keyed.acquire(&k, 0); // peek
        let _ = keyed.acquire(&k, 5); // never
    }
    assert_eq!(keyed.len(), 0);
    assert_eq!(keyed.evictions(), 0);
}

#[test]
fn overrides_and_runtime_changes_keep_state() {
    let clock = ManualClock::new(0);
    let q = |n| Quota::new(n, Duration::from_secs(10)).unwrap();
    let keyed =
        KeyedLimiter::<String, _, _>::with_clock(FixedWindow::new(q(3)).unwrap(), 64, &clock)
            .unwrap();
    keyed.set_override("vip".to_string(), FixedWindow::new(q(10)).unwrap());
    for _ in 0..3 {
        assert!(keyed.acquire("user", 1).allowed());
    }
    assert!(!keyed.acquire("user", 1).allowed());
    for _ in 0..10 {
        assert!(keyed.acquire("vip", 1).allowed());
    }
    assert!(!keyed.acquire("vip", 1).allowed());
    // Raise the default: "user" keeps its count of 3 and gets 2 more, not 5.
    keyed.set_algorithm(FixedWindow::new(q(5)).unwrap());
    assert!(keyed.acquire("user", 2).allowed());
    let d = keyed.acquire("user", 1);
    assert!(!d.allowed());
    assert_eq!(d.limit(), 5);
    keyed.remove_override("vip");
    assert!(!keyed.acquire("vip", 1).allowed()); // count 10 ≥ default 5
}

#[test]
fn works_with_any_algorithm_and_many_threads() {
    let clock = std::sync::Arc::new(ManualClock::new(0));
    let keyed = std::sync::Arc::new(
        KeyedLimiter::<u64, _, _>::with_clock(
            SlidingLog::new(Quota::new(5, Duration::from_secs(1)).unwrap()).unwrap(),
            10_000,
            clock.clone(),
        )
        .unwrap(),
    );
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let keyed = keyed.clone();
            std::thread::spawn(move || {
                (0..100u64)
                    .flat_map(|k| (0..10).map(move |_| k))
                    .filter(|k| keyed.acquire(k, 1).allowed())
                    .count()
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, 100 * 5);
}

mod table_model {
    use std::collections::HashMap;
    use std::time::Duration;

    use proptest::prelude::*;
    use weir_core::{Algorithm, Gcra, KeyedLimiter, ManualClock, Quota};

    fn alg() -> Gcra {
        Gcra::new(Quota::new(1, Duration::from_secs(1000)).unwrap(), 3).unwrap()
    }

    proptest! {
        /// Without eviction, every key behaves exactly like its own limiter.
        #[test]
        fn same_as_one_limiter_per_key(keys in prop::collection::vec(0u64..300, 1..2000)) {
            let clock = ManualClock::new(0);
            let keyed = KeyedLimiter::<u64, _, _>::with_clock(alg(), 4096, &clock).unwrap();
            let mut model: HashMap<u64, u64> = HashMap::new();
            let a = alg();
            for k in keys {
                let state = model.entry(k).or_insert_with(|| a.initial_state(0));
                prop_assert_eq!(keyed.acquire(&k, 1), a.decide(state, 1, 0));
            }
            prop_assert_eq!(keyed.evictions(), 0);
        }

        /// Under constant eviction (backward-shift deletes), a key just stored is always found
        /// again and the cap holds.
        #[test]
        fn stored_keys_stay_findable(keys in prop::collection::vec(0u64..100_000, 1..3000), cap in 1usize..300) {
            let clock = ManualClock::new(0);
            let keyed = KeyedLimiter::<u64, _, _>::with_clock(alg(), cap, &clock).unwrap();
            for k in keys {
                let first = keyed.acquire(&k, 1);
                if first.allowed() {
                    let peek = keyed.acquire(&k, 0);
                    prop_assert_eq!(peek.remaining(), first.remaining());
                }
                prop_assert!(keyed.len() <= cap);
            }
        }
    }
}

#[test]
fn acquire_if_room_never_evicts_a_busy_key_but_reuses_idle_slots() {
    let clock = ManualClock::new(0);
    let keyed = KeyedLimiter::<u64, _, _>::with_clock(gcra(1), 4, &clock).unwrap();
    for k in 0..4u64 {
        assert!(keyed.acquire_if_room(&k, 1).unwrap().allowed());
    }
    assert!(keyed.acquire_if_room(&9, 1).is_none(), "full of busy keys");
    assert_eq!(keyed.evictions(), 0);
    assert!(
        !keyed.acquire_if_room(&0, 1).unwrap().allowed(),
        "known keys still decide"
    );
    // Once the keys are idle (their state equals a fresh one), a newcomer takes a slot.
    clock.advance(Duration::from_secs(2));
    assert!(keyed.acquire_if_room(&9, 1).unwrap().allowed());
    assert_eq!(keyed.len(), 4);
}

/// Churn through evictions (each moves the last entry of a shard into the freed place) and
/// check the index still finds exactly the keys held: every held key is exhausted (remaining 0
/// on a peek), every other key peeks fresh, and the two agree with `len()`.
#[test]
fn index_stays_consistent_through_churn() {
    let clock = ManualClock::new(0);
    for cap in [16usize, 200, 5000] {
        let keyed = KeyedLimiter::<String, _, _>::with_clock(gcra(1), cap, &clock).unwrap();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let universe = cap as u64 * 3;
        for _ in 0..cap * 40 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let _ = keyed.acquire(format!("user-{}", x % universe).as_str(), 1);
        }
        let held = (0..universe)
            .filter(|k| keyed.acquire(format!("user-{k}").as_str(), 0).remaining() == 0)
            .count();
        assert_eq!(held, keyed.len(), "cap {cap}");
        assert!(keyed.len() <= keyed.capacity(), "cap {cap}");
        assert!(keyed.evictions() > 0, "cap {cap}");
    }
}
