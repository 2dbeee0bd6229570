//! A live dashboard: what is passed, blocked, shed and broken, second by second, on a page
//! every Weir process can serve itself.
//!
//! A [`Dashboard`] samples a [`Source`] once a second (a rule set, or anything that can state
//! per-resource counters in weir-rules' [`ResourceSnapshot`] shape: `weir serve` does so per
//! descriptor rule), keeps the last five minutes in a [`History`] ring, and serves
//!
//! - `GET /` — the page: plain HTML, CSS and JavaScript embedded in the binary, with
//!   self-drawn SVG charts, polling the API once a second; no build step, no CDN.
//! - `GET /api/v1/dashboard?since=T` — everything the page shows as JSON; with `since`, only
//!   the seconds after `T` (Unix seconds), so a poll costs a few hundred bytes.
//!
//! Read-only. [`Dashboard::router`] takes an optional token: with one, the API answers 401
//! unless the request carries `Authorization: Bearer TOKEN` (the page itself holds no data
//! and asks for the token). The sampler reads the same atomics as `/metrics`; the decision
//! path does no extra work for the dashboard.
//!
//! ```no_run
//! # async fn run() {
//! use std::sync::Arc;
//! use weir_rules::config::RuleSet;
//! use weir_rules::engine::Rules;
//! use weir_tower::dashboard::Dashboard;
//!
//! let set = RuleSet::from_yaml(std::path::Path::new("rules.yaml"),
//!     "resources:\n  - name: api\n    flow:\n      - {id: api-qps, qps: 100}\n").unwrap();
//! let rules = Arc::new(Rules::new(&set).unwrap());
//! let dashboard = Dashboard::for_rules("my service", rules.clone(), None);
//! dashboard.spawn_sampler();
//! let admin: axum::Router = dashboard.router(None);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9901").await.unwrap();
//! axum::serve(listener, admin).await.unwrap();
//! # }
//! ```

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{json, Map, Value};
use weir_core::clock::Clock;
use weir_rules::engine::Rules;
use weir_rules::history::{History, Point, DEFAULT_SECONDS};
use weir_rules::metrics::{
    BreakerSnapshot, CostSnapshot, HeavySnapshot, ResourceSnapshot, SystemSnapshot,
};

/// Most rows (resources or rules) in one answer: the busiest, by blocked then passed calls
/// over the window; the rest are counted in `omitted`.
pub const MAX_ROWS: usize = 200;

/// Where the JSON API is served.
pub const API_PATH: &str = "/api/v1/dashboard";

/// The page (HTML with its CSS and JavaScript inline).
pub const PAGE: &str = include_str!("dashboard.html");

/// What a [`Source`] reports each second.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Cumulative counters per resource (or per rule: whatever the page's rows are).
    pub resources: Vec<ResourceSnapshot>,
    /// Circuit breakers and their states.
    pub breakers: Vec<BreakerSnapshot>,
    /// Heavy hitters: the values blocked most, per rule.
    pub heavy: Vec<HeavySnapshot>,
    /// System protection, if any.
    pub system: Option<SystemSnapshot>,
    /// Anything else the page shows as tables or facts: `config` (`file`, `rules`: rows),
    /// `store` (facts and `transitions`), `quota` (rows). Kept as given.
    pub info: Map<String, Value>,
    /// The last configuration reload, when the source knows it (else what
    /// [`Dashboard::note_reload`] was told).
    pub reload: Option<Reload>,
    /// `resources`, `breakers` and `heavy` list only what changed since the last sample (the
    /// rest had an idle second), and an empty `info` means unchanged: a sample then costs
    /// what changed, however large the configuration.
    pub changed_only: bool,
    /// With `changed_only`: every resource and rule in force, given when they changed since
    /// the last sample (the history forgets the others).
    pub members: Option<Members>,
}

/// The resources and rules in force (see [`Sample::members`]).
#[derive(Debug, Clone, Default)]
pub struct Members {
    /// Resource names.
    pub resources: std::collections::HashSet<String>,
    /// Breaker and hot-parameter rule ids.
    pub rules: std::collections::HashSet<String>,
}

/// Whatever the dashboard shows: called once a second by the sampler.
pub trait Source: Send + Sync + 'static {
    /// The counters now.
    fn sample(&self) -> Sample;
}

impl<F: Fn() -> Sample + Send + Sync + 'static> Source for F {
    fn sample(&self) -> Sample {
        self()
    }
}

/// A rule set as a [`Source`]: its snapshot, and its rules as the `config` table (rebuilt only
/// when the rule set changes).
pub struct RulesSource<C: Clock + Clone> {
    rules: Arc<Rules<C>>,
    file: Option<PathBuf>,
    /// The rule set's generation at the last sample.
    /// The rules' generation and run-time switch states last reported (the table is sent
    /// again when either changes).
    generation: Mutex<(u64, std::collections::HashMap<String, bool>)>,
}

impl<C: Clock + Clone> RulesSource<C> {
    /// Reports `rules`, loaded from `file` if given.
    pub fn new(rules: Arc<Rules<C>>, file: Option<PathBuf>) -> Self {
        Self {
            rules,
            file,
            generation: Mutex::new((u64::MAX, std::collections::HashMap::new())),
        }
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> Source for RulesSource<C> {
    /// What changed since the last second ([`Rules::changed_snapshot`]); the configuration
    /// table and the members only after a reload.
    fn sample(&self) -> Sample {
        // A reload, or a switch set at run time, changes what the configuration table shows.
        let generation = self.rules.generation();
        let overrides = self.rules.switch_overrides();
        let changed = {
            let mut last = self.generation.lock();
            let changed = last.0 != generation || last.1 != overrides;
            if changed {
                *last = (generation, overrides.clone());
            }
            changed
        };
        let snap = self.rules.changed_snapshot();
        let mut sample = Sample {
            resources: snap.resources,
            breakers: snap.breakers,
            heavy: snap.heavy,
            system: snap.system,
            changed_only: true,
            ..Sample::default()
        };
        if changed {
            let set = self.rules.rule_set();
            let rows = weir_rules::describe::rows_in_force(&set, &overrides);
            let mut config = Map::new();
            if let Some(f) = &self.file {
                config.insert("file".into(), json!(f.display().to_string()));
            }
            config.insert(
                "rules".into(),
                serde_json::to_value(&rows).unwrap_or_default(),
            );
            sample.info.insert("config".into(), Value::Object(config));
            sample.members = Some(Members {
                resources: self.rules.resource_names().into_iter().collect(),
                rules: rows
                    .into_iter()
                    .filter(|r| r.kind == "breaker" || r.kind == "hot_param")
                    .map(|r| r.id)
                    .collect(),
            });
        }
        sample
    }
}

/// The system protection during one second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SystemPoint {
    /// The second (Unix time).
    pub t: u64,
    /// CPU usage 0..1, if read.
    pub cpu: Option<f64>,
    /// Inbound calls in flight.
    pub in_flight: u64,
    /// BBR's limit on calls in flight.
    pub bbr_limit: Option<u64>,
    /// The adaptive limiter's limit.
    pub adaptive_limit: Option<u64>,
}

/// The last reload of the configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reload {
    /// When (Unix seconds).
    pub t: u64,
    /// Whether the new configuration was applied.
    pub ok: bool,
    /// Why not (with file, line and column), when rejected.
    pub error: Option<String>,
}

struct State {
    history: History,
    system: VecDeque<SystemPoint>,
    /// The last sample (its `resources`, `breakers` and `heavy` taken into the fields here).
    latest: Sample,
    /// Heavy hitters per rule, as last reported.
    heavy: std::collections::BTreeMap<String, HeavySnapshot>,
    /// What calls cost, per resource with `cost:` rules, as last reported.
    costs: std::collections::BTreeMap<String, CostSnapshot>,
    reload: Option<Reload>,
}

/// A live dashboard over one [`Source`] (see the module documentation).
pub struct Dashboard {
    title: String,
    label: String,
    started: u64,
    source: Box<dyn Source>,
    state: Mutex<State>,
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Dashboard {
    /// A dashboard titled `title` whose rows are called `label` (e.g. "resources", "rules"),
    /// keeping five minutes.
    /// The source is sampled at once: the first second shown counts from here.
    pub fn new(title: &str, label: &str, source: impl Source) -> Arc<Self> {
        let me = Arc::new(Self {
            title: title.to_string(),
            label: label.to_string(),
            started: unix_now(),
            source: Box::new(source),
            state: Mutex::new(State {
                history: History::new(DEFAULT_SECONDS),
                system: VecDeque::new(),
                latest: Sample::default(),
                heavy: std::collections::BTreeMap::new(),
                costs: std::collections::BTreeMap::new(),
                reload: None,
            }),
        });
        me.sample_at(me.started);
        me
    }

    /// A dashboard of a rule set loaded from `file`.
    pub fn for_rules<C: Clock + Clone + Send + Sync + 'static>(
        title: &str,
        rules: Arc<Rules<C>>,
        file: Option<PathBuf>,
    ) -> Arc<Self> {
        Self::new(title, "resources", RulesSource::new(rules, file))
    }

    /// Samples the source as the second ending at `t` (Unix seconds). The sampler calls this
    /// once a second; tests may call it with their own seconds.
    pub fn sample_at(&self, t: u64) {
        let mut sample = self.source.sample();
        let resources = std::mem::take(&mut sample.resources);
        let breakers = std::mem::take(&mut sample.breakers);
        let heavy = std::mem::take(&mut sample.heavy);
        let costs: Vec<(String, CostSnapshot)> = resources
            .iter()
            .filter(|r| !r.cost.is_empty())
            .map(|r| (r.name.clone(), r.cost.clone()))
            .collect();
        let mut st = self.state.lock();
        let first = st.history.last_second().is_none();
        if !sample.changed_only {
            st.costs.clear();
        }
        st.costs.extend(costs);
        if sample.changed_only {
            if let Some(m) = sample.members.take() {
                st.history
                    .retain(|r| m.resources.contains(r), |b| m.rules.contains(b));
                st.heavy.retain(|rule, _| m.rules.contains(rule));
                st.costs.retain(|r, _| m.resources.contains(r));
            }
            st.history.record_changed(t, resources, &breakers);
            for h in heavy {
                st.heavy.insert(h.rule.clone(), h);
            }
            if sample.info.is_empty() {
                sample.info = std::mem::take(&mut st.latest.info);
            }
        } else {
            st.history.record(t, resources, &breakers);
            st.heavy = heavy.into_iter().map(|h| (h.rule.clone(), h)).collect();
        }
        if let Some(s) = &sample.system {
            if !first && st.system.back().is_none_or(|p| p.t < t) {
                if st.system.len() == st.history.seconds() {
                    st.system.pop_front();
                }
                st.system.push_back(SystemPoint {
                    t,
                    cpu: s.cpu,
                    in_flight: s.in_flight,
                    bbr_limit: s.bbr_limit,
                    adaptive_limit: s.adaptive_limit,
                });
            }
        } else {
            st.system.clear();
        }
        if let Some(r) = sample.reload.take() {
            st.reload = Some(r);
        }
        st.latest = sample;
    }

    /// Records the result of a configuration reload (shown until the next one).
    pub fn note_reload(&self, result: Result<(), String>) {
        self.state.lock().reload = Some(Reload {
            t: unix_now(),
            ok: result.is_ok(),
            error: result.err(),
        });
    }

    /// Starts sampling once a second, just after each whole second, on the current tokio
    /// runtime; the task ends when the dashboard is dropped.
    pub fn spawn_sampler(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                let to_next = Duration::from_secs(1)
                    .saturating_sub(Duration::from_nanos(u64::from(now.subsec_nanos())));
                tokio::time::sleep(to_next + Duration::from_millis(5)).await;
                let Some(me) = weak.upgrade() else { return };
                me.sample_at(unix_now());
            }
        })
    }

    /// Everything the page shows, with the seconds after `since` (all with 0).
    pub fn json(&self, since: u64) -> Value {
        let st = self.state.lock();
        // The busiest rows first (blocked, then passed, over the window), at most MAX_ROWS:
        // a configuration of thousands of rules still answers in bounded time and size.
        let mut rows: Vec<(u64, u64, &str)> = st
            .history
            .resources()
            .map(|(name, points)| {
                let (blocked, passed) = points.fold((0u64, 0u64), |(b, p), x: &Point| {
                    (b + u64::from(x.blocked), p + u64::from(x.passed))
                });
                (blocked, passed, name)
            })
            .collect();
        let omitted = rows.len().saturating_sub(MAX_ROWS);
        if omitted > 0 {
            rows.select_nth_unstable_by(MAX_ROWS - 1, |a, b| (b.0, b.1).cmp(&(a.0, a.1)));
            rows.truncate(MAX_ROWS);
            rows.sort_by(|a, b| a.2.cmp(b.2));
        }
        let shown: std::collections::HashSet<&str> = rows.iter().map(|r| r.2).collect();
        let resources: Vec<Value> = rows
            .iter()
            .map(|(_, _, name)| {
                json!({"name": name, "points": st.history.points_since(name, since)})
            })
            .collect();
        // Breakers and heavy hitters of the resources shown, at most MAX_ROWS of each.
        let breakers: Vec<_> = st
            .history
            .breakers()
            .filter(|b| omitted == 0 || shown.contains(b.resource.as_str()))
            .take(MAX_ROWS)
            .collect();
        let heavy: Vec<Value> = st
            .heavy
            .values()
            .filter(|h| omitted == 0 || shown.contains(h.resource.as_str()))
            .take(MAX_ROWS)
            .map(|h| {
                let top: Vec<Value> = h
                    .top
                    .iter()
                    .map(|e| json!({"value": e.value, "count": e.count, "error": e.error}))
                    .collect();
                json!({"rule": h.rule, "resource": h.resource, "top": top})
            })
            .collect();
        // What calls cost, and who spent most, for the resources shown.
        let costs: Vec<Value> = st
            .costs
            .iter()
            .filter(|(r, _)| omitted == 0 || shown.contains(r.as_str()))
            .take(MAX_ROWS)
            .map(|(r, c)| {
                // By what is certain (count less the sketch's possible overcount): one-off
                // spenders cannot lift a name to the top.
                let mut heavy: Vec<&weir_core::top_k::Heavy> = c.top.iter().collect();
                heavy.sort_by_key(|e| std::cmp::Reverse(e.count - e.error));
                let top: Vec<Value> = heavy
                    .iter()
                    .map(|e| {
                        json!({"value": e.value, "count": e.count, "error": e.error,
                               "certain": e.count - e.error})
                    })
                    .collect();
                json!({"resource": r, "admitted": c.admitted, "refunded": c.refunded,
                       "owed": c.owed, "top": top})
            })
            .collect();
        let system = st.latest.system.as_ref().map(|s| {
            let points: Vec<_> = st.system.iter().filter(|p| p.t > since).collect();
            json!({
                "now": {
                    "cpu": s.cpu, "in_flight": s.in_flight, "max_in_flight": s.max_in_flight,
                    "max_cpu": s.max_cpu, "bbr_limit": s.bbr_limit,
                    "adaptive_limit": s.adaptive_limit, "adaptive_in_flight": s.adaptive_in_flight,
                },
                "points": points,
            })
        });
        json!({
            "version": 1,
            "title": self.title,
            "label": self.label,
            "now": st.history.last_second().unwrap_or_else(unix_now),
            "started": self.started,
            "seconds": st.history.seconds(),
            "resources": resources,
            "omitted": omitted,
            "breakers": breakers,
            "heavy": heavy,
            "costs": costs,
            "system": system,
            "reload": st.reload,
            "info": bounded_info(&st.latest.info, &shown),
        })
    }

    /// `GET /api/v1/dashboard` alone (to mount beside other admin routes behind the same
    /// token, see [`require_bearer`]).
    pub fn api_router(self: &Arc<Self>) -> Router {
        let me = self.clone();
        Router::new().route(
            API_PATH,
            get(move |req: Request| {
                let since = since(req.uri().query());
                let body = serde_json::to_vec(&me.json(since)).unwrap_or_default();
                async move {
                    (
                        [
                            (header::CONTENT_TYPE, "application/json"),
                            (header::CACHE_CONTROL, "no-store"),
                        ],
                        body,
                    )
                }
            }),
        )
    }

    /// The page and the API, the API behind `token` when given.
    pub fn router(self: &Arc<Self>, token: Option<&str>) -> Router {
        require_bearer(self.api_router(), token).merge(page_router())
    }
}

/// `GET /`: the page (static: it holds no data, so it is served without the token).
pub fn page_router() -> Router {
    Router::new().route(
        "/",
        get(|| async {
            (
                [
                    (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                    (header::CACHE_CONTROL, "no-cache"),
                ],
                PAGE,
            )
        }),
    )
}

/// `info` with its `config.rules` rows cut to those of the `shown` resources when there are
/// more than [`MAX_ROWS`] (then `config.rules_omitted` counts the others): a file of tens of
/// thousands of rules still answers in bounded time and size.
fn bounded_info(info: &Map<String, Value>, shown: &std::collections::HashSet<&str>) -> Value {
    let mut out = Map::new();
    for (k, v) in info {
        let rules = v.get("rules").and_then(Value::as_array);
        match (k.as_str(), rules) {
            ("config", Some(rules)) if rules.len() > MAX_ROWS => {
                // Every field but the rules, which are filtered (never copied whole).
                let mut config: Map<String, Value> = v
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| k.as_str() != "rules")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let kept: Vec<Value> = rules
                    .iter()
                    .filter(|r| {
                        r.get("resource")
                            .and_then(Value::as_str)
                            .is_some_and(|n| shown.contains(n))
                    })
                    .take(4 * MAX_ROWS)
                    .cloned()
                    .collect();
                config.insert("rules_omitted".into(), json!(rules.len() - kept.len()));
                config.insert("rules".into(), Value::Array(kept));
                out.insert(k.clone(), Value::Object(config));
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// The `since` query parameter (0 when absent or not a number).
fn since(query: Option<&str>) -> u64 {
    query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("since="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Every route of `router` answers 401 unless the request carries
/// `Authorization: Bearer TOKEN` (the scheme in any case, as RFC 9110 has it; the token
/// compared in constant time); no token: unchanged.
pub fn require_bearer(router: Router, token: Option<&str>) -> Router {
    let Some(token) = token else { return router };
    let expected: Arc<[u8]> = Arc::from(token.as_bytes());
    router.route_layer(axum::middleware::from_fn(
        move |req: Request, next: Next| {
            let expected = expected.clone();
            async move {
                let token = bearer_token(req.headers()).unwrap_or(&[]);
                if !token.is_empty() && constant_time_eq(token, &expected) {
                    next.run(req).await
                } else {
                    unauthorized()
                }
            }
        },
    ))
}

/// The token of an `Authorization: Bearer TOKEN` header (the scheme in any case, as RFC 9110
/// has it), if the request has one.
pub fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&[u8]> {
    let given = headers
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes)?;
    given
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
        .map(|_| &given[7..])
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "401 Unauthorized: send Authorization: Bearer TOKEN (the --admin-token)\n",
    )
        .into_response()
}

/// Equality whose time depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_reads_the_query() {
        assert_eq!(since(Some("since=1700000000")), 1_700_000_000);
        assert_eq!(since(Some("x=1&since=5")), 5);
        assert_eq!(since(Some("since=abc")), 0);
        assert_eq!(since(None), 0);
    }

    #[test]
    fn at_most_max_rows_are_sent_the_busiest_kept() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let tick = Arc::new(AtomicU64::new(0));
        let t = tick.clone();
        let source = move || {
            let n = t.load(Ordering::Relaxed);
            let resources = (0..MAX_ROWS + 50)
                .map(|i| ResourceSnapshot {
                    name: format!("r{i:03}"),
                    // r249 is the only one that blocks; the rest pass i calls a second.
                    passes: n * i as u64,
                    blocks: if i == MAX_ROWS + 49 { n } else { 0 },
                    blocked_by: [0; 6],
                    shadow_blocks: 0,
                    in_flight: 0,
                    completed: 0,
                    errors: 0,
                    fallbacks: 0,
                    rt_buckets: Vec::new(),
                    rt_sum: Duration::ZERO,
                    cost: CostSnapshot::default(),
                })
                .collect();
            Sample {
                resources,
                ..Sample::default()
            }
        };
        let d = Dashboard::new("t", "rules", source);
        tick.store(1, Ordering::Relaxed);
        d.sample_at(unix_now() + 1);
        let v = d.json(0);
        let names: Vec<&str> = v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names.len(), MAX_ROWS);
        assert_eq!(v["omitted"], 50);
        // The blocking row and the busiest passing ones, in name order.
        assert_eq!(names[0], "r050");
        assert_eq!(names[MAX_ROWS - 1], "r249");
    }

    #[test]
    fn a_large_rule_set_is_sampled_by_what_changed_and_answered_bounded() {
        let text: String = (0..2_000)
            .map(|i| format!("  - name: r{i:04}\n    flow:\n      - {{id: f{i:04}, qps: 1000}}\n"))
            .collect();
        let set = weir_rules::config::RuleSet::from_yaml(
            std::path::Path::new("big.yaml"),
            &format!("resources:\n{text}"),
        )
        .unwrap();
        let rules = Arc::new(Rules::new(&set).unwrap());
        let d = Dashboard::for_rules("t", rules.clone(), None);
        let ctx = weir_rules::engine::Context::default();
        for _ in 0..3 {
            rules
                .entry("r1234", &ctx)
                .unwrap()
                .complete(weir_core::stats::Outcome::Success);
        }
        d.sample_at(d.started + 1);
        let v = d.json(0);
        assert_eq!(v["resources"].as_array().unwrap().len(), MAX_ROWS);
        assert_eq!(v["omitted"], 2_000 - MAX_ROWS);
        assert_eq!(
            v["resources"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["name"] == "r1234")
                .count(),
            1
        );
        // The configuration table holds the rules of the resources shown, the rest counted.
        let config = &v["info"]["config"];
        let shown = config["rules"].as_array().unwrap().len();
        assert!(shown <= MAX_ROWS, "{shown}");
        assert_eq!(config["rules_omitted"], 2_000 - shown);
        // A second with no call changes no series.
        d.sample_at(d.started + 2);
        let points = &d.json(d.started + 1)["resources"];
        let busy = points
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "r1234")
            .unwrap();
        assert_eq!(busy["points"][0]["passed"], 0);
    }

    /// A resource with `cost:` rules shows what its calls cost and who spent most.
    #[test]
    fn costs_and_spenders_are_shown() {
        let set = weir_rules::config::RuleSet::from_yaml(
            std::path::Path::new("llm.yaml"),
            "resources:\n  - name: llm\n    hot_params:\n      - {id: per-user, param: 0, threshold: 10000, window: 1m, algorithm: gcra, cost: {estimate: 100}}\n  - name: plain\n    flow:\n      - {id: q, qps: 10}\n",
        )
        .unwrap();
        let rules = Arc::new(Rules::new(&set).unwrap());
        let d = Dashboard::for_rules("t", rules.clone(), None);
        for (user, estimate, actual) in [("ann", 500, 200), ("bob", 100, 900), ("ann", 300, 300)] {
            let ctx = weir_rules::engine::Context {
                params: &[user],
                cost: Some(estimate),
                ..Default::default()
            };
            let mut g = rules.entry("llm", &ctx).unwrap();
            g.settle_cost(actual);
            g.complete(weir_core::stats::Outcome::Success);
        }
        rules
            .entry("plain", &weir_rules::engine::Context::default())
            .unwrap()
            .complete(weir_core::stats::Outcome::Success);
        d.sample_at(d.started + 1);
        let v = d.json(0);
        let costs = v["costs"].as_array().unwrap();
        assert_eq!(costs.len(), 1, "only resources with cost rules: {costs:?}");
        let c = &costs[0];
        assert_eq!(c["resource"], "llm");
        assert_eq!(
            (
                c["admitted"].as_u64(),
                c["refunded"].as_u64(),
                c["owed"].as_u64()
            ),
            (Some(900), Some(300), Some(800))
        );
        let top: Vec<(&str, u64)> = c["top"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["value"].as_str().unwrap(), e["count"].as_u64().unwrap()))
            .collect();
        assert_eq!(top, [("bob", 900), ("ann", 500)]);
        assert!(PAGE.contains("data-cost="), "the page draws them");
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"Bearer t0k", b"Bearer t0k"));
        assert!(!constant_time_eq(b"Bearer t0", b"Bearer t0k"));
        assert!(!constant_time_eq(b"Bearer t0j", b"Bearer t0k"));
    }
}
