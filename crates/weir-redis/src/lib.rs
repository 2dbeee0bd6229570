//! One global limit across machines: Weir's algorithms as atomic Redis Lua scripts.
//!
//! - [`RedisRule`]: a validated limit (fixed window, sliding counter, sliding log, GCRA, token
//!   bucket, distributed concurrency) whose keys all sit in one hash slot (`weir:{rule:key}`),
//!   so every script runs on Redis Cluster.
//! - [`RedisLimiter`]: one atomic EVALSHA per decision, answering the same
//!   [`weir_core::Decision`] as the in-memory limiters. Time is Redis `TIME` by default (one
//!   clock for all instances), integer µs since 2026-01-01.
//! - Failure handling: every call has a timeout (default 30 ms). The first failure switches
//!   *all* decisions to the fallback at once (this instance's share of the limit by default,
//!   or fail-open / fail-closed), so an outage costs at most one timeout, not one per request;
//!   a background probe returns to Redis when it answers again. Transitions are logged
//!   (`tracing`) and exported (`metrics`: `weir_redis_fallback`, `weir_redis_transitions_total`,
//!   `weir_redis_fallback_decisions_total`, `weir_redis_errors_total`).
//! - A local cache of keys known to be over their limit answers them without a round trip
//!   until their `retry_after`.
//! - Cost reservations ([`RedisLimiter::reserve_cost`], [`RedisLimiter::settle`]): an
//!   estimate held, then settled to the actual cost atomically (refund or debt).
//! - Calendar budgets ([`budget`]): one count per rule, key and period every instance shares.
//! - [`leader`]: leader election for a group of servers (a key with a TTL and a fencing term).
//! - [`scripts`]: the Lua scripts themselves.
//!
//! Inside the crate: `rule` (a validated limit and its script parameters), `limiter` (one
//! script per decision, the fallback), `config` (timeouts, fallback, probe, cache, clock),
//! `store` (one Redis or a Cluster), `error`, `cost` (reservations and settlements), `cache`
//! (keys known to be over their limit), `reserve` (units taken in advance for hot keys) and
//! `sharded` (the bounded map both of those keep).
//!
//! See `docs/redis.md` for the design, the bugs of peer projects each choice avoids, and the
//! benchmark.

pub mod budget;
mod cache;
mod config;
mod cost;
mod error;
pub mod leader;
mod limiter;
mod reserve;
mod rule;
pub mod scripts;
mod sharded;
mod store;

pub use config::{Fallback, RedisConfig, TimeSource};
pub use cost::CostHeld;
pub use error::StoreError;
pub use limiter::{caller_now_us, ConcurrencySlot, RedisLimiter, Status, ERROR_KINDS};
pub use rule::{RedisRule, Retune, RuleOptions, MAX_MEMBER_LIMIT};
pub use scripts::EPOCH_UNIX_SECS;
pub use store::Target;
