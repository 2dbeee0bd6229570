//! Authority rules: which origins may call a resource.

use serde::Deserialize;

/// Allow or deny list of origins (callers).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorityRule {
    /// Unique id.
    pub id: String,
    /// Only these origins may call (exclusive with `deny`).
    #[serde(default)]
    pub allow: Vec<String>,
    /// These origins may not call.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Evaluate and count, never block.
    #[serde(default)]
    pub shadow: bool,
}
