//! `weir simulate` and `weir quota allocate`, wired from the flags.

use std::fs::File;
use std::io::{self, BufReader, Write};
use std::process::ExitCode;

use weir::{duration, overload, quota, simulate};

use super::args::*;
use crate::fail;

/// The trace used when `--input` is not given: a burst across a window boundary.
const BUNDLED_TRACE: &str = include_str!("../../traces/boundary_burst.csv");

/// `weir quota allocate`: one resource's capacity divided among the demands read.
pub(crate) fn run_allocate(args: AllocateArgs) -> ExitCode {
    let read = match &args.input {
        None => quota::read_demands(io::stdin().lock(), "stdin"),
        Some(p) if p.as_os_str() == "-" => quota::read_demands(io::stdin().lock(), "stdin"),
        Some(p) => match File::open(p) {
            Ok(f) => quota::read_demands(BufReader::new(f), &p.display().to_string()),
            Err(e) => return fail(format_args!("{}: {e}", p.display())),
        },
    };
    let input = match read {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let source = match &args.input {
        Some(p) if p.as_os_str() != "-" => p.display().to_string(),
        _ => "stdin".to_string(),
    };
    match quota::answer(args.capacity, args.algorithm, &input, &source) {
        Ok((out, total)) => {
            print!("{out}");
            let _ = io::stdout().flush();
            let clients = input.rows.iter().filter(|r| r.demand.is_some()).count();
            eprintln!(
                "total {} of capacity {} ({clients} clients, {})",
                quota::decimal(total),
                quota::decimal(args.capacity),
                if input.nested {
                    "nested fair_share"
                } else {
                    args.algorithm.as_str()
                }
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// `weir simulate overload`.
pub(crate) fn run_overload(args: OverloadArgs) -> ExitCode {
    let settings = overload::Settings {
        protection: args.protection,
        load: args.load,
        capacity: args.capacity,
        duration: args.duration,
        seed: args.seed,
        workers: args.workers,
    };
    let report = match overload::run(&settings) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if args.json {
        println!("{}", overload::json(&report));
    } else {
        print!("{}", overload::text(&report));
    }
    let Some(path) = &args.report.report else {
        return ExitCode::SUCCESS;
    };
    let mut sections = vec![overload::report_section(&settings, &report)];
    if let Some(other) = &args.report.compare {
        let compared = overload::Settings {
            protection: other.clone(),
            ..settings.clone()
        };
        match overload::run(&compared) {
            Ok(r) => sections.push(overload::report_section(&compared, &r)),
            Err(e) => return fail(format_args!("--compare: {e}")),
        }
    }
    write_report(path, "weir simulate overload", &sections)
}

/// `weir simulate quota`: the lease protocol on virtual time, with its measures.
/// `FROM..TO` of a flag (`None` when absent); a bad one is a usage error.
fn span(
    flag: &str,
    text: Option<&str>,
) -> Result<Option<(std::time::Duration, std::time::Duration)>, ExitCode> {
    let Some(s) = text else {
        return Ok(None);
    };
    let parsed = s.split_once("..").and_then(|(a, b)| {
        Some((
            duration::parse_duration(a).ok()?,
            duration::parse_duration(b).ok()?,
        ))
    });
    match parsed {
        Some((a, b)) if a < b => Ok(Some((a, b))),
        _ => Err(fail(format_args!(
            "{flag} {s:?}: expected FROM..TO, e.g. 100s..200s"
        ))),
    }
}

/// `weir simulate quota --tree SHAPE`: a tree of lease servers on virtual time.
fn run_tree_sim(args: &QuotaSimArgs, shape: &str) -> ExitCode {
    let shape = match weir_quota::sim_tree::parse_shape(shape) {
        Ok(s) => s,
        Err(e) => return fail(format_args!("--tree {e}")),
    };
    let cut = match span("--cut-region", args.cut_region.as_deref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let leaves = shape.last().copied().unwrap_or(1);
    if args.clients < leaves || args.clients > 1_000_000 {
        return fail(format_args!(
            "--clients {}: at least one per server of the last level ({leaves}), at most 1000000",
            args.clients
        ));
    }
    let settings = weir_quota::sim_tree::TreeSettings {
        shape,
        clients: args.clients,
        capacity: args.capacity,
        lease: args.lease,
        refresh: args.refresh,
        duration: args.duration,
        cut,
        seed: args.seed,
    };
    match weir_quota::sim_tree::run(&settings) {
        Ok(r) => {
            if args.json {
                println!("{}", quota::tree_json(&r, args.capacity));
            } else {
                print!("{}", quota::tree_text(&r, args.capacity));
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

pub(crate) fn run_quota_sim(args: QuotaSimArgs) -> ExitCode {
    if !(args.capacity.is_finite() && args.capacity > 0.0) {
        return fail(format_args!(
            "--capacity {}: expected units/s > 0",
            args.capacity
        ));
    }
    if args.refresh.is_zero() || args.lease < args.refresh {
        return fail("--lease must be at least --refresh, and --refresh > 0");
    }
    let server_down = match span("--server-down", args.server_down.as_deref()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if let Some(shape) = &args.tree {
        if args.report.report.is_some() {
            return fail("--report draws the simulation of one server: not with --tree");
        }
        return run_tree_sim(&args, shape);
    }
    if args.cut_region.is_some() {
        return fail("--cut-region needs --tree");
    }
    let scenario = match &args.scenario {
        None => weir_quota::sim::default_scenario(args.clients, args.capacity, args.duration),
        Some(p) => match File::open(p) {
            Ok(f) => match quota::read_scenario(BufReader::new(f), &p.display().to_string()) {
                Ok(s) => s,
                Err(e) => return fail(e),
            },
            Err(e) => return fail(format_args!("{}: {e}", p.display())),
        },
    };
    let settings = weir_quota::sim::Settings {
        resource: weir_quota::ResourceConfig {
            capacity: args.capacity,
            algorithm: args.algorithm,
            lease: args.lease,
            refresh: args.refresh,
            safe_capacity: None,
        },
        client: weir_quota::ClientConfig::default(),
        duration: args.duration,
        server_down,
        seed: args.seed,
    };
    let report = weir_quota::sim::run(&settings, &scenario);
    if args.json {
        println!("{}", quota::sim_json(&report));
    } else {
        eprint!("{}", quota::sim_summary(&report));
        print!("{}", quota::sim_csv(&report));
    }
    let Some(path) = &args.report.report else {
        return ExitCode::SUCCESS;
    };
    let mut sections = vec![quota::sim_report_section(&settings, &report)];
    if let Some(other) = &args.report.compare {
        let algorithm = match other.parse::<weir_quota::Division>() {
            Ok(a) => a,
            Err(e) => return fail(format_args!("--compare {other:?}: {e}")),
        };
        let compared = weir_quota::sim::Settings {
            resource: weir_quota::ResourceConfig {
                algorithm,
                ..settings.resource
            },
            ..settings.clone()
        };
        let r = weir_quota::sim::run(&compared, &scenario);
        sections.push(quota::sim_report_section(&compared, &r));
    }
    write_report(path, "weir simulate quota", &sections)
}

/// `weir simulate`: a trace through an algorithm on virtual time (or a scenario).
pub(crate) fn run_simulate(args: SimulateArgs) -> ExitCode {
    match args.scenario {
        Some(Scenario::Overload(o)) => return run_overload(o),
        Some(Scenario::Quota(q)) => return run_quota_sim(q),
        None => {}
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
    // Settings first (an empty trace runs nothing): a usage error is the only line printed.
    if let Err(e) = simulate::simulate(&settings, &simulate::Trace::default(), &mut io::sink()) {
        return fail(e);
    }
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
    let Some(path) = &args.report.report else {
        return ExitCode::SUCCESS;
    };
    let mut sections = vec![simulate::report_section(&settings, trace.keys(), &summary)];
    if let Some(other) = &args.report.compare {
        // The same limit, window and trace; the options of the first algorithm are its own.
        let compared = simulate::Settings {
            algorithm: other.clone(),
            burst: None,
            buckets: None,
            warmup: None,
            max_wait: None,
            ..settings.clone()
        };
        match simulate::simulate(&compared, &trace, &mut io::sink()) {
            Ok(s) => sections.push(simulate::report_section(&compared, trace.keys(), &s)),
            Err(e) => return fail(format_args!("--compare: {e}")),
        }
    }
    write_report(path, "weir simulate", &sections)
}

/// Writes a report's page to `path`, saying where.
fn write_report(
    path: &std::path::Path,
    title: &str,
    sections: &[weir::report::Section],
) -> ExitCode {
    match std::fs::write(path, weir::report::html(title, sections)) {
        Ok(()) => {
            eprintln!("weir: report written to {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weir: error: cannot write --report {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}
