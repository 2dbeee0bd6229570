//! Loading a rule file, and watching it: when its contents change the new set is validated and
//! applied atomically (keeping state, see [`Rules::apply`]); an invalid or unreadable file is
//! reported and the rules in force stay.
//!
//! The watcher polls (default every second) instead of using inotify: polling sees every way a
//! file gets replaced — editors writing a temporary file and renaming it, Kubernetes swapping a
//! ConfigMap's symlinked directory, a file on a network volume — with one code path, and one
//! `read` per second costs nothing. It compares contents (a hash of the file, or of every file
//! of a directory with its name), not modification times (which have coarse resolution on some
//! file systems, and which `cp -p` or `touch -r` leave old). [`Watcher::on_change`] is the one
//! watcher of Weir: rule files use it through [`Watcher::start`], `weir serve` for its
//! rate-limit configuration and its quota file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use weir_core::Clock;

use crate::config::RuleSet;
use crate::engine::Rules;

/// Why a rule file could not be used; prints as one line naming the file (and line, column and
/// field when it is a configuration error).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("{}: {err}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        err: std::io::Error,
    },
    /// The file is not a valid rule set (every error found, one per line).
    #[error("{0}")]
    Invalid(#[from] crate::yaml::LocatedErrors),
    /// The set was refused by an algorithm (e.g. a window too short for its buckets).
    #[error("{}: {err}", .path.display())]
    Rules {
        /// The file.
        path: PathBuf,
        /// The error.
        err: crate::engine::RulesError,
    },
}

/// Reads and validates the rule file `path`.
pub fn load(path: &Path) -> Result<RuleSet, LoadError> {
    let text = crate::yaml::read(path).map_err(crate::yaml::LocatedErrors::from)?;
    Ok(RuleSet::from_yaml(path, &text)?)
}

/// What the watcher did.
#[derive(Debug)]
pub enum Event {
    /// The file changed and its rules are in force.
    Applied,
    /// The file changed but could not be used; the previous rules stay.
    Rejected(LoadError),
}

/// A background thread watching a file (or directory) for changed contents. Stops when
/// dropped.
#[derive(Debug)]
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// A hash of the contents of `path` — a file, or every entry of a directory with its name —
/// read within the configuration size bound; `None` when `path` cannot be read at all (a file
/// that vanished mid-rename: the next poll reads it again).
pub fn fingerprint(path: &Path) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    use std::io::Read;
    fn contents(p: &Path, h: &mut impl Hasher) -> Option<()> {
        let mut bytes = Vec::new();
        std::fs::File::open(p)
            .ok()?
            .take(crate::yaml::MAX_BYTES + 1)
            .read_to_end(&mut bytes)
            .ok()?;
        bytes.hash(h);
        Some(())
    }
    let mut h = std::hash::DefaultHasher::new();
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in &entries {
            e.hash(&mut h);
            // An unreadable entry hashes as absent; the owner's reload reports it.
            let _ = contents(e, &mut h);
        }
    } else {
        contents(path, &mut h)?;
    }
    Some(h.finish())
}

impl Watcher {
    /// Polls `path` every `interval` and calls `changed` on the watcher's thread whenever its
    /// contents differ from the last seen (the contents now are taken as seen). `changed`
    /// answers whether to keep watching.
    pub fn on_change(
        path: PathBuf,
        interval: Duration,
        mut changed: impl FnMut() -> bool + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let mut seen = fingerprint(&path);
        let thread = std::thread::Builder::new()
            .name("weir-watch".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    std::thread::park_timeout(interval);
                    if s.load(Ordering::Relaxed) {
                        break;
                    }
                    let now = fingerprint(&path);
                    if now.is_none() || now == seen {
                        continue;
                    }
                    seen = now;
                    if !changed() {
                        break;
                    }
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Polls `path` every `interval` and applies changed contents to `rules`, reporting each
    /// change to `on_event` (and to `tracing`). The contents already in force are taken to be
    /// what the file holds now.
    pub fn start<C>(
        rules: Arc<Rules<C>>,
        path: PathBuf,
        interval: Duration,
        on_event: impl Fn(Event) + Send + 'static,
    ) -> std::io::Result<Self>
    where
        C: Clock + Clone + Send + Sync + 'static,
    {
        let file = path.clone();
        Self::on_change(path, interval, move || {
            let event = match load(&file) {
                Ok(set) => match rules.apply(&set) {
                    Ok(()) => Event::Applied,
                    Err(e) => Event::Rejected(LoadError::Rules {
                        path: file.clone(),
                        err: e,
                    }),
                },
                Err(e) => Event::Rejected(e),
            };
            match &event {
                Event::Applied => tracing::info!(file = %file.display(), "rules reloaded"),
                Event::Rejected(LoadError::Invalid(errors)) => {
                    for e in &errors.0 {
                        tracing::warn!(error = %e, "rules not reloaded; previous rules stay")
                    }
                }
                Event::Rejected(e) => {
                    tracing::warn!(error = %e, "rules not reloaded; previous rules stay")
                }
            }
            on_event(event);
            true
        })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            // Dropped by its own thread (an owner released inside `changed`): it ends by itself.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}
