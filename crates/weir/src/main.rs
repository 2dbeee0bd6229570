//! The `weir` command.
//!
//! - `weir simulate`: run a trace through any algorithm on virtual time (see `simulate.rs`).
//!
//! Errors print one line `weir: error: …` and exit 2 (bad usage, configuration or input).

mod duration;
mod overload;
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
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct SimulateArgs {
    #[command(subcommand)]
    scenario: Option<Scenario>,
    /// fixed_window, sliding_window, sliding_log, sliding_counter, gcra, token_bucket,
    /// warmup_token_bucket or pacing.
    #[arg(long, value_name = "ALG", required = true)]
    algorithm: Option<String>,
    /// Units per window.
    #[arg(long, value_name = "N", required = true)]
    limit: Option<u64>,
    /// The window, e.g. 1s, 250ms, 1m.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, required = true)]
    window: Option<Duration>,
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

#[derive(Subcommand)]
enum Scenario {
    /// A service at X × its capacity in virtual time, behind one of Weir's protections.
    Overload(OverloadArgs),
}

#[derive(clap::Args)]
struct OverloadArgs {
    /// none, static, bbr, gradient2, aimd, vegas or codel.
    #[arg(long, value_name = "P")]
    protection: String,
    /// Offered load as a multiple of capacity (e.g. 3).
    #[arg(long, value_name = "X")]
    load: f64,
    /// Requests per second the service completes at full use.
    #[arg(long, value_name = "C", default_value_t = 1000.0)]
    capacity: f64,
    /// Simulated time.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "30s")]
    duration: Duration,
    /// Random seed (same seed, same result).
    #[arg(long, value_name = "S", default_value_t = 1)]
    seed: u64,
    /// Workers (threads) of the simulated service.
    #[arg(long, value_name = "W", default_value_t = overload::DEFAULT_WORKERS)]
    workers: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
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

fn run_overload(args: OverloadArgs) -> ExitCode {
    let settings = overload::Settings {
        protection: args.protection,
        load: args.load,
        capacity: args.capacity,
        duration: args.duration,
        seed: args.seed,
        workers: args.workers,
    };
    match overload::run(&settings) {
        Ok(report) => {
            if args.json {
                println!("{}", overload::json(&report));
            } else {
                print!("{}", overload::text(&report));
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn run_simulate(args: SimulateArgs) -> ExitCode {
    if let Some(Scenario::Overload(o)) = args.scenario {
        return run_overload(o);
    }
    let (Some(algorithm), Some(limit), Some(window)) = (args.algorithm, args.limit, args.window)
    else {
        return fail("simulate needs --algorithm, --limit and --window");
    };
    let settings = simulate::Settings {
        algorithm,
        limit,
        window,
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
