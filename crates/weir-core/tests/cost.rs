//! Cost reservations (`weir_core::cost`) on a manual clock: refunds give room back whenever a
//! call ends (nothing to a full limiter), excesses are debts, and on random timelines of
//! concurrent reservations lasting from 1 ms to 100 × (estimate ÷ rate): the units charged in
//! any window (estimates when admitted, excesses when settled, less refunds) never pass the
//! algorithm's own bound plus the excesses settled in that window, and what the calls of any
//! window cost never passes `burst + rate × window` plus its excesses plus the estimates
//! outstanding at its start.

use std::time::Duration;

use proptest::prelude::*;

mod support;
use support::cost_bound::{
    run_timeline, steps, tokens_used_per_window, tokens_used_within, Entry, Step,
};
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

/// A call that runs far longer than its estimate takes to refill gives back what it did not
/// use all the same (a budget counts tokens, not `max_tokens`) — in saturation too, where the
/// limiter's state is ahead of now.
#[test]
fn a_long_calls_refund_gives_back_what_it_did_not_use() {
    let clock = ManualClock::new(SECOND);
    let gcra = Limiter::with_clock(Gcra::new(quota(), 100).unwrap(), &clock);
    let long = gcra.reserve_cost(100).unwrap();
    // 30 s later (30 × estimate ÷ rate) another call fills the burst: saturated.
    clock.advance(Duration::from_secs(30));
    let busy = gcra.reserve_cost(100).unwrap();
    assert!(!gcra.acquire(1).allowed());
    // The long call used 10: its 90 come back at once.
    long.settle(10);
    assert!(gcra.reserve_cost(90).is_ok());
    assert!(!gcra.acquire(1).allowed());
    busy.settle(100);
}

/// A limiter already full gets nothing back: it never holds more than its burst.
#[test]
fn a_full_limiter_gets_nothing_back() {
    let clock = ManualClock::new(SECOND);
    let gcra = Limiter::with_clock(Gcra::new(quota(), 100).unwrap(), &clock);
    let call = gcra.reserve_cost(50).unwrap();
    clock.advance(Duration::from_secs(2));
    call.settle(0);
    assert!(gcra.reserve_cost(100).is_ok());
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

/// Runs `steps` on `limiter` (see [`run_timeline`]).
fn run<A: Settle>(
    limiter: &Limiter<A, &ManualClock>,
    clock: &ManualClock,
    steps: &[Step],
) -> Vec<Entry> {
    run_timeline(
        steps,
        weir_core::Clock::now(clock),
        |estimate, now| {
            clock.set(now);
            limiter.reserve_cost_at(estimate, now).ok()
        },
        |r, actual, now| {
            clock.set(now.max(weir_core::Clock::now(clock)));
            r.settle_at(actual, now);
        },
    )
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
        prop_assert_eq!(tokens_used_within(&ledger, SECOND / 100, 50, 0), Ok(()));
    }

    #[test]
    fn token_bucket_charges_at_most_its_bound_plus_the_excesses(steps in steps()) {
        // Guava semantics: burst + limit, plus the last grant taken on credit (≤ 59 here).
        let clock = ManualClock::new(5 * SECOND);
        let limiter = Limiter::with_clock(TokenBucket::new(quota(), 50).unwrap(), &clock);
        let ledger = run(&limiter, &clock, &steps);
        let w = worst(&ledger, SECOND, false);
        prop_assert!(w <= 100 + 50 + 59, "{} charged past the excesses in one window", w);
        prop_assert_eq!(tokens_used_within(&ledger, SECOND / 100, 50, 59), Ok(()));
    }

    #[test]
    fn fixed_window_charges_at_most_its_limit_plus_the_excesses(steps in steps()) {
        let clock = ManualClock::new(5 * SECOND);
        let limiter = Limiter::with_clock(FixedWindow::new(quota()).unwrap(), &clock);
        let ledger = run(&limiter, &clock, &steps);
        let w = worst(&ledger, SECOND, true);
        prop_assert!(w <= 100, "{} charged past the excesses in one aligned window", w);
        prop_assert_eq!(tokens_used_per_window(&ledger, SECOND, 100), Ok(()));
    }
}
