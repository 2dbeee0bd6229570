//! The `weir` command: parses the command line and runs the subcommand — `serve`, `proxy`
//! (the servers of the weir-server crate, wired in `cli/serve.rs` and `cli/run.rs`),
//! `check-config` (`cli/check.rs`), `simulate` and `quota allocate`; the arguments are in
//! `cli/args.rs`.
//!
//! Errors print one line `weir: error: …` and exit 2 (bad usage, configuration or input).

use std::process::ExitCode;

use clap::Parser;

mod cli;

use cli::args::{Cli, Command, QuotaCommand};

/// mimalloc rather than glibc's malloc: the servers allocate small, short-lived buffers per
/// request on every worker thread, where glibc's arenas took ≈ 10 % of `weir serve`'s CPU
/// under load (docs/serve.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_) | Command::Proxy(_)) {
        init_logging();
    }
    match cli.command {
        Command::Simulate(args) => cli::run::run_simulate(args),
        Command::Serve(args) => cli::serve::run_serve(args),
        Command::CheckConfig(args) => cli::check::run_check_config(args),
        Command::Proxy(args) => cli::proxy::run_proxy(*args),
        Command::Quota(QuotaCommand::Allocate(args)) => cli::run::run_allocate(args),
    }
}

/// Events (reloads, breaker transitions, upstream failures; blocks at `debug`) to stderr,
/// filtered by `WEIR_LOG` (default `info`; e.g. `WEIR_LOG=weir_rules=debug`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

/// The multi-threaded runtime of `serve` and `proxy` (one error line if it cannot start).
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("weir: error: cannot start the runtime: {e}");
            ExitCode::FAILURE
        })
}

pub(crate) fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("weir: error: {message}");
    ExitCode::from(2)
}
