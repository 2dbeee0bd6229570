//! Reloading a configuration file when its contents change, shared by `weir serve`'s
//! rate-limit configuration and its quota file.
//!
//! Every `interval` the file (or every file of a directory) is hashed; when the hash moved,
//! the owner's `reload` runs. Both run on the blocking pool, never on a runtime worker, so a
//! large or pathological file does not hold up requests. Comparing contents, not modification
//! times, sees changes that `cp -p` or `touch -r` leave with an old time. Each outcome is one
//! log event (`tracing`) per error and a `result="applied"|"rejected"` count on `metric`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Watches `path` for `owner` (until `owner` is dropped), calling `reload` on a change;
/// `what` names the file in the messages.
pub fn watch<S: Send + Sync + 'static>(
    owner: &Arc<S>,
    path: PathBuf,
    interval: Duration,
    metric: &'static str,
    what: &'static str,
    reload: fn(&S) -> Result<(), Vec<String>>,
) {
    let me = Arc::downgrade(owner);
    tokio::spawn(async move {
        let p = path.clone();
        let mut last = tokio::task::spawn_blocking(move || fingerprint(&p))
            .await
            .unwrap_or_default();
        loop {
            tokio::time::sleep(interval).await;
            let Some(me) = me.upgrade() else { return };
            let p = path.clone();
            let seen = last;
            let checked = tokio::task::spawn_blocking(move || {
                let now = fingerprint(&p);
                let outcome = (now != seen).then(|| reload(&me));
                (now, outcome)
            })
            .await;
            let Ok((now, outcome)) = checked else {
                continue;
            };
            last = now;
            match outcome {
                None => {}
                Some(Ok(())) => {
                    metrics::counter!(metric, "result" => "applied").increment(1);
                    tracing::info!(file = %path.display(), "reloaded the {what}");
                }
                Some(Err(errors)) => {
                    metrics::counter!(metric, "result" => "rejected").increment(1);
                    for e in errors {
                        tracing::error!("reload kept the previous {what}: {e}");
                    }
                }
            }
        }
    });
}

/// A hash of the contents of `path` (a file, or every entry of a directory with its name),
/// read within the configuration size bound; unreadable parts hash as absent.
pub fn fingerprint(path: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    use std::io::Read;
    fn contents(p: &Path, h: &mut impl Hasher) {
        let mut bytes = Vec::new();
        if let Ok(f) = std::fs::File::open(p) {
            let _ = f
                .take(weir_rules::yaml::MAX_BYTES + 1)
                .read_to_end(&mut bytes);
        }
        bytes.hash(h);
    }
    let mut h = std::hash::DefaultHasher::new();
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        entries.sort();
        for e in &entries {
            e.hash(&mut h);
            contents(e, &mut h);
        }
    } else {
        contents(path, &mut h);
    }
    h.finish()
}
