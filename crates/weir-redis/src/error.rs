//! Errors talking to Redis.

use std::time::Duration;

/// Errors talking to Redis.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A store URL that cannot be parsed.
    #[error("bad store URL {0}")]
    Url(String),
    /// Redis answered with an error or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// No answer within the call timeout.
    #[error("redis: no answer within {0:?}")]
    Timeout(Duration),
    /// Not connected (a cluster whose seeds were unreachable so far).
    #[error("redis: not connected")]
    NotConnected,
    /// A script answered something that is not a decision (a bug, or a foreign key type).
    #[error("redis: unexpected script answer {0}")]
    Answer(String),
}
