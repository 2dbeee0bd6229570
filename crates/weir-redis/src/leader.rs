//! Leader election for a group of servers on Redis: a key with a time to live and a fencing
//! token, plus the leader's snapshot, all changed by one atomic script per call.
//!
//! Keys (one hash slot, so they work on Redis Cluster): `weir:{quota:GROUP}:leader` holds
//! `TOKEN|IDENTITY` with a time to live; `…:epoch` counts elections (each new leader's token
//! is the next value, so tokens only grow); `…:snapshot` holds the leader's last snapshot.
//!
//! [`Election::campaign`] renews the key when this server holds it with the token it
//! believes it holds — and only then stores its snapshot (a deposed leader's writes are
//! refused: that is the fencing) — takes it when it is free, or names the holder. A
//! server's identity is its advertised address with a random prefix, so a restarted process
//! never mistakes the previous one's key for its own.

use std::time::Duration;

use parking_lot::Mutex;

use crate::error::StoreError;
use crate::scripts;
use crate::store::{Backend, Target};

/// Largest snapshot stored (a larger one is not written; the next leader learns instead).
pub const MAX_SNAPSHOT: usize = 16 << 20;

pub use weir_core::election::Term;

/// One server's side of an election (see the module documentation).
pub struct Election {
    target: Target,
    backend: tokio::sync::Mutex<Option<Backend>>,
    keys: [String; 3],
    identity: String,
    advertise: String,
    timeout: Duration,
    /// The token last answered to this server (for [`Election::resign`]).
    token: Mutex<Option<u64>>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("key", &self.keys[0])
            .field("advertise", &self.advertise)
            .finish()
    }
}

/// A group name: 1–64 bytes of letters, digits, `-`, `_` and `.`.
fn valid_group(group: &str) -> bool {
    (1..=64).contains(&group.len())
        && group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

impl Election {
    /// A server advertised as `advertise` (what followers tell clients) campaigning in `group`
    /// on the Redis at `url` (`redis://…` or `redis+cluster://…`); every call is bounded by
    /// `timeout`. Connects on first use (and again after a failure).
    pub fn new(
        url: &str,
        group: &str,
        advertise: &str,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        if !valid_group(group) {
            return Err(StoreError::Url(format!(
                "quota group {group:?}: 1 to 64 letters, digits, '-', '_' or '.'"
            )));
        }
        if advertise.is_empty() || advertise.contains('|') {
            return Err(StoreError::Url(format!(
                "advertised address {advertise:?}: empty or contains '|'"
            )));
        }
        let nonce = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            (std::process::id(), std::time::SystemTime::now()),
        );
        let base = format!("weir:{{quota:{group}}}");
        Ok(Self {
            target: Target::parse(url)?,
            backend: tokio::sync::Mutex::new(None),
            keys: [
                format!("{base}:leader"),
                format!("{base}:epoch"),
                format!("{base}:snapshot"),
            ],
            identity: format!("{nonce:016x} {advertise}"),
            advertise: advertise.to_string(),
            timeout,
            token: Mutex::new(None),
        })
    }

    /// What this server advertises.
    pub fn advertise(&self) -> &str {
        &self.advertise
    }

    async fn invoke(&self, inv: &redis::ScriptInvocation<'_>) -> Result<redis::Value, StoreError> {
        let mut slot = self.backend.lock().await;
        if slot.is_none() {
            let b =
                tokio::time::timeout(self.timeout, Backend::connect(&self.target, self.timeout))
                    .await
                    .map_err(|_| StoreError::Timeout(self.timeout))??;
            *slot = Some(b);
        }
        let Some(mut backend) = slot.clone() else {
            return Err(StoreError::NotConnected);
        };
        drop(slot);
        match tokio::time::timeout(self.timeout, backend.invoke(inv)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// One campaign: renews (storing `snapshot`, if given, for `snapshot_ttl`), takes the
    /// key for `ttl`, or names the leader. `token` is the token this server believes it holds.
    pub async fn campaign(
        &self,
        token: Option<u64>,
        ttl: Duration,
        snapshot: Option<&[u8]>,
        snapshot_ttl: Duration,
    ) -> Result<Term, StoreError> {
        let snapshot = snapshot.filter(|s| s.len() <= MAX_SNAPSHOT).unwrap_or(b"");
        let mut inv = scripts::LEADER.prepare_invoke();
        inv.key(&self.keys[0])
            .key(&self.keys[1])
            .key(&self.keys[2])
            .arg(&self.identity)
            .arg(ttl.as_millis().max(1) as u64)
            .arg(token.unwrap_or(0))
            .arg(snapshot)
            .arg(snapshot_ttl.as_millis().max(1) as u64);
        let value = self.invoke(&inv).await?;
        let term = parse(&value).ok_or_else(|| StoreError::Answer(format!("{value:?}")))?;
        *self.token.lock() = match &term {
            Term::Leader { token, .. } => Some(*token),
            Term::Follower { .. } => None,
        };
        Ok(term)
    }

    /// Steps down if this server still leads: stores `snapshot` and deletes the key, so
    /// another server is elected at its next campaign instead of after the time to live.
    /// Answers whether it led.
    pub async fn resign(
        &self,
        snapshot: Option<&[u8]>,
        snapshot_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let Some(token) = self.token.lock().take() else {
            return Ok(false);
        };
        let snapshot = snapshot.filter(|s| s.len() <= MAX_SNAPSHOT).unwrap_or(b"");
        let mut inv = scripts::RESIGN.prepare_invoke();
        inv.key(&self.keys[0])
            .key(&self.keys[1])
            .key(&self.keys[2])
            .arg(&self.identity)
            .arg(token)
            .arg(snapshot)
            .arg(snapshot_ttl.as_millis().max(1) as u64);
        Ok(matches!(self.invoke(&inv).await?, redis::Value::Int(1)))
    }
}

fn int(v: &redis::Value) -> Option<u64> {
    match v {
        redis::Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

fn bytes(v: &redis::Value) -> Option<Vec<u8>> {
    match v {
        redis::Value::BulkString(b) => Some(b.clone()),
        redis::Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

fn parse(value: &redis::Value) -> Option<Term> {
    let redis::Value::Array(items) = value else {
        return None;
    };
    match (int(items.first()?)?, items.get(2)) {
        (1, Some(elected)) => Some(Term::Leader {
            token: int(items.get(1)?)?,
            elected: int(elected)? == 1,
            snapshot: items.get(3).and_then(bytes),
        }),
        (0, Some(holder)) => {
            let holder = String::from_utf8(bytes(holder)?).ok()?;
            // "NONCE ADDRESS": followers tell clients the address.
            let leader = holder.split_once(' ').map_or(holder.as_str(), |(_, a)| a);
            Some(Term::Follower {
                leader: leader.to_string(),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_parsed_and_groups_checked() {
        use redis::Value::{Array, BulkString, Int, Nil};
        assert_eq!(
            parse(&Array(vec![
                Int(1),
                Int(7),
                Int(1),
                BulkString(b"{}".to_vec())
            ])),
            Some(Term::Leader {
                token: 7,
                elected: true,
                snapshot: Some(b"{}".to_vec())
            })
        );
        assert_eq!(
            parse(&Array(vec![Int(1), Int(7), Int(1), Nil])),
            Some(Term::Leader {
                token: 7,
                elected: true,
                snapshot: None
            })
        );
        assert_eq!(
            parse(&Array(vec![
                Int(0),
                Int(7),
                BulkString(b"ab12 http://x:1".to_vec())
            ])),
            Some(Term::Follower {
                leader: "http://x:1".into()
            })
        );
        assert_eq!(parse(&Int(3)), None);
        assert!(Election::new(
            "redis://127.0.0.1:1",
            "a{b}",
            "http://x",
            Duration::from_secs(1)
        )
        .is_err());
        assert!(Election::new(
            "redis://127.0.0.1:1",
            "eu-1",
            "http://x|y",
            Duration::from_secs(1)
        )
        .is_err());
        assert!(Election::new(
            "redis://127.0.0.1:1",
            "eu-1",
            "http://x",
            Duration::from_secs(1)
        )
        .is_ok());
    }
}
