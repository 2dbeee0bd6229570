//! Prometheus text exposition (format 0.0.4) of the rules' counters and the proxy's own.
//!
//! Written by hand from [`Snapshot`]: the rules engine keeps lock-free atomics on the call
//! path, and a scrape reads them once; a metrics registry would add a lookup per request.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use weir_rules::metrics::Snapshot;

use super::ProxyStats;

/// A label value escaped for the text format (backslash, double quote, newline).
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The exposition of `snap` and `proxy`.
pub fn render(snap: &Snapshot, proxy: &ProxyStats) -> String {
    let mut out = String::with_capacity(4096);
    type Field = fn(&weir_rules::metrics::ResourceSnapshot) -> u64;
    let resource_families: [(&str, &str, &str, Field); 4] = [
        (
            "weir_resource_passes_total",
            "counter",
            "Calls admitted to the resource.",
            |r| r.passes,
        ),
        (
            "weir_resource_blocks_total",
            "counter",
            "Calls blocked by any rule of the resource.",
            |r| r.blocks,
        ),
        (
            "weir_resource_errors_total",
            "counter",
            "Admitted calls that ended with an error (5xx).",
            |r| r.errors,
        ),
        (
            "weir_resource_in_flight",
            "gauge",
            "Admitted calls not ended yet.",
            |r| r.in_flight,
        ),
    ];
    for (name, kind, help, field) in resource_families {
        family(&mut out, name, kind, help);
        for r in &snap.resources {
            let _ = writeln!(out, "{name}{{resource=\"{}\"}} {}", esc(&r.name), field(r));
        }
    }
    family(
        &mut out,
        "weir_resource_response_seconds",
        "histogram",
        "Response time of admitted calls, until the response body ended.",
    );
    for r in &snap.resources {
        let res = esc(&r.name);
        for (le, count) in &r.rt_buckets {
            let le = if le.is_infinite() {
                "+Inf".to_string()
            } else {
                le.to_string()
            };
            let _ = writeln!(
                out,
                "weir_resource_response_seconds_bucket{{resource=\"{res}\",le=\"{le}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "weir_resource_response_seconds_sum{{resource=\"{res}\"}} {}",
            r.rt_sum.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "weir_resource_response_seconds_count{{resource=\"{res}\"}} {}",
            r.completed
        );
    }
    type RuleField = fn(&weir_rules::metrics::RuleSnapshot) -> u64;
    let rule_families: [(&str, &str, RuleField); 5] = [
        (
            "weir_rule_passes_total",
            "Calls the rule let through.",
            |r| r.passes,
        ),
        ("weir_rule_blocks_total", "Calls the rule blocked.", |r| {
            r.blocks
        }),
        (
            "weir_rule_shadow_blocks_total",
            "Calls the rule would have blocked (shadow mode).",
            |r| r.shadow_blocks,
        ),
        (
            "weir_rule_evictions_total",
            "Tracked values evicted at the rule's bound.",
            |r| r.evictions,
        ),
        (
            "weir_rule_full_total",
            "Calls whose value found the rule's table full (on_full reject/allow).",
            |r| r.full,
        ),
    ];
    for (name, help, field) in rule_families {
        family(&mut out, name, "counter", help);
        for r in &snap.rules {
            let _ = writeln!(
                out,
                "{name}{{rule=\"{}\",kind=\"{}\",resource=\"{}\"}} {}",
                esc(&r.id),
                r.kind.as_str(),
                esc(&r.resource),
                field(r)
            );
        }
    }
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    family(
        &mut out,
        "weir_proxy_forwarded_total",
        "counter",
        "Requests answered by the upstream.",
    );
    let _ = writeln!(out, "weir_proxy_forwarded_total {}", load(&proxy.forwarded));
    family(
        &mut out,
        "weir_proxy_upstream_errors_total",
        "counter",
        "Requests the upstream did not answer (502 unreachable, 504 timeout).",
    );
    let _ = writeln!(
        out,
        "weir_proxy_upstream_errors_total{{kind=\"unreachable\"}} {}",
        load(&proxy.upstream_unreachable)
    );
    let _ = writeln!(
        out,
        "weir_proxy_upstream_errors_total{{kind=\"timeout\"}} {}",
        load(&proxy.upstream_timeout)
    );
    family(
        &mut out,
        "weir_rules_reloads_total",
        "counter",
        "Rule file changes seen, by result.",
    );
    let _ = writeln!(
        out,
        "weir_rules_reloads_total{{result=\"applied\"}} {}",
        load(&proxy.reloads_applied)
    );
    let _ = writeln!(
        out,
        "weir_rules_reloads_total{{result=\"rejected\"}} {}",
        load(&proxy.reloads_rejected)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
