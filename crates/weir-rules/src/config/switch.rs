//! Switches: a resource turned off by configuration or at run time.

use serde::Deserialize;

/// A switch on a resource: while on, every call to the resource is blocked (kind `switch`,
/// before any other rule) and gets the route's fallback or 503. `on` here is the state the file
/// asks for; a state set at run time ([`crate::engine::Rules::set_switch`]) overrides it and
/// survives reloads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchRule {
    /// The switch's id (unique among rule ids).
    pub id: String,
    /// Degraded: calls are blocked (default false).
    #[serde(default)]
    pub on: bool,
}
