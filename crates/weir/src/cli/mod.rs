//! The `weir` command's parts: its arguments, and one module per group of subcommands.

pub(crate) mod args;
pub(crate) mod check;
pub(crate) mod proxy;
pub(crate) mod ratelimit_env;
pub(crate) mod run;
pub(crate) mod serve;
