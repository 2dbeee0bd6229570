//! `weir proxy` towards the upstream, through the real binary, in a test binary of its own (no
//! other proxy test runs beside it): requests without a body share the worker's upstream
//! connections, and chunked answers (data, extensions, trailers) and HEAD pass through. Included
//! twice (see `main.rs`): on the lean HTTP/1.1 path, and again with `--http1 hyper`.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;

/// An upstream answering every request head (no bodies) with a chunked body and a trailer,
/// keeping each connection open; `accepted` counts its connections.
async fn chunked_upstream(accepted: Arc<AtomicUsize>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            accepted.fetch_add(1, AtomicOrdering::SeqCst);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Ok(n) = s.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head_only = seen.starts_with(b"HEAD ");
                        seen.drain(..end + 4);
                        let reply: &[u8] = if head_only {
                            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                        } else {
                            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-cost\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-cost: 7\r\n\r\n"
                        };
                        if s.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

/// The data of a chunked body (extensions and trailers dropped).
fn dechunk(mut body: &str) -> String {
    let mut data = String::new();
    while let Some((line, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .expect("a chunk-size line");
        if size == 0 {
            break;
        }
        data.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodiless_requests_share_one_upstream_connection_and_chunked_answers_pass() {
    let accepted = Arc::new(AtomicUsize::new(0));
    let up = chunked_upstream(accepted.clone()).await;
    let dir = common::tempdir("proxy-upstream");
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "resources:\n  - name: all\nhttp:\n  routes:\n    - {resource: all, prefix: /}\n",
    )
    .unwrap();
    // One worker: every request is forwarded from the same idle connections.
    let http1 = if module_path!().ends_with("_hyper") {
        "hyper"
    } else {
        "lean"
    };
    let (mut child, port) = common::start_proxy(&rules, up, &["--workers", "1", "--http1", http1]);
    let answers = tokio::task::spawn_blocking(move || {
        let get = || common::request(port, "GET", "/chunked", "", "");
        let head = common::request(port, "HEAD", "/chunked", "", "");
        [get(), get(), head, get()]
    })
    .await
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let [a, b, head, c] = answers.map(|a| a.expect("answered"));
    for (status, body) in [a, b, c] {
        assert_eq!((status, dechunk(&body).as_str()), (200, "hello world"));
    }
    assert_eq!(head, (200, String::new()));
    assert_eq!(
        accepted.load(AtomicOrdering::SeqCst),
        1,
        "every request went over one upstream connection"
    );
}
