//! An axum app protected by a rule file, reloaded when it changes.
//!
//! `cargo run -p weir-tower --example axum_rules -- [RULES.yaml] [--demo]`
//!
//! Without `--demo` it serves on 127.0.0.1:3000 until interrupted; try
//! `curl -i -H 'x-user: ann' localhost:3000/hello` a few times, or `/admin` with and without
//! `-H 'x-caller: ops'`. With `--demo` it sends a few requests to itself, prints the answers and
//! exits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_rules::engine::Rules;
use weir_rules::watch::{load, Watcher};
use weir_tower::rules::RulesLayer;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let demo = args.iter().any(|a| a == "--demo");
    let path = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules.yaml"))
        });
    let set = load(&path).unwrap_or_else(|e| {
        eprintln!("axum_rules: error: {e}");
        std::process::exit(2)
    });
    let rules = Arc::new(Rules::new(&set).unwrap_or_else(|e| {
        eprintln!("axum_rules: error: {}: {e}", path.display());
        std::process::exit(2)
    }));
    // Edits to the file apply within a second; a bad edit is reported and ignored.
    let _watcher = Watcher::start(rules.clone(), path.clone(), Duration::from_secs(1), |e| {
        eprintln!("axum_rules: rules file: {e:?}")
    })
    .expect("watcher thread");
    let app = Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .route("/admin", get(|| async { "admin\n" }))
        .layer(RulesLayer::new(rules.clone()));
    let addr = if demo {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    };
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    let local = listener.local_addr().expect("address");
    println!("axum_rules: http://{local} (rules: {})", path.display());
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    );
    if !demo {
        server.await.expect("serve");
        return;
    }
    tokio::spawn(async move { server.await.expect("serve") });
    for (path, headers) in [
        ("/hello", "x-user: ann\r\n"),
        ("/hello", "x-user: ann\r\n"),
        ("/hello", "x-user: ann\r\n"),
        ("/hello", "x-user: bob\r\n"),
        ("/admin", "x-caller: web\r\n"),
        ("/admin", "x-caller: ops\r\n"),
    ] {
        let mut s = tokio::net::TcpStream::connect(local)
            .await
            .expect("connect");
        let req =
            format!("GET {path} HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n{headers}\r\n");
        s.write_all(req.as_bytes()).await.expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        let status = out.lines().next().unwrap_or("");
        let body = out.split("\r\n\r\n").nth(1).unwrap_or("").trim();
        println!("GET {path} [{}] -> {status} {body}", headers.trim());
    }
    let snap = rules.snapshot();
    for r in &snap.rules {
        println!("rule {}: {} passed, {} blocked", r.id, r.passes, r.blocks);
    }
}
