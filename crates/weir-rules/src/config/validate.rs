//! What a rule set must satisfy beyond its types: unique names and ids, exactly one of
//! `qps`, `concurrency` or `cluster` per flow rule, at most one concurrency rule per resource,
//! and each kind of rule's own checks (in the module of its kind).

use std::collections::HashSet;

use super::breaker::validate_breaker;
use super::budget::validate_budget;
use super::cost::ActualFrom;
use super::cost::EstimateFrom;
use super::fields::is_header_name;
use super::fields::is_json_path;
use super::flow::validate_flow;
use super::flow::validate_flow_cost;
use super::flow::Behavior;
use super::flow::FlowRule;
use super::hot_param::validate_hot;
use super::http::validate_http;
use super::set::cost_rules;
use super::set::ResourceConfig;
use super::set::RuleSet;
use super::set::MAX_NAME_BYTES;
use super::system::validate_system;

impl RuleSet {
    /// [`RuleSet::problems`]; without `references`, a part naming a resource not declared is
    /// not a problem (the set lacks parts that had errors: [`yaml::Completeness`]).
    pub(super) fn problems_with(&self, references: bool) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut fail = |path: String, reason: &str| out.push((path, reason.to_string()));
        let names = self.resource_names(&mut fail);
        let names = references.then_some(&names);
        let mut ids = Ids::default();
        for (i, r) in self.resources.iter().enumerate() {
            check_resource(r, &format!("resources[{i}]"), names, &mut ids, &mut fail);
        }
        if let Some(s) = &self.system {
            validate_system(s, &mut fail);
        }
        if let Some(h) = &self.http {
            validate_http(h, names, &mut fail);
        }
        out
    }

    /// The resources' names, each checked: not empty, not declared twice, not too long.
    fn resource_names(&self, fail: &mut dyn FnMut(String, &str)) -> HashSet<&str> {
        let mut names = HashSet::new();
        for (i, r) in self.resources.iter().enumerate() {
            if r.name.is_empty() || !names.insert(r.name.as_str()) {
                fail(
                    format!("resources[{i}].name"),
                    &format!("resource name {:?} empty or duplicated", r.name),
                );
            } else if r.name.len() > MAX_NAME_BYTES {
                fail(
                    format!("resources[{i}].name"),
                    &format!("longer than {MAX_NAME_BYTES} bytes"),
                );
            }
        }
        names
    }
}

/// The rule ids seen so far: each one given, and unique in the whole set.
#[derive(Default)]
struct Ids(HashSet<String>);

impl Ids {
    fn check(&mut self, path: String, id: &str, fail: &mut dyn FnMut(String, &str)) {
        if id.is_empty() {
            fail(path, "id must not be empty");
        } else if !self.0.insert(id.to_string()) {
            fail(path, &format!("duplicate rule id {id:?}"));
        }
    }
}

/// Every rule of resource `r` (at path `at`); `names`: the declared resources, when
/// references are checked.
fn check_resource(
    r: &ResourceConfig,
    at: &str,
    names: Option<&HashSet<&str>>,
    ids: &mut Ids,
    fail: &mut dyn FnMut(String, &str),
) {
    let mut concurrency = 0;
    for (j, f) in r.flow.iter().enumerate() {
        let p = format!("{at}.flow[{j}]");
        ids.check(format!("{p}.id"), &f.id, fail);
        if matches!(f.concurrency, Some(c) if c > 0) && f.qps.is_none() && f.cluster.is_none() {
            concurrency += 1;
        }
        check_flow_kind(f, &p, fail);
        if f.burst == Some(0) {
            fail(format!("{p}.burst"), "burst must be ≥ 1");
        }
        validate_flow_cost(f, &p, fail);
        validate_flow(f, &p, &r.name, names, fail);
    }
    if concurrency > 1 {
        fail(
            format!("{at}.flow"),
            "at most one concurrency rule per resource",
        );
    }
    for (j, h) in r.hot_params.iter().enumerate() {
        let p = format!("{at}.hot_params[{j}]");
        ids.check(format!("{p}.id"), &h.id, fail);
        validate_hot(h, &p, fail);
    }
    for (j, b) in r.budgets.iter().enumerate() {
        let p = format!("{at}.budgets[{j}]");
        ids.check(format!("{p}.id"), &b.id, fail);
        validate_budget(b, &p, fail);
    }
    validate_cost_sources(r, at, fail);
    if let Some(a) = &r.authority {
        ids.check(format!("{at}.authority.id"), &a.id, fail);
        if a.allow.is_empty() == a.deny.is_empty() {
            fail(
                format!("{at}.authority"),
                "give exactly one of allow or deny",
            );
        }
    }
    if let Some(sw) = &r.switch {
        ids.check(format!("{at}.switch.id"), &sw.id, fail);
    }
    if let Some(b) = &r.breaker {
        ids.check(format!("{at}.breaker.id"), &b.id, fail);
        validate_breaker(b, &format!("{at}.breaker"), fail);
    }
}

/// Exactly one of `qps`, `concurrency` or `cluster`, each with its own constraints.
fn check_flow_kind(f: &FlowRule, p: &str, fail: &mut dyn FnMut(String, &str)) {
    match (f.qps, f.concurrency, &f.cluster) {
        (Some(0), _, _) => fail(format!("{p}.qps"), "must be ≥ 1"),
        (_, Some(0), _) => fail(format!("{p}.concurrency"), "must be ≥ 1"),
        (Some(_), None, None) | (None, Some(_), None) => {}
        (None, None, Some(c)) => {
            if c.resource.is_empty() {
                fail(format!("{p}.cluster.resource"), "must not be empty");
            }
            if !(c.safe.is_finite() && c.safe > 0.0) {
                fail(
                    format!("{p}.cluster.safe"),
                    &format!("must be a rate > 0 (never 0 by accident), got {}", c.safe),
                );
            }
            if f.origin.is_some()
                || f.relate.is_some()
                || f.behavior != Behavior::Reject
                || f.window.is_some()
                || f.algorithm.is_some()
            {
                fail(
                    format!("{p}.cluster"),
                    "a cluster rule takes no origin, relate, behavior, window or algorithm",
                );
            }
        }
        _ => fail(
            p.to_string(),
            "give exactly one of qps, concurrency or cluster",
        ),
    }
}

/// The cost sources of a resource's `cost:` rules: valid header names and JSON paths, and one
/// of each per resource (an HTTP call states one estimate and one actual cost).
pub(super) fn validate_cost_sources(
    r: &ResourceConfig,
    at: &str,
    fail: &mut dyn FnMut(String, &str),
) {
    let rules = cost_rules(r, at);
    let mut estimate: Option<&EstimateFrom> = None;
    let mut actual: Option<&ActualFrom> = None;
    for (p, c) in &rules {
        if let Some(e) = &c.estimate_from {
            let (name, ok) = match e {
                EstimateFrom::Header(h) => (h, is_header_name(h)),
                EstimateFrom::Json(j) => (j, is_json_path(j)),
            };
            if !ok {
                fail(
                    format!("{p}.estimate_from"),
                    &format!("{name:?} is not a header name or dotted JSON field"),
                );
            }
            match estimate {
                Some(first) if first != e => fail(
                    format!("{p}.estimate_from"),
                    "the cost rules of one resource read the same estimate_from",
                ),
                _ => estimate = Some(e),
            }
        }
        if let Some(a) = &c.actual_from {
            let (name, ok) = match a {
                ActualFrom::Header(h) | ActualFrom::Trailer(h) => (h, is_header_name(h)),
                ActualFrom::Json(j) | ActualFrom::Sse(j) => (j, is_json_path(j)),
            };
            if !ok {
                fail(
                    format!("{p}.actual_from"),
                    &format!("{name:?} is not a header name or dotted JSON field"),
                );
            }
            match actual {
                Some(first) if first != a => fail(
                    format!("{p}.actual_from"),
                    "the cost rules of one resource read the same actual_from",
                ),
                _ => actual = Some(a),
            }
        }
    }
}
