//! A test upstream that behaves like an LLM API: each request is answered with a stream of
//! Server-Sent Events for a random time (50–300 ms), ending with a `usage` event whose
//! `total_tokens` is drawn from a heavy-tailed distribution, then `data: [DONE]`; one stream
//! in twenty is cut midway (no usage, the connection closed). Every answer is recorded: when
//! the request came, its `x-user`, the tokens it cost (0 for a cut stream).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One answered request.
#[derive(Debug, Clone)]
pub struct Served {
    /// When it reached the upstream.
    pub at: Instant,
    /// Its path.
    pub path: String,
    /// Its `x-user` header.
    pub user: String,
    /// Tokens it cost (0: cut midway).
    pub tokens: u64,
    /// Cut midway.
    pub failed: bool,
    /// The request's `max_tokens` (0: none stated).
    pub stated: u64,
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(u64);

impl Rng {
    /// Seeded with `seed` (non-zero).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A heavy-tailed token count: Pareto with minimum 50 and shape 1.5, at most 4 000.
    pub fn tokens(&mut self) -> u64 {
        let u = 1.0 - self.next_f64();
        ((50.0 / u.powf(1.0 / 1.5)) as u64).min(4_000)
    }
}

/// The mean of [`Rng::tokens`], estimated from a million draws.
pub fn mean_tokens() -> f64 {
    let mut r = Rng::new(7);
    (0..1_000_000).map(|_| r.tokens() as f64).sum::<f64>() / 1e6
}

/// What the upstream answered, in order.
pub type Log = Arc<Mutex<Vec<Served>>>;

/// Starts the upstream on a free loopback port: the port and its log. With `trailer`, a
/// stream that ends whole also states its tokens in that trailer (for Envoy, which reads
/// trailers but not events).
pub async fn start(seed: u64, trailer: Option<&'static str>) -> (u16, Log) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let log: Log = Arc::default();
    let rng = Arc::new(Mutex::new(Rng::new(seed)));
    let out = log.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (log, rng) = (log.clone(), rng.clone());
            tokio::spawn(async move {
                let _ = serve(s, &log, &rng, trailer).await;
            });
        }
    });
    (port, out)
}

/// One request per connection (`Connection: close`).
async fn serve(
    mut s: tokio::net::TcpStream,
    log: &Log,
    rng: &Mutex<Rng>,
    trailer: Option<&'static str>,
) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 64 * 1024 {
            return Ok(());
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let field = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
    };
    let len: usize = field("content-length:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let path = head
        .lines()
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("/")
        .to_string();
    let user = field("x-user:").unwrap_or_default();
    let at = Instant::now();
    let body = String::from_utf8_lossy(&buf[head_end..]).into_owned();
    let stated: u64 = body
        .split("\"max_tokens\":")
        .nth(1)
        .and_then(|r| {
            r.split(|c: char| !c.is_ascii_digit())
                .find(|t| !t.is_empty())
        })
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let (tokens, failed, millis, parts) = {
        let mut r = rng.lock();
        let tokens = r.tokens();
        // `/cut…` always fails midway, `/whole…` and `/late-trailer…` never; others one in
        // twenty.
        let failed = match () {
            _ if path.starts_with("/cut") => true,
            _ if path.starts_with("/whole") || path.starts_with("/late-trailer") => false,
            _ => r.next_f64() < 0.05,
        };
        let millis = 50 + (r.next_f64() * 250.0) as u64;
        let parts = 3 + (r.next_f64() * 4.0) as u64;
        if path.starts_with("/long") {
            // A real LLM stream: 1–60 s (Pareto, shape 1.2: most a few seconds, some a minute),
            // an event every half second, using a 4th to a 20th of the max_tokens stated.
            let u = 1.0 - r.next_f64();
            let millis = ((1_000.0 / u.powf(1.0 / 1.2)) as u64).min(60_000);
            let k = 4.0 + 16.0 * r.next_f64();
            let tokens = ((stated.max(1) as f64) / k).ceil() as u64;
            (tokens, false, millis, (millis / 500).max(2))
        } else {
            (tokens, failed, millis, parts)
        }
    };
    let mut response = String::from(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n",
    );
    if let Some(t) = trailer {
        response.push_str(&format!("trailer: {t}\r\n"));
    }
    response.push_str("\r\n");
    s.write_all(response.as_bytes()).await?;
    let send = |data: String| format!("{:x}\r\n{data}\r\n", data.len());
    for i in 0..parts {
        let event =
            format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"part {i}\"}}}}]}}\n\n");
        s.write_all(send(event).as_bytes()).await?;
        tokio::time::sleep(Duration::from_millis(millis / parts)).await;
        if failed && i == parts / 2 {
            log.lock().push(Served {
                at,
                path,
                user,
                tokens: 0,
                failed: true,
                stated,
            });
            // Cut: the chunked body never ends.
            return Ok(());
        }
    }
    let usage = format!(
        "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":0,\"completion_tokens\":{tokens},\"total_tokens\":{tokens}}}}}\n\ndata: [DONE]\n\n"
    );
    s.write_all(send(usage).as_bytes()).await?;
    match trailer {
        Some(t) => {
            if path.starts_with("/late-trailer") {
                // The trailer comes after the client has read every event.
                s.flush().await?;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            s.write_all(format!("0\r\n{t}: {tokens}\r\n\r\n").as_bytes())
                .await?
        }
        None => s.write_all(b"0\r\n\r\n").await?,
    }
    s.flush().await?;
    log.lock().push(Served {
        at,
        path,
        user,
        tokens,
        failed: false,
        stated,
    });
    Ok(())
}

/// The most and least tokens any `span` starting at a request of `served` (within `[from,
/// to - span]`) saw, and the excesses over `estimate` of the requests in the span with the
/// most: (max, min, sum of excesses in the max span, largest single excess overall).
pub fn spans(
    served: &[Served],
    span: Duration,
    from: Instant,
    to: Instant,
    estimate: u64,
) -> (u64, u64, u64, u64) {
    let mut s: Vec<&Served> = served.iter().collect();
    s.sort_by_key(|r| r.at);
    let (mut max, mut min, mut excess_at_max) = (0, u64::MAX, 0);
    for (i, first) in s.iter().enumerate() {
        if first.at < from || first.at + span > to {
            continue;
        }
        let inside = s[i..].iter().take_while(|r| r.at < first.at + span);
        let (tokens, excess) = inside.fold((0, 0), |(t, e), r| {
            (t + r.tokens, e + r.tokens.saturating_sub(estimate))
        });
        if tokens > max {
            (max, excess_at_max) = (tokens, excess);
        }
        min = min.min(tokens);
    }
    let largest = s
        .iter()
        .map(|r| r.tokens.saturating_sub(estimate))
        .max()
        .unwrap_or(0);
    (
        max,
        if min == u64::MAX { 0 } else { min },
        excess_at_max,
        largest,
    )
}

/// The HTTP client LLM test clients call with.
pub type ChatClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<bytes::Bytes>,
>;

/// One chat call of `user` to `path` stating `max_tokens` (also in `x-max-tokens`), its
/// stream read to its end (or to the error that cuts it): the status, `None` when it failed or
/// took longer than `limit`.
pub async fn chat(
    client: &ChatClient,
    port: u16,
    path: &str,
    user: &str,
    max_tokens: u64,
    limit: Duration,
) -> Option<u16> {
    use http_body_util::BodyExt;
    let body =
        format!("{{\"model\":\"m\",\"stream\":true,\"max_tokens\":{max_tokens},\"messages\":[]}}");
    let req = http::Request::post(format!("http://127.0.0.1:{port}{path}"))
        .header("x-user", user)
        .header("x-max-tokens", max_tokens.to_string())
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .ok()?;
    tokio::time::timeout(limit, async {
        let r = client.request(req).await.ok()?;
        let status = r.status().as_u16();
        let _ = r.into_body().collect().await;
        Some(status)
    })
    .await
    .ok()
    .flatten()
}
