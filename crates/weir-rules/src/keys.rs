//! Keys taken from requests (parameter values, origins, header values, descriptor values) are
//! stored in bounded tables — in memory or in Redis; one longer than [`MAX_KEY_LEN`] bytes is
//! stored as a fixed-size digest instead, so a table of N keys holds at most N × 64 bytes of key
//! text whatever callers send (a 16 KiB header value would otherwise be kept as is).
//!
//! The digest is SHA-256 (first 128 bits): the same on every instance (weir serve processes
//! sharing counters in Redis must agree on keys), and no one can craft two values that share a
//! counter to spend someone else's quota.

use std::borrow::Cow;

use sha2::{Digest, Sha256};

/// Longest key stored as is.
pub const MAX_KEY_LEN: usize = 64;

/// Shortens long keys (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyShortener;

impl KeyShortener {
    /// The shortener.
    pub fn new() -> Self {
        Self
    }

    /// `value` itself, or `~LEN:HEX` (128 bits of its SHA-256) when it is longer than
    /// [`MAX_KEY_LEN`] bytes.
    #[inline]
    pub fn bounded<'a>(&self, value: &'a str) -> Cow<'a, str> {
        if value.len() <= MAX_KEY_LEN {
            Cow::Borrowed(value)
        } else {
            Cow::Owned(digest(value))
        }
    }
}

#[cold]
fn digest(value: &str) -> String {
    use std::fmt::Write;
    let hash = Sha256::digest(value.as_bytes());
    let mut out = format!("~{}:", value.len());
    for b in &hash[..16] {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_pass_long_ones_are_digested_the_same_everywhere() {
        let k = KeyShortener::new();
        assert!(matches!(k.bounded("user-1"), Cow::Borrowed("user-1")));
        let long = "x".repeat(10_000);
        let d = k.bounded(&long);
        assert!(d.len() <= MAX_KEY_LEN && d.starts_with("~10000:"), "{d}");
        assert_eq!(d, KeyShortener.bounded(&long), "stable across instances");
        assert_ne!(d, k.bounded(&"y".repeat(10_000)));
        // SHA-256("a" × 65), first 16 bytes.
        assert_eq!(
            k.bounded(&"a".repeat(65)),
            "~65:".to_string()
                + &{
                    let h = Sha256::digest("a".repeat(65).as_bytes());
                    h[..16]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                }
        );
    }
}
