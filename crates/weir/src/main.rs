//! The `weir` command.
//!
//! - `weir simulate`: run a trace through any algorithm on virtual time (see `simulate.rs`).
//!
//! Errors print one line `weir: error: …` and exit 2 (bad usage, configuration or input).

mod duration;
mod simulate;

use std::fs::File;
use std::io::{self, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// The trace used when `--input` is not given: a burst across a window boundary.
const BUNDLED_TRACE: &str = include_str!("../traces/boundary_burst.csv");

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "Weir flow control",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a CSV trace (t_ms,key,cost) through a rate-limiting algorithm on virtual time.
    Simulate(SimulateArgs),
}

#[derive(clap::Args)]
struct SimulateArgs {
    /// fixed_window, sliding_window, sliding_log, sliding_counter, gcra, token_bucket,
    /// warmup_token_bucket or pacing.
    #[arg(long, value_name = "ALG")]
    algorithm: String,
    /// Units per window.
    #[arg(long, value_name = "N")]
    limit: u64,
    /// The window, e.g. 1s, 250ms, 1m.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration)]
    window: Duration,
    /// Units admitted at once (gcra, token_bucket; default: the limit).
    #[arg(long, value_name = "B")]
    burst: Option<u64>,
    /// Sub-windows of sliding_window (default 10).
    #[arg(long, value_name = "B")]
    buckets: Option<u32>,
    /// Warm-up period of warmup_token_bucket (default 10s).
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration)]
    warmup: Option<Duration>,
    /// Longest wait an admitted request may be given (token buckets, pacing; default 0; `inf`).
    #[arg(long, value_name = "DUR", value_parser = duration::parse_max_wait)]
    max_wait: Option<Duration>,
    /// Trace file, or - for standard input (default: the bundled boundary-burst trace).
    #[arg(long, value_name = "FILE|-")]
    input: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Simulate(args) => run_simulate(args),
    }
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("weir: error: {message}");
    ExitCode::from(2)
}

fn run_simulate(args: SimulateArgs) -> ExitCode {
    let settings = simulate::Settings {
        algorithm: args.algorithm,
        limit: args.limit,
        window: args.window,
        burst: args.burst,
        buckets: args.buckets,
        warmup: args.warmup,
        max_wait: args.max_wait,
    };
    let trace = match &args.input {
        None => {
            eprintln!("weir: no --input given; using the bundled trace traces/boundary_burst.csv");
            simulate::parse_trace(BUNDLED_TRACE.as_bytes(), "bundled trace")
        }
        Some(p) if p.as_os_str() == "-" => simulate::parse_trace(io::stdin().lock(), "stdin"),
        Some(p) => match File::open(p) {
            Ok(f) => simulate::parse_trace(BufReader::new(f), &p.display().to_string()),
            Err(e) => return fail(format_args!("cannot read {}: {e}", p.display())),
        },
    };
    let trace = match trace {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let stdout = io::stdout();
    let mut out = io::BufWriter::with_capacity(1 << 16, stdout.lock());
    let summary = match simulate::simulate(&settings, &trace, &mut out) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let _ = out.flush();
    drop(out);
    let _ = simulate::write_summary(&settings, &summary, &mut io::stderr().lock());
    ExitCode::SUCCESS
}
