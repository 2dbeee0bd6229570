//! The rule set: resources and their rules, from YAML or built in code.
//!
//! ```yaml
//! resources:
//!   - name: checkout
//!     flow:
//!       - {id: checkout-qps, qps: 100, window: 1s, algorithm: sliding_window}
//!       - {id: checkout-inflight, concurrency: 20}
//!     hot_params:
//!       - {id: per-user, param: 0, threshold: 5, window: 1s, exceptions: {vip: 50}, max_values: 10000}
//!     authority: {id: callers, allow: [web, mobile]}
//!     breaker: {id: payment, preset: resilience4j, shadow: true}
//!   - name: search
//!     flow:
//!       - {id: search-paced, qps: 50, behavior: pace, max_wait: 500ms}
//!       - {id: search-batch, qps: 5, origin: batch}
//!       - {id: search-when-checkout-busy, qps: 80, relate: checkout}
//! system: {max_in_flight: 500, bbr: {cpu_threshold: 0.8}}
//! http:
//!   trusted_proxies: [10.0.0.0/8]
//!   origin_header: x-caller
//!   routes:
//!     - {resource: checkout, prefix: /api/checkout, methods: [POST], params: [{header: x-user-id}]}
//!     - {resource: search, prefix: /api/search, params: [client_ip]}
//! ```

mod authority;
mod breaker;
mod budget;
mod cost;
mod fields;
mod flow;
mod hot_param;
mod http;
mod set;
mod switch;
mod system;
mod validate;

pub use self::authority::AuthorityRule;
pub use self::breaker::{BreakerPreset, BreakerRule};
pub use self::budget::{BudgetMode, BudgetRule, Every, Fraction, Resets};
pub use self::cost::{ActualFrom, CostRule, CostSources, Estimate, EstimateFrom, MAX_COST_JSON};
pub use self::fields::{is_header_name, parse_duration, RateAlgorithm, FILE_ALGORITHMS};
pub use self::flow::{
    Behavior, ClusterLimit, FlowRule, DEFAULT_MAX_WAIT, DEFAULT_WARMUP, OTHER_ORIGIN,
};
pub use self::hot_param::{Absent, HotParamRule, OnFull, Param};
pub use self::http::{Fallback, HttpConfig, Route, MAX_FALLBACK_BYTES};
pub use self::set::{ResourceConfig, RuleSet, MAX_NAME_BYTES};
pub use self::switch::SwitchRule;
pub use self::system::{AdaptiveAlgorithm, AdaptiveRule, BbrRule, SystemRule};
