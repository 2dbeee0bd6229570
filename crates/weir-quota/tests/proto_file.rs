//! The hand-written messages of `weir_quota::proto` against `proto/weir/quota/v1/quota.proto`:
//! the file is compiled with protox (no protoc), and each message, filled in every field, is
//! encoded by prost and decoded through the file's descriptor — field names, numbers and
//! types must all agree. The service's methods must match the paths served.

use std::path::Path;

use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, Value};
use weir_quota::proto::*;

fn pool() -> DescriptorPool {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let files =
        protox::compile(["weir/quota/v1/quota.proto"], [root]).expect("the .proto compiles");
    DescriptorPool::from_file_descriptor_set(files).unwrap()
}

/// Decodes `message`'s encoding as `name` of the .proto file; every field of the file's message
/// must be present (non-default) and no bytes unknown.
fn through_the_file(pool: &DescriptorPool, name: &str, message: &impl Message) -> DynamicMessage {
    let d = pool
        .get_message_by_name(&format!("weir.quota.v1.{name}"))
        .unwrap_or_else(|| panic!("{name} in the .proto"));
    let bytes = message.encode_to_vec();
    let m = DynamicMessage::decode(d.clone(), bytes.as_slice()).unwrap();
    for f in d.fields() {
        assert!(
            m.has_field(&f),
            "{name}.{} not set by the Rust message",
            f.name()
        );
    }
    // Re-encoding through the file gives the same bytes: nothing was unknown or dropped.
    assert_eq!(m.encode_to_vec(), bytes, "{name}: the encodings differ");
    m
}

#[test]
fn the_rust_messages_are_the_proto_files() {
    let pool = pool();
    let ask = ResourceAsk {
        resource: "search".into(),
        wants: 1.5,
        has: 0.5,
        weight: 2.0,
        priority: Priority::Sheddable as i32,
        safe: 3.0,
        lease_id: u64::MAX - 1,
        needs: Some(1.0),
        holds: Some(0.25),
        term: 3,
        parts: vec![DemandPart {
            wants: 1.5,
            needs: Some(1.0),
            weight: 2.0,
            priority: Priority::CriticalPlus as i32,
        }],
    };
    through_the_file(&pool, "DemandPart", &ask.parts[0]);
    let m = through_the_file(&pool, "ResourceAsk", &ask);
    assert_eq!(m.get_field_by_name("needs").unwrap().as_f64(), Some(1.0));
    assert_eq!(m.get_field_by_name("holds").unwrap().as_f64(), Some(0.25));
    assert_eq!(
        m.get_field_by_name("term").unwrap().into_owned(),
        Value::U64(3)
    );
    assert_eq!(m.get_field_by_name("wants").unwrap().as_f64(), Some(1.5));
    assert_eq!(m.get_field_by_name("safe").unwrap().as_f64(), Some(3.0));
    assert_eq!(
        m.get_field_by_name("lease_id").unwrap().into_owned(),
        Value::U64(u64::MAX - 1)
    );
    assert_eq!(
        m.get_field_by_name("priority").unwrap().as_enum_number(),
        Some(4)
    );
    let e = pool.get_enum_by_name("weir.quota.v1.Priority").unwrap();
    for (rust, name) in [
        (Priority::Unspecified, "PRIORITY_UNSPECIFIED"),
        (Priority::CriticalPlus, "CRITICAL_PLUS"),
        (Priority::Critical, "CRITICAL"),
        (Priority::SheddablePlus, "SHEDDABLE_PLUS"),
        (Priority::Sheddable, "SHEDDABLE"),
    ] {
        assert_eq!(e.get_value_by_name(name).unwrap().number(), rust as i32);
    }
    assert_eq!(e.values().count(), 5);
    through_the_file(
        &pool,
        "RefreshRequest",
        &RefreshRequest {
            client: "c".into(),
            resources: vec![ask],
        },
    );
    let lease = ResourceLease {
        resource: "search".into(),
        granted: 3.0,
        expires_in_ms: 30_000,
        refresh_in_ms: 5_000,
        safe_capacity: 1.0,
        learning: true,
        error: "x".into(),
        lease_id: 42,
    };
    let m = through_the_file(&pool, "ResourceLease", &lease);
    assert_eq!(
        m.get_field_by_name("expires_in_ms").unwrap().into_owned(),
        Value::U64(30_000)
    );
    through_the_file(
        &pool,
        "RefreshResponse",
        &RefreshResponse {
            leases: vec![lease],
        },
    );
    through_the_file(
        &pool,
        "ReleaseRequest",
        &ReleaseRequest {
            client: "c".into(),
            resources: vec!["search".into()],
            lease_ids: vec![42],
        },
    );
    assert_eq!(
        pool.get_message_by_name("weir.quota.v1.ReleaseResponse")
            .unwrap()
            .fields()
            .count(),
        0
    );
    let service = pool
        .get_service_by_name("weir.quota.v1.QuotaService")
        .unwrap();
    let paths: Vec<String> = service
        .methods()
        .map(|m| format!("/{}/{}", service.full_name(), m.name()))
        .collect();
    assert_eq!(paths, [REFRESH_PATH, RELEASE_PATH]);
}
