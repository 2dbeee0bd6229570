//! The quota configuration: the resources a lease server divides.
//!
//! ```yaml
//! resources:
//!   - name: search                 # one resource
//!     capacity: 1000/s             # units per second (also 60000/m, 1000, 2.5/s)
//!     algorithm: fair_share        # or proportional_share, static (default fair_share)
//!     lease: 30s                   # default 30s
//!     refresh: 5s                  # default 5s, at most the lease
//!     safe_capacity: 50/s          # per client when the server is unreachable
//!                                  # (default: capacity ÷ clients last seen)
//!   - name: "tenant-*"             # a template: each name it matches is its own resource,
//!     capacity: 100/s              # created on first use
//!   - {name: org-acme, capacity: 1000/s}                  # nested: org ⊃ team ⊃ user,
//!   - {name: "team-*", parent: org-acme, capacity: 400/s} # leased by the path of a leaf
//!   - {name: "user-*", parent: "org-acme/team-*", capacity: 50/s, weight: 2}
//! clients:                         # optional: who may ask, with what weight ([`crate::clients`])
//!   - {id: "checkout-*", weight: 3, priority: CRITICAL_PLUS, token_sha256: 9f86d0…}
//! ```
//!
//! Errors name the file, line, column and field (every validation error of a file at once),
//! as every configuration of Weir does.

use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use weir_rules::yaml::{self, LocatedErrors};

use crate::allocate::Division;
use crate::clients::{parse_digest, ClientRule};
use crate::lease::ResourceConfig;

mod nesting;

/// Longest resource name (bytes) a quota file may declare and a client may ask for.
pub const MAX_RESOURCE_NAME: usize = 256;

/// The `rlqs` section of a quota file.
#[derive(Debug, Clone, PartialEq)]
pub struct RlqsConfig {
    /// Only this domain is served (`None`: any).
    pub domain: Option<String>,
    /// A bucket's token bucket holds this much time of its share (at least one token).
    pub burst: Duration,
    /// A bucket without requests for this long is abandoned (Envoy forgets it).
    pub idle: Duration,
    /// Most buckets tracked per stream (one Envoy).
    pub max_buckets_per_stream: usize,
    /// Most buckets tracked in total.
    pub max_buckets: usize,
    /// First match wins.
    pub buckets: Vec<BucketRule>,
}

impl Default for RlqsConfig {
    fn default() -> Self {
        Self {
            domain: None,
            burst: Duration::from_secs(1),
            idle: Duration::from_secs(60),
            max_buckets_per_stream: 10_000,
            max_buckets: 100_000,
            buckets: Vec::new(),
        }
    }
}

/// A bucket id's value in a [`BucketRule`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValuePattern {
    /// `*`: any value (usable as `{key}` in the resource name).
    Any,
    /// This value only.
    Exact(String),
}

/// What a matched bucket draws from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketTarget {
    /// A resource; `{key}` is replaced by the bucket's value of `key` (so `user-{user}` with
    /// a template `user-*` gives every user its own capacity).
    Resource(String),
    /// Never limited (ALLOW_ALL).
    Unlimited,
}

/// Buckets whose id has every key of `matches` (with a matching value) draw from `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketRule {
    /// Keys and values the bucket id must have (other keys are ignored).
    pub matches: Vec<(String, ValuePattern)>,
    /// What it draws from.
    pub target: BucketTarget,
}

/// Most levels of nested resources (a root and the levels under it).
pub const MAX_LEVELS: usize = 8;

/// One level of nested resources: a group (levels under it) or, without levels under it, a
/// resource clients lease by its path (`org-acme/team-search/user-bob`).
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    /// Its name at this level, or a template with one `*`.
    pub name: String,
    /// Its capacity (and, for a leaf, its lease parameters).
    pub config: ResourceConfig,
    /// Its weight among its siblings (> 0).
    pub weight: f64,
    /// Levels under it, in file order (empty: a leaf).
    pub children: Vec<Level>,
}

impl Level {
    /// Whether clients lease it (no level under it).
    pub fn is_leaf(&self) -> bool {
        self.children.is_empty()
    }
}

/// A whole quota configuration.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QuotaConfig {
    /// Resources by exact name, in file order.
    pub resources: Vec<(String, ResourceConfig)>,
    /// Templates: a name with one `*`, matched against names no exact resource has.
    pub templates: Vec<(String, ResourceConfig)>,
    /// Nested resources: the top level of each family (an entry of the file with entries
    /// naming it as `parent`), in file order.
    pub nested: Vec<Level>,
    /// Envoy's RLQS buckets and the resources they draw from (`None`: RLQS not served).
    pub rlqs: Option<std::sync::Arc<RlqsConfig>>,
    /// Who may ask for leases, in file order (empty: anyone, weight 1, CRITICAL).
    pub clients: Vec<ClientRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    resources: Vec<RawResource>,
    #[serde(default)]
    rlqs: Option<RawRlqs>,
    #[serde(default)]
    clients: Option<Vec<RawClient>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    id: String,
    #[serde(default)]
    token_sha256: Option<String>,
    #[serde(default)]
    weight: Option<f64>,
    #[serde(default)]
    priority: Option<String>,
    #[serde(default)]
    own_values: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRlqs {
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    burst: Option<String>,
    #[serde(default)]
    idle: Option<String>,
    #[serde(default)]
    max_buckets_per_stream: Option<usize>,
    #[serde(default)]
    max_buckets: Option<usize>,
    #[serde(default)]
    buckets: Vec<RawBucket>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBucket {
    #[serde(rename = "match")]
    matches: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    unlimited: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResource {
    name: String,
    capacity: serde_yaml_value::Value,
    #[serde(default)]
    parent: Option<String>,
    #[serde(default)]
    weight: Option<f64>,
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    lease: Option<String>,
    #[serde(default)]
    refresh: Option<String>,
    #[serde(default)]
    safe_capacity: Option<serde_yaml_value::Value>,
}

/// YAML scalars as serde sees them (a number or a string like `1000/s`).
mod serde_yaml_value {
    /// A number or a string.
    #[derive(Debug, Clone, PartialEq, serde::Deserialize)]
    #[serde(untagged)]
    pub enum Value {
        /// A plain number (units per second).
        Number(f64),
        /// `N/s`, `N/m`, `N/h`.
        Text(String),
    }
}

/// Why a value is not a rate.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RateError {
    /// Not a number, nor `N/UNIT`.
    #[error("{0:?}: expected a rate like 1000/s, 600/m or 2.5")]
    Number(String),
    /// A unit other than `s`, `m` and `h`.
    #[error("{text:?}: unknown unit {unit:?} (expected s, m or h)")]
    Unit {
        /// The value given.
        text: String,
        /// Its unit.
        unit: String,
    },
    /// Negative, infinite or not a number.
    #[error("{0} is not a rate ≥ 0")]
    Range(f64),
}

/// Parses a rate: a number (per second) or `N/s`, `N/m`, `N/h`; finite and ≥ 0.
pub fn parse_rate(v: &serde_yaml_value::Value) -> Result<f64, RateError> {
    let rate = match v {
        serde_yaml_value::Value::Number(n) => *n,
        serde_yaml_value::Value::Text(s) => {
            let (n, per) = s.split_once('/').unwrap_or((s, "s"));
            let n: f64 = n.trim().parse().map_err(|_| RateError::Number(s.clone()))?;
            let secs = match per.trim() {
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                other => {
                    return Err(RateError::Unit {
                        text: s.clone(),
                        unit: other.to_string(),
                    })
                }
            };
            n / secs
        }
    };
    if rate.is_finite() && rate >= 0.0 {
        Ok(rate)
    } else {
        Err(RateError::Range(rate))
    }
}

/// The `rlqs` section, checked against the resources already read.
fn parse_rlqs(
    r: &RawRlqs,
    config: &QuotaConfig,
    problems: &mut Vec<(String, String)>,
) -> RlqsConfig {
    let mut out = RlqsConfig {
        domain: r.domain.clone(),
        ..RlqsConfig::default()
    };
    let mut duration = |field: &str, v: &Option<String>, into: &mut Duration| {
        if let Some(s) = v {
            match weir_rules::config::parse_duration(s) {
                Some(d) => *into = d,
                None => problems.push((
                    format!("rlqs.{field}"),
                    format!("{s:?}: expected a positive duration like 1s or 1m"),
                )),
            }
        }
    };
    duration("burst", &r.burst, &mut out.burst);
    duration("idle", &r.idle, &mut out.idle);
    for (field, v, into) in [
        (
            "max_buckets_per_stream",
            r.max_buckets_per_stream,
            &mut out.max_buckets_per_stream,
        ),
        ("max_buckets", r.max_buckets, &mut out.max_buckets),
    ] {
        match v {
            Some(0) => problems.push((format!("rlqs.{field}"), "must be ≥ 1".into())),
            Some(n) => *into = n,
            None => {}
        }
    }
    for (i, b) in r.buckets.iter().enumerate() {
        let at = |field: &str| format!("rlqs.buckets[{i}].{field}");
        if b.matches.is_empty() {
            problems.push((at("match"), "give at least one key of the bucket id".into()));
        }
        let matches: Vec<(String, ValuePattern)> = b
            .matches
            .iter()
            .map(|(k, v)| {
                let p = if v == "*" {
                    ValuePattern::Any
                } else {
                    ValuePattern::Exact(v.clone())
                };
                (k.clone(), p)
            })
            .collect();
        let target = match (&b.resource, b.unlimited) {
            (Some(_), true) | (None, false) => {
                problems.push((
                    at("resource"),
                    "give exactly one of resource or unlimited: true".into(),
                ));
                BucketTarget::Unlimited
            }
            (None, true) => BucketTarget::Unlimited,
            (Some(name), false) => {
                // `{key}` takes the bucket's value of `key`, which must be matched by `*`.
                let mut sample = name.clone();
                for (k, p) in &matches {
                    if *p == ValuePattern::Any {
                        sample = sample.replace(&format!("{{{k}}}"), "x");
                    }
                }
                if sample.contains('{') || sample.contains('}') {
                    problems.push((
                        at("resource"),
                        format!("{name:?}: every {{key}} must be a key matched by \"*\""),
                    ));
                } else if config.resource(&sample).is_none() {
                    problems.push((
                        at("resource"),
                        format!("{name:?}: no resource or template of this file covers it"),
                    ));
                }
                BucketTarget::Resource(name.clone())
            }
        };
        out.buckets.push(BucketRule { matches, target });
    }
    out
}

/// The `clients` section.
fn parse_clients(raw: &[RawClient], problems: &mut Vec<(String, String)>) -> Vec<ClientRule> {
    raw.iter()
        .enumerate()
        .map(|(i, c)| {
            let at = |field: &str| format!("clients[{i}].{field}");
            let mut rule = ClientRule {
                id: c.id.clone(),
                own_values: c.own_values,
                ..ClientRule::anyone()
            };
            if c.id.is_empty() || c.id.matches('*').count() > 1 || c.id.len() > 256 {
                problems.push((
                    at("id"),
                    "a client id of 1 to 256 bytes, at most one `*`".into(),
                ));
            }
            if let Some(t) = &c.token_sha256 {
                match parse_digest(t) {
                    Some(d) => rule.token_sha256 = Some(d),
                    None => problems.push((
                        at("token_sha256"),
                        "64 hex digits: the SHA-256 of the token (sha256sum prints it)".into(),
                    )),
                }
            }
            if let Some(w) = c.weight {
                if w.is_finite() && w > 0.0 && w <= crate::lease::MAX_WEIGHT {
                    rule.weight = w;
                } else {
                    problems.push((at("weight"), format!("{w}: a number > 0 and ≤ 1000000")));
                }
            }
            if let Some(p) = &c.priority {
                match p.parse() {
                    Ok(p) => rule.priority = p,
                    Err(e) => problems.push((at("priority"), format!("{e}"))),
                }
            }
            rule
        })
        .collect()
}

impl QuotaConfig {
    /// The settings in force, defaults filled in, one line per resource, template and RLQS
    /// bucket rule (what `weir check-config` prints for a quota file).
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let rows = self
            .resources
            .iter()
            .map(|r| ("resource", r))
            .chain(self.templates.iter().map(|t| ("template", t)));
        for (what, (name, c)) in rows {
            let _ = writeln!(
                out,
                "{what} {name}: {}/s, {}, lease {}, refresh {}, safe capacity {}",
                c.capacity,
                c.algorithm.as_str(),
                secs(c.lease),
                secs(c.refresh),
                safe(c),
            );
        }
        for l in &self.nested {
            describe_level(&mut out, l, 0);
        }
        if let Some(r) = &self.rlqs {
            describe_rlqs(&mut out, r);
        }
        self.describe_clients(&mut out);
        out
    }

    /// Who may ask, with what weight and priority, and whether a token is required.
    fn describe_clients(&self, out: &mut String) {
        if self.clients.is_empty() {
            let _ = writeln!(
                out,
                "clients: anyone, weight 1, CRITICAL (weights and priorities clients send are ignored)"
            );
            return;
        }
        for c in &self.clients {
            let _ = writeln!(
                out,
                "client {}: weight {}, {}{}{}",
                c.id,
                c.weight,
                c.priority.as_str(),
                if c.own_values {
                    ", or the weight and priority it sends"
                } else {
                    ""
                },
                if c.token_sha256.is_some() {
                    ", bearer token required"
                } else {
                    ", no token"
                },
            );
        }
        let _ = writeln!(out, "clients no entry covers are refused");
    }

    /// What the file allows that is likely a mistake, one line each (`weir check-config`
    /// prints them; `weir serve --quota` logs them): a `clients` entry with `own_values` and
    /// no token lets any caller claiming a matching id choose its own weight, priority, parts
    /// and failover term — e.g. take a whole capacity with one heavy part.
    pub fn warnings(&self) -> Vec<String> {
        self.clients
            .iter()
            .filter(|c| c.own_values && c.token_sha256.is_none())
            .map(|c| {
                format!(
                    "clients: {:?} has own_values: true and no token_sha256: any caller claiming such an id chooses its own weight, priority and parts (give it a token)",
                    c.id
                )
            })
            .collect()
    }

    /// Parses and validates a quota file's text, reporting type errors and broken constraints
    /// in one run (`weir_rules::yaml::parse_checked`).
    pub fn from_yaml(file: &Path, text: &str) -> Result<Self, LocatedErrors> {
        let mut built = None;
        let raw: RawConfig = yaml::parse_checked(file, text, |raw: &RawConfig, whole| {
            let (config, mut problems) = Self::from_raw(raw);
            if whole == yaml::Completeness::ElementsSetAside {
                // A parent may be named by a resource that was set aside.
                problems.retain(|(path, _)| !path.ends_with(".parent"));
            }
            built = Some(config);
            problems
        })?;
        Ok(built.unwrap_or_else(|| Self::from_raw(&raw).0))
    }

    /// The configuration `raw` describes, and the constraints it breaks as (field path,
    /// reason).
    fn from_raw(raw: &RawConfig) -> (Self, Vec<(String, String)>) {
        let mut problems: Vec<(String, String)> = Vec::new();
        let mut out = QuotaConfig::default();
        let mut names = std::collections::HashSet::new();
        let mut parsed = Vec::with_capacity(raw.resources.len());
        for (i, r) in raw.resources.iter().enumerate() {
            let at = |field: &str| format!("resources[{i}].{field}");
            if r.name.is_empty() || r.name.matches('*').count() > 1 {
                problems.push((at("name"), "a name, with at most one `*`".into()));
            } else if r.name.len() > MAX_RESOURCE_NAME {
                problems.push((
                    at("name"),
                    format!("longer than {} bytes", MAX_RESOURCE_NAME),
                ));
            } else if r.name.contains('/') {
                problems.push((
                    at("name"),
                    format!(
                        "{:?}: `/` separates the levels of nested resources; nest with parent:",
                        r.name
                    ),
                ));
            } else if r.parent.is_none() && !names.insert(r.name.clone()) {
                problems.push((at("name"), format!("{:?} is declared twice", r.name)));
            }
            let mut c = ResourceConfig::default();
            match parse_rate(&r.capacity) {
                Ok(v) => c.capacity = v,
                Err(e) => problems.push((at("capacity"), e.to_string())),
            }
            if let Some(a) = &r.algorithm {
                match a.parse::<Division>() {
                    Ok(a) => c.algorithm = a,
                    Err(e) => problems.push((at("algorithm"), e.to_string())),
                }
            }
            let mut duration = |field: &str, v: &Option<String>, into: &mut Duration| {
                if let Some(s) = v {
                    match weir_rules::config::parse_duration(s) {
                        Some(d) => *into = d,
                        None => problems.push((
                            at(field),
                            format!("{s:?}: expected a positive duration like 5s or 1m"),
                        )),
                    }
                }
            };
            duration("lease", &r.lease, &mut c.lease);
            duration("refresh", &r.refresh, &mut c.refresh);
            if c.refresh > c.lease {
                problems.push((at("refresh"), "must not be longer than the lease".into()));
            }
            if let Some(v) = &r.safe_capacity {
                match parse_rate(v) {
                    Ok(v) => c.safe_capacity = Some(v),
                    Err(e) => problems.push((at("safe_capacity"), e.to_string())),
                }
            }
            parsed.push(c);
        }
        let nesting = nesting::resolve(&raw.resources, &parsed, &mut problems);
        for (i, (r, c)) in raw.resources.iter().zip(parsed).enumerate() {
            if nesting.nested[i] {
                continue;
            }
            if r.weight.is_some() {
                problems.push((
                    format!("resources[{i}].weight"),
                    "a weight among siblings applies to nested resources (with parent:)".into(),
                ));
            }
            if r.name.contains('*') {
                out.templates.push((r.name.clone(), c));
            } else {
                out.resources.push((r.name.clone(), c));
            }
        }
        out.nested = nesting.roots;
        if let Some(r) = &raw.rlqs {
            out.rlqs = Some(std::sync::Arc::new(parse_rlqs(r, &out, &mut problems)));
        }
        if let Some(clients) = &raw.clients {
            if clients.is_empty() {
                problems.push((
                    "clients".into(),
                    "an empty list would refuse every client; remove the section to allow anyone"
                        .into(),
                ));
            }
            out.clients = parse_clients(clients, &mut problems);
        }
        (out, problems)
    }

    /// Reads and validates a quota file.
    pub fn load(file: &Path) -> Result<Self, LocatedErrors> {
        let text = yaml::read(file)?;
        Self::from_yaml(file, &text)
    }

    /// The levels a nested path goes through (`org-acme/team-search/user-bob`), from the top:
    /// at each level the entry of that exact name, else the first template matching it.
    /// `None` when a segment matches nothing (or is empty).
    pub fn levels(&self, path: &str) -> Option<Vec<&Level>> {
        let mut out = Vec::new();
        let mut siblings = &self.nested;
        for segment in path.split('/') {
            if segment.is_empty() || out.len() == MAX_LEVELS {
                return None;
            }
            let l = siblings.iter().find(|l| l.name == segment).or_else(|| {
                siblings
                    .iter()
                    .find(|l| crate::pattern::matches(&l.name, segment))
            })?;
            out.push(l);
            siblings = &l.children;
        }
        Some(out)
    }

    /// The capacity and weight of each level of nested path `name`, from the top (`None`: not
    /// a leased nested resource).
    pub(crate) fn level_params(&self, name: &str) -> Option<Vec<(f64, f64)>> {
        let levels = self.levels(name)?;
        levels.last()?.is_leaf().then(|| {
            levels
                .iter()
                .map(|l| (l.config.capacity, l.weight))
                .collect()
        })
    }

    /// Whether `name` is a group of nested resources (clients lease the leaves under it).
    pub fn is_group(&self, name: &str) -> bool {
        self.levels(name)
            .is_some_and(|l| l.last().is_some_and(|l| !l.is_leaf()))
    }

    /// Whether `name` is declared as it is (not made from a template): an exact resource, or a
    /// nested path whose every level is named exactly.
    pub fn is_named(&self, name: &str) -> bool {
        if name.contains('/') {
            return self.levels(name).is_some_and(|levels| {
                levels
                    .iter()
                    .zip(name.split('/'))
                    .all(|(l, segment)| l.name == segment)
            });
        }
        self.resources.iter().any(|(n, _)| n == name)
    }

    /// The parameters of resource `name`: its own, else the first template matching it; for
    /// a nested path, its leaf's (a group is not leased).
    pub fn resource(&self, name: &str) -> Option<ResourceConfig> {
        if name.contains('/') {
            let levels = self.levels(name)?;
            let leaf = levels.last()?;
            return leaf.is_leaf().then_some(leaf.config);
        }
        if let Some((_, c)) = self.resources.iter().find(|(n, _)| n == name) {
            return Some(*c);
        }
        self.templates
            .iter()
            .find_map(|(pattern, c)| crate::pattern::matches(pattern, name).then_some(*c))
    }
}

/// A duration as `describe` writes it (`1.5s`).
fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// A leased resource's safe capacity as `describe` writes it.
fn safe(c: &ResourceConfig) -> String {
    c.safe_capacity.map_or_else(
        || "capacity ÷ clients last seen".to_string(),
        |s| format!("{s}/s"),
    )
}

/// A nested resource and the levels under it, indented by `depth`.
fn describe_level(out: &mut String, l: &Level, depth: usize) {
    let indent = "  ".repeat(depth);
    let what = if depth == 0 { "nested " } else { "" };
    let leaf = if l.is_leaf() {
        format!(
            ", leased: lease {}, refresh {}, safe capacity {}",
            secs(l.config.lease),
            secs(l.config.refresh),
            safe(&l.config)
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "{indent}{what}{}: {}/s, weight {}{leaf}",
        l.name, l.config.capacity, l.weight
    );
    for c in &l.children {
        describe_level(out, c, depth + 1);
    }
}

/// The RLQS settings and each bucket rule's match and target.
fn describe_rlqs(out: &mut String, r: &RlqsConfig) {
    let _ = writeln!(
        out,
        "rlqs: domain {}, burst {}, idle {}, at most {} buckets per stream and {} in all",
        r.domain.as_deref().unwrap_or("(any)"),
        secs(r.burst),
        secs(r.idle),
        r.max_buckets_per_stream,
        r.max_buckets
    );
    for b in &r.buckets {
        let m: Vec<String> = b
            .matches
            .iter()
            .map(|(k, v)| match v {
                ValuePattern::Any => format!("{k}=*"),
                ValuePattern::Exact(x) => format!("{k}={x}"),
            })
            .collect();
        let to = match &b.target {
            BucketTarget::Resource(r) => format!("resource {r}"),
            BucketTarget::Unlimited => "unlimited (ALLOW_ALL)".to_string(),
        };
        let _ = writeln!(out, "  bucket {{{}}} -> {to}", m.join(", "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_templates_and_defaults() {
        let c = QuotaConfig::from_yaml(
            Path::new("q.yaml"),
            "resources:\n  - {name: search, capacity: 1000/s, lease: 10s, refresh: 2s}\n  - {name: 'tenant-*', capacity: 6000/m, algorithm: static, safe_capacity: 5}\n",
        )
        .unwrap();
        let s = c.resource("search").unwrap();
        assert_eq!(
            (s.capacity, s.lease, s.refresh),
            (1000.0, Duration::from_secs(10), Duration::from_secs(2))
        );
        let t = c.resource("tenant-acme").unwrap();
        assert_eq!(
            (t.capacity, t.algorithm, t.safe_capacity),
            (100.0, Division::Static, Some(5.0))
        );
        assert_eq!(c.resource("other"), None);
        assert_eq!(c.resource("tenant-"), Some(t));
    }

    #[test]
    fn rlqs_buckets_map_to_resources_and_errors_are_located() {
        let c = QuotaConfig::from_yaml(
            Path::new("q.yaml"),
            "resources:\n  - {name: search, capacity: 100}\n  - {name: 'user-*', capacity: 10}\nrlqs:\n  idle: 2m\n  buckets:\n    - {match: {name: per_user, user: '*'}, resource: 'user-{user}'}\n    - {match: {name: search}, resource: search}\n    - {match: {name: open}, unlimited: true}\n",
        )
        .unwrap();
        let r = c.rlqs.unwrap();
        assert_eq!(r.idle, Duration::from_secs(120));
        assert_eq!(r.buckets.len(), 3);
        assert_eq!(r.buckets[2].target, BucketTarget::Unlimited);
        let e = QuotaConfig::from_yaml(
            Path::new("q.yaml"),
            "resources:\n  - {name: search, capacity: 100}\nrlqs:\n  max_buckets: 0\n  buckets:\n    - {match: {name: a, user: bob}, resource: 'user-{user}'}\n    - {match: {name: b}, resource: nope}\n    - {match: {}, unlimited: true, resource: search}\n",
        )
        .unwrap_err()
        .to_string();
        for needle in [
            "q.yaml:4:16: rlqs.max_buckets: must be ≥ 1",
            "q.yaml:6:47: rlqs.buckets[0].resource: \"user-{user}\": every {key}",
            "q.yaml:7:36: rlqs.buckets[1].resource: \"nope\": no resource",
            "rlqs.buckets[2].match: give at least one key",
            "rlqs.buckets[2].resource: give exactly one",
        ] {
            assert!(e.contains(needle), "{needle} in {e}");
        }
    }

    #[test]
    fn every_error_is_located() {
        let e = QuotaConfig::from_yaml(
            Path::new("q.yaml"),
            "resources:\n  - name: a\n    capacity: lots\n  - name: b\n    capacity: 5/d\n    refresh: 1m\n    algorithm: fair\n",
        )
        .unwrap_err()
        .to_string();
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), 4, "{e}");
        assert!(
            lines[0].starts_with("q.yaml:3:15: resources[0].capacity: \"lots\""),
            "{e}"
        );
        assert!(
            lines[1].starts_with("q.yaml:5:15: resources[1].capacity: \"5/d\": unknown unit"),
            "{e}"
        );
        assert!(
            lines[2].starts_with("q.yaml:6:14: resources[1].refresh: must not be longer"),
            "{e}"
        );
        assert!(
            lines[3].starts_with("q.yaml:7:16: resources[1].algorithm: unknown algorithm"),
            "{e}"
        );
        // A type error does not hide the broken constraints of the rest.
        let e = QuotaConfig::from_yaml(
            Path::new("q.yaml"),
            "resources:\n  - {name: a, capacity: 5/s, weight: heavy}\n  - {name: b, capacity: 5/s}\n  - {name: b, capacity: 5/s}\n",
        )
        .unwrap_err()
        .to_string();
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), 2, "{e}");
        assert!(
            lines[0]
                .starts_with("q.yaml:2:38: resources[0].weight: expected a number, got \"heavy\""),
            "{e}"
        );
        assert!(
            lines[1].starts_with("q.yaml:4:12: resources[2].name: \"b\" is declared twice"),
            "{e}"
        );
        let e = QuotaConfig::from_yaml(
            Path::new("q.yaml"),
            "resources:\n  - {name: a, capacity: 1, bogus: 2}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("q.yaml:2:") && e.contains("bogus"), "{e}");
    }

    #[test]
    fn nested_resources_resolve_by_path() {
        let c = QuotaConfig::from_yaml(
            Path::new("q.yaml"),
            "resources:\n  - {name: search, capacity: 10}\n  - {name: org-acme, capacity: 1000/s}\n  - {name: 'team-*', parent: org-acme, capacity: 400/s}\n  - {name: team-core, parent: org-acme, capacity: 600/s, weight: 2}\n  - {name: 'user-*', parent: 'org-acme/team-*', capacity: 50/s, lease: 10s}\n  - {name: 'user-*', parent: org-acme/team-core, capacity: 100/s}\n",
        )
        .unwrap();
        assert_eq!(c.resources.len(), 1);
        assert_eq!(c.nested.len(), 1);
        let bob = c.resource("org-acme/team-ads/user-bob").unwrap();
        assert_eq!((bob.capacity, bob.lease), (50.0, Duration::from_secs(10)));
        // The exact name wins over the template at its level.
        let levels = c.levels("org-acme/team-core/user-bob").unwrap();
        let caps: Vec<f64> = levels.iter().map(|l| l.config.capacity).collect();
        assert_eq!(caps, [1000.0, 600.0, 100.0]);
        assert_eq!(levels[1].weight, 2.0);
        // Groups are not leased; unknown levels resolve to nothing.
        assert_eq!(c.resource("org-acme"), None);
        assert_eq!(c.resource("org-acme/team-ads"), None);
        assert!(c.is_group("org-acme") && c.is_group("org-acme/team-ads"));
        assert_eq!(c.resource("org-other/team-ads/user-bob"), None);
        assert_eq!(c.resource("org-acme/team-ads/user-bob/more"), None);
        assert_eq!(c.resource("org-acme//user-bob"), None);
        assert!(!c.is_named("org-acme/team-core/user-x"));
        assert!(!c.is_named("org-acme/team-ads/user-bob"));
        let d = c.describe();
        assert!(d.contains("nested org-acme: 1000/s"), "{d}");
        assert!(
            d.contains("    user-*: 50/s, weight 1, leased: lease 10s"),
            "{d}"
        );
    }

    #[test]
    fn nesting_errors_are_located() {
        let e = QuotaConfig::from_yaml(
            Path::new("q.yaml"),
            "resources:\n  - {name: org, capacity: 100, lease: 5s}\n  - {name: team, parent: org, capacity: 200}\n  - {name: a, parent: b, capacity: 1}\n  - {name: b, parent: a, capacity: 1}\n  - {name: x, parent: nowhere, capacity: 1}\n  - {name: team, parent: org, capacity: 1}\n  - {name: u/v, capacity: 1}\n  - {name: flat, capacity: 1, weight: 2}\n  - {name: w, parent: org, capacity: 1, algorithm: static, weight: 0}\n",
        )
        .unwrap_err()
        .to_string();
        for needle in [
            "q.yaml:2:39: resources[0].lease: a group is not leased itself",
            "q.yaml:3:41: resources[1].capacity: 200/s is more than its parent \"org\" has (100/s)",
            "q.yaml:4:23: resources[2].parent: a cycle of parents: a → b → a",
            "q.yaml:5:23: resources[3].parent: a cycle of parents: b → a → b",
            "q.yaml:6:23: resources[4].parent: \"nowhere\": no resource has this path",
            "q.yaml:7:12: resources[5].name: \"org/team\" is declared twice",
            "q.yaml:8:12: resources[6].name: \"u/v\": `/` separates",
            "q.yaml:9:39: resources[7].weight: a weight among siblings",
            "q.yaml:10:52: resources[8].algorithm: nested resources are divided by fair_share",
            "q.yaml:10:68: resources[8].weight: 0: a number > 0",
        ] {
            assert!(e.contains(needle), "{needle} in\n{e}");
        }
        // Deeper than MAX_LEVELS.
        let mut text = String::from("resources:\n  - {name: l0, capacity: 1}\n");
        let mut parent = String::from("l0");
        for i in 1..=MAX_LEVELS {
            text.push_str(&format!(
                "  - {{name: l{i}, parent: {parent}, capacity: 1}}\n"
            ));
            parent = format!("{parent}/l{i}");
        }
        let e = QuotaConfig::from_yaml(Path::new("q.yaml"), &text)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "resources[{MAX_LEVELS}].parent: nested deeper than {MAX_LEVELS} levels"
            )),
            "{e}"
        );
    }
}
