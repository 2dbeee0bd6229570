//! The connection: one Redis (auto-reconnecting `ConnectionManager`) or a Redis Cluster.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use crate::error::StoreError;

/// Where the limits live, parsed from a URL: `redis://HOST:PORT[/DB]` or
/// `redis+cluster://H1:P1,H2:P2,…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One Redis server (`redis://…`, also `rediss://` and `unix://` as the redis crate reads them).
    Single(String),
    /// Seed nodes of a Redis Cluster, each as `redis://HOST:PORT`.
    Cluster(Vec<String>),
}

impl Target {
    /// Parses a store URL.
    pub fn parse(url: &str) -> Result<Self, StoreError> {
        if let Some(rest) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = rest
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| format!("redis://{s}"))
                .collect();
            if nodes.is_empty() {
                return Err(StoreError::Url(format!("{url}: no cluster nodes")));
            }
            for n in &nodes {
                redis::parse_redis_url(n)
                    .ok_or_else(|| StoreError::Url(format!("{url}: bad node {n}")))?;
            }
            return Ok(Self::Cluster(nodes));
        }
        redis::Client::open(url).map_err(|e| StoreError::Url(format!("{url}: {e}")))?;
        Ok(Self::Single(url.to_string()))
    }
}

/// A cloneable handle on the connection (both kinds multiplex calls over shared sockets).
#[derive(Clone)]
pub(crate) enum Backend {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Backend {
    /// Connects. A single server connects lazily (so a process can start while Redis is down);
    /// a cluster needs one reachable seed to learn the slot map.
    pub(crate) async fn connect(target: &Target, timeout: Duration) -> Result<Self, StoreError> {
        match target {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout.max(Duration::from_millis(100))))
                    .set_response_timeout(None)
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(100));
                Ok(Self::Single(ConnectionManager::new_lazy_with_config(
                    client, config,
                )?))
            }
            Target::Cluster(nodes) => {
                let client = ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeout.max(Duration::from_millis(100)))
                    .response_timeout(timeout.max(Duration::from_millis(100)))
                    .retries(1)
                    .build()?;
                Ok(Self::Cluster(client.get_async_connection().await?))
            }
        }
    }

    pub(crate) async fn invoke(
        &mut self,
        inv: &redis::ScriptInvocation<'_>,
    ) -> redis::RedisResult<redis::Value> {
        match self {
            Self::Single(c) => inv.invoke_async(c).await,
            Self::Cluster(c) => inv.invoke_async(c).await,
        }
    }

    pub(crate) async fn ping(&mut self) -> redis::RedisResult<()> {
        let mut cmd = redis::cmd("PING");
        let cmd = &mut cmd;
        match self {
            Self::Single(c) => cmd.query_async::<()>(c).await,
            Self::Cluster(c) => cmd.query_async::<()>(c).await,
        }
    }
}
