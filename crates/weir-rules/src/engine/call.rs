//! A call as the engine sees it: who calls and with what ([`Context`]), why one is refused
//! ([`Block`]), and the one place a refusal is counted and named.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use weir_core::{Clock, Criticality, Remaining};

use crate::metrics::RuleKind;
use crate::metrics::RuleStats;

use super::state::Resource;

/// Who calls and with what: the origin (caller), the criticality, the parameters that
/// hot-parameter rules look at, and whether the call comes into this service (system rules
/// apply to inbound calls only).
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The caller's name (`""` when unknown).
    pub origin: &'a str,
    /// The call's criticality.
    pub criticality: Criticality,
    /// Parameters by position (user id, IP, tenant …).
    pub params: &'a [&'a str],
    /// A call into this service (true, the default) or out of it to a dependency (false).
    pub inbound: bool,
    /// What the call says it will cost (its estimate, e.g. an LLM request's `max_tokens`), for
    /// rules with `cost:`; `None`: each rule's own `estimate`.
    pub cost: Option<u64>,
}

impl Default for Context<'_> {
    fn default() -> Self {
        Self {
            origin: "",
            criticality: Criticality::Critical,
            params: &[],
            inbound: true,
            cost: None,
        }
    }
}

/// Why a call was blocked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The rule's id.
    pub rule: Arc<str>,
    /// Its kind.
    pub kind: RuleKind,
    /// When a retry may pass (None: not by waiting, e.g. denied by authority).
    pub retry_after: Option<Duration>,
    /// The rate that was exceeded (units, window), for rate rules: what `RateLimit-Policy`
    /// headers announce.
    pub rate: Option<(u64, Duration)>,
    /// What the rule had left for the call's key, for rate rules (`RateLimit`'s `r=`). With
    /// no `retry_after`, the call asked for more than the rule can ever hold (a cost estimate
    /// above its burst): no wait lets it pass. Divided only when read ([`Remaining::get`]).
    pub remaining: Option<Remaining>,
}

/// Counts a block on the resource and traces it.
#[inline]
pub(super) fn blocked<C: Clock>(res: Option<&Resource<C>>, resource: &str, block: Block) -> Block {
    if let Some(r) = res {
        r.stats.block(block.kind);
    }
    tracing::debug!(
        resource,
        rule = &*block.rule,
        kind = block.kind.as_str(),
        "blocked"
    );
    block
}

/// Counts the verdict; blocks unless allowed or in shadow mode.
#[inline]
pub(super) fn verdict(
    allowed: bool,
    shadow: bool,
    stats: &RuleStats,
    block: impl FnOnce() -> Block,
) -> Result<(), Block> {
    if allowed {
        stats.passes.add(1);
        return Ok(());
    }
    if shadow {
        stats.shadow_blocks.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    stats.blocks.fetch_add(1, Ordering::Relaxed);
    Err(block())
}
