//! `weir simulate overload` through the real binary.

use crate::common;

use crate::common::json_number;

fn weir(args: &[&str]) -> std::process::Output {
    common::run(args, "")
}

fn run(protection: &str, load: &str) -> String {
    let out = weir(&[
        "simulate",
        "overload",
        "--protection",
        protection,
        "--load",
        load,
        "--duration",
        "10s",
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn deterministic_json_with_the_documented_keys() {
    let a = run("static", "2");
    assert_eq!(a, run("static", "2"), "same seed, same result");
    for key in ["goodput_ratio", "p50_ms", "p99_ms"] {
        json_number(&a, key);
    }
    for level in ["CRITICAL_PLUS", "CRITICAL", "SHEDDABLE_PLUS", "SHEDDABLE"] {
        assert!(a.contains(&format!("\"{level}\":{{")), "{a}");
    }
    assert!(a.contains("\"success_ratio\":"));
}

#[test]
fn no_protection_collapses_and_a_limit_holds_goodput() {
    let none = run("none", "3");
    assert!(json_number(&none, "goodput_ratio") < 0.2, "{none}");
    let fixed = run("static", "3");
    assert!(json_number(&fixed, "goodput_ratio") > 0.9, "{fixed}");
    assert!(json_number(&fixed, "p99_ms") < 3.0 * json_number(&fixed, "unloaded_p99_ms"));
}

#[test]
fn bad_arguments_exit_2() {
    let out = weir(&[
        "simulate",
        "overload",
        "--protection",
        "magic",
        "--load",
        "3",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown protection 'magic'"));
    let out = weir(&[
        "simulate",
        "overload",
        "--protection",
        "bbr",
        "--load",
        "-1",
    ]);
    assert_eq!(out.status.code(), Some(2));
}
