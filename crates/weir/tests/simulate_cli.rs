//! `weir simulate` through the real binary: output format, summary, and bad input.

use crate::common;

use std::process::Output;

fn weir(args: &[&str], stdin: &str) -> Output {
    common::run(args, stdin)
}

fn sim(alg: &str, extra: &[&str], input: &str) -> Output {
    let mut args = vec![
        "simulate",
        "--algorithm",
        alg,
        "--limit",
        "2",
        "--window",
        "1s",
        "--input",
        "-",
    ];
    args.extend_from_slice(extra);
    weir(&args, input)
}

#[test]
fn gcra_csv_output_is_exact() {
    let out = sim(
        "gcra",
        &[],
        "t_ms,key,cost\n0,a,1\n0,a,1\n0,a,1\n250,a,1\n500,a,0\n0600,b,3\n",
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout,
        "t_ms,key,cost,allowed,remaining,retry_after_ms,wait_ms\n\
         0,a,1,true,1,0,0\n\
         0,a,1,true,0,0,0\n\
         0,a,1,false,0,500,0\n\
         250,a,1,false,0,250,0\n\
         500,a,0,true,1,0,0\n\
         600,b,3,false,2,,0\n"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("events: 6  allowed: 3  denied: 3"),
        "{stderr}"
    );
    assert!(stderr.contains("  a: 2"), "{stderr}");
}

#[test]
fn pacing_reports_waits() {
    let out = sim(
        "pacing",
        &["--max-wait", "600ms"],
        "0,k,1\n0,k,1\n0,k,1\n0,k,1\n",
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    // 2 per second = one every 500 ms; a queue of 600 ms holds one more.
    assert_eq!(lines[1], "0,k,1,true,1,0,0");
    assert_eq!(lines[2], "0,k,1,true,0,0,500");
    assert_eq!(lines[3], "0,k,1,false,0,400,0");
    assert_eq!(lines.len(), 5);
}

#[test]
fn the_bundled_trace_shows_the_fixed_window_boundary_burst() {
    let out = weir(
        &[
            "simulate",
            "--algorithm",
            "fixed_window",
            "--limit",
            "10",
            "--window",
            "1s",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("alice: 19"), "{stderr}");
    let out = weir(
        &[
            "simulate",
            "--algorithm",
            "sliding_log",
            "--limit",
            "10",
            "--window",
            "1s",
        ],
        "",
    );
    assert!(String::from_utf8(out.stderr).unwrap().contains("alice: 10"));
}

fn assert_usage_error(out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "partial output: {:?}", out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(needle),
        "stderr {stderr:?} lacks {needle:?}"
    );
    assert_eq!(
        stderr.lines().filter(|l| l.contains("error")).count(),
        1,
        "{stderr}"
    );
}

#[test]
fn bad_input_names_the_line_and_prints_nothing_else() {
    let ok = "0,a,1\n1,a,1\n";
    assert_usage_error(
        &sim("gcra", &[], &format!("{ok}0,a,1\n")),
        "line 3: time goes backwards",
    );
    assert_usage_error(
        &sim("gcra", &[], &format!("{ok}2,a\n")),
        "line 3: expected 3 fields",
    );
    assert_usage_error(
        &sim("gcra", &[], &format!("{ok}2,a,-1\n")),
        "line 3: cost '-1'",
    );
    assert_usage_error(
        &sim("gcra", &[], &format!("{ok}x,a,1\n")),
        "line 3: t_ms 'x'",
    );
    assert_usage_error(
        &sim("gcra", &[], &format!("{ok}2,a,1.5\n")),
        "line 3: cost '1.5'",
    );
    let long_key = "k".repeat(2000);
    assert_usage_error(
        &sim("gcra", &[], &format!("1,{long_key},1\n")),
        "line 1: key is longer",
    );
}

#[test]
fn bad_options_are_usage_errors() {
    assert_usage_error(&sim("nope", &[], "0,a,1\n"), "unknown algorithm 'nope'");
    assert_usage_error(
        &sim("gcra", &["--buckets", "4"], "0,a,1\n"),
        "--buckets does not apply",
    );
    let out = weir(
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "0",
            "--window",
            "1s",
            "--input",
            "-",
        ],
        "0,a,1\n",
    );
    assert_usage_error(&out, "limit must be at least 1");
    // Without --input either: the error is the only line (no note about the bundled trace).
    let out = weir(
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "0",
            "--window",
            "1s",
        ],
        "",
    );
    assert_usage_error(&out, "limit must be at least 1");
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    let out = weir(
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "0s",
            "--input",
            "-",
        ],
        "0,a,1\n",
    );
    assert_usage_error(&out, "window must be longer than zero");
    let out = weir(
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "1x",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    let out = weir(
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "1s",
            "--input",
            "/nonexistent/trace.csv",
        ],
        "",
    );
    assert_usage_error(&out, "cannot read /nonexistent/trace.csv");
}

/// The README's boundary-burst table is what `weir simulate` prints on the bundled trace.
#[test]
fn the_readmes_boundary_burst_table_is_what_the_command_prints() {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
    )
    .unwrap();
    let table = readme
        .split("| algorithm | allowed of 32 |")
        .nth(1)
        .expect("the table");
    let mut rows = 0;
    for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let algorithm = cells[1].split('`').nth(1).unwrap();
        let allowed = cells[2];
        let most = cells[3].trim_matches('*');
        let mut args = vec![
            "simulate",
            "--algorithm",
            algorithm,
            "--limit",
            "10",
            "--window",
            "1s",
        ];
        if cells[1].contains("--max-wait 1s") {
            args.extend(["--max-wait", "1s"]);
        }
        let out = weir(&args, "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("allowed: {allowed} ")),
            "{algorithm}: README says {allowed} allowed; the command: {err}"
        );
        assert!(
            err.contains(&format!("alice: {most}\n")),
            "{algorithm}: README says {most} in a span; the command: {err}"
        );
        rows += 1;
    }
    assert!(rows >= 7, "{rows} rows");
}
