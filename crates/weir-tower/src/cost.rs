//! Costs stated over HTTP, for rules with `cost:` (weir-rules' `estimate_from` /
//! `actual_from`): the estimate read from a request header or a field of a JSON request body,
//! the actual cost from a response header, a trailer, a field of a JSON response body or of
//! the last Server-Sent Event carrying it — read as the body passes, never buffered whole,
//! each read bounded by [`MAX_COST_JSON`].
//!
//! A cost that is not a whole number ≥ 0 (or a float that is not finite) counts as absent:
//! the estimate stays, and the bad value is logged (at most once a second). A value above the
//! rule's `max` counts as the `max` (weir-rules caps it).
//!
//! [`ReadJsonLayer`] reads a JSON request body's first bytes before the rules so that
//! `estimate_from: {json: …}` can see them, and hands the body on whole.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request};
use http_body::{Body, Frame, SizeHint};
use tower::{Layer, Service};
pub use weir_rules::config::MAX_COST_JSON;
use weir_rules::config::{ActualFrom, EstimateFrom};

/// A cost that could not be read: what was wrong, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadCost {
    /// Not a number.
    NotANumber,
    /// Below zero.
    Negative,
}

impl BadCost {
    fn as_str(self) -> &'static str {
        match self {
            BadCost::NotANumber => "not a number",
            BadCost::Negative => "negative",
        }
    }
}

/// Reads a cost from text: a whole number, or a finite number ≥ 0 rounded up; surrounding
/// spaces allowed.
pub fn parse_cost(text: &[u8]) -> Result<u64, BadCost> {
    let t = std::str::from_utf8(text)
        .map_err(|_| BadCost::NotANumber)?
        .trim();
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    match t.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 => Ok(f.ceil().min(u64::MAX as f64) as u64),
        Ok(f) if f < 0.0 => Err(BadCost::Negative),
        _ if t.starts_with('-') && t[1..].parse::<u64>().is_ok() => Err(BadCost::Negative),
        _ => Err(BadCost::NotANumber),
    }
}

/// Bad-cost log lines: at most one a second, whatever an attacker sends.
static BAD_COST_LOG: weir_core::log_gate::LogGate =
    weir_core::log_gate::LogGate::new(1_000_000_000);

/// Logs a bad cost `value` (its first 32 bytes, escaped) read from `place`.
fn log_bad(what: &str, place: &str, value: &[u8], why: BadCost) {
    use weir_core::Clock;
    let Some(held) = BAD_COST_LOG.open(weir_core::MonotonicClock::new().now()) else {
        return;
    };
    let shown = String::from_utf8_lossy(&value[..value.len().min(32)]);
    let more = if value.len() > 32 { "…" } else { "" };
    tracing::warn!(
        "{what} cost in {place} is {} ({:?}{more}): counted as the estimate ({held} more bad costs not logged since the last line)",
        why.as_str(),
        shown
    );
}

/// Reads a header holding a cost; absent or bad (logged): `None`.
fn header_cost(headers: &HeaderMap, name: &str, what: &str) -> Option<u64> {
    let v = headers.get(name)?;
    match parse_cost(v.as_bytes()) {
        Ok(n) => Some(n),
        Err(e) => {
            log_bad(what, name, v.as_bytes(), e);
            None
        }
    }
}

/// The field at dotted `path` of the JSON document `doc`, as a cost (`None`: no such field,
/// or not a number ≥ 0, logged).
pub fn json_cost(doc: &[u8], path: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(doc).ok()?;
    let mut at = &v;
    for key in path.split('.') {
        at = at.get(key)?;
    }
    let n = match at {
        serde_json::Value::Number(n) => n,
        serde_json::Value::Null => return None,
        other => {
            log_bad(
                "a JSON",
                path,
                other.to_string().as_bytes(),
                BadCost::NotANumber,
            );
            return None;
        }
    };
    match n.as_u64() {
        Some(n) => Some(n),
        None => {
            let text = n.to_string();
            match parse_cost(text.as_bytes()) {
                Ok(n) => Some(n),
                Err(e) => {
                    log_bad("a JSON", path, text.as_bytes(), e);
                    None
                }
            }
        }
    }
}

/// A JSON request body's first bytes, read by [`ReadJsonLayer`]: the whole body when it fits
/// [`MAX_COST_JSON`].
#[derive(Debug, Clone)]
pub struct RequestJson(pub Bytes);

/// The estimate a request with `headers` and `extensions` states at `from` (`None`: absent
/// or unreadable, the rule's own estimate counts).
pub fn request_estimate(
    headers: &HeaderMap,
    extensions: &http::Extensions,
    from: &EstimateFrom,
) -> Option<u64> {
    match from {
        EstimateFrom::Header(h) => header_cost(headers, h, "a request"),
        EstimateFrom::Json(path) => {
            let json = extensions.get::<RequestJson>()?;
            json_cost(&json.0, path)
        }
    }
}

/// The actual cost a response states in its head (`actual_from: {header: …}`).
pub fn response_header_cost(headers: &HeaderMap, from: &ActualFrom) -> Option<u64> {
    match from {
        ActualFrom::Header(h) => header_cost(headers, h, "a response"),
        _ => None,
    }
}

/// Reads the actual cost from a response body as its frames pass (trailers, a JSON body, a
/// Server-Sent Events stream), holding at most [`MAX_COST_JSON`] bytes.
#[derive(Debug)]
pub struct ActualReader {
    kind: Reading,
    /// The cost found so far.
    found: Option<u64>,
}

#[derive(Debug)]
enum Reading {
    Trailer(Box<str>),
    /// The body so far; `None` once it outgrew the bound.
    Json {
        path: Box<str>,
        body: Option<BytesMut>,
    },
    Sse(Box<SseScan>),
}

impl ActualReader {
    /// A reader for `from`; `None` for a response header (read from the head) .
    pub fn new(from: &ActualFrom) -> Option<Self> {
        let kind = match from {
            ActualFrom::Header(_) => return None,
            ActualFrom::Trailer(t) => Reading::Trailer(t.as_str().into()),
            ActualFrom::Json(p) => Reading::Json {
                path: p.as_str().into(),
                body: Some(BytesMut::new()),
            },
            ActualFrom::Sse(p) => Reading::Sse(Box::new(SseScan::new(p))),
        };
        Some(Self { kind, found: None })
    }

    /// Looks at one frame of the response body.
    pub fn frame(&mut self, frame: &Frame<Bytes>) {
        match (&mut self.kind, frame.data_ref(), frame.trailers_ref()) {
            (Reading::Trailer(name), _, Some(t)) => {
                self.found = header_cost(t, name, "a trailer").or(self.found);
            }
            (Reading::Json { body, .. }, Some(data), _) => {
                if let Some(b) = body {
                    if b.len() + data.len() > MAX_COST_JSON {
                        *body = None;
                    } else {
                        b.extend_from_slice(data);
                    }
                }
            }
            (Reading::Sse(scan), Some(data), _) => {
                if let Some(n) = scan.feed(data) {
                    self.found = Some(n);
                }
            }
            _ => {}
        }
    }

    /// The cost read so far, for a body that will not end (the client went away): a trailer
    /// or the last complete Server-Sent Event stating it; a JSON body counts only once whole.
    pub fn known(&self) -> Option<u64> {
        self.found
    }

    /// The cost the body stated, once it ended (`None`: it stated none).
    pub fn finish(self) -> Option<u64> {
        match self.kind {
            Reading::Json {
                path,
                body: Some(b),
            } => json_cost(&b, &path),
            Reading::Sse(mut scan) => scan.end().or(self.found),
            _ => self.found,
        }
    }
}

/// Scans a Server-Sent Events stream for the last event whose JSON `data` has the field at
/// `path` (OpenAI-style streams end with a `usage` event, then `data: [DONE]`).
#[derive(Debug)]
struct SseScan {
    path: Box<str>,
    /// The current line so far; `None` while skipping a line longer than the bound.
    line: Option<Vec<u8>>,
    /// The current event's data lines; `None` while skipping an event over the bound.
    data: Option<Vec<u8>>,
    /// The last byte seen was `\r` (a `\r\n` pair ends one line, not two).
    after_cr: bool,
}

impl SseScan {
    fn new(path: &str) -> Self {
        Self {
            path: path.into(),
            line: Some(Vec::new()),
            data: Some(Vec::new()),
            after_cr: false,
        }
    }

    /// Feeds a chunk; the cost of the last complete event in it that states one.
    fn feed(&mut self, chunk: &[u8]) -> Option<u64> {
        let mut found = None;
        for &b in chunk {
            let cr_lf = self.after_cr && b == b'\n';
            self.after_cr = b == b'\r';
            if cr_lf {
                continue;
            }
            if b == b'\n' || b == b'\r' {
                if let Some(n) = self.end_line() {
                    found = Some(n);
                }
                continue;
            }
            if let Some(l) = &mut self.line {
                if l.len() < MAX_COST_JSON {
                    l.push(b);
                } else {
                    self.line = None;
                }
            }
        }
        found
    }

    /// The stream ended: a last event not followed by a blank line still counts.
    fn end(&mut self) -> Option<u64> {
        let a = self.end_line();
        a.or_else(|| self.dispatch())
    }

    /// A line ended: a data line adds to the event, a blank line dispatches it.
    fn end_line(&mut self) -> Option<u64> {
        let line = self.line.replace(Vec::new());
        let Some(line) = line else {
            // Too long: the event is spoiled.
            self.data = None;
            return None;
        };
        if line.is_empty() {
            return self.dispatch();
        }
        if let Some(rest) = line.strip_prefix(b"data:") {
            let rest = rest.strip_prefix(b" ").unwrap_or(rest);
            if let Some(d) = &mut self.data {
                if d.len() + rest.len() + 1 > MAX_COST_JSON {
                    self.data = None;
                } else {
                    if !d.is_empty() {
                        d.push(b'\n');
                    }
                    d.extend_from_slice(rest);
                }
            }
        }
        None
    }

    fn dispatch(&mut self) -> Option<u64> {
        let data = self.data.replace(Vec::new())?;
        if data.first() != Some(&b'{') {
            return None;
        }
        json_cost(&data, &self.path)
    }
}

/// Reads the first [`MAX_COST_JSON`] bytes of JSON request bodies into a [`RequestJson`]
/// extension, for rules whose estimate is a JSON field (`estimate_from: {json: …}`), then
/// hands the body on whole ([`ReplayBody`]). Reads only requests `wanted` picks — those routed
/// to a resource that takes its estimate from the body (e.g.
/// [`crate::rules::RulesLayer::reads_request_json`]) — and only bodies whose content type is
/// JSON; a body slower than `timeout` to arrive is handed on with what came. With a budget
/// ([`ReadJsonLayer::with_budget`]) the bytes held count against it; a body that would pass it
/// is handed on unread (its call holds the rule's own estimate).
#[derive(Clone)]
pub struct ReadJsonLayer {
    wanted: Arc<dyn Fn(&http::request::Parts) -> bool + Send + Sync>,
    timeout: Duration,
    budget: Option<Arc<dyn crate::prefix::ReadBudget>>,
}

impl ReadJsonLayer {
    /// Reads the JSON bodies of requests `wanted` picks (given the request's head), waiting
    /// at most `timeout` for their first bytes.
    pub fn new(
        wanted: impl Fn(&http::request::Parts) -> bool + Send + Sync + 'static,
        timeout: Duration,
    ) -> Self {
        Self {
            wanted: Arc::new(wanted),
            timeout,
            budget: None,
        }
    }

    /// Counts the bytes held against `budget` (e.g. one connection's share of the process's).
    pub fn with_budget(mut self, budget: Arc<dyn crate::prefix::ReadBudget>) -> Self {
        self.budget = Some(budget);
        self
    }
}

impl<S> Layer<S> for ReadJsonLayer {
    type Service = ReadJson<S>;

    fn layer(&self, inner: S) -> ReadJson<S> {
        ReadJson {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`ReadJsonLayer`].
#[derive(Clone)]
pub struct ReadJson<S> {
    inner: S,
    layer: ReadJsonLayer,
}

/// Whether a request says its body is JSON (`application/json`, `…+json`).
fn is_json<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| {
            let t = t.trim();
            t.eq_ignore_ascii_case("application/json") || t.ends_with("+json")
        })
}

impl<S, B> Service<Request<B>> for ReadJson<S>
where
    S: Service<Request<ReplayBody<B>>> + Clone + Send + 'static,
    S::Future: Send,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ReadJsonFuture<S::Future, S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if !is_json(&req) {
            return ReadJsonFuture::Direct {
                f: self.inner.call(req.map(ReplayBody::whole)),
            };
        }
        let (parts, body) = req.into_parts();
        if !(self.layer.wanted)(&parts) {
            let req = Request::from_parts(parts, ReplayBody::whole(body));
            return ReadJsonFuture::Direct {
                f: self.inner.call(req),
            };
        }
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let timeout = self.layer.timeout;
        let budget = self.layer.budget.clone();
        ReadJsonFuture::Reading {
            f: Box::pin(async move {
                let (mut parts, mut body) = (parts, body);
                // A body slower than the timeout is handed on with what came.
                let crate::prefix::Prefix {
                    bytes,
                    hold,
                    trailers,
                    ended,
                    failed,
                    ..
                } = crate::prefix::read_prefix(&mut body, MAX_COST_JSON, budget, Some(timeout))
                    .await;
                if ended && failed.is_none() {
                    parts.extensions.insert(RequestJson(bytes.clone()));
                }
                let body = ReplayBody::Replay {
                    hold: hold.map(Box::new),
                    prefix: Some(bytes),
                    failed,
                    trailers,
                    rest: (!ended).then_some(body),
                };
                inner.call(Request::from_parts(parts, body)).await
            }),
        }
    }
}

/// A boxed future of a read body's call.
type BodyRead<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

pin_project_lite::pin_project! {
    /// The future of [`ReadJson`]: the inner call at once (no body to read: no allocation),
    /// or after reading the body.
    // pin-project-lite takes no documentation on variant fields: the states are what
    // the variants' own documentation says.
    #[allow(missing_docs)]
    #[project = ReadJsonProj]
    pub enum ReadJsonFuture<F, R, E> {
        /// Not read: the inner call.
        Direct { #[pin] f: F },
        /// Reading the body, then the inner call.
        Reading { f: BodyRead<R, E> },
    }
}

impl<F: Future<Output = Result<R, E>>, R, E> Future for ReadJsonFuture<F, R, E> {
    type Output = Result<R, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<R, E>> {
        match self.project() {
            ReadJsonProj::Direct { f } => f.poll(cx),
            ReadJsonProj::Reading { f } => f.as_mut().poll(cx),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request body handed on by [`ReadJson`]: untouched, or the bytes it read followed by
    /// the rest.
    // pin-project-lite takes no documentation on variant fields: the states are what
    // the variants' own documentation says.
    #[allow(missing_docs)]
    #[project = ReplayProj]
    pub enum ReplayBody<B: Body> {
        /// Not read.
        Whole { #[pin] body: B },
        /// Read in part or whole: the bytes read, then what ended the read (an error, the
        /// trailers), then the rest of the body if it had not ended.
        Replay {
            prefix: Option<Bytes>,
            // The budget the bytes read hold until they are handed on.
            hold: Option<Box<crate::prefix::BudgetHold>>,
            failed: Option<B::Error>,
            trailers: Option<HeaderMap>,
            rest: Option<B>,
        },
    }
}

impl<B: Body> ReplayBody<B> {
    /// `body`, untouched.
    pub fn whole(body: B) -> Self {
        Self::Whole { body }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for ReplayBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project() {
            ReplayProj::Whole { body } => body.poll_frame(cx),
            ReplayProj::Replay {
                prefix,
                hold,
                failed,
                trailers,
                rest,
            } => {
                let p = prefix.take();
                // Handed on: the budget is free again.
                hold.take();
                if let Some(p) = p.filter(|p| !p.is_empty()) {
                    return Poll::Ready(Some(Ok(Frame::data(p))));
                }
                if let Some(e) = failed.take() {
                    return Poll::Ready(Some(Err(e)));
                }
                if let Some(t) = trailers.take() {
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                match rest {
                    Some(b) => Pin::new(b).poll_frame(cx),
                    None => Poll::Ready(None),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Whole { body } => body.is_end_stream(),
            Self::Replay {
                prefix,
                failed,
                trailers,
                rest,
                ..
            } => {
                prefix.as_ref().is_none_or(Bytes::is_empty)
                    && failed.is_none()
                    && trailers.is_none()
                    && rest.as_ref().is_none_or(Body::is_end_stream)
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Whole { body } => body.size_hint(),
            Self::Replay { prefix, rest, .. } => {
                let p = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let rest = rest
                    .as_ref()
                    .map_or(SizeHint::with_exact(0), Body::size_hint);
                let mut h = SizeHint::new();
                // The upper bound first: a lower bound above it is refused.
                if let Some(u) = rest.upper() {
                    h.set_upper(u.saturating_add(p));
                }
                h.set_lower(rest.lower().saturating_add(p));
                h
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body read in part is handed on whole, its size hint counting the bytes read.
    #[tokio::test]
    async fn read_bodies_are_handed_on_whole() {
        use http_body_util::BodyExt;
        let big = Bytes::from(vec![b'x'; MAX_COST_JSON + 100]);
        for body in [Bytes::from_static(b"{\"max_tokens\": 7}"), big] {
            let inner = tower::service_fn(
                |req: Request<ReplayBody<http_body_util::Full<Bytes>>>| async move {
                    let seen = req.extensions().get::<RequestJson>().map(|j| j.0.len());
                    let hint = req.body().size_hint();
                    let got = req.into_body().collect().await.unwrap().to_bytes();
                    Ok::<_, std::convert::Infallible>((seen, hint.lower(), hint.upper(), got))
                },
            );
            let svc = ReadJsonLayer::new(|_| true, Duration::from_secs(1)).layer(inner);
            let req = Request::post("/")
                .header("content-type", "application/json; charset=utf-8")
                .body(http_body_util::Full::new(body.clone()))
                .unwrap();
            let (seen, lower, upper, got) = tower::ServiceExt::oneshot(svc, req).await.unwrap();
            let n = body.len() as u64;
            assert_eq!(got, body);
            assert_eq!((lower, upper), (n, Some(n)));
            // Only a body that fits is read as JSON.
            assert_eq!(seen, (body.len() <= MAX_COST_JSON).then_some(body.len()));
        }
    }

    #[test]
    fn costs_parse_or_say_why_not() {
        assert_eq!(parse_cost(b" 120 "), Ok(120));
        assert_eq!(parse_cost(b"12.2"), Ok(13));
        assert_eq!(parse_cost(b"-5"), Err(BadCost::Negative));
        assert_eq!(parse_cost(b"-0.5"), Err(BadCost::Negative));
        assert_eq!(parse_cost(b"ten"), Err(BadCost::NotANumber));
        assert_eq!(parse_cost(b"NaN"), Err(BadCost::NotANumber));
        assert_eq!(parse_cost(b"inf"), Err(BadCost::NotANumber));
        assert_eq!(parse_cost(&[0xff, b'1']), Err(BadCost::NotANumber));
        assert_eq!(parse_cost(b"99999999999999999999999"), Ok(u64::MAX));
    }

    #[test]
    fn json_fields_by_dotted_path() {
        let doc = br#"{"usage": {"total_tokens": 321, "neg": -3, "s": "9"}, "max_tokens": 50.5}"#;
        assert_eq!(json_cost(doc, "usage.total_tokens"), Some(321));
        assert_eq!(json_cost(doc, "max_tokens"), Some(51));
        assert_eq!(json_cost(doc, "usage.neg"), None);
        assert_eq!(json_cost(doc, "usage.s"), None);
        assert_eq!(json_cost(doc, "usage.missing"), None);
        assert_eq!(json_cost(b"{not json", "a"), None);
    }

    fn sse(chunks: &[&[u8]]) -> Option<u64> {
        let mut r = ActualReader::new(&ActualFrom::Sse("usage.total_tokens".into())).unwrap();
        for c in chunks {
            r.frame(&Frame::data(Bytes::copy_from_slice(c)));
        }
        r.finish()
    }

    #[test]
    fn the_last_sse_event_stating_usage_counts() {
        // Chunks split anywhere, CRLF or LF, multi-line data, a final [DONE].
        let stream = b"data: {\"choices\":[{\"delta\":\"hi\"}]}\n\ndata: {\"usage\":\r\ndata: {\"total_tokens\": 7}}\r\n\r\n: comment\n\ndata: {\"usage\":{\"total_tokens\":42}}\n\ndata: [DONE]\n\n";
        for split in [1, 2, 7, 13, stream.len()] {
            let chunks: Vec<&[u8]> = stream.chunks(split).collect();
            assert_eq!(sse(&chunks), Some(42), "split {split}");
        }
        // The last event may end with the stream rather than a blank line.
        assert_eq!(sse(&[b"data: {\"usage\":{\"total_tokens\":5}}"]), Some(5));
        assert_eq!(sse(&[b"data: {\"choices\":[]}\n\n"]), None);
    }

    #[test]
    fn oversized_events_and_lines_are_skipped_not_kept() {
        let mut huge = b"data: {\"pad\":\"".to_vec();
        huge.resize(MAX_COST_JSON + 10, b'x');
        huge.extend_from_slice(b"\", \"usage\":{\"total_tokens\":9}}\n\n");
        assert_eq!(sse(&[&huge]), None);
        let mut after = huge.clone();
        after.extend_from_slice(b"data: {\"usage\":{\"total_tokens\":3}}\n\n");
        assert_eq!(sse(&[&after]), Some(3));
        // A JSON body past the bound keeps the estimate.
        let mut r = ActualReader::new(&ActualFrom::Json("n".into())).unwrap();
        r.frame(&Frame::data(Bytes::from(vec![b' '; MAX_COST_JSON])));
        r.frame(&Frame::data(Bytes::from_static(b"{\"n\":1}")));
        assert_eq!(r.finish(), None);
    }

    #[test]
    fn trailers_and_json_bodies() {
        let mut r = ActualReader::new(&ActualFrom::Trailer("x-cost".into())).unwrap();
        r.frame(&Frame::data(Bytes::from_static(b"abc")));
        let mut t = HeaderMap::new();
        t.insert("x-cost", http::HeaderValue::from_static("17"));
        r.frame(&Frame::trailers(t));
        assert_eq!(r.finish(), Some(17));
        let mut r = ActualReader::new(&ActualFrom::Json("usage.total_tokens".into())).unwrap();
        for c in [&b"{\"usage\": {\"total"[..], b"_tokens\": 88}}"] {
            r.frame(&Frame::data(Bytes::from_static(c)));
        }
        assert_eq!(r.finish(), Some(88));
    }
}
