//! A real axum service doing CPU work (≈ 2 ms of computation per request on a blocking pool of
//! 2 threads, as a Rust service does CPU work), its capacity measured first, then driven
//! open-loop at 3 × that capacity for 1.5 s, with BBR (real container-aware CPU sampler) and
//! without. With BBR the admitted requests' latency stays bounded and the process keeps
//! answering (a health probe during the overload); without, the queue grows for the whole
//! overload. Bounded: at most 4 000 requests per run, each with a 20 s timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use weir_core::adaptive::bbr::{Bbr, BbrConfig};
use weir_core::adaptive::cpu::CpuSampler;
use weir_tower::shed::BbrLayer;

const RUN: Duration = Duration::from_millis(1_500);
const MAX_REQUESTS: u64 = 4_000;

/// A fixed amount of computation (not a wall-clock spin: under contention it takes longer).
fn compute(iterations: u64) -> u64 {
    let mut x = 0u64;
    for _ in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
    x
}

/// Iterations that take ≈ 2 ms on an idle core.
fn calibrate() -> u64 {
    let start = Instant::now();
    compute(1_000_000);
    let per_ms = 1_000_000.0 / start.elapsed().as_secs_f64() / 1_000.0;
    (per_ms * 2.0) as u64
}

/// Starts the app on its own one-worker runtime; answers its port.
fn serve(with_bbr: bool, iterations: u64) -> u16 {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut app = Router::new()
                .route(
                    "/work",
                    get(move || async move {
                        let x = tokio::task::spawn_blocking(move || compute(iterations)).await;
                        format!("{}", x.unwrap_or(0) & 1)
                    }),
                )
                .route("/health", get(|| async { "ok" }));
            // Kept alive for the server's life: the sampler stops when dropped.
            let sampler = Arc::new(CpuSampler::start(Duration::from_millis(100)));
            if with_bbr {
                let bbr = Bbr::new(BbrConfig::default(), sampler.clone()).unwrap();
                app = app.layer(BbrLayer::new(Arc::new(bbr)));
            }
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap().port()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

/// One request on a fresh connection: (status, latency).
async fn get_once(port: u16, path: &str) -> Option<(u16, Duration)> {
    let start = Instant::now();
    let work = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf);
        text.get(9..12)?.parse::<u16>().ok()
    };
    let status = tokio::time::timeout(Duration::from_secs(20), work)
        .await
        .ok()??;
    Some((status, start.elapsed()))
}

struct Run {
    ok: Vec<Duration>,
    shed: usize,
    failed: usize,
    health: Duration,
}

/// Requests per second the service completes with 8 closed-loop clients for 1 s.
async fn capacity(port: u16) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(1);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline && n < 10_000 {
                    if get_once(port, "/work").await.is_some() {
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

async fn drive(port: u16, rate: u64) -> Run {
    // Warm up: a few sequential requests so BBR has statistics.
    for _ in 0..20 {
        get_once(port, "/work").await;
    }
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = ((rate as u128 * RUN.as_millis() / 1_000) as u64).min(MAX_REQUESTS) as usize;
    let mut tasks = Vec::with_capacity(total);
    let mut health = None;
    for i in 0..total {
        tick.tick().await;
        tasks.push(tokio::spawn(get_once(port, "/work")));
        if i == total * 2 / 3 {
            health = Some(tokio::spawn(get_once(port, "/health")));
        }
    }
    let health = health
        .unwrap()
        .await
        .unwrap()
        .map_or(Duration::MAX, |(_, d)| d);
    let mut run = Run {
        ok: Vec::new(),
        shed: 0,
        failed: 0,
        health,
    };
    for t in tasks {
        match t.await.unwrap() {
            Some((200, d)) => run.ok.push(d),
            Some((503, _)) => run.shed += 1,
            _ => run.failed += 1,
        }
    }
    run.ok.sort_unstable();
    run
}

fn p99(v: &[Duration]) -> Duration {
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn bbr_keeps_latency_bounded_under_three_times_capacity() {
    let iterations = calibrate();
    let without_port = serve(false, iterations);
    let cap = capacity(without_port).await;
    eprintln!(
        "{iterations} iterations per request, capacity {cap} req/s; driving at {}",
        3 * cap
    );
    let with = drive(serve(true, iterations), 3 * cap).await;
    let without = drive(without_port, 3 * cap).await;
    eprintln!(
        "with BBR: {} ok (p99 {:?}), {} shed, {} failed, health {:?}",
        with.ok.len(),
        p99(&with.ok),
        with.shed,
        with.failed,
        with.health
    );
    eprintln!(
        "without: {} ok (p99 {:?}), {} shed, {} failed, health {:?}",
        without.ok.len(),
        p99(&without.ok),
        without.shed,
        without.failed,
        without.health
    );
    assert!(with.shed > 0, "BBR shed nothing at 3 × capacity");
    assert_eq!(without.shed, 0);
    assert!(
        with.ok.len() > 200,
        "BBR still serves: {} ok",
        with.ok.len()
    );
    // Bounded latency with BBR; a queue growing for the whole overload without.
    // Generous absolute bounds: on a busy CI machine a few connections of either run wait for a
    // 1 s SYN retransmit when the accept backlog overflows; the comparison is the verdict.
    let p50 = with.ok[with.ok.len() / 2];
    assert!(p50 < Duration::from_millis(300), "p50 with BBR {p50:?}");
    assert!(
        p99(&with.ok) < Duration::from_secs(2),
        "p99 with BBR {:?}",
        p99(&with.ok)
    );
    // The verdict compares medians: a p99 of either run can be one of those 1 s SYN
    // retransmits (a CI run once saw 1.09 s with BBR against 2.0 s without, both tails).
    let without_p50 = without.ok[without.ok.len() / 2];
    assert!(
        without_p50 > 2 * p50,
        "without BBR p50 {without_p50:?} vs with {p50:?} (p99 {:?} vs {:?})",
        p99(&without.ok),
        p99(&with.ok)
    );
    assert!(
        with.health < Duration::from_secs(2),
        "health probe took {:?}",
        with.health
    );
}
