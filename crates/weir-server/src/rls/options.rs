//! What an engine is built with: shadow mode, its clock, response metadata, merged domains.

/// Options for building rules.
#[derive(Debug, Clone, Copy)]
pub struct EngineOptions {
    /// Force shadow mode on every rule (`--shadow`).
    pub shadow: bool,
    /// The clock of the in-memory limiters (`--clock`).
    pub clock: weir_core::ClockKind,
    /// Fill [`super::Response::metadata`] (`--response-metadata`).
    pub response_metadata: bool,
    /// How the configuration loads: a domain in several files joins their descriptors
    /// (`--merge-domains`, Lyft's `MERGE_DOMAIN_CONFIG`) instead of being an error.
    pub merge_domains: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            shadow: false,
            clock: weir_core::ClockKind::Exact,
            response_metadata: false,
            merge_domains: false,
        }
    }
}
