//! The metric families of `weir proxy`: the rules' counters and the proxy's own, reported to
//! the process's one registry ([`crate::admin::metrics`]).
//!
//! The rules engine keeps lock-free atomics on the call path; a scrape takes one
//! [`Snapshot`] and encodes it, so nothing is registered or looked up per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::admin::metrics::{counter, counters, gauges, histograms, Collector};
use prometheus_client::encoding::DescriptorEncoder;
use weir_rules::metrics::{ResourceSnapshot, RuleSnapshot, Snapshot};

use weir_rules::history::state_name;

/// One scrape's values.
#[derive(Debug)]
struct Scrape {
    snap: Snapshot,
    forwarded: u64,
    unreachable: u64,
    timeout: u64,
    busy: u64,
    too_slow: u64,
    loops: u64,
    lean: u64,
    handoffs: u64,
    applied: u64,
    rejected: u64,
    switch_changes: u64,
    gutter: Option<(weir_tower::gutter::GutterStats, [&'static str; 2])>,
}

type ResourceField = fn(&ResourceSnapshot) -> u64;
type RuleField = fn(&RuleSnapshot) -> u64;

const RESOURCE_COUNTERS: [(&str, &str, ResourceField); 7] = [
    (
        "weir_resource_passes",
        "Calls admitted to the resource.",
        |r| r.passes,
    ),
    (
        "weir_resource_blocks",
        "Calls blocked by any rule of the resource.",
        |r| r.blocks,
    ),
    (
        "weir_resource_errors",
        "Admitted calls that ended with an error (5xx).",
        |r| r.errors,
    ),
    (
        "weir_resource_fallbacks",
        "Blocked calls answered by the route's fallback (also in blocks).",
        |r| r.fallbacks,
    ),
    (
        "weir_resource_cost_admitted",
        "Units of cost held as estimates by calls admitted (cost rules).",
        |r| r.cost.admitted,
    ),
    (
        "weir_resource_cost_refunded",
        "Units given back when calls cost less than their estimates or failed (cost rules).",
        |r| r.cost.refunded,
    ),
    (
        "weir_resource_cost_owed",
        "Units charged beyond estimates when calls cost more: debts (cost rules).",
        |r| r.cost.owed,
    ),
];

const RULE_COUNTERS: [(&str, &str, RuleField); 7] = [
    ("weir_rule_passes", "Calls the rule let through.", |r| {
        r.passes
    }),
    ("weir_rule_blocks", "Calls the rule blocked.", |r| r.blocks),
    (
        "weir_rule_shadow_blocks",
        "Calls the rule would have blocked (shadow mode).",
        |r| r.shadow_blocks,
    ),
    (
        "weir_rule_evictions",
        "Tracked values evicted at the rule's bound.",
        |r| r.evictions,
    ),
    (
        "weir_rule_full",
        "Calls whose value found the rule's table full (on_full reject or allow).",
        |r| r.full,
    ),
    (
        "weir_rule_over_budget",
        "Calls a soft calendar budget admitted past its limit.",
        |r| r.over_budget,
    ),
    (
        "weir_rule_budget_warnings",
        "Warnings a calendar budget logged: a key reached a threshold of its limit (80 %, 100 %) first in its period; thresholds reached by one call count once.",
        |r| r.budget_warnings,
    ),
];

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.resources(&mut enc)?;
        for (name, help, field) in RULE_COUNTERS {
            let rows = self.snap.rules.iter().map(|r| {
                let labels = [
                    ("rule", r.id.as_str()),
                    ("kind", r.kind.as_str()),
                    ("resource", r.resource.as_str()),
                ];
                (labels, field(r))
            });
            counters(&mut enc, name, help, rows)?;
        }
        self.proxy(&mut enc)
    }
}

impl Scrape {
    /// The families per resource: counters, calls in flight, response times, heavy spenders.
    fn resources(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let resources = &self.snap.resources;
        for (name, help, field) in RESOURCE_COUNTERS {
            counters(
                enc,
                name,
                help,
                resources.iter().map(|r| (label(r), field(r))),
            )?;
        }
        gauges(
            enc,
            "weir_resource_in_flight",
            "Admitted calls not ended yet.",
            resources.iter().map(|r| (label(r), r.in_flight as f64)),
        )?;
        histograms(
            enc,
            "weir_resource_response_seconds",
            "Response time of admitted calls, until the response body ended.",
            resources
                .iter()
                .map(|r| (label(r), r.rt_sum.as_secs_f64(), per_bucket(&r.rt_buckets))),
        )?;
        // What each call used, as OpenTelemetry's GenAI semantic conventions record LLM token
        // usage (the OTLP export names it gen_ai.client.token.usage).
        histograms(
            enc,
            "gen_ai_client_token_usage",
            "Units each call of a resource with cost rules used, once known (tokens for LLM calls; calls abandoned before their cost was known are left out); gen_ai_token_type: what actual_from counts (input, output, total).",
            resources.iter().filter_map(|r| {
                let kind = r.cost.usage_kind?;
                let bounds = weir_rules::metrics::USAGE_BUCKETS
                    .iter()
                    .map(|&b| b as f64)
                    .chain([f64::INFINITY]);
                let buckets = bounds.zip(r.cost.usage.iter().copied()).collect();
                let labels = [("resource", r.name.as_str()), ("gen_ai_token_type", kind)];
                Some((labels, r.cost.usage_sum as f64, buckets))
            }),
        )?;
        // What is certain of each heavy spender's count, and beside it the sketch's possible
        // overcount (units of the values it replaced): one-off names cannot claim the top.
        for (name, help, of) in [
            (
                "weir_resource_cost_top_spender",
                "Units certainly charged to the resource's heaviest spenders (a hot-parameter value, else the origin; at most 10 per resource; a lower bound).",
                (|h| h.count - h.error) as fn(&weir_core::top_k::Heavy) -> u64,
            ),
            (
                "weir_resource_cost_top_spender_error",
                "How many more units a heavy spender may have been charged than weir_resource_cost_top_spender says (the sketch's possible overcount).",
                |h| h.error,
            ),
        ] {
            let rows = resources.iter().flat_map(|r| {
                r.cost.top.iter().map(move |h| {
                    let labels = [("resource", r.name.as_str()), ("spender", h.value.as_str())];
                    (labels, of(h) as f64)
                })
            });
            gauges(enc, name, help, rows)?;
        }
        Ok(())
    }

    /// The proxy's own families: forwarding, upstream errors, reloads, switches, the gutter.
    fn proxy(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        counter(
            enc,
            "weir_proxy_forwarded",
            "Requests answered by the upstream.",
            self.forwarded,
        )?;
        counters(
            enc,
            "weir_proxy_upstream_errors",
            "Requests not answered by the upstream (502 unreachable, 504 timeout, 503 busy: too many in flight, 508 loop, 408 body_too_slow: the request body did not keep arriving).",
            [
                ("unreachable", self.unreachable),
                ("timeout", self.timeout),
                ("busy", self.busy),
                ("loop", self.loops),
                ("body_too_slow", self.too_slow),
            ]
            .map(|(kind, v)| ([("kind", kind)], v)),
        )?;
        counter(
            enc,
            "weir_proxy_lean_requests",
            "HTTP/1.1 requests the proxy's lean path answered.",
            self.lean,
        )?;
        counter(
            enc,
            "weir_proxy_lean_handoffs",
            "Client connections hyper took over from the lean path, at the first request the lean path does not serve.",
            self.handoffs,
        )?;
        counters(
            enc,
            "weir_rules_reloads",
            "Rule file changes seen, by result.",
            [("applied", self.applied), ("rejected", self.rejected)]
                .map(|(result, v)| ([("result", result)], v)),
        )?;
        counter(
            enc,
            "weir_switch_changes",
            "Switches set over the admin API.",
            self.switch_changes,
        )?;
        let Some((g, states)) = &self.gutter else {
            return Ok(());
        };
        counters(
            enc,
            "weir_gutter_requests",
            "Requests by where the gutter sent them (primary, gutter, thrown_back: taken by the primary after the gutter refused, rejected: 503).",
            [
                ("primary", g.primary),
                ("gutter", g.gutter),
                ("thrown_back", g.thrown_back),
                ("rejected", g.rejected),
            ]
            .map(|(route, v)| ([("route", route)], v)),
        )?;
        gauges(
            enc,
            "weir_upstream_breaker_open",
            "1 while the upstream's breaker is not closed (open, half-open or ramping).",
            [("primary", states[0]), ("gutter", states[1])].map(|(upstream, state)| {
                (
                    [("upstream", upstream)],
                    f64::from(u8::from(state != "closed")),
                )
            }),
        )
    }
}

/// A resource's label set.
fn label(r: &ResourceSnapshot) -> [(&'static str, &str); 1] {
    [("resource", r.name.as_str())]
}

/// Per-bucket counts from cumulative ones (the encoder sums them again).
fn per_bucket(cumulative: &[(f64, u64)]) -> Vec<(f64, u64)> {
    let mut prev = 0;
    cumulative
        .iter()
        .map(|&(le, c)| {
            let n = c - prev;
            prev = c;
            (le, n)
        })
        .collect()
}

/// Counters of the proxy itself (beside the rules' own).
#[derive(Default)]
pub struct ProxyStats {
    /// Striped per thread: every forwarded request counts it.
    pub(super) forwarded: weir_core::striped::StripedCounter,
    pub(super) upstream_unreachable: AtomicU64,
    pub(super) upstream_timeout: AtomicU64,
    pub(super) upstream_busy: AtomicU64,
    pub(super) body_too_slow: AtomicU64,
    pub(super) loops: AtomicU64,
    /// Requests the lean HTTP/1.1 path answered (striped per thread).
    pub(super) lean_requests: weir_core::striped::StripedCounter,
    /// Connections hyper took over from the lean path.
    pub(super) lean_handoffs: AtomicU64,
    pub(super) reloads_applied: AtomicU64,
    pub(super) reloads_rejected: AtomicU64,
    pub(super) switch_changes: Arc<AtomicU64>,
    /// The gutter's decisions and breakers, when there is one.
    pub(super) gutter: std::sync::OnceLock<weir_tower::gutter::Gutter<(), ()>>,
}

/// The proxy's collector: its rules and its own counters, read at each scrape.
pub struct ProxyCollector {
    /// The rules in force.
    pub rules: std::sync::Arc<weir_rules::engine::Rules<weir_core::AnyClock>>,
    /// The proxy's counters.
    pub stats: std::sync::Arc<ProxyStats>,
}

impl std::fmt::Debug for ProxyCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyCollector").finish_non_exhaustive()
    }
}

impl Collector for ProxyCollector {
    fn encode(&self, enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        scrape(self.rules.snapshot(), &self.stats).encode(enc)
    }
}

/// One scrape of `snap` and `proxy`.
fn scrape(snap: Snapshot, proxy: &ProxyStats) -> Scrape {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Scrape {
        snap,
        forwarded: proxy.forwarded.get(),
        unreachable: load(&proxy.upstream_unreachable),
        timeout: load(&proxy.upstream_timeout),
        busy: load(&proxy.upstream_busy),
        too_slow: load(&proxy.body_too_slow),
        loops: load(&proxy.loops),
        lean: proxy.lean_requests.get(),
        handoffs: load(&proxy.lean_handoffs),
        applied: load(&proxy.reloads_applied),
        rejected: load(&proxy.reloads_rejected),
        switch_changes: load(&proxy.switch_changes),
        gutter: proxy.gutter.get().map(|g| {
            let (p, q) = g.states();
            (g.stats(), [state_name(p), state_name(q)])
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use weir_rules::metrics::RuleKind;

    #[test]
    fn families_histograms_and_escaped_labels() {
        let snap = Snapshot {
            resources: vec![ResourceSnapshot {
                name: "a\"b".into(),
                passes: 3,
                blocks: 1,
                blocked_by: [1, 0, 0, 0, 0, 0],
                shadow_blocks: 0,
                in_flight: 1,
                completed: 2,
                errors: 0,
                fallbacks: 0,
                rt_buckets: vec![(0.001, 1), (0.01, 2), (f64::INFINITY, 2)],
                rt_sum: Duration::from_millis(5),
                cost: weir_rules::metrics::CostSnapshot {
                    admitted: 700,
                    refunded: 200,
                    owed: 50,
                    top: vec![weir_core::top_k::Heavy {
                        value: "ann".into(),
                        count: 550,
                        error: 30,
                    }],
                    usage: {
                        // Two calls of 3 and 40 units (buckets ≤ 4 and ≤ 64).
                        let mut u = vec![0; weir_rules::metrics::USAGE_BUCKETS.len() + 1];
                        u[1] = 1;
                        u[3] = 1;
                        u
                    },
                    usage_sum: 43,
                    usage_kind: Some("output"),
                },
            }],
            rules: vec![RuleSnapshot {
                id: "r".into(),
                kind: RuleKind::Flow,
                resource: "a\"b".into(),
                passes: 3,
                blocks: 1,
                shadow_blocks: 0,
                evictions: 0,
                full: 0,
                over_budget: 0,
                budget_warnings: 0,
            }],
            ..Snapshot::default()
        };
        let registry = crate::admin::metrics::Metrics::new();
        registry.register(scrape(snap, &ProxyStats::default()));
        let text = registry.render();
        for line in [
            "weir_resource_passes_total{resource=\"a\\\"b\"} 3",
            "weir_resource_in_flight{resource=\"a\\\"b\"} 1",
            "weir_resource_response_seconds_bucket{le=\"0.001\",resource=\"a\\\"b\"} 1",
            "weir_resource_response_seconds_bucket{le=\"0.01\",resource=\"a\\\"b\"} 2",
            "weir_resource_response_seconds_bucket{le=\"+Inf\",resource=\"a\\\"b\"} 2",
            "weir_resource_response_seconds_count{resource=\"a\\\"b\"} 2",
            "weir_rule_blocks_total{rule=\"r\",kind=\"flow\",resource=\"a\\\"b\"} 1",
            "weir_rules_reloads_total{result=\"applied\"} 0",
            "weir_resource_cost_admitted_total{resource=\"a\\\"b\"} 700",
            "weir_resource_cost_refunded_total{resource=\"a\\\"b\"} 200",
            "weir_resource_cost_owed_total{resource=\"a\\\"b\"} 50",
            "weir_resource_cost_top_spender{resource=\"a\\\"b\",spender=\"ann\"} 520",
            "weir_resource_cost_top_spender_error{resource=\"a\\\"b\",spender=\"ann\"} 30",
            "gen_ai_client_token_usage_bucket{le=\"1.0\",resource=\"a\\\"b\",gen_ai_token_type=\"output\"} 0",
            "gen_ai_client_token_usage_bucket{le=\"4.0\",resource=\"a\\\"b\",gen_ai_token_type=\"output\"} 1",
            "gen_ai_client_token_usage_bucket{le=\"64.0\",resource=\"a\\\"b\",gen_ai_token_type=\"output\"} 2",
            "gen_ai_client_token_usage_sum{resource=\"a\\\"b\",gen_ai_token_type=\"output\"} 43.0",
            "gen_ai_client_token_usage_count{resource=\"a\\\"b\",gen_ai_token_type=\"output\"} 2",
            "# EOF",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
