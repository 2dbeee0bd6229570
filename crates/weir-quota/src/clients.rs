//! Who may ask for leases, and with what weight and priority: the `clients` section of a
//! quota file.
//!
//! ```yaml
//! clients:                          # first entry that matches the caller wins
//!   - id: "checkout-*"              # client ids (at most one `*`; "*" is anyone)
//!     token_sha256: 9f86d081884c…   # optional: the caller must send `Authorization: Bearer T`
//!                                   # where T's SHA-256 (hex) is this
//!     weight: 3                     # default 1
//!     priority: CRITICAL_PLUS       # default CRITICAL
//!   - id: "batch-*"
//!     priority: SHEDDABLE
//!     own_values: true              # the client's own weight and priority are used
//! ```
//!
//! Without a `clients` section anyone may ask, with weight 1 and priority CRITICAL: the
//! weight and priority a client sends are used only where an entry says `own_values: true`
//! (a client could otherwise take the whole capacity by declaring itself heavier). With the
//! section, a caller is served by the first entry whose `id` matches its client id and whose
//! token (if the entry names one) it presents; a caller no entry covers is refused. Tokens
//! are stored as SHA-256 digests, so the quota file holds no secret.

use sha2::{Digest, Sha256};
use weir_core::Criticality;

use crate::lease::Ask;

/// One entry of the `clients` section.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientRule {
    /// Client ids it covers: exact, or with one `*`.
    pub id: String,
    /// The SHA-256 of the bearer token a caller must present (`None`: no token needed).
    pub token_sha256: Option<[u8; 32]>,
    /// The weight of these clients within their band.
    pub weight: f64,
    /// Their band.
    pub priority: Criticality,
    /// Whether a client's own weight and priority (from its ask) are used instead.
    pub own_values: bool,
}

impl ClientRule {
    /// Anyone, weight 1, CRITICAL, its own values ignored: the policy without a `clients`
    /// section.
    pub fn anyone() -> Self {
        Self {
            id: "*".into(),
            token_sha256: None,
            weight: 1.0,
            priority: Criticality::Critical,
            own_values: false,
        }
    }

    /// Whether `client` is one of the ids this entry covers.
    pub fn covers(&self, client: &str) -> bool {
        crate::pattern::matches(&self.id, client)
    }

    /// `ask` with the weight and priority this entry gives (the ask's own where
    /// `own_values` allows them).
    pub fn apply(&self, ask: &mut Ask) {
        if !self.own_values {
            ask.weight = self.weight;
            ask.priority = self.priority;
        }
    }

    /// Whether `bearer` (the token the caller sent, if any) satisfies this entry.
    fn accepts(&self, bearer: Option<&str>) -> bool {
        match (&self.token_sha256, bearer) {
            (None, _) => true,
            (Some(want), Some(token)) => {
                let got: [u8; 32] = Sha256::digest(token.as_bytes()).into();
                // Digests are compared in full whatever differs first.
                got.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
            }
            (Some(_), None) => false,
        }
    }
}

/// Why a caller is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Denied {
    /// Entries cover the client id, but each needs a token the caller did not present.
    #[error("client {0:?} needs a bearer token the quota file accepts")]
    Unauthenticated(String),
    /// No entry of the `clients` section covers the client id.
    #[error("client {0:?} is not allowed by the quota file's clients section")]
    NotAllowed(String),
}

/// The rule serving `client` presenting `bearer`, from `rules` (an empty list: anyone, see
/// [`ClientRule::anyone`]).
pub fn admit<'a>(
    rules: &'a [ClientRule],
    client: &str,
    bearer: Option<&str>,
) -> Result<std::borrow::Cow<'a, ClientRule>, Denied> {
    if rules.is_empty() {
        return Ok(std::borrow::Cow::Owned(ClientRule::anyone()));
    }
    let mut covered = false;
    for r in rules {
        if r.covers(client) {
            covered = true;
            if r.accepts(bearer) {
                return Ok(std::borrow::Cow::Borrowed(r));
            }
        }
    }
    Err(if covered {
        Denied::Unauthenticated(client.to_string())
    } else {
        Denied::NotAllowed(client.to_string())
    })
}

/// Parses a SHA-256 digest written as 64 hex digits.
pub fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(token: &str) -> [u8; 32] {
        Sha256::digest(token.as_bytes()).into()
    }

    #[test]
    fn first_entry_covering_the_id_with_its_token_wins() {
        let rules = vec![
            ClientRule {
                id: "checkout-*".into(),
                token_sha256: Some(digest("s3cret")),
                weight: 3.0,
                priority: Criticality::CriticalPlus,
                own_values: false,
            },
            ClientRule {
                id: "checkout-*".into(),
                token_sha256: Some(digest("next")),
                ..ClientRule::anyone()
            },
            ClientRule {
                id: "batch".into(),
                own_values: true,
                ..ClientRule::anyone()
            },
        ];
        let r = admit(&rules, "checkout-1", Some("s3cret")).unwrap();
        assert_eq!((r.weight, r.priority), (3.0, Criticality::CriticalPlus));
        // A rotated token is another entry for the same ids.
        assert_eq!(
            admit(&rules, "checkout-1", Some("next")).unwrap().weight,
            1.0
        );
        assert_eq!(
            admit(&rules, "checkout-1", Some("guess")),
            Err(Denied::Unauthenticated("checkout-1".into()))
        );
        assert_eq!(
            admit(&rules, "checkout-1", None),
            Err(Denied::Unauthenticated("checkout-1".into()))
        );
        assert!(admit(&rules, "batch", None).unwrap().own_values);
        assert_eq!(
            admit(&rules, "batch-2", None),
            Err(Denied::NotAllowed("batch-2".into()))
        );
        // No section: anyone, weight 1, CRITICAL, own values ignored.
        let anyone = admit(&[], "x", None).unwrap();
        assert_eq!(*anyone, ClientRule::anyone());
    }

    #[test]
    fn digests_parse_from_hex() {
        let d = digest("s3cret");
        let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(parse_digest(&hex), Some(d));
        assert_eq!(parse_digest(&hex.to_uppercase()), Some(d));
        assert_eq!(parse_digest("abc"), None);
        assert_eq!(parse_digest(&"zz".repeat(32)), None);
    }
}
