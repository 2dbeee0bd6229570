//! A tonic gRPC service (the standard health service) protected by a rule file: blocked calls
//! get gRPC statuses (RESOURCE_EXHAUSTED with `grpc-retry-pushback-ms`, PERMISSION_DENIED,
//! UNAVAILABLE), not HTTP errors.
//!
//! `cargo run -p weir-tower --example tonic_rules -- [RULES.yaml] [--demo]`
//!
//! Without `--demo` it serves on 127.0.0.1:50051; with `--demo` it calls itself five times
//! (the bundled rules allow 3 per 10 s), prints the statuses and exits.

use tonic::transport::Server;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use weir_tower::rules::RulesLayer;

mod common;

#[tokio::main]
async fn main() {
    let (rules, demo, _watcher) = common::rules_from_args("tonic_rules");
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let addr = if demo {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:50051"
    };
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    let local = listener.local_addr().expect("address");
    println!("tonic_rules: grpc://{local}");
    let server = Server::builder()
        .layer(RulesLayer::new(rules))
        .add_service(health)
        .serve_with_incoming(tokio_stream_from(listener));
    if !demo {
        server.await.expect("serve");
        return;
    }
    tokio::spawn(async move { server.await.expect("serve") });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{local}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = HealthClient::new(channel);
    for i in 1..=5 {
        match client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
        {
            Ok(r) => println!("call {i}: OK {:?}", r.into_inner().status()),
            Err(s) => println!(
                "call {i}: {:?} {:?} (pushback {:?} ms)",
                s.code(),
                s.message(),
                s.metadata()
                    .get("grpc-retry-pushback-ms")
                    .and_then(|v| v.to_str().ok())
            ),
        }
    }
}

/// The listener as the stream of connections tonic accepts.
fn tokio_stream_from(l: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(l)
}
