//! The command line: every subcommand's arguments (clap).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use weir::{duration, overload};
use weir_server::net::{accept, conn};
use weir_server::proxy;

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "Weir flow control",
    propagate_version = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run a CSV trace (t_ms,key,cost) through a rate-limiting algorithm on virtual time.
    Simulate(Box<SimulateArgs>),
    /// Run the Envoy rate-limit service (gRPC RLS v3) with an HTTP API and metrics.
    Serve(Box<ServeArgs>),
    /// Check a configuration: a weir rule file, a Lyft-format rate-limit YAML file (or a
    /// directory of them) or a quota file; the format is told by the top-level keys.
    CheckConfig(CheckConfigArgs),
    /// A reverse proxy applying a weir rule file to every request (HTTP/1.1 and h2c).
    Proxy(Box<ProxyArgs>),
    /// Cluster quota tools.
    #[command(subcommand)]
    Quota(QuotaCommand),
}

#[derive(Subcommand)]
pub(crate) enum QuotaCommand {
    /// Divide a capacity among clients' demands: CSV client,wants[,weight[,priority]] in,
    /// client,share out (input order), the total on stderr.
    Allocate(AllocateArgs),
}

#[derive(clap::Args)]
pub(crate) struct AllocateArgs {
    /// Units per second to divide.
    #[arg(long, value_name = "C")]
    pub(crate) capacity: f64,
    /// fair_share (exact weighted max-min), proportional_share or static.
    #[arg(long, value_name = "ALG", default_value = "fair_share")]
    pub(crate) algorithm: weir_quota::Division,
    /// The demands (CSV); `-` or absent: standard input.
    #[arg(long, value_name = "FILE|-")]
    pub(crate) input: Option<PathBuf>,
}

#[derive(clap::Args)]
pub(crate) struct ProxyArgs {
    /// The rule file (resources, rules and http.routes); reloaded when it changes.
    #[arg(long, value_name = "FILE")]
    pub(crate) rules: PathBuf,
    /// Listen address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    pub(crate) listen: std::net::SocketAddr,
    /// The upstream, http://HOST:PORT.
    #[arg(long, value_name = "URL")]
    pub(crate) upstream: String,
    /// Serve the dashboard (/), its JSON API (/api/v1/dashboard), /metrics (Prometheus) and
    /// /healthz on this address.
    #[arg(long, value_name = "ADDR")]
    pub(crate) admin: Option<std::net::SocketAddr>,
    /// With it, the admin listener answers 401 to requests for the dashboard's data and
    /// /metrics without `Authorization: Bearer TOKEN` (/healthz and the page stay open).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "WEIR_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub(crate) admin_token: Option<String>,
    /// Longest wait for the upstream's response head (then 504).
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "30s")]
    pub(crate) upstream_timeout: Duration,
    /// How often the rule file is checked for changes.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "1s")]
    pub(crate) reload_interval: Duration,
    #[command(flatten)]
    pub(crate) connections: ConnectionArgs,
    #[command(flatten)]
    pub(crate) otlp: OtlpArgs,
    /// Most requests in flight to the upstream, all clients together (then 503); each client
    /// connection at most 64.
    #[arg(long, value_name = "N", default_value_t = 1_024)]
    pub(crate) max_upstream_requests: usize,
    /// Most requests in flight to the upstream from one client address (an IPv6 /64), then
    /// 503 (default: a quarter of --max-upstream-requests).
    #[arg(long, value_name = "N")]
    pub(crate) max_upstream_per_address: Option<usize>,
    /// A request body streamed to the upstream is cut off (408) after this long without data.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "10s")]
    pub(crate) body_idle_timeout: Duration,
    /// ... and when, after its first --body-idle-timeout, it has arrived at fewer bytes a
    /// second than this on average (0: no rate).
    #[arg(long, value_name = "BYTES", default_value_t = 1_024)]
    pub(crate) body_min_rate: u64,
    /// Most bytes of request bodies held at once by the whole process to read a JSON cost
    /// estimate (`estimate_from: {json: …}`; each connection at most 4 MiB, each body 64 KiB);
    /// past it a body is passed on unread and its call holds the rule's estimate.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    pub(crate) max_buffered_bytes: usize,
    /// The quota server for `cluster` flow rules: http://HOST:PORT of `weir serve --quota`.
    #[arg(long, value_name = "URL")]
    pub(crate) quota_server: Option<String>,
    /// This proxy's client id at the quota server (default: weir-proxy-HOSTNAME-PID).
    #[arg(long, value_name = "ID")]
    pub(crate) quota_client_id: Option<String>,
    /// A file holding the bearer token to present to the quota server (when its quota file's
    /// clients section asks for one).
    #[arg(long, value_name = "FILE")]
    pub(crate) quota_token_file: Option<PathBuf>,
    /// On SIGTERM or Ctrl-C, how long the requests in flight get to finish before exit.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "10s")]
    pub(crate) drain_timeout: Duration,
    /// auto (gRPC calls go out over h2c, which gRPC needs; everything else over HTTP/1.1),
    /// http1 or h2c.
    #[arg(long, value_name = "P", default_value = "auto")]
    pub(crate) upstream_protocol: proxy::UpstreamProtocol,
    /// Which server reads HTTP/1.1 requests: lean (the proxy's own reader for requests
    /// without a body on routes without costs or fallbacks; hyper for the rest) or hyper (for
    /// every request).
    #[arg(long, value_name = "PATH", default_value = "lean")]
    pub(crate) http1: proxy::Http1,
    /// The clock limiters read: exact (default), coarse (one atomic load per decision, updated
    /// every 1 ms; decisions up to one tick conservative) or coarse:DUR (100us..1s).
    #[arg(long, value_name = "CLOCK", value_parser = duration::parse_clock, default_value = "exact")]
    pub(crate) clock: weir_core::ClockKind,
    /// A gutter, http://HOST:PORT: a small upstream that serves what the upstream's breaker
    /// sheds; when it cannot either, the request is thrown back at the upstream, else 503.
    #[arg(long, value_name = "URL")]
    pub(crate) gutter: Option<String>,
    /// With --gutter: most requests in flight to the gutter.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) gutter_max_requests: usize,
    /// With --gutter: the breaker of each upstream, as a rule file's breaker fields, e.g.
    /// '{error_ratio: 0.5, window_calls: 20, open_for: 10s}' (default: Resilience4j's).
    #[arg(long, value_name = "YAML", default_value = "{}", value_parser = parse_breaker)]
    pub(crate) upstream_breaker: weir_core::breaker::BreakerConfig,
    /// redis://HOST:PORT[/DB] or redis+cluster://H1:P1,H2:P2: rules that say `shared: true`
    /// count there, one budget for every proxy on it (default: they count in this process).
    #[arg(long, value_name = "STORE")]
    pub(crate) store: Option<String>,
    /// With --store: proxies sharing it (while Redis is unreachable each allows limit / N).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) instances: u64,
    /// Worker threads serving clients, each with its own listener (SO_REUSEPORT) and
    /// upstream connections (default: one per core).
    #[arg(long, value_name = "N")]
    pub(crate) workers: Option<usize>,
}

/// `--upstream-breaker`: a rule file's breaker fields (YAML flow mapping), validated as one.
pub(crate) fn parse_breaker(text: &str) -> Result<weir_core::breaker::BreakerConfig, String> {
    let yaml = format!("resources:\n  - name: upstream\n    breaker: {text}\n");
    let mut value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&yaml).map_err(|e| format!("{text:?}: {e}"))?;
    if let Some(b) = value["resources"][0]["breaker"].as_mapping_mut() {
        b.entry("id".into()).or_insert("upstream".into());
    } else {
        return Err(format!("{text:?}: expected {{field: value, …}}"));
    }
    let text = serde_yaml_ng::to_string(&value).map_err(|e| e.to_string())?;
    let set =
        weir_rules::config::RuleSet::from_yaml(std::path::Path::new("--upstream-breaker"), &text)
            .map_err(|e| e.to_string().replace("resources[0].breaker.", ""))?;
    set.resources[0]
        .breaker
        .as_ref()
        .map(|b| b.config())
        .ok_or_else(|| "no breaker".to_string())
}

#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// A Lyft-format YAML file or a directory of them (default: the bundled example).
    #[arg(long, value_name = "PATH", conflicts_with = "xds_server")]
    pub(crate) config: Option<PathBuf>,
    /// Take the configuration over xDS from this management server, HOST:PORT (envoyproxy/
    /// ratelimit's RateLimitConfig resources on the aggregated stream, as Envoy Gateway serves
    /// them); no domain until the first push. Not with --config.
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) xds_server: Option<String>,
    /// The node id sent to the xDS server.
    #[arg(long, value_name = "ID", default_value = "weir")]
    pub(crate) xds_node_id: String,
    /// Speak TLS to the xDS server, trusting this CA (PEM).
    #[arg(long, value_name = "FILE")]
    pub(crate) xds_tls_ca: Option<PathBuf>,
    /// This client's certificate for mutual TLS to the xDS server (PEM; with --xds-tls-key).
    #[arg(long, value_name = "FILE", requires_all = ["xds_tls_key", "xds_tls_ca"])]
    pub(crate) xds_tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE", requires = "xds_tls_cert")]
    pub(crate) xds_tls_key: Option<PathBuf>,
    /// The name the xDS server's certificate must carry (default: its host).
    #[arg(long, value_name = "NAME", requires = "xds_tls_ca")]
    pub(crate) xds_tls_server_name: Option<String>,
    /// Serve gRPC over TLS with this certificate chain (PEM; with --grpc-tls-key); reloaded
    /// when the file changes.
    #[arg(long, value_name = "FILE", requires = "grpc_tls_key")]
    pub(crate) grpc_tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE", requires = "grpc_tls_cert")]
    pub(crate) grpc_tls_key: Option<PathBuf>,
    /// Mutual TLS: gRPC clients must present a certificate chaining to this CA (PEM).
    #[arg(long, value_name = "FILE", requires = "grpc_tls_cert")]
    pub(crate) grpc_tls_client_ca: Option<PathBuf>,
    /// gRPC listen address (Envoy's rate-limit cluster points here).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    pub(crate) grpc_addr: std::net::SocketAddr,
    /// HTTP listen address (POST /json, GET /healthz, GET /metrics, the dashboard at /).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub(crate) http_addr: std::net::SocketAddr,
    /// A second address serving the same HTTP API, for a scraper that expects /metrics on a
    /// port of its own (envoyproxy/ratelimit's PROMETHEUS_ADDR).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    /// With it, the HTTP listener answers 401 to requests for the dashboard's data and
    /// /metrics without `Authorization: Bearer TOKEN` (/json, /healthz and the page stay open).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "WEIR_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub(crate) admin_token: Option<String>,
    /// memory, redis://HOST:PORT[/DB] or redis+cluster://H1:P1,H2:P2.
    #[arg(long, value_name = "STORE", default_value = "memory")]
    pub(crate) store: String,
    /// Instances sharing the Redis store (the local fallback allows limit / N each); a memory
    /// store is one process's alone and takes no other value than 1.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) instances: u64,
    /// Evaluate and count every rule, never answer OVER_LIMIT.
    #[arg(long)]
    pub(crate) shadow: bool,
    /// Also serve the cluster-quota lease API (HTTP/JSON, /quota/v1/…) for the resources of
    /// this quota file (docs/quota.md); reloaded when it changes.
    #[arg(long, value_name = "FILE")]
    pub(crate) quota: Option<PathBuf>,
    /// With --quota and a Redis --store: the servers of this group elect one quota leader
    /// through Redis (docs/quota.md, failover).
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub(crate) quota_group: String,
    /// With failover: the address lease clients are sent to when this server leads
    /// (default: http:// and --http-addr, which must then be a specific address and port).
    #[arg(long, value_name = "URL")]
    pub(crate) quota_advertise: Option<String>,
    /// With failover: the HOST:PORT gRPC lease clients are sent to when this server leads
    /// (default: --grpc-addr when it is a specific address and port).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) quota_advertise_grpc: Option<String>,
    /// With --quota: lease every capacity from this parent lease server (http://HOST:PORT of
    /// its HTTP API; several sharing a quota comma-separated) and divide what it grants — a
    /// regional server of a tree of lease servers (docs/quota.md).
    #[arg(long, value_name = "URL[,URL…]")]
    pub(crate) parent: Option<String>,
    /// With --parent: this server's client id at the parent (default: weir-serve-HOSTNAME-ADDR,
    /// unique per host; on Redis, where the servers of one failover group share it,
    /// weir-serve-ADDR). Keep it stable across restarts.
    #[arg(long, value_name = "ID")]
    pub(crate) parent_client_id: Option<String>,
    /// With --parent: a file holding the bearer token to present to the parent.
    #[arg(long, value_name = "FILE")]
    pub(crate) parent_token_file: Option<PathBuf>,
    /// With failover: the leader key's time to live; renewed every fifth of it. A dead
    /// leader is replaced within about 1.2 × this.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "5s")]
    pub(crate) quota_leader_ttl: Duration,
    /// Rate-limit headers Envoy adds to responses: none, draft03 (X-RateLimit-*) or ietf
    /// (RateLimit-Policy, RateLimit, Retry-After).
    #[arg(long, value_name = "STYLE", default_value = "none", value_parser = ["none", "draft03", "ietf"])]
    pub(crate) response_headers: String,
    /// Answer with Lyft's dynamic metadata (domain, descriptors, hits and the `metadata` of
    /// the descriptors that passed), as envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA.
    #[arg(long)]
    pub(crate) response_metadata: bool,
    /// A domain defined in several files of a --config directory joins their descriptors
    /// (Lyft's MERGE_DOMAIN_CONFIG) instead of being an error.
    #[arg(long)]
    pub(crate) merge_domains: bool,
    #[command(flatten)]
    pub(crate) connections: ConnectionArgs,
    #[command(flatten)]
    pub(crate) otlp: OtlpArgs,
    /// Longest time from a request's head to the end of its body (then DEADLINE_EXCEEDED /
    /// 408).
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "10s")]
    pub(crate) body_timeout: Duration,
    /// Most bytes of unfinished request bodies buffered by the whole process (each connection
    /// at most 4 MiB).
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    pub(crate) max_buffered_bytes: usize,
    /// On SIGTERM or Ctrl-C, how long the calls in flight get to finish before exit.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "10s")]
    pub(crate) drain_timeout: Duration,
    /// The clock limiters read: exact (default), coarse (one atomic load per decision, updated
    /// every 1 ms; decisions up to one tick conservative) or coarse:DUR (100us..1s).
    #[arg(long, value_name = "CLOCK", value_parser = duration::parse_clock, default_value = "exact")]
    pub(crate) clock: weir_core::ClockKind,
}

/// OpenTelemetry export shared by `serve` and `proxy` (docs/observability.md): the flags, over
/// the standard `OTEL_` variables.
#[derive(clap::Args)]
pub(crate) struct OtlpArgs {
    /// Push every metric family of /metrics to an OpenTelemetry collector, http://HOST:PORT
    /// (default: OTEL_EXPORTER_OTLP_ENDPOINT; no export when neither is set). OTEL_SERVICE_NAME,
    /// OTEL_RESOURCE_ATTRIBUTES, OTEL_METRIC_EXPORT_INTERVAL (ms, default 60000) and
    /// OTEL_EXPORTER_OTLP_TIMEOUT (ms, default 10000) apply.
    #[arg(long, value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,
    /// grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf).
    #[arg(long, value_name = "P")]
    pub(crate) otlp_protocol: Option<weir_server::otlp::Protocol>,
    /// Send a span per decision for this share (0 to 1) of the requests that bring no sampled
    /// traceparent; a caller's sampled traceparent is always followed (default:
    /// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG; no spans when neither is set).
    #[arg(long, value_name = "RATIO")]
    pub(crate) trace_ratio: Option<f64>,
    /// Send a span for every refusal, whatever the ratio.
    #[arg(long)]
    pub(crate) trace_refusals: bool,
}

impl OtlpArgs {
    /// The export these flags and the environment ask for (`None`: none), as `service`.
    pub(crate) fn settings(
        &self,
        service: &str,
    ) -> Result<Option<weir_server::otlp::Settings>, weir_server::otlp::OtlpError> {
        let settings = weir_server::otlp::Settings::from_env(
            std::env::vars(),
            self.otlp_endpoint.as_deref(),
            self.otlp_protocol,
            service,
        )?;
        match settings {
            Some(mut s) => {
                s.trace(self.trace_ratio, self.trace_refusals)?;
                Ok(Some(s))
            }
            None if self.trace_ratio.is_some() || self.trace_refusals => {
                Err(weir_server::otlp::OtlpError::NoTracesEndpoint)
            }
            None => Ok(None),
        }
    }
}

/// Connection bounds shared by `serve` and `proxy` (see docs/limits.md).
#[derive(clap::Args)]
pub(crate) struct ConnectionArgs {
    /// Most connections open at once per listener; at the cap the connection idle the longest
    /// is closed to make room.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub(crate) max_connections: usize,
    /// Longest wait for a connection's first request and for each request head.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "10s")]
    pub(crate) header_timeout: Duration,
    /// Close a connection that has had no request in flight for this long.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "60s")]
    pub(crate) idle_timeout: Duration,
}

impl ConnectionArgs {
    pub(crate) fn limits(&self) -> accept::Limits {
        accept::Limits {
            max_connections: self.max_connections,
            timeouts: conn::Timeouts {
                first_request: self.header_timeout,
                idle: self.idle_timeout,
            },
        }
    }
}

#[derive(clap::Args)]
pub(crate) struct CheckConfigArgs {
    /// The file or directory to check.
    pub(crate) path: PathBuf,
    /// Lyft configurations: a domain in several files joins their descriptors (as
    /// `weir serve --merge-domains`).
    #[arg(long)]
    pub(crate) merge_domains: bool,
    /// The file's kind: rules (weir proxy, weir-rules), lyft (weir serve --config) or quota
    /// (weir serve --quota). Default: told by its top-level keys.
    #[arg(long, value_name = "KIND", value_parser = ["rules", "lyft", "quota"])]
    pub(crate) kind: Option<String>,
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct SimulateArgs {
    #[command(subcommand)]
    pub(crate) scenario: Option<Scenario>,
    /// fixed_window, sliding_window, sliding_log, sliding_counter, gcra, token_bucket,
    /// warmup_token_bucket or pacing.
    #[arg(long, value_name = "ALG", required = true)]
    pub(crate) algorithm: Option<String>,
    /// Units per window.
    #[arg(long, value_name = "N", required = true)]
    pub(crate) limit: Option<u64>,
    /// The window, e.g. 1s, 250ms, 1m.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, required = true)]
    pub(crate) window: Option<Duration>,
    /// Units admitted at once (gcra, token_bucket; default: the limit).
    #[arg(long, value_name = "B")]
    pub(crate) burst: Option<u64>,
    /// Sub-windows of sliding_window (default 10).
    #[arg(long, value_name = "B")]
    pub(crate) buckets: Option<u32>,
    /// Warm-up period of warmup_token_bucket (default 10s).
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration)]
    pub(crate) warmup: Option<Duration>,
    /// Longest wait an admitted request may be given (token buckets, pacing; default 0; `inf`).
    #[arg(long, value_name = "DUR", value_parser = duration::parse_max_wait)]
    pub(crate) max_wait: Option<Duration>,
    /// Trace file, or - for standard input (default: the bundled boundary-burst trace).
    #[arg(long, value_name = "FILE|-")]
    pub(crate) input: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
}

/// `--report` and `--compare`, shared by the simulators.
#[derive(clap::Args)]
pub(crate) struct ReportArgs {
    /// Also write a self-contained HTML report with charts to FILE (inline SVG, no external
    /// assets).
    #[arg(long, value_name = "FILE")]
    pub(crate) report: Option<PathBuf>,
    /// With --report: run a second configuration beside the first (another algorithm or
    /// protection, with the same other settings) and show both side by side.
    #[arg(long, value_name = "ALT", requires = "report")]
    pub(crate) compare: Option<String>,
}

#[derive(Subcommand)]
pub(crate) enum Scenario {
    /// A service at X × its capacity in virtual time, behind one of Weir's protections.
    Overload(OverloadArgs),
    /// Cluster quota in virtual time: the real allocator, lease table and clients.
    Quota(QuotaSimArgs),
}

#[derive(clap::Args)]
pub(crate) struct QuotaSimArgs {
    /// Units per second shared by all clients.
    #[arg(long, value_name = "C")]
    pub(crate) capacity: f64,
    /// fair_share, proportional_share or static.
    #[arg(long, value_name = "ALG", default_value = "fair_share")]
    pub(crate) algorithm: weir_quota::Division,
    /// Clients of the built-in scenario (ignored with --scenario).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub(crate) clients: usize,
    /// Scenario CSV t_ms,client,demand (demand in units/s, or `leave`).
    #[arg(long, value_name = "FILE")]
    pub(crate) scenario: Option<PathBuf>,
    /// Refresh interval.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "5s")]
    pub(crate) refresh: Duration,
    /// Lease length.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "30s")]
    pub(crate) lease: Duration,
    /// Simulated time.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "300s")]
    pub(crate) duration: Duration,
    /// The server is unreachable FROM..TO (e.g. 100s..200s) and restarts without its table.
    #[arg(long, value_name = "FROM..TO")]
    pub(crate) server_down: Option<String>,
    /// A tree of lease servers instead of one: servers per level, the root's first (e.g.
    /// 1x10x100); --clients are spread over the last level's servers.
    #[arg(long, value_name = "SHAPE")]
    pub(crate) tree: Option<String>,
    /// With --tree: the first server of the second level cannot reach the root FROM..TO.
    #[arg(long, value_name = "FROM..TO")]
    pub(crate) cut_region: Option<String>,
    /// Random seed (same seed, same result).
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub(crate) seed: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
}

#[derive(clap::Args)]
pub(crate) struct OverloadArgs {
    /// none, static, bbr, gradient2, aimd, vegas or codel.
    #[arg(long, value_name = "P")]
    pub(crate) protection: String,
    /// Offered load as a multiple of capacity (e.g. 3).
    #[arg(long, value_name = "X")]
    pub(crate) load: f64,
    /// Requests per second the service completes at full use.
    #[arg(long, value_name = "C", default_value_t = 1000.0)]
    pub(crate) capacity: f64,
    /// Simulated time.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "30s")]
    pub(crate) duration: Duration,
    /// Random seed (same seed, same result).
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub(crate) seed: u64,
    /// Workers (threads) of the simulated service.
    #[arg(long, value_name = "W", default_value_t = overload::DEFAULT_WORKERS)]
    pub(crate) workers: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
}
