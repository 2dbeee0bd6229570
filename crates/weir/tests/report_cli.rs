//! The simulators' HTML reports (`--report FILE`, `--compare ALT`): `weir simulate`, `weir
//! simulate overload` and `weir simulate quota` write a self-contained page (inline SVG, nothing
//! fetched) with both configurations side by side, which headless Chromium renders with its
//! charts drawn. With `WEIR_SCREENSHOTS=DIR` the tests also save the pages as PNG there (how
//! docs/simulate-*.png are made).

use crate::common;

use std::path::PathBuf;

fn screenshot(name: &str) -> Option<PathBuf> {
    std::env::var_os("WEIR_SCREENSHOTS").map(|d| PathBuf::from(d).join(name))
}

/// Runs the binary with `args` and `--report` into a fresh directory: the page.
fn report(args: &[&str], name: &str) -> (PathBuf, String) {
    let path = common::tempdir("report").join(format!("{name}.html"));
    let mut all = args.to_vec();
    all.extend(["--report", path.to_str().unwrap()]);
    let out = common::run(&all, "");
    assert!(
        out.status.success(),
        "{all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("report written to"), "{err}");
    let page = std::fs::read_to_string(&path).unwrap();
    (path, page)
}

/// What every report is: one HTML page, nothing fetched, a column per configuration.
fn self_contained(page: &str, sections: usize, charts: usize) {
    assert!(page.starts_with("<!DOCTYPE html>"));
    for external in ["<script", "<link", "src=", "href=", "url(", "@import"] {
        assert!(!page.contains(external), "{external} in the page");
    }
    assert_eq!(page.matches("<section>").count(), sections);
    assert_eq!(page.matches("<svg").count(), sections * charts);
}

/// The page as Chromium renders it: its charts are there, drawn.
fn rendered(path: &std::path::Path, png: &str) {
    let url = format!("file://{}", path.display());
    let dom = common::render_page(&url, 1280, 1100, None, &[]);
    assert!(dom.contains("<polyline"), "no line drawn");
    if let Some(shot) = screenshot(png) {
        common::render_page(&url, 1280, 1100, Some(&shot), &[]);
    }
}

#[test]
fn simulate_reports_two_algorithms_side_by_side() {
    let (path, page) = report(
        &[
            "simulate",
            "--algorithm",
            "fixed_window",
            "--limit",
            "10",
            "--window",
            "1s",
            "--compare",
            "sliding_log",
        ],
        "simulate",
    );
    self_contained(&page, 2, 1);
    assert!(page.contains("fixed_window 10 per 1s") && page.contains("sliding_log 10 per 1s"));
    // The bundled trace's boundary burst: a fixed window admits 19 in one second, the log 10.
    assert!(page.contains("19 (1.90 × the limit)"), "{page}");
    assert!(page.contains("10 (1.00 × the limit)"), "{page}");
    rendered(&path, "simulate-algorithms.png");
}

#[test]
fn overload_reports_two_protections_side_by_side() {
    let (path, page) = report(
        &[
            "simulate",
            "overload",
            "--protection",
            "bbr",
            "--load",
            "3",
            "--duration",
            "30s",
            "--compare",
            "none",
        ],
        "overload",
    );
    self_contained(&page, 2, 2);
    assert!(page.contains("bbr at 3 × 1000/s") && page.contains("none at 3 × 1000/s"));
    assert!(page.contains("p99 latency"), "{page}");
    rendered(&path, "simulate-overload.png");
}

#[test]
fn quota_reports_grants_against_max_min_shares() {
    let (path, page) = report(
        &[
            "simulate",
            "quota",
            "--capacity",
            "1000",
            "--compare",
            "proportional_share",
        ],
        "quota",
    );
    self_contained(&page, 2, 3);
    assert!(page.contains("fair_share 1000/s") && page.contains("proportional_share 1000/s"));
    // One bar per client and series at the moment of excess demand.
    assert!(page.matches("<rect").count() >= 2 * 3 * 9, "{page}");
    rendered(&path, "simulate-quota.png");
}

#[test]
fn report_options_are_checked() {
    for (args, message) in [
        (
            vec![
                "simulate",
                "overload",
                "--protection",
                "bbr",
                "--load",
                "2",
                "--compare",
                "none",
            ],
            "--report",
        ),
        (
            vec![
                "simulate",
                "quota",
                "--capacity",
                "1000",
                "--tree",
                "1x2x4",
                "--report",
                "/tmp/x.html",
            ],
            "not with --tree",
        ),
        (
            vec![
                "simulate",
                "--algorithm",
                "gcra",
                "--limit",
                "5",
                "--window",
                "1s",
                "--report",
                "/tmp/weir-report-never-written.html",
                "--compare",
                "leaky",
            ],
            "--compare: unknown algorithm 'leaky'",
        ),
    ] {
        let out = common::run(&args, "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: {err}");
    }
}
