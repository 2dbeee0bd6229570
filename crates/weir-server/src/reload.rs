//! Reloading `weir serve`'s configuration files (its rate-limit configuration and its quota
//! file) when their contents change, on weir-rules' one file watcher
//! ([`weir_rules::watch::Watcher`]): the owner's `reload` runs on the watcher's thread, never on
//! a runtime worker, so a large or pathological file does not hold up requests. Each outcome
//! is one log event (`tracing`) per error and one count in the owner's [`Reloads`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_rules::watch::Watcher;

/// Changes of a watched file seen so far, by result.
#[derive(Debug, Default)]
pub struct Reloads {
    /// Changes applied.
    pub applied: AtomicU64,
    /// Changes refused (the previous file stays in force).
    pub rejected: AtomicU64,
}

impl Reloads {
    /// Writes the counts as the counter `name` (`_total`) by `result`.
    pub fn encode(
        &self,
        enc: &mut crate::admin::metrics::Encoder,
        name: &str,
        help: &str,
    ) -> std::fmt::Result {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        crate::admin::metrics::counters(
            enc,
            name,
            help,
            [
                ([("result", "applied")], load(&self.applied)),
                ([("result", "rejected")], load(&self.rejected)),
            ],
        )
    }
}

/// Watches `path` for `owner` (until the watcher or `owner` is dropped), calling `reload` on a
/// change and counting the outcome in `counts`; `what` names the file in the messages.
pub fn watch<S: Send + Sync + 'static, E: std::fmt::Display + 'static>(
    owner: &Arc<S>,
    path: PathBuf,
    interval: Duration,
    counts: Arc<Reloads>,
    what: &'static str,
    reload: fn(&S) -> Result<(), E>,
) -> std::io::Result<Watcher> {
    let me = Arc::downgrade(owner);
    let file = path.clone();
    Watcher::on_change(path, interval, move || {
        let Some(me) = me.upgrade() else {
            return false;
        };
        match reload(&me) {
            Ok(()) => {
                counts.applied.fetch_add(1, Ordering::Relaxed);
                tracing::info!(file = %file.display(), "reloaded the {what}");
            }
            Err(errors) => {
                counts.rejected.fetch_add(1, Ordering::Relaxed);
                // One event per problem: an error's display holds one per line.
                for e in errors.to_string().lines() {
                    tracing::error!("reload kept the previous {what}: {e}");
                }
            }
        }
        true
    })
}
