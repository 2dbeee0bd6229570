//! The rate-limit service's metric families, read from its counters at each scrape (the
//! names are Lyft-style `weir_rls_*`; see docs/serve.md): per rule label the hits, over-limit,
//! near-limit and shadow over-limit counts; bad requests; reloads; the decision latency; the
//! store's fallback state when it has one; and the request bodies buffered.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::admin::metrics::{counter, counters, gauge, Collector, Encoder};
use crate::net::budget::Budget;

use super::service::Service;

/// The service's collector (holds the service weakly: a dropped service reports none).
#[derive(Debug)]
pub struct RlsCollector(pub Weak<Service>);

const RULE_FAMILIES: [(&str, &str); 7] = [
    ("weir_rls_hits", "Hits counted, by rule (or value) label."),
    ("weir_rls_over_limit", "Hits answered OVER_LIMIT."),
    (
        "weir_rls_near_limit",
        "Hits let through with less than a tenth of the limit left.",
    ),
    (
        "weir_rls_shadow_over_limit",
        "Hits over the limit in shadow mode (answered OK).",
    ),
    (
        "weir_rls_refunded_units",
        "Units given back by settlements (is_negative_hits) on rules with cost.",
    ),
    (
        "weir_rls_charged_units",
        "Units charged by settlements (weir_cost=settle) on rules with cost, whatever the limit.",
    ),
    (
        "weir_rls_settlements_refused",
        "Settlements refused in whole or part: the rule has no cost, or a refund passed what the key's asks charged.",
    ),
];

impl Collector for RlsCollector {
    fn encode(&self, mut enc: Encoder) -> std::fmt::Result {
        let Some(service) = self.0.upgrade() else {
            return Ok(());
        };
        let engine = service.engine();
        // One series per label: a per-value label two rules share adds up, as one counter.
        let mut rules: BTreeMap<String, [u64; 7]> = BTreeMap::new();
        for rule in engine.rules() {
            rule.metric_series(|label, m| {
                let row = rules.entry(label.to_string()).or_default();
                let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
                for (v, c) in row.iter_mut().zip([
                    &m.hits,
                    &m.over_limit,
                    &m.near_limit,
                    &m.shadow_over_limit,
                    &m.refunded,
                    &m.charged,
                    &m.settlements_refused,
                ]) {
                    *v += load(c);
                }
            });
        }
        for (i, (name, help)) in RULE_FAMILIES.into_iter().enumerate() {
            let rows: Vec<([(&str, &str); 1], u64)> = rules
                .iter()
                .map(|(label, v)| ([("rule", label.as_str())], v[i]))
                .collect();
            counters(&mut enc, name, help, rows)?;
        }
        counter(
            &mut enc,
            "weir_rls_bad_requests",
            "Requests refused as invalid (gRPC INVALID_ARGUMENT, HTTP 4xx).",
            service.bad_requests(),
        )?;
        service.reloads().encode(
            &mut enc,
            "weir_rls_reloads",
            "Configuration changes seen, by result.",
        )?;
        service.latency().encode(&mut enc)?;
        if let Some(s) = engine.store().fallback_status() {
            gauge(
                &mut enc,
                "weir_redis_fallback",
                "1 while decisions are made by the local fallback (Redis unreachable).",
                f64::from(u8::from(!s.on_redis)),
            )?;
            counters(
                &mut enc,
                "weir_redis_transitions",
                "Switches between Redis and the fallback, by the side switched to.",
                [
                    ([("to", "fallback")], s.to_fallback),
                    ([("to", "redis")], s.to_redis),
                ],
            )?;
            counter(
                &mut enc,
                "weir_redis_fallback_decisions",
                "Decisions made by the fallback.",
                s.fallback_decisions,
            )?;
            counters(
                &mut enc,
                "weir_redis_errors",
                "Failed Redis calls, by kind (timeout, connection, answer).",
                s.errors_by_kind.map(|(kind, n)| ([("kind", kind)], n)),
            )?;
        }
        Ok(())
    }
}

/// Bytes of unfinished request bodies a process's [`Budget`] holds.
#[derive(Debug)]
pub struct BufferedBodies(pub Arc<Budget>);

impl Collector for BufferedBodies {
    fn encode(&self, mut enc: Encoder) -> std::fmt::Result {
        gauge(
            &mut enc,
            "weir_buffered_body_bytes",
            "Bytes of unfinished request bodies held in memory.",
            self.0.used() as f64,
        )
    }
}
