//! A trivial HTTP upstream for benchmarks: answers 200 "ok" to everything.
//! `cargo run --release -p weir --example upstream -- PORT`

use axum::Router;

fn main() {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| {
            eprintln!("usage: upstream PORT");
            std::process::exit(2)
        });
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async move {
            let app = Router::new().fallback(|| async { "ok" });
            let l = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .expect("bind");
            axum::serve(l, app).await.expect("serve");
        });
}
