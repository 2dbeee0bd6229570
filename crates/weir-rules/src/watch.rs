//! Loading a rule file, and watching it: when its contents change the new set is validated and
//! applied atomically (keeping state, see [`Rules::apply`]); an invalid or unreadable file is
//! reported and the rules in force stay.
//!
//! The watcher polls (default every second) instead of using inotify: polling sees every way a
//! file gets replaced — editors writing a temporary file and renaming it, Kubernetes swapping a
//! ConfigMap's symlinked directory, a file on a network volume — with one code path, and one
//! `read` per second costs nothing. It compares contents, not modification times (which have
//! coarse resolution on some file systems).

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

/// A background thread applying a rule file's changes. Stops when dropped.
#[derive(Debug)]
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
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
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let mut seen = std::fs::read(&path).ok();
        let thread = std::thread::Builder::new()
            .name("weir-rules-watch".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    std::thread::park_timeout(interval);
                    if s.load(Ordering::Relaxed) {
                        break;
                    }
                    let now = std::fs::read(&path).ok();
                    // A file that vanished (mid-rename) keeps the rules; it is read again
                    // on the next poll.
                    if now.is_none() || now == seen {
                        continue;
                    }
                    seen = now;
                    let event = match load(&path) {
                        Ok(set) => match rules.apply(&set) {
                            Ok(()) => Event::Applied,
                            Err(e) => Event::Rejected(LoadError::Rules {
                                path: path.clone(),
                                err: e,
                            }),
                        },
                        Err(e) => Event::Rejected(e),
                    };
                    match &event {
                        Event::Applied => tracing::info!(file = %path.display(), "rules reloaded"),
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
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
