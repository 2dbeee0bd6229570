//! Rules counted in a store every instance shares (`shared: true` on a flow `qps` or
//! hot-parameter rule): one budget across processes, e.g. two `weir proxy` on one Redis.
//!
//! The engine never waits: [`crate::engine::Rules::entry`] decides every local rule and leaves
//! the shared ones on the guard; the caller then awaits [`crate::engine::Guard::decide_shared`],
//! which asks the [`SharedStore`] for each (its estimate held, for a rule with `cost:`) and
//! gives back what it took if one refuses. Settlements go to the store without waiting
//! ([`SharedStore::settle`]). Without a store the rules decide locally, as any other.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;

use weir_core::budget::CountOf;
use weir_core::rate::RateSpec;
use weir_core::Decision;

/// A rule as the shared store counts it: its id (the counters' name, the same in every
/// instance with the same rule file) and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedRule {
    /// The rule's id.
    pub name: String,
    /// What it counts.
    pub spec: RateSpec,
}

/// What a store holds for a cost reservation, handed back to it to settle (opaque to the
/// rules).
pub struct SharedHeld(pub Box<dyn Any + Send + Sync>);

impl std::fmt::Debug for SharedHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedHeld")
    }
}

/// A decision being made by a [`SharedStore`].
pub type Deciding<'a> = Pin<Box<dyn Future<Output = (Decision, Option<SharedHeld>)> + Send + 'a>>;

/// A calendar budget's take decided by a [`SharedStore`]: `Some((admitted, count after))`
/// (refused: the count before), or `None` when the store cannot answer (the rule then counts
/// on this instance).
pub type BudgetDeciding<'a> = Pin<Box<dyn Future<Output = Option<(bool, u64)>> + Send + 'a>>;

/// Counters every instance shares (weir-redis through weir-server).
pub trait SharedStore: Send + Sync + 'static {
    /// Takes `n` units of `rule` for `key`; with `cost`, holds them as an estimate to settle:
    /// the decision and, when admitted, what to settle with. Never fails: a store that cannot
    /// be reached decides by its own fallback.
    fn acquire<'a>(
        &'a self,
        rule: &'a SharedRule,
        key: &'a str,
        n: u64,
        cost: bool,
    ) -> Deciding<'a>;

    /// Corrects a reservation to `actual` (the rest given back, an excess a debt), without
    /// the caller waiting.
    fn settle(&self, rule: &SharedRule, key: &str, held: SharedHeld, actual: u64);

    /// Takes `n` units of a calendar budget's count `of` (`budgets:` with `shared: true`;
    /// `now`: Unix seconds): a hard budget refuses past `limit`. By default the store does
    /// not count budgets (`None`: counted locally).
    fn take_budget<'a>(
        &'a self,
        of: CountOf<'a>,
        now: i64,
        n: u64,
        limit: u64,
        hard: bool,
    ) -> BudgetDeciding<'a> {
        let _ = (of, now, n, limit, hard);
        Box::pin(async { None })
    }

    /// Adds `delta` units (negative: gives back, never below 0) to a calendar budget's count
    /// `of`, without the caller waiting.
    fn add_budget(&self, of: CountOf<'_>, now: i64, delta: i64) {
        let _ = (of, now, delta);
    }
}
