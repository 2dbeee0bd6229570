//! Resources and rule sets for embedding Weir in a service (Sentinel's model, done right).
//!
//! - [`yaml`]: YAML with errors located by file, line, column and field path.
//! - [`config`]: the rule set (resources with flow, hot-parameter, authority and breaker rules;
//!   `shadow` on any rule), as YAML or built in code, validated as a whole.
//! - [`rate`]: a bounded keyed limiter over any weir-core algorithm chosen at run time (also
//!   weir-redis's local fallback).
//! - [`engine`]: [`engine::Rules::entry`] admits a call to a resource or says which rule
//!   blocked it; [`engine::Rules::apply`] swaps a rule set in atomically, keeping the state of
//!   unchanged rules and the counters of rules whose threshold changed.

pub mod cidr;
pub mod config;
pub mod engine;
pub mod keys;
pub mod metrics;
pub mod path;
pub mod rate;
mod system;
pub mod watch;
pub mod yaml;
