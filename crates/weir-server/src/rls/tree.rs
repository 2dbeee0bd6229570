//! The configured limits as the engine matches them: a tree of descriptor nodes per domain
//! (exact values, `*` wildcard patterns, keys without value), each limit's [`Rule`] with its
//! counters in the store, kept across reloads while they mean the same, and its metrics.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::Mutex;
use weir_core::rate::RateAlgorithm;

use super::config::{Descriptor, Metadata, RateLimit};
use super::options::EngineOptions;
use super::request::{AppliedLimit, MAX_ENTRIES};
use super::settlement::Ledger;
use super::store::{Counter, Retune, Store};

/// Why an engine could not be built from a valid configuration (the previous one, on a reload,
/// stays in force).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The clock asked for cannot run here.
    #[error("clock: {0}")]
    Clock(weir_core::ConfigError),
    /// The store cannot count a rule's limit.
    #[error("rule {rule}: {source}")]
    Counter {
        /// The rule's id.
        rule: String,
        /// The store's reason.
        #[source]
        source: super::store::CounterError,
    },
}

/// One configured limit.
pub struct Rule {
    /// `domain.key_value.key…`: stable across reloads while the path is unchanged.
    pub id: String,
    /// The configuration.
    pub limit: RateLimit,
    /// Shadow mode.
    pub shadow: bool,
    /// Quota mode.
    pub quota_mode: bool,
    /// The descriptor's `metadata`, for the response's dynamic metadata.
    pub metadata: Option<Arc<Metadata>>,
    /// Whether the metric label depends on the request's values (`detailed_metric` on this
    /// rule, or `value_to_metric` on its path).
    pub(crate) per_value_metrics: bool,
    pub(crate) detailed_metric: bool,
    /// The counters (none for `unlimited` and `requests_per_unit: 0`).
    pub(crate) counter: Option<Arc<dyn Counter>>,
    pub(crate) metrics: Arc<RuleMetrics>,
    /// Per-value metric counts (bounded by [`MAX_METRIC_VALUES`]), kept across reloads
    /// with the rule's own.
    pub(crate) value_metrics: Arc<Mutex<HashMap<Box<str>, Arc<RuleMetrics>>>>,
    /// The dashboard's counters, kept across reloads while the id stays.
    pub counts: Arc<RuleCounts>,
    /// Built once, cloned (two reference counts) into every status.
    pub(crate) applied: AppliedLimit,
    /// With `cost:`: what each key's asks charged, the most its refunds give back.
    pub(crate) ledger: Option<Arc<Ledger>>,
}

/// Distinct metric labels one `detailed_metric` / `value_to_metric` rule creates at most;
/// later values are counted under the rule's own label, so clients cannot grow the metrics
/// without bound.
pub const MAX_METRIC_VALUES: usize = 1_000;

/// The Prometheus counts of one metric label (`weir_rls_*_total{rule=…}`), kept in relaxed
/// atomics on the request path and read by the service's metrics collector at a scrape.
#[derive(Debug, Default)]
pub struct RuleMetrics {
    /// Hits counted.
    pub hits: AtomicU64,
    /// Hits answered OVER_LIMIT.
    pub over_limit: AtomicU64,
    /// Hits let through with less than a tenth of the limit left.
    pub near_limit: AtomicU64,
    /// Hits over the limit in shadow mode.
    pub shadow_over_limit: AtomicU64,
    /// Units given back by settlements (`is_negative_hits`).
    pub refunded: AtomicU64,
    /// Units charged by settlements (`weir_cost=settle`), whatever the limit.
    pub charged: AtomicU64,
    /// Settlements refused, whole or in part: on a rule without `cost:`, or a refund beyond
    /// what the key's asks charged.
    pub settlements_refused: AtomicU64,
}

/// Cumulative counts of one rule, for the dashboard (the Prometheus counters are write-only).
#[derive(Debug)]
pub struct RuleCounts {
    /// Hits counted (each descriptor's `hits_addend`).
    pub hits: AtomicU64,
    /// Hits answered OVER_LIMIT.
    pub over_limit: AtomicU64,
    /// Hits over the limit in shadow mode (answered OK).
    pub shadow_over_limit: AtomicU64,
    /// The descriptor values over the limit most often (fixed size whatever clients send;
    /// recorded only when uncontended).
    pub top: Mutex<weir_core::TopK>,
}

/// Heavy hitters kept per rule.
pub const TOP_VALUES: usize = 10;

impl Default for RuleCounts {
    fn default() -> Self {
        Self {
            hits: AtomicU64::new(0),
            over_limit: AtomicU64::new(0),
            shadow_over_limit: AtomicU64::new(0),
            top: Mutex::new(weir_core::TopK::new(TOP_VALUES)),
        }
    }
}

pub(crate) struct Node {
    pub(crate) key: String,
    pub(crate) value: Option<String>,
    pub(crate) rule: Option<Arc<Rule>>,
    pub(crate) share_threshold: bool,
    pub(crate) value_to_metric: bool,
    pub(crate) children: Vec<Node>,
}

/// The configured nodes a request descriptor matched, one per entry.
pub(crate) struct Matched<'a> {
    pub(crate) nodes: [Option<&'a Node>; MAX_ENTRIES],
    pub(crate) rule: &'a Arc<Rule>,
}

impl Matched<'_> {
    /// The value a counter uses for entry `i`: the wildcard pattern where the node shares
    /// its threshold, else the request's value.
    pub(crate) fn counted<'v>(&'v self, i: usize, value: &'v str) -> &'v str {
        match self.nodes[i] {
            Some(Node {
                share_threshold: true,
                value: Some(pattern),
                ..
            }) if pattern != value => pattern,
            _ => value,
        }
    }
}

/// The name of a rule's counters (in Redis: `weir:{NAME:KEY}`): the rule's id with its
/// algorithm and window, the two things whose change makes the old state meaningless (a
/// fixed-window count read as a GCRA time, a 1 s count read as a 1 min one). A new limit,
/// burst or `name` keeps the counters.
pub(crate) fn counter_name(id: &str, limit: &RateLimit) -> String {
    format!(
        "{id}|{}|{}ms",
        limit.algorithm.as_str(),
        limit.window.as_millis()
    )
}

/// The counters of a limit in `store`: none for `unlimited` and `requests_per_unit: 0`.
pub(crate) fn counter(
    store: &dyn Store,
    id: &str,
    limit: &RateLimit,
    count_denied: bool,
) -> Result<Option<Arc<dyn Counter>>, EngineError> {
    if limit.unlimited || limit.denies_all() {
        return Ok(None);
    }
    let spec = limit.spec().counting_denied(count_denied);
    store
        .counter(counter_name(id, limit), &spec)
        .map(Some)
        .map_err(|source| EngineError::Counter {
            rule: id.to_string(),
            source,
        })
}

/// The counters of a reloaded rule: the previous rule's when they still mean the same
/// (same algorithm and window), retuned to the new limit, burst or counting of denied hits
/// once the whole configuration is valid (`retunes`); new ones otherwise.
pub(crate) fn reloaded_counter(
    store: &dyn Store,
    id: &str,
    limit: &RateLimit,
    previous: Option<&Rule>,
    count_denied: bool,
    retunes: &mut Vec<Retune>,
) -> Result<Option<Arc<dyn Counter>>, EngineError> {
    let kept = previous.filter(|p| {
        !limit.unlimited && p.limit.algorithm == limit.algorithm && p.limit.window == limit.window
    });
    let Some(old) = kept.and_then(|p| p.counter.as_ref()) else {
        return counter(store, id, limit, count_denied);
    };
    if limit.denies_all() {
        return Ok(None);
    }
    let spec = limit.spec().counting_denied(count_denied);
    if *old.spec() == spec {
        return Ok(Some(old.clone()));
    }
    let (counter, retune) = old.retuned(&spec).map_err(|source| EngineError::Counter {
        rule: id.to_string(),
        source,
    })?;
    retunes.push(retune);
    Ok(Some(counter))
}

impl Rule {
    /// Visits this rule's metric labels with their counts: its id, then each per-value label.
    pub fn metric_series(&self, mut visit: impl FnMut(&str, &RuleMetrics)) {
        visit(&self.id, &self.metrics);
        for (label, m) in self.value_metrics.lock().iter() {
            visit(label, m);
        }
    }

    /// The metric handles of one per-value label (`None` past [`MAX_METRIC_VALUES`] or when
    /// the label is the rule's own).
    pub(crate) fn value_metrics(&self, key: &str) -> Option<Arc<RuleMetrics>> {
        if key == self.id {
            return None;
        }
        let mut map = self.value_metrics.lock();
        if let Some(m) = map.get(key) {
            return Some(m.clone());
        }
        if map.len() >= MAX_METRIC_VALUES {
            return None;
        }
        let m = Arc::new(RuleMetrics::default());
        map.insert(key.into(), m.clone());
        Some(m)
    }
}

/// The metric label of a matched descriptor, as Lyft names its stats: with `detailed_metric`
/// `domain.key_value…` with the request's values; otherwise the rule's path where a level
/// with `value_to_metric` shows the request's value. A value sharing its threshold always
/// shows its pattern.
pub(crate) fn metric_key(
    domain: &str,
    detailed: bool,
    m: &Matched<'_>,
    entries: &[(String, String)],
) -> String {
    let mut out = String::from(domain);
    for (i, (k, v)) in entries.iter().enumerate() {
        out.push('.');
        out.push_str(k);
        let node = m.nodes[i];
        let shown = match node {
            _ if detailed => Some(m.counted(i, v)),
            None => None,
            Some(n) => match &n.value {
                Some(p) if p == v => Some(&**v),
                Some(p) if n.share_threshold || !n.value_to_metric => Some(&**p),
                Some(_) => Some(&**v),
                None if n.value_to_metric => Some(&**v),
                None => None,
            },
        };
        if let Some(shown) = shown {
            out.push('_');
            out.push_str(shown);
        }
    }
    out
}

/// The counter of a request's descriptor within its rule. Each entry is written with its
/// length, so no two different descriptors share a counter (`a=x, b=y` is not `k="x\u{1f}y"`);
/// `with_keys` adds the keys, for counters not fixed to a configured descriptor path (limit
/// overrides without a matching rule, where `user=alice` and `org=alice` must differ). Stored
/// as a digest when longer than 64 bytes (16 values of 1 KiB each would otherwise be kept as
/// is in every counter, in memory and in Redis).
pub(crate) fn counter_key<'a>(
    entries: impl Iterator<Item = (&'a str, &'a str)>,
    with_keys: bool,
) -> String {
    use std::fmt::Write;
    let mut k = String::new();
    for (key, value) in entries {
        if with_keys {
            let _ = write!(k, "{}:{key}", key.len());
        }
        let _ = write!(k, "{}:{value}", value.len());
    }
    match weir_rules::keys::KeyShortener.bounded(&k) {
        std::borrow::Cow::Borrowed(_) => k,
        std::borrow::Cow::Owned(short) => short,
    }
}

pub(crate) fn match_level<'a>(level: &'a [Node], key: &str, value: &str) -> Option<&'a Node> {
    let mut wildcard: Option<(&Node, usize)> = None;
    let mut key_only = None;
    for n in level.iter().filter(|n| n.key == key) {
        match &n.value {
            Some(v) if v == value => return Some(n),
            Some(v) => {
                if let Some(len) = wildcard_match(v, value) {
                    if wildcard.is_none_or(|(_, best)| len > best) {
                        wildcard = Some((n, len));
                    }
                }
            }
            None => key_only = Some(n),
        }
    }
    wildcard.map(|(n, _)| n).or(key_only)
}

/// Matches `value` against a pattern with `*` wildcards; answers the count of literal
/// characters (to prefer the most specific pattern).
pub(crate) fn wildcard_match(pattern: &str, value: &str) -> Option<usize> {
    if !pattern.contains('*') {
        return None;
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut rest = value;
    let first = parts[0];
    rest = rest.strip_prefix(first)?;
    let last = parts[parts.len() - 1];
    for p in &parts[1..parts.len() - 1] {
        let i = rest.find(p)?;
        rest = &rest[i + p.len()..];
    }
    if parts.len() > 1 && !rest.ends_with(last) {
        return None;
    }
    Some(parts.iter().map(|p| p.len()).sum())
}

/// A configuration being built into rules and a match tree.
pub(crate) struct Built<'a> {
    pub(crate) options: EngineOptions,
    pub(crate) store: &'a dyn Store,
    pub(crate) old: &'a HashMap<&'a str, &'a Arc<Rule>>,
    pub(crate) rules: Vec<Arc<Rule>>,
    pub(crate) retunes: Vec<Retune>,
    /// The domain's `count_denied`.
    pub(crate) count_denied: bool,
}

impl Built<'_> {
    pub(crate) fn nodes(
        &mut self,
        prefix: &str,
        descriptors: &[Descriptor],
        value_to_metric_above: bool,
    ) -> Result<Vec<Node>, EngineError> {
        let mut nodes = Vec::with_capacity(descriptors.len());
        for d in descriptors {
            let id = match &d.value {
                Some(v) => format!("{prefix}.{}_{v}", d.key),
                None => format!("{prefix}.{}", d.key),
            };
            let value_to_metric = value_to_metric_above || d.value_to_metric;
            let rule = match &d.rate_limit {
                Some(limit) => Some(self.rule(&id, d, limit, value_to_metric)?),
                None => None,
            };
            let children = self.nodes(&id, &d.descriptors, value_to_metric)?;
            nodes.push(Node {
                key: d.key.clone(),
                value: d.value.clone(),
                rule,
                share_threshold: d.share_threshold,
                value_to_metric: d.value_to_metric,
                children,
            });
        }
        Ok(nodes)
    }

    pub(crate) fn rule(
        &mut self,
        id: &str,
        d: &Descriptor,
        limit: &RateLimit,
        value_to_metric: bool,
    ) -> Result<Arc<Rule>, EngineError> {
        let shadow = d.shadow_mode || self.options.shadow;
        let previous = self.old.get(id).map(|r| &***r);
        let count_denied = self.count_denied && limit.algorithm == RateAlgorithm::FixedWindow;
        let counter = reloaded_counter(
            self.store,
            id,
            limit,
            previous,
            count_denied,
            &mut self.retunes,
        )?;
        let (requests_per_unit, unit) = limit.reported();
        let rule = Arc::new(Rule {
            applied: AppliedLimit {
                name: limit.name.as_deref().map(Arc::from),
                policy: Arc::from(limit.name.as_deref().unwrap_or(id)),
                requests_per_unit,
                unit,
                quota: limit.requests_per_unit,
            },
            metrics: previous.map(|p| p.metrics.clone()).unwrap_or_default(),
            value_metrics: previous
                .map(|p| p.value_metrics.clone())
                .unwrap_or_default(),
            per_value_metrics: d.detailed_metric || value_to_metric,
            detailed_metric: d.detailed_metric,
            counts: previous.map(|p| p.counts.clone()).unwrap_or_default(),
            id: id.to_string(),
            limit: limit.clone(),
            shadow,
            quota_mode: d.quota_mode,
            metadata: d.metadata.clone().map(Arc::new),
            ledger: limit
                .cost
                .map(|_| previous.and_then(|p| p.ledger.clone()).unwrap_or_default()),
            counter,
        });
        self.rules.push(rule.clone());
        Ok(rule)
    }
}
