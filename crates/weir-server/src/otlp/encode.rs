//! A process's `/metrics` exposition (OpenMetrics text, [`crate::admin::metrics::Metrics::render`])
//! as OTLP metrics: every family with the same name, help, labels and values — a counter as a
//! monotonic cumulative sum, a gauge as a gauge, a histogram as an explicit-bucket histogram
//! (per-bucket counts from the cumulative `le` series). Reading the one rendering both
//! exporters see keeps a Prometheus scrape and an OTLP export equal by construction.

use super::proto::{
    Data, Gauge, Histogram, HistogramDataPoint, KeyValue, Metric, NumberDataPoint, Sum, Value,
    CUMULATIVE,
};

/// The times of one export: when counting began and when the values were read (Unix ns).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Times {
    pub start: u64,
    pub now: u64,
}

/// Every family of `exposition`, in its order.
pub(crate) fn metrics(exposition: &str, times: Times) -> Vec<Metric> {
    let mut out: Vec<Metric> = Vec::new();
    let mut family: Option<Family> = None;
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let Some((kind, rest)) = rest.split_once(' ') else {
                continue;
            };
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            if family.as_ref().is_none_or(|f| f.name != name) {
                if let Some(f) = family.take() {
                    out.extend(f.finish(times));
                }
                family = Some(Family::new(name));
            }
            if let Some(f) = family.as_mut() {
                match kind {
                    "TYPE" => f.kind = Kind::of(text),
                    "HELP" => f.help = unescape(text),
                    "UNIT" => f.unit = text.to_string(),
                    _ => {}
                }
            }
            continue;
        }
        if let (Some(f), Some(sample)) = (family.as_mut(), Sample::parse(line)) {
            f.add(sample);
        }
    }
    if let Some(f) = family {
        out.extend(f.finish(times));
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn of(text: &str) -> Self {
        match text {
            "counter" => Self::Counter,
            "histogram" => Self::Histogram,
            // gauge, and what OTLP has no closer kind for (unknown, info, stateset).
            _ => Self::Gauge,
        }
    }
}

/// One sample line: its name, labels and value.
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
    /// Written as a whole number.
    whole: bool,
}

impl Sample {
    /// `name{k="v",…} value [timestamp]`; `None` for what is not one.
    fn parse(line: &str) -> Option<Self> {
        let name_end = line.find(['{', ' '])?;
        let name = &line[..name_end];
        let (labels, rest) = match line[name_end..].strip_prefix('{') {
            Some(body) => labels(body)?,
            None => (Vec::new(), &line[name_end..]),
        };
        let text = rest.trim_start().split(' ').next()?;
        let value: f64 = text.parse().ok()?;
        let whole = !text.contains(['.', 'e', 'E', 'n', 'N', 'i', 'I']);
        Some(Self {
            name: name.to_string(),
            labels,
            value,
            whole,
        })
    }
}

/// The labels of a sample (`k="v",…}` up to the closing brace) and what follows them.
fn labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut out = Vec::new();
    loop {
        s = s.trim_start_matches(',');
        if let Some(rest) = s.strip_prefix('}') {
            return Some((out, rest));
        }
        let (key, rest) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        out.push((key.to_string(), value));
        s = &rest[end + 1..];
    }
}

/// Help text with OpenMetrics' escapes undone.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
    }
    out
}

/// A family being read.
struct Family {
    name: String,
    help: String,
    unit: String,
    kind: Kind,
    samples: Vec<Sample>,
}

impl Family {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            help: String::new(),
            unit: String::new(),
            kind: Kind::Gauge,
            samples: Vec::new(),
        }
    }

    fn add(&mut self, s: Sample) {
        self.samples.push(s);
    }

    fn finish(self, times: Times) -> Option<Metric> {
        let data = match self.kind {
            Kind::Counter => Data::Sum(Sum {
                data_points: self.points("_total", times),
                aggregation_temporality: CUMULATIVE,
                is_monotonic: true,
            }),
            Kind::Gauge => Data::Gauge(Gauge {
                data_points: self.points("", times),
            }),
            Kind::Histogram => Data::Histogram(Histogram {
                data_points: self.histogram_points(times),
                aggregation_temporality: CUMULATIVE,
            }),
        };
        let mut metric = Metric {
            name: self.name,
            description: self.help,
            unit: self.unit,
            data: Some(data),
        };
        conventional(&mut metric);
        Some(metric)
    }

    /// The points of the samples named `NAME{suffix}`.
    fn points(&self, suffix: &str, times: Times) -> Vec<NumberDataPoint> {
        self.samples
            .iter()
            .filter(|s| s.name.strip_prefix(self.name.as_str()) == Some(suffix))
            .map(|s| NumberDataPoint {
                attributes: attributes(&s.labels),
                start_time_unix_nano: times.start,
                time_unix_nano: times.now,
                value: Some(number(s)),
            })
            .collect()
    }

    /// One point per label set of `_bucket` (`le` set aside), `_sum` and `_count`.
    fn histogram_points(&self, times: Times) -> Vec<HistogramDataPoint> {
        let mut points: Vec<(Vec<(String, String)>, HistogramDataPoint)> = Vec::new();
        for s in &self.samples {
            let Some(suffix) = s.name.strip_prefix(self.name.as_str()) else {
                continue;
            };
            let le = s.labels.iter().find(|(k, _)| k == "le").map(|(_, v)| v);
            let labels: Vec<(String, String)> = s
                .labels
                .iter()
                .filter(|(k, _)| k != "le")
                .cloned()
                .collect();
            let at = match points.iter().position(|(l, _)| *l == labels) {
                Some(i) => i,
                None => {
                    let point = HistogramDataPoint {
                        attributes: attributes(&labels),
                        start_time_unix_nano: times.start,
                        time_unix_nano: times.now,
                        ..HistogramDataPoint::default()
                    };
                    points.push((labels, point));
                    points.len() - 1
                }
            };
            let p = &mut points[at].1;
            match (suffix, le) {
                ("_bucket", Some(le)) => {
                    let cumulative = s.value as u64;
                    let below: u64 = p.bucket_counts.iter().sum();
                    p.bucket_counts.push(cumulative.saturating_sub(below));
                    if let Ok(bound) = le.parse::<f64>() {
                        if bound.is_finite() {
                            p.explicit_bounds.push(bound);
                        }
                    }
                }
                ("_sum", None) => p.sum = Some(s.value),
                ("_count", None) => p.count = s.value as u64,
                _ => {}
            }
        }
        points.into_iter().map(|(_, p)| p).collect()
    }
}

/// Families that follow an OpenTelemetry semantic convention: their Prometheus name, the
/// convention's name and unit, and their labels' attribute names there.
const CONVENTIONS: [Convention; 1] = [(
    "gen_ai_client_token_usage",
    "gen_ai.client.token.usage",
    "{token}",
    &[
        ("gen_ai_token_type", "gen_ai.token.type"),
        ("resource", "weir.resource"),
    ],
)];

/// A family's Prometheus name, its convention's name and unit, and label → attribute names.
type Convention = (
    &'static str,
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// Names `m` as its semantic convention does, if it follows one.
fn conventional(m: &mut Metric) {
    let Some((_, name, unit, labels)) = CONVENTIONS.iter().find(|c| c.0 == m.name) else {
        return;
    };
    m.name = (*name).to_string();
    m.unit = (*unit).to_string();
    if let Some(Data::Histogram(h)) = &mut m.data {
        for p in &mut h.data_points {
            for a in &mut p.attributes {
                if let Some((_, to)) = labels.iter().find(|(from, _)| *from == a.key) {
                    a.key = (*to).to_string();
                }
            }
        }
    }
}

fn number(s: &Sample) -> Value {
    if s.whole && s.value.abs() < 9.0e15 {
        Value::AsInt(s.value as i64)
    } else {
        Value::AsDouble(s.value)
    }
}

fn attributes(labels: &[(String, String)]) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(k, v)| KeyValue::string(k.as_str(), v.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {

    #[test]
    fn token_usage_is_named_as_the_genai_conventions_name_it() {
        let text = "# HELP gen_ai_client_token_usage U.\n# TYPE gen_ai_client_token_usage histogram\ngen_ai_client_token_usage_bucket{le=\"4.0\",resource=\"chat\",gen_ai_token_type=\"output\"} 1\ngen_ai_client_token_usage_bucket{le=\"+Inf\",resource=\"chat\",gen_ai_token_type=\"output\"} 1\ngen_ai_client_token_usage_sum{resource=\"chat\",gen_ai_token_type=\"output\"} 3.0\ngen_ai_client_token_usage_count{resource=\"chat\",gen_ai_token_type=\"output\"} 1\n# EOF\n";
        let m = metrics(text, Times { start: 1, now: 2 });
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].name, "gen_ai.client.token.usage");
        assert_eq!(m[0].unit, "{token}");
        let Some(Data::Histogram(h)) = &m[0].data else {
            panic!("a histogram: {:?}", m[0].data);
        };
        let keys: Vec<&str> = h.data_points[0]
            .attributes
            .iter()
            .map(|a| a.key.as_str())
            .collect();
        assert_eq!(keys, ["weir.resource", "gen_ai.token.type"]);
        assert_eq!(h.data_points[0].count, 1);
    }

    use super::*;
    use crate::otlp::proto::StringValue;

    const EXPOSITION: &str = "# HELP weir_x X \\\"quoted\\\".
# TYPE weir_x counter
weir_x_total{rule=\"a\\\"b\",kind=\"flow\"} 3
weir_x_total{rule=\"c\",kind=\"flow\"} 0
# HELP weir_g G.
# TYPE weir_g gauge
weir_g 2.5
# HELP weir_s S.
# TYPE weir_s histogram
weir_s_sum{resource=\"r\"} 7.5
weir_s_count{resource=\"r\"} 3
weir_s_bucket{le=\"0.5\",resource=\"r\"} 1
weir_s_bucket{le=\"1.0\",resource=\"r\"} 1
weir_s_bucket{le=\"+Inf\",resource=\"r\"} 3
# EOF
";

    fn text(kv: &KeyValue) -> (&str, &str) {
        let Some(AnyValue {
            value: Some(StringValue::String(v)),
        }) = &kv.value
        else {
            panic!("not a string")
        };
        (kv.key.as_str(), v.as_str())
    }

    use crate::otlp::proto::AnyValue;

    #[test]
    fn families_become_sums_gauges_and_histograms() {
        let times = Times { start: 10, now: 20 };
        let m = metrics(EXPOSITION, times);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].name, "weir_x");
        assert_eq!(m[0].description, "X \"quoted\".");
        let Some(Data::Sum(sum)) = &m[0].data else {
            panic!("a counter is a sum")
        };
        assert!(sum.is_monotonic);
        assert_eq!(sum.aggregation_temporality, CUMULATIVE);
        assert_eq!(sum.data_points.len(), 2);
        assert_eq!(sum.data_points[0].value, Some(Value::AsInt(3)));
        assert_eq!(text(&sum.data_points[0].attributes[0]), ("rule", "a\"b"));
        assert_eq!(text(&sum.data_points[0].attributes[1]), ("kind", "flow"));
        assert_eq!(sum.data_points[0].start_time_unix_nano, 10);
        assert_eq!(sum.data_points[0].time_unix_nano, 20);
        let Some(Data::Gauge(g)) = &m[1].data else {
            panic!("a gauge")
        };
        assert_eq!(g.data_points[0].value, Some(Value::AsDouble(2.5)));
        let Some(Data::Histogram(h)) = &m[2].data else {
            panic!("a histogram")
        };
        let p = &h.data_points[0];
        assert_eq!(text(&p.attributes[0]), ("resource", "r"));
        assert_eq!(p.attributes.len(), 1, "le is not a label of the point");
        assert_eq!(p.count, 3);
        assert_eq!(p.sum, Some(7.5));
        assert_eq!(p.explicit_bounds, [0.5, 1.0]);
        assert_eq!(p.bucket_counts, [1, 0, 2]);
    }

    #[test]
    fn what_is_not_a_sample_is_skipped() {
        let m = metrics(
            "# TYPE weir_g gauge\nweir_g{k=\"v\" 1\nweir_g NaNx\nweir_g 1\n",
            Times { start: 0, now: 0 },
        );
        let Some(Data::Gauge(g)) = &m[0].data else {
            panic!("a gauge")
        };
        assert_eq!(g.data_points.len(), 1);
    }
}
