//! YAML with located errors: `FILE:LINE:COLUMN: field.path: reason`.
//!
//! `serde_yaml_ng` (the maintained fork of the deprecated `serde_yaml`) reports line and column;
//! `serde_path_to_error` adds the field path. Used by the rule sets here and by `weir serve`'s
//! Lyft configuration.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// One configuration error, printable as one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocatedError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line and column, when known.
    pub position: Option<(usize, usize)>,
    /// The field path, e.g. `descriptors[1].rate_limit.unit`.
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for LocatedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, col)) = self.position {
            write!(f, ":{line}:{col}")?;
        }
        if !self.path.is_empty() && self.path != "." {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for LocatedError {}

/// Parses `text` (the contents of `file`) into `T`.
pub fn parse<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, LocatedError> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let position = inner.location().map(|l| (l.line(), l.column()));
        let mut reason = inner.to_string();
        // serde_yaml_ng appends " at line L column C"; the position is printed separately.
        if let Some(i) = reason.find(" at line ") {
            reason.truncate(i);
        }
        // … and may start with its own (shorter) path: keep the reason only.
        if let Some((head, rest)) = reason.split_once(": ") {
            if !head.contains(' ') && path.starts_with(head) {
                reason = rest.to_string();
            }
        }
        LocatedError {
            file: file.to_path_buf(),
            position,
            path,
            reason,
        }
    })
}
