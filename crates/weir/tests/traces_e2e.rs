//! Decision spans end to end with a real Envoy: Envoy traces a request with its OpenTelemetry
//! tracer (every request sampled) and calls `weir serve`'s rate-limit service; both export to
//! one receiver of this test. `weir serve` samples nothing on its own (`--trace-ratio 0`): its
//! span exists because Envoy's `traceparent` in the call's gRPC metadata says sampled, and it
//! must be the child of Envoy's span of that call, in Envoy's trace. Also the tracing flags'
//! errors.

use crate::common;
use crate::otlp_cli::{receiver, refused_at_start};

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// `deploy/envoy/ratelimit.yaml` with its ports replaced and OpenTelemetry tracing to
/// `collector` (HTTP/protobuf, flushed every 200 ms).
fn envoy_config(port: u16, admin: u16, upstream: u16, grpc: u16, collector: u16) -> String {
    let doc =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/envoy/ratelimit.yaml");
    let mut yaml = std::fs::read_to_string(doc).unwrap();
    let tracing = format!(
        "          stat_prefix: ingress
          tracing:
            random_sampling: {{value: 100}}
            provider:
              name: envoy.tracers.opentelemetry
              typed_config:
                \"@type\": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                service_name: envoy-edge
                http_service:
                  http_uri: {{uri: \"http://127.0.0.1:{collector}/v1/traces\", cluster: otel, timeout: 2s}}
"
    );
    let otel_cluster = format!(
        "  clusters:
  - name: otel
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: otel
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {collector}}}}}}}
"
    );
    for (from, to) in [
        ("port_value: 9901}", format!("port_value: {admin}}}")),
        ("port_value: 10000}", format!("port_value: {port}}}")),
        ("port_value: 8000}", format!("port_value: {upstream}}}")),
        ("port_value: 8081}", format!("port_value: {grpc}}}")),
        ("          stat_prefix: ingress\n", tracing),
        ("  clusters:\n", otel_cluster),
        (
            "admin:\n",
            "layered_runtime:\n  layers:\n  - name: flush\n    static_layer: {tracing.opentelemetry.flush_interval_ms: 200, tracing.opentelemetry.min_flush_spans: 1}\nadmin:\n".to_string(),
        ),
    ] {
        assert!(yaml.contains(from), "{from} in deploy/envoy/ratelimit.yaml");
        yaml = yaml.replacen(from, &to, 1);
    }
    yaml
}

fn attr(span: &Span, key: &str) -> Option<String> {
    let kv = span.attributes.iter().find(|a| a.key == key)?;
    match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        _ => None,
    }
}

#[test]
fn weir_serve_is_a_child_of_envoys_span_in_envoys_trace() {
    let (collector, exports) = receiver();
    let (http, grpc) = (common::free_port(), common::free_port());
    let mut weir = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["serve", "--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--otlp-endpoint", &format!("http://127.0.0.1:{collector}")])
        .args(["--trace-ratio", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(weir.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("gRPC RLS v3"), "{line}");

    let upstream = common::http1_upstream(|_, _| "upstream".to_string());
    let (port, admin) = (common::free_port(), common::free_port());
    let dir = common::tempdir("traces-e2e");
    let file = dir.join("envoy.yaml");
    std::fs::write(&file, envoy_config(port, admin, upstream, grpc, collector)).unwrap();
    let mut envoy = common::start_envoy(&file, admin, port);

    let (status, body) = common::request(port, "GET", "/x", "x-user: ann\r\n", "").unwrap();
    assert_eq!((status, body.as_str()), (200, "upstream"));

    // Every span that reaches the receiver in 15 s, until weir's and its parent have come.
    let mut spans: Vec<(String, Span)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    let found = loop {
        let weirs = spans
            .iter()
            .filter(|(service, _)| service == "weir-serve")
            .map(|(_, s)| s);
        let pair = weirs.into_iter().find_map(|w| {
            let parent = spans
                .iter()
                .find(|(svc, s)| svc == "envoy-edge" && s.span_id == w.parent_span_id)?;
            Some((w.clone(), parent.1.clone()))
        });
        if pair.is_some() || Instant::now() >= deadline {
            break pair;
        }
        let Ok(e) = exports.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        if e.path != "/v1/traces" {
            continue;
        }
        let request = ExportTraceServiceRequest::decode(&e.body[..]).unwrap();
        for rs in request.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                    any_value::Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                spans.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
    };
    let _ = envoy.kill();
    let _ = envoy.wait();
    let _ = weir.kill();
    let _ = weir.wait();
    let names: Vec<_> = spans
        .iter()
        .map(|(svc, s)| format!("{svc}: {}", s.name))
        .collect();
    let (weir_span, envoy_span) =
        found.unwrap_or_else(|| panic!("weir's span under one of Envoy's; got {names:?}"));
    assert_eq!(weir_span.trace_id, envoy_span.trace_id, "one trace");
    assert_eq!(
        weir_span.name,
        "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    );
    assert_eq!(attr(&weir_span, "weir.domain").as_deref(), Some("example"));
    assert_eq!(attr(&weir_span, "weir.verdict").as_deref(), Some("ok"));
    // Envoy's request span is in the same trace too: the decision shows in the user's trace.
    assert!(
        spans
            .iter()
            .filter(|(svc, s)| svc == "envoy-edge" && s.trace_id == weir_span.trace_id)
            .count()
            >= 2,
        "{names:?}"
    );
}

#[test]
fn bad_tracing_flags_are_refused_at_start() {
    for (args, env, message) in [
        (
            vec![
                "--otlp-endpoint",
                "http://127.0.0.1:4318",
                "--trace-ratio",
                "1.5",
            ],
            vec![],
            "trace ratio 1.5: expected a ratio from 0 to 1",
        ),
        (vec!["--trace-refusals"], vec![], "traces need a collector"),
        (
            vec!["--otlp-endpoint", "http://127.0.0.1:4318"],
            vec![("OTEL_TRACES_SAMPLER", "jaeger_remote")],
            "OTEL_TRACES_SAMPLER=\"jaeger_remote\"",
        ),
        (
            vec!["--otlp-endpoint", "http://127.0.0.1:4318"],
            vec![
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "2"),
            ],
            "OTEL_TRACES_SAMPLER_ARG=\"2\"",
        ),
    ] {
        refused_at_start(&args, &env, message);
    }
}
