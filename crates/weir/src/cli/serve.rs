//! `weir serve`: the rate-limit service, the lease server and RLQS, wired from the flags
//! through weir-server's builders.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use weir_server::net::{accept, budget};
use weir_server::quota::api::{OpenError, QuotaApi};
use weir_server::rls;
use weir_server::serve::Server;

use super::args::*;
use crate::{fail, runtime};

/// Counters kept per limit in memory (and per limit's local fallback on Redis).
const KEYS: usize = 100_000;

/// How often the configuration and quota files are checked for changes.
const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// `weir serve` on a multi-threaded runtime until a signal stops it.
pub(crate) fn run_serve(args: ServeArgs) -> ExitCode {
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    runtime.block_on(serve(args))
}

/// Loads the configuration, opens the listeners and runs every server the flags ask for.
async fn serve(args: ServeArgs) -> ExitCode {
    let otlp = match args.otlp.settings("weir-serve") {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let store = match store(&args).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let quota = match &args.quota {
        None if args.parent.is_some() => return fail("--parent needs --quota"),
        None => None,
        Some(path) => match lease_server(&args, path.clone()) {
            Ok(q) => Some(q),
            Err(code) => return code,
        },
    };
    let mut builder = builder(&args, store);
    let xds = match &args.xds_server {
        Some(server) => match xds_settings(&args, server) {
            Ok(s) => {
                builder = builder.pushed();
                Some(s)
            }
            Err(e) => return fail(e),
        },
        None => None,
    };
    if let Some(path) = &args.config {
        builder = builder.config_file(path.clone());
    }
    if let Some(q) = &quota {
        builder = builder.quota(q.clone());
    }
    let mut server = match builder.build() {
        Ok(s) => s,
        Err(errors) => {
            for e in errors.to_string().lines() {
                eprintln!("weir: error: {e}");
            }
            return ExitCode::from(2);
        }
    };
    match grpc_tls(&args) {
        Ok(Some(tls)) => server.grpc_tls(tls),
        Ok(None) => {}
        Err(e) => return fail(e),
    }
    server.service().watch(RELOAD_INTERVAL);
    let _xds = xds.map(|s| {
        tracing::info!(server = %s.server, node = %s.node_id, "configuration over xDS");
        weir_server::xds::XdsClient::spawn(server.service().clone(), s)
    });
    let exporter = otlp.map(|s| export(server.metrics().clone(), s));
    if let Some(t) = exporter.as_ref().and_then(|e| e.tracer()) {
        server.trace(t.clone());
    }
    let (grpc, http, metrics) = match listeners(&args).await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let (g, h) = (
        grpc.local_addr().map_or(args.grpc_addr, |a| a),
        http.local_addr().map_or(args.http_addr, |a| a),
    );
    let admin_token = args.admin_token.clone().filter(|t| !t.is_empty());
    if !h.ip().is_loopback() && admin_token.is_none() {
        tracing::warn!(
            "--http-addr {h} is reachable from other hosts and has no --admin-token: anyone who can connect reads the dashboard and /metrics"
        );
    }
    announce(&args, &server, g, h);
    // The accept loops run until a stop signal (accept errors are retried); then both listeners
    // close and the calls in flight finish.
    let (trigger, shutdown) = accept::shutdown();
    let stopped = |mut s: accept::Shutdown| async move { s.stopping().await };
    let servers = async {
        let second = async {
            if let Some(l) = metrics {
                let token = admin_token.clone();
                server.serve_http(l, token, stopped(shutdown.clone())).await;
            }
        };
        tokio::join!(
            server.serve_grpc(grpc, stopped(shutdown.clone())),
            server.serve_http(http, admin_token.clone(), stopped(shutdown.clone())),
            second,
        );
    };
    accept::run_until_stopped("weir serve", servers, trigger, args.drain_timeout).await;
    if let Some(q) = &quota {
        q.resign().await;
    }
    ExitCode::SUCCESS
}

/// The server's builder with the flags' engine options, headers and bounds.
fn builder(args: &ServeArgs, store: Arc<dyn rls::Store>) -> weir_server::serve::Builder {
    Server::builder()
        .store_shared(store)
        .options(rls::EngineOptions {
            shadow: args.shadow,
            clock: args.clock,
            response_metadata: args.response_metadata,
            merge_domains: args.merge_domains,
        })
        .headers(match args.response_headers.as_str() {
            "draft03" => rls::HeaderStyle::Draft03,
            "ietf" => rls::HeaderStyle::Ietf,
            _ => rls::HeaderStyle::None,
        })
        .limits(args.connections.limits())
        .bodies(budget::BodyLimits {
            timeout: args.body_timeout,
            total: args.max_buffered_bytes,
            ..budget::BodyLimits::default()
        })
}

/// The gRPC listener's TLS from the flags, watched for renewals (none without
/// `--grpc-tls-cert`).
fn grpc_tls(
    args: &ServeArgs,
) -> Result<Option<Arc<weir_server::net::tls::ServerTls>>, weir_server::net::tls::TlsError> {
    let Some(cert) = &args.grpc_tls_cert else {
        return Ok(None);
    };
    let files = weir_server::net::tls::TlsFiles {
        cert: cert.clone(),
        key: args.grpc_tls_key.clone().unwrap_or_default(),
        client_ca: args.grpc_tls_client_ca.clone(),
    };
    let tls = weir_server::net::tls::ServerTls::load(files)?;
    tls.watch(RELOAD_INTERVAL);
    Ok(Some(tls))
}

/// The gRPC, HTTP and (with `--metrics-addr`) metrics listeners, or why one cannot be opened.
async fn listeners(
    args: &ServeArgs,
) -> Result<(TcpListener, TcpListener, Option<TcpListener>), String> {
    let grpc = bind(args.grpc_addr, "gRPC", "--grpc-addr").await?;
    let http = bind(args.http_addr, "HTTP", "--http-addr").await?;
    let metrics = match args.metrics_addr {
        Some(a) => Some(bind(a, "metrics", "--metrics-addr").await?),
        None => None,
    };
    Ok((grpc, http, metrics))
}

/// The xDS client's settings from the flags.
fn xds_settings(
    args: &ServeArgs,
    server: &str,
) -> Result<weir_server::xds::Settings, weir_server::xds::XdsError> {
    let mut s = weir_server::xds::Settings::new(server, &args.xds_node_id)?;
    s.merge_domains = args.merge_domains;
    if let Some(ca) = &args.xds_tls_ca {
        s = s.with_tls(weir_server::xds::ClientTls {
            ca: ca.clone(),
            identity: args.xds_tls_cert.clone().zip(args.xds_tls_key.clone()),
            server_name: args.xds_tls_server_name.clone(),
        });
    }
    s.check()?;
    Ok(s)
}

/// The counters' store `--store` names; `--instances` divides only a shared one.
async fn store(args: &ServeArgs) -> Result<Arc<dyn rls::Store>, ExitCode> {
    if args.instances == 0 {
        return Err(fail("--instances must be ≥ 1"));
    }
    if args.store == "memory" {
        // One process owns the memory store: there is no share to divide.
        if args.instances != 1 {
            return Err(fail("--instances applies to a shared store (--store redis://…): a memory store is this process's alone"));
        }
        return Ok(Arc::new(rls::MemoryStore::new(KEYS, args.clock)));
    }
    if !on_redis(args) {
        return Err(fail(format_args!(
            "--store {:?}: expected memory, redis://HOST:PORT[/DB] or redis+cluster://H1:P1,H2:P2",
            args.store
        )));
    }
    match weir_redis::RedisLimiter::connect(&args.store, weir_redis::RedisConfig::default()).await {
        Ok(l) => Ok(Arc::new(rls::RedisStore::new(
            l,
            args.instances,
            KEYS,
            args.clock,
        ))),
        Err(e) => Err(fail(format_args!("--store {}: {e}", args.store))),
    }
}

fn on_redis(args: &ServeArgs) -> bool {
    args.store.starts_with("redis://") || args.store.starts_with("redis+cluster://")
}

/// A lease server's client id at its parent unless `--parent-client-id` says. A failover
/// group (on Redis) shares one, `weir-serve-ADDR`, so a standby elected leader takes over the
/// group's lease; a lone server's is unique per host, `weir-serve-HOSTNAME-ADDR`, stable across
/// restarts, so two hosts binding the same `--http-addr` (0.0.0.0:8080) are two clients, not
/// one whose leases alternate.
fn default_parent_client_id(http_addr: std::net::SocketAddr, group: bool) -> String {
    if group {
        return format!("weir-serve-{http_addr}");
    }
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into());
    format!("weir-serve-{host}-{http_addr}")
}

/// The lease server of `--quota`, watched, failing over through the Redis store when there is
/// one.
fn lease_server(args: &ServeArgs, path: std::path::PathBuf) -> Result<Arc<QuotaApi>, ExitCode> {
    let mut builder = QuotaApi::builder(path).watch(RELOAD_INTERVAL);
    if on_redis(args) {
        builder = builder.failover(failover(args)?);
    }
    if let Some(endpoint) = &args.parent {
        if endpoint.split(',').any(|url| {
            url.trim()
                .parse::<http::Uri>()
                .is_ok_and(|uri| weir_server::net::points_at(&uri, args.http_addr))
        }) {
            return Err(fail(format_args!(
                "--parent {endpoint} is this server's own --http-addr: it would lease from itself and grant nothing"
            )));
        }
        let token = match &args.parent_token_file {
            None => None,
            Some(f) => match std::fs::read_to_string(f) {
                Ok(t) if !t.trim().is_empty() => Some(t.trim().to_string()),
                Ok(_) => {
                    return Err(fail(format_args!(
                        "--parent-token-file {}: empty",
                        f.display()
                    )))
                }
                Err(e) => {
                    return Err(fail(format_args!(
                        "--parent-token-file {}: {e}",
                        f.display()
                    )))
                }
            },
        };
        builder = builder.parent(weir_server::quota::api::Parent {
            endpoint: endpoint.clone(),
            client_id: args
                .parent_client_id
                .clone()
                .unwrap_or_else(|| default_parent_client_id(args.http_addr, on_redis(args))),
            token,
        });
    } else if args.parent_client_id.is_some() || args.parent_token_file.is_some() {
        return Err(fail(
            "--parent-client-id and --parent-token-file need --parent",
        ));
    }
    builder.build().map_err(|e| match e {
        OpenError::Parent(e) => fail(format_args!("--parent: {e}")),
        OpenError::Config(errors) => {
            for e in errors.to_string().lines() {
                eprintln!("weir: error: {e}");
            }
            ExitCode::from(2)
        }
    })
}

/// Binds `addr` for the `what` listener, naming it and, when another server has the port,
/// the flag that moves this one.
async fn bind(addr: SocketAddr, what: &str, flag: &str) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::AddrInUse {
            format!(" (another server has it: choose another port with {flag})")
        } else {
            String::new()
        };
        format!("cannot listen for {what} on {addr}: {e}{hint}")
    })
}

/// Failover through the Redis store: the addresses this server advertises to clients when
/// it leads.
fn failover(args: &ServeArgs) -> Result<weir_server::quota::ha::Ha, ExitCode> {
    let advertise = match &args.quota_advertise {
        Some(a) => a.clone(),
        None if args.http_addr.port() != 0 && !args.http_addr.ip().is_unspecified() => {
            format!("http://{}", args.http_addr)
        }
        None => {
            return Err(fail(format_args!(
            "--quota-advertise is needed: --http-addr {} is not an address clients can be sent to",
            args.http_addr
        )))
        }
    };
    if args.quota_leader_ttl < Duration::from_millis(250) {
        return Err(fail("--quota-leader-ttl: at least 250ms"));
    }
    // The gRPC address is advertised when it is one a client can dial.
    let grpc = (args.grpc_addr.port() != 0 && !args.grpc_addr.ip().is_unspecified())
        .then(|| args.grpc_addr.to_string());
    let grpc = args.quota_advertise_grpc.clone().or(grpc);
    weir_server::quota::ha::Ha::new(
        &args.store,
        &args.quota_group,
        &advertise,
        grpc.as_deref(),
        args.quota_leader_ttl,
    )
    .map_err(fail)
}

/// The lines that say where everything is served.
fn announce(args: &ServeArgs, server: &Server, g: SocketAddr, h: SocketAddr) {
    let service = server.service();
    let config = match (&args.config, &args.xds_server) {
        (Some(p), _) => p.display().to_string(),
        (None, Some(x)) => format!("xDS from {x} as node {}", args.xds_node_id),
        (None, None) => "the bundled example".to_string(),
    };
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
            "weir serve: quota {}: lease API on http://{h}/quota/v1/refresh and gRPC weir.quota.v1.QuotaService on {g}{}{}",
            q.display(),
            if server.quota().is_some_and(|q| q.serves_rlqs()) {
                format!(", Envoy RLQS on {g}")
            } else {
                String::new()
            },
            match &args.parent {
                Some(p) => format!(", leasing from the parent {p}"),
                None => String::new(),
            }
        );
        // A lease server's first call: a lease, not the bundled Lyft example's decision.
        println!(
            "try: curl -s -XPOST http://{h}/quota/v1/refresh -d '{{\"client\":\"me\",\"resources\":[{{\"resource\":\"NAME\",\"wants\":10}}]}}'   (send the answer's leaseId back with the next refresh)"
        );
    } else {
        println!(
            "try: curl -s -XPOST http://{h}/json -d '{{\"domain\":\"{domain}\",\"descriptors\":[{{\"entries\":[{{\"key\":\"remote_address\",\"value\":\"10.0.0.1\"}}]}}]}}'"
        );
    }
    let _ = io::stdout().flush();
}

/// Starts the OTLP export of `metrics`, saying where to.
pub(crate) fn export(
    metrics: std::sync::Arc<weir_server::admin::metrics::Metrics>,
    s: weir_server::otlp::Settings,
) -> weir_server::otlp::Exporter {
    tracing::info!(
        collector = %s.target,
        protocol = ?s.protocol,
        interval = ?s.interval,
        service = %s.service_name,
        "exporting metrics over OTLP"
    );
    if let (Some(sampling), Some(to)) = (s.sampling, &s.traces_target) {
        tracing::info!(
            collector = %to,
            ratio = sampling.ratio,
            parent_based = sampling.parent_based,
            refusals = sampling.refusals,
            "exporting decision spans over OTLP"
        );
    }
    weir_server::otlp::spawn(metrics, s)
}
