//! The request's criticality in HTTP headers and gRPC metadata.
//!
//! gRPC metadata is HTTP/2 headers: tonic's `MetadataMap` is `AsRef<HeaderMap>` and
//! `AsMut<HeaderMap>`, so the same functions serve both:
//! `criticality::read(request.metadata().as_ref())`,
//! `criticality::write(outgoing.metadata_mut().as_mut(), level)`.
//! An absent or unknown value reads as the default (CRITICAL), so a caller cannot raise its
//! priority with garbage.
//!
//! Automatic propagation: [`CriticalityLayer`] on the server runs each request's handler with
//! the request's criticality in a task-local; [`PropagateLayer`] on a client writes it into
//! every outgoing request made from that handler (unless the request already carries one).
//! Work moved to a spawned task does not inherit task-locals: wrap it with [`scope`].

use std::future::Future;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderName, HeaderValue, Request};
use tower::{Layer, Service};
use weir_core::criticality::HEADER;
use weir_core::Criticality;

/// The header, parsed once (a `&str` name is parsed on every lookup).
pub const HEADER_NAME: HeaderName = HeaderName::from_static(HEADER);

/// The criticality carried by `headers` (default CRITICAL when absent or unknown).
pub fn read(headers: &HeaderMap) -> Criticality {
    Criticality::from_header(headers.get(HEADER_NAME).map(HeaderValue::as_bytes))
}

/// Sets `level` on outgoing `headers` (replacing any value).
pub fn write(headers: &mut HeaderMap, level: Criticality) {
    headers.insert(HEADER_NAME, HeaderValue::from_static(level.as_str()));
}

/// Copies the criticality of an incoming request to an outgoing one: the downstream call is
/// as critical as the request that caused it.
pub fn propagate(incoming: &HeaderMap, outgoing: &mut HeaderMap) {
    write(outgoing, read(incoming));
}

tokio::task_local! {
    static CURRENT: Criticality;
}

/// The criticality of the request being served by this task, if a [`CriticalityLayer`] (or
/// [`scope`]) set one.
pub fn current() -> Option<Criticality> {
    CURRENT.try_with(|c| *c).ok()
}

/// Runs `f` with `level` as the current criticality.
pub fn scope<F: Future>(
    level: Criticality,
    f: F,
) -> tokio::task::futures::TaskLocalFuture<Criticality, F> {
    CURRENT.scope(level, f)
}

/// Server side: runs each request's handler with the request's criticality as [`current`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CriticalityLayer;

impl<S> Layer<S> for CriticalityLayer {
    type Service = CriticalityService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CriticalityService { inner }
    }
}

/// A service whose calls run with the request's criticality as [`current`].
#[derive(Debug, Clone)]
pub struct CriticalityService<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for CriticalityService<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = tokio::task::futures::TaskLocalFuture<Criticality, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let level = read(req.headers());
        // The inner call's synchronous part runs in the scope too.
        let fut = CURRENT.sync_scope(level, || self.inner.call(req));
        scope(level, fut)
    }
}

/// Client side: writes [`current`] into outgoing requests that carry no criticality yet.
#[derive(Debug, Clone, Copy, Default)]
pub struct PropagateLayer;

impl<S> Layer<S> for PropagateLayer {
    type Service = PropagateService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PropagateService { inner }
    }
}

/// A client service propagating the criticality of the request being served.
#[derive(Debug, Clone)]
pub struct PropagateService<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for PropagateService<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(level) = current() {
            if !req.headers().contains_key(HEADER_NAME) {
                write(req.headers_mut(), level);
            }
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_headers_and_unknown_reads_as_default() {
        let mut h = HeaderMap::new();
        assert_eq!(read(&h), Criticality::Critical);
        for level in Criticality::ALL {
            write(&mut h, level);
            assert_eq!(read(&h), level);
        }
        h.insert(HEADER, HeaderValue::from_static("SUPER_CRITICAL"));
        assert_eq!(read(&h), Criticality::Critical);
        let mut out = HeaderMap::new();
        write(&mut h, Criticality::Sheddable);
        propagate(&h, &mut out);
        assert_eq!(read(&out), Criticality::Sheddable);
    }

    #[test]
    fn grpc_metadata_carries_it_too() {
        let mut incoming = tonic::metadata::MetadataMap::new();
        incoming.insert(HEADER, "SHEDDABLE_PLUS".parse().unwrap());
        assert_eq!(read(incoming.as_ref()), Criticality::SheddablePlus);
        let mut outgoing = tonic::metadata::MetadataMap::new();
        propagate(incoming.as_ref(), outgoing.as_mut());
        assert_eq!(
            outgoing.get(HEADER).unwrap().to_str().unwrap(),
            "SHEDDABLE_PLUS"
        );
    }
}
