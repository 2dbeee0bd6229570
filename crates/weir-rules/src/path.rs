//! Request paths in one normal form, so that a limit on `/api/checkout` cannot be dodged by
//! writing the same resource another way (`/api//checkout`, `/api/./checkout`,
//! `/%61pi/checkout`, …), and so that what is matched is exactly what is forwarded.
//!
//! [`normalize`] applies, in order (RFC 3986 §6.2.2 and §5.2.4; Envoy's `normalize_path` and
//! `merge_slashes` together):
//!
//! 1. Percent-encodings of unreserved characters (`A–Z a–z 0–9 - . _ ~`) are decoded; every
//!    other percent-encoding is kept, its hex digits upper-cased (`%2a` → `%2A`).
//! 2. Runs of `/` become one `/`.
//! 3. `.` segments are removed and `..` segments remove the segment before them (never above
//!    the root).
//!
//! Forms that upstreams disagree about are refused ([`PathError`], answered 400) rather than
//! guessed: an encoded slash or backslash (`%2F`, `%5C`: one server splits segments there,
//! another does not), a raw backslash (a segment separator on some servers), an encoded
//! control character (`%00`–`%1F`, `%7F`: C servers stop at `%00`), a `%` not followed by two
//! hex digits, and a path that is not origin-form (does not start with `/`; `*` of
//! `OPTIONS *` passes unchanged).
//!
//! [`match_path`] additionally drops `;parameters` from each segment and trims its trailing
//! dots and encoded spaces, for route matching only: servlet containers and others serve
//! `/api;x=1/checkout` as `/api/checkout`, servers on Windows `/api/checkout.` and
//! `/api/checkout%20`, so a route on `/api/checkout` must count them. The request is still forwarded with its
//! parameters (a server that does not strip them sees another resource, which is then limited
//! as the one it resembles: stricter, never looser).
//!
//! Case is left alone: paths are case-sensitive (RFC 3986 §6.2.2.1), and routes match them as
//! written.

use std::borrow::Cow;

/// Why a path is refused (answered 400 Bad Request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.as_str())]
pub enum PathError {
    /// `%2F` or `%5C`: servers disagree on whether it separates segments.
    EncodedSeparator,
    /// A raw `\`: some servers read it as `/`.
    Backslash,
    /// `%00`–`%1F` or `%7F`.
    EncodedControl,
    /// `%` not followed by two hex digits.
    BadEncoding,
    /// Not origin-form.
    NotOriginForm,
}

impl PathError {
    /// The message, as a static string (for answers built without allocating).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EncodedSeparator => "the path has an encoded slash or backslash (%2F, %5C)",
            Self::Backslash => "the path has a backslash",
            Self::EncodedControl => "the path has an encoded control character",
            Self::BadEncoding => "the path has a malformed percent-encoding",
            Self::NotOriginForm => "the path does not start with /",
        }
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Whether `path` is already in normal form and route form alike: origin-form with no `%`,
/// `\`, `;`, `//`, `.` right after a `/`, or a segment ending with `.`. One scan, eight bytes
/// at a time; the common case needs nothing more.
#[inline]
pub fn is_plain(path: &str) -> bool {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') || bytes.last() == Some(&b'.') {
        return false;
    }
    let mut chunks = bytes.chunks_exact(8);
    // 0x80 in the lowest byte when the previous eight ended with a `/`, in the second byte
    // when they ended with a `.`.
    let mut carry = 0;
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        match plain_word(word, carry) {
            Some(c) => carry = c,
            None => return false,
        }
    }
    let rest = chunks.remainder();
    let mut last = [0u8; 8];
    last[..rest.len()].copy_from_slice(rest);
    // Zero padding matches none of the bytes looked for.
    plain_word(u64::from_le_bytes(last), carry).is_some()
}

const ONES: u64 = 0x0101_0101_0101_0101;
const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;

/// 0x80 in each byte of `word` equal to `b`, 0 in the others (exact: no carry crosses bytes).
#[inline]
fn bytes_equal(word: u64, b: u8) -> u64 {
    let x = word ^ (ONES * u64::from(b));
    !(((x & LOW7) + LOW7) | x | LOW7)
}

/// Eight bytes of a path (little-endian) after a word whose last byte was a `/` (`carry` has
/// 0x80 in its lowest byte) or a `.` (0x80 in its second byte): `None` if they hold `%`, `\`,
/// `;`, a `/` followed by `/` or `.`, or a `.` followed by `/`; else the carry for the next
/// eight.
#[inline]
fn plain_word(word: u64, carry: u64) -> Option<u64> {
    let refused = bytes_equal(word, b'%') | bytes_equal(word, b'\\') | bytes_equal(word, b';');
    let slash = bytes_equal(word, b'/');
    let dot = bytes_equal(word, b'.');
    let after_slash = (slash << 8) | (carry & 0xff);
    let after_dot = (dot << 8) | ((carry >> 8) & 0xff);
    if refused | (after_slash & (slash | dot)) | (after_dot & slash) != 0 {
        return None;
    }
    Some((slash >> 56) | ((dot >> 56) << 8))
}

/// Whether `path` might need rewriting: a `%`, `//`, a `.` right after `/`, or a `\`.
/// False is exact (the path is already normal); true may be a false alarm (`/a/.x`).
fn suspicious(path: &[u8]) -> bool {
    let mut prev = 0u8;
    for &b in path {
        if b == b'%' || b == b'\\' || (prev == b'/' && (b == b'/' || b == b'.')) {
            return true;
        }
        prev = b;
    }
    false
}

/// The normal form of `path` (see the module documentation); borrowed when `path` already is
/// in it, which is the common case and costs one scan.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    if path == "*" {
        return Ok(Cow::Borrowed(path));
    }
    if !path.starts_with('/') {
        return Err(PathError::NotOriginForm);
    }
    let bytes = path.as_bytes();
    if !suspicious(bytes) {
        return Ok(Cow::Borrowed(path));
    }
    // 1. Decode unreserved, upper-case the rest, refuse the ambiguous.
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'\\' => return Err(PathError::Backslash),
            b'%' => {
                let (Some(h), Some(l)) = (
                    bytes.get(i + 1).copied().and_then(hex),
                    bytes.get(i + 2).copied().and_then(hex),
                ) else {
                    return Err(PathError::BadEncoding);
                };
                let c = h << 4 | l;
                if c == b'/' || c == b'\\' {
                    return Err(PathError::EncodedSeparator);
                }
                if c < 0x20 || c == 0x7f {
                    return Err(PathError::EncodedControl);
                }
                if unreserved(c) {
                    decoded.push(c);
                } else {
                    decoded.push(b'%');
                    decoded.push(bytes[i + 1].to_ascii_uppercase());
                    decoded.push(bytes[i + 2].to_ascii_uppercase());
                }
                i += 3;
            }
            _ => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    // 2 and 3. Segments: empty ones (repeated slashes) and `.` dropped, `..` pops.
    let trailing = decoded.ends_with(b"/")
        || decoded.ends_with(b"/.")
        || decoded.ends_with(b"/..")
        || decoded == b"/";
    let mut segments: Vec<&[u8]> = Vec::new();
    for s in decoded.split(|&b| b == b'/') {
        match s {
            b"" | b"." => {}
            b".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        // Only ASCII bytes were decoded (unreserved), the rest came from a `&str`: the
        // segments are UTF-8.
        out.push_str(std::str::from_utf8(s).map_err(|_| PathError::BadEncoding)?);
    }
    if trailing || segments.is_empty() {
        out.push('/');
    }
    if out == path {
        return Ok(Cow::Borrowed(path));
    }
    Ok(Cow::Owned(out))
}

/// A normal path (from [`normalize`]) as routes match it: each segment's `;parameters`
/// dropped, then dot segments and empty segments resolved again (`/api;v=1/checkout;s=2` and
/// `/api/x/..;y/checkout` → `/api/checkout`, as a servlet container reads them).
pub fn match_path(normal: &str) -> Cow<'_, str> {
    if !normal.contains(';') && !trimmed_ends(normal) {
        return Cow::Borrowed(normal);
    }
    let stripped: Vec<&str> = normal
        .split('/')
        .map(|segment| trim_segment_end(segment.split(';').next().unwrap_or("")))
        .collect();
    let joined = stripped.join("/");
    // `joined` has no new `%` or `\`: normalising it only resolves segments, and cannot fail.
    match normalize(&joined) {
        Ok(p) => Cow::Owned(p.into_owned()),
        Err(_) => Cow::Owned(joined),
    }
}

/// Whether a segment of `path` ends with `.` or an encoded space (`%20`): servers that trim
/// them (Windows' file APIs, and frameworks on them) serve `/api/checkout.` and
/// `/api/checkout%20` as `/api/checkout`, so [`match_path`] matches them as that path. A
/// plain path ([`is_plain`]) may still have one: check both.
pub fn trimmed_ends(path: &str) -> bool {
    path.ends_with('.') || path.ends_with("%20") || path.contains("./") || path.contains("%20/")
}

/// A segment without its trailing dots and encoded spaces (a segment of dots only is kept).
fn trim_segment_end(segment: &str) -> &str {
    let mut s = segment;
    loop {
        let shorter = s
            .strip_suffix('.')
            .or_else(|| s.strip_suffix("%20"))
            .filter(|rest| !rest.is_empty() && !rest.bytes().all(|b| b == b'.'));
        match shorter {
            Some(rest) => s = rest,
            None => return s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_dots_and_encoded_spaces_match_as_the_plain_path() {
        for p in [
            "/api/checkout.",
            "/api/checkout..",
            "/api/checkout%20",
            "/api/checkout.%20.",
        ] {
            assert!(trimmed_ends(p), "{p}");
            let n = normalize(p).unwrap();
            assert_eq!(match_path(&n), "/api/checkout", "{p}");
        }
        let n = normalize("/api./checkout%20/x").unwrap();
        assert_eq!(match_path(&n), "/api/checkout/x");
        // Dots inside a segment, and segments of dots only, are left alone.
        for p in ["/v1.0/file.txt", "/a/.../b"] {
            assert!(!trimmed_ends(p) || p.contains("..."), "{p}");
            assert_eq!(match_path(&normalize(p).unwrap()), p);
        }
    }

    /// The byte-at-a-time definition `is_plain` computes eight bytes at a time.
    fn is_plain_bytewise(path: &str) -> bool {
        let bytes = path.as_bytes();
        if bytes.first() != Some(&b'/') {
            return false;
        }
        if bytes.last() == Some(&b'.') {
            return false;
        }
        let mut prev = 0u8;
        for &b in bytes {
            if matches!(b, b'%' | b'\\' | b';')
                || (prev == b'/' && matches!(b, b'/' | b'.'))
                || (prev == b'.' && b == b'/')
            {
                return false;
            }
            prev = b;
        }
        true
    }

    #[test]
    fn is_plain_agrees_with_its_bytewise_definition() {
        let alphabet = ["/", ".", "%", "\\", ";", "a", "é", "~"];
        // Every string of up to 6 symbols (after a leading `/`), then long random ones, so
        // every symbol pair falls on every position of a word and across words.
        let mut paths = vec![String::new()];
        let mut frontier = vec![String::new()];
        for _ in 0..6 {
            frontier = frontier
                .iter()
                .flat_map(|p| alphabet.iter().map(move |a| format!("{p}{a}")))
                .collect();
            paths.extend(frontier.iter().cloned());
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            let mut p = String::new();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for i in 0..(x % 40) {
                // Mostly letters and slashes, as paths are.
                let pick = (x >> (i % 48)) as usize % 24;
                p.push_str(alphabet.get(pick).copied().unwrap_or(if pick % 3 == 0 {
                    "/"
                } else {
                    "b"
                }));
            }
            paths.push(p);
        }
        for p in paths {
            for path in [format!("/{p}"), p.clone()] {
                assert_eq!(is_plain(&path), is_plain_bytewise(&path), "{path:?}");
            }
        }
    }

    fn n(p: &str) -> Result<String, PathError> {
        normalize(p).map(Cow::into_owned)
    }

    #[test]
    fn every_spelling_of_one_resource_normalises_to_it() {
        for p in [
            "/api/checkout",
            "/api//checkout",
            "//api/checkout",
            "/api/./checkout",
            "/api/x/../checkout",
            "/api/%63heckout",
            "/%61pi/checkout",
            "/api/%2e/checkout",
            "/api/x/%2E%2E/checkout",
            "/./api/checkout",
            "/../api/checkout",
            "///api///checkout",
        ] {
            assert_eq!(n(p).unwrap(), "/api/checkout", "{p}");
        }
    }

    #[test]
    fn ambiguous_forms_are_refused() {
        assert_eq!(n("/api/checkout%2f"), Err(PathError::EncodedSeparator));
        assert_eq!(n("/api%2Fcheckout"), Err(PathError::EncodedSeparator));
        assert_eq!(n("/api%5ccheckout"), Err(PathError::EncodedSeparator));
        assert_eq!(n("/api\\checkout"), Err(PathError::Backslash));
        assert_eq!(n("/api/checkout%00"), Err(PathError::EncodedControl));
        assert_eq!(n("/api/checkout%7f"), Err(PathError::EncodedControl));
        assert_eq!(n("/api/%zz"), Err(PathError::BadEncoding));
        assert_eq!(n("/api/%2"), Err(PathError::BadEncoding));
        assert_eq!(n("api/checkout"), Err(PathError::NotOriginForm));
        assert_eq!(n(""), Err(PathError::NotOriginForm));
    }

    #[test]
    fn plain_paths_are_their_own_normal_and_route_forms() {
        for p in ["/", "/api/checkout", "/a.b/c/", "/x-y_z~"] {
            assert!(is_plain(p), "{p}");
            assert_eq!(normalize(p).unwrap(), p);
            assert_eq!(match_path(p), p);
        }
        for p in [
            "", "*", "a", "//", "/a/./b", "/a/.b", "/%61", "/a;b", "/a\\b",
        ] {
            assert!(!is_plain(p), "{p}");
        }
    }

    #[test]
    fn what_is_normal_already_is_borrowed() {
        for p in [
            "/",
            "/api/checkout",
            "/api/checkout/",
            "/a.b/c",
            "/a/.x",
            "*",
        ] {
            assert!(matches!(normalize(p), Ok(Cow::Borrowed(_))), "{p}");
        }
    }

    #[test]
    fn other_encodings_are_kept_upper_cased_and_trailing_slashes_stay() {
        assert_eq!(n("/a%2ab").unwrap(), "/a%2Ab");
        assert_eq!(n("/caf%c3%a9").unwrap(), "/caf%C3%A9");
        assert_eq!(n("/api/checkout/").unwrap(), "/api/checkout/");
        assert_eq!(n("/api/checkout/.").unwrap(), "/api/checkout/");
        assert_eq!(n("/api/checkout/x/..").unwrap(), "/api/checkout/");
        assert_eq!(n("/..").unwrap(), "/");
        assert_eq!(n("//").unwrap(), "/");
        assert_eq!(n("/é//x").unwrap(), "/é/x");
    }

    #[test]
    fn match_path_drops_segment_parameters() {
        assert_eq!(match_path("/api;v=1/checkout;s=2"), "/api/checkout");
        assert_eq!(match_path("/api/checkout;jsessionid=1"), "/api/checkout");
        assert_eq!(match_path("/api/x/..;y/checkout"), "/api/checkout");
        assert_eq!(match_path("/;x/api/checkout"), "/api/checkout");
        assert!(matches!(match_path("/api/checkout"), Cow::Borrowed(_)));
    }
}
