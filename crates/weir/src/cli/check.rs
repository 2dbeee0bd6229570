//! `weir check-config`: a Lyft, rule or quota file checked and printed with its settings in
//! force.

use std::io::{self, Write};
use std::process::ExitCode;

use weir::duration;
use weir_server::rls;

use super::args::*;
use crate::fail;

/// Which format a configuration file is in, told by its top-level keys.
pub(crate) enum Format {
    /// A weir rule file (`resources`, `system`, `http`).
    Rules,
    /// A Lyft rate-limit configuration (`domain`, `descriptors`).
    Lyft,
    /// A quota file (`resources` with `capacity`, `rlqs`).
    Quota,
}

/// The format of `path`, told by its top-level keys (Lyft: `domain`; quota: `resources` with
/// `capacity`, or `rlqs`; else rules).
pub(crate) fn detect_format(path: &std::path::Path) -> Result<Format, String> {
    if path.is_dir() {
        return Ok(Format::Lyft);
    }
    // Bounded in size and nesting like every configuration read; only the top-level keys are
    // kept.
    let text = weir_rules::yaml::read(path).map_err(|e| e.to_string())?;
    use serde::de::IgnoredAny;
    let top: std::collections::BTreeMap<String, IgnoredAny> = weir_rules::yaml::parse(path, &text)
        .map_err(|e| {
            format!("{e} (expected a YAML mapping: weir rules, a Lyft config or a quota file)")
        })?;
    let keys: Vec<&str> = top.keys().map(String::as_str).collect();
    let has = |k: &str| keys.contains(&k);
    // A quota file's resources have a capacity; a rule file's never do (only the keys of
    // each resource are read, whatever their values).
    #[derive(serde::Deserialize)]
    struct Probe {
        resources: Vec<std::collections::BTreeMap<String, IgnoredAny>>,
    }
    let quota_resources = has("resources")
        && weir_rules::yaml::parse::<Probe>(path, &text)
            .is_ok_and(|p| p.resources.iter().any(|r| r.contains_key("capacity")));
    if has("rlqs") || (quota_resources && !has("system") && !has("http")) {
        return Ok(Format::Quota);
    }
    match (
        has("resources") || has("system") || has("http"),
        has("domain") || has("descriptors"),
    ) {
        (true, false) => Ok(Format::Rules),
        (false, true) => Ok(Format::Lyft),
        (true, true) => Err(format!(
            "{}: mixes weir rule keys (resources, system, http) with Lyft keys (domain, descriptors)",
            path.display()
        )),
        (false, false) => Err(format!(
            "{}: cannot tell the format: expected top-level `resources`, `system` or `http` (weir rules), `domain` and `descriptors` (Lyft rate-limit config) or `resources` with `capacity` and `rlqs` (quota file); or say it with --kind",
            path.display()
        )),
    }
}

/// `weir check-config`: the file's format (`--kind`, else detected), then its check.
pub(crate) fn run_check_config(args: CheckConfigArgs) -> ExitCode {
    let format = match args.kind.as_deref() {
        Some("rules") => Ok(Format::Rules),
        Some("lyft") => Ok(Format::Lyft),
        Some("quota") => Ok(Format::Quota),
        _ => detect_format(&args.path),
    };
    match format {
        Err(e) => fail(e),
        Ok(Format::Rules) => check_rules(&args.path),
        Ok(Format::Lyft) => check_lyft(&args),
        Ok(Format::Quota) => check_quota(&args.path),
    }
}

/// A quota file: every resource with its settings in force (defaults filled in).
pub(crate) fn check_quota(path: &std::path::Path) -> ExitCode {
    let config = match weir_quota::config::QuotaConfig::load(path) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("weir: error: {e}");
            }
            return ExitCode::from(2);
        }
    };
    for w in config.warnings() {
        eprintln!("weir: warning: {}: {w}", path.display());
    }
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "weir quota: {}", path.display());
    let _ = write!(out, "{}", config.describe());
    ExitCode::SUCCESS
}

/// A rule file: every resource and rule with its settings in force, the routes and switches.
pub(crate) fn check_rules(path: &std::path::Path) -> ExitCode {
    let set = match weir_rules::watch::load(path) {
        Ok(s) => s,
        Err(weir_rules::watch::LoadError::Invalid(errors)) => {
            // One line per error, each with its location.
            for e in &errors.0 {
                eprintln!("weir: error: {e}");
            }
            return ExitCode::from(2);
        }
        Err(e) => return fail(e),
    };
    // Compiling catches what only the algorithms know (e.g. a window too short).
    if let Err(e) = weir_rules::engine::Rules::new(&set) {
        return fail(format_args!("{}: {e}", path.display()));
    }
    // Every rule as in force (presets filled in), in weir-rules' wording, the dashboard's.
    // Switch states set at run time (`PUT /api/v1/switches/…`) are kept beside the file and
    // win over it: shown as in force.
    let state = weir_server::admin::switches::state_path(path);
    let overrides = match state.exists() {
        true => match weir_server::admin::switches::load(&state) {
            Ok(o) => o,
            Err(e) => return fail(e),
        },
        false => Default::default(),
    };
    let rows = weir_rules::describe::rows_in_force(&set, &overrides);
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "weir rules: {}", path.display());
    let line = |row: &weir_rules::describe::RuleRow| {
        let shadow = if row.shadow { " [shadow]" } else { "" };
        format!("{}: {}{shadow}", row.id, row.detail)
    };
    // Rows come resource by resource in file order, the system rule last.
    let mut rows = rows.iter().peekable();
    for r in &set.resources {
        let _ = writeln!(out, "resource {}", r.name);
        while let Some(row) = rows.next_if(|row| row.kind != "system" && row.resource == r.name) {
            let _ = writeln!(out, "  {} {}", row.kind, line(row));
        }
    }
    for row in rows {
        let _ = writeln!(
            out,
            "system (inbound calls): {}",
            line(row).trim_start_matches("system: ")
        );
    }
    if let Some(h) = &set.http {
        for r in &h.routes {
            let methods = if r.methods.is_empty() {
                "*".to_string()
            } else {
                r.methods.join(",")
            };
            let _ = writeln!(out, "route {methods} {} -> {}", r.prefix, r.resource);
            if let Some(f) = &r.fallback {
                let on = if f.on.is_empty() {
                    "every block".to_string()
                } else {
                    f.on.join(", ")
                };
                let what = match (&f.upstream, &f.body_file, &f.body) {
                    (Some(u), _, _) => format!("forwarded to {u}"),
                    (None, Some(file), _) => format!("{} with the body of {file}", f.status),
                    (None, None, Some(b)) => format!("{} with a {}-byte body", f.status, b.len()),
                    (None, None, None) => format!("{} without a body", f.status),
                };
                let _ = writeln!(out, "  fallback on {on}: {what}");
            }
        }
    }
    ExitCode::SUCCESS
}

/// A Lyft file (or a directory of them): every domain's descriptors with their limits.
pub(crate) fn check_lyft(args: &CheckConfigArgs) -> ExitCode {
    match rls::config::load(&args.path, args.merge_domains) {
        Ok(domains) => {
            let engine = match rls::Engine::build(
                &domains,
                rls::EngineOptions::default(),
                std::sync::Arc::new(rls::MemoryStore::default()),
                None,
            ) {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("weir: error: {e}");
                    return ExitCode::from(2);
                }
            };
            let mut out = io::stdout().lock();
            for d in &domains {
                let _ = writeln!(out, "domain {}", d.domain);
                for r in engine
                    .rules()
                    .iter()
                    .filter(|r| r.id.starts_with(&format!("{}.", d.domain)))
                {
                    let l = &r.limit;
                    let what = if l.unlimited {
                        "unlimited".to_string()
                    } else if l.denies_all() {
                        format!(
                            "0 per {}: every request over the limit",
                            duration::format_duration(l.window)
                        )
                    } else {
                        format!(
                            "{} per {} ({}{})",
                            l.requests_per_unit,
                            duration::format_duration(l.window),
                            l.algorithm.as_str(),
                            l.burst.map(|b| format!(", burst {b}")).unwrap_or_default()
                        )
                    };
                    let _ = writeln!(
                        out,
                        "  {}: {what}{}{}{}",
                        r.id,
                        if r.shadow { " [shadow]" } else { "" },
                        if r.quota_mode { " [quota mode]" } else { "" },
                        l.name
                            .as_ref()
                            .map(|n| format!(" name={n}"))
                            .unwrap_or_default()
                    );
                }
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in errors {
                eprintln!("weir: error: {e}");
            }
            ExitCode::from(2)
        }
    }
}
