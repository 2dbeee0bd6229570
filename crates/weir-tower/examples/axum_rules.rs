//! An axum app protected by a rule file, reloaded when it changes.
//!
//! `cargo run -p weir-tower --example axum_rules -- [RULES.yaml] [--demo]`
//!
//! Without `--demo` it serves on 127.0.0.1:3000 until interrupted; try
//! `curl -i -H 'x-user: ann' localhost:3000/hello` a few times, or `/admin` with and without
//! `-H 'x-caller: ops'`. With `--demo` it sends a few requests to itself, prints the answers and
//! exits.

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_tower::rules::RulesLayer;

mod common;

#[tokio::main]
async fn main() {
    let (rules, demo, _watcher) = common::rules_from_args("axum_rules");
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
    println!("axum_rules: http://{local}");
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
