//! The framing of unary gRPC calls, by hand on hyper.
//!
//! Why not tonic's generated server: per call it builds a decoding stream, a metadata map, an
//! encoding stream and boxed bodies, ≈ 20 % of `weir serve`'s CPU per decision under load
//! (docs/serve.md). A unary call is simple enough to frame by hand: the request body is one
//! length-prefixed message; the answer is `200`, `content-type: application/grpc`, one
//! length-prefixed message and the trailer `grpc-status: 0`. Errors are "trailers-only"
//! answers (status and message in the headers, no body), as gRPC specifies. Compression is not
//! offered (no `grpc-accept-encoding`), so conforming clients (Envoy, tonic, grpc-go) send
//! uncompressed messages; a compressed one is answered UNIMPLEMENTED.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use hyper::body::{Body, Frame, SizeHint};
use prost::Message;

/// Largest request message accepted (tonic's and grpc-go's default).
pub const MAX_MESSAGE: usize = 4 << 20;

/// gRPC status codes of the errors answered here (success is the `grpc-status: 0` trailer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// The request could not be read to its end (the caller went away).
    Cancelled = 1,
    /// The request body did not arrive within the body timeout.
    DeadlineExceeded = 4,
    /// A malformed or invalid request.
    InvalidArgument = 3,
    /// A request message above [`MAX_MESSAGE`], or past the buffered-bytes bounds.
    ResourceExhausted = 8,
    /// An unknown method, or a compressed message.
    Unimplemented = 12,
    /// A quota call to a server that is not the quota leader (the leader is named in the
    /// metadata).
    FailedPrecondition = 9,
    /// A quota call while no quota leader is known.
    Unavailable = 14,
    /// A lease-API call without a token the quota file accepts for its client id.
    Unauthenticated = 16,
    /// A lease-API call from a client id the quota file does not allow.
    PermissionDenied = 7,
    /// The server failed to answer (its lease server's work did not complete).
    Internal = 13,
}

/// The message of a unary request body: exactly one uncompressed length-prefixed message.
pub fn unframe(body: &Bytes) -> Result<Bytes, (Code, &'static str)> {
    let Some(&[flag, a, b, c, d]) = body.get(..5) else {
        return Err((Code::InvalidArgument, "request body is not a gRPC message"));
    };
    if flag != 0 {
        return Err((Code::Unimplemented, "compressed messages are not supported"));
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if body.len() - 5 != len {
        return Err((
            Code::InvalidArgument,
            "a unary request carries exactly one message",
        ));
    }
    Ok(body.slice(5..))
}

/// A successful unary answer: `message`, then the `grpc-status: 0` trailer.
pub fn ok(message: &impl Message) -> Response<GrpcBody> {
    let len = message.encoded_len();
    // A Vec, not a BytesMut: prost writes varints a byte at a time, and BytesMut's `put_slice`
    // is an out-of-line call (then memmove) per byte where Vec's inlines to a store.
    // `Bytes::from(Vec)` takes the allocation without copying.
    let mut buf = Vec::with_capacity(5 + len);
    buf.push(0);
    buf.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    // Cannot fail: a Vec grows as needed.
    let _ = message.encode(&mut buf);
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut r = Response::new(GrpcBody {
        data: Some(Bytes::from(buf)),
        trailers: Some(trailers),
    });
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    r
}

/// A trailers-only answer: `code` and `message` in the response headers, no body.
pub fn status(code: Code, message: &str) -> Response<GrpcBody> {
    let mut r = Response::new(GrpcBody::empty());
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert("grpc-status", HeaderValue::from(code as u16));
    if let Ok(v) = HeaderValue::from_str(&weir_tower::problem::grpc_message(message)) {
        h.insert("grpc-message", v);
    }
    r
}

/// A gRPC response body: at most one data frame, then at most one trailers frame.
pub struct GrpcBody {
    pub(crate) data: Option<Bytes>,
    pub(crate) trailers: Option<HeaderMap>,
}

impl GrpcBody {
    /// No data and no trailers (a trailers-only answer's body).
    pub fn empty() -> Self {
        Self {
            data: None,
            trailers: None,
        }
    }
}

impl Body for GrpcBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(d) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn framed(msg: &[u8]) -> Bytes {
        let mut b = vec![0u8];
        b.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        b.extend_from_slice(msg);
        Bytes::from(b)
    }

    #[test]
    fn unframe_takes_exactly_one_uncompressed_message() {
        assert_eq!(
            unframe(&framed(b"abc")).unwrap(),
            Bytes::from_static(b"abc")
        );
        assert_eq!(unframe(&framed(b"")).unwrap(), Bytes::new());
        assert_eq!(
            unframe(&Bytes::from_static(b"\0\0")).unwrap_err().0,
            Code::InvalidArgument
        );
        let mut two = framed(b"a").to_vec();
        two.extend_from_slice(&framed(b"b"));
        assert_eq!(
            unframe(&Bytes::from(two)).unwrap_err().0,
            Code::InvalidArgument
        );
        let mut short = framed(b"abcd").to_vec();
        short.pop();
        assert_eq!(
            unframe(&Bytes::from(short)).unwrap_err().0,
            Code::InvalidArgument
        );
        let mut compressed = framed(b"abc").to_vec();
        compressed[0] = 1;
        assert_eq!(
            unframe(&Bytes::from(compressed)).unwrap_err().0,
            Code::Unimplemented
        );
    }

    #[test]
    fn grpc_message_is_percent_encoded() {
        assert_eq!(weir_tower::problem::grpc_message("a b%c"), "a b%25c");
        assert_eq!(weir_tower::problem::grpc_message("é\n"), "%C3%A9%0A");
        let r = status(Code::InvalidArgument, "bad\tvalue");
        assert_eq!(r.headers()["grpc-status"], "3");
        assert_eq!(r.headers()["grpc-message"], "bad%09value");
        assert!(r.body().is_end_stream());
    }
}
