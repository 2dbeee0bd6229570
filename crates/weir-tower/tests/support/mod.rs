//! Shared by the layer tests: a real axum server on a free loopback port, a raw HTTP/1.1
//! client, and a body that never ends.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::Router;
use bytes::Bytes;
use http_body::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_tower::key::PeerAddr;

/// Puts the connection's peer address where weir-tower's extractors read it.
pub async fn peer(
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    mut req: Request,
    next: Next,
) -> axum::response::Response {
    req.extensions_mut().insert(PeerAddr(addr));
    next.run(req).await
}

pub async fn serve(app: Router) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        axum::serve(l, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });
    port
}

/// (status, lower-cased head, body) of `GET /x`.
pub async fn get_raw(port: u16, headers: &[(&str, &str)]) -> (u16, String, String) {
    request(port, "GET", "/x", headers).await
}

/// (status, lower-cased head, body) of `METHOD path`.
pub async fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let out = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (
        head[9..12].parse().unwrap(),
        head.to_ascii_lowercase(),
        body.to_string(),
    )
}

pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
}

/// A body that sends one chunk and then never ends (a slow download).
pub struct Endless(pub bool);

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.0 {
            Poll::Pending
        } else {
            self.0 = true;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"first chunk")))))
        }
    }
}
