//! A whole rule set and its resources: parsed from YAML (every error located at its field),
//! the routes' fallback bodies read beside the file, and checked (`validate.rs`).

use std::path::Path;

use serde::Deserialize;

use crate::yaml;
use crate::yaml::LocatedErrors;

use super::authority::AuthorityRule;
use super::breaker::BreakerRule;
use super::budget::BudgetRule;
use super::cost::CostRule;
use super::cost::CostSources;
use super::flow::FlowRule;
use super::hot_param::HotParamRule;
use super::http::HttpConfig;
use super::http::MAX_FALLBACK_BYTES;
use super::switch::SwitchRule;
use super::system::SystemRule;

/// A whole rule set.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RuleSet {
    /// The resources.
    #[serde(default)]
    pub resources: Vec<ResourceConfig>,
    /// Rules on all inbound traffic together.
    pub system: Option<SystemRule>,
    /// How HTTP requests map to resources (weir-tower's `RulesLayer`, `weir proxy`).
    pub http: Option<HttpConfig>,
}

/// One resource (an endpoint, a method, a dependency) and its rules.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    /// The resource's name, as `entry` is called with it.
    pub name: String,
    /// Flow rules (all must admit).
    #[serde(default)]
    pub flow: Vec<FlowRule>,
    /// Per-parameter-value limits.
    #[serde(default)]
    pub hot_params: Vec<HotParamRule>,
    /// Allow or deny list of origins.
    pub authority: Option<AuthorityRule>,
    /// A circuit breaker.
    pub breaker: Option<BreakerRule>,
    /// A switch that turns the resource off by hand (degradation).
    pub switch: Option<SwitchRule>,
    /// Calendar budgets: units per day, week or month ([`BudgetRule`]).
    #[serde(default)]
    pub budgets: Vec<BudgetRule>,
}

/// Longest resource name (bytes): names become metric labels, dashboard rows and, for
/// cluster rules, lease-server resources (which bound names the same).
pub const MAX_NAME_BYTES: usize = 256;

impl RuleSet {
    /// Parses and validates a YAML rule set. A file that is not of the right shape reports
    /// every field of the wrong type or with an impossible value ([`yaml::parse_all`]); a
    /// file that parses reports every rule that breaks a constraint, each located at its
    /// field.
    pub fn from_yaml(file: &Path, text: &str) -> Result<Self, LocatedErrors> {
        let mut set: RuleSet = yaml::parse_checked(file, text, |set: &RuleSet, whole| {
            set.problems_with(whole != yaml::Completeness::ElementsSetAside)
        })?;
        let problems = set.load_fallback_bodies(file);
        yaml::located(file, text, problems).map_or(Ok(set), Err)
    }

    /// Reads every route's `fallback.body_file` (relative to `file`'s directory, at most
    /// [`MAX_FALLBACK_BYTES`]); the problems as (field path, reason).
    fn load_fallback_bodies(&mut self, file: &Path) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let dir = file.parent().unwrap_or(Path::new("."));
        let routes = self.http.iter_mut().flat_map(|h| h.routes.iter_mut());
        for (i, r) in routes.enumerate() {
            let Some(f) = r.fallback.as_mut() else {
                continue;
            };
            let Some(name) = &f.body_file else { continue };
            let path = dir.join(name);
            let at = format!("http.routes[{i}].fallback.body_file");
            match std::fs::read(&path) {
                Ok(b) if b.len() <= MAX_FALLBACK_BYTES => f.loaded = Some(b.into()),
                Ok(b) => out.push((
                    at,
                    format!(
                        "{}: {} bytes, at most {MAX_FALLBACK_BYTES}",
                        path.display(),
                        b.len()
                    ),
                )),
                Err(e) => out.push((at, format!("{}: {e}", path.display()))),
            }
        }
        out
    }

    /// Checks what the types cannot (see [`RuleSet::problems`]); answers the first problem as
    /// (field path, reason).
    pub fn validate(&self) -> Result<(), (String, String)> {
        match self.problems().into_iter().next() {
            Some(p) => Err(p),
            None => Ok(()),
        }
    }

    /// Every constraint the types cannot express that this set breaks, as (field path,
    /// reason): unique names and ids, exactly one of `qps` / `concurrency`, at most one
    /// concurrency rule per resource, non-zero thresholds, ratios in [0, 1], options that fit
    /// the behaviour, declared resources in `relate` and routes, valid CIDR blocks, header
    /// names and route prefixes.
    pub fn problems(&self) -> Vec<(String, String)> {
        self.problems_with(true)
    }
}

/// The `cost:` rules of `r` with where each is found (`resources[i].flow[j].cost`, …).
pub(super) fn cost_rules<'a>(r: &'a ResourceConfig, at: &str) -> Vec<(String, &'a CostRule)> {
    let flows = r.flow.iter().enumerate().filter_map(|(j, f)| {
        f.cost
            .as_deref()
            .map(|c| (format!("{at}.flow[{j}].cost"), c))
    });
    let hot = r.hot_params.iter().enumerate().filter_map(|(j, h)| {
        h.cost
            .as_deref()
            .map(|c| (format!("{at}.hot_params[{j}].cost"), c))
    });
    let budgets = r.budgets.iter().enumerate().filter_map(|(j, b)| {
        b.cost
            .as_deref()
            .map(|c| (format!("{at}.budgets[{j}].cost"), c))
    });
    flows.chain(hot).chain(budgets).collect()
}

impl ResourceConfig {
    /// Whether any of its `cost:` rules learns its estimate (`estimate: learned`).
    pub fn learns_costs(&self) -> bool {
        cost_rules(self, "").iter().any(|(_, c)| c.learns())
    }

    /// Where HTTP calls to this resource state their costs: the first `estimate_from` and
    /// `actual_from` among its `cost:` rules (a valid set states at most one of each).
    pub fn cost_sources(&self) -> CostSources {
        let rules = cost_rules(self, "");
        CostSources {
            estimate: rules.iter().find_map(|(_, c)| c.estimate_from.clone()),
            actual: rules.iter().find_map(|(_, c)| c.actual_from.clone()),
        }
    }
}
