//! What a rate-limit layer adds to a request, interleaved: `cargo bench -p weir-tower --bench
//! layers_compare`.
//!
//! The criterion bench `layers` runs each case for seconds, one after the other, and this shared
//! machine's speed drifts by tens of percent in that time. Here every round times a short batch
//! of each case in turn (the order rotating), subtracts the bare handler's time of the same
//! round, and divides by what tower-resilience-ratelimiter adds in that round; a row's ratio is
//! the median over rounds. Same fixture as `layers`: a trivial handler, one request polled to
//! completion, limits never reached.

use std::hint::black_box;
use std::time::{Duration, Instant};

use tower::Layer;
use weir_core::{Gcra, KeyedLimiter, Quota};
use weir_tower::key::Global;
use weir_tower::limit::RateLimitLayer;
use weir_tower::rules::RulesLayer;

mod fixture;
use fixture::{handler, once};

const ROUNDS: usize = 41;
const BATCH: u32 = 20_000;

type Case = Box<dyn FnMut()>;

fn case<S>(mut svc: S) -> Case
where
    S: tower::Service<http::Request<()>> + 'static,
    S::Error: std::fmt::Debug,
{
    Box::new(move || once(black_box(&mut svc)))
}

fn rate_limit() -> RateLimitLayer<Gcra, Global> {
    let quota = Quota::per_second(1_000_000_000).expect("quota");
    let limiter = KeyedLimiter::new(Gcra::from_quota(quota).expect("gcra"), 16).expect("limiter");
    RateLimitLayer::new(limiter, Global)
}

fn time(f: &mut Case) -> f64 {
    let start = Instant::now();
    for _ in 0..BATCH {
        f();
    }
    start.elapsed().as_nanos() as f64 / f64::from(BATCH)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _ctx = rt.enter();
    let coarse = weir_core::CoarseClock::new(Duration::from_millis(1)).expect("clock");
    // The baseline first, tower-resilience second: the rows divide by them.
    let mut cases: Vec<(&str, Case)> = vec![
        ("handler alone", case(handler())),
        ("tower-resilience-ratelimiter", case(fixture::resilience())),
        (
            "weir RulesLayer, one flow rule on a route",
            case(RulesLayer::new(fixture::rules()).layer(handler())),
        ),
        (
            "weir RulesLayer, the same on CoarseClock (1 ms)",
            case(RulesLayer::new(fixture::rules_on(coarse)).layer(handler())),
        ),
        (
            "weir RateLimitLayer (GCRA, global key), RateLimit headers on every response",
            case(rate_limit().layer(handler())),
        ),
        (
            "weir RateLimitLayer, headers on refusals only",
            case(rate_limit().headers_on_success(false).layer(handler())),
        ),
        ("tower_governor (global key)", case(fixture::governor())),
    ];
    for (_, c) in cases.iter_mut() {
        time(c);
    }
    let n = cases.len();
    let mut times = vec![Vec::new(); n];
    let mut ratios = vec![Vec::new(); n];
    for round in 0..ROUNDS {
        let mut t = vec![0.0; n];
        for k in 0..n {
            let i = (round + k) % n;
            t[i] = time(&mut cases[i].1);
        }
        let reference = t[1] - t[0];
        for i in 0..n {
            times[i].push(t[i]);
            ratios[i].push((t[i] - t[0]) / reference);
        }
    }
    println!("| layer (interleaved, median of {ROUNDS} rounds) | time per request | added to the handler | added / tower-resilience's |");
    println!("|---|---|---|---|");
    let base = median(&mut times[0].clone());
    for (i, (name, _)) in cases.iter().enumerate() {
        let t = median(&mut times[i]);
        if i == 0 {
            println!("| {name} | {t:.1} ns | — | — |");
        } else {
            let r = median(&mut ratios[i]);
            println!("| {name} | {t:.1} ns | {:.1} ns | {r:.2} |", t - base);
        }
    }
}
