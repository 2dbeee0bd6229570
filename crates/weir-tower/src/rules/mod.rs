//! A weir-rules rule set as a tower layer: each request is mapped to a resource and a call
//! context (origin, criticality, parameters) by a [`Classify`] — the rule file's `http.routes`
//! ([`Routes`]) or a closure — then admitted by [`Rules::entry`](weir_rules::engine::Rules::entry).
//!
//! - Admitted: the inner service is called (after the wait of a paced rule); the guard is held
//!   by the response body and completed when the body ends (5xx or a body error = error), or
//!   dropped with it (a client that disconnects frees its slot).
//! - Blocked: flow and hot-parameter rules answer 429 with `Retry-After` (seconds, rounded up),
//!   `RateLimit-Policy` / `RateLimit` and a problem body; authority 403; breaker and system
//!   rules 503 (with `Retry-After` when known).
//! - gRPC requests (`content-type: application/grpc…`) are answered the gRPC way instead:
//!   HTTP 200 with trailers-only `grpc-status` RESOURCE_EXHAUSTED (rate rules),
//!   PERMISSION_DENIED (authority) or UNAVAILABLE (breaker, system), `grpc-message`, and
//!   `grpc-retry-pushback-ms` when the wait is known.
//! - Request paths are normalised first ([`crate::path`]): the inner service sees the path
//!   that was matched; an ambiguous path (`%2F`, `\\`, `%00`, …) is answered 400.
//! - Requests no route matches pass untouched.

mod decider;
mod fallback;
mod future;
mod layer;
mod policy;
mod response;
mod routes;
mod service;

pub use decider::{Call, Decider, RouteView, Verdict};
pub use fallback::{Degraded, Fallback, OnBlocked, OnBlockedFuture};
pub use future::{Deciding, Paced, RulesFuture};
pub use layer::RulesLayer;
pub use response::Pending;
pub use response::{blocked_grpc_response, blocked_response, Admitted, GuardBody, BUDGET_EXCEEDED};
pub use routes::{Classify, ClassifyFn, Head, Routes, Target};
pub use service::RulesService;

#[cfg(test)]
mod tests {
    use super::routes::under;

    #[test]
    fn prefixes_match_whole_segments() {
        assert!(under("/api", "/api"));
        assert!(under("/api/x", "/api"));
        assert!(!under("/apiary", "/api"));
        assert!(under("/anything", ""));
        assert!(!under("/other", "/api"));
    }

    /// The criticality header is read for the calls whose rules use it (the system rule, a
    /// concurrency rule), and only for them.
    #[test]
    fn criticality_is_read_when_a_rule_uses_it() {
        use weir_core::Criticality;
        let target = |yaml: &str| {
            let set = weir_rules::config::RuleSet::from_yaml(std::path::Path::new("r.yaml"), yaml)
                .expect("rule set");
            let rules = weir_rules::engine::Rules::new(&set).expect("rules");
            let table = super::routes::Table::compile(&rules, rules.generation());
            let req = http::Request::get("/a")
                .header("x-weir-criticality", "SHEDDABLE")
                .body(())
                .expect("request");
            let head = super::Head::of(&req);
            let i = table.find(head, "/a").expect("routed");
            super::routes::target_of(&table, i, head, "/a").criticality
        };
        let routes = "http:\n  routes:\n    - {resource: a, prefix: /a}\n";
        let rate = "resources:\n  - name: a\n    flow:\n      - {id: q, qps: 5}\n";
        let concurrency = "resources:\n  - name: a\n    flow:\n      - {id: c, concurrency: 5}\n";
        let system = format!("{rate}system: {{max_in_flight: 5}}\n");
        assert_eq!(target(&format!("{rate}{routes}")), Criticality::Critical);
        assert_eq!(
            target(&format!("{concurrency}{routes}")),
            Criticality::Sheddable
        );
        assert_eq!(target(&format!("{system}{routes}")), Criticality::Sheddable);
    }
}
