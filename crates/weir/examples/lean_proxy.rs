//! The floor of a Rust HTTP/1.1 reverse proxy on tokio, for `bench/proxy-compare`: what a
//! forwarder with no rules, no header maps and no connection pool lock costs on the same
//! machine as nginx and `weir proxy`. Not a proxy to use: it forwards only bodiless requests,
//! with no timeouts or bounds.
//!
//! `lean_proxy LISTEN_PORT UPSTREAM_PORT [WORKERS] [--hyper]`: one current-thread runtime per
//! worker (default one per core), each with its own `SO_REUSEPORT` listener on 127.0.0.1 and
//! its own idle upstream connections. A client connection's task reads a request head, writes
//! it to an upstream connection, reads the response (Content-Length framed) and writes it back.
//! With `--hyper` the same workers serve with hyper's HTTP/1.1 server and forward with
//! hyper-util's pooled client (the parts `weir proxy` is built on), and nothing else.

use std::cell::RefCell;
use std::rc::Rc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

type Pool = Rc<RefCell<Vec<TcpStream>>>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(listen), Some(upstream)) = (
        args.get(1).and_then(|p| p.parse::<u16>().ok()),
        args.get(2).and_then(|p| p.parse::<u16>().ok()),
    ) else {
        eprintln!("usage: lean_proxy LISTEN_PORT UPSTREAM_PORT [WORKERS]");
        std::process::exit(2);
    };
    let hyper = args.iter().any(|a| a == "--hyper");
    let workers = args
        .get(3)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let threads: Vec<_> = (0..workers)
        .map(|_| std::thread::spawn(move || worker(listen, upstream, hyper)))
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

fn worker(listen: u16, upstream: u16, hyper: bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.set_reuseaddr(true).expect("reuseaddr");
        socket.set_reuseport(true).expect("reuseport");
        socket.bind(([127, 0, 0, 1], listen).into()).expect("bind");
        let listener = socket.listen(1024).expect("listen");
        if hyper {
            return with_hyper(listener, upstream).await;
        }
        let pool: Pool = Rc::new(RefCell::new(Vec::new()));
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let pool = pool.clone();
            tokio::task::spawn_local(async move {
                let _ = serve(client, upstream, pool).await;
            });
        }
    });
}

async fn serve(mut client: TcpStream, upstream: u16, pool: Pool) -> std::io::Result<()> {
    let mut inbuf = Vec::with_capacity(4096);
    let mut out = Vec::with_capacity(4096);
    let mut resp = Vec::with_capacity(4096);
    loop {
        // One request head.
        let head_len = loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut headers);
            if let httparse::Status::Complete(n) = req
                .parse(&inbuf)
                .map_err(|e| std::io::Error::other(e.to_string()))?
            {
                out.clear();
                out.extend_from_slice(req.method.unwrap_or("GET").as_bytes());
                out.push(b' ');
                out.extend_from_slice(req.path.unwrap_or("/").as_bytes());
                out.extend_from_slice(b" HTTP/1.1\r\n");
                for h in req.headers.iter() {
                    if h.name.eq_ignore_ascii_case("connection") {
                        continue;
                    }
                    out.extend_from_slice(h.name.as_bytes());
                    out.extend_from_slice(b": ");
                    out.extend_from_slice(h.value);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"Via: 1.1 lean\r\n\r\n");
                break n;
            }
            if read_more(&mut client, &mut inbuf).await? == 0 {
                return Ok(());
            }
        };
        inbuf.drain(..head_len);
        let pooled = pool.borrow_mut().pop();
        let mut up = match pooled {
            Some(c) => c,
            None => {
                let c = TcpStream::connect(("127.0.0.1", upstream)).await?;
                c.set_nodelay(true)?;
                c
            }
        };
        up.write_all(&out).await?;
        // The response: head, then Content-Length bytes.
        resp.clear();
        let total = loop {
            if read_more(&mut up, &mut resp).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(n) = r
                .parse(&resp)
                .map_err(|e| std::io::Error::other(e.to_string()))?
            {
                let len = r
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok())
                    .unwrap_or(0);
                break n + len;
            }
        };
        while resp.len() < total {
            if read_more(&mut up, &mut resp).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        pool.borrow_mut().push(up);
        client.write_all(&resp[..total]).await?;
    }
}

async fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    buf.reserve(4096);
    s.read_buf(buf).await
}

/// Serves with hyper's HTTP/1.1 server, forwarding with hyper-util's pooled client.
async fn with_hyper(listener: tokio::net::TcpListener, upstream: u16) {
    use hyper_util::client::legacy::{connect::HttpConnector, Client};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, hyper::body::Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    let base: http::Uri = format!("http://127.0.0.1:{upstream}").parse().expect("uri");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        let base = base.clone();
        tokio::task::spawn_local(async move {
            let svc =
                hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                    let mut parts = base.clone().into_parts();
                    parts.path_and_query = req.uri().path_and_query().cloned();
                    if let Ok(uri) = http::Uri::from_parts(parts) {
                        *req.uri_mut() = uri;
                    }
                    client.request(req)
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
