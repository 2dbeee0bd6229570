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

/// Largest configuration file read: 8 MiB (≈ 100 000 Lyft rules). Parsing costs ≈ 100 × the
/// text in memory, so an unbounded file is an unbounded allocation.
pub const MAX_BYTES: u64 = 8 << 20;

/// Deepest nesting of flow collections (`[`, `{`) accepted: parsers recurse per level, and
/// real rule files nest a handful of levels.
pub const MAX_NESTING: usize = 64;

/// Reads a configuration file of at most [`MAX_BYTES`], naming the file in the error.
pub fn read(file: &Path) -> Result<String, LocatedError> {
    use std::io::Read;
    let fail = |reason: String| LocatedError {
        file: file.to_path_buf(),
        position: None,
        path: String::new(),
        reason,
    };
    let f = std::fs::File::open(file).map_err(|e| fail(format!("cannot read: {e}")))?;
    let mut bytes = Vec::new();
    f.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(fail(format!(
            "larger than {} MiB: split it (a directory of files) or trim it",
            MAX_BYTES >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        let upto = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = upto.iter().filter(|b| **b == b'\n').count() + 1;
        let column = upto.iter().rev().take_while(|b| **b != b'\n').count() + 1;
        LocatedError {
            position: Some((line, column)),
            ..fail("not UTF-8".into())
        }
    })
}

/// Where flow collections nest deeper than [`MAX_NESTING`] (1-based line and column), looking
/// past quoted strings and comments.
fn too_deep(text: &str) -> Option<(usize, usize)> {
    let (mut depth, mut line, mut col) = (0usize, 1usize, 0usize);
    let mut quote: Option<char> = None;
    let mut comment = false;
    let mut prev = '\n';
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        col += 1;
        if c == '\n' {
            line += 1;
            col = 0;
            comment = false;
            prev = c;
            continue;
        }
        match (quote, c) {
            _ if comment => {}
            (Some('"'), '\\') => {
                chars.next();
                col += 1;
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '#') if prev.is_whitespace() => comment = true,
            (None, '"' | '\'') => quote = Some(c),
            (None, '[' | '{') => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some((line, col));
                }
            }
            (None, ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
        prev = c;
    }
    None
}

/// Parses `text` (the contents of `file`) into `T`. A leading UTF-8 byte-order mark is
/// ignored; text over [`MAX_BYTES`] or nested deeper than [`MAX_NESTING`] is refused before
/// parsing.
pub fn parse<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, LocatedError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.len() as u64 > MAX_BYTES {
        return Err(LocatedError {
            file: file.to_path_buf(),
            position: None,
            path: String::new(),
            reason: format!("larger than {} MiB", MAX_BYTES >> 20),
        });
    }
    if let Some(position) = too_deep(text) {
        return Err(LocatedError {
            file: file.to_path_buf(),
            position: Some(position),
            path: String::new(),
            reason: format!("nested deeper than {MAX_NESTING} levels"),
        });
    }
    deserialize(text).map_err(|(_, e)| LocatedError {
        file: file.to_path_buf(),
        ..e
    })
}

/// One step of a deserializer's field path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Seg {
    Key(String),
    Index(usize),
}

/// Deserializes `text`; an error carries its path as steps too (empty file name).
fn deserialize<T: DeserializeOwned>(text: &str) -> Result<T, (Option<Vec<Seg>>, LocatedError)> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let segs: Option<Vec<Seg>> = e
            .path()
            .iter()
            .map(|s| match s {
                serde_path_to_error::Segment::Map { key } => Some(Seg::Key(key.clone())),
                serde_path_to_error::Segment::Seq { index } => Some(Seg::Index(*index)),
                _ => None,
            })
            .collect();
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
        let reason = plain(&reason);
        (
            segs,
            LocatedError {
                file: PathBuf::new(),
                position,
                path,
                reason,
            },
        )
    })
}

/// serde's wording of a type error (`invalid type: integer `-2`, expected u64`) in a
/// configuration's terms (`expected a whole number ≥ 0, got -2`); other reasons as they are.
fn plain(reason: &str) -> String {
    if let Some(rest) = reason.strip_prefix("unknown variant ") {
        if let Some((got, one_of)) = rest.split_once(", expected ") {
            return format!("unknown value {got}: expected {one_of}");
        }
    }
    let Some(rest) = reason
        .strip_prefix("invalid type: ")
        .or_else(|| reason.strip_prefix("invalid value: "))
    else {
        return reason.to_string();
    };
    let Some((got, expected)) = rest.rsplit_once(", expected ") else {
        return reason.to_string();
    };
    let expected = match expected {
        "u64" | "usize" => "a whole number ≥ 0".to_string(),
        "u32" => format!("a whole number from 0 to {}", u32::MAX),
        "u16" => format!("a whole number from 0 to {}", u16::MAX),
        "u8" => format!("a whole number from 0 to {}", u8::MAX),
        "i64" | "i32" | "isize" => "a whole number".to_string(),
        "f64" | "f32" => "a number".to_string(),
        "a boolean" => "true or false".to_string(),
        "a string" | "a borrowed string" => "text".to_string(),
        "a sequence" => "a list".to_string(),
        "a map" => "a mapping (`field: value` lines)".to_string(),
        e if e.starts_with("struct ") => "a mapping of fields (`field: value`)".to_string(),
        e => e.to_string(),
    };
    let got = if let Some(v) = got
        .strip_prefix("integer ")
        .or_else(|| got.strip_prefix("floating point "))
        .or_else(|| got.strip_prefix("boolean "))
    {
        v.trim_matches('`').to_string()
    } else if let Some(v) = got.strip_prefix("string ") {
        v.to_string()
    } else {
        match got {
            "sequence" => "a list".to_string(),
            "map" => "a mapping".to_string(),
            "unit value" => "nothing".to_string(),
            g => g.to_string(),
        }
    };
    format!("expected {expected}, got {got}")
}

/// Most errors one file reports ([`parse_all`]).
pub const MAX_ERRORS: usize = 100;

/// Time [`parse_all`] spends looking for further errors after the first, at most.
const FURTHER_ERRORS_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

/// [`parse`], reporting every error of the file rather than the first: after an error, the
/// offending node is set aside (a field, or a list element) and the rest is deserialized
/// again, so errors in other fields and other list elements are found in the same run. An
/// error that only follows from a node set aside (a required field now missing) is not
/// reported. Syntax errors end the search (nothing after them can be read). At most
/// [`MAX_ERRORS`] errors, and about two seconds of further searching.
pub fn parse_all<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, LocatedErrors> {
    parse_checked(file, text, |_: &T, _| Vec::new())
}

/// What a file still says once the nodes with errors were set aside ([`parse_checked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completeness {
    /// Nothing was set aside: every check applies.
    Whole,
    /// Fields were set aside, and no list element whole.
    FieldsSetAside,
    /// A whole list element was set aside (a rule or resource without a required field): a
    /// check that one part names another (a route's resource) may fail only because the part
    /// named is the one set aside, so such checks should be skipped.
    ElementsSetAside,
}

/// [`parse_all`], then `check` — the constraints the types cannot express, as (field path,
/// reason) — on what parsed. When some nodes had errors, `check` still runs on the rest (the
/// nodes with errors set aside, see [`Completeness`]), so a file's type errors and its
/// semantic ones are reported in one run; a problem at a node that contained a node set aside
/// is not reported (it may only follow from it). Errors are in file order.
pub fn parse_checked<T, F>(file: &Path, text: &str, check: F) -> Result<T, LocatedErrors>
where
    T: DeserializeOwned,
    F: FnOnce(&T, Completeness) -> Vec<(String, String)>,
{
    let first = match parse::<T>(file, text) {
        Ok(t) => {
            let problems = check(&t, Completeness::Whole);
            return located(file, text, problems).map_or(Ok(t), Err);
        }
        Err(e) => e,
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut errors = vec![first];
    let Ok(mut doc) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) else {
        return Err(LocatedErrors(errors));
    };
    let Some(mut at) = segs(&errors[0].path) else {
        return Err(LocatedErrors(errors));
    };
    let mut set_aside = SetAside::default();
    let started = std::time::Instant::now();
    let mut rest: Option<T> = None;
    while errors.len() < MAX_ERRORS && started.elapsed() < FURTHER_ERRORS_BUDGET {
        if at.is_empty() || !remove(&mut doc, &at) {
            break;
        }
        set_aside.record(&at);
        let Ok(again) = serde_yaml_ng::to_string(&doc) else {
            break;
        };
        match deserialize::<T>(&again) {
            Ok(t) => {
                rest = Some(t);
                break;
            }
            Err((None, _)) => break,
            Err((Some(segs), e)) => {
                let original = set_aside.original(&segs);
                if !set_aside.explains(&original) {
                    let path = render(&original);
                    errors.push(LocatedError {
                        file: file.to_path_buf(),
                        position: locate(text, &path),
                        path,
                        reason: e.reason,
                    });
                }
                at = segs;
            }
        }
    }
    if let Some(t) = rest {
        let completeness = if set_aside.elements.is_empty() {
            Completeness::FieldsSetAside
        } else {
            Completeness::ElementsSetAside
        };
        for (path, reason) in check(&t, completeness) {
            let Some(now) = segs(&path) else { continue };
            let original = set_aside.original(&now);
            if set_aside.explains(&original) || errors.len() >= MAX_ERRORS {
                continue;
            }
            let path = render(&original);
            errors.push(LocatedError {
                file: file.to_path_buf(),
                position: locate(text, &path),
                path,
                reason,
            });
        }
    }
    in_file_order(&mut errors);
    Err(LocatedErrors(errors))
}

/// Sorts errors in file order; those without a position last, in the order found.
fn in_file_order(errors: &mut [LocatedError]) {
    errors.sort_by_key(|e| e.position.map_or((usize::MAX, 0), |p| p));
}

/// A field path as steps.
fn segs(path: &str) -> Option<Vec<Seg>> {
    steps(path).map(|s| {
        s.into_iter()
            .map(|s| match s {
                Step::Key(k) => Seg::Key(k.to_string()),
                Step::Index(i) => Seg::Index(i),
            })
            .collect()
    })
}

/// `a.b[2].c`, as `serde_path_to_error` writes a path.
fn render(segs: &[Seg]) -> String {
    let mut out = String::new();
    for s in segs {
        match s {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Removes the node at `at` from `doc`; false when there is none.
fn remove(doc: &mut serde_yaml_ng::Value, at: &[Seg]) -> bool {
    use serde_yaml_ng::Value;
    let Some((last, parents)) = at.split_last() else {
        return false;
    };
    let mut node = doc;
    for s in parents {
        node = match (node, s) {
            (Value::Mapping(m), Seg::Key(k)) => {
                match m.iter_mut().find(|(key, _)| key_is(key, k)) {
                    Some((_, v)) => v,
                    None => return false,
                }
            }
            (Value::Sequence(v), Seg::Index(i)) => match v.get_mut(*i) {
                Some(v) => v,
                None => return false,
            },
            (Value::Tagged(t), _) => return remove(&mut t.value, std::slice::from_ref(s)),
            _ => return false,
        };
    }
    match (node, last) {
        (Value::Mapping(m), Seg::Key(k)) => {
            let key = m.keys().find(|key| key_is(key, k)).cloned();
            key.is_some_and(|key| m.remove(&key).is_some())
        }
        (Value::Sequence(v), Seg::Index(i)) if *i < v.len() => {
            v.remove(*i);
            true
        }
        _ => false,
    }
}

fn key_is(key: &serde_yaml_ng::Value, want: &str) -> bool {
    match key {
        serde_yaml_ng::Value::String(s) => s == want,
        serde_yaml_ng::Value::Number(n) => n.to_string() == want,
        serde_yaml_ng::Value::Bool(b) => b.to_string() == want,
        _ => false,
    }
}

/// The nodes [`parse_all`] set aside, in the original file's coordinates.
#[derive(Default)]
struct SetAside {
    /// Every node set aside.
    paths: Vec<Vec<Seg>>,
    /// Per list (its original path), the original indices of its elements set aside, sorted.
    elements: std::collections::HashMap<Vec<Seg>, Vec<usize>>,
}

impl SetAside {
    /// A path in the document as it is now, in the original file's coordinates (list
    /// elements set aside shift the later ones).
    fn original(&self, now: &[Seg]) -> Vec<Seg> {
        let mut out = Vec::with_capacity(now.len());
        for s in now {
            let mapped = match s {
                Seg::Index(i) => {
                    let gone = self.elements.get(&out).map(Vec::as_slice).unwrap_or(&[]);
                    let mut original = *i;
                    for g in gone {
                        if *g <= original {
                            original += 1;
                        }
                    }
                    Seg::Index(original)
                }
                key => key.clone(),
            };
            out.push(mapped);
        }
        out
    }

    /// Records that the node now at `now` was set aside.
    fn record(&mut self, now: &[Seg]) {
        let original = self.original(now);
        if let Some((Seg::Index(i), list)) = original.split_last() {
            let gone = self.elements.entry(list.to_vec()).or_default();
            let at = gone.partition_point(|g| g < i);
            gone.insert(at, *i);
        }
        self.paths.push(original);
    }

    /// Whether an error at `original` may only follow from a node set aside within it.
    fn explains(&self, original: &[Seg]) -> bool {
        self.paths.iter().any(|p| p.starts_with(original))
    }
}

/// Every error of one file, printed one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocatedErrors(pub Vec<LocatedError>);

impl fmt::Display for LocatedErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LocatedErrors {}

impl From<LocatedError> for LocatedErrors {
    fn from(e: LocatedError) -> Self {
        Self(vec![e])
    }
}

/// Validation problems found after parsing `text` (the contents of `file`), as (field path,
/// reason), located in the text and in file order; `None` when there are none.
pub fn located(file: &Path, text: &str, problems: Vec<(String, String)>) -> Option<LocatedErrors> {
    if problems.is_empty() {
        return None;
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut errors: Vec<LocatedError> = problems
        .into_iter()
        .map(|(path, reason)| LocatedError {
            file: file.to_path_buf(),
            position: locate(text, &path),
            path,
            reason,
        })
        .collect();
    in_file_order(&mut errors);
    Some(LocatedErrors(errors))
}

/// One step of a field path (`resources[2].flow[0].qps`).
#[derive(Debug, PartialEq, Eq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// Splits a field path as `serde_path_to_error` and the validators write it.
fn steps(path: &str) -> Option<Vec<Step<'_>>> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Step::Key(key));
        }
        while let Some((n, after)) = rest.split_once(']') {
            out.push(Step::Index(n.parse().ok()?));
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    Some(out)
}

/// The 1-based line and column where the node at field path `path` starts in the YAML `text`
/// (a validation error found after deserializing carries only its path).
pub fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    use saphyr_parser::{Event, Parser};
    let target = steps(path)?;
    /// An open collection: its depth in the path, and where its next child goes.
    enum Frame<'a> {
        Map {
            key: Option<std::borrow::Cow<'a, str>>,
        },
        Seq {
            next: usize,
        },
    }
    let mut frames: Vec<Frame> = Vec::new();
    // Whether the path so far (one step per frame) is a prefix of the target.
    let mut on_path: Vec<bool> = Vec::new();
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, span) = parser.next_event()?.ok()?;
        let is_node = matches!(
            event,
            Event::Scalar(..)
                | Event::MappingStart(..)
                | Event::SequenceStart(..)
                | Event::Alias(_)
        );
        if is_node {
            // A mapping expecting a key: this scalar is the key, not a value.
            if let (Some(Frame::Map { key: key @ None }), Event::Scalar(k, ..)) =
                (frames.last_mut(), &event)
            {
                *key = Some(k.clone());
                continue;
            }
            // The value's path: the parent's, plus its key or index.
            let depth = frames.len();
            // Whether this node's path is a prefix of the target (the root's, empty, is).
            let matches = match frames.last() {
                None => true,
                Some(frame) => {
                    on_path.last().copied().unwrap_or(true)
                        && target
                            .get(depth - 1)
                            .is_some_and(|want| match (frame, want) {
                                (Frame::Map { key: Some(k) }, Step::Key(w)) => k == w,
                                (Frame::Seq { next }, Step::Index(w)) => next == w,
                                _ => false,
                            })
                }
            };
            if matches && depth == target.len() {
                return Some((span.start.line(), span.start.col() + 1));
            }
            match event {
                Event::MappingStart(..) => {
                    frames.push(Frame::Map { key: None });
                    on_path.push(matches);
                }
                Event::SequenceStart(..) => {
                    frames.push(Frame::Seq { next: 0 });
                    on_path.push(matches);
                }
                _ => advance(frames.last_mut()),
            }
        } else if matches!(event, Event::MappingEnd | Event::SequenceEnd) {
            frames.pop();
            on_path.pop();
            advance(frames.last_mut());
        } else if matches!(event, Event::StreamEnd) {
            return None;
        }
    }
    /// The collection `frame` has taken one value.
    fn advance(frame: Option<&mut Frame<'_>>) {
        match frame {
            Some(Frame::Map { key }) => *key = None,
            Some(Frame::Seq { next }) => *next += 1,
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_paths_are_found_in_the_text() {
        let text = "resources:\n  - name: a\n    flow:\n      - {id: x, qps: 0}\n      - id: y\n        qps: 5\nhttp: {routes: [{prefix: /a}, {prefix: b}]}\n";
        assert_eq!(locate(text, "resources[0].flow[0].qps"), Some((4, 22)));
        assert_eq!(locate(text, "resources[0].flow[0]"), Some((4, 9)));
        assert_eq!(locate(text, "resources[0].flow[1].qps"), Some((6, 14)));
        assert_eq!(locate(text, "resources[0].name"), Some((2, 11)));
        assert_eq!(locate(text, "http.routes[1].prefix"), Some((7, 40)));
        assert_eq!(locate(text, "resources[1]"), None);
        assert_eq!(locate(text, "nothing.here"), None);
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Doc {
        a: serde_yaml_ng::Value,
    }

    fn err(text: &str) -> String {
        parse::<Doc>(Path::new("f.yaml"), text)
            .unwrap_err()
            .to_string()
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        name: String,
        n: Option<u32>,
        kind: Option<Kind>,
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(rename_all = "snake_case")]
    enum Kind {
        Small,
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Items {
        items: Vec<Item>,
        title: Option<String>,
    }

    fn all(text: &str) -> Vec<String> {
        parse_all::<Items>(Path::new("f.yaml"), text)
            .unwrap_err()
            .0
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn every_error_of_a_file_is_reported_in_one_run() {
        let text = "items:\n  - name: a\n    n: -1\n  - name: b\n    kind: huge\n  - nam: c\n  - name: d\n    n: x\n    kind: tiny\ntitle: [1]\n";
        let e = all(text);
        assert_eq!(e.len(), 6, "{e:#?}");
        assert!(
            e[0].starts_with(
                "f.yaml:3:8: items[0].n: expected a whole number from 0 to 4294967295, got -1"
            ),
            "{e:#?}"
        );
        assert!(
            e[1].starts_with("f.yaml:5:11: items[1].kind: unknown value `huge`: expected"),
            "{}",
            e[1]
        );
        assert!(
            e[2].starts_with("f.yaml:6:10: items[2].nam: unknown field `nam`"),
            "{}",
            e[2]
        );
        assert!(
            e[3].starts_with(
                "f.yaml:8:8: items[3].n: expected a whole number from 0 to 4294967295, got \"x\""
            ),
            "{}",
            e[3]
        );
        assert!(
            e[4].starts_with("f.yaml:9:11: items[3].kind: unknown value `tiny`"),
            "{}",
            e[4]
        );
        assert!(
            e[5].starts_with("f.yaml:10:8: title: expected text, got a list"),
            "{}",
            e[5]
        );
        // A required field set aside is not reported again as missing.
        let e = all("items:\n  - name: [x]\n  - name: ok\n    n: 1.5\n");
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(e[1].starts_with("f.yaml:4:8: items[1].n: "), "{}", e[1]);
        // A syntax error ends the search.
        assert_eq!(all("items: [\n").len(), 1);
        // A valid file parses.
        assert!(parse_all::<Items>(Path::new("f.yaml"), "items: [{name: a}]\n").is_ok());
    }

    /// A check the types cannot express: names unique, and every `other` names an item.
    fn check(items: &Items, whole: Completeness) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, it) in items.items.iter().enumerate() {
            if !seen.insert(it.name.as_str()) {
                out.push((format!("items[{i}].name"), "duplicate".to_string()));
            }
        }
        if whole != Completeness::ElementsSetAside {
            if let Some(t) = &items.title {
                if !seen.contains(t.as_str()) {
                    out.push(("title".to_string(), format!("{t:?} names no item")));
                }
            }
        }
        out
    }

    fn checked(text: &str) -> Vec<String> {
        parse_checked(Path::new("f.yaml"), text, check)
            .unwrap_err()
            .0
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn type_errors_do_not_hide_the_checks_of_the_rest() {
        // A type error, then a duplicate in a later element (its index shifted by nothing)
        // and a reference to nothing: all three in one run, in file order.
        let e = checked("items:\n  - name: a\n    n: -1\n  - name: a\ntitle: zed\n");
        assert_eq!(
            e,
            [
                "f.yaml:3:8: items[0].n: expected a whole number from 0 to 4294967295, got -1",
                "f.yaml:4:11: items[1].name: duplicate",
                "f.yaml:5:8: title: \"zed\" names no item",
            ],
        );
        // An element set aside whole (its required name missing) shifts the later ones: the
        // duplicate is reported at its place in the file; a reference that may name the
        // element set aside is not checked.
        let e = checked("items:\n  - nam: q\n  - name: b\n  - name: b\ntitle: q\n");
        assert_eq!(
            e,
            [
                "f.yaml:2:5: items[0].nam: unknown field `nam`, expected one of `name`, `n`, `kind`",
                "f.yaml:4:11: items[2].name: duplicate",
            ],
        );
        // A problem inside a node that lost a field is not reported (it may only follow from it).
        let whole = parse_checked(Path::new("f.yaml"), "items: [{name: a}]\ntitle: a\n", check);
        assert!(whole.is_ok());
    }

    #[test]
    fn a_byte_order_mark_is_ignored() {
        assert!(parse::<Doc>(Path::new("f.yaml"), "\u{feff}a: 1\n").is_ok());
    }

    #[test]
    fn deep_nesting_is_refused_at_once_with_its_place() {
        let deep = format!("a: {}", "[".repeat(200_000));
        let t = std::time::Instant::now();
        let e = err(&deep);
        assert!(e.starts_with("f.yaml:1:68: nested deeper than 64"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        // Brackets in strings and comments are not nesting.
        let quoted = format!("a: '{0}' # {0}\n", "[".repeat(100));
        assert!(parse::<Doc>(Path::new("f.yaml"), &quoted).is_ok());
        let ok = format!("a: {}{}", "[".repeat(64), "]".repeat(64));
        assert!(parse::<Doc>(Path::new("f.yaml"), &ok).is_ok());
    }

    #[test]
    fn oversized_files_are_refused_before_reading_them_whole() {
        let dir = std::env::temp_dir().join(format!("weir-yaml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.yaml");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_BYTES + 10).unwrap();
        let e = read(&big).unwrap_err().to_string();
        assert!(e.contains("big.yaml: larger than 8 MiB"), "{e}");
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, b"a: 1\nb: \xff\n").unwrap();
        let e = read(&bad).unwrap_err().to_string();
        assert!(e.contains("bad.yaml:2:4: not UTF-8"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
