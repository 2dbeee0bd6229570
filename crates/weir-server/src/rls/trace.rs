//! The span of a rate-limit decision (a `ShouldRateLimit` call, or `POST /json`): a server
//! span, child of the span the caller names in its `traceparent` (Envoy: in the call's gRPC
//! metadata), with the domain, the verdict, the rules over their limit,
//! the descriptors' values digested and the units asked, settled or given back.

use weir_tower::trace::TraceParent;

use super::request::{BadRequest, Request, Response};
use crate::otlp::proto::{KeyValue, Status, KIND_SERVER, STATUS_ERROR};
use crate::otlp::trace::{Begun, Tracer};

/// The span's name: the method, as OpenTelemetry names RPC server spans.
const NAME: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Most bytes of a caller's text a span carries (a domain, a refusal's reason): a span queued
/// for export stays small whatever a caller sends.
const MAX_TEXT: usize = 256;

/// `text` cut to [`MAX_TEXT`] bytes, on a character boundary.
fn bounded(text: &str) -> &str {
    if text.len() <= MAX_TEXT {
        return text;
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Begins the span of a call with `headers`, if it may be exported.
pub(crate) fn begin(tracer: Option<&Tracer>, headers: &http::HeaderMap) -> Option<Begun> {
    tracer?.begin(TraceParent::from_headers(headers))
}

/// Ends the span of `request`, decided as `answer`.
pub(crate) fn end(
    tracer: &Tracer,
    begun: Begun,
    request: &Request,
    answer: &Result<Response, BadRequest>,
) {
    let refused = answer.as_ref().is_ok_and(|r| r.over_limit);
    if !tracer.wants(&begun, refused) {
        return;
    }
    let mut a = vec![
        KeyValue::string("rpc.system", "grpc"),
        KeyValue::string("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
        KeyValue::string("rpc.method", "ShouldRateLimit"),
        // The domain is the caller's: cut to a bound, as the error below.
        KeyValue::string("weir.domain", bounded(&request.domain)),
        KeyValue::int("weir.descriptors", request.descriptors.len() as u64),
    ];
    let values = request
        .descriptors
        .iter()
        .flat_map(|d| d.matched_entries().iter().map(|(_, v)| v.as_str()));
    a.push(KeyValue::string("weir.key.digest", tracer.digest(values)));
    let (mut asked, mut settled, mut refunded) = (0u64, 0u64, 0u64);
    for d in &request.descriptors {
        let hits = d
            .hits_addend
            .unwrap_or(u64::from(request.hits_addend.max(1)));
        match d.settlement() {
            None => asked = asked.saturating_add(hits),
            Some(false) => settled = settled.saturating_add(hits),
            Some(true) => refunded = refunded.saturating_add(hits),
        }
    }
    a.push(KeyValue::int("weir.hits", asked));
    if settled > 0 {
        a.push(KeyValue::int("weir.cost.settled", settled));
    }
    if refunded > 0 {
        a.push(KeyValue::int("weir.cost.refunded", refunded));
    }
    let (refused, status) = match answer {
        Ok(r) => {
            a.push(KeyValue::string(
                "weir.verdict",
                if r.over_limit { "over_limit" } else { "ok" },
            ));
            let over = r
                .statuses
                .iter()
                .filter(|s| s.over_limit)
                .filter_map(|s| s.limit.as_ref())
                .map(|l| &*l.policy)
                .collect::<Vec<_>>();
            if let Some(rule) = over.first() {
                a.push(KeyValue::string("weir.rule", *rule));
            }
            (r.over_limit, None)
        }
        Err(e) => {
            a.push(KeyValue::string("weir.verdict", "invalid"));
            let status = Status {
                message: bounded(&e.0).to_string(),
                code: STATUS_ERROR,
            };
            (false, Some(status))
        }
    };
    tracer.end(begun, refused, NAME, KIND_SERVER, a, status);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callers_text_is_cut_to_its_bound_on_a_character() {
        assert_eq!(bounded("edge"), "edge");
        let long = "é".repeat(1_000);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_TEXT && cut.len() >= MAX_TEXT - 1);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
