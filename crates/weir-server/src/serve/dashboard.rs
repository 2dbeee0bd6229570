//! `weir serve`'s dashboard source: one row per descriptor rule (hits passed, over the limit,
//! shadow), the descriptor values over the limit most often per rule, the store's health
//! (Redis or the local fallback, with its switches), the configuration and its last reload,
//! and the cluster-quota allocation table when the lease API is served.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use weir_rules::metrics::{HeavySnapshot, ResourceSnapshot, RuleKind};
use weir_tower::dashboard::{unix_now, Dashboard, Sample, Source};

use crate::quota::api::QuotaApi;
use crate::rls::Service;

/// Store state changes kept.
const MAX_STORE_TRANSITIONS: usize = 64;

/// The dashboard of a `weir serve` process.
pub(crate) fn dashboard(service: Arc<Service>, quota: Option<Arc<QuotaApi>>) -> Arc<Dashboard> {
    Dashboard::new(
        "weir serve",
        "rules",
        ServeSource {
            service,
            quota,
            store: Mutex::new((None, VecDeque::new())),
        },
    )
}

/// A store switch: Unix second, from, to.
type StoreChange = (u64, &'static str, &'static str);

struct ServeSource {
    service: Arc<Service>,
    /// The lease server served beside it, whose allocation table the dashboard shows.
    quota: Option<Arc<QuotaApi>>,
    /// The store's last seen state and its changes.
    store: Mutex<(Option<&'static str>, VecDeque<StoreChange>)>,
}

impl ServeSource {
    fn store(&self) -> Value {
        let store = self.service.store();
        let Some(s) = store.fallback_status() else {
            return json!({"store": store.name()});
        };
        let now = if s.on_redis { "redis" } else { "fallback" };
        let mut seen = self.store.lock();
        if let Some(before) = seen.0.filter(|b| *b != now) {
            if seen.1.len() == MAX_STORE_TRANSITIONS {
                seen.1.pop_front();
            }
            seen.1.push_back((unix_now(), before, now));
        }
        seen.0 = Some(now);
        let transitions: Vec<Value> = seen
            .1
            .iter()
            .map(|(t, from, to)| json!({"t": t, "from": from, "to": to}))
            .collect();
        json!({
            "store": now,
            "to_fallback": s.to_fallback,
            "to_redis": s.to_redis,
            "fallback_decisions": s.fallback_decisions,
            "errors": s.errors,
            "cache_hits": s.cache_hits,
            "transitions": transitions,
        })
    }
}

impl Source for ServeSource {
    fn sample(&self) -> Sample {
        let engine = self.service.engine();
        let mut resources = Vec::new();
        let mut heavy = Vec::new();
        let mut rows = Vec::new();
        for r in engine.rules() {
            let c = &r.counts;
            let hits = c.hits.load(Ordering::Relaxed);
            let over = c.over_limit.load(Ordering::Relaxed).min(hits);
            let mut blocked_by = [0; RuleKind::COUNT];
            blocked_by[RuleKind::Flow as usize] = over;
            resources.push(ResourceSnapshot {
                name: r.id.clone(),
                passes: hits - over,
                blocks: over,
                blocked_by,
                shadow_blocks: c.shadow_over_limit.load(Ordering::Relaxed),
                in_flight: 0,
                completed: 0,
                errors: 0,
                fallbacks: 0,
                rt_buckets: Vec::new(),
                rt_sum: std::time::Duration::ZERO,
                cost: Default::default(),
            });
            heavy.push(HeavySnapshot {
                rule: r.id.clone(),
                resource: String::new(),
                top: c.top.lock().top(),
            });
            let limit = if r.limit.unlimited {
                "unlimited".to_string()
            } else {
                format!(
                    "{} per {}",
                    r.limit.requests_per_unit,
                    weir_core::duration::format(r.limit.window)
                )
            };
            rows.push(json!({
                "rule": r.id,
                "limit": limit,
                "algorithm": r.limit.algorithm.as_str(),
                "name": r.limit.name,
                "shadow": r.shadow,
            }));
        }
        let mut config = Map::new();
        config.insert(
            "file".into(),
            json!(self.service.config_path().map_or_else(
                || "the bundled example".to_string(),
                |p| p.display().to_string()
            )),
        );
        config.insert("rules".into(), Value::Array(rows));
        let mut info = Map::new();
        // Rows are decisions, not calls: no errors, in flight or response times to show.
        info.insert("decisions_only".into(), Value::Bool(true));
        info.insert("config".into(), Value::Object(config));
        info.insert("store".into(), self.store());
        if let Some(q) = &self.quota {
            info.insert("quota".into(), Value::Array(q.table()));
        }
        Sample {
            resources,
            heavy,
            info,
            reload: self.service.last_reload(),
            ..Sample::default()
        }
    }
}
