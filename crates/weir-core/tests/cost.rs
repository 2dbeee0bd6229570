//! Cost reservations (`weir_core::cost`) on a manual clock: refunds give room back, excesses
//! are debts, and on random timelines of concurrent reservations the units charged in any
//! window (estimates when admitted, excesses when settled, less refunds) never pass the
//! algorithm's own bound plus the excesses settled in that window.

use std::time::Duration;

use proptest::prelude::*;
use weir_core::cost::Settle;
use weir_core::{Algorithm, FixedWindow, Gcra, Limiter, ManualClock, Quota, TokenBucket};

const SECOND: u64 = 1_000_000_000;

fn quota() -> Quota {
    Quota::new(100, Duration::from_secs(1)).unwrap()
}

#[test]
fn a_refund_gives_room_back_and_an_excess_is_a_debt() {
    let clock = ManualClock::new(10 * SECOND);
    let gcra = Limiter::with_clock(Gcra::new(quota(), 100).unwrap(), &clock);
    // 80 estimated, 20 used: 80 of the 100 are free again.
    let r = gcra.reserve_cost(80).unwrap();
    assert_eq!(r.estimate(), 80);
    r.settle(20);
    assert!(gcra.reserve_cost(80).is_ok_and(|r| {
        r.cancel();
        true
    }));
    // 10 estimated, 300 used: the debt (more than the whole burst) blocks for ≈ 2.2 s.
    gcra.reserve_cost(10).unwrap().settle(300);
    let refused = gcra.reserve_cost(1).err().expect("in debt");
    assert!(refused.retry_after().unwrap() > Duration::from_secs(2));
    clock.advance(Duration::from_millis(2_300));
    assert!(gcra.reserve_cost(1).is_ok());
}

#[test]
fn dropped_reservations_keep_their_estimate_and_cancelled_ones_give_it_all_back() {
    let clock = ManualClock::new(0);
    let window = Limiter::with_clock(FixedWindow::new(quota()).unwrap(), &clock);
    let kept = window.reserve_cost(60).unwrap();
    drop(kept);
    window.reserve_cost(40).unwrap().cancel();
    // 60 held by the dropped one, 40 given back: 40 fit, 41 do not.
    assert!(window.reserve_cost(41).is_err());
    window.reserve_cost(40).unwrap().settle(40);
    assert!(!window.acquire(1).allowed());
    // A refund after its window ended gives nothing to the next window.
    clock.advance(Duration::from_secs(1));
    let late = window.reserve_cost(30).unwrap();
    clock.advance(Duration::from_secs(1));
    window.reserve_cost(50).unwrap().settle(50);
    late.settle(0);
    assert_eq!(window.acquire(0).remaining(), 50);
}

#[test]
fn time_that_passed_is_not_given_back() {
    let clock = ManualClock::new(SECOND);
    let gcra = Limiter::with_clock(Gcra::new(quota(), 100).unwrap(), &clock);
    let first = gcra.reserve_cost(50).unwrap();
    gcra.reserve_cost(50).unwrap().settle(50);
    // 400 ms later 40 of the first 50 units' time has passed: only the 10 still ahead can
    // come back, so 50 fit now (the 40 refilled and the 10), not 90.
    clock.advance(Duration::from_millis(400));
    first.settle(0);
    assert!(gcra.reserve_cost(50).is_ok());
    assert!(!gcra.acquire(1).allowed());
}

#[test]
fn keyed_reservations_settle_per_key_and_a_refund_never_stores_a_key() {
    use weir_core::rate::{KeyedRate, RateAlgorithm, RateSpec};
    let clock = ManualClock::new(SECOND);
    let spec = RateSpec::new(RateAlgorithm::Gcra, 100, Duration::from_secs(1));
    let users = KeyedRate::new(&spec, 10, &clock).unwrap();
    assert!(users.settles());
    let now = SECOND;
    let alice = users.reserve_cost_at("alice", 90, now).unwrap();
    assert!(users.reserve_cost_at("alice", 20, now).is_err());
    assert!(
        users.reserve_cost_at("bob", 90, now).is_ok(),
        "bob has his own budget"
    );
    users.settle_at("alice", alice, 10, now);
    assert!(users.reserve_cost_at("alice", 80, now).is_ok());
    // An excess on a key: a debt for that key alone.
    let carol = users.reserve_cost_at("carol", 1, now).unwrap();
    users.settle_at("carol", carol, 250, now);
    assert!(users.reserve_cost_at("carol", 1, now + SECOND).is_err());
    assert!(users.reserve_cost_at("dave", 1, now).is_ok());
    // A refund for a key not tracked (evicted, or never charged) stores nothing.
    let before = users.len();
    let ghost = weir_core::cost::Held {
        estimate: 50,
        taken: now,
    };
    users.settle_at("ghost", ghost, 0, now);
    assert_eq!(users.len(), before);
    // Algorithms without settlement take a reservation as a plain acquire.
    let log = KeyedRate::new(
        &RateSpec::new(RateAlgorithm::SlidingLog, 5, Duration::from_secs(1)),
        10,
        &clock,
    )
    .unwrap();
    assert!(!log.settles());
    let held = log.reserve_cost_at("k", 5, now).unwrap();
    log.settle_at("k", held, 0, now);
    assert!(log.reserve_cost_at("k", 1, now).is_err());
}

/// One step of a timeline: wait `dt` ms, then ask for `estimate` (to cost `actual`, settled
/// `hold` ms later).
#[derive(Debug, Clone)]
struct Step {
    dt: u64,
    estimate: u64,
    actual: u64,
    hold: u64,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0u64..40, 1u64..60, 0u64..120, 0u64..1500).prop_map(|(dt, estimate, actual, hold)| Step {
            dt,
            estimate,
            actual,
            hold,
        }),
        1..300,
    )
}

/// A ledger entry: at `t`, `units` charged (negative: refunded), `excess` forced past the
/// limit.
struct Entry {
    t: u64,
    units: i64,
    excess: u64,
    admission: bool,
}

/// Runs `steps` on `limiter`, settling each reservation `hold` ms after it was made (at most
/// several in flight at once); answers the ledger.
fn run<A: Settle>(
    limiter: &Limiter<A, &ManualClock>,
    clock: &ManualClock,
    steps: &[Step],
) -> Vec<Entry> {
    let mut ledger = Vec::new();
    let mut open: Vec<(
        u64,
        weir_core::cost::CostReservation<'_, A, &ManualClock>,
        u64,
    )> = Vec::new();
    let settle_due = |open: &mut Vec<(
        u64,
        weir_core::cost::CostReservation<'_, A, &ManualClock>,
        u64,
    )>,
                      ledger: &mut Vec<Entry>,
                      now: u64| {
        let mut i = 0;
        while i < open.len() {
            if open[i].0 <= now {
                let (at, r, actual) = open.swap_remove(i);
                let estimate = r.estimate();
                r.settle_at(actual, at);
                let units = actual as i64 - estimate as i64;
                ledger.push(Entry {
                    t: at,
                    units,
                    excess: actual.saturating_sub(estimate),
                    admission: false,
                });
            } else {
                i += 1;
            }
        }
    };
    for s in steps {
        let now = weir_core::Clock::now(clock) + s.dt * 1_000_000;
        // Settle in time order what falls due before the next request.
        let mut due: Vec<u64> = open.iter().map(|o| o.0).filter(|t| *t <= now).collect();
        due.sort_unstable();
        for t in due {
            clock.set(t.max(weir_core::Clock::now(clock)));
            settle_due(&mut open, &mut ledger, t);
        }
        clock.set(now);
        if let Ok(r) = limiter.reserve_cost_at(s.estimate, now) {
            ledger.push(Entry {
                t: now,
                units: s.estimate as i64,
                excess: 0,
                admission: true,
            });
            open.push((now + s.hold * 1_000_000, r, s.actual));
        }
    }
    let mut rest: Vec<u64> = open.iter().map(|o| o.0).collect();
    rest.sort_unstable();
    for t in rest {
        clock.set(t.max(weir_core::Clock::now(clock)));
        settle_due(&mut open, &mut ledger, t);
    }
    // In the order things happened (times never decrease).
    ledger
}

/// The largest `net charged − excess` over windows `[start, start + window)` with `start`
/// at every entry (sliding) or on multiples of `window` (aligned).
fn worst(ledger: &[Entry], window: u64, aligned: bool) -> i64 {
    let starts: Vec<u64> = if aligned {
        ledger.iter().map(|e| e.t / window * window).collect()
    } else {
        ledger.iter().map(|e| e.t).collect()
    };
    starts
        .iter()
        .map(|&u| {
            ledger
                .iter()
                .filter(|e| e.t >= u && e.t < u + window)
                .map(|e| e.units - e.excess as i64)
                .sum::<i64>()
        })
        .max()
        .unwrap_or(0)
}

/// Debts are paid: up to the last admission, the units charged (excesses included) are at
/// most the rate over the span plus `burst` (only the excesses settled after the last
/// admission can add to that).
fn debts_paid(ledger: &[Entry], interval: u64, burst: i64) -> Result<(), String> {
    let (Some(first), Some(last)) = (ledger.first(), ledger.iter().rposition(|e| e.admission))
    else {
        return Ok(());
    };
    let net: i64 = ledger[..=last].iter().map(|e| e.units).sum();
    let last = &ledger[last];
    let allowed = ((last.t - first.t) / interval) as i64 + burst + 1;
    if net > allowed {
        return Err(format!(
            "{net} charged by the last admission, {allowed} allowed"
        ));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn gcra_charges_at_most_burst_plus_limit_plus_the_excesses(steps in steps()) {
        let clock = ManualClock::new(5 * SECOND);
        let gcra = Gcra::new(quota(), 50).unwrap();
        let bound = (gcra.limit() + 50) as i64;
        let limiter = Limiter::with_clock(gcra, &clock);
        let ledger = run(&limiter, &clock, &steps);
        let w = worst(&ledger, SECOND, false);
        prop_assert!(w <= bound, "{} charged past the excesses in one window, bound {}", w, bound);
        prop_assert_eq!(debts_paid(&ledger, SECOND / 100, 50), Ok(()));
    }

    #[test]
    fn token_bucket_charges_at_most_its_bound_plus_the_excesses(steps in steps()) {
        // Guava semantics: burst + limit, plus the last grant taken on credit (≤ 59 here).
        let clock = ManualClock::new(5 * SECOND);
        let limiter = Limiter::with_clock(TokenBucket::new(quota(), 50).unwrap(), &clock);
        let ledger = run(&limiter, &clock, &steps);
        let w = worst(&ledger, SECOND, false);
        prop_assert!(w <= 100 + 50 + 59, "{} charged past the excesses in one window", w);
    }

    #[test]
    fn fixed_window_charges_at_most_its_limit_plus_the_excesses(steps in steps()) {
        let clock = ManualClock::new(5 * SECOND);
        let limiter = Limiter::with_clock(FixedWindow::new(quota()).unwrap(), &clock);
        let ledger = run(&limiter, &clock, &steps);
        let w = worst(&ledger, SECOND, true);
        prop_assert!(w <= 100, "{} charged past the excesses in one aligned window", w);
    }
}
