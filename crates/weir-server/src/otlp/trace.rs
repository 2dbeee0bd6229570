//! Spans of decisions, exported over OTLP: a [`Tracer`] samples (the caller's `traceparent`
//! flag, a ratio by trace id, every refusal if asked), queues finished spans in a bounded
//! queue (full: the span is dropped and counted) and one task sends them in batches.
//!
//! - A span's parent is the caller's span from its `traceparent` (Envoy's, in `weir serve`'s
//!   gRPC metadata; a client's, in `weir proxy`), so the decision shows in the caller's trace.
//! - Keys (descriptor values, client addresses, hot-parameter values) can be personal: spans
//!   carry a digest (`weir.key.digest`: SHA-256 of a per-process salt and the values, 16 hex
//!   digits), never the values; `WEIR_TRACE_KEY_SALT` sets the salt, so that the replicas of
//!   one deployment digest a key alike.
//! - Nothing here blocks a decision: a decision not sampled costs one random draw (or a read
//!   of the caller's flag); a sampled one a clock read and a queue push that never waits.
//!
//! Who may call it: server code. What reaches it from a client is a `traceparent` (parsed by
//! [`weir_tower::trace::TraceParent`], anything malformed starts a new trace) and the
//! decision's inputs, which are digested.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use weir_core::log_gate::LogGate;
use weir_tower::trace::{push_hex, Decided, DecisionRecord, TraceParent};

use super::outcomes::{Outcomes, OutcomesCollector};
use super::proto::{
    ExportTraceServiceRequest, InstrumentationScope, KeyValue, ResourceSpans, ScopeSpans, Span,
    KIND_INTERNAL,
};
use super::resource::{monotonic_nanos, resource, unix_nanos};
use super::send::{Sender, GRPC_TRACES};
use super::{Sampling, Settings};
use crate::admin::metrics::Metrics;

/// Spans waiting for their export at most (`OTEL_BSP_MAX_QUEUE_SIZE`'s default); past it a
/// span is dropped and counted.
pub const MAX_QUEUED: usize = 2_048;

/// Spans per export at most (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`'s default).
pub const MAX_BATCH: usize = 512;

/// Longest wait before queued spans are sent (`OTEL_BSP_SCHEDULE_DELAY`'s default is 5 s;
/// decisions are short, so sooner).
pub const BATCH_DELAY: Duration = Duration::from_secs(1);

/// Samples decisions and queues their spans for export.
pub struct Tracer {
    sampling: Sampling,
    /// `ratio` as a bound on a trace id's last 8 bytes.
    bound: u64,
    queue: mpsc::Sender<Span>,
    salt: [u8; 32],
    stats: Arc<Outcomes>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("sampling", &self.sampling)
            .finish_non_exhaustive()
    }
}

/// A span begun: its ids, its parent and when it began; [`Tracer::end`] queues it.
#[derive(Debug, Clone, Copy)]
pub struct Begun {
    /// The trace (the caller's, or a new one).
    pub trace_id: [u8; 16],
    /// This span.
    pub span_id: [u8; 8],
    /// The caller's span.
    pub parent: Option<[u8; 8]>,
    /// Sampled when it began (by the caller's flag or the ratio): exported whatever the verdict.
    pub sampled: bool,
    start: u64,
}

impl Begun {
    /// The `traceparent` naming this span as the parent (sampled).
    pub fn child(&self) -> TraceParent {
        TraceParent {
            trace_id: self.trace_id,
            span_id: self.span_id,
            flags: 1,
        }
    }
}

impl Tracer {
    /// A tracer sampling as `sampling` says, its spans counted in `registry`; the receiver is
    /// what [`run`] sends from.
    fn new(sampling: Sampling, registry: &Metrics) -> (Arc<Self>, mpsc::Receiver<Span>) {
        let (queue, rx) = mpsc::channel(MAX_QUEUED);
        let stats = Arc::new(Outcomes::default());
        registry.register(OutcomesCollector {
            outcomes: stats.clone(),
            name: "weir_otlp_spans",
            help: "Decision spans, by result (exported; failed: the collector did not take their export; dropped: the export queue was full).",
            labels: ["exported", "failed", "dropped"],
        });
        // The bound on a trace id's random part (W3C level 2: its last 7 bytes are random;
        // OpenTelemetry's ratio sampler compares them with ratio × 2^56).
        let bound = (sampling.ratio.clamp(0.0, 1.0) * (1u64 << 56) as f64) as u64;
        let tracer = Arc::new(Self {
            sampling,
            bound,
            queue,
            salt: salt(std::env::var("WEIR_TRACE_KEY_SALT").ok().as_deref()),
            stats,
        });
        (tracer, rx)
    }

    /// Begins a span for a decision on a request from a caller whose `traceparent` is
    /// `parent`; `None` when it will not be exported whatever the verdict.
    #[inline]
    pub fn begin(&self, parent: Option<TraceParent>) -> Option<Begun> {
        let (trace_id, sampled) = self.sample(parent.as_ref());
        if !sampled && !self.sampling.refusals {
            return None;
        }
        Some(self.start(trace_id, parent, sampled))
    }

    /// The trace a decision belongs to (the caller's, or a new one) and whether it is sampled:
    /// by the caller's flag (parent-based), else by the ratio on the trace id.
    #[inline]
    fn sample(&self, parent: Option<&TraceParent>) -> ([u8; 16], bool) {
        let trace_id = parent.map_or_else(new_trace_id, |p| p.trace_id);
        let sampled = match parent {
            Some(p) if self.sampling.parent_based => p.sampled(),
            _ => random_part(&trace_id) < self.bound,
        };
        (trace_id, sampled)
    }

    /// A span of the trace `trace_id`, begun now.
    fn start(&self, trace_id: [u8; 16], parent: Option<TraceParent>, sampled: bool) -> Begun {
        Begun {
            trace_id,
            span_id: new_span_id(),
            parent: parent.map(|p| p.span_id),
            sampled,
            start: unix_nanos(),
        }
    }

    /// Whether the span of `begun` will be queued: it was sampled, or it is a refusal traced as
    /// such, and the queue has room (a full queue counts it dropped). Ask before building its
    /// attributes: a span that cannot be sent costs nothing more.
    pub fn wants(&self, begun: &Begun, refused: bool) -> bool {
        if !(begun.sampled || refused && self.sampling.refusals) {
            return false;
        }
        if self.queue.capacity() == 0 {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Queues the span of `begun` (named `name`, of `kind`, with `attributes`) when it was
    /// sampled or is a refusal traced as such; a full queue drops it (counted).
    pub(crate) fn end(
        &self,
        begun: Begun,
        refused: bool,
        name: &str,
        kind: i32,
        attributes: Vec<KeyValue>,
        status: Option<super::proto::Status>,
    ) {
        if !(begun.sampled || refused && self.sampling.refusals) {
            return;
        }
        let span = Span {
            trace_id: begun.trace_id.to_vec(),
            span_id: begun.span_id.to_vec(),
            parent_span_id: begun.parent.map(|p| p.to_vec()).unwrap_or_default(),
            name: name.to_string(),
            kind,
            start_time_unix_nano: begun.start,
            end_time_unix_nano: unix_nanos().max(begun.start),
            attributes,
            status,
        };
        if self.queue.try_send(span).is_err() {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The record an admitted request's decision is noted in until its response ends, for a
    /// request whose `traceparent` is `parent`: when its span is sampled (the request then
    /// goes on as a child of the decision's span), or when it is `pending` shared rules that
    /// may still refuse it and refusals are traced.
    pub fn record(
        self: &Arc<Self>,
        parent: Option<TraceParent>,
        pending: bool,
    ) -> Option<DecisionRecord> {
        let (trace_id, sampled) = self.sample(parent.as_ref());
        if !(sampled || pending && self.sampling.refusals) {
            return None;
        }
        let begun = self.start(trace_id, parent, sampled);
        let tracer = self.clone();
        let on_end = move |d: Decided| tracer.end_decided(begun, d);
        Some(if sampled {
            DecisionRecord::with_child(begun.child(), on_end)
        } else {
            DecisionRecord::new(on_end)
        })
    }

    /// Queues the span of a rules layer's decision `d` (none when no rule applied).
    fn end_decided(&self, begun: Begun, d: Decided) {
        let Some(resource) = d.resource else {
            return;
        };
        let refused = d.refused_by.is_some();
        if !self.wants(&begun, refused) {
            return;
        }
        let verdict = match (&d.refused_by, d.fallback) {
            (None, _) => "admitted",
            (Some(_), true) => "fallback",
            (Some(_), false) => "refused",
        };
        let mut a = vec![
            KeyValue::string("weir.resource", resource),
            KeyValue::string("weir.verdict", verdict),
        ];
        if let Some((rule, kind)) = d.refused_by {
            a.push(KeyValue::string("weir.rule", rule));
            a.push(KeyValue::string("weir.rule.kind", kind.as_str()));
        }
        if !d.origin.is_empty() || !d.params.is_empty() {
            let parts =
                std::iter::once(d.origin.as_str()).chain(d.params.iter().map(String::as_str));
            a.push(KeyValue::string("weir.key.digest", self.digest(parts)));
        }
        if let Some(e) = d.estimate {
            a.push(KeyValue::int("weir.cost.estimate", e));
        }
        if let Some(s) = d.settled {
            a.push(KeyValue::int("weir.cost.settled", s));
        }
        if d.abandoned {
            a.push(KeyValue::bool("weir.cost.abandoned", true));
        }
        self.end(begun, refused, "weir.decision", KIND_INTERNAL, a, None);
    }

    /// The digest of a key's `parts`: 16 hex digits of SHA-256 over the salt and the parts.
    pub fn digest<'a>(&self, parts: impl IntoIterator<Item = &'a str>) -> String {
        let mut h = Sha256::new();
        h.update(self.salt);
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p.as_bytes());
        }
        let mut s = String::with_capacity(16);
        push_hex(&mut s, &h.finalize()[..8]);
        s
    }

    /// Spans dropped so far (the queue was full).
    pub fn dropped(&self) -> u64 {
        self.stats.dropped.load(Ordering::Relaxed)
    }
}

/// A rules layer's tracer: a refusal's span at once, an admission's through its record.
///
/// `weir proxy`'s rules layer calls it (`Proxy::trace`); the headers are the client's, of
/// which only `traceparent` is read.
pub struct LayerTracer(pub Arc<Tracer>);

impl weir_tower::trace::DecisionTracer for LayerTracer {
    fn admitted(&self, headers: &http::HeaderMap, pending: bool) -> Option<DecisionRecord> {
        self.0.record(TraceParent::from_headers(headers), pending)
    }

    fn refused(&self, headers: &http::HeaderMap, decided: Decided) {
        if let Some(begun) = self.0.begin(TraceParent::from_headers(headers)) {
            self.0.end_decided(begun, decided);
        }
    }
}

/// The salt of key digests: `WEIR_TRACE_KEY_SALT`'s bytes hashed, else random per process.
fn salt(given: Option<&str>) -> [u8; 32] {
    match given.filter(|s| !s.is_empty()) {
        Some(s) => Sha256::digest(s.as_bytes()).into(),
        None => {
            let mut salt = [0u8; 32];
            for chunk in salt.chunks_mut(8) {
                chunk.copy_from_slice(&fastrand::u64(..).to_le_bytes());
            }
            salt
        }
    }
}

fn new_trace_id() -> [u8; 16] {
    loop {
        let id = fastrand::u128(..).to_be_bytes();
        if id != [0; 16] {
            return id;
        }
    }
}

fn new_span_id() -> [u8; 8] {
    fastrand::u64(1..).to_be_bytes()
}

/// A trace id's random part: its last 7 bytes, as a number below 2^56.
fn random_part(id: &[u8; 16]) -> u64 {
    let mut b = [0u8; 8];
    b[1..].copy_from_slice(&id[9..]);
    u64::from_be_bytes(b)
}

/// A minute between log lines about a failing collector.
static FAILURES: LogGate = LogGate::new(60_000_000_000);

/// Starts the trace export `settings` ask for (none without sampling or a traces endpoint):
/// the tracer to record decisions with, and the task sending its spans.
pub(crate) fn spawn(
    registry: &Metrics,
    settings: &Settings,
) -> Option<(Arc<Tracer>, tokio::task::JoinHandle<()>)> {
    let (sampling, target) = (settings.sampling?, settings.traces_target.clone()?);
    let (tracer, rx) = Tracer::new(sampling, registry);
    let sender = Sender::new(settings.protocol, target, settings.timeout, GRPC_TRACES);
    let resource = resource(settings);
    let task = tokio::spawn(run(rx, sender, resource, tracer.stats.clone()));
    Some((tracer, task))
}

/// Sends queued spans in batches of at most [`MAX_BATCH`], one export at a time, within
/// [`BATCH_DELAY`] of the first span of a batch.
async fn run(
    mut rx: mpsc::Receiver<Span>,
    sender: Sender,
    resource: super::proto::Resource,
    stats: Arc<Outcomes>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        if rx.recv_many(&mut batch, MAX_BATCH).await == 0 {
            return;
        }
        let deadline = tokio::time::Instant::now() + BATCH_DELAY;
        while batch.len() < MAX_BATCH {
            let more = MAX_BATCH - batch.len();
            match tokio::time::timeout_at(deadline, rx.recv_many(&mut batch, more)).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let n = batch.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "weir".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                    }),
                    spans: std::mem::take(&mut batch),
                }],
            }],
        };
        match sender.send(&request).await {
            Ok(()) => {
                stats.sent.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                stats.failed.fetch_add(n, Ordering::Relaxed);
                if let Some(held) = FAILURES.open(monotonic_nanos()) {
                    tracing::warn!(
                        error = %e,
                        failures_not_logged = held,
                        "OTLP span export failed (logged at most once a minute; counted in weir_otlp_spans_total)"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracer(ratio: f64, parent_based: bool, refusals: bool) -> Arc<Tracer> {
        let sampling = Sampling {
            ratio,
            parent_based,
            refusals,
        };
        Tracer::new(sampling, &Metrics::default()).0
    }

    fn parent(sampled: bool) -> TraceParent {
        TraceParent {
            trace_id: [7; 16],
            span_id: [9; 8],
            flags: u8::from(sampled),
        }
    }

    #[test]
    fn a_sampled_caller_is_followed_and_an_unsampled_one_is_not() {
        let t = tracer(0.0, true, false);
        let b = t.begin(Some(parent(true))).expect("the caller sampled it");
        assert_eq!(b.trace_id, [7; 16]);
        assert_eq!(b.parent, Some([9; 8]));
        assert_ne!(b.span_id, [0; 8]);
        assert!(t.begin(Some(parent(false))).is_none());
        assert!(t.begin(None).is_none(), "ratio 0");
        // Refusals traced: every decision is begun, sampled or not.
        let r = tracer(0.0, true, true);
        assert!(!r.begin(Some(parent(false))).expect("begun").sampled);
    }

    #[test]
    fn the_ratio_samples_about_its_share_of_new_traces() {
        let t = tracer(0.25, true, false);
        let n = (0..20_000).filter(|_| t.begin(None).is_some()).count();
        assert!((4_400..5_600).contains(&n), "{n} of 20 000 at 0.25");
        assert_eq!(
            (0..1_000)
                .filter(|_| tracer(1.0, false, false).begin(None).is_some())
                .count(),
            1_000
        );
    }

    #[test]
    fn keys_are_digested_with_the_salt_never_sent_as_they_are() {
        let t = tracer(1.0, true, false);
        let d = t.digest(["10.0.0.1", "alice"]);
        assert_eq!(d.len(), 16);
        assert!(!d.contains("10.0.0.1"));
        assert_eq!(d, t.digest(["10.0.0.1", "alice"]));
        // Parts are delimited: ("ab", "c") is not ("a", "bc").
        assert_ne!(t.digest(["ab", "c"]), t.digest(["a", "bc"]));
        // A set salt digests alike everywhere; two random ones do not.
        assert_eq!(salt(Some("s")), salt(Some("s")));
        assert_ne!(salt(None), salt(None));
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let sampling = Sampling {
            ratio: 1.0,
            parent_based: false,
            refusals: false,
        };
        let (t, _rx) = Tracer::new(sampling, &Metrics::default());
        for _ in 0..MAX_QUEUED + 10 {
            let b = t.begin(None).expect("sampled");
            t.end(b, false, "x", KIND_INTERNAL, Vec::new(), None);
        }
        assert_eq!(t.dropped(), 10);
    }

    #[test]
    fn an_unsampled_admission_is_not_recorded_but_its_refusal_is_sent() {
        use weir_tower::trace::DecisionTracer;
        let (t, mut rx) = Tracer::new(
            Sampling {
                ratio: 0.0,
                parent_based: true,
                refusals: true,
            },
            &Metrics::default(),
        );
        let layer = LayerTracer(t.clone());
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", parent(false).header_value());
        assert!(
            layer.admitted(&headers, false).is_none(),
            "admitted, not sampled: nothing to note"
        );
        layer.refused(
            &headers,
            Decided {
                resource: Some("r".into()),
                refused_by: Some(("q".into(), weir_rules::engine::RuleKind::Flow)),
                origin: "10.0.0.1".into(),
                ..Decided::default()
            },
        );
        let span = rx.try_recv().expect("the refusal's span");
        assert_eq!(span.parent_span_id, vec![9; 8]);
        let text = format!("{:?}", span.attributes);
        assert!(text.contains("refused") && text.contains("weir.key.digest"));
        assert!(!text.contains("10.0.0.1"), "{text}");
        // Pending shared rules: recorded, since they may still refuse; admitted in the end,
        // not sampled: no span.
        let pending = layer.admitted(&headers, true).expect("recorded");
        assert!(!pending.sampled());
        pending.note(|d| d.resource = Some("r".into()));
        drop(pending);
        assert!(rx.try_recv().is_err());
    }
}
