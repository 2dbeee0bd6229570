//! What every export carries: the resource (the process, as OTLP describes it) and the
//! clocks exports are stamped and their failures paced with.

use std::time::{SystemTime, UNIX_EPOCH};

use super::proto::{KeyValue, Resource};
use super::Settings;

/// `service.name` and the further resource attributes of `s`.
pub(super) fn resource(s: &Settings) -> Resource {
    let mut attributes = vec![KeyValue::string("service.name", s.service_name.as_str())];
    attributes.extend(
        s.resource
            .iter()
            .filter(|(k, _)| k != "service.name")
            .map(|(k, v)| KeyValue::string(k.as_str(), v.as_str())),
    );
    Resource { attributes }
}

pub(super) fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

pub(super) fn monotonic_nanos() -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
