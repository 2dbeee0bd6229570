//! A lease client's local limiter counts costs (a `cluster:` rule with `cost:`) as GCRA does in
//! memory: on random timelines of calls lasting from 1 ms to 100 × (estimate ÷ rate), at the
//! rate a lease granted, what the calls of any window cost never passes `burst + rate × window`
//! plus the window's excesses plus the estimates outstanding at its start (docs/cost.md).

#[path = "../../weir-core/tests/support/cost_bound.rs"]
mod cost_bound;

use std::time::Duration;

use cost_bound::{run_timeline, steps, tokens_used_within};
use proptest::prelude::*;
use weir_core::cost::Held;
use weir_quota::client::{ClientConfig, ResourceClient};
use weir_quota::Lease;

const SECOND: u64 = 1_000_000_000;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn a_lease_clients_costs_keep_the_bound(steps in steps()) {
        // 100 units/s granted, half a second's burst: 50 units.
        let config = ClientConfig {
            burst: Duration::from_millis(500),
            ..ClientConfig::default()
        };
        let start = 5 * SECOND;
        let client = ResourceClient::new("tokens", config, 100.0, 1, start);
        client.on_lease(
            Lease {
                granted: 100.0,
                expires_at: u64::MAX / 2,
                refresh: Duration::from_secs(3_600),
                safe_capacity: 100.0,
                learning: false,
                lease_id: 1,
            },
            start,
        );
        let ledger = run_timeline(
            &steps,
            start,
            |estimate, now| {
                client
                    .acquire(estimate, now)
                    .allowed()
                    .then_some(Held { estimate, taken: now })
            },
            |held, actual, now| client.settle(held, actual, now),
        );
        // (A first call within the burst is always admitted: the timelines do exercise it.)
        prop_assert!(steps[0].estimate > 50 || ledger.iter().any(|e| e.admission));
        prop_assert_eq!(tokens_used_within(&ledger, SECOND / 100, 50, 0), Ok(()));
    }
}
