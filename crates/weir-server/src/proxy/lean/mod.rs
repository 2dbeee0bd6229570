//! `weir proxy`'s lean HTTP/1.1 path, and the one rule of which path serves a request.
//!
//! A client connection starts on the lean path ([`conn`]): each request head is parsed with
//! `httparse` into spans of the read buffer ([`request`]), decided by the rules on those spans
//! (a header map holds only the headers the routes read), written to the upstream as bytes
//! over the worker's idle connections, and the response head and body are written back with
//! only what framing needs parsed ([`wire`]).
//!
//! **Which path serves what.** The lean path serves a request when all of these hold:
//! - HTTP/1.1, origin-form target, a path already in normal form, exactly one `Host`;
//! - no body (no `Transfer-Encoding`; no `Content-Length`, or `0`), no `Upgrade`, no `Expect`,
//!   `Connection` naming nothing but `close` / `keep-alive`, not gRPC, not `CONNECT`, not this
//!   proxy's own `Via` token, a head within [`request::MAX_HEAD`] bytes and
//!   [`request::MAX_HEADERS`] headers (every case is a [`request::Hyper`]);
//! - its route has no `fallback` and its resource no `cost:` rules
//!   ([`weir_tower::rules::Verdict::Service`]);
//! - the proxy has no gutter and no tracer, and runs `--http1 lean` (the default).
//!
//! At the first request that fails one, hyper takes the connection over, from that request on
//! (the bytes read are put back in front: [`crate::net::rewind`]) — h2c, request bodies,
//! normalised paths and everything hyper's service stack does. No request is counted by the
//! rules before this choice, so a request is decided exactly once, on the path that serves it.

mod conn;
pub mod request;
pub mod wire;

pub(super) use conn::{serve, Lean};
