//! gRPC server reflection (v1 and v1alpha) on `weir serve`'s gRPC port, so that grpcurl and
//! similar tools list and call its services with no `.proto` files: Envoy's RLS
//! (`envoy.service.ratelimit.v3.RateLimitService`), RLQS and Weir's quota lease API. The
//! descriptors (`descriptors.bin`, an encoded `FileDescriptorSet`) are compiled from the protos
//! the envoy-types crate ships and from weir-quota's `proto/` by the test
//! `tests/descriptors.rs`, which fails when they differ from what those files compile to (and
//! rewrites them with `WEIR_WRITE_DESCRIPTORS=1`): no build script, nothing read from outside
//! the package when building. Reflection describes the API only; it reads no state.

use std::convert::Infallible;
use std::sync::OnceLock;

use hyper::body::Incoming;
use hyper::{Request, Response};
use tower::util::BoxCloneSyncService;

/// The encoded `FileDescriptorSet` of every service served on the gRPC port.
pub const DESCRIPTORS: &[u8] = include_bytes!("descriptors.bin");

/// Path prefixes of the reflection services.
const V1: &str = "/grpc.reflection.v1.ServerReflection/";
const V1ALPHA: &str = "/grpc.reflection.v1alpha.ServerReflection/";

/// A reflection server, boxed (the builder's type cannot be named).
pub type Server = BoxCloneSyncService<Request<Incoming>, Response<tonic::body::Body>, Infallible>;

/// The reflection server for `path`, when `path` is a reflection call. Built once per process
/// (parsing the descriptor set takes a few milliseconds) and cloned per call.
pub fn server_for(path: &str) -> Option<Server> {
    static SERVERS: OnceLock<Option<(Server, Server)>> = OnceLock::new();
    let v1 = path.starts_with(V1);
    if !v1 && !path.starts_with(V1ALPHA) {
        return None;
    }
    let servers = SERVERS.get_or_init(|| {
        let builder = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(DESCRIPTORS)
        };
        match (builder().build_v1(), builder().build_v1alpha()) {
            (Ok(v1), Ok(v1alpha)) => Some((
                BoxCloneSyncService::new(v1),
                BoxCloneSyncService::new(v1alpha),
            )),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!("gRPC reflection unavailable: {e}");
                None
            }
        }
    });
    servers
        .as_ref()
        .map(|(a, b)| if v1 { a.clone() } else { b.clone() })
}
