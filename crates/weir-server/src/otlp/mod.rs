//! OTLP export of a process's metrics: every family `/metrics` has, with the same names,
//! labels and values, pushed to an OpenTelemetry collector at an interval — beside the
//! Prometheus scrape, not instead of it.
//!
//! - `proto`: the OTLP messages written; `encode`: the exposition as OTLP metrics;
//!   `send`: the HTTP/protobuf and gRPC transports; `resource`: the process and the clocks
//!   exports carry; `export`: the loop; [`trace`]: spans of
//!   decisions, sampled, queued and sent in batches.
//! - The exporter never blocks a decision: it renders the registry as a scrape does (the
//!   collectors read atomics), on its own task, with at most one export in flight — a tick
//!   that finds the previous export unanswered is dropped and counted
//!   (`weir_otlp_exports_total{result="dropped"}`). A collector that is down, slow or
//!   refuses costs one timeout per interval and is logged at most once a minute.
//! - [`Settings::from_env`] reads the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//!   `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL`,
//!   `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_METRIC_EXPORT_INTERVAL`,
//!   `OTEL_EXPORTER_OTLP_TIMEOUT`).
//!
//! Who may call it: the program that runs the server (its operator's settings); nothing here
//! is read from a client. The collector is trusted to be a collector: its answers are only
//! checked for success, and a slow one is cut off at the timeout.

mod encode;
mod export;
mod outcomes;
pub(crate) mod proto;
mod resource;
mod send;
pub mod trace;

use std::time::Duration;

use http::Uri;

pub use export::{spawn, Exporter};
pub use send::SendError;
pub use trace::Tracer;

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `POST …/v1/metrics` with a protobuf body (the specification's default; port 4318).
    HttpProtobuf,
    /// gRPC over h2c (port 4317).
    Grpc,
}

impl std::str::FromStr for Protocol {
    type Err = OtlpError;

    fn from_str(s: &str) -> Result<Self, OtlpError> {
        match s {
            "http/protobuf" => Ok(Self::HttpProtobuf),
            "grpc" => Ok(Self::Grpc),
            other => Err(OtlpError::Protocol(other.to_string())),
        }
    }
}

/// A bad OTLP setting.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OtlpError {
    /// The endpoint is not an `http://host:port` URL.
    #[error("OTLP endpoint {url:?}: {reason}")]
    Endpoint {
        /// What was given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Not a transport the exporter speaks.
    #[error("OTLP protocol {0:?}: expected grpc or http/protobuf (http/json is not supported)")]
    Protocol(String),
    /// A sampling ratio outside 0..=1.
    #[error("trace ratio {0}: expected a ratio from 0 to 1")]
    Ratio(f64),
    /// Traces asked for with only a metrics endpoint to send them to.
    #[error("traces need a collector: --otlp-endpoint, OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")]
    NoTracesEndpoint,
    /// A standard variable with a value that cannot be used.
    #[error("{name}={value:?}: {reason}")]
    Variable {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Which decisions become spans ([`trace`]): the standard parent-based ratio sampler,
/// and every refusal if asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// The share of traces sampled, 0 to 1, by trace id (a trace is sampled or not as a whole).
    pub ratio: f64,
    /// A caller's `traceparent` decides instead of the ratio: its sampled flag is followed.
    pub parent_based: bool,
    /// Every refusal becomes a span, whatever the ratio and the caller's flag.
    pub refusals: bool,
}

/// Where and how often to export.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The collector's metrics URL (HTTP/protobuf: with its path, by default `/v1/metrics`)
    /// or address (gRPC).
    pub target: Uri,
    /// The collector's traces URL (HTTP/protobuf: by default `/v1/traces`) or address (gRPC);
    /// `None` when only a metrics endpoint was given.
    pub traces_target: Option<Uri>,
    /// Which decisions are traced; `None`: no spans (the default: traces are asked for with
    /// `OTEL_TRACES_SAMPLER` or [`Settings::trace`]).
    pub sampling: Option<Sampling>,
    /// The transport.
    pub protocol: Protocol,
    /// Time between exports.
    pub interval: Duration,
    /// Longest wait for the collector's answer to one export.
    pub timeout: Duration,
    /// `service.name` of the resource.
    pub service_name: String,
    /// Further resource attributes (`OTEL_RESOURCE_ATTRIBUTES`).
    pub resource: Vec<(String, String)>,
}

impl Settings {
    /// Exports to the collector at `endpoint` (`http://host:port`, a base URL as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` takes it: HTTP/protobuf appends `/v1/metrics`) every 60 s
    /// with a 10 s timeout, as the service `service_name`.
    pub fn new(endpoint: &str, protocol: Protocol, service_name: &str) -> Result<Self, OtlpError> {
        let base = parse_endpoint(endpoint)?;
        let signal = |name: &str| match protocol {
            Protocol::Grpc => Ok(base.clone()),
            Protocol::HttpProtobuf => {
                let path = base.path().trim_end_matches('/');
                with_path(&base, &format!("{path}/v1/{name}"), endpoint)
            }
        };
        Ok(Self {
            target: signal("metrics")?,
            traces_target: Some(signal("traces")?),
            sampling: None,
            protocol,
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
            service_name: service_name.to_string(),
            resource: Vec::new(),
        })
    }

    /// The settings the standard variables of `vars` ask for (pass `std::env::vars()`), or
    /// `None` when no endpoint is set; `endpoint` (a flag) and `protocol` take precedence over
    /// the variables, `service_name` is the default of `OTEL_SERVICE_NAME`.
    pub fn from_env(
        vars: impl IntoIterator<Item = (String, String)>,
        endpoint: Option<&str>,
        protocol: Option<Protocol>,
        service_name: &str,
    ) -> Result<Option<Self>, OtlpError> {
        let vars: std::collections::HashMap<String, String> = vars.into_iter().collect();
        let var = |name: &str| vars.get(name).map(String::as_str).filter(|v| !v.is_empty());
        let protocol = match (protocol, var("OTEL_EXPORTER_OTLP_PROTOCOL")) {
            (Some(p), _) => p,
            (None, Some(p)) => p.parse()?,
            (None, None) => Protocol::HttpProtobuf,
        };
        let metrics_endpoint = var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
        let mut s = match (
            endpoint.or(var("OTEL_EXPORTER_OTLP_ENDPOINT")),
            metrics_endpoint,
        ) {
            (Some(e), _) if endpoint.is_some() => Self::new(e, protocol, service_name)?,
            // The signal's own endpoint is used as it is.
            (_, Some(m)) => Self {
                target: parse_endpoint(m)?,
                traces_target: None,
                ..Self::new(m, protocol, service_name)?
            },
            (Some(e), None) => Self::new(e, protocol, service_name)?,
            (None, None) => return Ok(None),
        };
        if let Some(attrs) = var("OTEL_RESOURCE_ATTRIBUTES") {
            s.resource = resource_attributes(attrs)?;
        }
        // OTEL_SERVICE_NAME first, then a service.name among the attributes.
        let named = s.resource.iter().find(|(k, _)| k == "service.name");
        if let Some(name) = var("OTEL_SERVICE_NAME").or(named.map(|(_, v)| v.as_str())) {
            s.service_name = name.to_string();
        }
        if let Some(t) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            s.traces_target = Some(parse_endpoint(t)?);
        }
        s.sampling = sampling(var("OTEL_TRACES_SAMPLER"), var("OTEL_TRACES_SAMPLER_ARG"))?;
        match var("OTEL_TRACES_EXPORTER") {
            None | Some("otlp") => {}
            Some("none") => s.sampling = None,
            Some(other) => {
                return Err(OtlpError::Variable {
                    name: "OTEL_TRACES_EXPORTER",
                    value: other.to_string(),
                    reason: "expected otlp or none".into(),
                })
            }
        }
        for (name, field) in [
            ("OTEL_METRIC_EXPORT_INTERVAL", &mut s.interval),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", &mut s.timeout),
        ] {
            if let Some(v) = var(name) {
                *field = millis(name, v)?;
            }
        }
        Ok(Some(s))
    }

    /// Applies the tracing flags: `ratio` traces that share of decisions whose caller sent no
    /// sampled `traceparent` (parent-based: a caller's flag is followed), `refusals` traces
    /// every refusal as well. Without either, the sampler of the variables stays.
    pub fn trace(&mut self, ratio: Option<f64>, refusals: bool) -> Result<(), OtlpError> {
        if let Some(r) = ratio {
            if !(0.0..=1.0).contains(&r) {
                return Err(OtlpError::Ratio(r));
            }
            self.sampling = Some(Sampling {
                ratio: r,
                parent_based: true,
                refusals,
            });
        } else if refusals {
            let mut s = self.sampling.unwrap_or(Sampling {
                ratio: 0.0,
                parent_based: true,
                refusals: true,
            });
            s.refusals = true;
            self.sampling = Some(s);
        }
        if self.sampling.is_some() && self.traces_target.is_none() {
            return Err(OtlpError::NoTracesEndpoint);
        }
        Ok(())
    }
}

/// The sampler `OTEL_TRACES_SAMPLER` names, with `OTEL_TRACES_SAMPLER_ARG` (the ratio,
/// default 1); `None` without a sampler.
fn sampling(sampler: Option<&str>, arg: Option<&str>) -> Result<Option<Sampling>, OtlpError> {
    let Some(name) = sampler else {
        return Ok(None);
    };
    let ratio = match arg {
        None => 1.0,
        Some(a) => match a.parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => r,
            _ => {
                return Err(OtlpError::Variable {
                    name: "OTEL_TRACES_SAMPLER_ARG",
                    value: a.to_string(),
                    reason: "expected a ratio from 0 to 1".into(),
                })
            }
        },
    };
    let (ratio, parent_based) = match name {
        "always_on" => (1.0, false),
        "always_off" => (0.0, false),
        "traceidratio" => (ratio, false),
        "parentbased_always_on" => (1.0, true),
        "parentbased_always_off" => (0.0, true),
        "parentbased_traceidratio" => (ratio, true),
        other => {
            return Err(OtlpError::Variable {
                name: "OTEL_TRACES_SAMPLER",
                value: other.to_string(),
                reason: "expected always_on, always_off, traceidratio or their parentbased_ forms"
                    .into(),
            })
        }
    };
    Ok(Some(Sampling {
        ratio,
        parent_based,
        refusals: false,
    }))
}

/// `http://host:port[/path]`.
fn parse_endpoint(url: &str) -> Result<Uri, OtlpError> {
    let bad = |reason: &str| OtlpError::Endpoint {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let uri: Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(bad(
                "https is not supported: point the exporter at a collector's plain port (a sidecar or node agent)",
            ))
        }
        _ => return Err(bad("expected http://HOST:PORT")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    Ok(uri)
}

fn with_path(base: &Uri, path: &str, given: &str) -> Result<Uri, OtlpError> {
    let authority = base.authority().map_or("", |a| a.as_str());
    format!("http://{authority}{path}")
        .parse()
        .map_err(|e: http::uri::InvalidUri| OtlpError::Endpoint {
            url: given.to_string(),
            reason: e.to_string(),
        })
}

/// `key=value,key2=value2`, values percent-decoded (W3C Baggage's octets).
fn resource_attributes(text: &str) -> Result<Vec<(String, String)>, OtlpError> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').ok_or_else(|| OtlpError::Variable {
                name: "OTEL_RESOURCE_ATTRIBUTES",
                value: text.to_string(),
                reason: format!("{pair:?} is not key=value"),
            })?;
            Ok((k.trim().to_string(), percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A variable in milliseconds (as the specification states them), at least 1 ms.
fn millis(name: &'static str, v: &str) -> Result<Duration, OtlpError> {
    match v.parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(OtlpError::Variable {
            name,
            value: v.to_string(),
            reason: "expected milliseconds, a whole number ≥ 1".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_standard_variables_are_read() {
        let s = Settings::from_env(
            vars(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                ("OTEL_SERVICE_NAME", "edge-limits"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=prod, team=a%2Cb",
                ),
                ("OTEL_METRIC_EXPORT_INTERVAL", "15000"),
            ]),
            None,
            None,
            "weir-serve",
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.target, "http://collector:4318/v1/metrics");
        assert_eq!(s.protocol, Protocol::HttpProtobuf);
        assert_eq!(s.service_name, "edge-limits");
        assert_eq!(
            s.resource,
            [
                ("deployment.environment".to_string(), "prod".to_string()),
                ("team".to_string(), "a,b".to_string())
            ]
        );
        assert_eq!(s.interval, Duration::from_secs(15));
        // Flags first; gRPC keeps the address.
        let g = Settings::from_env(
            vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://elsewhere:1")]),
            Some("http://127.0.0.1:4317"),
            Some(Protocol::Grpc),
            "weir-proxy",
        )
        .unwrap()
        .unwrap();
        assert_eq!(g.target, "http://127.0.0.1:4317/");
        assert_eq!(g.service_name, "weir-proxy");
        // The signal's own endpoint as it is.
        let m = Settings::from_env(
            vars(&[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://c:9/custom")]),
            None,
            None,
            "weir-serve",
        )
        .unwrap()
        .unwrap();
        assert_eq!(m.target, "http://c:9/custom");
        assert!(Settings::from_env(vars(&[]), None, None, "x")
            .unwrap()
            .is_none());
    }

    #[test]
    fn bad_settings_are_named() {
        for (pairs, message) in [
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318")],
                "https is not supported",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
                "expected http://HOST:PORT",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:1"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
                ],
                "expected grpc or http/protobuf",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:1"),
                    ("OTEL_METRIC_EXPORT_INTERVAL", "1m"),
                ],
                "OTEL_METRIC_EXPORT_INTERVAL=\"1m\": expected milliseconds",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:1"),
                    ("OTEL_RESOURCE_ATTRIBUTES", "a=1,b"),
                ],
                "\"b\" is not key=value",
            ),
        ] {
            let e = Settings::from_env(vars(&pairs), None, None, "x").unwrap_err();
            assert!(e.to_string().contains(message), "{e} lacks {message}");
        }
    }
}
