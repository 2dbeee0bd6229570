//! A rule set as rows for people: one line per rule with what it does, for dashboards and
//! listings. The wording follows the rule file's field names.

use std::fmt::Write;
use std::time::Duration;

use crate::config::{AdaptiveAlgorithm, BreakerPreset, RuleSet};

/// One rule, readable.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RuleRow {
    /// The rule's id (`system` for the system rule).
    pub id: String,
    /// `flow`, `hot_param`, `authority`, `breaker`, `switch`, `budget` or `system`.
    pub kind: &'static str,
    /// The resource (empty for the system rule).
    pub resource: String,
    /// Its settings as `field value` pairs, e.g. `qps 100 · algorithm gcra · burst 10`.
    pub detail: String,
    /// Counted but never blocking.
    pub shadow: bool,
    /// A switch's state set at run time, which wins over the file's `on` (`None`: the file's
    /// applies): what is in force, as the dashboard and `check-config` show it.
    pub overridden: Option<bool>,
}

/// Accumulates `field value` pairs.
#[derive(Default)]
struct Detail(String);

impl Detail {
    fn add(&mut self, field: &str, value: impl std::fmt::Display) -> &mut Self {
        if !self.0.is_empty() {
            self.0.push_str(" · ");
        }
        let _ = write!(self.0, "{field} {value}");
        self
    }

    fn opt<T: std::fmt::Display>(&mut self, field: &str, value: Option<T>) -> &mut Self {
        if let Some(v) = value {
            self.add(field, v);
        }
        self
    }

    fn dur(&mut self, field: &str, value: Option<Duration>) -> &mut Self {
        self.opt(field, value.map(weir_core::duration::format))
    }
}

/// A breaker rule as in force: its preset's values with the rule's fields applied, e.g.
/// `preset resilience4j · window_calls 20 · min_calls 20 · error_ratio 0.5 · …`.
fn breaker_detail(b: &crate::config::BreakerRule) -> Detail {
    use weir_core::breaker::Window;
    let c = b.config();
    let mut d = Detail::default();
    d.add(
        "preset",
        match b.preset.unwrap_or(BreakerPreset::Resilience4j) {
            BreakerPreset::Hystrix => "hystrix",
            BreakerPreset::Sentinel => "sentinel",
            BreakerPreset::Resilience4j => "resilience4j",
        },
    );
    match c.window {
        Window::Count(n) => d.add("window_calls", n),
        Window::Time { length, buckets } => d
            .add("window", weir_core::duration::format(length))
            .add("buckets", buckets),
    };
    d.add("min_calls", c.min_calls)
        .opt("error_ratio", c.error_ratio)
        .opt("error_count", c.error_count);
    if c.slow_ratio.is_some() {
        d.opt("slow_ratio", c.slow_ratio)
            .add("slow_call", weir_core::duration::format(c.slow_call));
    }
    d.add("open_for", weir_core::duration::format(c.open_duration));
    if c.open_backoff > 1.0 {
        d.add("open_backoff", c.open_backoff)
            .add("max_open", weir_core::duration::format(c.max_open));
    }
    d.add("max_probes", c.max_probes)
        .add("successes_to_close", c.successes_to_close)
        .add(
            "probe_timeout",
            weir_core::duration::format(c.probe_timeout),
        );
    if !c.slow_start.is_zero() {
        d.add("slow_start", weir_core::duration::format(c.slow_start));
    }
    d
}

/// A rule's `cost:` (`cost estimate 100, max 8000`).
fn cost(d: &mut Detail, c: Option<&crate::config::CostRule>) {
    if let Some(c) = c {
        let max = c.max.map(|m| format!(", max {m}")).unwrap_or_default();
        d.add("cost", format!("estimate {}{max}", c.estimate));
    }
}

/// Every rule of `set`, resource by resource in file order, the system rule last.
pub fn rows(set: &RuleSet) -> Vec<RuleRow> {
    rows_in_force(set, &std::collections::HashMap::new())
}

/// [`rows`], with the switch states set at run time (`overrides`, by id: what
/// `Rules::switch_overrides` answers, or the state file beside the rule file) shown beside the
/// file's.
pub fn rows_in_force(
    set: &RuleSet,
    overrides: &std::collections::HashMap<String, bool>,
) -> Vec<RuleRow> {
    let mut out = Vec::new();
    for r in &set.resources {
        let row = |id: &str, kind, detail: Detail, shadow| RuleRow {
            id: id.to_string(),
            kind,
            resource: r.name.clone(),
            detail: detail.0,
            shadow,
            overridden: None,
        };
        for f in &r.flow {
            out.push(row(&f.id, "flow", flow_detail(f), f.shadow));
        }
        for h in &r.hot_params {
            out.push(row(&h.id, "hot_param", hot_param_detail(h), h.shadow));
        }
        if let Some(a) = &r.authority {
            let mut d = Detail::default();
            if !a.allow.is_empty() {
                d.add("allow", a.allow.join(", "));
            }
            if !a.deny.is_empty() {
                d.add("deny", a.deny.join(", "));
            }
            out.push(row(&a.id, "authority", d, a.shadow));
        }
        if let Some(sw) = &r.switch {
            let set_now = overrides.get(&sw.id).copied();
            out.push(RuleRow {
                overridden: set_now,
                ..row(&sw.id, "switch", switch_detail(sw, set_now), false)
            });
        }
        if let Some(b) = &r.breaker {
            out.push(row(&b.id, "breaker", breaker_detail(b), b.shadow));
        }
        for b in &r.budgets {
            out.push(row(&b.id, "budget", budget_detail(b), false));
        }
    }
    if let Some(s) = &set.system {
        out.push(RuleRow {
            id: "system".into(),
            kind: "system",
            resource: String::new(),
            detail: system_detail(s).0,
            shadow: s.shadow,
            overridden: None,
        });
    }
    out
}

/// A flow rule's fields; a rate shows its window and algorithm in force, given or not.
fn flow_detail(f: &crate::config::FlowRule) -> Detail {
    let mut d = Detail::default();
    let rate = f.qps.is_some() && f.cluster.is_none();
    let window = f.window.or(rate.then_some(Duration::from_secs(1)));
    let reject = f.behavior == crate::config::Behavior::Reject;
    let algorithm = f
        .algorithm
        .or((rate && reject).then_some(crate::config::FILE_ALGORITHMS[0]));
    d.opt("qps", f.qps)
        .opt("concurrency", f.concurrency)
        .dur("window", window)
        .opt("algorithm", algorithm.map(|a| a.as_str()))
        .opt("burst", f.burst);
    if f.behavior != Default::default() {
        d.add("behavior", f.behavior.as_str());
    }
    d.dur("max_wait", f.max_wait)
        .dur("warmup", f.warmup)
        .opt("origin", f.origin.as_deref())
        .opt("relate", f.relate.as_deref());
    if let Some(c) = &f.cluster {
        d.add("cluster", format!("{} (safe {}/s)", c.resource, c.safe));
    }
    cost(&mut d, f.cost.as_deref());
    d
}

/// A hot-parameter rule's fields.
fn hot_param_detail(h: &crate::config::HotParamRule) -> Detail {
    let mut d = Detail::default();
    d.add("param", h.param)
        .add("threshold", h.threshold)
        .dur("window", h.window.or(Some(Duration::from_secs(1))))
        .add("algorithm", h.algorithm.as_str())
        .opt("burst", h.burst)
        .add("max_values", h.max_values)
        .add("on_full", format!("{:?}", h.on_full).to_lowercase());
    if !h.exceptions.is_empty() {
        d.add("exceptions", h.exceptions.len());
    }
    cost(&mut d, h.cost.as_deref());
    d
}

/// A switch's state in the file, and beside it the one set at run time (`set_now`).
fn switch_detail(sw: &crate::config::SwitchRule, set_now: Option<bool>) -> Detail {
    let mut d = Detail::default();
    match set_now {
        Some(on) => {
            d.add("on", format!("{} in the file", sw.on)).add(
                "set at run time",
                if on { "true (blocked)" } else { "false" },
            );
        }
        None => {
            d.add("on", if sw.on { "true (blocked)" } else { "false" });
        }
    }
    d
}

/// A calendar budget's fields.
fn budget_detail(b: &crate::config::BudgetRule) -> Detail {
    let mut d = Detail::default();
    let every = format!("{:?}", b.resets.every).to_lowercase();
    d.add("limit", b.limit)
        .add("every", every)
        .opt("on", b.resets.on.as_deref())
        .add("at", &b.resets.at)
        .add("tz", &b.resets.tz)
        .opt("param", b.param)
        .add("mode", format!("{:?}", b.mode).to_lowercase());
    if !b.warn.is_empty() {
        let warn: Vec<String> = b
            .warn
            .iter()
            .map(|f| format!("{}%", f64::from(f.0) / 10.0))
            .collect();
        d.add("warn", warn.join(", "));
    }
    if b.param.is_some() {
        d.add("max_values", b.max_values);
    }
    cost(&mut d, b.cost.as_deref());
    d
}

/// The system rule's fields.
fn system_detail(s: &crate::config::SystemRule) -> Detail {
    let mut d = Detail::default();
    d.opt("max_qps", s.max_qps)
        .opt("max_in_flight", s.max_in_flight)
        .dur("max_avg_rt", s.max_avg_rt)
        .opt("max_cpu", s.max_cpu);
    if let Some(b) = &s.bbr {
        d.add(
            "bbr",
            format!(
                "cpu_threshold {}",
                b.cpu_threshold
                    .unwrap_or(weir_core::adaptive::bbr::BbrConfig::default().cpu_threshold)
            ),
        );
    }
    if let Some(a) = &s.adaptive {
        d.add(
            "adaptive",
            match a.algorithm {
                AdaptiveAlgorithm::Gradient2 => "gradient2",
                AdaptiveAlgorithm::Vegas => "vegas",
                AdaptiveAlgorithm::Aimd => "aimd",
            },
        );
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_name_every_rule_with_its_fields() {
        let set = RuleSet::from_yaml(
            std::path::Path::new("r.yaml"),
            "resources:
  - name: api
    flow:
      - {id: q, qps: 100, algorithm: gcra, burst: 10}
    hot_params:
      - {id: u, param: 0, threshold: 5, window: 1m}
    breaker: {id: b, error_ratio: 0.5, open_for: 30s}
system: {max_in_flight: 500}
",
        )
        .unwrap();
        let rows = rows(&set);
        let brief: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|r| (r.id.as_str(), r.kind, r.resource.as_str()))
            .collect();
        assert_eq!(
            brief,
            [
                ("q", "flow", "api"),
                ("u", "hot_param", "api"),
                ("b", "breaker", "api"),
                ("system", "system", "")
            ]
        );
        assert_eq!(
            rows[0].detail,
            "qps 100 · window 1s · algorithm gcra · burst 10"
        );
        assert!(
            rows[1]
                .detail
                .starts_with("param 0 · threshold 5 · window 1m"),
            "{}",
            rows[1].detail
        );
        // The breaker as in force: Resilience4j's values with the rule's applied.
        assert_eq!(
            rows[2].detail,
            "preset resilience4j · window_calls 100 · min_calls 100 · error_ratio 0.5 · slow_ratio 1 · slow_call 1m · open_for 30s · max_probes 10 · successes_to_close 10 · probe_timeout 1m"
        );
        assert_eq!(rows[3].detail, "max_in_flight 500");
    }
}
