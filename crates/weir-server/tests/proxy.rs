//! `weir proxy` built in-process through weir-server's library (`Proxy::build` on
//! `Settings::new`), on listeners bound to 127.0.0.1:0, in front of an HTTP/1.1 upstream of
//! this test: requests forwarded and refused by a rule, the admin port's `/metrics`, a rule
//! file changed while serving (applied with its counters kept), a graceful stop, and typed
//! errors for a bad rule file and a proxy pointed at itself.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use weir_server::net::accept;
use weir_server::proxy::{Proxy, Settings, StartError};

mod common;

/// An upstream answering every request `200 ok` (HTTP/1.1, one connection at a time each on
/// its own task, keep-alive).
async fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = s.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    // Requests without bodies: one answer per head.
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        let answer =
                            b"HTTP/1.1 200 OK\r\nx-tokens-used: 7\r\nContent-Length: 2\r\n\r\nok";
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// One GET.
async fn get(addr: SocketAddr, path: &str) -> String {
    common::request(addr, "GET", path, &[], "").await
}

/// [`get`] by the caller named `caller` (`x-caller`).
async fn get_as(addr: SocketAddr, path: &str, caller: &str) -> String {
    common::request(addr, "GET", path, &[("x-caller", caller)], "").await
}

fn file(name: &str, text: &str) -> std::path::PathBuf {
    common::file("proxy", name, text)
}

/// A rule file: `limit` requests a minute to /api, and /chat under a cost rule (each call
/// holds 100 units of a budget of a million a minute, settled to what the upstream's
/// `x-tokens-used` says, charged to its caller).
fn rules(limit: u64) -> String {
    format!(
        "resources:
  - name: api
    flow:
      - {{id: api-rate, qps: {limit}, window: 60s}}
  - name: chat
    flow:
      - {{id: chat-tokens, qps: 1000000, window: 60s, algorithm: gcra, cost: {{estimate: 100, actual_from: {{header: x-tokens-used}}}}}}
http:
  origin_header: x-caller
  routes:
    - {{resource: api, prefix: /api}}
    - {{resource: chat, prefix: /chat}}
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_forwards_refuses_reloads_and_reports() {
    let (upstream, gutter) = (upstream().await, upstream().await);
    let rule_file = file("rules.yaml", &rules(2));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    let proxy = Proxy::build(Settings {
        workers: 1,
        reload_interval: Duration::from_millis(50),
        gutter: Some(format!("http://{gutter}")),
        ..Settings::new(&rule_file, addr, format!("http://{upstream}"))
    })
    .unwrap();
    let proxy = std::sync::Arc::new(proxy);
    let (trigger, shutdown) = accept::shutdown();
    let serving = {
        let proxy = proxy.clone();
        tokio::spawn(async move { proxy.serve(listener, Some(admin), shutdown).await })
    };

    // Two requests a minute: the third is refused by the rule, not forwarded.
    for _ in 0..2 {
        let a = get(addr, "/api/items").await;
        assert!(a.starts_with("HTTP/1.1 200"), "{a}");
        assert!(a.ends_with("ok"), "{a}");
    }
    let refused = get(addr, "/api/items").await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    // Paths no route names pass.
    assert!(get(addr, "/other").await.starts_with("HTTP/1.1 200"));
    // A call under the cost rule, charged to its caller.
    let chat = get_as(addr, "/chat", "ann").await;
    assert!(chat.starts_with("HTTP/1.1 200"), "{chat}");

    let metrics = get(admin_addr, "/metrics").await;
    for line in [
        "weir_rule_passes_total{rule=\"api-rate\",kind=\"flow\",resource=\"api\"} 2",
        "weir_rule_blocks_total{rule=\"api-rate\",kind=\"flow\",resource=\"api\"} 1",
        "weir_proxy_forwarded_total 4",
        "weir_resource_cost_admitted_total{resource=\"chat\"} 100",
        "gen_ai_client_token_usage_count{resource=\"chat\",gen_ai_token_type=\"total\"} 1",
        "weir_rules_reloads_total{result=\"applied\"} 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in\n{metrics}"
        );
    }

    let body = metrics.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    common::promtool_check("weir proxy", body);
    common::check_dashboard("weir-proxy", body);

    // Five a minute now: the rule keeps the two it counted, so three more pass.
    std::fs::write(&rule_file, rules(5)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !get(admin_addr, "/metrics")
        .await
        .contains("weir_rules_reloads_total{result=\"applied\"} 1")
    {
        assert!(
            Instant::now() < deadline,
            "the changed rule file was not applied"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let codes: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(get(addr, "/api/items").await.starts_with("HTTP/1.1 200"));
        }
        v
    };
    assert_eq!(
        codes,
        [true, true, true, false],
        "counters kept across the reload"
    );

    trigger.stop();
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the proxy stops within 10 s")
        .unwrap();
}

#[test]
fn bad_settings_are_typed_errors() {
    let listen: SocketAddr = "127.0.0.1:18000".parse().unwrap();
    let bad = file(
        "bad.yaml",
        "resources:\n  - name: api\n    flow:\n      - {id: x}\n",
    );
    match Proxy::build(Settings::new(&bad, listen, "http://127.0.0.1:9")) {
        Err(StartError::File(e)) => {
            assert!(e.contains("bad.yaml:4"), "names the file and line: {e}")
        }
        Err(e) => panic!("not a file error: {e}"),
        Ok(_) => panic!("a rule without qps or concurrency was accepted"),
    }
    let good = file("good.yaml", &rules(1));
    match Proxy::build(Settings::new(&good, listen, "http://127.0.0.1:18000")) {
        Err(StartError::Setting(e)) => assert!(e.contains("loop"), "{e}"),
        Err(e) => panic!("not a setting error: {e}"),
        Ok(_) => panic!("a proxy pointed at itself was accepted"),
    }
}
