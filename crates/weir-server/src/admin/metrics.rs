//! The one metrics exporter of every Weir server: a process's `/metrics` is one
//! [`Metrics`] registry (prometheus-client) rendered in the OpenMetrics text format, which
//! Prometheus scrapes.
//!
//! Nothing is registered or looked up per request: each part of a server keeps its counts in
//! relaxed atomics on its own hot path and registers one [`Collector`] that reads them when
//! `/metrics` is scraped (the rate-limit service's rules, the decision latency, the body
//! budget, the Redis store, the lease server, the proxy). The helpers below write the common
//! shapes (a counter or gauge per label set, a histogram from bucket counts) so that every
//! collector names and labels its families the same way.

use std::fmt;

use parking_lot::RwLock;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

pub use prometheus_client::collector::Collector;
pub use prometheus_client::encoding::DescriptorEncoder as Encoder;

/// The content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A process's metrics registry: the collectors of every server it runs.
#[derive(Default)]
pub struct Metrics {
    registry: RwLock<Registry>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a collector, read at every scrape from now on.
    pub fn register(&self, collector: impl Collector) {
        self.registry
            .write()
            .register_collector(Box::new(collector));
    }

    /// Every family of every collector, in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry.read());
        out
    }
}

/// A counter family (`name` gets the `_total` suffix): one series per row, its labels a list
/// of `(name, value)` pairs (e.g. `[("rule", id)]`).
pub fn counters<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, u64)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        m.encode_family(&labels)?
            .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
    }
    Ok(())
}

/// A counter without labels.
pub fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    enc.encode_descriptor(name, help, None, MetricType::Counter)?
        .encode_counter::<NoLabelSet, _, u64>(&v, None)
}

/// A gauge family: one series per row; whole values are written as integers.
pub fn gauges<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, f64)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        let mut s = m.encode_family(&labels)?;
        if whole(v) {
            s.encode_gauge(&(v as i64))?;
        } else {
            s.encode_gauge(&v)?;
        }
    }
    Ok(())
}

fn whole(v: f64) -> bool {
    v.fract() == 0.0 && v.abs() < 9.0e15
}

/// A gauge without labels.
pub fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    if whole(v) {
        m.encode_gauge(&(v as i64))
    } else {
        m.encode_gauge(&v)
    }
}

/// A histogram without labels from per-bucket counts: `buckets[i]` observations at most
/// `bounds[i]` seconds (and above the previous bound), `buckets[bounds.len()]` above the last.
pub fn histogram(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    bounds: &[f64],
    buckets: &[u64],
    sum: f64,
) -> fmt::Result {
    let rows: Vec<(f64, u64)> = bounds
        .iter()
        .copied()
        .chain([f64::INFINITY])
        .zip(buckets.iter().copied())
        .collect();
    let count = buckets.iter().sum();
    enc.encode_descriptor(name, help, None, MetricType::Histogram)?
        .encode_histogram::<NoLabelSet>(sum, count, &rows, None)
}

/// A histogram family: one series per row, its labels, the sum of its observations and its
/// per-bucket counts as `(upper bound, observations in the bucket)` (the last bound `+Inf`).
pub fn histograms<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, f64, Vec<(f64, u64)>)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, sum, buckets) in rows {
        let count = buckets.iter().map(|(_, n)| n).sum();
        m.encode_family(&labels)?
            .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Sample;

    impl Collector for Sample {
        fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
            counters(
                &mut enc,
                "weir_x",
                "X.",
                [([("rule", "a\"b")], 3), ([("rule", "c")], 0)],
            )?;
            gauge(&mut enc, "weir_g", "G.", 2.0)?;
            gauges(&mut enc, "weir_h", "H.", [([("k", "v")], 0.25)])?;
            histogram(&mut enc, "weir_s", "S.", &[0.5, 1.0], &[1, 0, 2], 7.5)
        }
    }

    #[test]
    fn one_registry_renders_every_collector_with_escaped_labels() {
        let m = Metrics::new();
        m.register(Sample);
        let text = m.render();
        for line in [
            "# TYPE weir_x counter",
            "weir_x_total{rule=\"a\\\"b\"} 3",
            "weir_x_total{rule=\"c\"} 0",
            "weir_g 2",
            "weir_h{k=\"v\"} 0.25",
            "weir_s_bucket{le=\"0.5\"} 1",
            "weir_s_bucket{le=\"1.0\"} 1",
            "weir_s_bucket{le=\"+Inf\"} 3",
            "weir_s_count 3",
            "weir_s_sum 7.5",
            "# EOF",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
