//! Shared by weir-server's in-process tests.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A file of `text` in a directory of this test binary's own under the system's temporary
/// directory (`group` tells the binaries apart).
pub fn file(group: &str, name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-server-{group}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    path
}

/// Prometheus's `promtool`: on PATH, else the copy `scripts/test` unpacks from Debian's
/// `prometheus` package into `$WEIR_CACHE/prometheus` (default `~/.cache/weir`).
fn promtool() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("promtool"))
            .find(|p| p.is_file())
    });
    let cache = std::env::var_os("WEIR_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/weir")))
        .map(|c| c.join("prometheus/usr/bin/promtool"))
        .filter(|p| p.is_file());
    on_path.or(cache).expect(
        "promtool not found: scripts/test unpacks Debian's prometheus package into ~/.cache/weir/prometheus",
    )
}

/// Runs `promtool check metrics` on an exposition; panics with promtool's findings unless it
/// passes (a parse error or a lint).
pub fn promtool_check(what: &str, exposition: &str) {
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics refused {what}'s /metrics:\n{}{}\n--- exposition:\n{exposition}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
