//! Trace context for rule decisions: the W3C `traceparent` header ([`TraceParent`]), the
//! tracer a rules layer asks about each decision ([`DecisionTracer`], given with
//! `RulesLayer::with_tracer`) and the record an admitted call's decision is noted in until
//! its response ends ([`DecisionRecord`]), so that each decision can become a span, a child
//! of the caller's.
//!
//! - A refusal is handed to [`DecisionTracer::refused`] at once, with what was decided
//!   ([`Decided`]): the resource, the rule, the caller's key, the cost estimate.
//! - An admitted call gets a record from [`DecisionTracer::admitted`] only when the tracer
//!   wants its span (sampled, or shared rules may still refuse it); the layer notes the
//!   decision in it, and the settled cost when the response ends; when the last holder lets go
//!   the record's `on_end` receives what was noted.
//! - When the record carries a child context ([`DecisionRecord::with_child`]), the layer
//!   replaces the request's `traceparent` with it, so the service behind is a child of the
//!   decision's span. Requests no rule applies to, or not traced, keep their `traceparent`.
//! - Without a tracer, nothing of this runs.
//!
//! Who may call it: the record is put in by server code; `traceparent` comes from any client
//! and is only parsed: 55 bytes exactly, lowercase hex, no all-zero ids — anything else is
//! not a parent (the trace starts anew), never an error.

use std::sync::{Arc, Mutex};

use http::{HeaderMap, HeaderValue};
use weir_rules::engine::RuleKind;

/// The W3C trace-context header.
pub const TRACEPARENT: &str = "traceparent";

/// A W3C `traceparent`: version 00, the trace id, the parent span id and the flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace (16 bytes, not all zero).
    pub trace_id: [u8; 16],
    /// The caller's span (8 bytes, not all zero).
    pub span_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

impl TraceParent {
    /// The first `traceparent` of `headers`, when it is valid (see [`TraceParent::parse`]).
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        Self::parse(headers.get(TRACEPARENT)?.as_bytes())
    }

    /// Parses `00-<32 hex>-<16 hex>-<2 hex>` (lowercase). A later version is read by its
    /// first 55 bytes when a `-` follows them, as the specification asks; version `ff`, an
    /// all-zero id or any other form is `None`.
    pub fn parse(v: &[u8]) -> Option<Self> {
        if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let version = hex_byte(&v[0..2])?;
        match version {
            0 if v.len() == 55 => {}
            0 | 0xff => return None,
            _ if v.len() == 55 || v[55] == b'-' => {}
            _ => return None,
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&v[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, b) in span_id.iter_mut().enumerate() {
            *b = hex_byte(&v[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&v[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// Whether the caller sampled its span (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The header's value (version 00).
    pub fn header_value(&self) -> HeaderValue {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        push_hex(&mut s, &self.trace_id);
        s.push('-');
        push_hex(&mut s, &self.span_id);
        s.push('-');
        push_hex(&mut s, &[self.flags]);
        HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

/// Two lowercase hex digits.
fn hex_byte(two: &[u8]) -> Option<u8> {
    let d = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(d(two[0])? << 4 | d(two[1])?)
}

/// Appends `bytes` as lowercase hex.
pub fn push_hex(s: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
}

/// What a rules layer asks about its decisions (`RulesLayer::with_tracer`). Called on the
/// decision's path: an implementation decides cheaply whether it traces the request and
/// never waits.
pub trait DecisionTracer: Send + Sync + 'static {
    /// A request with `headers` was admitted (`pending`: shared rules decide next and may
    /// still refuse it): the record its decision is noted in until the response ends, when
    /// its span is wanted.
    fn admitted(&self, headers: &HeaderMap, pending: bool) -> Option<DecisionRecord>;

    /// A request with `headers` was refused, as `decided` says.
    fn refused(&self, headers: &HeaderMap, decided: Decided);
}

/// A rules layer's decision on one request, as noted in its [`DecisionRecord`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decided {
    /// The resource the request was routed to (`None`: no rule applied, nothing decided).
    pub resource: Option<String>,
    /// The rule that refused it, and its kind (`None`: admitted).
    pub refused_by: Option<(String, RuleKind)>,
    /// Refused, but passed on to a fallback.
    pub fallback: bool,
    /// The caller's origin (client address or identity; `""`: unknown).
    pub origin: String,
    /// The hot-parameter values the request was keyed by.
    pub params: Vec<String>,
    /// The cost the request stated for its `cost:` rules.
    pub estimate: Option<u64>,
    /// The cost settled when the response ended (`None`: nothing to settle, or not known).
    pub settled: Option<u64>,
    /// The response was dropped before its end: the rules charged what bounds one call.
    pub abandoned: bool,
}

/// Where a rules layer notes its decision on a request, put in the request's extensions by a
/// tracer. Cheap to clone; `on_end` runs once, when the last clone is dropped.
#[derive(Clone)]
pub struct DecisionRecord(Arc<Record>);

struct Record {
    decided: Mutex<Decided>,
    child: Option<TraceParent>,
    on_end: Mutex<Option<OnEnd>>,
}

type OnEnd = Box<dyn FnOnce(Decided) + Send>;

impl DecisionRecord {
    /// A record handing what was noted to `on_end` when its last clone is dropped.
    pub fn new(on_end: impl FnOnce(Decided) + Send + 'static) -> Self {
        Self(Arc::new(Record {
            decided: Mutex::new(Decided::default()),
            child: None,
            on_end: Mutex::new(Some(Box::new(on_end))),
        }))
    }

    /// A record whose admitted request goes on with `child` as its `traceparent` (the
    /// decision's span as the parent of the service's).
    pub fn with_child(child: TraceParent, on_end: impl FnOnce(Decided) + Send + 'static) -> Self {
        Self(Arc::new(Record {
            decided: Mutex::new(Decided::default()),
            child: Some(child),
            on_end: Mutex::new(Some(Box::new(on_end))),
        }))
    }

    /// Whether an admitted request's span is exported (it was sampled: the record carries a
    /// child context); a record not sampled matters only if the request is refused.
    pub fn sampled(&self) -> bool {
        self.0.child.is_some()
    }

    /// Notes with `f`.
    pub fn note(&self, f: impl FnOnce(&mut Decided)) {
        let mut d = self.0.decided.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut d);
    }

    /// Notes a refusal by the rule `rule` of `kind` (`fallback`: passed on to a fallback).
    pub fn refused(&self, rule: &str, kind: RuleKind, fallback: bool) {
        self.note(|d| {
            d.refused_by = Some((rule.to_string(), kind));
            d.fallback = fallback;
        });
    }

    /// What was noted so far.
    pub fn decided(&self) -> Decided {
        self.0
            .decided
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Writes the child context (if any) as the request's `traceparent`.
    pub(crate) fn pass_on(&self, headers: &mut HeaderMap) {
        if let Some(child) = &self.0.child {
            headers.insert(TRACEPARENT, child.header_value());
        }
    }
}

impl std::fmt::Debug for DecisionRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DecisionRecord")
            .field(&self.decided())
            .finish()
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let on_end = self
            .on_end
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(f) = on_end {
            let d = std::mem::take(self.decided.get_mut().unwrap_or_else(|e| e.into_inner()));
            f(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_specifications_example_and_writes_it_back() {
        let t = TraceParent::parse(GOOD.as_bytes()).expect("valid");
        assert_eq!(t.trace_id[0], 0x4b);
        assert_eq!(t.span_id[7], 0xb7);
        assert!(t.sampled());
        assert_eq!(t.header_value(), GOOD);
    }

    #[test]
    fn refuses_every_malformed_form() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ];
        for b in bad {
            assert_eq!(TraceParent::parse(b.as_bytes()), None, "{b:?}");
        }
        // A later version: its first 55 bytes, when a '-' follows.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(TraceParent::parse(later.as_bytes()).is_some());
    }

    #[test]
    fn the_record_reaches_its_end_once_with_what_was_noted() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = got.clone();
        let r = DecisionRecord::new(move |d| sink.lock().unwrap().push(d));
        let r2 = r.clone();
        r.note(|d| d.resource = Some("chat".into()));
        drop(r);
        assert!(got.lock().unwrap().is_empty(), "a clone still holds it");
        r2.note(|d| d.settled = Some(7));
        drop(r2);
        let got = got.lock().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].resource.as_deref(), Some("chat"));
        assert_eq!(got[0].settled, Some(7));
    }
}
