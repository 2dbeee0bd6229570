//! Shared by the rules tests: a rule set from YAML, rules on a manual clock, counting passes.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use weir_core::stats::Outcome;
use weir_core::ManualClock;
use weir_rules::config::RuleSet;
use weir_rules::engine::{Context, Rules};

/// Rules on a manual clock.
pub type R = Rules<Arc<ManualClock>>;

/// A validated rule set (panics with the located error).
pub fn set(yaml: &str) -> RuleSet {
    RuleSet::from_yaml(Path::new("rules.yaml"), yaml).unwrap_or_else(|e| panic!("{e}"))
}

/// Rules from `yaml` on a manual clock at 1 s.
pub fn rules(yaml: &str) -> (R, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    (Rules::with_clock(&set(yaml), clock.clone()).unwrap(), clock)
}

/// How many of `n` calls pass (each completed at once).
pub fn passes(r: &R, resource: &str, ctx: &Context<'_>, n: usize) -> usize {
    (0..n)
        .filter(|_| {
            r.entry(resource, ctx)
                .map(|g| g.complete(Outcome::Success))
                .is_ok()
        })
        .count()
}
