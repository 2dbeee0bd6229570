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

use std::fmt::{self, Write};

use parking_lot::RwLock;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

pub use prometheus_client::collector::Collector;
pub use prometheus_client::encoding::DescriptorEncoder as Encoder;

/// The content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of the Prometheus text format 0.0.4 ([`Metrics::render_as`]).
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The exposition formats `/metrics` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics text 1.0 (what Prometheus asks for first).
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (what `curl`, `promtool check metrics` and older
    /// scrapers read).
    Prometheus,
}

impl Format {
    /// The format a scrape's `Accept` header asks for: OpenMetrics when it accepts
    /// `application/openmetrics-text` (with a weight above 0), else the Prometheus text
    /// format — as Prometheus's own client libraries answer. Any `Accept` is safe to pass:
    /// it is only searched, never stored.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let asks = accept.is_some_and(|a| {
            a.split(',').any(|range| {
                let mut parts = range.split(';').map(str::trim);
                let kind = parts.next().unwrap_or_default();
                let refused = parts.any(|p| {
                    p.strip_prefix("q=")
                        .and_then(|q| q.parse::<f64>().ok())
                        .is_some_and(|q| q <= 0.0)
                });
                kind.eq_ignore_ascii_case("application/openmetrics-text") && !refused
            })
        });
        if asks {
            Self::OpenMetrics
        } else {
            Self::Prometheus
        }
    }

    /// The response's content type.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => CONTENT_TYPE,
            Self::Prometheus => PROMETHEUS_CONTENT_TYPE,
        }
    }
}

/// The `/metrics` answer of `metrics` to a request with these headers, in the format its
/// `Accept` asks for.
pub fn answer(metrics: &Metrics, headers: &http::HeaderMap) -> http::Response<String> {
    let accept = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let format = Format::negotiate(accept);
    let mut r = http::Response::new(metrics.render_as(format));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(format.content_type()),
    );
    r
}

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

    /// Every family of every collector in `format`: the same families, names, labels and
    /// values either way.
    pub fn render_as(&self, format: Format) -> String {
        let open = self.render();
        match format {
            Format::OpenMetrics => open,
            Format::Prometheus => prometheus_text(&open),
        }
    }
}

/// The Prometheus text format 0.0.4 of an OpenMetrics exposition: a counter family is named
/// by its samples (`_total`) in `# HELP` and `# TYPE`, `unknown` is `untyped`, and `# UNIT`
/// and `# EOF` are left out (the sample lines are the same in both).
fn prometheus_text(open: &str) -> String {
    use std::collections::HashMap;
    let types: HashMap<&str, &str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .collect();
    let mut out = String::with_capacity(open.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = line
            .strip_prefix("# HELP ")
            .map(|r| ("HELP", r))
            .or_else(|| line.strip_prefix("# TYPE ").map(|r| ("TYPE", r)));
        match meta.and_then(|(kind, rest)| Some((kind, rest.split_once(' ')?))) {
            Some((kind, (name, rest))) => {
                let suffix = if types.get(name) == Some(&"counter") {
                    "_total"
                } else {
                    ""
                };
                let rest: std::borrow::Cow<'_, str> = match kind {
                    "TYPE" if rest == "unknown" => "untyped".into(),
                    // OpenMetrics escapes `"` in help text; the text format does not.
                    "HELP" => rest.replace("\\\"", "\"").into(),
                    _ => rest.into(),
                };
                let _ = write!(out, "# {kind} {name}{suffix} {rest}");
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
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
    fn the_text_format_names_counters_by_their_samples() {
        let m = Metrics::new();
        m.register(Sample);
        let text = m.render_as(Format::Prometheus);
        for line in [
            "# HELP weir_x_total X.",
            "# TYPE weir_x_total counter",
            "weir_x_total{rule=\"a\\\"b\"} 3",
            "# TYPE weir_g gauge",
            "# TYPE weir_s histogram",
            "weir_s_bucket{le=\"+Inf\"} 3",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains("# EOF"), "{text}");
        // The same samples either way.
        let samples = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .map(String::from)
                .collect()
        };
        assert_eq!(samples(&text), samples(&m.render()));
    }

    #[test]
    fn accept_headers_choose_the_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(None), Format::Prometheus);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Prometheus);
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Prometheus);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text; q=0, text/plain")),
            Format::Prometheus
        );
        assert_eq!(
            Format::negotiate(Some("Application/OpenMetrics-Text")),
            Format::OpenMetrics
        );
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
