//! The OTLP messages the exporter writes: the subset of OpenTelemetry's
//! `opentelemetry/proto/{collector/metrics,collector/trace,metrics,trace,common,resource}/v1`
//! it needs (a request of resource metrics, each a gauge, a monotonic cumulative sum or an
//! explicit-bucket histogram; a request of resource spans), with the field numbers of those
//! files. Fields left out are empty on the wire,
//! as the protocol allows; weir-server's tests decode what is sent with the OpenTelemetry
//! project's own generated types.

/// `collector.metrics.v1.ExportMetricsServiceRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportMetricsServiceRequest {
    /// The metrics, by resource.
    #[prost(message, repeated, tag = "1")]
    pub resource_metrics: Vec<ResourceMetrics>,
}

/// `metrics.v1.ResourceMetrics`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceMetrics {
    /// The process that exports (`service.name` and the resource attributes).
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    /// The metrics, by instrumentation scope.
    #[prost(message, repeated, tag = "2")]
    pub scope_metrics: Vec<ScopeMetrics>,
}

/// `resource.v1.Resource`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Resource {
    /// Its attributes.
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

/// `metrics.v1.ScopeMetrics`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ScopeMetrics {
    /// Who produced them (`weir`, with its version).
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    /// The metrics.
    #[prost(message, repeated, tag = "2")]
    pub metrics: Vec<Metric>,
}

/// `common.v1.InstrumentationScope`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InstrumentationScope {
    /// Its name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its version.
    #[prost(string, tag = "2")]
    pub version: String,
}

/// `metrics.v1.Metric`: one metric family.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    /// The family's name, as `/metrics` names it.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its help text.
    #[prost(string, tag = "2")]
    pub description: String,
    /// Its unit (empty: none stated).
    #[prost(string, tag = "3")]
    pub unit: String,
    /// Its points.
    #[prost(oneof = "Data", tags = "5, 7, 9")]
    pub data: Option<Data>,
}

/// `metrics.v1.Metric.data`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Data {
    /// A gauge.
    #[prost(message, tag = "5")]
    Gauge(Gauge),
    /// A counter: a monotonic cumulative sum.
    #[prost(message, tag = "7")]
    Sum(Sum),
    /// A histogram with explicit buckets.
    #[prost(message, tag = "9")]
    Histogram(Histogram),
}

/// `metrics.v1.Gauge`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Gauge {
    /// One point per label set.
    #[prost(message, repeated, tag = "1")]
    pub data_points: Vec<NumberDataPoint>,
}

/// `metrics.v1.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE`: counts since the
/// process started, as Prometheus counts.
pub const CUMULATIVE: i32 = 2;

/// `metrics.v1.Sum`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sum {
    /// One point per label set.
    #[prost(message, repeated, tag = "1")]
    pub data_points: Vec<NumberDataPoint>,
    /// Always [`CUMULATIVE`].
    #[prost(int32, tag = "2")]
    pub aggregation_temporality: i32,
    /// Always true: counters only grow.
    #[prost(bool, tag = "3")]
    pub is_monotonic: bool,
}

/// `metrics.v1.Histogram`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Histogram {
    /// One point per label set.
    #[prost(message, repeated, tag = "1")]
    pub data_points: Vec<HistogramDataPoint>,
    /// Always [`CUMULATIVE`].
    #[prost(int32, tag = "2")]
    pub aggregation_temporality: i32,
}

/// `metrics.v1.NumberDataPoint`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NumberDataPoint {
    /// The series' labels.
    #[prost(message, repeated, tag = "7")]
    pub attributes: Vec<KeyValue>,
    /// When counting began (the exporter's start), Unix nanoseconds.
    #[prost(fixed64, tag = "2")]
    pub start_time_unix_nano: u64,
    /// When the value was read, Unix nanoseconds.
    #[prost(fixed64, tag = "3")]
    pub time_unix_nano: u64,
    /// The value.
    #[prost(oneof = "Value", tags = "4, 6")]
    pub value: Option<Value>,
}

/// `metrics.v1.NumberDataPoint.value`.
#[derive(Clone, Copy, PartialEq, prost::Oneof)]
pub enum Value {
    /// A value with a fraction, or too large for an integer.
    #[prost(double, tag = "4")]
    AsDouble(f64),
    /// A whole value.
    #[prost(sfixed64, tag = "6")]
    AsInt(i64),
}

/// `metrics.v1.HistogramDataPoint`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HistogramDataPoint {
    /// The series' labels (without `le`).
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    /// When counting began, Unix nanoseconds.
    #[prost(fixed64, tag = "2")]
    pub start_time_unix_nano: u64,
    /// When the value was read, Unix nanoseconds.
    #[prost(fixed64, tag = "3")]
    pub time_unix_nano: u64,
    /// Observations.
    #[prost(fixed64, tag = "4")]
    pub count: u64,
    /// Their sum.
    #[prost(double, optional, tag = "5")]
    pub sum: Option<f64>,
    /// Observations per bucket (not cumulative), one more than the bounds.
    #[prost(fixed64, repeated, tag = "6")]
    pub bucket_counts: Vec<u64>,
    /// The buckets' upper bounds, increasing (`+Inf` implied last).
    #[prost(double, repeated, tag = "7")]
    pub explicit_bounds: Vec<f64>,
}

/// `common.v1.KeyValue` with a string value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    /// The key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The value.
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `common.v1.AnyValue`: a string, a boolean or an integer.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyValue {
    /// The value.
    #[prost(oneof = "StringValue", tags = "1, 2, 3")]
    pub value: Option<StringValue>,
}

/// `common.v1.AnyValue.value`: the cases written.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum StringValue {
    /// A string.
    #[prost(string, tag = "1")]
    String(String),
    /// A boolean.
    #[prost(bool, tag = "2")]
    Bool(bool),
    /// An integer.
    #[prost(int64, tag = "3")]
    Int(i64),
}

impl KeyValue {
    /// An integer attribute.
    pub fn int(key: impl Into<String>, value: u64) -> Self {
        Self {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(StringValue::Int(i64::try_from(value).unwrap_or(i64::MAX))),
            }),
        }
    }

    /// A boolean attribute.
    pub fn bool(key: impl Into<String>, value: bool) -> Self {
        Self {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(StringValue::Bool(value)),
            }),
        }
    }

    /// A string attribute.
    pub fn string(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(StringValue::String(value.into())),
            }),
        }
    }
}

/// `collector.trace.v1.ExportTraceServiceRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTraceServiceRequest {
    /// The spans, by resource.
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

/// `trace.v1.ResourceSpans`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceSpans {
    /// The process that exports.
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    /// The spans, by instrumentation scope.
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
}

/// `trace.v1.ScopeSpans`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ScopeSpans {
    /// Who produced them (`weir`, with its version).
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    /// The spans.
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
}

/// `trace.v1.Span.SpanKind.SPAN_KIND_INTERNAL`.
pub const KIND_INTERNAL: i32 = 1;
/// `trace.v1.Span.SpanKind.SPAN_KIND_SERVER`.
pub const KIND_SERVER: i32 = 2;
/// `trace.v1.Status.StatusCode.STATUS_CODE_ERROR`.
pub const STATUS_ERROR: i32 = 2;

/// `trace.v1.Span`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Span {
    /// The trace (16 bytes).
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    /// This span (8 bytes).
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    /// The parent span (8 bytes; empty for a root).
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    /// What the span is.
    #[prost(string, tag = "5")]
    pub name: String,
    /// [`KIND_SERVER`] or [`KIND_INTERNAL`].
    #[prost(int32, tag = "6")]
    pub kind: i32,
    /// Its start, Unix nanoseconds.
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    /// Its end, Unix nanoseconds.
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    /// What was decided.
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    /// Set for a request that could not be decided.
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
}

/// `trace.v1.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    /// Why.
    #[prost(string, tag = "2")]
    pub message: String,
    /// [`STATUS_ERROR`].
    #[prost(int32, tag = "3")]
    pub code: i32,
}
