//! Reloading `weir serve`'s configuration files (its rate-limit configuration and its quota
//! file) when their contents change, on weir-rules' one file watcher
//! ([`weir_rules::watch::Watcher`]): the owner's `reload` runs on the watcher's thread, never on
//! a runtime worker, so a large or pathological file does not hold up requests. Each outcome
//! is one log event (`tracing`) per error and a `result="applied"|"rejected"` count on
//! `metric`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use weir_rules::watch::Watcher;

/// Watches `path` for `owner` (until the watcher or `owner` is dropped), calling `reload` on a
/// change; `what` names the file in the messages.
pub fn watch<S: Send + Sync + 'static>(
    owner: &Arc<S>,
    path: PathBuf,
    interval: Duration,
    metric: &'static str,
    what: &'static str,
    reload: fn(&S) -> Result<(), Vec<String>>,
) -> std::io::Result<Watcher> {
    let me = Arc::downgrade(owner);
    let file = path.clone();
    Watcher::on_change(path, interval, move || {
        let Some(me) = me.upgrade() else {
            return false;
        };
        match reload(&me) {
            Ok(()) => {
                metrics::counter!(metric, "result" => "applied").increment(1);
                tracing::info!(file = %file.display(), "reloaded the {what}");
            }
            Err(errors) => {
                metrics::counter!(metric, "result" => "rejected").increment(1);
                for e in errors {
                    tracing::error!("reload kept the previous {what}: {e}");
                }
            }
        }
        true
    })
}
