//! `weir serve`: the rate-limit service, the lease server and RLQS, wired from the flags.

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use weir_server::net::{accept, budget};
use weir_server::rls;

use super::args::*;
use crate::{fail, runtime};

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
    use std::sync::Arc;
    if args.instances == 0 {
        eprintln!("weir: error: --instances must be ≥ 1");
        return ExitCode::from(2);
    }
    const KEYS: usize = 100_000;
    let on_redis = args.store.starts_with("redis://") || args.store.starts_with("redis+cluster://");
    let store: Arc<dyn rls::Store> = if args.store == "memory" {
        // One process owns the memory store: there is no share to divide.
        if args.instances != 1 {
            return fail("--instances applies to a shared store (--store redis://…): a memory store is this process's alone");
        }
        Arc::new(rls::MemoryStore::new(KEYS, args.clock))
    } else if on_redis {
        match weir_redis::RedisLimiter::connect(&args.store, weir_redis::RedisConfig::default())
            .await
        {
            Ok(l) => Arc::new(rls::RedisStore::new(l, args.instances, KEYS, args.clock)),
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
    let metrics = Arc::new(weir_server::admin::metrics::Metrics::new());
    let options = rls::engine::EngineOptions {
        shadow: args.shadow,
        clock: args.clock,
        response_metadata: args.response_metadata,
        merge_domains: args.merge_domains,
    };
    let style = match args.response_headers.as_str() {
        "draft03" => rls::engine::HeaderStyle::Draft03,
        "ietf" => rls::engine::HeaderStyle::Ietf,
        _ => rls::engine::HeaderStyle::None,
    };
    let failover = match &args.quota {
        Some(_) if on_redis => {
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
            match weir_server::quota::ha::Ha::new(
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
            Some(h) => weir_server::quota::api::QuotaApi::load_with_failover(p.clone(), h),
            None => weir_server::quota::api::QuotaApi::load(p.clone()),
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
    let service = match rls::server::Service::new(args.config.clone(), store, options, metrics) {
        Ok(s) => {
            let s = s.with_headers(style);
            match &quota {
                Some(q) => {
                    q.watch(std::time::Duration::from_secs(1));
                    q.start_failover();
                    s.with_quota(q.clone())
                }
                None => s,
            }
            .start()
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
    service
        .metrics()
        .register(rls::metrics::BufferedBodies(bodies.clone()));
    let servers = async {
        tokio::join!(
            weir_server::grpc::router::serve_grpc(
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
        q.resign().await;
    }
    ExitCode::SUCCESS
}
