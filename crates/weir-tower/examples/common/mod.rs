//! What the examples share: arguments (`[RULES.yaml] [--demo]`), the rules loaded from the file
//! (one error line and exit 2 when it is bad) and a watcher applying its edits.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use weir_rules::engine::Rules;
use weir_rules::watch::{load, Watcher};

/// The example's rules, whether `--demo` was given, and the watcher keeping the rules in step
/// with the file (keep it alive).
pub fn rules_from_args(name: &str) -> (Arc<Rules>, bool, Watcher) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let demo = args.iter().any(|a| a == "--demo");
    let path = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules.yaml"))
        });
    let fail = |e: &dyn std::fmt::Display| -> ! {
        eprintln!("{name}: error: {e}");
        std::process::exit(2)
    };
    let set = load(&path).unwrap_or_else(|e| fail(&e));
    let rules = Arc::new(
        Rules::new(&set).unwrap_or_else(|e| fail(&format_args!("{}: {e}", path.display()))),
    );
    println!("{name}: rules from {}", path.display());
    // Edits to the file apply within a second; a bad edit is reported and ignored.
    let tag = name.to_string();
    let watcher = Watcher::start(rules.clone(), path, Duration::from_secs(1), move |e| {
        eprintln!("{tag}: rules file: {e:?}")
    })
    .unwrap_or_else(|e| fail(&e));
    (rules, demo, watcher)
}
