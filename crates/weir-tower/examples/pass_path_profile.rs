//! The `RulesLayer` pass path in a loop, for counting instructions with callgrind (exact and
//! repeatable on this noisy shared machine, unlike timings):
//!
//! ```text
//! cargo build --release -p weir-tower --example pass_path_profile
//! valgrind --tool=callgrind target/release/examples/pass_path_profile rules 200000
//! ```
//!
//! Run each mode (`plain`: the handler alone; `rules`: one GCRA flow rule on a route; the same
//! fixture as `benches/layers.rs`) with two counts N and subtract, so one-time costs (runtime,
//! clock calibration) cancel out: instructions per request = (Ir(2N) − Ir(N)) / N. Readings in
//! docs/tower.md.

use tower::Layer;
use weir_tower::rules::RulesLayer;

#[path = "../benches/fixture.rs"]
mod fixture;
use fixture::{handler, once, rules};

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "rules".into());
    let n: usize = args.next().map_or(100_000, |s| s.parse().expect("a count"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _ctx = rt.enter();
    match mode.as_str() {
        "plain" => {
            let mut svc = handler();
            (0..n).for_each(|_| once(&mut svc));
        }
        "rules" => {
            let mut svc = RulesLayer::new(rules()).layer(handler());
            (0..n).for_each(|_| once(&mut svc));
        }
        other => {
            eprintln!("usage: pass_path_profile plain|rules [N] (got {other:?})");
            std::process::exit(2);
        }
    }
}
