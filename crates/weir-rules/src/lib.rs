//! Resources and rule sets for embedding Weir in a service (Sentinel's model, done right).
//!
//! - [`yaml`]: YAML with errors located by file, line, column and field path.
//! - [`config`]: the rule set (resources with flow, hot-parameter, authority and breaker rules;
//!   `shadow` on any rule), as YAML or built in code, validated as a whole.
//! - [`engine`]: [`engine::Rules::entry`] admits a call to a resource or says which rule
//!   blocked it; [`engine::Rules::apply`] swaps a rule set in atomically, keeping the state of
//!   unchanged rules and the counters of rules whose threshold changed.
//! - [`watch`]: a file watcher applying edits as they come (a bad edit is reported, the rules
//!   in force stay).
//! - [`budget`]: a resource's calendar budgets in force; [`shared`]: rules counted in a store
//!   every instance shares; `system` (inside the crate): limits on all inbound calls together.
//! - [`keys`]: bounded keys taken from requests; [`cidr`]: trusted proxies' blocks;
//!   [`path`]: request paths in normal form.
//! - [`metrics`]: the engine's counters per rule and resource; [`history`]: the last minutes
//!   second by second; [`describe`]: a rule set as rows for people.
//!
//! ```
//! use std::path::Path;
//! use weir_core::stats::Outcome;
//! use weir_rules::{config::RuleSet, engine::{Context, Rules}};
//!
//! let yaml = "resources:
//!   - name: search
//!     flow:
//!       - {id: search-qps, qps: 2}
//!     hot_params:
//!       - {id: per-user, param: 0, threshold: 1}
//! ";
//! let rules = Rules::new(&RuleSet::from_yaml(Path::new("rules.yaml"), yaml).unwrap()).unwrap();
//! let ann = Context { params: &["ann"], ..Context::default() };
//! let call = rules.entry("search", &ann).unwrap(); // admitted
//! call.complete(Outcome::Success); // its outcome feeds breakers and statistics
//! // ann's one per second is used:
//! let Err(block) = rules.entry("search", &ann) else { panic!("admitted") };
//! assert_eq!(&*block.rule, "per-user");
//! // A bad file is refused with every error located.
//! let e = RuleSet::from_yaml(Path::new("rules.yaml"), "resources: [{name: x, flow: [{id: f, qps: 0}]}]");
//! assert!(e.unwrap_err().to_string().contains("rules.yaml:1:"));
//! ```

pub mod budget;
pub mod cidr;
pub mod config;
pub mod describe;
pub mod engine;
pub mod history;
pub mod keys;
pub mod metrics;
pub mod path;
pub mod shared;
mod system;
pub mod watch;
pub mod yaml;

pub use config::RuleSet;
pub use engine::{Block, Context, Guard, Rules};
