//! Why a rule set cannot be put in force, and why a switch is not found.

use weir_core::ConfigError;

/// Errors applying a rule set.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RulesError {
    /// The set failed validation: (field path, reason).
    #[error("{0}: {1}")]
    Invalid(String, String),
    /// A rule's parameters were refused by the algorithm.
    #[error("rule {0}: {1}")]
    Rule(String, ConfigError),
}

/// No resource has a switch with this id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no switch {0:?} in the rules in force")]
pub struct UnknownSwitch(pub String);
