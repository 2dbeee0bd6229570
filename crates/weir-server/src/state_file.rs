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

/// The state saved in `path` (`None` when there is no file). A file larger than `max_bytes`,
/// unreadable or not of the shape `expected` describes is an error naming it (with line and
/// column for JSON errors) and `hint`, what the reader can do about it.
pub fn load<T: DeserializeOwned>(
    path: &Path,
    max_bytes: u64,
    expected: &str,
    hint: &str,
) -> Result<Option<T>, String> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut text = String::new();
    file.take(max_bytes + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > max_bytes {
        return Err(format!("{}: larger than {max_bytes} bytes", path.display()));
    }
    serde_json::from_str(&text).map(Some).map_err(|e| {
        // serde_json ends its message with the position, which the prefix already gives.
        let reason = e.to_string();
        let reason = reason
            .rsplit_once(" at line ")
            .map_or(reason.as_str(), |(r, _)| r);
        format!(
            "{}:{}:{}: expected {expected}: {reason}{hint}",
            path.display(),
            e.line(),
            e.column()
        )
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
