//! State a server keeps beside its configuration file across restarts (`RULES.switches.json`,
//! `RULES.budgets.json`): JSON read back with a size bound and errors naming the file, line
//! and column; written atomically (a temporary file beside it, synced, renamed over it), so a
//! crash leaves the previous complete file.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// `FILE.SUFFIX` beside `config` (`rules.yaml` → `rules.yaml.switches.json`).
pub fn beside(config: &Path, suffix: &str) -> PathBuf {
    let mut name = config.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    config.with_file_name(name)
}

/// Why a state file could not be read back: each names the file (a malformed one with line and
/// column) and what the reader can do about it.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// The file exists but cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than any state this server writes.
    #[error("{}: larger than {max_bytes} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The bound.
        max_bytes: u64,
    },
    /// The file is not JSON of the expected shape.
    #[error("{}:{line}:{column}: expected {expected}: {reason}{hint}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Where, from 1.
        line: usize,
        /// Where on the line, from 1.
        column: usize,
        /// The shape expected.
        expected: &'static str,
        /// What was wrong there.
        reason: String,
        /// What the reader can do about it (empty, or starting with a space).
        hint: &'static str,
    },
}

/// The state saved in `path` (`None` when there is no file). A file larger than `max_bytes`,
/// unreadable or not of the shape `expected` describes is an error naming it (with line and
/// column for JSON errors) and `hint`, what the reader can do about it.
pub fn load<T: DeserializeOwned>(
    path: &Path,
    max_bytes: u64,
    expected: &'static str,
    hint: &'static str,
) -> Result<Option<T>, StateFileError> {
    use std::io::Read;
    let read = |source| StateFileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read(e)),
    };
    let mut text = String::new();
    file.take(max_bytes + 1)
        .read_to_string(&mut text)
        .map_err(read)?;
    if text.len() as u64 > max_bytes {
        return Err(StateFileError::TooLarge {
            path: path.to_path_buf(),
            max_bytes,
        });
    }
    serde_json::from_str(&text).map(Some).map_err(|e| {
        // serde_json ends its message with the position, which the error gives apart.
        let reason = e.to_string();
        let reason = reason
            .rsplit_once(" at line ")
            .map_or(reason.as_str(), |(r, _)| r);
        StateFileError::Malformed {
            path: path.to_path_buf(),
            line: e.line(),
            column: e.column(),
            expected,
            reason: reason.to_string(),
            hint,
        }
    })
}

/// Writes `value` as JSON to `path` atomically: a temporary file beside it, synced, renamed
/// over it.
pub fn save<T: Serialize + ?Sized>(path: &Path, value: &T, pretty: bool) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        if pretty {
            serde_json::to_writer_pretty(&mut f, value)?;
        } else {
            serde_json::to_writer(&mut f, value)?;
        }
        f.write_all(b"\n")?;
        f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}
