//! Calendar budgets' counts kept across restarts: `RULES.budgets.json` beside the rule file.
//!
//! `weir proxy` reads the file at start (counts of periods that have ended are dropped), writes
//! the counts of the current periods every [`SAVE_EVERY`] when they changed, and once more when
//! it stops; each write is a temporary file, synced, then renamed over the old one, so a crash
//! leaves the previous complete file. What a crash can lose: the last [`SAVE_EVERY`] of counts.
//! Several proxies sharing one budget need a shared store instead (one file per proxy counts
//! per proxy).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use weir_rules::budget::SavedCount;

use crate::state_file::StateFileError;
use weir_rules::engine::Rules;

/// How often changed counts are written.
pub const SAVE_EVERY: Duration = Duration::from_secs(5);

/// Largest state file read back: about 600 000 counts.
pub const MAX_STATE_BYTES: u64 = 64 << 20;

/// Where the budgets' counts of `rules` are kept: `FILE.budgets.json` in its directory.
pub fn state_path(rules: &Path) -> PathBuf {
    crate::state_file::beside(rules, ".budgets.json")
}

/// The counts saved in `path` (none when it does not exist); an unreadable or malformed file
/// is an error naming it, its line and column.
pub fn load(path: &Path) -> Result<Vec<SavedCount>, StateFileError> {
    let saved = crate::state_file::load(
        path,
        MAX_STATE_BYTES,
        "[{\"rule\", \"key\", \"period_start\", \"used\"}, …]",
        " (delete the file to start the budgets from 0)",
    )?;
    Ok(saved.unwrap_or_default())
}

/// Writes `counts` to `path` atomically.
pub fn save(path: &Path, counts: &[SavedCount]) -> std::io::Result<()> {
    crate::state_file::save(path, counts, false)
}

/// Restores the counts saved beside the rule file into `rules`; answers how many were taken.
pub fn restore<C>(rules: &Rules<C>, path: &Path) -> Result<usize, StateFileError>
where
    C: weir_core::Clock + Clone,
{
    let saved = load(path)?;
    Ok(if saved.is_empty() {
        0
    } else {
        rules.restore_budgets(&saved)
    })
}

/// Writes the counts of `rules` to `path` whenever they changed, every [`SAVE_EVERY`], until
/// `stop` says so; then once more. Nothing is collected while they stay the same
/// ([`Rules::budget_changes`]).
pub async fn keep<C>(rules: Arc<Rules<C>>, path: PathBuf, mut stop: crate::net::accept::Shutdown)
where
    C: weir_core::Clock + Clone + 'static,
{
    let mut saved = rules.budget_changes();
    loop {
        let stopping = tokio::select! {
            () = tokio::time::sleep(SAVE_EVERY) => false,
            () = stop.stopping() => true,
        };
        let now = rules.budget_changes();
        if now != saved {
            let (p, counts) = (path.clone(), rules.budget_counts());
            let written = tokio::task::spawn_blocking(move || save(&p, &counts)).await;
            match written {
                Ok(Ok(())) => saved = now,
                Ok(Err(e)) => {
                    tracing::warn!(file = %path.display(), "budget counts not saved: {e}")
                }
                Err(e) => tracing::warn!(file = %path.display(), "budget counts not saved: {e}"),
            }
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_round_trip_and_bad_files_are_named() {
        let dir = std::env::temp_dir().join(format!("weir-budget-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = state_path(&dir.join("rules.yaml"));
        assert!(path.ends_with("rules.yaml.budgets.json"));
        assert_eq!(load(&path).unwrap(), Vec::new());
        let counts = vec![SavedCount {
            rule: "month".into(),
            key: "ann".into(),
            period_start: 1_796_000_000,
            used: 42,
        }];
        save(&path, &counts).unwrap();
        assert_eq!(load(&path).unwrap(), counts);
        // A file of 100 000 users' counts (the default `max_values` of one rule) is read back
        // whole, well within the size bound.
        let many: Vec<SavedCount> = (0..100_000)
            .map(|i| SavedCount {
                rule: "tokens-per-user-month".into(),
                key: format!("user-{i:08}"),
                period_start: 1_796_083_200,
                used: 999_999,
            })
            .collect();
        save(&path, &many).unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size < MAX_STATE_BYTES / 4, "{size} bytes");
        assert_eq!(load(&path).unwrap(), many);
        std::fs::write(&path, "[{\"rule\": 1}]").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("rules.yaml.budgets.json:1:"), "{e}");
        assert!(e.contains("delete the file"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
