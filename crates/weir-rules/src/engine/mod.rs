//! Deciding calls to resources under a rule set, and swapping rule sets without losing state.
//!
//! Order of checks (Sentinel's slot order): authority, system (inbound calls only), hot
//! parameters, flow, breaker. A call that passes them all gets a [`Guard`]; completing it
//! reports the outcome (breaker, adaptive limit) and the response time (resource statistics);
//! dropping it releases what it holds and records the response time without an outcome. A
//! paced call gets a guard with a [`Guard::wait`] the caller must wait before proceeding. A
//! blocked call gets a [`Block`] naming the rule, its kind and when to retry. Rules in shadow
//! mode are evaluated and counted, never block. The pass path of a configured resource does
//! not allocate (hot-parameter and `origin: other` rules allocate a key only when the value is
//! new to their table).
//!
//! The decision path crosses these files (`decide` calls `call`'s and `guard`'s helpers): the
//! small helpers it calls are `#[inline]`, since code split across modules may land in other
//! codegen units, where the compiler calls instead of inlining (≈ 40 instructions more per
//! refusal, measured with the `entry` bench and cachegrind).

mod call;
mod compile;
mod decide;
mod error;
mod guard;
mod rules;
mod state;

pub use crate::keys::MAX_KEY_LEN;
pub use crate::metrics::RuleKind;
pub use call::{Block, Context};
pub use error::{RulesError, UnknownSwitch};
pub use guard::{Budget, Guard};
pub use rules::{Rules, SwitchState};
pub use state::{ClusterHandle, ClusterQuota, Resolved, TOP_VALUES};
