//! The Lua scripts, one per algorithm, each with the shared prelude (time, arguments).
//!
//! Every script runs as one atomic EVALSHA (`redis::Script` loads it again on `NOSCRIPT`, after
//! a restart, failover or `SCRIPT FLUSH`) and touches only the keys passed in `KEYS`, all in one
//! hash slot, so it runs unchanged on Redis Cluster.

use std::sync::LazyLock;

use redis::Script;

/// Seconds from the Unix epoch to the project epoch (2026-01-01T00:00:00Z) used by the scripts.
pub const EPOCH_UNIX_SECS: u64 = 1_767_225_600;

macro_rules! script {
    ($name:ident, $file:literal) => {
        #[doc = concat!("`src/lua/", $file, "` after the prelude.")]
        pub static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!(
                include_str!("lua/prelude.lua"),
                include_str!(concat!("lua/", $file))
            ))
        });
    };
}

script!(FIXED_WINDOW, "fixed_window.lua");
script!(SLIDING_COUNTER, "sliding_counter.lua");
script!(SLIDING_WINDOW, "sliding_window.lua");
script!(SLIDING_LOG, "sliding_log.lua");
script!(GCRA, "gcra.lua");
script!(TOKEN_BUCKET, "token_bucket.lua");
script!(CONCURRENCY, "concurrency.lua");
script!(SETTLE, "settle.lua");

/// A calendar budget's count ([`crate::budget`]; no prelude: the period is the caller's).
pub static BUDGET: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/budget.lua")));

/// Releases a concurrency lease (no prelude: no time, no decision).
pub static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/release.lua")));

/// One campaign for the leadership of lease servers ([`crate::leader`]; no prelude).
pub static LEADER: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/leader.lua")));

/// A leader stepping down ([`crate::leader`]).
pub static RESIGN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/resign.lua")));
