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
    if invoked_as_ratelimit() {
        return as_ratelimit();
    }
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_) | Command::Proxy(_)) {
        init_logging(None);
    }
    match cli.command {
        Command::Simulate(args) => cli::run::run_simulate(*args),
        Command::Serve(args) => cli::serve::run_serve(*args),
        Command::CheckConfig(args) => cli::check::run_check_config(args),
        Command::Proxy(args) => cli::proxy::run_proxy(*args),
        Command::Quota(QuotaCommand::Allocate(args)) => cli::run::run_allocate(args),
    }
}

/// Whether the binary was started as `ratelimit` (a link named so, or a copy): it then reads
/// envoyproxy/ratelimit's environment variables ([`cli::ratelimit_env`]).
fn invoked_as_ratelimit() -> bool {
    std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n == "ratelimit")
        })
        .unwrap_or(false)
}

/// `weir serve` with the arguments envoyproxy/ratelimit's variables ask for.
fn as_ratelimit() -> ExitCode {
    let vars: std::collections::HashMap<String, String> = std::env::vars().collect();
    let t = match cli::ratelimit_env::translate(&vars) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    init_logging(t.log.as_deref());
    for w in &t.warnings {
        tracing::warn!("{w}");
    }
    let mut argv = vec!["weir".to_string(), "serve".to_string()];
    argv.extend(t.args);
    if let Some(a) = t.metrics_addr {
        argv.extend(["--metrics-addr".to_string(), a]);
    }
    match Cli::try_parse_from(&argv) {
        Ok(Cli {
            command: Command::Serve(args),
        }) => cli::serve::run_serve(*args),
        Ok(_) => fail("the ratelimit variables did not make a serve command"),
        Err(e) => fail(format_args!(
            "the ratelimit variables make {:?}: {}",
            argv[2..].join(" "),
            e.to_string().lines().next().unwrap_or_default()
        )),
    }
}

/// Events (reloads, breaker transitions, upstream failures; blocks at `debug`) to stderr,
/// filtered by `WEIR_LOG` (default `info`, or `default` when given; e.g.
/// `WEIR_LOG=weir_rules=debug`).
fn init_logging(default: Option<&str>) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default.unwrap_or("info")));
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
