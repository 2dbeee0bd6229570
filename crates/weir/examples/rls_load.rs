//! Direct gRPC load on `weir serve`: C concurrent callers over K HTTP/2 connections for a
//! duration, closed loop. Prints one JSON line: decisions/s, p50/p99 µs, OVER_LIMIT share.
//!
//! `cargo run --release -p weir --example rls_load -- ADDR DOMAIN KEY CONCURRENCY MILLIS [--random-values]`
//! With `--random-values` every request carries a fresh random value (a stream of new
//! counters: the memory of the server must stay flat).

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

const CONNECTIONS: usize = 4;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5 {
        eprintln!("usage: rls_load ADDR DOMAIN KEY CONCURRENCY MILLIS [--random-values]");
        std::process::exit(2);
    }
    let threads = std::env::var("WEIR_LOAD_THREADS").map_or(1, |t| t.parse().expect("threads"));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(args));
}

async fn run(args: Vec<String>) {
    let (addr, domain, key) = (args[0].clone(), args[1].clone(), args[2].clone());
    let concurrency: usize = args[3].parse().expect("CONCURRENCY");
    let run = Duration::from_millis(args[4].parse().expect("MILLIS"));
    let random = args.iter().any(|a| a == "--random-values");
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("address")
            .connect()
            .await
            .expect("connect");
        clients.push(RateLimitServiceClient::new(endpoint));
    }
    let deadline = Instant::now() + run;
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let mut client = clients[t % CONNECTIONS].clone();
            let (domain, key) = (domain.clone(), key.clone());
            tokio::spawn(async move {
                let mut lat: Vec<u32> = Vec::new();
                let mut over = 0u64;
                let mut x = t as u64 * 0x9E37_79B9_7F4A_7C15 + 1;
                while Instant::now() < deadline && lat.len() < 10_000_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let value = if random {
                        format!("v{x:x}")
                    } else {
                        "bench".to_string()
                    };
                    let req = RateLimitRequest {
                        domain: domain.clone(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: key.clone(),
                                value,
                            }],
                            ..Default::default()
                        }],
                        hits_addend: 1,
                    };
                    let start = Instant::now();
                    let r = client.should_rate_limit(req).await.expect("call");
                    lat.push(start.elapsed().as_micros() as u32);
                    over += u64::from(r.into_inner().overall_code == 2);
                }
                (lat, over)
            })
        })
        .collect();
    let started = Instant::now();
    let (mut all, mut over) = (Vec::new(), 0);
    for t in tasks {
        let (l, o) = t.await.expect("task");
        all.extend(l);
        over += o;
    }
    let secs = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
    println!(
        "{{\"ops_per_s\": {:.0}, \"p50_us\": {}, \"p99_us\": {}, \"over_limit_share\": {:.4}, \"calls\": {}}}",
        all.len() as f64 / secs,
        pct(0.5),
        pct(0.99),
        over as f64 / all.len().max(1) as f64,
        all.len()
    );
}
