//! The request's criticality in HTTP headers and gRPC metadata.
//!
//! gRPC metadata is HTTP/2 headers: tonic's `MetadataMap` is `AsRef<HeaderMap>` and
//! `AsMut<HeaderMap>`, so the same functions serve both:
//! `criticality::read(request.metadata().as_ref())`,
//! `criticality::write(outgoing.metadata_mut().as_mut(), level)`.
//! An absent or unknown value reads as the default (CRITICAL), so a caller cannot raise its
//! priority with garbage.

use http::{HeaderMap, HeaderName, HeaderValue};
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
