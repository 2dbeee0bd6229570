//! Failover of `weir serve --quota` through Redis: several servers with the same quota file
//! and `--store redis://…` elect one leader (weir-redis [`Election`]); only the leader
//! allocates, the others answer lease calls with `421 Misdirected Request` naming it (`503`
//! while no leader is known), and a client follows. Every [`HaConfig::renew`] each server
//! campaigns; the leader's campaign also stores its allocation snapshot, which the next
//! leader resumes from without a learning period. The rules of the roles — and why two
//! leaders cannot both hand out the capacity — are weir-quota's [`weir_quota::ha`].
//!
//! A stopping leader resigns (final snapshot, key deleted), so another server takes over at
//! its next campaign instead of after the key's time to live.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::IntoResponse;
use parking_lot::Mutex;
use serde_json::{json, Value};
use weir_core::{Clock, MonotonicClock, Nanos};
use weir_quota::ha::{Action, HaConfig, Leadership, Role, Snapshot};
use weir_quota::server::LeaseServer;
use weir_redis::leader::Election;

/// Where the leader is, as it advertised itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Leader {
    /// `http://HOST:PORT` of its HTTP API.
    pub http: String,
    /// `HOST:PORT` of its gRPC port, if it advertised one.
    pub grpc: Option<String>,
}

impl Leader {
    /// Reads what [`Ha::new`] advertised: `HTTP[ grpc=HOST:PORT]`.
    fn parse(advertised: &str) -> Self {
        let mut parts = advertised.split(' ');
        let http = parts.next().unwrap_or_default().to_string();
        let grpc = parts
            .find_map(|p| p.strip_prefix("grpc="))
            .map(str::to_string);
        Self { http, grpc }
    }
}

/// One server's part in the failover.
pub struct Ha {
    election: Election,
    leadership: Mutex<Leadership>,
    /// The role last logged ("leader", "holding", "follower").
    logged: Mutex<&'static str>,
    elections: AtomicU64,
    errors: AtomicU64,
    /// Set on resignation: no more campaigns.
    stopped: AtomicBool,
}

/// Why a server cannot join a failover group.
#[derive(Debug, thiserror::Error)]
pub enum HaError {
    /// The HTTP address to advertise is not `http://HOST:PORT`.
    #[error("--quota-advertise {0:?}: expected http://HOST:PORT")]
    Http(String),
    /// The gRPC address to advertise is not `HOST:PORT`.
    #[error("gRPC address {0:?}: expected HOST:PORT")]
    Grpc(String),
    /// The Redis address or the group's name.
    #[error(transparent)]
    Redis(#[from] weir_redis::StoreError),
}

impl Ha {
    /// Campaigns in `group` on the Redis at `url`, advertised to clients as `http`
    /// (`http://HOST:PORT` of this server's HTTP API) and `grpc` (`HOST:PORT` of its gRPC
    /// port); the leader key lives `ttl` and is renewed every `ttl / 5`.
    pub fn new(
        url: &str,
        group: &str,
        http: &str,
        grpc: Option<&str>,
        ttl: Duration,
    ) -> Result<Self, HaError> {
        let plain = |s: &str| !s.is_empty() && !s.contains([' ', '|']);
        if !http.starts_with("http://") || !plain(http) {
            return Err(HaError::Http(http.to_string()));
        }
        let advertise = match grpc {
            Some(g) if plain(g) => format!("{http} grpc={g}"),
            Some(g) => return Err(HaError::Grpc(g.to_string())),
            None => http.to_string(),
        };
        let renew = ttl / 5;
        let election = Election::new(url, group, &advertise, renew.max(Duration::from_millis(50)))?;
        Ok(Self {
            election,
            leadership: Mutex::new(Leadership::new(HaConfig { ttl, renew })),
            logged: Mutex::new(""),
            elections: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        })
    }

    /// The role at `now`, for the allocation table.
    pub fn status(&self, now: Nanos) -> Value {
        let l = self.leadership.lock();
        let me = Leader::parse(self.election.advertise());
        let (role, leader) = match l.role(now) {
            Role::Leader => ("leader", Some(me.clone())),
            Role::Holding { .. } => ("holding", Some(me.clone())),
            Role::Follower { leader } => ("follower", leader.as_deref().map(Leader::parse)),
        };
        json!({
            "role": role,
            "leader": leader.as_ref().map(|l| &l.http),
            "leaderGrpc": leader.as_ref().and_then(|l| l.grpc.as_ref()),
            "token": l.token(),
            "advertise": me.http,
            "elections": self.elections.load(Ordering::Relaxed),
            "storeErrors": self.errors.load(Ordering::Relaxed),
        })
    }

    /// Writes the failover families: the role and the counts of this server.
    pub fn encode(&self, now: Nanos, enc: &mut crate::admin::metrics::Encoder) -> std::fmt::Result {
        use crate::admin::metrics::{counter, gauges};
        let role = self.leadership.lock().role(now);
        let on = |r: &str| {
            matches!(
                (&role, r),
                (Role::Leader, "leader")
                    | (Role::Holding { .. }, "holding")
                    | (Role::Follower { .. }, "follower")
            )
        };
        gauges(
            enc,
            "weir_quota_role",
            "1 for this server's failover role.",
            ["leader", "holding", "follower"].map(|r| ([("role", r)], f64::from(u8::from(on(r))))),
        )?;
        counter(
            enc,
            "weir_quota_elections",
            "Times this server was elected leader.",
            self.elections.load(Ordering::Relaxed),
        )?;
        counter(
            enc,
            "weir_quota_store_errors",
            "Campaigns that could not reach Redis.",
            self.errors.load(Ordering::Relaxed),
        )
    }
}

/// `None` when this server may allocate now; otherwise where the leader is (`Some(None)`:
/// no leader known yet).
pub fn elsewhere(ha: Option<&Ha>, now: Nanos) -> Option<Option<Leader>> {
    let ha = ha?;
    let role = ha.leadership.lock().role(now);
    match role {
        Role::Leader | Role::Holding { .. } => None,
        Role::Follower { leader } => Some(leader.as_deref().map(Leader::parse)),
    }
}

/// The failover term this server may lease from a parent in now (0: no failover group), or
/// `None` while it follows.
pub fn term(ha: Option<&Ha>, now: Nanos) -> Option<u64> {
    let Some(ha) = ha else {
        return Some(0);
    };
    let l = ha.leadership.lock();
    match l.role(now) {
        Role::Leader | Role::Holding { .. } => l.token(),
        Role::Follower { .. } => None,
    }
}

/// The HTTP answer of a server that must not allocate now (`421` naming the leader, `503`
/// when none is known), or `None` when it may.
pub fn not_leader(ha: Option<&Ha>, now: Nanos) -> Option<axum::response::Response> {
    Some(match elsewhere(ha, now)? {
        Some(l) => (
            StatusCode::MISDIRECTED_REQUEST,
            axum::Json(json!({
                "error": "this server is not the quota leader",
                "leader": l.http,
                "leaderGrpc": l.grpc,
            })),
        )
            .into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"error": "no quota leader is known yet; retry", "leader": null})),
        )
            .into_response(),
    })
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Starts campaigning for `server` (read on `clock`), until it is dropped or `ha` resigns.
pub fn start(server: &Arc<LeaseServer>, clock: MonotonicClock, ha: &Arc<Ha>) {
    let me = Arc::downgrade(server);
    let ha = ha.clone();
    tokio::spawn(async move {
        loop {
            let Some(server) = me.upgrade() else { return };
            if ha.stopped.load(Ordering::Relaxed) {
                return;
            }
            let renew = ha.leadership.lock().config().renew;
            campaign(&server, &clock, &ha).await;
            drop(server);
            tokio::time::sleep(renew).await;
        }
    });
}

/// The age past which a snapshot holds no live lease: the longest lease plus the key's time
/// to live (its writer could give leases until its proof ended).
fn lapsed_after(server: &LeaseServer, config: &HaConfig) -> Duration {
    server.max_lease() + config.ttl
}

/// How long Redis keeps a snapshot: long after its leases lapsed, because an old snapshot
/// still proves something — that every lease has lapsed, so a leader elected after a long
/// outage starts empty at once instead of learning for a lease length.
fn snapshot_ttl(server: &LeaseServer, config: &HaConfig) -> Duration {
    (2 * lapsed_after(server, config)).max(Duration::from_secs(3600))
}

async fn campaign(server: &LeaseServer, clock: &MonotonicClock, ha: &Ha) {
    let sent_at = clock.now();
    let (token, config) = {
        let l = ha.leadership.lock();
        (l.token(), *l.config())
    };
    let snapshot = token.map(|t| Snapshot::new(t, unix_ms(), server.snapshot(sent_at)).encode());
    let keep = snapshot_ttl(server, &config);
    let lapsed = lapsed_after(server, &config);
    let answer = ha
        .election
        .campaign(token, config.ttl, snapshot.as_deref(), keep)
        .await
        .map_err(|e| e.to_string());
    if let Err(e) = &answer {
        if ha.errors.fetch_add(1, Ordering::Relaxed) == 0 || *ha.logged.lock() != "holding" {
            tracing::warn!(error = %e, "quota failover: Redis unreachable");
        }
    }
    let action = ha.leadership.lock().on_answer(sent_at, answer);
    let now = clock.now();
    match action {
        Action::Keep => {}
        Action::Restore(s) => {
            ha.elections.fetch_add(1, Ordering::Relaxed);
            let age = s.age(unix_ms());
            let (token, holders) = (
                s.token,
                s.tables.iter().map(|t| t.holders.len()).sum::<usize>(),
            );
            if age > lapsed {
                tracing::info!(age = ?age, "quota failover: elected; the last snapshot is older than any lease, starting empty");
                server.restore(Vec::new(), now);
            } else {
                match s.into_tables(unix_ms()) {
                    Ok(tables) => {
                        tracing::info!(from_token = token, leases = holders, age = ?age, "quota failover: elected; resuming from the last leader's snapshot");
                        server.restore(tables, now);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "quota failover: elected; unusable snapshot, learning for one lease length");
                        server.restart(now);
                    }
                }
            }
        }
        Action::Learn => {
            ha.elections.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                "quota failover: elected without a snapshot; learning for one lease length"
            );
            server.restart(now);
        }
        Action::Forget => server.restart(now),
    }
    let role = ha.leadership.lock().role(now);
    let label = match &role {
        Role::Leader => {
            server.hold(None);
            "leader"
        }
        Role::Holding { since } => {
            server.hold(Some(*since));
            "holding"
        }
        Role::Follower { .. } => {
            server.hold(None);
            "follower"
        }
    };
    let mut logged = ha.logged.lock();
    if *logged != label {
        match &role {
            Role::Leader => tracing::info!("quota failover: this server leads"),
            Role::Holding { .. } => tracing::warn!(
                "quota failover: leadership cannot be proven (Redis unreachable); serving from memory, no grant grows"
            ),
            Role::Follower { leader } => tracing::info!(
                leader = leader.as_deref().unwrap_or("unknown"),
                "quota failover: following"
            ),
        }
        *logged = label;
    }
}

/// A stopping leader steps down: its last snapshot is stored and the key deleted, so another
/// server takes over at its next campaign. Bounded by the store's timeout.
pub async fn resign(server: &LeaseServer, clock: &MonotonicClock, ha: &Ha) {
    ha.stopped.store(true, Ordering::Relaxed);
    let now = clock.now();
    let (token, config) = {
        let mut l = ha.leadership.lock();
        let t = (l.token(), *l.config());
        // From here on, calls are answered 503: clients go to the next leader.
        l.step_down();
        t
    };
    let Some(token) = token else { return };
    let snapshot = Snapshot::new(token, unix_ms(), server.snapshot(now)).encode();
    match ha
        .election
        .resign(Some(&snapshot), snapshot_ttl(server, &config))
        .await
    {
        Ok(true) => tracing::info!("quota failover: resigned the leadership"),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(error = %e, "quota failover: could not resign; another server takes over when the key expires")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_addresses_round_trip() {
        assert_eq!(
            Leader::parse("http://a:1 grpc=a:2"),
            Leader {
                http: "http://a:1".into(),
                grpc: Some("a:2".into())
            }
        );
        assert_eq!(Leader::parse("http://a:1").grpc, None);
        let url = "redis://127.0.0.1:1";
        let ttl = Duration::from_secs(1);
        assert!(Ha::new(url, "g", "a:1", None, ttl).is_err());
        assert!(Ha::new(url, "g", "http://a:1", Some("a b"), ttl).is_err());
        assert!(Ha::new(url, "g", "http://a:1", Some("a:2"), ttl).is_ok());
    }
}
