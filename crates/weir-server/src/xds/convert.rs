//! `RateLimitConfig` resources into the configuration the files give: each resource is
//! written as the YAML document it stands for and read by the files' own parser
//! ([`crate::rls::config::parse`]), so both sources compile into one configuration with the
//! same checks and the same errors — named `xds:NAME`, with the field's path.

use std::path::PathBuf;

use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use serde_json::{json, Map};

use super::proto::{unit_name, RateLimitConfig, RateLimitDescriptor, RateLimitPolicy};
use crate::rls::config::{self, ConfigError, DomainConfig};

/// The domains of one response's resources, merged as the files' domains are (`merge_domains`:
/// one domain in two resources joins them; else it is an error); every problem of every
/// resource otherwise.
pub fn domains(
    resources: &[RateLimitConfig],
    merge_domains: bool,
) -> Result<Vec<DomainConfig>, Vec<ConfigError>> {
    let mut parsed = Vec::with_capacity(resources.len());
    let mut errors = Vec::new();
    for r in resources {
        let file = PathBuf::from(format!("xds:{}", r.name));
        let text = match serde_yaml_ng::to_string(&document(r)) {
            Ok(t) => t,
            Err(e) => {
                errors.push(error(&file, format!("cannot be written as YAML: {e}")));
                continue;
            }
        };
        match config::parse(&file, &text) {
            Ok(d) => parsed.push((file, d)),
            // Lines of a document written here mean nothing to the sender: the field's path
            // says where.
            Err(e) => errors.extend(e.into_iter().map(|mut e| {
                e.position = None;
                e
            })),
        }
    }
    match config::merge(parsed, merge_domains) {
        Ok(merged) if errors.is_empty() => Ok(merged),
        Ok(_) => Err(errors),
        Err(e) => {
            errors.extend(e);
            Err(errors)
        }
    }
}

fn error(file: &std::path::Path, reason: String) -> ConfigError {
    ConfigError {
        file: file.to_path_buf(),
        position: None,
        path: String::new(),
        reason,
    }
}

/// The YAML document a resource stands for (as envoyproxy/ratelimit maps it: an empty value
/// is no value, an unlimited policy is `unlimited: true` alone).
fn document(r: &RateLimitConfig) -> serde_json::Value {
    json!({
        "domain": r.domain,
        "descriptors": r.descriptors.iter().map(descriptor).collect::<Vec<_>>(),
    })
}

fn descriptor(d: &RateLimitDescriptor) -> serde_json::Value {
    let mut m = Map::new();
    m.insert("key".into(), d.key.clone().into());
    if !d.value.is_empty() {
        m.insert("value".into(), d.value.clone().into());
    }
    if let Some(p) = &d.rate_limit {
        m.insert("rate_limit".into(), policy(p));
    }
    for (name, on) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if on {
            m.insert(name.into(), true.into());
        }
    }
    if let Some(s) = &d.metadata {
        m.insert("metadata".into(), structure(s));
    }
    if !d.descriptors.is_empty() {
        m.insert(
            "descriptors".into(),
            d.descriptors.iter().map(descriptor).collect(),
        );
    }
    m.into()
}

fn policy(p: &RateLimitPolicy) -> serde_json::Value {
    let mut m = Map::new();
    if p.unlimited {
        m.insert("unlimited".into(), true.into());
    } else {
        // A unit that is none is written as its number: the parser names it.
        let unit = unit_name(p.unit).map_or_else(|| p.unit.to_string(), str::to_string);
        m.insert("unit".into(), unit.into());
        m.insert("requests_per_unit".into(), p.requests_per_unit.into());
    }
    if !p.name.is_empty() {
        m.insert("name".into(), p.name.clone().into());
    }
    if !p.replaces.is_empty() {
        m.insert(
            "replaces".into(),
            p.replaces.iter().map(|r| json!({"name": r.name})).collect(),
        );
    }
    m.into()
}

fn structure(s: &Struct) -> serde_json::Value {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value(v)))
        .collect::<Map<_, _>>()
        .into()
}

fn value(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => s.clone().into(),
        Some(Kind::BoolValue(b)) => (*b).into(),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::proto::RateLimitReplace;
    use super::*;

    fn policy(unit: i32, n: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit,
            requests_per_unit: n,
            ..RateLimitPolicy::default()
        })
    }

    /// The resource and the YAML file it stands for compile into the same configuration.
    #[test]
    fn a_resource_is_the_file_it_stands_for() {
        let resource = RateLimitConfig {
            name: "edge".into(),
            domain: "edge".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    key: "remote_address".into(),
                    rate_limit: policy(2, 10),
                    ..RateLimitDescriptor::default()
                },
                RateLimitDescriptor {
                    key: "path".into(),
                    value: "/login".into(),
                    shadow_mode: true,
                    descriptors: vec![RateLimitDescriptor {
                        key: "user".into(),
                        rate_limit: Some(RateLimitPolicy {
                            unit: 1,
                            requests_per_unit: 3,
                            name: "login".into(),
                            replaces: vec![RateLimitReplace {
                                name: "other".into(),
                            }],
                            ..RateLimitPolicy::default()
                        }),
                        ..RateLimitDescriptor::default()
                    }],
                    ..RateLimitDescriptor::default()
                },
                RateLimitDescriptor {
                    key: "free".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unlimited: true,
                        ..RateLimitPolicy::default()
                    }),
                    ..RateLimitDescriptor::default()
                },
            ],
        };
        let file = "domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: /login
    shadow_mode: true
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 3, name: login, replaces: [{name: other}]}
  - key: free
    rate_limit: {unlimited: true}
";
        let from_file = config::parse(std::path::Path::new("f.yaml"), file).unwrap();
        assert_eq!(domains(&[resource], false).unwrap(), [from_file]);
    }

    #[test]
    fn a_bad_resource_is_named_with_its_field() {
        let bad = RateLimitConfig {
            name: "broken".into(),
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                rate_limit: policy(0, 5),
                ..RateLimitDescriptor::default()
            }],
        };
        let e = domains(&[bad], false).unwrap_err();
        let text = e[0].to_string();
        assert!(
            text.starts_with("xds:broken: descriptors[0].rate_limit"),
            "{text}"
        );
        // Two resources of one domain: an error, as two files are, unless merged.
        let a = RateLimitConfig {
            name: "a".into(),
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "x".into(),
                rate_limit: policy(1, 1),
                ..RateLimitDescriptor::default()
            }],
        };
        let b = RateLimitConfig {
            name: "b".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "y".into(),
                rate_limit: policy(1, 1),
                ..RateLimitDescriptor::default()
            }],
            ..a.clone()
        };
        let e = domains(&[a.clone(), b.clone()], false).unwrap_err();
        assert!(
            e[0].to_string().contains("also defined in xds:a"),
            "{}",
            e[0]
        );
        assert_eq!(domains(&[a, b], true).unwrap()[0].descriptors.len(), 2);
    }
}
