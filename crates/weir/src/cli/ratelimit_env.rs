//! envoyproxy/ratelimit's settings, as environment variables, turned into `weir serve`'s
//! arguments: the binary started as `ratelimit` (Envoy Gateway runs `/bin/ratelimit` in its
//! rate-limit Deployment) reads them, so Weir's image runs where ratelimit's does. Each
//! variable is supported (mapped to a flag), ignored with a warning (nothing in Weir needs
//! it), or refused at start with one line and exit code 2 (Weir cannot do what it asks);
//! docs/serve.md has the table.

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

/// What Weir does with a variable envoyproxy/ratelimit reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handling {
    /// Mapped to a flag.
    Supported,
    /// Nothing in Weir needs it: set, it is warned about once at start.
    Ignored,
    /// Weir cannot do what it asks: set (to anything but its default), the start fails.
    Refused,
}

/// Every variable envoyproxy/ratelimit reads (its `src/settings/settings.go`), and Envoy
/// Gateway's `GRPC_SERVER_TLS_CA_CERT`: how Weir takes it, and what it does (the table of
/// docs/serve.md, which a test holds equal to this one).
pub(crate) const VARIABLES: [(&str, Handling, &str); 115] = [
    ("HOST", Handling::Supported, "with PORT: `--http-addr` (default 0.0.0.0:8080): /json, /healthcheck, /metrics, the dashboard"),
    ("PORT", Handling::Supported, "see HOST"),
    ("DEBUG_HOST", Handling::Ignored, "no debug port: /metrics, /healthcheck and the dashboard are on PORT"),
    ("DEBUG_PORT", Handling::Ignored, "no debug port: /metrics, /healthcheck and the dashboard are on PORT"),
    ("GRPC_UDS", Handling::Refused, "a Unix socket listener is not supported; use GRPC_HOST and GRPC_PORT"),
    ("GRPC_HOST", Handling::Supported, "with GRPC_PORT: `--grpc-addr` (default 0.0.0.0:8081)"),
    ("GRPC_PORT", Handling::Supported, "see GRPC_HOST"),
    ("GRPC_MAX_CONNECTION_AGE", Handling::Ignored, "connections are bounded by `weir serve`'s own limits (docs/limits.md)"),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", Handling::Ignored, "connections are bounded by `weir serve`'s own limits (docs/limits.md)"),
    ("GRPC_SERVER_USE_TLS", Handling::Supported, "true: `--grpc-tls-cert`, `--grpc-tls-key` (reloaded when the files change)"),
    ("GRPC_SERVER_TLS_CERT", Handling::Supported, "`--grpc-tls-cert` (needed with GRPC_SERVER_USE_TLS)"),
    ("GRPC_SERVER_TLS_KEY", Handling::Supported, "`--grpc-tls-key` (needed with GRPC_SERVER_USE_TLS)"),
    ("GRPC_CLIENT_TLS_CACERT", Handling::Supported, "`--grpc-tls-client-ca`: clients must present a certificate of this CA"),
    ("GRPC_SERVER_TLS_CA_CERT", Handling::Supported, "Envoy Gateway's name for GRPC_CLIENT_TLS_CACERT"),
    ("GRPC_CLIENT_TLS_SAN", Handling::Refused, "checking a client certificate's name is not supported (clients are checked against the CA)"),
    ("LOG_LEVEL", Handling::Supported, "the log filter (`WEIR_LOG` takes precedence)"),
    ("LOG_FORMAT", Handling::Ignored, "logs are text lines"),
    ("CONFIG_TYPE", Handling::Supported, "FILE: `--config` RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY; GRPC_XDS_SOTW: `--xds-server`; anything else refused"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", Handling::Ignored, "weir always starts before the first push (every request OK until then)"),
    ("CONFIG_GRPC_XDS_NODE_ID", Handling::Supported, "`--xds-node-id` (default `default`)"),
    ("CONFIG_GRPC_XDS_NODE_METADATA", Handling::Refused, "the xDS client sends the node id only"),
    ("CONFIG_GRPC_XDS_SERVER_URL", Handling::Supported, "`--xds-server` (default localhost:18000)"),
    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Handling::Ignored, "the xDS client reconnects after 0.5 s doubling to 30 s, ± 50 %"),
    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", Handling::Refused, "the xDS client sends no extra headers"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", Handling::Supported, "true: `--xds-tls-ca` (and the client certificate below)"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Handling::Supported, "`--xds-tls-cert` (mutual TLS)"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Handling::Supported, "`--xds-tls-key`"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Handling::Supported, "`--xds-tls-ca` (needed with CONFIG_GRPC_XDS_SERVER_USE_TLS)"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", Handling::Supported, "`--xds-tls-server-name`"),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", Handling::Ignored, "the xDS client reconnects after 0.5 s doubling to 30 s, ± 50 %"),
    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Handling::Ignored, "the xDS client reconnects after 0.5 s doubling to 30 s, ± 50 %"),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Handling::Ignored, "the xDS client reconnects after 0.5 s doubling to 30 s, ± 50 %"),
    ("XDS_CLIENT_BACKOFF_JITTER", Handling::Ignored, "the xDS client reconnects after 0.5 s doubling to 30 s, ± 50 %"),
    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", Handling::Ignored, "responses of up to 4 MiB are taken"),
    ("USE_DOG_STATSD", Handling::Ignored, "no statsd: metrics are on /metrics (and OTLP)"),
    ("USE_DOG_STATSD_MOGRIFIERS", Handling::Ignored, "no statsd"),
    ("USE_STATSD", Handling::Ignored, "no statsd: metrics are on /metrics (and OTLP)"),
    ("STATSD_HOST", Handling::Ignored, "no statsd"),
    ("STATSD_PORT", Handling::Ignored, "no statsd"),
    ("EXTRA_TAGS", Handling::Ignored, "no statsd"),
    ("STATS_FLUSH_INTERVAL", Handling::Ignored, "metrics are read when scraped"),
    ("DISABLE_STATS", Handling::Ignored, "metrics cost nothing unless scraped"),
    ("USE_PROMETHEUS", Handling::Supported, "true: `--metrics-addr` PROMETHEUS_ADDR (the HTTP API with /metrics there too)"),
    ("PROMETHEUS_ADDR", Handling::Supported, "see USE_PROMETHEUS (default :9090)"),
    ("PROMETHEUS_PATH", Handling::Ignored, "metrics are served at /metrics"),
    ("PROMETHEUS_MAPPER_YAML", Handling::Ignored, "Weir's metric names are its own (docs/observability.md)"),
    ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", Handling::Ignored, "times are in seconds, as Prometheus names them"),
    ("RUNTIME_ROOT", Handling::Supported, "see CONFIG_TYPE (default /srv/runtime_data/current)"),
    ("RUNTIME_SUBDIRECTORY", Handling::Supported, "see CONFIG_TYPE"),
    ("RUNTIME_APPDIRECTORY", Handling::Supported, "see CONFIG_TYPE (default `config`)"),
    ("RUNTIME_IGNOREDOTFILES", Handling::Ignored, "the directory's *.yaml and *.yml files are read"),
    ("RUNTIME_WATCH_ROOT", Handling::Ignored, "the configuration directory is watched by content"),
    ("EXPIRATION_JITTER_MAX_SECONDS", Handling::Ignored, "counters expire with their window"),
    ("LOCAL_CACHE_SIZE_IN_BYTES", Handling::Ignored, "no over-limit cache on the memory store; on Redis, weir-redis's own (docs/serve.md)"),
    ("NEAR_LIMIT_RATIO", Handling::Ignored, "near-limit counts use 80 %"),
    ("CACHE_KEY_PREFIX", Handling::Ignored, "Weir's Redis keys have their own prefix"),
    ("BACKEND_TYPE", Handling::Supported, "redis (the default); anything else refused"),
    ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", Handling::Ignored, "per rule: `count_denied: false` (docs/serve.md)"),
    ("LIMIT_RESPONSE_HEADERS_ENABLED", Handling::Supported, "true: `--response-headers draft03` (X-RateLimit-Limit, -Remaining, -Reset)"),
    ("LIMIT_LIMIT_HEADER", Handling::Ignored, "the header names are fixed"),
    ("LIMIT_REMAINING_HEADER", Handling::Ignored, "the header names are fixed"),
    ("LIMIT_RESET_HEADER", Handling::Ignored, "the header names are fixed"),
    ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Handling::Ignored, "/healthcheck answers OK once listening"),
    ("REDIS_SOCKET_TYPE", Handling::Supported, "tcp; unix refused"),
    ("REDIS_TYPE", Handling::Supported, "SINGLE: `--store redis://`; CLUSTER: `--store redis+cluster://`; SENTINEL refused"),
    ("REDIS_URL", Handling::Supported, "HOST:PORT (comma-separated for a cluster) into `--store`; unset: counters in memory, with a warning"),
    ("REDIS_POOL_SIZE", Handling::Ignored, "one multiplexed connection per node"),
    ("REDIS_AUTH", Handling::Supported, "the password (or `user:password`) in `--store`"),
    ("REDIS_TLS", Handling::Refused, "TLS to Redis is not supported"),
    ("REDIS_TLS_CLIENT_CERT", Handling::Ignored, "only with REDIS_TLS"),
    ("REDIS_TLS_CLIENT_KEY", Handling::Ignored, "only with REDIS_TLS"),
    ("REDIS_TLS_CACERT", Handling::Ignored, "only with REDIS_TLS"),
    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Handling::Ignored, "only with REDIS_TLS"),
    ("REDIS_PIPELINE_WINDOW", Handling::Ignored, "Redis calls are batched per connection"),
    ("REDIS_PIPELINE_LIMIT", Handling::Ignored, "Redis calls are batched per connection"),
    ("REDIS_CLUSTER_PIPELINE_PARALLELISM", Handling::Ignored, "Redis calls are batched per connection"),
    ("REDIS_PERSECOND", Handling::Refused, "a second Redis for per-second limits is not supported"),
    ("REDIS_PERSECOND_SOCKET_TYPE", Handling::Ignored, "only with REDIS_PERSECOND"),
    ("REDIS_PERSECOND_TYPE", Handling::Ignored, "only with REDIS_PERSECOND"),
    ("REDIS_PERSECOND_URL", Handling::Ignored, "only with REDIS_PERSECOND"),
    ("REDIS_PERSECOND_POOL_SIZE", Handling::Ignored, "only with REDIS_PERSECOND"),
    ("REDIS_PERSECOND_AUTH", Handling::Ignored, "only with REDIS_PERSECOND"),
    ("REDIS_PERSECOND_TLS", Handling::Ignored, "only with REDIS_PERSECOND"),
    ("REDIS_SENTINEL_AUTH", Handling::Ignored, "Sentinel is not supported (REDIS_TYPE)"),
    ("REDIS_PERSECOND_SENTINEL_AUTH", Handling::Ignored, "only with REDIS_PERSECOND"),
    ("REDIS_PERSECOND_PIPELINE_WINDOW", Handling::Ignored, "only with REDIS_PERSECOND"),
    ("REDIS_PERSECOND_PIPELINE_LIMIT", Handling::Ignored, "only with REDIS_PERSECOND"),
    ("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", Handling::Ignored, "only with REDIS_PERSECOND"),
    ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", Handling::Ignored, "a Redis that fails is seen at the next call (local fallback)"),
    ("REDIS_TIMEOUT", Handling::Ignored, "Redis calls time out after 30 ms, then the local fallback decides (docs/redis.md)"),
    ("REDIS_PERSECOND_TIMEOUT", Handling::Ignored, "only with REDIS_PERSECOND"),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", Handling::Ignored, "one multiplexed connection per node"),
    ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", Handling::Ignored, "only with REDIS_PERSECOND"),
    ("REDIS_STARTUP_INITIAL_INTERVAL", Handling::Ignored, "a Redis not reachable at start stops the process (exit 2)"),
    ("REDIS_STARTUP_MAX_INTERVAL", Handling::Ignored, "a Redis not reachable at start stops the process (exit 2)"),
    ("REDIS_STARTUP_MAX_ELAPSED_TIME", Handling::Ignored, "a Redis not reachable at start stops the process (exit 2)"),
    ("MEMCACHE_HOST_PORT", Handling::Ignored, "only with BACKEND_TYPE=memcache, which is refused"),
    ("MEMCACHE_MAX_IDLE_CONNS", Handling::Ignored, "only with BACKEND_TYPE=memcache, which is refused"),
    ("MEMCACHE_SRV", Handling::Ignored, "only with BACKEND_TYPE=memcache, which is refused"),
    ("MEMCACHE_SRV_REFRESH", Handling::Ignored, "only with BACKEND_TYPE=memcache, which is refused"),
    ("MEMCACHE_TLS", Handling::Ignored, "only with BACKEND_TYPE=memcache, which is refused"),
    ("MEMCACHE_TLS_CLIENT_CERT", Handling::Ignored, "only with BACKEND_TYPE=memcache, which is refused"),
    ("MEMCACHE_TLS_CLIENT_KEY", Handling::Ignored, "only with BACKEND_TYPE=memcache, which is refused"),
    ("MEMCACHE_TLS_CACERT", Handling::Ignored, "only with BACKEND_TYPE=memcache, which is refused"),
    ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", Handling::Ignored, "only with BACKEND_TYPE=memcache, which is refused"),
    ("SHADOW_MODE", Handling::Supported, "true: `--shadow`"),
    ("QUOTA_MODE", Handling::Refused, "a global quota mode is not supported; set `quota_mode` on the descriptors"),
    ("RESPONSE_DYNAMIC_METADATA", Handling::Supported, "true: `--response-metadata`"),
    ("MERGE_DOMAIN_CONFIG", Handling::Supported, "true: `--merge-domains`"),
    ("TRACING_ENABLED", Handling::Supported, "true: `--trace-ratio` TRACING_SAMPLING_RATE, to OTEL_EXPORTER_OTLP_ENDPOINT (docs/observability.md)"),
    ("TRACING_SERVICE_NAME", Handling::Ignored, "use OTEL_SERVICE_NAME"),
    ("TRACING_SERVICE_NAMESPACE", Handling::Ignored, "use OTEL_RESOURCE_ATTRIBUTES"),
    ("TRACING_SERVICE_INSTANCE_ID", Handling::Ignored, "use OTEL_RESOURCE_ATTRIBUTES"),
    ("TRACING_EXPORTER_PROTOCOL", Handling::Supported, "`--otlp-protocol` (grpc, else http/protobuf)"),
    ("TRACING_SAMPLING_RATE", Handling::Supported, "see TRACING_ENABLED (default 1)"),
];

/// The variables, as envoyproxy/ratelimit reads them: an empty value is unset.
struct Env<'a>(&'a HashMap<String, String>);

impl Env<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A boolean set to true.
    fn on(&self, name: &str) -> bool {
        self.get(name)
            .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
    }
}

/// The arguments `vars` ask for, or the first variable Weir cannot honour.
pub(crate) fn translate(vars: &HashMap<String, String>) -> Result<Translation, String> {
    let env = Env(vars);
    for (name, handling, why) in VARIABLES {
        // Refused unless it asks for nothing (false, 0, empty).
        let asks = env
            .get(name)
            .is_some_and(|v| !matches!(v.to_ascii_lowercase().as_str(), "false" | "0"));
        if handling == Handling::Refused && asks {
            return Err(format!("{name}: not supported ({why})"));
        }
    }
    let mut t = Translation::default();
    let addr = |host: &str, port: &str, default_port: &str| {
        let host = env.get(host).unwrap_or("0.0.0.0");
        let port = env.get(port).unwrap_or(default_port);
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
    source(&env, &mut t)?;
    tls(&env, &mut t)?;
    match env.get("BACKEND_TYPE").unwrap_or("redis") {
        "redis" => store(&env, &mut t)?,
        other => {
            return Err(format!(
                "BACKEND_TYPE={other:?}: expected redis (Weir counts in memory or on Redis)"
            ))
        }
    }
    options(&env, &mut t);
    ignored(&env, &mut t);
    Ok(t)
}

/// Where the configuration comes from: files under RUNTIME_ROOT, or xDS.
fn source(env: &Env<'_>, t: &mut Translation) -> Result<(), String> {
    match env.get("CONFIG_TYPE").unwrap_or("FILE") {
        "FILE" => {
            let root = env
                .get("RUNTIME_ROOT")
                .unwrap_or("/srv/runtime_data/current");
            let mut path = std::path::PathBuf::from(root);
            if let Some(sub) = env.get("RUNTIME_SUBDIRECTORY") {
                path.push(sub);
            }
            path.push(env.get("RUNTIME_APPDIRECTORY").unwrap_or("config"));
            t.args
                .extend(["--config".into(), path.display().to_string()]);
        }
        "GRPC_XDS_SOTW" => {
            let server = env
                .get("CONFIG_GRPC_XDS_SERVER_URL")
                .unwrap_or("localhost:18000");
            let node = env.get("CONFIG_GRPC_XDS_NODE_ID").unwrap_or("default");
            t.args.extend(["--xds-server".into(), server.into()]);
            t.args.extend(["--xds-node-id".into(), node.into()]);
        }
        other => {
            return Err(format!(
                "CONFIG_TYPE={other:?}: expected FILE or GRPC_XDS_SOTW"
            ))
        }
    }
    Ok(())
}

/// The answers' options, the metrics port, the log level and tracing.
fn options(env: &Env<'_>, t: &mut Translation) {
    for (name, flag) in [
        ("SHADOW_MODE", "--shadow"),
        ("MERGE_DOMAIN_CONFIG", "--merge-domains"),
        ("RESPONSE_DYNAMIC_METADATA", "--response-metadata"),
    ] {
        if env.on(name) {
            t.args.push(flag.into());
        }
    }
    if env.on("LIMIT_RESPONSE_HEADERS_ENABLED") {
        t.args
            .extend(["--response-headers".into(), "draft03".into()]);
        t.warnings.push("LIMIT_RESPONSE_HEADERS_ENABLED: the headers are X-RateLimit-Limit, -Remaining and -Reset (LIMIT_*_HEADER names are not read)".into());
    }
    if env.on("USE_PROMETHEUS") {
        let addr = env.get("PROMETHEUS_ADDR").unwrap_or(":9090");
        t.metrics_addr = Some(match addr.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => addr.to_string(),
        });
    }
    t.log = env
        .get("LOG_LEVEL")
        .map(|l| match l.to_ascii_lowercase().as_str() {
            "trace" => "trace".into(),
            "debug" => "debug".into(),
            "warn" | "warning" => "warn".into(),
            "error" | "fatal" | "panic" => "error".into(),
            _ => "info".into(),
        });
    if env.on("TRACING_ENABLED") {
        let rate = env.get("TRACING_SAMPLING_RATE").unwrap_or("1");
        t.args.extend(["--trace-ratio".into(), rate.into()]);
        if let Some(p) = env.get("TRACING_EXPORTER_PROTOCOL") {
            let p = if p == "grpc" { "grpc" } else { "http/protobuf" };
            t.args.extend(["--otlp-protocol".into(), p.into()]);
        }
    }
}

/// A warning for each ignored variable set to something Weir does not do anyway.
fn ignored(env: &Env<'_>, t: &mut Translation) {
    for (name, handling, why) in VARIABLES {
        let as_weir = matches!(
            (name, env.get(name)),
            ("USE_STATSD", Some("false"))
                | (
                    "FORCE_START_WITHOUT_INITIAL_CONFIG"
                        | "RUNTIME_WATCH_ROOT"
                        | "RUNTIME_IGNOREDOTFILES",
                    _
                )
                | ("PROMETHEUS_PATH", Some("/metrics"))
                | ("LOG_FORMAT", Some("text"))
        );
        if handling == Handling::Ignored && env.get(name).is_some() && !as_weir {
            t.warnings.push(format!("{name}: ignored ({why})"));
        }
    }
}

/// The TLS flags of the gRPC listener and the xDS client.
fn tls(env: &Env<'_>, t: &mut Translation) -> Result<(), String> {
    let need = |name: &str, why: &str| {
        env.get(name)
            .map(str::to_string)
            .ok_or_else(|| format!("{name} is not set ({why})"))
    };
    if env.on("GRPC_SERVER_USE_TLS") {
        let cert = need("GRPC_SERVER_TLS_CERT", "GRPC_SERVER_USE_TLS=true")?;
        let key = need("GRPC_SERVER_TLS_KEY", "GRPC_SERVER_USE_TLS=true")?;
        t.args
            .extend(["--grpc-tls-cert".into(), cert, "--grpc-tls-key".into(), key]);
        // envoyproxy/ratelimit's name, and Envoy Gateway's.
        if let Some(ca) = env
            .get("GRPC_CLIENT_TLS_CACERT")
            .or(env.get("GRPC_SERVER_TLS_CA_CERT"))
        {
            t.args.extend(["--grpc-tls-client-ca".into(), ca.into()]);
        }
    }
    if env.on("CONFIG_GRPC_XDS_SERVER_USE_TLS") {
        let ca = need(
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
            "CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
        )?;
        t.args.extend(["--xds-tls-ca".into(), ca]);
        if let (Some(cert), Some(key)) = (
            env.get("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
            env.get("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
        ) {
            t.args.extend([
                "--xds-tls-cert".into(),
                cert.into(),
                "--xds-tls-key".into(),
                key.into(),
            ]);
        }
        if let Some(san) = env.get("CONFIG_GRPC_XDS_SERVER_TLS_SAN") {
            t.args.extend(["--xds-tls-server-name".into(), san.into()]);
        }
    }
    Ok(())
}

/// `--store` from the Redis variables (`REDIS_URL` unset: counters in memory, with a warning).
fn store(env: &Env<'_>, t: &mut Translation) -> Result<(), String> {
    let var = |name: &str| env.get(name);
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
            (vec![("REDIS_TLS", "true")], "REDIS_TLS: not supported"),
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

    /// docs/serve.md's table names every variable once, as this file takes it.
    #[test]
    fn the_table_of_the_docs_is_this_one() {
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/serve.md"),
        )
        .unwrap();
        let rows: Vec<(String, String)> = docs
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
                let handling = cells.get(2)?;
                name.chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit())
                    .then(|| (name.to_string(), handling.to_string()))
            })
            .collect();
        assert_eq!(rows.len(), VARIABLES.len(), "one row per variable");
        for (name, handling, _) in VARIABLES {
            let row = rows.iter().find(|(n, _)| n == name);
            let expected = format!("{handling:?}").to_lowercase();
            assert_eq!(
                row.map(|(_, h)| h.as_str()),
                Some(expected.as_str()),
                "{name}"
            );
        }
    }
}
