//! What the layer answers: a block as an HTTP or gRPC response, and what an admitted request
//! holds until its response ends ([`Admitted`]: the guard, costs settled).

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use weir_core::{Clock, MonotonicClock};
use weir_rules::engine::{Block, Guard, RuleKind};

use crate::problem;
use crate::trace::DecisionRecord;

/// The answer to a blocked request: 429 for rate rules, 403 for authority, 503 for breakers
/// and system rules; `Retry-After` in whole seconds rounded up when the wait is known; rate
/// rules add `RateLimit-Policy` / `RateLimit`; always an `application/problem+json` body.
pub fn blocked_response<B: From<String>>(block: &Block) -> Response<B> {
    let (status, what) = match block.kind {
        RuleKind::Flow | RuleKind::HotParam => (StatusCode::TOO_MANY_REQUESTS, "rate limit"),
        RuleKind::Authority => (StatusCode::FORBIDDEN, "caller not allowed by"),
        RuleKind::Breaker => (StatusCode::SERVICE_UNAVAILABLE, "circuit breaker open:"),
        RuleKind::System => (StatusCode::SERVICE_UNAVAILABLE, "overloaded:"),
        RuleKind::Switch => (StatusCode::SERVICE_UNAVAILABLE, "switched off:"),
    };
    let retry = block.retry_after.map(|r| problem::ceil_secs(r).max(1));
    // A rate rule that had room left yet refused with no retry time: the call asked for more
    // than the rule can ever hold (a cost estimate above its burst). Waiting will not help.
    let remaining = block.remaining.map_or(0, |r| r.get());
    let never = block.rate.is_some() && retry.is_none() && remaining > 0;
    let detail = match retry {
        Some(s) => format!("{what} {} exceeded; retry in {s} s", block.rule),
        None if never => format!(
            "{what} {}: the call asks for more than the rule can ever hold ({} left now); lower its estimate (max_tokens) — no wait lets it pass",
            block.rule, remaining
        ),
        None => format!("{what} {}", block.rule),
    };
    let mut r = problem::problem(status, &detail);
    if let Some(s) = retry {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    if let Some((limit, window)) = block.rate {
        let policy = format!(
            "\"{}\";q={limit};w={}",
            block.rule,
            problem::ceil_secs(window).max(1)
        );
        let now = format!(
            "\"{}\";r={};t={}",
            block.rule,
            remaining,
            retry.unwrap_or(0)
        );
        if let (Ok(p), Ok(n)) = (HeaderValue::from_str(&policy), HeaderValue::from_str(&now)) {
            r.headers_mut().insert("ratelimit-policy", p);
            r.headers_mut().insert("ratelimit", n);
        }
    }
    r
}

/// The gRPC answer to a blocked call: HTTP 200, trailers-only (empty body, the status in the
/// headers) with `grpc-status` 8 RESOURCE_EXHAUSTED for rate rules, 7 PERMISSION_DENIED for
/// authority, 14 UNAVAILABLE for breakers and system rules; `grpc-message` (percent-encoded);
/// `grpc-retry-pushback-ms` when the wait is known (gRPC's retry pushback).
pub fn blocked_grpc_response<B: From<String>>(block: &Block) -> Response<B> {
    let code = match block.kind {
        RuleKind::Flow | RuleKind::HotParam => 8,
        RuleKind::Authority => 7,
        RuleKind::Breaker | RuleKind::System | RuleKind::Switch => 14,
    };
    let message = format!("blocked by {} rule {}", block.kind.as_str(), block.rule);
    let mut r = Response::new(B::from(String::new()));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert("grpc-status", HeaderValue::from(code));
    if let Ok(v) = HeaderValue::from_str(&crate::problem::grpc_message(&message)) {
        h.insert("grpc-message", v);
    }
    if let Some(wait) = block.retry_after {
        let ms = u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        h.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
    }
    r
}

/// A response body holding the rules' guard until it ends (completed: success, or error for
/// a 5xx or a body error) or is dropped (released without an outcome).
pub type GuardBody<B, C> = crate::body::HeldBody<B, Admitted<C>>;

/// What an admitted request holds until its response ends: the rules' guard and, for rules
/// with `cost:`, the reader of the actual cost.
///
/// Settlement when the response ends: the cost the response stated (header, trailer, JSON
/// field, last Server-Sent Event); a response stating none that failed (5xx, a broken body)
/// or was refused upstream (4xx) gives the estimate back; any other keeps it. A response
/// dropped before its end (the client went away, the connection closed) settles with the cost
/// read so far (a usage event already passed), else with the rules' `max`: a client cannot
/// leave early to pay less than its call cost.
pub struct Admitted<C: Clock + Clone = MonotonicClock> {
    /// `None` once ended.
    pub(super) guard: Option<Guard<C>>,
    /// Reads the actual cost from the body (`None`: nothing to read, or already settled).
    pub(super) reader: Option<Box<crate::cost::ActualReader>>,
    /// A 4xx: the upstream refused the call.
    pub(super) refused: bool,
    /// Where the settled cost is noted, when a tracer asked (see [`crate::trace`]).
    pub(super) record: Option<DecisionRecord>,
}

impl<C: Clock + Clone> Admitted<C> {
    /// Holds `guard` for the response `r`: settles a cost stated in its head, prepares the
    /// reader of one stated in its body, and tells the caller its budget (`RateLimit`).
    pub(super) fn new<B>(
        guard: Guard<C>,
        r: &mut Response<B>,
        record: Option<DecisionRecord>,
    ) -> Self {
        if let Some(rule) = guard.over_budget() {
            mark_over_budget(rule, r);
        }
        if !guard.holds_cost() {
            return Self {
                guard: Some(guard),
                reader: None,
                refused: false,
                record,
            };
        }
        Self::costed(guard, r, record)
    }

    #[cold]
    pub(super) fn costed<B>(
        mut guard: Guard<C>,
        r: &mut Response<B>,
        record: Option<DecisionRecord>,
    ) -> Self {
        // What was left once the estimate was held (before a settlement below).
        if let Some(b) = guard.budget() {
            let h = r.headers_mut();
            if let Some(v) = problem::policy_text(&b.rule, b.limit, b.window) {
                h.insert(problem::RATELIMIT_POLICY, v);
            }
            if let Some(v) = problem::ratelimit_text(&b.rule, b.remaining, b.reset_after) {
                h.insert(problem::RATELIMIT, v);
            }
        }
        let mut reader = None;
        if let Some(from) = guard.cost_sources().and_then(|s| s.actual.clone()) {
            match crate::cost::response_header_cost(r.headers(), &from) {
                Some(n) => {
                    guard.settle_cost(n);
                    settled(record.as_ref(), n);
                }
                None => reader = crate::cost::ActualReader::new(&from).map(Box::new),
            }
        }
        Self {
            guard: Some(guard),
            reader,
            refused: r.status().is_client_error(),
            record,
        }
    }
}

/// Header marking a response a soft calendar budget admitted past its limit; the value is the
/// budget's rule id.
pub const BUDGET_EXCEEDED: &str = "weir-budget-exceeded";

#[cold]
pub(super) fn mark_over_budget<B>(rule: &str, r: &mut Response<B>) {
    if let Ok(v) = http::HeaderValue::from_str(rule) {
        r.headers_mut()
            .insert(http::HeaderName::from_static(BUDGET_EXCEEDED), v);
    }
}

impl<C: Clock + Clone> crate::body::Held for Admitted<C> {
    fn end(mut self, failed: bool) {
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        if guard.holds_cost() {
            match self.reader.take().and_then(|r| r.finish()) {
                Some(actual) => {
                    guard.settle_cost(actual);
                    settled(self.record.as_ref(), actual);
                }
                None if failed || self.refused => {
                    guard.settle_cost(0);
                    settled(self.record.as_ref(), 0);
                }
                None => {}
            }
        }
        guard.end(failed);
    }

    #[inline]
    fn frame(&mut self, frame: &http_body::Frame<Bytes>) {
        if let Some(r) = &mut self.reader {
            r.frame(frame);
        }
    }
}

impl<C: Clock + Clone> Drop for Admitted<C> {
    /// The response was dropped before its end: the call is charged the cost read so far, else
    /// the rules' `max`.
    fn drop(&mut self) {
        if let Some(guard) = self.guard.as_mut() {
            let known = self.reader.as_deref().and_then(|r| r.known());
            abandoned(guard, known, self.record.as_ref());
        }
    }
}

/// Settles a call whose response will not end (the client went away): with `known`, the
/// cost read so far, else with what bounds it (each rule's `max`) when the response was to
/// state its cost. A call whose rules read no actual cost keeps its estimates.
pub(crate) fn abandoned<C: Clock + Clone>(
    guard: &mut Guard<C>,
    known: Option<u64>,
    record: Option<&DecisionRecord>,
) {
    if !guard.holds_cost() {
        return;
    }
    let states_cost = guard.cost_sources().is_some_and(|s| s.actual.is_some());
    match known {
        Some(actual) => guard.settle_cost(actual),
        None if states_cost => guard.settle_abandoned(),
        None => {}
    }
    if let Some(r) = record {
        r.note(|d| {
            d.abandoned = true;
            d.settled = known;
        });
    }
}

/// Notes the cost a call settled at.
fn settled(record: Option<&DecisionRecord>, cost: u64) {
    if let Some(r) = record {
        r.note(|d| d.settled = Some(cost));
    }
}

/// Whether `req` is a gRPC call (answered the gRPC way when blocked).
pub(super) fn is_grpc<B>(req: &http::Request<B>) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The guard of a call whose service is answering: dropped before the answer (the client
/// went away while the upstream worked), the call is abandoned: charged the rules' `max`.
pub struct Pending<C: Clock + Clone> {
    pub(super) guard: Option<Guard<C>>,
    /// Where the decision is noted, when a tracer asked (see [`crate::trace`]).
    pub(super) record: Option<DecisionRecord>,
}

impl<C: Clock + Clone> Pending<C> {
    /// Nothing held: a request no rule applied to, or a refusal passed on.
    pub(super) fn none() -> Self {
        Self {
            guard: None,
            record: None,
        }
    }

    /// Holds `guard` for the request with extensions `ext` (its decision record, if any).
    pub(super) fn new(guard: Guard<C>, ext: &http::Extensions) -> Self {
        Self {
            guard: Some(guard),
            record: ext.get::<DecisionRecord>().cloned(),
        }
    }
}

impl<C: Clock + Clone> Drop for Pending<C> {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.as_mut() {
            abandoned(guard, None, self.record.as_ref());
        }
    }
}
