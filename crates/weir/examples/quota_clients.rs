//! Lease clients under load: the admitted rate of a cluster-quota resource, second by second.
//!
//! `cargo run --release -p weir --example quota_clients -- SERVERS RESOURCE CLIENTS DEMAND SECONDS [SAFE]`
//!
//! Runs CLIENTS lease clients (weir-quota's `LeaseClient`, ids `load-0` … `load-N`) against
//! SERVERS (`http://HOST:PORT`, several comma-separated when servers fail over through Redis),
//! each offering DEMAND units/s of RESOURCE for SECONDS seconds, enforcing its lease locally
//! (SAFE units/s, default 1, until the first lease arrives). Every second it prints one JSON
//! line: `{"t": seconds since start, "rate": admitted units/s over the second, "granted":
//! clients running on a lease, "safe": clients on their safe capacity, "rates": [each
//! client's rate in force]}`. At the end the clients give their leases back.

use std::time::{Duration, Instant};

use weir_quota::net::LeaseClient;
use weir_quota::Source;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !(6..=7).contains(&args.len()) {
        eprintln!("usage: quota_clients SERVERS RESOURCE CLIENTS DEMAND SECONDS [SAFE]");
        std::process::exit(2);
    }
    let num = |i: usize| -> f64 {
        args[i].parse().unwrap_or_else(|_| {
            eprintln!("quota_clients: {:?} is not a number", args[i]);
            std::process::exit(2)
        })
    };
    let (servers, resource) = (&args[1], &args[2]);
    let (clients, demand, seconds) = (num(3) as usize, num(4), num(5));
    let safe = if args.len() == 7 { num(6) } else { 1.0 };
    let leases: Vec<LeaseClient> = (0..clients)
        .map(|i| {
            LeaseClient::builder(servers, &format!("load-{i}"))
                .resource(resource, safe)
                .start()
                .unwrap_or_else(|e| {
                    eprintln!("quota_clients: {e}");
                    std::process::exit(2)
                })
        })
        .collect();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut offered = vec![0u64; clients];
    let mut admitted = 0u64;
    let mut second_start = start;
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    while Instant::now() < end {
        tick.tick().await;
        let now = Instant::now();
        // Each client offers its demand evenly: as many units as are due by now.
        let due = (demand * now.duration_since(start).as_secs_f64()) as u64;
        for (c, sent) in leases.iter().zip(offered.iter_mut()) {
            while *sent < due {
                *sent += 1;
                if c.acquire(resource, 1).is_some_and(|d| d.allowed()) {
                    admitted += 1;
                }
            }
        }
        let elapsed = now.duration_since(second_start);
        if elapsed >= Duration::from_secs(1) {
            let states: Vec<(f64, Source)> = leases
                .iter()
                .filter_map(|c| c.resource(resource).map(|r| r.rate()))
                .collect();
            let granted = states.iter().filter(|s| s.1 == Source::Granted).count();
            let rates: Vec<String> = states.iter().map(|s| format!("{:.1}", s.0)).collect();
            println!(
                "{{\"t\":{:.3},\"rate\":{:.1},\"granted\":{},\"safe\":{},\"rates\":[{}]}}",
                now.duration_since(start).as_secs_f64(),
                admitted as f64 / elapsed.as_secs_f64(),
                granted,
                states.len() - granted,
                rates.join(",")
            );
            admitted = 0;
            second_start = now;
        }
    }
    for c in leases {
        c.shutdown().await;
    }
}
