//! Envoy's Rate Limit Quota Service (RLQS) on the lease server, without I/O: each Envoy
//! (one stream) reports, per bucket, the requests it allowed and denied; each (stream,
//! bucket) is a client of the allocator ([`LeaseServer`]); its share goes back to Envoy as a
//! token bucket that Envoy enforces locally. Envoy never waits for the server on the request
//! path.
//!
//! What Envoy (1.40) does, and what the encoding below respects:
//!
//! - It enforces `blanket_rule` (ALLOW_ALL / DENY_ALL) and `token_bucket` (continuous refill at
//!   `tokens_per_fill ÷ fill_interval`); `requests_per_time_unit` is ignored, never sent.
//! - Only whole seconds count: fill intervals and assignment TTLs are whole seconds ≥ 1 and
//!   `tokens_per_fill` is always set. An identical assignment re-sent extends its TTL and keeps
//!   the bucket's tokens; Envoy's equality ignores the seconds of `fill_interval`, so a new
//!   assignment never differs from the last in those alone.
//! - It reports every bucket every 5 s, with `time_elapsed` in whole seconds (0 on a new
//!   bucket's first report): demand is measured on the server's clock.
//! - It never drops a bucket unless abandoned: idle buckets are abandoned
//!   ([`RlqsConfig::idle`]), and buckets beyond the bounds are abandoned at once (counted).
//!
//! Demand per bucket: allowed + denied over the time since its last report (denied requests
//! count, so a limited bucket's demand shows); it *needs* that rate and *wants* it × 1.2 + 1
//! unit/s — the headroom is granted only from capacity no bucket needs ([`Ask::needs`]), so
//! a light Envoy's headroom never starves a heavy one. A bucket's first report asks for the
//! whole capacity (the grant is capped by what others hold, so that is safe) until its rate is
//! known. Every second
//! ([`Session::tick`]) each bucket is refreshed again and a changed assignment pushed, so a
//! share moves within a second or two of a demand change, not at the next 5 s report.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::{rate_limit_strategy, RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    rate_limit_quota_response::{bucket_action, BucketAction},
    BucketId, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use weir_core::{Criticality, Nanos};

use crate::lease::{Ask, Lease};
use crate::server::{LeaseServer, Refusal};

pub use crate::config::{BucketRule, BucketTarget, RlqsConfig, ValuePattern};

/// Longest bucket id accepted (keys and values together), bytes.
pub const MAX_BUCKET_ID: usize = 1024;

/// A bucket's resolved target.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Resource(String),
    Unlimited,
    /// No rule matches: no assignment (Envoy's `no_assignment_behavior` applies).
    Unmatched,
}

impl RlqsConfig {
    fn target(&self, id: &BucketId) -> Target {
        for rule in &self.buckets {
            let matched = rule
                .matches
                .iter()
                .all(|(k, p)| match (id.bucket.get(k), p) {
                    (Some(_), ValuePattern::Any) => true,
                    (Some(v), ValuePattern::Exact(x)) => v == x,
                    (None, _) => false,
                });
            if !matched {
                continue;
            }
            return match &rule.target {
                BucketTarget::Unlimited => Target::Unlimited,
                BucketTarget::Resource(name) => {
                    let mut out = name.clone();
                    for (k, p) in &rule.matches {
                        if *p == ValuePattern::Any {
                            if let Some(v) = id.bucket.get(k) {
                                // A long value (up to the bucket id's 1 KiB) stands as its
                                // digest, so the name stays within the lease server's bound.
                                let v = weir_rules::keys::KeyShortener.bounded(v);
                                // `/` separates the levels of nested resources: a value never
                                // adds one (`%` escaped first, so distinct values stay
                                // distinct).
                                let v = if v.contains(['/', '%']) {
                                    v.replace('%', "%25").replace('/', "%2F")
                                } else {
                                    v.into_owned()
                                };
                                out = out.replace(&format!("{{{k}}}"), &v);
                            }
                        }
                    }
                    Target::Resource(out)
                }
            };
        }
        Target::Unmatched
    }
}

/// An assignment as Envoy enforces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// ALLOW_ALL.
    AllowAll,
    /// DENY_ALL.
    DenyAll,
    /// A token bucket: `tokens_per_fill` every `fill_secs` seconds (continuously), holding at
    /// most `max_tokens`.
    TokenBucket {
        /// Tokens added per fill interval.
        tokens_per_fill: u32,
        /// The fill interval, whole seconds.
        fill_secs: u64,
        /// The bucket's size.
        max_tokens: u32,
    },
}

/// Fill intervals tried, shortest first: the first that expresses the share within 1 % (rounded
/// down, so never above it) is used.
const FILL_SECS: [u64; 6] = [1, 2, 5, 10, 20, 60];

impl Assignment {
    /// The token bucket for `share` units/s holding `burst` of it, given the assignment sent
    /// last (`prev`): DENY_ALL below one token a minute. Rounded down, never above the share.
    pub fn for_share(share: f64, burst: Duration, prev: Option<Assignment>) -> Self {
        if !share.is_finite() {
            return if share > 0.0 {
                Self::AllowAll
            } else {
                Self::DenyAll
            };
        }
        // The previous token bucket is kept while it is within 2 % under the share: shares
        // wobble by a fraction of a unit between reports and ticks, and each new assignment
        // replaces Envoy's bucket (a fresh one, full) — keeping it is both steadier and safer.
        if let Some(p @ Self::TokenBucket { .. }) = prev {
            if p.rate() <= share && p.rate() >= 0.98 * share {
                return p;
            }
        }
        let share = share.min(f64::from(u32::MAX) / 60.0);
        let tokens = |secs: u64| (share * secs as f64 + 1e-9).floor();
        let secs = FILL_SECS
            .into_iter()
            .find(|&s| {
                let t = tokens(s);
                t >= 1.0 && t >= 0.99 * share * s as f64
            })
            .unwrap_or(60);
        let mut t = tokens(secs) as u32;
        let mut secs = secs;
        if t == 0 {
            return Self::DenyAll;
        }
        // Envoy compares assignments without the seconds of the fill interval: a change of
        // the interval alone would be ignored. Keep the previous interval instead.
        if let Some(Self::TokenBucket {
            tokens_per_fill,
            fill_secs,
            ..
        }) = prev
        {
            if tokens_per_fill == t && fill_secs != secs {
                secs = fill_secs;
                t = tokens(secs) as u32;
                if t == 0 {
                    return Self::DenyAll;
                }
            }
        }
        let max_tokens = (share * burst.as_secs_f64())
            .ceil()
            .clamp(1.0, f64::from(u32::MAX)) as u32;
        Self::TokenBucket {
            tokens_per_fill: t,
            fill_secs: secs,
            max_tokens,
        }
    }

    /// The rate Envoy enforces (units/s).
    pub fn rate(&self) -> f64 {
        match self {
            Self::AllowAll => f64::INFINITY,
            Self::DenyAll => 0.0,
            Self::TokenBucket {
                tokens_per_fill,
                fill_secs,
                ..
            } => f64::from(*tokens_per_fill) / *fill_secs as f64,
        }
    }

    fn strategy(&self) -> RateLimitStrategy {
        use rate_limit_strategy::{BlanketRule, Strategy};
        let strategy = match *self {
            Self::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
            Self::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
            Self::TokenBucket {
                tokens_per_fill,
                fill_secs,
                max_tokens,
            } => Strategy::TokenBucket(TokenBucket {
                max_tokens,
                tokens_per_fill: Some(UInt32Value {
                    value: tokens_per_fill,
                }),
                fill_interval: Some(PbDuration {
                    seconds: i64::try_from(fill_secs).unwrap_or(60),
                    nanos: 0,
                }),
            }),
        };
        RateLimitStrategy {
            strategy: Some(strategy),
        }
    }
}

/// Counts shared by every stream (for `/metrics`), and the total bucket bound.
#[derive(Debug, Default)]
pub struct RlqsTotals {
    /// Buckets tracked now.
    pub buckets: AtomicUsize,
    /// Streams open now.
    pub streams: AtomicUsize,
    /// Usage reports received (one per bucket per report).
    pub reports: AtomicU64,
    /// Assignments sent.
    pub assignments: AtomicU64,
    /// Buckets abandoned because idle.
    pub abandoned_idle: AtomicU64,
    /// Buckets refused (abandoned at once) because a bound was reached or the id too long.
    pub refused: AtomicU64,
    /// Buckets no rule matches (no assignment sent).
    pub unmatched: AtomicU64,
}

/// Why a stream is ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The stream's domain is not the one served.
    #[error("domain {got:?} is not served (this server serves {want:?})")]
    Domain {
        /// What the stream said.
        got: String,
        /// What the configuration serves.
        want: String,
    },
}

struct Bucket {
    id: BucketId,
    target: Target,
    client: String,
    /// When its last report arrived (server clock); `None` before the first.
    last_report: Option<Nanos>,
    /// When it last had a request.
    last_active: Nanos,
    wants: f64,
    /// Its measured demand (units/s): what it needs of `wants`.
    needs: f64,
    /// Allowed units/s as last measured (what it uses of its assignment).
    used: f64,
    granted: f64,
    /// The id of its lease (proof for the next refresh and the release).
    lease_id: u64,
    sent: Option<Assignment>,
    /// When an assignment was last sent, and its TTL then.
    sent_at: Nanos,
    ttl: Nanos,
}

/// One Envoy's stream (see the module documentation).
pub struct Session {
    prefix: String,
    domain: Option<String>,
    buckets: HashMap<String, Bucket>,
    /// The configuration the buckets' targets were resolved with: a reload (a new `Arc`)
    /// resolves them again, once, instead of at every report.
    resolved: Option<Arc<RlqsConfig>>,
}

/// `bucket`'s map as one string, keys sorted, each key and value length-prefixed.
fn canonical(id: &BucketId) -> String {
    let mut pairs: Vec<(&String, &String)> = id.bucket.iter().collect();
    pairs.sort();
    let mut out = String::new();
    for (k, v) in pairs {
        out.push_str(&format!("{}:{k}{}:{v}", k.len(), v.len()));
    }
    out
}

fn nanos(d: Duration) -> Nanos {
    Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX)
}

impl Session {
    /// A stream known to the allocator as `client` (its `weir-client-id` metadata, stable
    /// across reconnections and failovers, or a per-stream id).
    pub fn new(client: &str) -> Self {
        Self {
            prefix: client.to_string(),
            domain: None,
            buckets: HashMap::new(),
            resolved: None,
        }
    }

    /// Buckets tracked.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// No bucket tracked.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// A usage report at `now`: the assignments to send (one per reported bucket that has a
    /// target; an abandon for each refused bucket).
    pub fn on_report(
        &mut self,
        reports: RateLimitQuotaUsageReports,
        now: Nanos,
        server: &LeaseServer,
        config: &Arc<RlqsConfig>,
        totals: &RlqsTotals,
    ) -> Result<Vec<BucketAction>, StreamError> {
        self.resolve(config, server);
        if self.domain.is_none() {
            if let Some(want) = &config.domain {
                if *want != reports.domain {
                    return Err(StreamError::Domain {
                        got: reports.domain,
                        want: want.clone(),
                    });
                }
            }
            self.domain = Some(reports.domain);
        }
        let mut actions = Vec::new();
        for usage in reports.bucket_quota_usages {
            totals.reports.fetch_add(1, Ordering::Relaxed);
            let Some(id) = usage.bucket_id else { continue };
            let key = canonical(&id);
            if !self.buckets.contains_key(&key) {
                let full = self.buckets.len() >= config.max_buckets_per_stream
                    || totals.buckets.load(Ordering::Relaxed) >= config.max_buckets;
                if full || key.len() > MAX_BUCKET_ID {
                    totals.refused.fetch_add(1, Ordering::Relaxed);
                    actions.push(abandon(id));
                    continue;
                }
                totals.buckets.fetch_add(1, Ordering::Relaxed);
                let target = config.target(&id);
                if target == Target::Unmatched {
                    totals.unmatched.fetch_add(1, Ordering::Relaxed);
                }
                self.buckets.insert(
                    key.clone(),
                    Bucket {
                        client: format!("{}/{key}", self.prefix),
                        id,
                        target,
                        last_report: None,
                        last_active: now,
                        wants: 0.0,
                        needs: 0.0,
                        used: 0.0,
                        granted: 0.0,
                        lease_id: 0,
                        sent: None,
                        sent_at: 0,
                        ttl: 0,
                    },
                );
            }
            let Some(b) = self.buckets.get_mut(&key) else {
                continue;
            };
            let count = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            if count > 0 {
                b.last_active = now;
            }
            let elapsed = match b.last_report {
                Some(at) => Some(now.saturating_sub(at) as f64 / 1e9),
                None => usage
                    .time_elapsed
                    .as_ref()
                    .filter(|d| d.seconds >= 1)
                    .map(|d| d.seconds as f64),
            };
            b.last_report = Some(now);
            match elapsed {
                Some(e) if e >= 0.5 => {
                    b.needs = count as f64 / e;
                    b.wants = b.needs * 1.2 + 1.0;
                    b.used = usage.num_requests_allowed as f64 / e;
                }
                // Too soon to measure: keep the last estimate; none yet: ask for everything.
                _ if b.wants == 0.0 => b.wants = f64::INFINITY,
                _ => {}
            }
            if let Some(a) = assign(b, now, server, config) {
                totals.assignments.fetch_add(1, Ordering::Relaxed);
                actions.push(a);
            }
        }
        Ok(actions)
    }

    /// After a reload (a configuration not seen yet): every bucket's target resolved again; a
    /// bucket that moved gives its old lease back.
    fn resolve(&mut self, config: &Arc<RlqsConfig>, server: &LeaseServer) {
        if self
            .resolved
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(r, config))
        {
            return;
        }
        for b in self.buckets.values_mut() {
            let target = config.target(&b.id);
            if target != b.target {
                if let Target::Resource(r) = &b.target {
                    server.release(&b.client, &[(r.clone(), b.lease_id)]);
                }
                b.target = target;
                b.sent = None;
            }
        }
        self.resolved = Some(config.clone());
    }

    /// Every second: each bucket refreshed again (shares move with the others' demand), a
    /// changed assignment pushed, idle buckets abandoned.
    pub fn tick(
        &mut self,
        now: Nanos,
        server: &LeaseServer,
        config: &Arc<RlqsConfig>,
        totals: &RlqsTotals,
    ) -> Vec<BucketAction> {
        self.resolve(config, server);
        let mut actions = Vec::new();
        let idle = nanos(config.idle);
        self.buckets.retain(|_, b| {
            if now.saturating_sub(b.last_active) >= idle {
                if let Target::Resource(r) = &b.target {
                    server.release(&b.client, &[(r.clone(), b.lease_id)]);
                }
                totals.buckets.fetch_sub(1, Ordering::Relaxed);
                totals.abandoned_idle.fetch_add(1, Ordering::Relaxed);
                actions.push(abandon(b.id.clone()));
                return false;
            }
            let (before, sent_at, ttl) = (b.sent, b.sent_at, b.ttl);
            if let Some(a) = assign(b, now, server, config) {
                // Changed, or half its TTL gone (reports may be further apart than it).
                if b.sent != before || now.saturating_sub(sent_at) >= ttl / 2 {
                    totals.assignments.fetch_add(1, Ordering::Relaxed);
                    actions.push(a);
                } else {
                    // Not sent: Envoy's TTL still runs from the last send.
                    b.sent_at = sent_at;
                    b.ttl = ttl;
                }
            }
            true
        });
        actions
    }

    /// The stream ended: every grant goes back to the pool.
    pub fn close(self, server: &LeaseServer, totals: &RlqsTotals) {
        for b in self.buckets.into_values() {
            if let Target::Resource(r) = &b.target {
                server.release(&b.client, &[(r.clone(), b.lease_id)]);
            }
            totals.buckets.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn abandon(id: BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(bucket_action::BucketAction::AbandonAction(
            bucket_action::AbandonAction {},
        )),
    }
}

/// Refreshes `b`'s lease and answers the assignment to send, if any.
fn assign(
    b: &mut Bucket,
    now: Nanos,
    server: &LeaseServer,
    config: &RlqsConfig,
) -> Option<BucketAction> {
    let (assignment, ttl) = match &b.target {
        Target::Unmatched => return None,
        Target::Unlimited => (Assignment::AllowAll, Duration::from_secs(60)),
        Target::Resource(resource) => {
            let (wants, needs) = if b.wants.is_finite() {
                (b.wants, b.needs)
            } else {
                let c = server.capacity(resource)?;
                (c, c)
            };
            if b.lease_id == 0 {
                // A stream holds its client id alone (no two open streams share one), so a
                // reconnecting Envoy — or one moving to a new leader, which resumed the rows
                // from the snapshot — takes up the leases its id holds.
                b.lease_id = server.lease_id_of(&b.client, resource);
            }
            let ask = Ask {
                wants,
                needs: Some(needs),
                // What this server granted the bucket: a bucket new to it (a restart, a new
                // stream) asks as a newcomer, so it gets its share of what no lease holds at
                // once, and its assignment replaces whatever Envoy kept from before.
                has: b.granted,
                // Envoy's bucket without an assignment is bounded by nothing weir knows.
                safe: f64::INFINITY,
                weight: 1.0,
                priority: Criticality::Critical,
                lease_id: b.lease_id,
                holds: None,
                term: 0,
            };
            let lease = match server
                .refresh(&b.client, &[(resource.clone(), ask)], now)
                .pop()?
            {
                Ok(lease) => lease,
                // A bound reached: the bucket is denied (failing open would let any number
                // of new buckets past the capacity).
                Err(Refusal::Full { .. }) => Lease {
                    granted: 0.0,
                    expires_at: now.saturating_add(1_000_000_000),
                    refresh: Duration::from_secs(1),
                    safe_capacity: 0.0,
                    learning: false,
                    lease_id: 0,
                },
                Err(_) => return None,
            };
            b.granted = lease.granted;
            b.lease_id = lease.lease_id;
            if lease.learning && lease.granted == 0.0 {
                // Learning or holding, nothing confirmed: Envoy keeps what it has.
                return None;
            }
            let ttl = Duration::from_nanos(lease.expires_at.saturating_sub(now));
            (
                Assignment::for_share(lease.granted, config.burst, b.sent),
                ttl,
            )
        }
    };
    b.sent = Some(assignment);
    // Whole seconds, at least one (Envoy expires a shorter TTL at once), never past the lease.
    let ttl_secs = ttl.as_secs().max(1);
    b.sent_at = now;
    b.ttl = ttl_secs.saturating_mul(1_000_000_000);
    Some(BucketAction {
        bucket_id: Some(b.id.clone()),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
            bucket_action::QuotaAssignmentAction {
                assignment_time_to_live: Some(PbDuration {
                    seconds: i64::try_from(ttl_secs).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
                rate_limit_strategy: Some(assignment.strategy()),
            },
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::QuotaConfig;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use std::path::Path;

    const S: Nanos = 1_000_000_000;

    fn tb(tokens_per_fill: u32, fill_secs: u64, max_tokens: u32) -> Assignment {
        Assignment::TokenBucket {
            tokens_per_fill,
            fill_secs,
            max_tokens,
        }
    }

    #[test]
    fn shares_become_whole_second_token_buckets_never_above_the_share() {
        let b = Duration::from_secs(1);
        assert_eq!(Assignment::for_share(100.0, b, None), tb(100, 1, 100));
        // 2.7/s: 2 per 1 s, 5 per 2 s, 13 per 5 s are more than 1 % low; 27 per 10 s is exact.
        assert_eq!(Assignment::for_share(2.7, b, None), tb(27, 10, 3));
        assert_eq!(Assignment::for_share(0.5, b, None), tb(1, 2, 1));
        assert_eq!(Assignment::for_share(0.0, b, None), Assignment::DenyAll);
        assert_eq!(Assignment::for_share(0.01, b, None), Assignment::DenyAll);
        assert_eq!(
            Assignment::for_share(f64::INFINITY, b, None),
            Assignment::AllowAll
        );
        // 27/s after 27 per 10 s: the same token count with only the interval changed would be
        // ignored by Envoy, so the interval is kept (270 per 10 s).
        assert_eq!(
            Assignment::for_share(27.0, b, Some(tb(27, 10, 3))),
            tb(270, 10, 27)
        );
        // A share that wobbles (7.99 ↔ 8.0) keeps the assignment in force while it is within
        // 2 % under the share; above the share it never stays.
        assert_eq!(Assignment::for_share(7.99, b, None), tb(159, 20, 8));
        assert_eq!(
            Assignment::for_share(8.0, b, Some(tb(159, 20, 8))),
            tb(159, 20, 8)
        );
        assert_eq!(
            Assignment::for_share(7.9, b, Some(tb(8, 1, 8))),
            tb(79, 10, 8)
        );
        assert_eq!(
            Assignment::for_share(9.0, b, Some(tb(8, 1, 8))),
            tb(9, 1, 9)
        );
        for share in [0.3, 1.0, 1.7, 3.33, 12.5, 999.9, 1e6] {
            let a = Assignment::for_share(share, b, None);
            assert!(
                a.rate() <= share && a.rate() >= share * 0.98,
                "{share}: {a:?}"
            );
        }
    }

    fn setup(yaml: &str) -> (LeaseServer, Arc<RlqsConfig>) {
        let c = QuotaConfig::from_yaml(Path::new("q.yaml"), yaml).unwrap();
        let rlqs = c.rlqs.clone().unwrap();
        let server = LeaseServer::new(c, 0);
        server.restore(Vec::new(), 0); // no learning
        (server, rlqs)
    }

    const YAML: &str = "resources:\n  - {name: 'user-*', capacity: 10}\nrlqs:\n  idle: 10s\n  buckets:\n    - {match: {name: per_user, user: '*'}, resource: 'user-{user}'}\n    - {match: {name: open}, unlimited: true}\n";

    fn id(pairs: &[(&str, &str)]) -> BucketId {
        BucketId {
            bucket: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn report(bucket: &BucketId, allowed: u64, denied: u64) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: "envoy".into(),
            bucket_quota_usages: vec![BucketQuotaUsage {
                bucket_id: Some(bucket.clone()),
                time_elapsed: None,
                num_requests_allowed: allowed,
                num_requests_denied: denied,
            }],
        }
    }

    #[test]
    fn a_long_bucket_value_names_its_resource_by_a_digest() {
        let (_, rlqs) = setup(YAML);
        let long = "u".repeat(900);
        let Target::Resource(name) = rlqs.target(&id(&[("name", "per_user"), ("user", &long)]))
        else {
            panic!("a resource");
        };
        assert!(name.starts_with("user-~900:") && name.len() < 64, "{name}");
        let Target::Resource(short) = rlqs.target(&id(&[("name", "per_user"), ("user", "ann")]))
        else {
            panic!("a resource");
        };
        assert_eq!(short, "user-ann");
    }

    fn strategy(a: &BucketAction) -> Option<Assignment> {
        use rate_limit_strategy::Strategy;
        match a.bucket_action.as_ref()? {
            bucket_action::BucketAction::QuotaAssignmentAction(q) => {
                Some(match q.rate_limit_strategy.as_ref()?.strategy.as_ref()? {
                    Strategy::BlanketRule(0) => Assignment::AllowAll,
                    Strategy::BlanketRule(_) => Assignment::DenyAll,
                    Strategy::TokenBucket(t) => tb(
                        t.tokens_per_fill.as_ref()?.value,
                        t.fill_interval.as_ref()?.seconds as u64,
                        t.max_tokens,
                    ),
                    Strategy::RequestsPerTimeUnit(_) => return None,
                })
            }
            bucket_action::BucketAction::AbandonAction(_) => None,
        }
    }

    #[test]
    fn two_envoys_share_a_users_capacity_fairly_within_a_tick() {
        let (server, config) = setup(YAML);
        let totals = RlqsTotals::default();
        let bob = id(&[("name", "per_user"), ("user", "bob")]);
        let (mut a, mut b) = (Session::new("envoy-a"), Session::new("envoy-b"));
        // a's first report: its rate is unknown, it asks for all and gets all 10/s.
        let act = a
            .on_report(report(&bob, 1, 0), 0, &server, &config, &totals)
            .unwrap();
        assert_eq!(strategy(&act[0]), Some(tb(10, 1, 10)));
        // b arrives: nothing is free yet.
        let act = b
            .on_report(report(&bob, 1, 0), S / 10, &server, &config, &totals)
            .unwrap();
        assert_eq!(strategy(&act[0]), Some(Assignment::DenyAll));
        // One tick: a shrinks to its fair 5, then b takes the 5 freed; both pushed.
        let act = a.tick(S, &server, &config, &totals);
        assert_eq!(strategy(&act[0]), Some(tb(5, 1, 5)));
        let act = b.tick(S, &server, &config, &totals);
        assert_eq!(strategy(&act[0]), Some(tb(5, 1, 5)));
        // Nothing changed: nothing pushed — until half the TTL (30 s) has gone by.
        assert!(a.tick(2 * S, &server, &config, &totals).is_empty());
        assert!(a.tick(4 * S, &server, &config, &totals).is_empty());
        // Reports 5 s apart measure demand on the server's clock: a light a needs 1/s, the
        // heavy b (65 requests, 40 of them denied, in 4.9 s) 13.3/s; capacity is short, so a's
        // headroom goes to b: 1 and 9.
        a.on_report(report(&bob, 5, 0), 5 * S, &server, &config, &totals)
            .unwrap();
        let act = b
            .on_report(report(&bob, 25, 40), 5 * S, &server, &config, &totals)
            .unwrap();
        assert_eq!(strategy(&act[0]), Some(tb(9, 1, 9)), "10 − 1 = 9/s");
        assert!(b.tick(6 * S, &server, &config, &totals).is_empty());
        // Another user has its own capacity; an unlimited bucket is never limited.
        let alice = id(&[("name", "per_user"), ("user", "alice")]);
        let act = b
            .on_report(report(&alice, 1, 0), 6 * S, &server, &config, &totals)
            .unwrap();
        assert_eq!(strategy(&act[0]), Some(tb(10, 1, 10)));
        let open = id(&[("name", "open")]);
        let act = b
            .on_report(report(&open, 1, 0), 6 * S, &server, &config, &totals)
            .unwrap();
        assert_eq!(strategy(&act[0]), Some(Assignment::AllowAll));
        // A bucket no rule matches gets no assignment.
        let other = id(&[("name", "other")]);
        assert!(b
            .on_report(report(&other, 1, 0), 6 * S, &server, &config, &totals)
            .unwrap()
            .is_empty());
        assert_eq!(totals.buckets.load(Ordering::Relaxed), 5);
        // The stream closes: its grants go back (its users' tables with it).
        b.close(&server, &totals);
        assert_eq!(totals.buckets.load(Ordering::Relaxed), 1);
        let all = server.allocations(7 * S);
        assert_eq!(all.len(), 1);
        assert_eq!(
            (all[0].resource.as_str(), all[0].clients.len()),
            ("user-bob", 1)
        );
    }

    #[test]
    fn a_bucket_past_the_holders_bound_is_denied_not_let_through() {
        let yaml = "resources:\n  - {name: shared, capacity: 1000}\nrlqs:\n  buckets:\n    - {match: {name: shared}, resource: shared}\n";
        let (server, config) = setup(yaml);
        let totals = RlqsTotals::default();
        for i in 0..crate::lease::MAX_HOLDERS {
            let ask = ("shared".to_string(), Ask::wants(0.001));
            server.refresh(&format!("c{i}"), &[ask], 0)[0]
                .as_ref()
                .unwrap();
        }
        let mut s = Session::new("envoy-a");
        let act = s
            .on_report(
                report(&id(&[("name", "shared")]), 1, 0),
                S,
                &server,
                &config,
                &totals,
            )
            .unwrap();
        assert_eq!(strategy(&act[0]), Some(Assignment::DenyAll));
    }

    #[test]
    fn idle_buckets_are_abandoned_and_bounds_refuse_new_ones() {
        let yaml = YAML.replace("idle: 10s", "idle: 10s\n  max_buckets_per_stream: 2");
        let (server, config) = setup(&yaml);
        let totals = RlqsTotals::default();
        let mut s = Session::new("e");
        let users: Vec<BucketId> = ["u1", "u2", "u3"]
            .iter()
            .map(|u| id(&[("name", "per_user"), ("user", u)]))
            .collect();
        for u in &users {
            s.on_report(report(u, 1, 0), 0, &server, &config, &totals)
                .unwrap();
        }
        assert_eq!(s.len(), 2);
        assert_eq!(totals.refused.load(Ordering::Relaxed), 1);
        // u1 stays busy; u2 is idle for 10 s: abandoned, its lease (and table) released.
        s.on_report(report(&users[0], 3, 0), 9 * S, &server, &config, &totals)
            .unwrap();
        let act = s.tick(10 * S, &server, &config, &totals);
        assert_eq!(act.len(), 1);
        assert_eq!(act[0].bucket_id.as_ref(), Some(&users[1]));
        assert!(matches!(
            act[0].bucket_action,
            Some(bucket_action::BucketAction::AbandonAction(_))
        ));
        assert_eq!(s.len(), 1);
        assert_eq!(server.allocations(10 * S).len(), 1, "only user-u1 remains");
        assert_eq!(totals.abandoned_idle.load(Ordering::Relaxed), 1);
        // A bucket id over the size bound is refused.
        let long = id(&[("name", "per_user"), ("user", &"x".repeat(2000))]);
        let act = s
            .on_report(report(&long, 1, 0), 10 * S, &server, &config, &totals)
            .unwrap();
        assert!(matches!(
            act[0].bucket_action,
            Some(bucket_action::BucketAction::AbandonAction(_))
        ));
    }

    #[test]
    fn an_unchanged_assignment_is_sent_again_before_half_its_ttl_is_gone() {
        let (server, config) = setup(&YAML.replace("idle: 10s", "idle: 60s"));
        let totals = RlqsTotals::default();
        let bob = id(&[("name", "per_user"), ("user", "bob")]);
        let mut s = Session::new("e");
        assert_eq!(
            s.on_report(report(&bob, 1, 0), 0, &server, &config, &totals)
                .unwrap()
                .len(),
            1
        );
        assert!(s.tick(14 * S, &server, &config, &totals).is_empty());
        let again = s.tick(15 * S, &server, &config, &totals);
        assert_eq!(
            strategy(&again[0]),
            Some(tb(10, 1, 10)),
            "TTL 30 s, half gone"
        );
        assert!(s.tick(16 * S, &server, &config, &totals).is_empty());
    }

    #[test]
    fn a_reload_moves_a_bucket_to_its_new_resource_and_frees_the_old() {
        let yaml = "resources:\n  - {name: 'user-*', capacity: 10}\n  - {name: shared, capacity: 4}\nrlqs:\n  buckets:\n    - {match: {name: per_user, user: '*'}, resource: 'user-{user}'}\n";
        let (server, config) = setup(yaml);
        let totals = RlqsTotals::default();
        let bob = id(&[("name", "per_user"), ("user", "bob")]);
        let mut s = Session::new("e");
        let act = s
            .on_report(report(&bob, 1, 0), 0, &server, &config, &totals)
            .unwrap();
        assert_eq!(strategy(&act[0]), Some(tb(10, 1, 10)));
        // The file now sends every user to one shared resource of 4/s.
        let moved = QuotaConfig::from_yaml(
            Path::new("q.yaml"),
            &yaml.replace("resource: 'user-{user}'", "resource: shared"),
        )
        .unwrap();
        server.reload(moved.clone());
        let config = moved.rlqs.unwrap();
        let act = s
            .on_report(report(&bob, 30, 20), 5 * S, &server, &config, &totals)
            .unwrap();
        assert_eq!(strategy(&act[0]), Some(tb(4, 1, 4)), "10/s asked, 4 there");
        let all = server.allocations(5 * S);
        assert_eq!(
            all.len(),
            1,
            "user-bob's table went with its lease: {all:?}"
        );
        assert_eq!(all[0].resource, "shared");
    }

    #[test]
    fn a_stream_of_another_domain_is_refused() {
        let yaml = YAML.replace("idle: 10s", "idle: 10s\n  domain: edge");
        let (server, config) = setup(&yaml);
        let totals = RlqsTotals::default();
        let bob = id(&[("name", "per_user"), ("user", "bob")]);
        let e = Session::new("e")
            .on_report(report(&bob, 1, 0), 0, &server, &config, &totals)
            .unwrap_err();
        assert!(e.to_string().contains("\"envoy\" is not served"), "{e}");
    }

    #[test]
    fn a_bucket_value_never_adds_a_level_to_a_nested_resource() {
        let yaml = "resources:\n  - {name: 'org-*', capacity: 100}\n  - {name: 'user-*', parent: 'org-*', capacity: 10}\nrlqs:\n  buckets:\n    - {match: {name: u, org: '*', user: '*'}, resource: 'org-{org}/user-{user}'}\n";
        let config =
            crate::config::QuotaConfig::from_yaml(std::path::Path::new("q.yaml"), yaml).unwrap();
        let rlqs = config.rlqs.clone().unwrap();
        let target = |org: &str, user: &str| match rlqs.target(&id(&[
            ("name", "u"),
            ("org", org),
            ("user", user),
        ])) {
            Target::Resource(r) => r,
            _ => panic!("no resource"),
        };
        assert_eq!(target("acme", "bob"), "org-acme/user-bob");
        assert!(config.resource(&target("acme", "bob")).is_some());
        // `/` and `%` in values are escaped: one level each, distinct values stay distinct.
        assert_eq!(target("acme", "a/b"), "org-acme/user-a%2Fb");
        assert_eq!(target("ac/me", "b"), "org-ac%2Fme/user-b");
        assert_ne!(target("acme", "a%2Fb"), target("acme", "a/b"));
        assert!(config.resource(&target("acme", "x/y/z")).is_some());
    }
}
