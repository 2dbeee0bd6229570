//! A light HTTP/2 load generator for `weir serve`'s gRPC port, for measuring the server
//! rather than the client on a 2-core machine.
//!
//! `cargo run --release -p weir --example rls_blast -- ADDR CONNECTIONS STREAMS MILLIS`
//!
//! Closed loop: each of CONNECTIONS keeps STREAMS `ShouldRateLimit` calls in flight (domain
//! `bench`, one descriptor `remote_address=10.1.2.3`), sending a new call as each answer
//! completes, for MILLIS milliseconds (then waits ≤ 5 s for the calls in flight). One thread.
//! Prints one JSON line: decisions/s, p50/p99/max latency in µs, failed calls.
//!
//! Why not h2load or a tonic client: both spend as much CPU per call as the server does, and
//! on two cores the client's share caps what the server can show. This one speaks just enough
//! HTTP/2 for a unary call: requests are frames built once (an HPACK block of static-table
//! and literal fields, no dynamic table; only the stream id changes), written in batches; the
//! answers are read as frames without decoding their headers. A call succeeds when its
//! stream carries a DATA frame holding a `RateLimitResponse` that decodes with overall code
//! OK and then ends with a HEADERS frame (the trailers). weir answers errors trailers-only
//! (no DATA), and a reset stream is a failure, so every failure is counted. It obeys the
//! server's connection flow-control window, acknowledges SETTINGS and PING, and keeps its
//! own receive window open.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;
/// Our receive window (connection and streams), topped up as answers arrive.
const RECV_WINDOW: u32 = 1 << 30;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 4 {
        eprintln!("usage: rls_blast ADDR CONNECTIONS STREAMS MILLIS");
        std::process::exit(2);
    }
    let num = |i: usize, what: &str| -> u64 {
        args[i].parse().unwrap_or_else(|_| {
            eprintln!("rls_blast: {what} must be a number, got {:?}", args[i]);
            std::process::exit(2)
        })
    };
    let (conns, streams, millis) = (num(1, "CONNECTIONS"), num(2, "STREAMS"), num(3, "MILLIS"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let addr = args[0].clone();
    let run = Duration::from_millis(millis);
    let results = rt.block_on(async move {
        let deadline = Instant::now() + run;
        let tasks: Vec<_> = (0..conns)
            .map(|_| tokio::spawn(connection(addr.clone(), streams as usize, deadline)))
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.push(t.await.expect("connection task"));
        }
        all
    });
    let mut lat: Vec<u32> = Vec::new();
    let mut failed = 0u64;
    for r in results {
        match r {
            Ok(s) => {
                lat.extend(s.latencies_us);
                failed += s.failed;
            }
            Err(e) => {
                eprintln!("rls_blast: {e}");
                std::process::exit(1);
            }
        }
    }
    lat.sort_unstable();
    let pct = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)));
    println!(
        "{{\"decisions_per_s\": {:.0}, \"p50_us\": {}, \"p99_us\": {}, \"max_us\": {}, \"calls\": {}, \"failed\": {}}}",
        lat.len() as f64 / run.as_secs_f64(),
        pct(0.5).copied().unwrap_or(0),
        pct(0.99).copied().unwrap_or(0),
        lat.last().copied().unwrap_or(0),
        lat.len(),
        failed
    );
}

struct Stats {
    latencies_us: Vec<u32>,
    failed: u64,
}

fn frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// HPACK literal (never the dynamic table): `name_index` from the static table, or a new name.
fn literal(block: &mut Vec<u8>, name_index: u8, name: &str, value: &str) {
    block.push(name_index); // 0000xxxx: literal without indexing, 4-bit name index
    if name_index == 0 {
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
    }
    block.push(value.len() as u8);
    block.extend_from_slice(value.as_bytes());
}

/// The bytes of one call on stream 1 (the id is patched per call at `ID_AT` and `DATA_ID_AT`).
fn call_template(authority: &str) -> (Vec<u8>, usize, usize, usize) {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
    literal(&mut block, 4, "", PATH); // :path
    literal(&mut block, 1, "", authority); // :authority
    literal(&mut block, 0, "content-type", "application/grpc");
    literal(&mut block, 0, "te", "trailers");
    let request = RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: "10.1.2.3".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let msg = request.encode_to_vec();
    let mut out = Vec::new();
    frame_header(&mut out, block.len(), HEADERS, END_HEADERS, 1);
    let id_at = 5;
    out.extend_from_slice(&block);
    let data_id_at = out.len() + 5;
    frame_header(&mut out, 5 + msg.len(), DATA, END_STREAM, 1);
    out.push(0);
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(&msg);
    (out, id_at, data_id_at, 5 + msg.len())
}

async fn connection(addr: String, streams: usize, deadline: Instant) -> Result<Stats, String> {
    let mut sock = TcpStream::connect(&addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    sock.set_nodelay(true).map_err(|e| e.to_string())?;
    let (template, id_at, data_id_at, data_len) = call_template(&addr);
    let mut out = Vec::with_capacity(64 * 1024);
    out.extend_from_slice(PREFACE);
    frame_header(&mut out, 6, SETTINGS, 0, 0);
    out.extend_from_slice(&4u16.to_be_bytes()); // SETTINGS_INITIAL_WINDOW_SIZE
    out.extend_from_slice(&RECV_WINDOW.to_be_bytes());
    frame_header(&mut out, 4, WINDOW_UPDATE, 0, 0);
    out.extend_from_slice(&(RECV_WINDOW - 65_535).to_be_bytes());

    let mut send_window: i64 = 65_535; // the server's connection window for our DATA
    let mut received: u64 = 0; // DATA bytes since our last WINDOW_UPDATE
    let mut next_id: u32 = 1;
    // stream id → (sent at, answer decoded OK)
    let mut inflight: HashMap<u32, (Instant, bool)> = HashMap::with_capacity(streams * 2);
    let mut stats = Stats {
        latencies_us: Vec::with_capacity(1 << 20),
        failed: 0,
    };
    let mut buf: Vec<u8> = vec![0; 256 * 1024];
    let (mut start, mut end) = (0usize, 0usize);
    let hard_stop = deadline + Duration::from_secs(5);
    loop {
        let now = Instant::now();
        if now < deadline {
            while inflight.len() < streams && send_window >= data_len as i64 {
                let at = out.len();
                out.extend_from_slice(&template);
                out[at + id_at..at + id_at + 4].copy_from_slice(&next_id.to_be_bytes());
                out[at + data_id_at..at + data_id_at + 4].copy_from_slice(&next_id.to_be_bytes());
                inflight.insert(next_id, (now, false));
                send_window -= data_len as i64;
                next_id += 2;
            }
        } else if inflight.is_empty() || now > hard_stop {
            stats.failed += inflight.len() as u64;
            return Ok(stats);
        }
        if !out.is_empty() {
            sock.write_all(&out)
                .await
                .map_err(|e| format!("write: {e}"))?;
            out.clear();
        }
        if start == end {
            start = 0;
            end = 0;
        } else if buf.len() - end < 16 * 1024 {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
        }
        let n = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf[end..]))
            .await
            .map_err(|_| "no answer for 5 s".to_string())?
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("server closed the connection".into());
        }
        end += n;
        // Every complete frame in the buffer.
        while end - start >= 9 {
            let h = &buf[start..start + 9];
            let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            if end - start < 9 + len {
                if 9 + len > buf.len() {
                    return Err(format!("frame of {len} bytes"));
                }
                break;
            }
            let (kind, flags) = (h[3], h[4]);
            let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            let payload = &buf[start + 9..start + 9 + len];
            match kind {
                DATA => {
                    received += len as u64;
                    if let Some(call) = inflight.get_mut(&id) {
                        // One length-prefixed message in one frame (as weir sends them).
                        call.1 = payload.len() >= 5
                            && RateLimitResponse::decode(&payload[5..])
                                .is_ok_and(|r| r.overall_code == 1);
                    }
                    if flags & END_STREAM != 0 {
                        if let Some((_, ok)) = inflight.remove(&id) {
                            stats.failed += u64::from(!ok);
                        }
                    }
                }
                HEADERS if flags & END_STREAM != 0 => {
                    if let Some((sent, ok)) = inflight.remove(&id) {
                        if ok {
                            let us = sent.elapsed().as_micros();
                            stats
                                .latencies_us
                                .push(u32::try_from(us).unwrap_or(u32::MAX));
                        } else {
                            stats.failed += 1;
                        }
                    }
                }
                RST_STREAM if inflight.remove(&id).is_some() => stats.failed += 1,
                SETTINGS if flags & ACK == 0 => frame_header(&mut out, 0, SETTINGS, ACK, 0),
                PING if flags & ACK == 0 => {
                    frame_header(&mut out, 8, PING, ACK, 0);
                    out.extend_from_slice(payload);
                }
                GOAWAY => return Err("server sent GOAWAY".into()),
                WINDOW_UPDATE if id == 0 && len == 4 => {
                    let inc = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                    send_window += i64::from(inc & 0x7fff_ffff);
                }
                _ => {}
            }
            start += 9 + len;
        }
        if received > u64::from(RECV_WINDOW / 2) {
            frame_header(&mut out, 4, WINDOW_UPDATE, 0, 0);
            out.extend_from_slice(&(received as u32).to_be_bytes());
            received = 0;
        }
        if stats.latencies_us.len() >= 50_000_000 {
            return Err("more than 50 M calls: run shorter".into());
        }
    }
}
