//! Matching request descriptors to configured limits and deciding them (Lyft semantics).
//!
//! Matching is level by level: for each entry of a request descriptor, the configured node
//! with the same key and value wins, then a node whose value is a `*` wildcard pattern matching
//! it (the longest prefix first), then a node with the key and no value. A descriptor with N
//! entries only matches an N-deep path; the limit is the last node's. No match, or a node
//! without `rate_limit`, is no limit (OK). Counters are per matched rule and per the request's
//! values, so a key without value keeps one counter per value, bounded by the store's key cap
//! (idle keys evicted first).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use weir_core::rate::RateAlgorithm;
use weir_core::Decision;

use super::config::{DomainConfig, RateLimit, Unit};
use super::options::EngineOptions;
use super::request::{
    AppliedLimit, BadRequest, Request, RequestDescriptor, Response, Status, MAX_DESCRIPTORS,
    MAX_ENTRIES, MAX_OVERRIDES, MAX_VALUE_BYTES, UNLIMITED_REMAINING,
};
use super::store::{Counter, Store};
use super::tree::EngineError;
use super::tree::{counter, counter_key, match_level, metric_key, Built, Matched, Node, Rule};

/// The clock of a running engine: the shared process clock moved to the Unix epoch (modulo a
/// span every Lyft unit divides), so that fixed windows start where Lyft's do — a MINUTE window
/// at each minute of the wall clock, a DAY window at midnight UTC.
#[derive(Clone)]
pub struct EngineClock {
    inner: Arc<dyn weir_core::Clock>,
    offset: weir_core::Nanos,
}

/// 15 330 days: a multiple of a week, 30 days and 365 days (and so of every Lyft unit).
const ALIGN_SPAN_NANOS: u128 = 15_330 * 86_400 * 1_000_000_000;

impl EngineClock {
    /// `kind`'s process-wide clock, aligned to the wall clock once per process (reloads and
    /// every engine share the offset, so kept counters keep their windows).
    pub fn aligned(kind: weir_core::ClockKind) -> Result<Self, EngineError> {
        use std::sync::OnceLock;
        use weir_core::Clock;
        static OFFSET: OnceLock<weir_core::Nanos> = OnceLock::new();
        let inner = kind.build().map_err(EngineError::Clock)?;
        let offset = *OFFSET.get_or_init(|| {
            let wall = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
                % ALIGN_SPAN_NANOS;
            let mono = u128::from(weir_core::MonotonicClock::new().now());
            u64::try_from((wall + ALIGN_SPAN_NANOS - mono % ALIGN_SPAN_NANOS) % ALIGN_SPAN_NANOS)
                .unwrap_or(0)
        });
        Ok(Self {
            inner: Arc::new(inner),
            offset,
        })
    }

    /// A clock read as is (tests drive a manual clock; windows align to its zero).
    pub fn unaligned(clock: Arc<dyn weir_core::Clock>) -> Self {
        Self {
            inner: clock,
            offset: 0,
        }
    }

    /// The time every decision of one request is made at.
    pub fn now(&self) -> weir_core::Nanos {
        self.inner.now().saturating_add(self.offset)
    }
}

/// The counters of request-supplied limit overrides, by rule id, limit and unit.
type Overrides = HashMap<(String, u32, Unit), Arc<dyn Counter>>;

/// Everything a loaded configuration needs to decide.
pub struct Engine {
    domains: HashMap<String, Vec<Node>>,
    rules: Vec<Arc<Rule>>,
    overrides: Mutex<Overrides>,
    store: Arc<dyn Store>,
    /// For rules made from a request's limit override (shadow only with `--shadow`).
    options: EngineOptions,
    clock: EngineClock,
}

impl Engine {
    /// Builds from loaded domains with counters in `store`. A rule of `previous` with the same
    /// descriptor path, algorithm and window keeps its counters, whatever else changed (limit,
    /// burst, name, shadow mode); request-supplied limit overrides keep theirs. `previous` is
    /// untouched when this fails.
    pub fn build(
        domains: &[DomainConfig],
        options: EngineOptions,
        store: Arc<dyn Store>,
        previous: Option<&Engine>,
    ) -> Result<Self, EngineError> {
        let clock = match previous {
            Some(p) => p.clock.clone(),
            None => EngineClock::aligned(options.clock)?,
        };
        Self::build_with_clock(domains, options, store, previous, clock)
    }

    /// [`Engine::build`] on a given clock (tests: a manual clock).
    pub fn build_with_clock(
        domains: &[DomainConfig],
        options: EngineOptions,
        store: Arc<dyn Store>,
        previous: Option<&Engine>,
        clock: EngineClock,
    ) -> Result<Self, EngineError> {
        let old: HashMap<&str, &Arc<Rule>> = previous
            .map(|p| p.rules.iter().map(|r| (r.id.as_str(), r)).collect())
            .unwrap_or_default();
        let mut built = Built {
            options,
            store: &*store,
            old: &old,
            rules: Vec::new(),
            retunes: Vec::new(),
            count_denied: true,
        };
        let mut tree = HashMap::new();
        for d in domains {
            built.count_denied = d.count_denied;
            let nodes = built.nodes(&d.domain, &d.descriptors, false)?;
            tree.insert(d.domain.clone(), nodes);
        }
        // Everything is valid: now the kept counters may take their new limits.
        for r in built.retunes {
            r.apply();
        }
        let overrides = previous.map_or_else(HashMap::new, |p| p.overrides.lock().clone());
        Ok(Self {
            domains: tree,
            rules: built.rules,
            overrides: Mutex::new(overrides),
            store,
            options,
            clock,
        })
    }

    /// Where the counters live.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Every rule, in configuration order.
    pub fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }

    /// The configured domains.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// The rule a descriptor's `entries` match under a domain's top-level nodes.
    fn find<'a>(top: &'a [Node], entries: &[(String, String)]) -> Option<Matched<'a>> {
        let mut level = top;
        let mut nodes = [None; MAX_ENTRIES];
        let mut found = None;
        for (i, (k, v)) in entries.iter().enumerate() {
            let node = match_level(level, k, v)?;
            *nodes.get_mut(i)? = Some(node);
            if i + 1 == entries.len() {
                found = node.rule.as_ref();
            }
            level = &node.children;
        }
        found.map(|rule| Matched { nodes, rule })
    }
    /// Validates a request (bounds, empty fields).
    pub fn validate(request: &Request) -> Result<(), BadRequest> {
        if request.domain.is_empty() {
            return Err(BadRequest("rate limit domain must not be empty".into()));
        }
        if request.descriptors.is_empty() {
            return Err(BadRequest(
                "rate limit descriptor list must not be empty".into(),
            ));
        }
        if request.descriptors.len() > MAX_DESCRIPTORS {
            return Err(BadRequest(format!(
                "{} descriptors: at most {MAX_DESCRIPTORS}",
                request.descriptors.len()
            )));
        }
        if request.domain.len() > MAX_VALUE_BYTES {
            return Err(BadRequest(format!(
                "domain longer than {MAX_VALUE_BYTES} bytes"
            )));
        }
        for (i, d) in request.descriptors.iter().enumerate() {
            if d.entries.is_empty() {
                return Err(BadRequest(format!("descriptors[{i}]: no entries")));
            }
            if d.entries.len() > MAX_ENTRIES {
                return Err(BadRequest(format!(
                    "descriptors[{i}]: {} entries, at most {MAX_ENTRIES}",
                    d.entries.len()
                )));
            }
            for (j, (k, v)) in d.entries.iter().enumerate() {
                if k.is_empty() {
                    return Err(BadRequest(format!(
                        "descriptors[{i}].entries[{j}]: empty key"
                    )));
                }
                if v.is_empty() {
                    return Err(BadRequest(format!(
                        "descriptors[{i}].entries[{j}] ({k}): empty value"
                    )));
                }
                if k.len() > MAX_VALUE_BYTES || v.len() > MAX_VALUE_BYTES {
                    return Err(BadRequest(format!(
                        "descriptors[{i}].entries[{j}]: key or value longer than {MAX_VALUE_BYTES} bytes"
                    )));
                }
            }
            if let Some((0, _)) = d.limit {
                return Err(BadRequest(format!(
                    "descriptors[{i}].limit: requests_per_unit must be ≥ 1"
                )));
            }
        }
        Ok(())
    }

    fn override_counter(
        &self,
        id: &str,
        rpu: u32,
        unit: Unit,
    ) -> Result<Arc<dyn Counter>, BadRequest> {
        let mut map = self.overrides.lock();
        let key = (id.to_string(), rpu, unit);
        if let Some(r) = map.get(&key) {
            return Ok(r.clone());
        }
        if map.len() >= MAX_OVERRIDES {
            return Err(BadRequest(format!(
                "more than {MAX_OVERRIDES} distinct limit overrides"
            )));
        }
        let limit = RateLimit {
            unit,
            requests_per_unit: u64::from(rpu),
            window: unit.duration(),
            name: None,
            unlimited: false,
            replaces: Vec::new(),
            algorithm: RateAlgorithm::FixedWindow,
            burst: None,
            cost: None,
        };
        // Lyft counts every hit of an override (it has no domain setting to say otherwise).
        let rule = counter(
            &*self.store,
            &format!("{id}~{rpu}/{}", unit.proto_name()),
            &limit,
            true,
        )
        .map_err(|e| BadRequest(e.to_string()))?
        .ok_or_else(|| BadRequest("override without limit".into()))?;
        map.insert(key, rule.clone());
        Ok(rule)
    }

    /// Decides a request: every descriptor is evaluated (Lyft semantics, including
    /// `replaces`, `quota_mode` and request-supplied limit overrides); one clock reading for
    /// the whole request.
    pub async fn decide(&self, request: &Request) -> Result<Response, BadRequest> {
        Self::validate(request)?;
        let now = self.clock.now();
        // One domain lookup per request; an unknown domain matches nothing.
        let top = self.domains.get(&request.domain);
        let known_domain = top.is_some();
        let matched: Vec<Option<Matched<'_>>> = request
            .descriptors
            .iter()
            .map(|d| top.and_then(|top| Self::find(top, d.matched_entries())))
            .collect();
        let replaced: Vec<&str> = matched
            .iter()
            .flatten()
            .flat_map(|m| m.rule.limit.replaces.iter().map(String::as_str))
            .collect();
        let mut statuses = Vec::with_capacity(request.descriptors.len());
        // Descriptors admitted under rules that charge nothing for a refused hit: given back
        // if the request as a whole is refused (at most MAX_DESCRIPTORS = 64 bits).
        let mut admitted: u64 = 0;
        for (i, (d, m)) in request.descriptors.iter().zip(&matched).enumerate() {
            let hits = d
                .hits_addend
                .unwrap_or(u64::from(request.hits_addend.max(1)));
            if let Some(refund) = d.settlement() {
                if let (Some(m), None) = (m, d.limit) {
                    self.settle_asked(m, d, hits, refund, now).await;
                }
                statuses.push(no_limit());
                continue;
            }
            let status = match (m, d.limit) {
                // Lyft: an override applies on a known domain, matched or not; an unknown
                // domain has no limit at all.
                (_, Some(_)) if !known_domain => no_limit(),
                (_, Some((rpu, unit))) => {
                    self.decide_override(request, d, m.as_ref(), (rpu, unit), hits, now)
                        .await?
                }
                (None, None) => no_limit(),
                (Some(m), None) => {
                    let (status, admit) = self
                        .decide_matched(request, d, m, &replaced, hits, now)
                        .await;
                    if admit {
                        admitted |= 1 << i;
                    }
                    status
                }
            };
            statuses.push(status);
        }
        let over = |s: &&Status| s.limit.is_some() && s.over_limit;
        let quota: Vec<&Status> = statuses.iter().filter(|s| s.quota_mode).collect();
        let over_limit = statuses.iter().filter(|s| !s.quota_mode).any(|s| over(&s))
            || (!quota.is_empty() && quota.iter().all(over));
        if over_limit && admitted != 0 {
            self.give_back(request, &matched, admitted, now).await;
        }
        let metadata = self
            .options
            .response_metadata
            .then(|| response_metadata(request, &statuses, &matched));
        Ok(Response {
            over_limit,
            statuses,
            metadata,
        })
    }

    /// A descriptor with a limit of its own (a request-supplied override): its own counter
    /// (by the matched rule's id, else the domain's), or every hit refused at 0.
    async fn decide_override(
        &self,
        request: &Request,
        d: &RequestDescriptor,
        m: Option<&Matched<'_>>,
        (rpu, unit): (u32, Unit),
        hits: u64,
        now: weir_core::Nanos,
    ) -> Result<Status, BadRequest> {
        if rpu == 0 {
            return Ok(deny_all(
                override_applied(0, unit),
                unit.duration(),
                now,
                self.options.shadow,
            ));
        }
        let id = m.map_or_else(
            || format!("{}.override", request.domain),
            |m| m.rule.id.clone(),
        );
        let counter = self.override_counter(&id, rpu, unit)?;
        let key = counter_key(d.entries.iter().map(|(k, v)| (&**k, &**v)), m.is_none());
        let decision = counter.acquire(&key, hits, now).await;
        Ok(status_of(
            &decision,
            override_applied(rpu, unit),
            unit.duration(),
            self.options.shadow,
            Some(now),
        ))
    }

    /// A descriptor matched by a rule of the file: replaced, unlimited, counted, or refused
    /// (`requests_per_unit: 0`); with whether its hits were charged and may be given back.
    async fn decide_matched(
        &self,
        request: &Request,
        d: &RequestDescriptor,
        m: &Matched<'_>,
        replaced: &[&str],
        hits: u64,
        now: weir_core::Nanos,
    ) -> (Status, bool) {
        let r = m.rule;
        if r.limit
            .name
            .as_deref()
            .is_some_and(|n| replaced.contains(&n))
        {
            return (no_limit(), false);
        }
        if r.limit.unlimited {
            let status = Status {
                remaining: UNLIMITED_REMAINING,
                ..no_limit()
            };
            return (status, false);
        }
        let Some(counter) = &r.counter else {
            // requests_per_unit: 0
            let mut status = deny_all(r.applied.clone(), r.limit.window, now, r.shadow);
            status.quota_mode = r.quota_mode;
            self.count(r, m, &request.domain, d, true, 0, hits);
            return (status, false);
        };
        let key = counter_key(
            d.entries
                .iter()
                .enumerate()
                .map(|(i, (_, v))| ("", m.counted(i, v))),
            false,
        );
        let hits = r.limit.cost.map_or(hits, |c| c.held(hits));
        let decision = counter.acquire(&key, hits, now).await;
        let admit = decision.allowed() && !counter.spec().count_denied;
        if let (true, Some(ledger)) = (decision.allowed(), &r.ledger) {
            ledger.charged(&key, hits, now);
        }
        let fixed = r.limit.algorithm == RateAlgorithm::FixedWindow;
        let mut status = status_of(
            &decision,
            r.applied.clone(),
            r.limit.window,
            r.shadow,
            fixed.then_some(now),
        );
        status.quota_mode = r.quota_mode;
        self.count(
            r,
            m,
            &request.domain,
            d,
            !decision.allowed(),
            decision.remaining(),
            hits,
        );
        (status, admit)
    }

    /// A refused request charges none of its descriptors (a team's counter is not charged
    /// when its user's refuses): the hits of the descriptors in `admitted` (a bit per index)
    /// are given back. Rules counting refused hits (Lyft's fixed window) are never in it.
    #[cold]
    async fn give_back(
        &self,
        request: &Request,
        matched: &[Option<Matched<'_>>],
        admitted: u64,
        now: weir_core::Nanos,
    ) {
        for (i, (d, m)) in request.descriptors.iter().zip(matched).enumerate() {
            if admitted & (1 << i) == 0 {
                continue;
            }
            if let Some(m) = m {
                let hits = d
                    .hits_addend
                    .unwrap_or(u64::from(request.hits_addend.max(1)));
                let hits = m.rule.limit.cost.map_or(hits, |c| c.held(hits));
                if let Some(ledger) = &m.rule.ledger {
                    ledger.refundable(&Self::settled_key(m, d), hits, now);
                }
                self.settle(m, d, hits, true, now).await;
            }
        }
    }

    /// A settlement a caller asked for on the rule `m` matched: refused unless the rule has
    /// `cost:`; then within its bounds ([`super::settlement`]). Counted in the rule's metrics
    /// (not as hits).
    async fn settle_asked(
        &self,
        m: &Matched<'_>,
        d: &RequestDescriptor,
        hits: u64,
        refund: bool,
        now: weir_core::Nanos,
    ) {
        let rule = m.rule;
        let refused = || {
            rule.metrics
                .settlements_refused
                .fetch_add(1, Ordering::Relaxed)
        };
        let (Some(bounds), Some(ledger), Some(_)) = (rule.limit.cost, &rule.ledger, &rule.counter)
        else {
            refused();
            return;
        };
        let units = if refund {
            let asked = bounds.held(hits);
            let units = ledger.refundable(&Self::settled_key(m, d), asked, now);
            if units < asked {
                refused();
            }
            rule.metrics.refunded.fetch_add(units, Ordering::Relaxed);
            units
        } else {
            let units = bounds.charged(hits);
            rule.metrics.charged.fetch_add(units, Ordering::Relaxed);
            units
        };
        if units > 0 {
            self.settle(m, d, units, refund, now).await;
        }
    }

    /// The counter key a settlement descriptor `d` names on the rule `m` matched
    /// ([`SETTLE_ENTRY`] left out).
    fn settled_key(m: &Matched<'_>, d: &RequestDescriptor) -> String {
        counter_key(
            d.matched_entries()
                .iter()
                .enumerate()
                .map(|(i, (_, v))| ("", m.counted(i, v))),
            false,
        )
    }

    /// Gives back or charges `hits` on the counter `m` matched (`refund`: given back).
    async fn settle(
        &self,
        m: &Matched<'_>,
        d: &RequestDescriptor,
        hits: u64,
        refund: bool,
        now: weir_core::Nanos,
    ) {
        let Some(counter) = &m.rule.counter else {
            return;
        };
        let key = Self::settled_key(m, d);
        let adjusting = counter.adjust(&key, hits, refund, now);
        if let Some(f) = adjusting {
            f.await;
        }
    }

    /// Records a rule's hit in its metrics and the dashboard's counts.
    #[allow(clippy::too_many_arguments)]
    fn count(
        &self,
        rule: &Rule,
        m: &Matched<'_>,
        domain: &str,
        d: &RequestDescriptor,
        exceeded: bool,
        remaining: u64,
        hits: u64,
    ) {
        let per_value;
        let metrics = if rule.per_value_metrics {
            per_value =
                rule.value_metrics(&metric_key(domain, rule.detailed_metric, m, &d.entries));
            per_value.as_deref().unwrap_or(&rule.metrics)
        } else {
            &rule.metrics
        };
        let c = &rule.counts;
        let add = |c: &AtomicU64| c.fetch_add(hits, Ordering::Relaxed);
        add(&metrics.hits);
        c.hits.fetch_add(hits, Ordering::Relaxed);
        if exceeded {
            if rule.shadow {
                add(&metrics.shadow_over_limit);
                c.shadow_over_limit.fetch_add(hits, Ordering::Relaxed);
            } else {
                add(&metrics.over_limit);
                c.over_limit.fetch_add(hits, Ordering::Relaxed);
            }
            if let Some(mut top) = c.top.try_lock() {
                top.record_n(&descriptor_text(&d.entries), hits);
            }
        } else if remaining * 10 < rule.limit.requests_per_unit {
            add(&metrics.near_limit);
        }
    }
}

fn override_applied(rpu: u32, unit: Unit) -> AppliedLimit {
    AppliedLimit {
        name: None,
        policy: Arc::from(""),
        requests_per_unit: u64::from(rpu),
        unit,
        quota: u64::from(rpu),
    }
}

/// Lyft's dynamic metadata: `domain`, `descriptors` (`entries` as `key=value`, `limit`,
/// `hitsAddend`), the request's `hitsAddend` when set, and `metadata`: the configured
/// metadata of the descriptors answered OK (merged, the first value of a key wins, maps
/// merged recursively).
fn response_metadata(
    request: &Request,
    statuses: &[Status],
    matched: &[Option<Matched<'_>>],
) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::{json, Map, Value};
    let mut out = Map::new();
    out.insert("domain".into(), json!(request.domain));
    let descriptors: Vec<Value> = request
        .descriptors
        .iter()
        .map(|d| {
            let mut v = Map::new();
            let entries: Vec<String> = d.entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
            v.insert("entries".into(), json!(entries));
            if let Some((rpu, unit)) = d.limit {
                v.insert(
                    "limit".into(),
                    json!(format!(
                        "requests_per_unit:{rpu} unit:{}",
                        unit.proto_name()
                    )),
                );
            }
            if let Some(h) = d.hits_addend {
                v.insert("hitsAddend".into(), json!(h));
            }
            Value::Object(v)
        })
        .collect();
    out.insert("descriptors".into(), Value::Array(descriptors));
    if request.hits_addend != 0 {
        out.insert("hitsAddend".into(), json!(request.hits_addend));
    }
    let mut merged = Map::new();
    for ((s, m), d) in statuses.iter().zip(matched).zip(&request.descriptors) {
        let passed = !s.over_limit && s.remaining != UNLIMITED_REMAINING && d.limit.is_none();
        if let (true, Some(md)) = (passed, m.as_ref().and_then(|m| m.rule.metadata.as_ref())) {
            merge(&mut merged, &md.0);
        }
    }
    if !merged.is_empty() {
        out.insert("metadata".into(), Value::Object(merged));
    }
    out
}

fn merge(
    into: &mut serde_json::Map<String, serde_json::Value>,
    from: &serde_json::Map<String, serde_json::Value>,
) {
    for (k, v) in from {
        match (into.get_mut(k), v) {
            (Some(serde_json::Value::Object(a)), serde_json::Value::Object(b)) => merge(a, b),
            (Some(_), _) => {}
            (None, v) => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

/// `key=value, key=value`: a descriptor as the dashboard shows it.
fn descriptor_text(entries: &[(String, String)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
        if out.len() > weir_core::top_k::MAX_VALUE_BYTES {
            break;
        }
    }
    out
}

fn no_limit() -> Status {
    Status {
        over_limit: false,
        limit: None,
        remaining: 0,
        reset: Duration::ZERO,
        retry_after: None,
        window: Duration::ZERO,
        quota_mode: false,
    }
}

/// Time from `now` to the end of its aligned window of `window`.
fn until_window_end(window: Duration, now: weir_core::Nanos) -> Duration {
    let w = weir_core::clock::duration_to_nanos(window).max(1);
    Duration::from_nanos(w - now % w)
}

/// A descriptor whose limit is 0: over the limit whatever it asks, until the window's end.
fn deny_all(limit: AppliedLimit, window: Duration, now: weir_core::Nanos, shadow: bool) -> Status {
    Status {
        over_limit: !shadow,
        limit: Some(limit),
        remaining: 0,
        reset: until_window_end(window, now),
        retry_after: None,
        window,
        quota_mode: false,
    }
}

/// A decision as a status. `window_end_from`: a fixed window's `now`, whose reset is the
/// window's end whatever was counted (Lyft's `duration_until_reset`).
fn status_of(
    d: &Decision,
    limit: AppliedLimit,
    window: Duration,
    shadow: bool,
    window_end_from: Option<weir_core::Nanos>,
) -> Status {
    let reset = match window_end_from {
        Some(_) if !d.reset_after().is_zero() => d.reset_after(),
        Some(now) => until_window_end(window, now),
        None => d.reset_after(),
    };
    Status {
        window,
        over_limit: !d.allowed() && !shadow,
        limit: Some(limit),
        remaining: if d.allowed() { d.remaining() } else { 0 },
        reset,
        retry_after: if d.allowed() {
            Some(Duration::ZERO)
        } else {
            d.retry_after()
        },
        quota_mode: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::tree::wildcard_match;
    use std::path::Path;

    fn ck(entries: &[(String, String)], keys: bool) -> String {
        counter_key(entries.iter().map(|(k, v)| (&**k, &**v)), keys)
    }

    fn engine(yaml: &str) -> Engine {
        let c = super::super::config::parse(Path::new("t.yaml"), yaml).unwrap();
        Engine::build(&[c], EngineOptions::default(), memory(), None).unwrap()
    }

    fn memory() -> Arc<dyn Store> {
        Arc::new(super::super::store::MemoryStore::default())
    }

    fn req(domain: &str, entries: &[(&str, &str)]) -> Request {
        Request {
            domain: domain.into(),
            descriptors: vec![RequestDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            }],
            hits_addend: 0,
        }
    }

    async fn pass(e: &Engine, r: &Request) -> bool {
        !e.decide(r).await.unwrap().over_limit
    }

    const CONFIG: &str = "domain: d
descriptors:
  - key: k
    value: exact
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    value: 'pre*'
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: s
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
";

    #[tokio::test]
    async fn long_values_get_their_own_bounded_counters() {
        let e = engine(CONFIG);
        let (a, b) = ("v".repeat(1000), format!("{}w", "v".repeat(999)));
        assert!(pass(&e, &req("d", &[("a", "x"), ("b", &a)])).await);
        assert!(
            !pass(&e, &req("d", &[("a", "x"), ("b", &a)])).await,
            "same value, same counter"
        );
        assert!(
            pass(&e, &req("d", &[("a", "x"), ("b", &b)])).await,
            "another long value"
        );
        let key = ck(&[("a".into(), "x".into()), ("b".into(), a)], false);
        assert!(key.len() <= weir_rules::keys::MAX_KEY_LEN, "{key}");
    }

    #[tokio::test]
    async fn most_specific_match_first_and_per_value_counters() {
        let e = engine(CONFIG);
        let count = |n: &str| {
            let r = req("d", &[("k", n)]);
            let e = &e;
            async move {
                let mut ok = 0;
                for _ in 0..5 {
                    ok += u32::from(pass(e, &r).await);
                }
                ok
            }
        };
        assert_eq!(count("exact").await, 1);
        assert_eq!(count("prefix-1").await, 2);
        assert_eq!(count("other").await, 3);
        assert_eq!(count("other2").await, 3, "one counter per value");
    }

    #[tokio::test]
    async fn nested_paths_match_only_at_full_depth() {
        let e = engine(CONFIG);
        assert!(pass(&e, &req("d", &[("a", "x"), ("b", "1")])).await);
        assert!(!pass(&e, &req("d", &[("a", "x"), ("b", "1")])).await);
        // one entry only: the path is 2 deep, no limit at depth 1
        for _ in 0..3 {
            assert!(pass(&e, &req("d", &[("a", "x")])).await);
        }
        // unknown domain / descriptor: no limit
        let r = e.decide(&req("nope", &[("k", "v")])).await.unwrap();
        assert!(!r.over_limit && r.statuses[0].limit.is_none());
    }

    #[tokio::test]
    async fn a_request_its_user_refuses_charges_no_org_with_weirs_algorithms_only() {
        // One request names the org and the org's user: two descriptors. With GCRA (or a
        // domain with count_denied: false) a request the user's limit refuses is charged to
        // nobody; Lyft's counting fixed window charges every descriptor, as Lyft does.
        let yaml = |algorithm: &str| {
            format!(
                "domain: d
descriptors:
  - key: org
    rate_limit: {{unit: minute, requests_per_unit: 5{algorithm}}}
    descriptors:
      - key: user
        rate_limit: {{unit: minute, requests_per_unit: 2{algorithm}}}
"
            )
        };
        let both = |user: &str| Request {
            descriptors: vec![
                req("d", &[("org", "acme")]).descriptors.remove(0),
                req("d", &[("org", "acme"), ("user", user)])
                    .descriptors
                    .remove(0),
            ],
            ..req("d", &[])
        };
        for (algorithm, org_left) in [(", algorithm: gcra", 3), ("", 0)] {
            let e = engine(&yaml(algorithm));
            // bob: 2 pass, 3 refused by his own limit.
            let passed: Vec<bool> = futures_passed(&e, &both("bob"), 5).await;
            assert_eq!(passed, [true, true, false, false, false], "{algorithm:?}");
            // What the org has left for amy: 5 − bob's 2 when refusals cost nothing; Lyft's
            // window counted all 5 of bob's.
            let amy = futures_passed(&e, &both("amy"), 5).await;
            let amy_passed = amy.iter().filter(|p| **p).count();
            assert_eq!(amy_passed, org_left.min(2), "{algorithm:?}: {amy:?}");
            // The org's own counter: with GCRA one more request fits (amy's 2 + bob's 2 = 4).
            let org = e.decide(&req("d", &[("org", "acme")])).await.unwrap();
            assert_eq!(!org.over_limit, org_left > 2, "{algorithm:?}");
        }
    }

    async fn futures_passed(e: &Engine, r: &Request, n: usize) -> Vec<bool> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(pass(e, r).await);
        }
        out
    }

    #[tokio::test]
    async fn shadow_mode_counts_but_never_blocks() {
        let e = engine(CONFIG);
        for _ in 0..5 {
            let r = e.decide(&req("d", &[("s", "v")])).await.unwrap();
            assert!(!r.over_limit);
        }
    }

    #[tokio::test]
    async fn bad_requests_are_refused_with_a_reason() {
        let e = engine(CONFIG);
        let mut r = req("", &[("k", "v")]);
        assert!(e.decide(&r).await.unwrap_err().0.contains("domain"));
        r = req("d", &[("", "v")]);
        assert!(e.decide(&r).await.unwrap_err().0.contains("empty key"));
        r = req("d", &[("k", "")]);
        assert!(e.decide(&r).await.unwrap_err().0.contains("empty value"));
        let big = "x".repeat(MAX_VALUE_BYTES + 1);
        r = req("d", &[("k", &big)]);
        assert!(e.decide(&r).await.is_err());
        r = req("d", &[("k", "v")]);
        r.descriptors = vec![r.descriptors[0].clone(); MAX_DESCRIPTORS + 1];
        assert!(e.decide(&r).await.is_err());
    }

    fn reloaded(previous: &Engine, yaml: &str) -> Engine {
        let c = super::super::config::parse(Path::new("t.yaml"), yaml).unwrap();
        Engine::build(&[c], EngineOptions::default(), memory(), Some(previous)).unwrap()
    }

    async fn passes(e: &Engine, r: &Request, tries: u32) -> u32 {
        let mut ok = 0;
        for _ in 0..tries {
            ok += u32::from(pass(e, r).await);
        }
        ok
    }

    #[tokio::test]
    async fn reload_keeps_counters_unless_algorithm_or_window_change() {
        let exact = req("d", &[("k", "exact")]);
        let e1 = engine(CONFIG);
        assert!(pass(&e1, &exact).await);
        let e2 = reloaded(&e1, CONFIG);
        assert!(!pass(&e2, &exact).await, "unchanged rule: counter kept");
        // A higher limit and a new name: the two hits counted (the refused one too, as Lyft
        // counts every hit of a fixed window) still count.
        let raised = CONFIG.replace(
            "value: exact\n    rate_limit: {unit: minute, requests_per_unit: 1}",
            "value: exact\n    rate_limit: {unit: minute, requests_per_unit: 5, name: renamed}",
        );
        assert_ne!(raised, CONFIG);
        let e3 = reloaded(&e2, &raised);
        assert_eq!(
            passes(&e3, &exact, 10).await,
            3,
            "limit 5, two already counted"
        );
        // Lowering it during an incident hands out no fresh quota.
        let e4 = reloaded(&e3, CONFIG);
        assert_eq!(passes(&e4, &exact, 3).await, 0);
        // Another algorithm (or window) counts differently: it starts from zero.
        let gcra = CONFIG.replace(
            "value: exact\n    rate_limit: {unit: minute, requests_per_unit: 1}",
            "value: exact\n    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: gcra}",
        );
        let e5 = reloaded(&e4, &gcra);
        assert_eq!(passes(&e5, &exact, 3).await, 1);
        // A failed reload leaves the running rules as they were.
        let raised9 = CONFIG.replace(
            "value: exact\n    rate_limit: {unit: minute, requests_per_unit: 1}",
            "value: exact\n    rate_limit: {unit: minute, requests_per_unit: 9}",
        );
        let mut c = super::super::config::parse(Path::new("t.yaml"), &raised9).unwrap();
        // A rule the store refuses, past the parser's checks (built in code).
        let mut bad = c.descriptors[0].clone();
        bad.key = "bad".into();
        if let Some(l) = bad.rate_limit.as_mut() {
            l.algorithm = RateAlgorithm::Gcra;
            l.burst = Some(0);
        }
        c.descriptors.push(bad);
        let refused = Engine::build(&[c], EngineOptions::default(), memory(), Some(&e4));
        let e = refused.err().unwrap();
        assert!(
            matches!(&e, EngineError::Counter { rule, .. } if rule.starts_with("d.bad")),
            "{e}"
        );
        assert!(e.to_string().starts_with("rule d.bad"), "{e}");
        assert_eq!(passes(&e4, &exact, 3).await, 0, "old limit still enforced");
    }

    fn with_override(entries: &[(&str, &str)], rpu: u32) -> Request {
        let mut r = req("d", entries);
        r.descriptors[0].limit = Some((rpu, Unit::Minute));
        r
    }

    #[tokio::test]
    async fn override_counters_are_per_keys_and_values_and_survive_reloads() {
        let e = engine(CONFIG);
        assert!(pass(&e, &with_override(&[("user", "alice")], 1)).await);
        assert!(!pass(&e, &with_override(&[("user", "alice")], 1)).await);
        assert!(
            pass(&e, &with_override(&[("org", "alice")], 1)).await,
            "another key is another counter"
        );
        let e2 = reloaded(&e, CONFIG);
        assert!(
            !pass(&e2, &with_override(&[("user", "alice")], 1)).await,
            "override counter kept across a reload"
        );
    }

    #[test]
    fn counter_keys_are_unambiguous() {
        let e = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        let two = e(&[("a", "x"), ("b", "y")]);
        let one = e(&[("k", "x\u{1f}y")]);
        let glued = e(&[("k", "x1:y")]);
        for keys in [false, true] {
            assert_ne!(ck(&two, keys), ck(&one, keys));
            assert_ne!(ck(&two, keys), ck(&glued, keys));
        }
        assert_ne!(
            ck(&e(&[("user", "alice")]), true),
            ck(&e(&[("org", "alice")]), true)
        );
    }

    fn on_clock(yaml: &str, clock: &Arc<weir_core::ManualClock>) -> Engine {
        let c = super::super::config::parse(Path::new("t.yaml"), yaml).unwrap();
        let clock = EngineClock::unaligned(clock.clone());
        Engine::build_with_clock(&[c], EngineOptions::default(), memory(), None, clock).unwrap()
    }

    #[tokio::test]
    async fn resets_are_the_fixed_windows_end_and_counts_follow_lyft() {
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 20}\n  - key: z\n    rate_limit: {unit: hour, requests_per_unit: 0}\n  - key: g\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: gcra}\n";
        let clock = Arc::new(weir_core::ManualClock::new(0));
        let e = on_clock(yaml, &clock);
        let hits = |n: u64, key: &str| {
            let mut r = req("d", &[(key, "v")]);
            r.descriptors[0].hits_addend = Some(n);
            r
        };
        let second = Duration::from_secs(1);
        clock.advance(Duration::from_millis(60_000 + 1_500));
        // A check on an empty window still reports the time to its end (58.5 s).
        let s = &e.decide(&hits(0, "k")).await.unwrap().statuses[0];
        assert_eq!((s.remaining, s.reset), (20, Duration::from_millis(58_500)));
        let s = &e.decide(&hits(21, "k")).await.unwrap().statuses[0];
        assert!(s.over_limit);
        assert_eq!((s.remaining, s.reset), (0, Duration::from_millis(58_500)));
        clock.advance(second);
        // Counted though refused: the window holds 21 of 20.
        let s = &e.decide(&hits(0, "k")).await.unwrap().statuses[0];
        assert!(s.over_limit);
        assert_eq!((s.remaining, s.reset), (0, Duration::from_millis(57_500)));
        // The next minute starts from zero.
        clock.advance(Duration::from_secs(58));
        let s = &e.decide(&hits(1, "k")).await.unwrap().statuses[0];
        assert!(!s.over_limit);
        assert_eq!((s.remaining, s.reset), (19, Duration::from_millis(59_500)));
        // A limit of 0: over, its window's end.
        let s = &e.decide(&hits(1, "z")).await.unwrap().statuses[0];
        assert!(s.over_limit && s.remaining == 0);
        assert_eq!(s.reset, Duration::from_millis(3_600_000 - 120_500));
        assert_eq!(s.limit.as_ref().unwrap().requests_per_unit, 0);
        // Other algorithms report their own reset (GCRA: when the burst is whole again).
        let s = &e.decide(&hits(1, "g")).await.unwrap().statuses[0];
        assert_eq!(s.reset, Duration::from_secs(30));
    }

    /// A request of `n` hits on `user: ann`: an ask, a refund (`Some(true)`) or a charge
    /// (`Some(false)`, the descriptor ending with `weir_cost=settle`).
    fn ask(n: u64, settle: Option<bool>) -> Request {
        let mut r = req("llm", &[("user", "ann")]);
        let d = &mut r.descriptors[0];
        d.hits_addend = Some(n);
        match settle {
            Some(true) => d.negative = true,
            Some(false) => d.entries.push(("weir_cost".into(), "settle".into())),
            None => {}
        }
        r
    }

    /// Whether `e` answers `r` OVER_LIMIT.
    async fn over(e: &Engine, r: Request) -> bool {
        e.decide(&r).await.unwrap().over_limit
    }

    /// Envoy's stream-end call on a rule with `cost:`: the estimate given back
    /// (`is_negative_hits`), the actual cost charged whatever the limit (the descriptor ends
    /// with `weir_cost: settle`, not matched) — each bounded.
    #[tokio::test]
    async fn settlements_give_back_and_charge_past_the_limit() {
        for algorithm in ["fixed_window", "gcra"] {
            let yaml = format!("domain: llm\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: 1000, algorithm: {algorithm}, cost: {{max: 2000}}}}\n");
            let clock = Arc::new(weir_core::ManualClock::new(0));
            let e = on_clock(&yaml, &clock);
            // What is left after an ask of 1.
            let left = || async { e.decide(&ask(1, None)).await.unwrap().statuses[0].remaining };
            // 900 held; the call cost 120: 900 back, 120 charged, in one request.
            assert!(!over(&e, ask(900, None)).await);
            assert_eq!(left().await, 99, "{algorithm}");
            let mut settle = ask(900, Some(true));
            settle
                .descriptors
                .push(ask(120, Some(false)).descriptors.remove(0));
            let r = e.decide(&settle).await.unwrap();
            assert!(!r.over_limit, "a settlement is never refused");
            assert_eq!(left().await, 878, "{algorithm}");
            // A charge past the limit still counts (a debt), at most `max`: nothing left.
            assert!(!e.decide(&ask(5_000, Some(false))).await.unwrap().over_limit);
            assert!(over(&e, ask(1, None)).await);
            // A refund gives back at most what ann's asks charged and were not given back
            // (2 units of 1): the debt stands.
            assert!(
                !e.decide(&ask(1_000_000, Some(true)))
                    .await
                    .unwrap()
                    .over_limit
            );
            assert!(over(&e, ask(1, None)).await, "{algorithm}");
            let m = &e.rules()[0].metrics;
            assert_eq!(m.refunded.load(Ordering::Relaxed), 902, "{algorithm}");
            assert_eq!(m.charged.load(Ordering::Relaxed), 2_120, "{algorithm}");
            assert_eq!(m.settlements_refused.load(Ordering::Relaxed), 1);
        }
    }

    /// Any caller of the service can send settlements: on a rule without `cost:` they change
    /// nothing (a refund never adds room, a charge never locks a key out) and are counted.
    #[tokio::test]
    async fn settlements_on_rules_without_cost_change_nothing() {
        let yaml = "domain: llm\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: gcra}\n";
        let clock = Arc::new(weir_core::ManualClock::new(0));
        let e = on_clock(yaml, &clock);
        for _ in 0..3 {
            assert!(!over(&e, ask(1, None)).await);
        }
        assert!(!e.decide(&ask(5, Some(true))).await.unwrap().over_limit);
        assert!(over(&e, ask(1, None)).await, "no refund");
        clock.advance(Duration::from_secs(60));
        assert!(
            !e.decide(&ask(1_000_000_000_000_000, Some(false)))
                .await
                .unwrap()
                .over_limit
        );
        assert!(!over(&e, ask(1, None)).await, "no charge");
        let m = &e.rules()[0].metrics;
        assert_eq!(m.settlements_refused.load(Ordering::Relaxed), 2);
        assert_eq!(m.refunded.load(Ordering::Relaxed), 0);
    }

    /// `cost.min`: an ask stating less (Envoy's `x-max-tokens: 0`) holds `min`, so concurrent
    /// asks cannot pass uncounted; its refund gives back what it held.
    #[tokio::test]
    async fn asks_below_the_floor_hold_the_floor() {
        let yaml = "domain: llm\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10000, algorithm: gcra, burst: 2000, cost: {min: 500, max: 4000}}\n";
        let clock = Arc::new(weir_core::ManualClock::new(0));
        let e = on_clock(yaml, &clock);
        let admitted = {
            let mut n = 0;
            for _ in 0..50 {
                if !over(&e, ask(0, None)).await {
                    n += 1;
                }
            }
            n
        };
        assert_eq!(admitted, 4, "2 000 of burst in asks of 500");
        // Each refund of 0 gives back the 500 its ask held.
        assert!(!e.decide(&ask(0, Some(true))).await.unwrap().over_limit);
        assert!(!over(&e, ask(0, None)).await);
        assert!(over(&e, ask(0, None)).await);
    }

    #[test]
    fn wildcards() {
        assert_eq!(wildcard_match("pre*", "prefix"), Some(3));
        assert_eq!(wildcard_match("*fix", "prefix"), Some(3));
        assert_eq!(wildcard_match("p*f*x", "prefix"), Some(3));
        assert_eq!(wildcard_match("pre*", "pr"), None);
        assert_eq!(wildcard_match("plain", "plain"), None);
    }
}
