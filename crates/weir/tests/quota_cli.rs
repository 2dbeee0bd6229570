//! `weir quota allocate` and `weir simulate quota` through the real binary: the seed example,
//! input order, located errors with nothing on stdout, and the simulator's measures on the
//! built-in scenario (with and without the server going away).

use std::io::Write;
use std::process::{Command, Stdio};

fn weir(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn allocate_prints_the_seed_example_in_input_order() {
    let (code, out, err) = weir(
        &["quota", "allocate", "--capacity", "10"],
        "client,wants\nd,5\na,2\nc,4\nb,2.6\n",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "client,share\nd,2.7\na,2\nc,2.7\nb,2.6\n");
    assert!(err.contains("total 10 of capacity 10"), "{err}");
    // Priorities and weights; another algorithm.
    let (code, out, _) = weir(
        &[
            "quota",
            "allocate",
            "--capacity",
            "10",
            "--algorithm",
            "static",
        ],
        "a,1\nb,9\n",
    );
    assert_eq!((code, out.as_str()), (0, "client,share\na,1\nb,5\n"));
}

#[test]
fn allocate_refuses_bad_input_with_the_line_and_prints_nothing() {
    let (code, out, err) = weir(&["quota", "allocate", "--capacity", "10"], "a,1\nb,lots\n");
    assert_eq!(code, 2);
    assert!(out.is_empty(), "partial output: {out}");
    assert_eq!(
        err.trim(),
        "weir: error: stdin:2: wants \"lots\" is not a number"
    );
    let (code, _, err) = weir(
        &[
            "quota",
            "allocate",
            "--capacity",
            "10",
            "--algorithm",
            "fair",
        ],
        "",
    );
    assert_eq!(code, 2);
    assert!(err.contains("fair"), "{err}");
}

fn number(json: &str, key: &str) -> f64 {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} in {json}"));
    let rest = &json[at + key.len() + 3..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end].parse().unwrap()
}

#[test]
fn simulate_quota_on_the_built_in_scenario_meets_its_goals() {
    let (code, out, err) = weir(&["simulate", "quota", "--capacity", "1000", "--json"], "");
    assert_eq!(code, 0, "{err}");
    assert!(number(&out, "utilisation") >= 0.99, "{out}");
    assert!(number(&out, "peak_ratio") <= 1.01, "{out}");
    assert!(number(&out, "max_fairness_error") <= 10.0, "{out}");
    assert!(number(&out, "converge_ms_p99") <= 10_000.0, "{out}");
    // Deterministic for a seed.
    let (_, again, _) = weir(&["simulate", "quota", "--capacity", "1000", "--json"], "");
    assert_eq!(out, again);
    let (code, out, _) = weir(
        &[
            "simulate",
            "quota",
            "--capacity",
            "1000",
            "--server-down",
            "100s..200s",
            "--json",
        ],
        "",
    );
    assert_eq!(code, 0);
    assert!(number(&out, "server_down_mean_ratio") > 0.5, "{out}");
    assert!(number(&out, "server_down_peak_ratio") <= 1.1, "{out}");
    let (code, _, err) = weir(
        &[
            "simulate",
            "quota",
            "--capacity",
            "1000",
            "--server-down",
            "200s..100s",
        ],
        "",
    );
    assert_eq!(code, 2);
    assert!(err.contains("FROM..TO"), "{err}");
}
