//! `weir proxy`: the reverse proxy wired from the flags — weir-server builds it; this binds
//! its listeners, says where it serves, and drains it on a stop signal.

use std::process::ExitCode;

use weir_server::net::accept;
use weir_server::proxy;

use super::args::*;
use crate::fail;

/// The proxy's settings from its flags (`quota_token`: read from `--quota-token-file`).
fn settings(args: ProxyArgs, quota_token: Option<String>) -> proxy::Settings {
    let defaults = proxy::Settings::new(args.rules, args.listen, args.upstream);
    proxy::Settings {
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
        max_buffered_bytes: args.max_buffered_bytes,
        quota_client_id: args.quota_client_id.unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default();
            format!("weir-proxy-{host}-{}", std::process::id())
        }),
        quota_server: args.quota_server,
        quota_token,
        upstream_protocol: args.upstream_protocol,
        http1: args.http1,
        drain_timeout: args.drain_timeout,
        clock: args.clock,
        gutter: args.gutter,
        gutter_max_requests: args.gutter_max_requests,
        upstream_breaker: args.upstream_breaker,
        store: args.store,
        instances: args.instances,
        workers: args.workers.unwrap_or(defaults.workers),
        ..defaults
    }
}

/// `weir proxy` until a signal stops it: clients are served by its worker threads (a runtime
/// each); this runtime, one thread, keeps the admin listener, reloads and leases.
pub(crate) fn run_proxy(args: ProxyArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("weir: error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
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
    if args.workers == Some(0) {
        eprintln!("weir: error: --workers must be at least 1");
        return ExitCode::from(2);
    }
    if args.instances != 1 && args.store.is_none() {
        eprintln!("weir: error: --instances applies to a shared store (--store redis://…)");
        return ExitCode::from(2);
    }
    let args_otlp = args.otlp.settings("weir-proxy");
    let settings = settings(args, quota_token);
    let otlp = match args_otlp {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    match runtime.block_on(serve(settings, otlp)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ proxy::StartError::Watcher(_)) => {
            eprintln!("weir: error: {e}");
            ExitCode::FAILURE
        }
        Err(e) => fail(e),
    }
}

/// Builds the proxy, opens its listeners, says where it serves, serves, and on a stop signal
/// lets the requests in flight finish (at most `--drain-timeout`) and gives its leases back.
async fn serve(
    s: proxy::Settings,
    otlp: Option<weir_server::otlp::Settings>,
) -> Result<(), proxy::StartError> {
    let (listen, admin_addr, token, drain) =
        (s.listen, s.admin, s.admin_token.is_some(), s.drain_timeout);
    let mut proxy = proxy::Proxy::build(s)?;
    proxy.connect_store().await?;
    let exporter = otlp.map(|o| super::serve::export(proxy.metrics().clone(), o));
    if let Some(t) = exporter.as_ref().and_then(|e| e.tracer()) {
        proxy.trace(t.clone());
    }
    let listener = proxy::bind_shared(listen)
        .map_err(|e| proxy::StartError::Setting(format!("cannot listen on {listen}: {e}")))?;
    if let Some(addr) = admin_addr.filter(|a| !a.ip().is_loopback() && !token) {
        tracing::warn!(
            "--admin {addr} is reachable from other hosts and has no --admin-token: anyone who can connect reads the dashboard and /metrics"
        );
    }
    let admin = match admin_addr {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            proxy::StartError::Setting(format!("cannot listen for --admin on {addr}: {e}"))
        })?),
        None => None,
    };
    let local = listener.local_addr().map_or(listen, |a| a);
    println!(
        "weir proxy: http://{local} -> {}{} (rules: {}{})",
        proxy.upstream(),
        proxy
            .gutter()
            .map(|g| format!(", gutter {g}"))
            .unwrap_or_default(),
        proxy.rules_file().display(),
        admin
            .as_ref()
            .and_then(|a| a.local_addr().ok())
            .map(|a| format!(", dashboard: http://{a}/, metrics: http://{a}/metrics"))
            .unwrap_or_default()
    );
    let (trigger, shutdown) = accept::shutdown();
    let serving = proxy.serve(listener, admin, shutdown);
    accept::run_until_stopped("weir proxy", serving, trigger, drain).await;
    proxy.release_leases().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The library's defaults are the flags' defaults: an embedder of `Settings::new` gets
    /// the proxy `weir proxy` runs with no flags.
    #[test]
    fn settings_new_has_the_flags_defaults() {
        let cli = Cli::try_parse_from([
            "weir",
            "proxy",
            "--rules",
            "r.yaml",
            "--upstream",
            "http://127.0.0.1:9",
        ])
        .unwrap();
        let Command::Proxy(args) = cli.command else {
            panic!("not the proxy command");
        };
        let listen = args.listen;
        let flags = settings(*args, None);
        let new = proxy::Settings::new("r.yaml", listen, "http://127.0.0.1:9");
        assert_eq!(flags.upstream_timeout, new.upstream_timeout);
        assert_eq!(flags.reload_interval, new.reload_interval);
        assert_eq!(flags.limits.max_connections, new.limits.max_connections);
        assert_eq!(
            flags.limits.timeouts.first_request,
            new.limits.timeouts.first_request
        );
        assert_eq!(flags.limits.timeouts.idle, new.limits.timeouts.idle);
        assert_eq!(flags.max_upstream_requests, new.max_upstream_requests);
        assert_eq!(flags.max_upstream_per_address, new.max_upstream_per_address);
        assert_eq!(flags.body_pace.idle, new.body_pace.idle);
        assert_eq!(flags.body_pace.min_rate, new.body_pace.min_rate);
        assert_eq!(flags.max_buffered_bytes, new.max_buffered_bytes);
        assert_eq!(flags.upstream_protocol, new.upstream_protocol);
        assert_eq!(flags.http1, new.http1);
        assert_eq!(flags.drain_timeout, new.drain_timeout);
        assert_eq!(flags.clock, new.clock);
        assert_eq!(flags.gutter_max_requests, new.gutter_max_requests);
        assert_eq!(
            format!("{:?}", flags.upstream_breaker),
            format!("{:?}", new.upstream_breaker)
        );
        assert_eq!(flags.instances, new.instances);
        assert_eq!(flags.workers, new.workers);
        assert!(flags.admin.is_none() && flags.store.is_none() && flags.gutter.is_none());
    }
}
