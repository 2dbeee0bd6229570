//! The `weir` command.
//!
//! - `weir simulate`: run a trace through any algorithm on virtual time (see `simulate.rs`).
//!
//! Errors print one line `weir: error: …` and exit 2 (bad usage, configuration or input).

use weir::{duration, overload, quota, simulate};
use weir_server::{accept, budget, conn, proxy, rls};

use std::fs::File;
use std::io::{self, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// mimalloc rather than glibc's malloc: the servers allocate small, short-lived buffers per
/// request on every worker thread, where glibc's arenas took ≈ 10 % of `weir serve`'s CPU
/// under load (docs/serve.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The trace used when `--input` is not given: a burst across a window boundary.
const BUNDLED_TRACE: &str = include_str!("../traces/boundary_burst.csv");

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "Weir flow control",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a CSV trace (t_ms,key,cost) through a rate-limiting algorithm on virtual time.
    Simulate(SimulateArgs),
    /// Run the Envoy rate-limit service (gRPC RLS v3) with an HTTP API and metrics.
    Serve(ServeArgs),
    /// Check a configuration: a weir rule file, or a Lyft-format rate-limit YAML file (or a
    /// directory of them); the format is told by the top-level keys.
    CheckConfig(CheckConfigArgs),
    /// A reverse proxy applying a weir rule file to every request (HTTP/1.1 and h2c).
    Proxy(ProxyArgs),
    /// Cluster quota tools.
    #[command(subcommand)]
    Quota(QuotaCommand),
}

#[derive(Subcommand)]
enum QuotaCommand {
    /// Divide a capacity among clients' demands: CSV client,wants[,weight[,priority]] in,
    /// client,share out (input order), the total on stderr.
    Allocate(AllocateArgs),
}

#[derive(clap::Args)]
struct AllocateArgs {
    /// Units per second to divide.
    #[arg(long, value_name = "C")]
    capacity: f64,
    /// fair_share (exact weighted max-min), proportional_share or static.
    #[arg(long, value_name = "ALG", default_value = "fair_share")]
    algorithm: weir_quota::Algorithm,
    /// The demands (CSV); `-` or absent: standard input.
    #[arg(long, value_name = "FILE|-")]
    input: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ProxyArgs {
    /// The rule file (resources, rules and http.routes); reloaded when it changes.
    #[arg(long, value_name = "FILE")]
    rules: PathBuf,
    /// Listen address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    listen: std::net::SocketAddr,
    /// The upstream, http://HOST:PORT.
    #[arg(long, value_name = "URL")]
    upstream: String,
    /// Serve the dashboard (/), its JSON API (/api/v1/dashboard), /metrics (Prometheus) and
    /// /healthz on this address.
    #[arg(long, value_name = "ADDR")]
    admin: Option<std::net::SocketAddr>,
    /// With it, the admin listener answers 401 to requests for the dashboard's data and
    /// /metrics without `Authorization: Bearer TOKEN` (/healthz and the page stay open).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "WEIR_ADMIN_TOKEN",
        hide_env_values = true
    )]
    admin_token: Option<String>,
    /// Longest wait for the upstream's response head (then 504).
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "30s")]
    upstream_timeout: Duration,
    /// How often the rule file is checked for changes.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "1s")]
    reload_interval: Duration,
    #[command(flatten)]
    connections: ConnectionArgs,
    /// Most requests in flight to the upstream, all clients together (then 503); each client
    /// connection at most 64.
    #[arg(long, value_name = "N", default_value_t = 1_024)]
    max_upstream_requests: usize,
    /// Most requests in flight to the upstream from one client address (an IPv6 /64), then
    /// 503 (default: a quarter of --max-upstream-requests).
    #[arg(long, value_name = "N")]
    max_upstream_per_address: Option<usize>,
    /// A request body streamed to the upstream is cut off (408) after this long without data.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "10s")]
    body_idle_timeout: Duration,
    /// ... and when, after its first --body-idle-timeout, it has arrived at fewer bytes a
    /// second than this on average (0: no rate).
    #[arg(long, value_name = "BYTES", default_value_t = 1_024)]
    body_min_rate: u64,
    /// The quota server for `cluster` flow rules: http://HOST:PORT of `weir serve --quota`.
    #[arg(long, value_name = "URL")]
    quota_server: Option<String>,
    /// This proxy's client id at the quota server (default: weir-proxy-HOSTNAME-PID).
    #[arg(long, value_name = "ID")]
    quota_client_id: Option<String>,
    /// A file holding the bearer token to present to the quota server (when its quota file's
    /// clients section asks for one).
    #[arg(long, value_name = "FILE")]
    quota_token_file: Option<PathBuf>,
    /// On SIGTERM or Ctrl-C, how long the requests in flight get to finish before exit.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "10s")]
    drain_timeout: Duration,
    /// auto (gRPC calls go out over h2c, which gRPC needs; everything else over HTTP/1.1),
    /// http1 or h2c.
    #[arg(long, value_name = "P", default_value = "auto")]
    upstream_protocol: proxy::UpstreamProtocol,
    /// The clock limiters read: exact (default), coarse (one atomic load per decision, updated
    /// every 1 ms; decisions up to one tick conservative) or coarse:DUR (100us..1s).
    #[arg(long, value_name = "CLOCK", value_parser = duration::parse_clock, default_value = "exact")]
    clock: weir_core::ClockKind,
    /// A gutter, http://HOST:PORT: a small upstream that serves what the upstream's breaker
    /// sheds; when it cannot either, the request is thrown back at the upstream, else 503.
    #[arg(long, value_name = "URL")]
    gutter: Option<String>,
    /// With --gutter: most requests in flight to the gutter.
    #[arg(long, value_name = "N", default_value_t = 64)]
    gutter_max_requests: usize,
    /// With --gutter: the breaker of each upstream, as a rule file's breaker fields, e.g.
    /// '{error_ratio: 0.5, window_calls: 20, open_for: 10s}' (default: Resilience4j's).
    #[arg(long, value_name = "YAML", default_value = "{}", value_parser = parse_breaker)]
    upstream_breaker: weir_core::breaker::BreakerConfig,
}

/// `--upstream-breaker`: a rule file's breaker fields (YAML flow mapping), validated as one.
fn parse_breaker(text: &str) -> Result<weir_core::breaker::BreakerConfig, String> {
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
struct ServeArgs {
    /// A Lyft-format YAML file or a directory of them (default: the bundled example).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// gRPC listen address (Envoy's rate-limit cluster points here).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    grpc_addr: std::net::SocketAddr,
    /// HTTP listen address (POST /json, GET /healthz, GET /metrics, the dashboard at /).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    http_addr: std::net::SocketAddr,
    /// With it, the HTTP listener answers 401 to requests for the dashboard's data and
    /// /metrics without `Authorization: Bearer TOKEN` (/json, /healthz and the page stay open).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "WEIR_ADMIN_TOKEN",
        hide_env_values = true
    )]
    admin_token: Option<String>,
    /// memory, redis://HOST:PORT[/DB] or redis+cluster://H1:P1,H2:P2.
    #[arg(long, value_name = "STORE", default_value = "memory")]
    store: String,
    /// Instances sharing the Redis store (the local fallback allows limit / N each).
    #[arg(long, value_name = "N", default_value_t = 1)]
    instances: u64,
    /// Evaluate and count every rule, never answer OVER_LIMIT.
    #[arg(long)]
    shadow: bool,
    /// Also serve the cluster-quota lease API (HTTP/JSON, /quota/v1/…) for the resources of
    /// this quota file (docs/quota.md); reloaded when it changes.
    #[arg(long, value_name = "FILE")]
    quota: Option<PathBuf>,
    /// With --quota and a Redis --store: the servers of this group elect one quota leader
    /// through Redis (docs/quota.md, failover).
    #[arg(long, value_name = "NAME", default_value = "default")]
    quota_group: String,
    /// With failover: the address lease clients are sent to when this server leads
    /// (default: http:// and --http-addr, which must then be a specific address and port).
    #[arg(long, value_name = "URL")]
    quota_advertise: Option<String>,
    /// With failover: the HOST:PORT gRPC lease clients are sent to when this server leads
    /// (default: --grpc-addr when it is a specific address and port).
    #[arg(long, value_name = "HOST:PORT")]
    quota_advertise_grpc: Option<String>,
    /// With failover: the leader key's time to live; renewed every fifth of it. A dead
    /// leader is replaced within about 1.2 × this.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "5s")]
    quota_leader_ttl: Duration,
    /// Rate-limit headers Envoy adds to responses: none, draft03 (X-RateLimit-*) or ietf
    /// (RateLimit-Policy, RateLimit, Retry-After).
    #[arg(long, value_name = "STYLE", default_value = "none", value_parser = ["none", "draft03", "ietf"])]
    response_headers: String,
    /// Answer with Lyft's dynamic metadata (domain, descriptors, hits and the `metadata` of
    /// the descriptors that passed), as envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA.
    #[arg(long)]
    response_metadata: bool,
    /// A domain defined in several files of a --config directory joins their descriptors
    /// (Lyft's MERGE_DOMAIN_CONFIG) instead of being an error.
    #[arg(long)]
    merge_domains: bool,
    #[command(flatten)]
    connections: ConnectionArgs,
    /// Longest time from a request's head to the end of its body (then DEADLINE_EXCEEDED /
    /// 408).
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "10s")]
    body_timeout: Duration,
    /// Most bytes of unfinished request bodies buffered by the whole process (each connection
    /// at most 4 MiB).
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    max_buffered_bytes: usize,
    /// On SIGTERM or Ctrl-C, how long the calls in flight get to finish before exit.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "10s")]
    drain_timeout: Duration,
    /// The clock limiters read: exact (default), coarse (one atomic load per decision, updated
    /// every 1 ms; decisions up to one tick conservative) or coarse:DUR (100us..1s).
    #[arg(long, value_name = "CLOCK", value_parser = duration::parse_clock, default_value = "exact")]
    clock: weir_core::ClockKind,
}

/// Connection bounds shared by `serve` and `proxy` (see docs/limits.md).
#[derive(clap::Args)]
struct ConnectionArgs {
    /// Most connections open at once per listener; at the cap the connection idle the longest
    /// is closed to make room.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    max_connections: usize,
    /// Longest wait for a connection's first request and for each request head.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "10s")]
    header_timeout: Duration,
    /// Close a connection that has had no request in flight for this long.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "60s")]
    idle_timeout: Duration,
}

impl ConnectionArgs {
    fn limits(&self) -> accept::Limits {
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
struct CheckConfigArgs {
    /// The file or directory to check.
    path: PathBuf,
    /// Lyft configurations: a domain in several files joins their descriptors (as
    /// `weir serve --merge-domains`).
    #[arg(long)]
    merge_domains: bool,
    /// The file's kind: rules (weir proxy, weir-rules), lyft (weir serve --config) or quota
    /// (weir serve --quota). Default: told by its top-level keys.
    #[arg(long, value_name = "KIND", value_parser = ["rules", "lyft", "quota"])]
    kind: Option<String>,
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct SimulateArgs {
    #[command(subcommand)]
    scenario: Option<Scenario>,
    /// fixed_window, sliding_window, sliding_log, sliding_counter, gcra, token_bucket,
    /// warmup_token_bucket or pacing.
    #[arg(long, value_name = "ALG", required = true)]
    algorithm: Option<String>,
    /// Units per window.
    #[arg(long, value_name = "N", required = true)]
    limit: Option<u64>,
    /// The window, e.g. 1s, 250ms, 1m.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, required = true)]
    window: Option<Duration>,
    /// Units admitted at once (gcra, token_bucket; default: the limit).
    #[arg(long, value_name = "B")]
    burst: Option<u64>,
    /// Sub-windows of sliding_window (default 10).
    #[arg(long, value_name = "B")]
    buckets: Option<u32>,
    /// Warm-up period of warmup_token_bucket (default 10s).
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration)]
    warmup: Option<Duration>,
    /// Longest wait an admitted request may be given (token buckets, pacing; default 0; `inf`).
    #[arg(long, value_name = "DUR", value_parser = duration::parse_max_wait)]
    max_wait: Option<Duration>,
    /// Trace file, or - for standard input (default: the bundled boundary-burst trace).
    #[arg(long, value_name = "FILE|-")]
    input: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Scenario {
    /// A service at X × its capacity in virtual time, behind one of Weir's protections.
    Overload(OverloadArgs),
    /// Cluster quota in virtual time: the real allocator, lease table and clients.
    Quota(QuotaSimArgs),
}

#[derive(clap::Args)]
struct QuotaSimArgs {
    /// Units per second shared by all clients.
    #[arg(long, value_name = "C")]
    capacity: f64,
    /// fair_share, proportional_share or static.
    #[arg(long, value_name = "ALG", default_value = "fair_share")]
    algorithm: weir_quota::Algorithm,
    /// Clients of the built-in scenario (ignored with --scenario).
    #[arg(long, value_name = "N", default_value_t = 10)]
    clients: usize,
    /// Scenario CSV t_ms,client,demand (demand in units/s, or `leave`).
    #[arg(long, value_name = "FILE")]
    scenario: Option<PathBuf>,
    /// Refresh interval.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "5s")]
    refresh: Duration,
    /// Lease length.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "30s")]
    lease: Duration,
    /// Simulated time.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "300s")]
    duration: Duration,
    /// The server is unreachable FROM..TO (e.g. 100s..200s) and restarts without its table.
    #[arg(long, value_name = "FROM..TO")]
    server_down: Option<String>,
    /// Random seed (same seed, same result).
    #[arg(long, value_name = "S", default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct OverloadArgs {
    /// none, static, bbr, gradient2, aimd, vegas or codel.
    #[arg(long, value_name = "P")]
    protection: String,
    /// Offered load as a multiple of capacity (e.g. 3).
    #[arg(long, value_name = "X")]
    load: f64,
    /// Requests per second the service completes at full use.
    #[arg(long, value_name = "C", default_value_t = 1000.0)]
    capacity: f64,
    /// Simulated time.
    #[arg(long, value_name = "DUR", value_parser = duration::parse_duration, default_value = "30s")]
    duration: Duration,
    /// Random seed (same seed, same result).
    #[arg(long, value_name = "S", default_value_t = 1)]
    seed: u64,
    /// Workers (threads) of the simulated service.
    #[arg(long, value_name = "W", default_value_t = overload::DEFAULT_WORKERS)]
    workers: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_) | Command::Proxy(_)) {
        init_logging();
    }
    match cli.command {
        Command::Simulate(args) => run_simulate(args),
        Command::Serve(args) => run_serve(args),
        Command::CheckConfig(args) => run_check_config(args),
        Command::Proxy(args) => run_proxy(args),
        Command::Quota(QuotaCommand::Allocate(args)) => run_allocate(args),
    }
}

fn run_allocate(args: AllocateArgs) -> ExitCode {
    let read = match &args.input {
        None => quota::read_demands(io::stdin().lock(), "stdin"),
        Some(p) if p.as_os_str() == "-" => quota::read_demands(io::stdin().lock(), "stdin"),
        Some(p) => match File::open(p) {
            Ok(f) => quota::read_demands(BufReader::new(f), &p.display().to_string()),
            Err(e) => return fail(format_args!("{}: {e}", p.display())),
        },
    };
    let (names, demands) = match read {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    match quota::answer(args.capacity, args.algorithm, &names, &demands) {
        Ok((out, total)) => {
            print!("{out}");
            let _ = io::stdout().flush();
            eprintln!(
                "total {} of capacity {} ({} clients, {})",
                quota::decimal(total),
                quota::decimal(args.capacity),
                names.len(),
                args.algorithm.as_str()
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// Events (reloads, breaker transitions, upstream failures; blocks at `debug`) to stderr,
/// filtered by `WEIR_LOG` (default `info`; e.g. `WEIR_LOG=weir_rules=debug`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

/// The multi-threaded runtime of `serve` and `proxy` (one error line if it cannot start).
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("weir: error: cannot start the runtime: {e}");
            ExitCode::FAILURE
        })
}

fn run_proxy(args: ProxyArgs) -> ExitCode {
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let quota_token = match &args.quota_token_file {
        None => None,
        Some(f) => match std::fs::read_to_string(f) {
            Ok(t) if !t.trim().is_empty() => Some(t.trim().to_string()),
            Ok(_) => {
                eprintln!("weir: error: --quota-token-file {}: empty", f.display());
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!("weir: error: --quota-token-file {}: {e}", f.display());
                return ExitCode::from(2);
            }
        },
    };
    let settings = proxy::Settings {
        rules: args.rules,
        listen: args.listen,
        upstream: args.upstream,
        admin: args.admin,
        admin_token: args.admin_token.filter(|t| !t.is_empty()),
        upstream_timeout: args.upstream_timeout,
        reload_interval: args.reload_interval,
        limits: args.connections.limits(),
        max_upstream_requests: args.max_upstream_requests,
        max_upstream_per_address: args
            .max_upstream_per_address
            .unwrap_or(args.max_upstream_requests / 4)
            .max(1),
        body_pace: proxy::paced::Pace {
            idle: args.body_idle_timeout,
            min_rate: args.body_min_rate,
        },
        quota_client_id: args.quota_client_id.unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default();
            format!("weir-proxy-{host}-{}", std::process::id())
        }),
        quota_server: args.quota_server,
        quota_token,
        upstream_protocol: args.upstream_protocol,
        drain_timeout: args.drain_timeout,
        clock: args.clock,
        gutter: args.gutter,
        gutter_max_requests: args.gutter_max_requests,
        upstream_breaker: args.upstream_breaker,
    };
    match runtime.block_on(proxy::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, e)) => {
            eprintln!("weir: error: {e}");
            ExitCode::from(code)
        }
    }
}

/// Which format a configuration file is in, told by its top-level keys.
enum Format {
    /// A weir rule file (`resources`, `system`, `http`).
    Rules,
    /// A Lyft rate-limit configuration (`domain`, `descriptors`).
    Lyft,
    /// A quota file (`resources` with `capacity`, `rlqs`).
    Quota,
}

fn detect_format(path: &std::path::Path) -> Result<Format, String> {
    if path.is_dir() {
        return Ok(Format::Lyft);
    }
    // Bounded in size and nesting like every configuration read; only the top-level keys are
    // kept.
    let text = weir_rules::yaml::read(path).map_err(|e| e.to_string())?;
    use serde::de::IgnoredAny;
    let top: std::collections::BTreeMap<String, IgnoredAny> = weir_rules::yaml::parse(path, &text)
        .map_err(|e| {
            format!("{e} (expected a YAML mapping: weir rules, a Lyft config or a quota file)")
        })?;
    let keys: Vec<&str> = top.keys().map(String::as_str).collect();
    let has = |k: &str| keys.contains(&k);
    // A quota file's resources have a capacity; a rule file's never do (only the keys of
    // each resource are read, whatever their values).
    #[derive(serde::Deserialize)]
    struct Probe {
        resources: Vec<std::collections::BTreeMap<String, IgnoredAny>>,
    }
    let quota_resources = has("resources")
        && weir_rules::yaml::parse::<Probe>(path, &text)
            .is_ok_and(|p| p.resources.iter().any(|r| r.contains_key("capacity")));
    if has("rlqs") || (quota_resources && !has("system") && !has("http")) {
        return Ok(Format::Quota);
    }
    match (
        has("resources") || has("system") || has("http"),
        has("domain") || has("descriptors"),
    ) {
        (true, false) => Ok(Format::Rules),
        (false, true) => Ok(Format::Lyft),
        (true, true) => Err(format!(
            "{}: mixes weir rule keys (resources, system, http) with Lyft keys (domain, descriptors)",
            path.display()
        )),
        (false, false) => Err(format!(
            "{}: cannot tell the format: expected top-level `resources`, `system` or `http` (weir rules), `domain` and `descriptors` (Lyft rate-limit config) or `resources` with `capacity` and `rlqs` (quota file); or say it with --kind",
            path.display()
        )),
    }
}

fn run_check_config(args: CheckConfigArgs) -> ExitCode {
    let format = match args.kind.as_deref() {
        Some("rules") => Ok(Format::Rules),
        Some("lyft") => Ok(Format::Lyft),
        Some("quota") => Ok(Format::Quota),
        _ => detect_format(&args.path),
    };
    match format {
        Err(e) => fail(e),
        Ok(Format::Rules) => check_rules(&args.path),
        Ok(Format::Lyft) => check_lyft(&args),
        Ok(Format::Quota) => check_quota(&args.path),
    }
}

/// A quota file: every resource with its settings in force (defaults filled in).
fn check_quota(path: &std::path::Path) -> ExitCode {
    let config = match weir_quota::config::QuotaConfig::load(path) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("weir: error: {e}");
            }
            return ExitCode::from(2);
        }
    };
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "weir quota: {}", path.display());
    let _ = write!(out, "{}", config.describe());
    ExitCode::SUCCESS
}

fn check_rules(path: &std::path::Path) -> ExitCode {
    let set = match weir_rules::watch::load(path) {
        Ok(s) => s,
        Err(weir_rules::watch::LoadError::Invalid(errors)) => {
            // One line per error, each with its location.
            for e in &errors.0 {
                eprintln!("weir: error: {e}");
            }
            return ExitCode::from(2);
        }
        Err(e) => return fail(e),
    };
    // Compiling catches what only the algorithms know (e.g. a window too short).
    if let Err(e) = weir_rules::engine::Rules::new(&set) {
        return fail(format_args!("{}: {e}", path.display()));
    }
    // Breaker rows by resource (one pass: a file may have tens of thousands of resources).
    let mut breakers: std::collections::HashMap<&str, Vec<&weir_rules::describe::RuleRow>> =
        std::collections::HashMap::new();
    let rows = weir_rules::describe::rows(&set);
    for row in rows.iter().filter(|row| row.kind == "breaker") {
        breakers.entry(row.resource.as_str()).or_default().push(row);
    }
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "weir rules: {}", path.display());
    for r in &set.resources {
        let _ = writeln!(out, "resource {}", r.name);
        if let Some(s) = &r.switch {
            let on = if s.on { "on (blocked)" } else { "off" };
            let _ = writeln!(out, "  switch {}: {on} in the file", s.id);
        }
        if let Some(a) = &r.authority {
            let (what, list) = if a.allow.is_empty() {
                ("deny", &a.deny)
            } else {
                ("allow", &a.allow)
            };
            let _ = writeln!(out, "  authority {}: {what} {}", a.id, list.join(", "));
        }
        for h in &r.hot_params {
            let _ = writeln!(
                out,
                "  hot_param {}: params[{}] {} per {} each ({}, at most {} values, on_full {}){}",
                h.id,
                h.param,
                h.threshold,
                duration::format_duration(h.window.unwrap_or(Duration::from_secs(1))),
                h.algorithm.as_str(),
                h.max_values,
                format!("{:?}", h.on_full).to_lowercase(),
                if h.shadow { " [shadow]" } else { "" }
            );
        }
        for f in &r.flow {
            let what = match (f.qps, f.concurrency) {
                (Some(q), _) => format!(
                    "{q} per {} ({}{}{})",
                    duration::format_duration(f.window.unwrap_or(Duration::from_secs(1))),
                    f.behavior.as_str(),
                    f.algorithm
                        .map(|a| format!(", {}", a.as_str()))
                        .unwrap_or_default(),
                    f.max_wait
                        .map(|w| format!(", max_wait {}", duration::format_duration(w)))
                        .unwrap_or_default()
                ),
                (None, Some(c)) => format!("{c} in flight"),
                _ => String::new(),
            };
            let scope = match (&f.origin, &f.relate) {
                (Some(o), _) => format!(" [origin {o}]"),
                (_, Some(r)) => format!(" [when {r} passes this rate]"),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "  flow {}: {what}{scope}{}",
                f.id,
                if f.shadow { " [shadow]" } else { "" }
            );
        }
        // Breakers as in force (the preset's values filled in), as the dashboard shows them.
        for row in breakers.get(r.name.as_str()).into_iter().flatten() {
            let _ = writeln!(
                out,
                "  breaker {}: {}{}",
                row.id,
                row.detail,
                if row.shadow { " [shadow]" } else { "" }
            );
        }
    }
    if let Some(s) = &set.system {
        let mut parts = Vec::new();
        if let Some(n) = s.max_qps {
            parts.push(format!("max_qps {n}/s"));
        }
        if let Some(n) = s.max_in_flight {
            parts.push(format!("max_in_flight {n}"));
        }
        if let Some(d) = s.max_avg_rt {
            parts.push(format!("max_avg_rt {}", duration::format_duration(d)));
        }
        if let Some(c) = s.max_cpu {
            parts.push(format!("max_cpu {c}"));
        }
        if let Some(b) = &s.bbr {
            parts.push(format!(
                "bbr (cpu ≥ {})",
                b.cpu_threshold
                    .unwrap_or(weir_core::adaptive::bbr::BbrConfig::default().cpu_threshold)
            ));
        }
        if let Some(a) = &s.adaptive {
            parts.push(format!("adaptive {:?}", a.algorithm));
        }
        let _ = writeln!(
            out,
            "system (inbound calls): {}{}",
            parts.join(", "),
            if s.shadow { " [shadow]" } else { "" }
        );
    }
    if let Some(h) = &set.http {
        for r in &h.routes {
            let methods = if r.methods.is_empty() {
                "*".to_string()
            } else {
                r.methods.join(",")
            };
            let _ = writeln!(out, "route {methods} {} -> {}", r.prefix, r.resource);
            if let Some(f) = &r.fallback {
                let on = if f.on.is_empty() {
                    "every block".to_string()
                } else {
                    f.on.join(", ")
                };
                let what = match (&f.upstream, &f.body_file, &f.body) {
                    (Some(u), _, _) => format!("forwarded to {u}"),
                    (None, Some(file), _) => format!("{} with the body of {file}", f.status),
                    (None, None, Some(b)) => format!("{} with a {}-byte body", f.status, b.len()),
                    (None, None, None) => format!("{} without a body", f.status),
                };
                let _ = writeln!(out, "  fallback on {on}: {what}");
            }
        }
    }
    ExitCode::SUCCESS
}

fn check_lyft(args: &CheckConfigArgs) -> ExitCode {
    match rls::config::load(&args.path, args.merge_domains) {
        Ok(domains) => {
            let engine = match rls::engine::Engine::build(
                &domains,
                rls::engine::EngineOptions::default(),
                None,
            ) {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("weir: error: {e}");
                    return ExitCode::from(2);
                }
            };
            let mut out = io::stdout().lock();
            for d in &domains {
                let _ = writeln!(out, "domain {}", d.domain);
                for r in engine
                    .rules()
                    .iter()
                    .filter(|r| r.id.starts_with(&format!("{}.", d.domain)))
                {
                    let l = &r.limit;
                    let what = if l.unlimited {
                        "unlimited".to_string()
                    } else if l.denies_all() {
                        format!(
                            "0 per {}: every request over the limit",
                            duration::format_duration(l.window)
                        )
                    } else {
                        format!(
                            "{} per {} ({}{})",
                            l.requests_per_unit,
                            duration::format_duration(l.window),
                            l.algorithm.name(),
                            l.burst.map(|b| format!(", burst {b}")).unwrap_or_default()
                        )
                    };
                    let _ = writeln!(
                        out,
                        "  {}: {what}{}{}{}",
                        r.id,
                        if r.shadow { " [shadow]" } else { "" },
                        if r.quota_mode { " [quota mode]" } else { "" },
                        l.name
                            .as_ref()
                            .map(|n| format!(" name={n}"))
                            .unwrap_or_default()
                    );
                }
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in errors {
                eprintln!("weir: error: {e}");
            }
            ExitCode::from(2)
        }
    }
}

fn run_serve(args: ServeArgs) -> ExitCode {
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    runtime.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> ExitCode {
    use std::sync::Arc;
    if args.instances == 0 {
        eprintln!("weir: error: --instances must be ≥ 1");
        return ExitCode::from(2);
    }
    let store = if args.store == "memory" {
        rls::engine::Store::Memory
    } else if args.store.starts_with("redis://") || args.store.starts_with("redis+cluster://") {
        match weir_redis::RedisLimiter::connect(&args.store, weir_redis::RedisConfig::default())
            .await
        {
            Ok(l) => rls::engine::Store::Redis(l),
            Err(e) => {
                eprintln!("weir: error: --store {}: {e}", args.store);
                return ExitCode::from(2);
            }
        }
    } else {
        eprintln!(
            "weir: error: --store {:?}: expected memory, redis://HOST:PORT[/DB] or redis+cluster://H1:P1,H2:P2",
            args.store
        );
        return ExitCode::from(2);
    };
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .ok();
    if let Some(handle) = prometheus.clone() {
        // install_recorder leaves upkeep to us: without it every histogram sample (one per
        // decision) is kept until the next scrape, so memory grew ≈ 2 MB/s at 150 k
        // decisions/s when nobody scraped /metrics.
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                handle.run_upkeep();
            }
        });
    }
    let options = rls::engine::EngineOptions {
        instances: args.instances,
        shadow: args.shadow,
        clock: args.clock,
        response_metadata: args.response_metadata,
        merge_domains: args.merge_domains,
        ..Default::default()
    };
    let style = match args.response_headers.as_str() {
        "draft03" => rls::engine::HeaderStyle::Draft03,
        "ietf" => rls::engine::HeaderStyle::Ietf,
        _ => rls::engine::HeaderStyle::None,
    };
    let failover = match (&args.quota, &store) {
        (Some(_), rls::engine::Store::Redis(_)) => {
            let advertise = match &args.quota_advertise {
                Some(a) => a.clone(),
                None if args.http_addr.port() != 0 && !args.http_addr.ip().is_unspecified() => {
                    format!("http://{}", args.http_addr)
                }
                None => {
                    return fail(format_args!(
                        "--quota-advertise is needed: --http-addr {} is not an address clients can be sent to",
                        args.http_addr
                    ))
                }
            };
            if args.quota_leader_ttl < Duration::from_millis(250) {
                return fail("--quota-leader-ttl: at least 250ms");
            }
            // The gRPC address is advertised when it is one a client can dial.
            let grpc = (args.grpc_addr.port() != 0 && !args.grpc_addr.ip().is_unspecified())
                .then(|| args.grpc_addr.to_string());
            let grpc = args.quota_advertise_grpc.clone().or(grpc);
            match weir_server::quota_ha::Ha::new(
                &args.store,
                &args.quota_group,
                &advertise,
                grpc.as_deref(),
                args.quota_leader_ttl,
            ) {
                Ok(h) => Some(h),
                Err(e) => return fail(e),
            }
        }
        _ => None,
    };
    let quota = match &args.quota {
        None => None,
        Some(p) => match match failover {
            Some(h) => weir_server::quota_api::QuotaApi::load_with_failover(p.clone(), h),
            None => weir_server::quota_api::QuotaApi::load(p.clone()),
        } {
            Ok(q) => Some(q),
            Err(errors) => {
                for e in errors.lines() {
                    eprintln!("weir: error: {e}");
                }
                return ExitCode::from(2);
            }
        },
    };
    let service = match rls::server::Service::new(args.config.clone(), store, options, prometheus) {
        Ok(s) => {
            let s = s.with_headers(style);
            Arc::new(match &quota {
                Some(q) => {
                    q.watch(std::time::Duration::from_secs(1));
                    weir_server::quota_ha::start(q);
                    s.with_quota(q.clone())
                }
                None => s,
            })
        }
        Err(errors) => {
            for e in errors {
                eprintln!("weir: error: {e}");
            }
            return ExitCode::from(2);
        }
    };
    let grpc = match rls::server::bind(args.grpc_addr, "gRPC").await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("weir: error: {e}");
            return ExitCode::from(2);
        }
    };
    let http = match rls::server::bind(args.http_addr, "HTTP").await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("weir: error: {e}");
            return ExitCode::from(2);
        }
    };
    let (g, h) = (
        grpc.local_addr().map_or(args.grpc_addr, |a| a),
        http.local_addr().map_or(args.http_addr, |a| a),
    );
    service.watch(std::time::Duration::from_secs(1));
    let admin_token = args.admin_token.clone().filter(|t| !t.is_empty());
    if !h.ip().is_loopback() && admin_token.is_none() {
        tracing::warn!(
            "--http-addr {h} is reachable from other hosts and has no --admin-token: anyone who can connect reads the dashboard and /metrics"
        );
    }
    let dashboard = rls::dashboard::dashboard(service.clone());
    dashboard.spawn_sampler();
    let config = args
        .config
        .as_ref()
        .map_or("the bundled example".to_string(), |p| {
            p.display().to_string()
        });
    let domain = service
        .engine()
        .domains()
        .next()
        .unwrap_or("example")
        .to_string();
    println!(
        "weir serve: gRPC RLS v3 on {g}, HTTP on http://{h} (rate-limit config: {config}, store: {}, dashboard: http://{h}/)",
        args.store
    );
    if let Some(q) = &args.quota {
        println!(
            "weir serve: quota {}: lease API on http://{h}/quota/v1/refresh and gRPC weir.quota.v1.QuotaService on {g}{}",
            q.display(),
            if service.quota().is_some_and(|q| q.serves_rlqs()) {
                format!(", Envoy RLQS on {g}")
            } else {
                String::new()
            }
        );
    }
    println!(
        "try: curl -s -XPOST http://{h}/json -d '{{\"domain\":\"{domain}\",\"descriptors\":[{{\"entries\":[{{\"key\":\"remote_address\",\"value\":\"10.0.0.1\"}}]}}]}}'"
    );
    let _ = io::stdout().flush();
    // The accept loops run until a stop signal (accept errors are retried); then both listeners
    // close and the calls in flight finish.
    let (trigger, shutdown) = accept::shutdown();
    let limits = args.connections.limits();
    let bodies = budget::Budget::new(budget::BodyLimits {
        timeout: args.body_timeout,
        total: args.max_buffered_bytes,
        ..budget::BodyLimits::default()
    });
    let servers = async {
        tokio::join!(
            rls::server::serve_grpc(
                service.clone(),
                grpc,
                limits,
                bodies.clone(),
                shutdown.clone()
            ),
            rls::server::serve_http(
                service.clone(),
                http,
                limits,
                bodies,
                rls::server::Admin {
                    dashboard,
                    token: admin_token,
                },
                shutdown
            ),
        );
    };
    accept::run_until_stopped("weir serve", servers, trigger, args.drain_timeout).await;
    if let Some(q) = &quota {
        weir_server::quota_ha::resign(q).await;
    }
    ExitCode::SUCCESS
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("weir: error: {message}");
    ExitCode::from(2)
}

fn run_overload(args: OverloadArgs) -> ExitCode {
    let settings = overload::Settings {
        protection: args.protection,
        load: args.load,
        capacity: args.capacity,
        duration: args.duration,
        seed: args.seed,
        workers: args.workers,
    };
    match overload::run(&settings) {
        Ok(report) => {
            if args.json {
                println!("{}", overload::json(&report));
            } else {
                print!("{}", overload::text(&report));
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn run_quota_sim(args: QuotaSimArgs) -> ExitCode {
    if !(args.capacity.is_finite() && args.capacity > 0.0) {
        return fail(format_args!(
            "--capacity {}: expected units/s > 0",
            args.capacity
        ));
    }
    if args.refresh.is_zero() || args.lease < args.refresh {
        return fail("--lease must be at least --refresh, and --refresh > 0");
    }
    let server_down = match args.server_down.as_deref() {
        None => None,
        Some(s) => {
            let parsed = s.split_once("..").and_then(|(a, b)| {
                Some((
                    duration::parse_duration(a).ok()?,
                    duration::parse_duration(b).ok()?,
                ))
            });
            match parsed {
                Some((a, b)) if a < b => Some((a, b)),
                _ => {
                    return fail(format_args!(
                        "--server-down {s:?}: expected FROM..TO, e.g. 100s..200s"
                    ))
                }
            }
        }
    };
    let scenario = match &args.scenario {
        None => weir_quota::sim::default_scenario(args.clients, args.capacity, args.duration),
        Some(p) => match File::open(p) {
            Ok(f) => match quota::read_scenario(BufReader::new(f), &p.display().to_string()) {
                Ok(s) => s,
                Err(e) => return fail(e),
            },
            Err(e) => return fail(format_args!("{}: {e}", p.display())),
        },
    };
    let settings = weir_quota::sim::Settings {
        resource: weir_quota::ResourceConfig {
            capacity: args.capacity,
            algorithm: args.algorithm,
            lease: args.lease,
            refresh: args.refresh,
            safe_capacity: None,
        },
        client: weir_quota::ClientConfig::default(),
        duration: args.duration,
        server_down,
        seed: args.seed,
    };
    let report = weir_quota::sim::run(&settings, &scenario);
    if args.json {
        println!("{}", quota::sim_json(&report));
    } else {
        print!("{}", quota::sim_text(&report, args.capacity));
    }
    ExitCode::SUCCESS
}

fn run_simulate(args: SimulateArgs) -> ExitCode {
    match args.scenario {
        Some(Scenario::Overload(o)) => return run_overload(o),
        Some(Scenario::Quota(q)) => return run_quota_sim(q),
        None => {}
    }
    let (Some(algorithm), Some(limit), Some(window)) = (args.algorithm, args.limit, args.window)
    else {
        return fail("simulate needs --algorithm, --limit and --window");
    };
    let settings = simulate::Settings {
        algorithm,
        limit,
        window,
        burst: args.burst,
        buckets: args.buckets,
        warmup: args.warmup,
        max_wait: args.max_wait,
    };
    // Settings first (an empty trace runs nothing): a usage error is the only line printed.
    if let Err(e) = simulate::simulate(&settings, &simulate::Trace::default(), &mut io::sink()) {
        return fail(e);
    }
    let trace = match &args.input {
        None => {
            eprintln!("weir: no --input given; using the bundled trace traces/boundary_burst.csv");
            simulate::parse_trace(BUNDLED_TRACE.as_bytes(), "bundled trace")
        }
        Some(p) if p.as_os_str() == "-" => simulate::parse_trace(io::stdin().lock(), "stdin"),
        Some(p) => match File::open(p) {
            Ok(f) => simulate::parse_trace(BufReader::new(f), &p.display().to_string()),
            Err(e) => return fail(format_args!("cannot read {}: {e}", p.display())),
        },
    };
    let trace = match trace {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let stdout = io::stdout();
    let mut out = io::BufWriter::with_capacity(1 << 16, stdout.lock());
    let summary = match simulate::simulate(&settings, &trace, &mut out) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let _ = out.flush();
    drop(out);
    let _ = simulate::write_summary(&settings, &summary, &mut io::stderr().lock());
    ExitCode::SUCCESS
}
