//! envoyproxy/ratelimit's settings, as environment variables, turned into `weir serve`'s
//! arguments: the binary started as `ratelimit` (Envoy Gateway runs `/bin/ratelimit` in its
//! rate-limit Deployment) reads them, so Weir's image runs where ratelimit's does. Each
//! variable is supported (mapped to a flag), ignored with a warning (nothing in Weir needs
//! it), or refused at start with one line and exit code 2 (Weir cannot do what it asks);
//! docs/envoy-gateway.md has the table.

use std::collections::HashMap;

/// What the variables ask for.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Translation {
    /// `weir serve`'s arguments.
    pub(crate) args: Vec<String>,
    /// The log filter (`WEIR_LOG`'s syntax).
    pub(crate) log: Option<String>,
    /// A second address serving the HTTP API with `/metrics` (`PROMETHEUS_ADDR`).
    pub(crate) metrics_addr: Option<String>,
    /// Variables set that Weir ignores, each with why.
    pub(crate) warnings: Vec<String>,
}

/// Variables Weir ignores, with why (warned about when set to something else than ratelimit's
/// default or a value Weir already behaves as).
const IGNORED: [(&str, &str); 22] = [
    (
        "DEBUG_HOST",
        "no debug port: /metrics, /healthcheck and the dashboard are on PORT",
    ),
    (
        "DEBUG_PORT",
        "no debug port: /metrics, /healthcheck and the dashboard are on PORT",
    ),
    (
        "USE_STATSD",
        "no statsd: metrics are on /metrics (and OTLP)",
    ),
    ("STATSD_HOST", "no statsd"),
    ("STATSD_PORT", "no statsd"),
    (
        "PROMETHEUS_MAPPER_YAML",
        "Weir's metric names are its own (docs/observability.md)",
    ),
    ("EXTRA_TAGS", "no statsd"),
    ("STATS_FLUSH_INTERVAL", "metrics are read when scraped"),
    (
        "RUNTIME_IGNOREDOTFILES",
        "Weir reads the directory's *.yaml and *.yml files",
    ),
    (
        "RUNTIME_WATCH_ROOT",
        "Weir watches the configuration directory by content",
    ),
    (
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "Weir always starts before the first push (every request OK until then)",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE",
        "connections are bounded by weir serve's own limits",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "connections are bounded by weir serve's own limits",
    ),
    ("NEAR_LIMIT_RATIO", "near-limit counts use 80 %"),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "counters expire with their window",
    ),
    (
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "no over-limit cache: every decision is counted",
    ),
    (
        "CACHE_KEY_PREFIX",
        "Weir's Redis keys have their own prefix",
    ),
    ("REDIS_POOL_SIZE", "one multiplexed connection per node"),
    (
        "REDIS_PIPELINE_WINDOW",
        "Redis calls are batched per connection",
    ),
    (
        "REDIS_PIPELINE_LIMIT",
        "Redis calls are batched per connection",
    ),
    (
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "the xDS client reconnects after 0.5 s doubling to 30 s, ± 50 %",
    ),
    (
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        "the xDS client reconnects after 0.5 s doubling to 30 s, ± 50 %",
    ),
];

/// The arguments `vars` ask for, or the first variable Weir cannot honour.
pub(crate) fn translate(vars: &HashMap<String, String>) -> Result<Translation, String> {
    let var = |name: &str| vars.get(name).map(String::as_str).filter(|v| !v.is_empty());
    let on = |name: &str| {
        var(name).is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
    };
    let mut t = Translation::default();
    let addr = |host: &str, port: &str, default_port: &str| {
        let host = var(host).unwrap_or("0.0.0.0");
        let port = var(port).unwrap_or(default_port);
        if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    };
    t.args
        .extend(["--http-addr".into(), addr("HOST", "PORT", "8080")]);
    t.args
        .extend(["--grpc-addr".into(), addr("GRPC_HOST", "GRPC_PORT", "8081")]);
    match var("CONFIG_TYPE").unwrap_or("FILE") {
        "FILE" => {
            let root = var("RUNTIME_ROOT").unwrap_or("/srv/runtime_data/current");
            let mut path = std::path::PathBuf::from(root);
            if let Some(sub) = var("RUNTIME_SUBDIRECTORY") {
                path.push(sub);
            }
            path.push(var("RUNTIME_APPDIRECTORY").unwrap_or("config"));
            t.args
                .extend(["--config".into(), path.display().to_string()]);
        }
        "GRPC_XDS_SOTW" => {
            let server = var("CONFIG_GRPC_XDS_SERVER_URL").unwrap_or("localhost:18000");
            let node = var("CONFIG_GRPC_XDS_NODE_ID").unwrap_or("default");
            t.args.extend(["--xds-server".into(), server.into()]);
            t.args.extend(["--xds-node-id".into(), node.into()]);
            for name in [
                "CONFIG_GRPC_XDS_NODE_METADATA",
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            ] {
                if var(name).is_some() {
                    return Err(format!(
                        "{name}: not supported yet (the xDS client sends the node id only)"
                    ));
                }
            }
        }
        other => {
            return Err(format!(
                "CONFIG_TYPE={other:?}: expected FILE or GRPC_XDS_SOTW"
            ))
        }
    }
    tls(vars, &mut t)?;
    if let Some(uds) = var("GRPC_UDS") {
        return Err(format!("GRPC_UDS={uds:?}: a Unix socket listener is not supported; use GRPC_HOST and GRPC_PORT"));
    }
    match var("BACKEND_TYPE").unwrap_or("redis") {
        "redis" => store(vars, &mut t)?,
        other => {
            return Err(format!(
                "BACKEND_TYPE={other:?}: expected redis (Weir counts in memory or on Redis)"
            ))
        }
    }
    if on("REDIS_PERSECOND") {
        return Err(
            "REDIS_PERSECOND=true: a second Redis for per-second limits is not supported".into(),
        );
    }
    for (name, flag) in [
        ("SHADOW_MODE", "--shadow"),
        ("MERGE_DOMAIN_CONFIG", "--merge-domains"),
        ("RESPONSE_DYNAMIC_METADATA", "--response-metadata"),
    ] {
        if on(name) {
            t.args.push(flag.into());
        }
    }
    if on("LIMIT_RESPONSE_HEADERS_ENABLED") {
        t.args
            .extend(["--response-headers".into(), "draft03".into()]);
        t.warnings.push("LIMIT_RESPONSE_HEADERS_ENABLED: the headers are X-RateLimit-Limit, -Remaining and -Reset (LIMIT_*_HEADER names are not read)".into());
    }
    if on("QUOTA_MODE") {
        return Err("QUOTA_MODE=true: a global quota mode is not supported; set quota_mode on the descriptors".into());
    }
    if on("USE_PROMETHEUS") {
        let addr = var("PROMETHEUS_ADDR").unwrap_or(":9090");
        let addr = match addr.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => addr.to_string(),
        };
        if var("PROMETHEUS_PATH").is_some_and(|p| p != "/metrics") {
            t.warnings
                .push("PROMETHEUS_PATH: metrics are served at /metrics".into());
        }
        t.metrics_addr = Some(addr);
    }
    t.log = var("LOG_LEVEL").map(|l| match l.to_ascii_lowercase().as_str() {
        "trace" => "trace".into(),
        "debug" => "debug".into(),
        "warn" | "warning" => "warn".into(),
        "error" | "fatal" | "panic" => "error".into(),
        _ => "info".into(),
    });
    if var("LOG_FORMAT").is_some_and(|f| f != "text") {
        t.warnings.push("LOG_FORMAT: logs are text lines".into());
    }
    if on("TRACING_ENABLED") {
        let rate = var("TRACING_SAMPLING_RATE").unwrap_or("1");
        t.args.extend(["--trace-ratio".into(), rate.into()]);
        if let Some(p) = var("TRACING_EXPORTER_PROTOCOL") {
            let p = if p == "grpc" { "grpc" } else { "http/protobuf" };
            t.args.extend(["--otlp-protocol".into(), p.into()]);
        }
    }
    for (name, why) in IGNORED {
        let default = matches!(
            (name, var(name)),
            ("USE_STATSD", Some("false"))
                | ("FORCE_START_WITHOUT_INITIAL_CONFIG", _)
                | ("RUNTIME_WATCH_ROOT", _)
                | ("RUNTIME_IGNOREDOTFILES", _)
        );
        if var(name).is_some() && !default {
            t.warnings.push(format!("{name}: ignored ({why})"));
        }
    }
    Ok(t)
}

/// The TLS flags of the gRPC listener and the xDS client.
fn tls(vars: &HashMap<String, String>, t: &mut Translation) -> Result<(), String> {
    let var = |name: &str| vars.get(name).map(String::as_str).filter(|v| !v.is_empty());
    let on = |name: &str| var(name).is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    let need = |name: &str, why: &str| {
        var(name)
            .map(str::to_string)
            .ok_or_else(|| format!("{name} is not set ({why})"))
    };
    if on("GRPC_SERVER_USE_TLS") {
        let cert = need("GRPC_SERVER_TLS_CERT", "GRPC_SERVER_USE_TLS=true")?;
        let key = need("GRPC_SERVER_TLS_KEY", "GRPC_SERVER_USE_TLS=true")?;
        t.args
            .extend(["--grpc-tls-cert".into(), cert, "--grpc-tls-key".into(), key]);
        // envoyproxy/ratelimit's name, and Envoy Gateway's.
        if let Some(ca) = var("GRPC_CLIENT_TLS_CACERT").or(var("GRPC_SERVER_TLS_CA_CERT")) {
            t.args.extend(["--grpc-tls-client-ca".into(), ca.into()]);
        }
        if var("GRPC_CLIENT_TLS_SAN").is_some() {
            return Err("GRPC_CLIENT_TLS_SAN: checking a client certificate's name is not supported (clients are checked against the CA)".into());
        }
    }
    if on("CONFIG_GRPC_XDS_SERVER_USE_TLS") {
        let ca = need(
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
            "CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
        )?;
        t.args.extend(["--xds-tls-ca".into(), ca]);
        if let (Some(cert), Some(key)) = (
            var("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
            var("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
        ) {
            t.args.extend([
                "--xds-tls-cert".into(),
                cert.into(),
                "--xds-tls-key".into(),
                key.into(),
            ]);
        }
        if let Some(san) = var("CONFIG_GRPC_XDS_SERVER_TLS_SAN") {
            t.args.extend(["--xds-tls-server-name".into(), san.into()]);
        }
    }
    if on("REDIS_TLS") {
        return Err("REDIS_TLS=true: TLS to Redis is not supported".into());
    }
    Ok(())
}

/// `--store` from the Redis variables (`REDIS_URL` unset: counters in memory, with a warning).
fn store(vars: &HashMap<String, String>, t: &mut Translation) -> Result<(), String> {
    let var = |name: &str| vars.get(name).map(String::as_str).filter(|v| !v.is_empty());
    let Some(url) = var("REDIS_URL") else {
        t.warnings
            .push("REDIS_URL is not set: counters are kept in memory, this replica's own".into());
        return Ok(());
    };
    if var("REDIS_SOCKET_TYPE").unwrap_or("unix") != "tcp" {
        return Err(format!("REDIS_SOCKET_TYPE: a Unix socket to Redis ({url}) is not supported; set tcp and HOST:PORT"));
    }
    let auth = var("REDIS_AUTH").map_or(String::new(), |a| match a.split_once(':') {
        Some((user, pass)) => format!("{user}:{pass}@"),
        None => format!(":{a}@"),
    });
    let hosts = url.split(',').map(str::trim).collect::<Vec<_>>();
    let store = match var("REDIS_TYPE")
        .unwrap_or("SINGLE")
        .to_ascii_uppercase()
        .as_str()
    {
        "SINGLE" if hosts.len() == 1 => format!("redis://{auth}{url}"),
        "CLUSTER" => format!("redis+cluster://{auth}{}", hosts.join(",")),
        "SINGLE" => return Err("REDIS_URL: one HOST:PORT for REDIS_TYPE=SINGLE".into()),
        other => {
            return Err(format!(
                "REDIS_TYPE={other:?}: expected SINGLE or CLUSTER (Sentinel is not supported)"
            ))
        }
    };
    t.args.extend(["--store".into(), store]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// What Envoy Gateway sets.
    #[test]
    fn envoy_gateways_settings_become_flags() {
        let t = translate(&vars(&[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.redis-system.svc.cluster.local:6379"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ]))
        .unwrap();
        assert_eq!(
            t.args,
            [
                "--http-addr",
                "0.0.0.0:8080",
                "--grpc-addr",
                "0.0.0.0:8081",
                "--xds-server",
                "envoy-gateway:18001",
                "--xds-node-id",
                "envoy-ratelimit",
                "--grpc-tls-cert",
                "/certs/tls.crt",
                "--grpc-tls-key",
                "/certs/tls.key",
                "--grpc-tls-client-ca",
                "/certs/ca.crt",
                "--xds-tls-ca",
                "/certs/ca.crt",
                "--xds-tls-cert",
                "/certs/tls.crt",
                "--xds-tls-key",
                "/certs/tls.key",
                "--store",
                "redis://redis.redis-system.svc.cluster.local:6379",
            ]
        );
        assert_eq!(t.metrics_addr.as_deref(), Some("0.0.0.0:19001"));
        assert_eq!(t.log.as_deref(), Some("info"));
        assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
        assert!(t.warnings[0].starts_with("PROMETHEUS_MAPPER_YAML: ignored"));
    }

    #[test]
    fn files_redis_and_what_cannot_be_done() {
        let t = translate(&vars(&[
            ("RUNTIME_ROOT", "/srv"),
            ("RUNTIME_SUBDIRECTORY", "rl"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "a:7000, b:7001"),
            ("REDIS_AUTH", "secret"),
            ("SHADOW_MODE", "true"),
            ("GRPC_PORT", "9000"),
        ]))
        .unwrap();
        assert!(t
            .args
            .windows(2)
            .any(|w| w == ["--config", "/srv/rl/config"]));
        assert!(t
            .args
            .windows(2)
            .any(|w| w == ["--store", "redis+cluster://:secret@a:7000,b:7001"]));
        assert!(t
            .args
            .windows(2)
            .any(|w| w == ["--grpc-addr", "0.0.0.0:9000"]));
        assert!(t.args.contains(&"--shadow".to_string()));
        for (pairs, message) in [
            (
                vec![("CONFIG_TYPE", "GRPC_XDS_DELTA")],
                "CONFIG_TYPE=\"GRPC_XDS_DELTA\"",
            ),
            (
                vec![("GRPC_SERVER_USE_TLS", "true")],
                "GRPC_SERVER_TLS_CERT is not set",
            ),
            (vec![("REDIS_TLS", "true")], "REDIS_TLS=true"),
            (vec![("REDIS_URL", "/var/run/r.sock")], "REDIS_SOCKET_TYPE"),
            (
                vec![("BACKEND_TYPE", "memcache")],
                "BACKEND_TYPE=\"memcache\"",
            ),
            (
                vec![
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_URL", "a:1"),
                    ("REDIS_TYPE", "SENTINEL"),
                ],
                "Sentinel",
            ),
        ] {
            let e = translate(&vars(&pairs)).unwrap_err();
            assert!(e.contains(message), "{e} lacks {message}");
        }
    }
}
