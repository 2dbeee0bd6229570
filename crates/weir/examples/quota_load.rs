//! A load generator for the cluster-quota lease API of `weir serve --quota`.
//!
//! `cargo run --release -p weir --example quota_load -- ADDR CONNECTIONS RESOURCES CLIENTS MILLIS [SPREAD]`
//!
//! CONNECTIONS keep-alive HTTP/1.1 connections each send refresh calls back to back for MILLIS
//! ms; a call refreshes RESOURCES resources (`r0` … `rN`, which the quota file must cover,
//! e.g. a template `r*`; with SPREAD, client `c` leases `r((c + k) mod SPREAD)` instead, so
//! CLIENTS clients spread over SPREAD resources) as one of CLIENTS client ids (round robin), each asking a random
//! demand and presenting the lease id it holds (as a real client does). Prints one JSON line: calls/s, resource-refreshes/s, p50/p99/max latency in µs,
//! failed calls. A call fails unless it answers 200 with one lease per resource.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 6 && args.len() != 7 {
        eprintln!("usage: quota_load ADDR CONNECTIONS RESOURCES CLIENTS MILLIS [SPREAD]");
        std::process::exit(2);
    }
    let addr = args[1].clone();
    let num = |i: usize| -> u64 {
        args[i].parse().unwrap_or_else(|_| {
            eprintln!("quota_load: {:?} is not a number", args[i]);
            std::process::exit(2)
        })
    };
    let (conns, resources, clients, millis) = (num(2), num(3), num(4).max(1), num(5));
    let spread = if args.len() == 7 {
        Some(num(6).max(1))
    } else {
        None
    };
    let deadline = Instant::now() + Duration::from_millis(millis);
    let mut tasks = Vec::new();
    for c in 0..conns {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            stream.set_nodelay(true).ok();
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("handshake");
            tokio::spawn(conn);
            let mut latencies = Vec::new();
            let mut failed = 0u64;
            // The lease ids this connection's clients hold: (client, resource) → id.
            let mut ids: std::collections::HashMap<(u64, u64), String> =
                std::collections::HashMap::new();
            let mut n = c;
            let mut seed = c.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            while Instant::now() < deadline {
                let client = n % clients;
                n += conns;
                let mut body = format!(r#"{{"client":"c{client}","resources":["#);
                for r in 0..resources {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let wants = (seed % 200) as f64;
                    if r > 0 {
                        body.push(',');
                    }
                    let name = spread.map_or(r, |n| (client + r) % n);
                    match ids.get(&(client, r)) {
                        Some(id) => body.push_str(&format!(
                            r#"{{"resource":"r{name}","wants":{wants},"leaseId":"{id}"}}"#
                        )),
                        None => {
                            body.push_str(&format!(r#"{{"resource":"r{name}","wants":{wants}}}"#))
                        }
                    }
                }
                body.push_str("]}");
                let req = http::Request::post("/quota/v1/refresh")
                    .header("host", "quota")
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))
                    .expect("request");
                let t = Instant::now();
                let ok = match send.send_request(req).await {
                    Ok(r) if r.status() == 200 => match r.into_body().collect().await {
                        Ok(b) => {
                            let b = b.to_bytes();
                            let text = String::from_utf8_lossy(&b);
                            let leases = text.matches("\"granted\"").count();
                            for (r, part) in text.split("\"leaseId\":\"").skip(1).enumerate() {
                                ids.insert((client, r as u64), part[..16].to_string());
                            }
                            leases as u64 == resources
                        }
                        Err(_) => false,
                    },
                    _ => false,
                };
                latencies.push(t.elapsed().as_micros() as u64);
                failed += u64::from(!ok);
                if !ok && send.ready().await.is_err() {
                    break;
                }
            }
            (latencies, failed)
        }));
    }
    let started = Instant::now();
    let mut all = Vec::new();
    let mut failed = 0;
    for t in tasks {
        let (l, f) = t.await.expect("task");
        all.extend(l);
        failed += f;
    }
    let secs = started.elapsed().as_secs_f64().max(millis as f64 / 1000.0);
    all.sort_unstable();
    let q = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "{{\"calls_per_s\": {:.0}, \"resource_refreshes_per_s\": {:.0}, \"p50_us\": {}, \"p99_us\": {}, \"max_us\": {}, \"calls\": {}, \"failed\": {}}}",
        all.len() as f64 / secs,
        all.len() as f64 * resources as f64 / secs,
        q(0.5),
        q(0.99),
        all.last().copied().unwrap_or(0),
        all.len(),
        failed
    );
}
