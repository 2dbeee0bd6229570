//! Fuzz entry points: each takes arbitrary bytes, drives one input parser of the binary as the
//! servers do, and panics only when an invariant breaks (never on bad input, which must be
//! refused with an error). The libFuzzer targets in `fuzz/` and the stable smoke test
//! (`tests/fuzz_smoke.rs`) both call these; `scripts/fuzz` runs them (docs/fuzzing.md).

use std::path::Path;
use std::sync::OnceLock;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderName, HeaderValue, Request, Version};

use weir_server::rls::Engine;
use weir_server::rls::MemoryStore;
use weir_server::rls::{EngineOptions, Request as RlsRequest};

/// A fuzz target: arbitrary bytes in, a panic only for a broken invariant.
pub type Target = fn(&[u8]);

/// Every target, by name (as `scripts/fuzz` and the smoke test list them).
pub const TARGETS: [(&str, Target); 8] = [
    ("lyft_config", lyft_config),
    ("rule_file", rule_file),
    ("rls_request", rls_request),
    ("json_body", json_body),
    ("proxy_head", proxy_head),
    ("lean_head", lean_head),
    ("path", path),
    ("csv_trace", csv_trace),
];

/// Counters in memory.
fn memory() -> std::sync::Arc<MemoryStore> {
    std::sync::Arc::new(MemoryStore::default())
}

/// The engine of the bundled example configuration, built once.
fn example() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let domains = weir_server::rls::load(None, false).expect("the bundled example loads");
        Engine::build(&domains, EngineOptions::default(), memory(), None)
            .expect("the bundled example builds")
    })
}

/// Decides `r` on the bundled example in memory (no await point is ever pending there).
fn decide(r: &RlsRequest) {
    let answer = example().decide(r).now_or_never();
    let answer = answer.expect("a memory-store decision never waits");
    if let Ok(response) = answer {
        assert_eq!(response.statuses.len(), r.descriptors.len());
    }
}

/// A Lyft configuration file: parsed (errors must name the file), then built.
pub fn lyft_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match weir_server::rls::config::parse(Path::new("fuzz.yaml"), text) {
        Ok(domain) => {
            let _ = Engine::build(&[domain], EngineOptions::default(), memory(), None);
        }
        Err(errors) => {
            assert!(!errors.is_empty());
            for e in errors {
                assert!(e.to_string().starts_with("fuzz.yaml"), "{e}");
            }
        }
    }
}

/// A weir-rules rule file: parsed and validated (every error located in the file), then
/// compiled.
pub fn rule_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match weir_rules::config::RuleSet::from_yaml(Path::new("fuzz.yaml"), text) {
        Ok(set) => {
            let _ = weir_rules::engine::Rules::new(&set);
        }
        Err(errors) => {
            assert!(!errors.0.is_empty());
            for e in &errors.0 {
                assert!(e.to_string().starts_with("fuzz.yaml"), "{e}");
            }
        }
    }
}

/// The body of a gRPC `ShouldRateLimit` call: unframed, decoded, checked and decided.
pub fn rls_request(data: &[u8]) {
    if let Ok(r) = weir_server::rls::grpc::decode(&Bytes::copy_from_slice(data)) {
        decide(&r);
    }
}

/// A `/json` body: parsed, checked and decided.
pub fn json_body(data: &[u8]) {
    if let Ok(r) = weir_server::rls::json::from_json(data) {
        decide(&r);
    }
}

/// An HTTP/1 request head as `weir proxy` handles it before forwarding: the careful-proxy
/// checks, path normalisation, hop-by-hop headers, `Via`.
pub fn proxy_head(data: &[u8]) {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Request::new(&mut headers);
    let Ok(httparse::Status::Complete(_)) = parsed.parse(data) else {
        return;
    };
    let (Some(method), Some(target)) = (parsed.method, parsed.path) else {
        return;
    };
    let mut builder =
        Request::builder()
            .method(method)
            .uri(target)
            .version(if parsed.version == Some(0) {
                Version::HTTP_10
            } else {
                Version::HTTP_11
            });
    for h in parsed.headers.iter() {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) else {
            return;
        };
        builder = builder.header(name, value);
    }
    let Ok(mut req) = builder.body(()) else {
        return;
    };
    let via = HeaderValue::from_static("weir-fuzz");
    if weir_server::proxy::refuse(&req, &via).is_some() {
        return;
    }
    if let Ok(normal) = weir_rules::path::normalize(req.uri().path()) {
        path_invariants(req.uri().path(), &normal);
    }
    let host = req.headers().get(http::header::HOST).cloned();
    weir_server::proxy::strip_hop_by_hop(req.headers_mut());
    assert_eq!(
        req.headers().get(http::header::HOST),
        host.as_ref(),
        "Host survives Connection"
    );
    let version = req.version();
    weir_server::proxy::append_via(req.headers_mut(), version, &via);
    assert!(
        weir_server::proxy::refuse(&req, &via).is_some(),
        "own Via is a loop"
    );
}

/// An HTTP/1.1 request head as `weir proxy`'s lean path reads it: parsed into spans, and, when
/// the lean path serves it, the upstream request written from them.
pub fn lean_head(data: &[u8]) {
    use weir_server::proxy::lean::{request, wire};
    let mut slots = request::slots();
    let head = match request::parse(data, &mut slots, b"weir-fuzz") {
        request::Parse::Head(h) => h,
        request::Parse::Partial => {
            assert!(
                data.len() < request::MAX_HEAD,
                "a head past the bound goes to hyper"
            );
            return;
        }
        request::Parse::Hyper(_) => return,
    };
    assert!(head.len <= data.len() && head.len <= request::MAX_HEAD);
    assert!(
        head.target.starts_with(head.path),
        "the path is the target's start"
    );
    assert!(
        weir_rules::path::is_plain(head.path),
        "a lean path is in normal form"
    );
    assert_ne!(head.method, "CONNECT");
    // Pipelined requests: a head cut short is never taken for one.
    let mut again = request::slots();
    assert!(matches!(
        request::parse(&data[..head.len - 1], &mut again, b"weir-fuzz"),
        request::Parse::Partial | request::Parse::Hyper(request::Hyper::Http2)
    ));
    let mut out = Vec::new();
    wire::upstream_request(&mut out, &head, b"10.0.0.1", b"1.1 weir-fuzz");
    let mut upstream = [httparse::EMPTY_HEADER; request::MAX_HEADERS + 2];
    let mut sent = httparse::Request::new(&mut upstream);
    let len = match sent.parse(&out) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!("the upstream request does not parse: {other:?}"),
    };
    assert_eq!(len, out.len(), "one request, nothing after it");
    assert_eq!(sent.method, Some(head.method));
    assert_eq!(sent.path, Some(head.target));
    // The client's end-to-end headers, in order, then X-Forwarded-For and Via.
    let kept: Vec<(&str, &[u8])> = head
        .headers
        .iter()
        .filter(|h| !request::is_hop_by_hop(h.name.as_bytes()))
        .filter(|h| {
            !h.name.eq_ignore_ascii_case("x-forwarded-for") && !h.name.eq_ignore_ascii_case("via")
        })
        .map(|h| (h.name, h.value))
        .collect();
    let got: Vec<(&str, &[u8])> = sent.headers.iter().map(|h| (h.name, h.value)).collect();
    assert_eq!(got.len(), kept.len() + 2);
    assert_eq!(&got[..kept.len()], &kept[..]);
    assert_eq!(got[kept.len()].0, "x-forwarded-for");
    assert!(got[kept.len()].1.ends_with(b"10.0.0.1"));
    assert_eq!(got[kept.len() + 1].0, "via");
    assert!(got[kept.len() + 1].1.ends_with(b"1.1 weir-fuzz"));
    let hosts = got
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("host"))
        .count();
    assert_eq!(hosts, 1, "exactly one Host goes upstream");
}

/// What a normal path must satisfy: origin-form, no empty / `.` / `..` segments, no decodable
/// unreserved escape, a fixed point of `normalize`, and the route-matching form likewise.
fn path_invariants(raw: &str, normal: &str) {
    if raw == "*" {
        assert_eq!(normal, "*");
        return;
    }
    assert!(normal.starts_with('/'), "{raw:?} → {normal:?}");
    let inner = normal.trim_end_matches('/');
    for segment in inner.split('/').skip(1) {
        assert!(
            !segment.is_empty() && segment != "." && segment != "..",
            "{raw:?} → {normal:?}"
        );
    }
    let again = weir_rules::path::normalize(normal).expect("a normal path is accepted");
    assert_eq!(again, normal, "normalize is idempotent for {raw:?}");
    let matched = weir_rules::path::match_path(normal);
    assert!(!matched.contains(';'), "{raw:?} → {matched:?}");
    assert_eq!(
        weir_rules::path::match_path(&matched),
        matched,
        "match_path is idempotent for {raw:?}"
    );
}

/// A request path (any bytes that form a string).
pub fn path(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(normal) = weir_rules::path::normalize(raw) {
        path_invariants(raw, &normal);
    }
}

/// A `weir simulate` CSV trace: parsed, then run through a limiter.
pub fn csv_trace(data: &[u8]) {
    let Ok(trace) = crate::simulate::parse_trace(data, "fuzz.csv") else {
        return;
    };
    let settings = crate::simulate::Settings {
        algorithm: "sliding_window".into(),
        limit: 5,
        window: std::time::Duration::from_secs(1),
        burst: None,
        buckets: None,
        warmup: None,
        max_wait: None,
    };
    let mut out = Vec::new();
    let summary = crate::simulate::simulate(&settings, &trace, &mut out);
    assert!(summary.is_ok(), "valid settings on a parsed trace run");
}
