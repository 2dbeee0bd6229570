//! `weir proxy` towards the upstream, through the real binary, in a test binary of its own (no
//! other proxy test runs beside it): requests without a body share the worker's upstream
//! connections, chunked answers (data, extensions, trailers) and HEAD pass through, and a slow
//! event stream reaches the client event by event. Included
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

/// A streamed answer (Server-Sent Events, a model's tokens) reaches the client event by event:
/// an upstream that sends one event, then waits 3 s before the next, has its first event at
/// the client well before the second is sent; the stream, 12 s long in all, arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_stream_reaches_the_client_as_it_is_sent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut req = [0u8; 4096];
        let _ = s.read(&mut req).await.unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        for i in 0..4 {
            let event = format!("data: token {i}\n\n");
            let chunk = format!("{:x}\r\n{event}\r\n", event.len());
            s.write_all(chunk.as_bytes()).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        }
        s.write_all(b"0\r\n\r\n").await.unwrap();
    });
    let dir = common::tempdir("proxy-stream");
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "resources:\n  - name: all\n    flow:\n      - {id: q, qps: 1000}\nhttp:\n  routes:\n    - {resource: all, prefix: /}\n",
    )
    .unwrap();
    let http1 = if module_path!().ends_with("_hyper") {
        "hyper"
    } else {
        "lean"
    };
    let (mut child, port) = common::start_proxy(&rules, up, &["--http1", http1]);
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(b"GET /stream HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    let mut first = None;
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(20), s.read(&mut buf))
            .await
            .expect("the stream goes on")
            .unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if first.is_none() && String::from_utf8_lossy(&got).contains("token 0") {
            first = Some(started.elapsed());
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let first = first.expect("the first event arrived");
    assert!(
        first < std::time::Duration::from_secs(2),
        "first event after {first:?}: held back until the next"
    );
    let text = String::from_utf8_lossy(&got);
    let (_, body) = text.split_once("\r\n\r\n").expect("a head");
    assert_eq!(
        dechunk(body),
        "data: token 0\n\ndata: token 1\n\ndata: token 2\n\ndata: token 3\n\n"
    );
    assert!(started.elapsed() >= std::time::Duration::from_secs(11));
}
