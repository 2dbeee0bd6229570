//! `weir quota allocate`: the cluster-quota allocator on a CSV of demands.
//!
//! Input: `client,wants[,weight[,priority]]` per line (blank lines and `#` comments skipped);
//! weight > 0 (default 1); priority one of `CRITICAL_PLUS`, `CRITICAL`, `SHEDDABLE_PLUS`,
//! `SHEDDABLE` (default `CRITICAL`). A first line starting with `client` is a header naming
//! the columns, in any order: `client`, `wants`, `weight`, `priority`, and for nested quotas
//! `parent` and `capacity` — a row with a `capacity` (`none`: no cap) is a group (an org, a
//! team), a row with
//! `wants` a client; `parent` names the group a row is under (empty: the top, of
//! `--capacity`), and the shares are nested max-min ([`weir_quota::hierarchy`]). Output:
//! `client,share` in input order (a group's share: what its rows get together), shares as
//! decimals; the total on stderr. Any bad line is one error naming it, and nothing is printed
//! on stdout.

use std::collections::{HashMap, HashSet};
use std::io::BufRead;

use weir_core::Criticality;
use weir_quota::forest::{loop_from, loop_message, Forest};
use weir_quota::hierarchy::{Node, Tree};
use weir_quota::{allocate, Demand, Division};

/// A line the allocator cannot use, or an unreadable input.
#[derive(Debug, thiserror::Error)]
#[error("{source_name}:{}", place(*line, message))]
pub struct InputError {
    /// Where the input came from.
    pub source_name: String,
    /// 1-based line number (0: the input as a whole).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// `N: message`, or ` message` for the input as a whole (line 0).
fn place(line: usize, message: &str) -> String {
    if line == 0 {
        format!(" {message}")
    } else {
        format!("{line}: {message}")
    }
}

/// The columns an input may name in its header.
const COLUMNS: [&str; 6] = [
    "client", "wants", "weight", "priority", "parent", "capacity",
];

/// One row of the input: a client's demand, or (nested input) a group's capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The client's (or group's) name.
    pub name: String,
    /// 1-based line number.
    pub line: usize,
    /// A client's demand (`None`: a group).
    pub demand: Option<Demand>,
    /// A group's capacity.
    pub capacity: Option<f64>,
    /// The group the row is under (`None`: the top).
    pub parent: Option<String>,
    /// A group's weight among its siblings.
    pub weight: f64,
}

/// The rows of an input, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Demands {
    /// Every row.
    pub rows: Vec<Row>,
    /// Some row names a parent or a capacity: the shares are nested.
    pub nested: bool,
}

/// Reads demands (see the module documentation).
pub fn read_demands(reader: impl BufRead, source: &str) -> Result<Demands, InputError> {
    let fail = |line: usize, message: String| InputError {
        source_name: source.to_string(),
        line,
        message,
    };
    let mut columns: Vec<usize> = vec![0, 1, 2, 3];
    let mut rows: Vec<Row> = Vec::new();
    let mut seen = HashSet::new();
    let mut first = true;
    for (i, line) in reader.lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|e| fail(n, format!("cannot read: {e}")))?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if std::mem::take(&mut first) && line.to_ascii_lowercase().starts_with("client") {
            columns = header(line).map_err(|e| fail(n, e))?;
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        rows.push(row(&fields, &columns, n, &mut seen).map_err(|e| fail(n, e))?);
    }
    let nested = rows
        .iter()
        .any(|r| r.parent.is_some() || r.capacity.is_some());
    Ok(Demands { rows, nested })
}

/// The columns a header names (indices into [`COLUMNS`]).
fn header(line: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for name in line.split(',').map(|c| c.trim().to_ascii_lowercase()) {
        let Some(c) = COLUMNS.iter().position(|k| *k == name) else {
            return Err(format!(
                "unknown column {name:?} (columns: {})",
                COLUMNS.join(", ")
            ));
        };
        if out.contains(&c) {
            return Err(format!("column {name:?} appears twice"));
        }
        out.push(c);
    }
    if !out.contains(&0) {
        return Err("the header names no client column".into());
    }
    Ok(out)
}

/// One data line, its fields in the header's `columns`.
fn row(
    fields: &[&str],
    columns: &[usize],
    n: usize,
    seen: &mut HashSet<String>,
) -> Result<Row, String> {
    if fields.len() > columns.len() || fields.len() < 2 {
        let names: Vec<&str> = columns.iter().map(|&c| COLUMNS[c]).collect();
        let expected = if columns == [0, 1, 2, 3] {
            "client,wants[,weight[,priority]]".to_string()
        } else {
            names.join(",")
        };
        return Err(format!("expected {expected}, got {} fields", fields.len()));
    }
    let field = |column: usize| -> Option<&str> {
        columns
            .iter()
            .position(|&c| c == column)
            .and_then(|i| fields.get(i).copied())
            .filter(|s| !s.is_empty())
    };
    let number = |what: &str, s: &str| -> Result<f64, String> {
        s.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| format!("{what} {s:?} is not a number"))
    };
    let client = field(0).ok_or("empty client")?;
    if !seen.insert(client.to_string()) {
        return Err(format!("client {client:?} appears twice"));
    }
    let wants = field(1).map(|s| number("wants", s)).transpose()?;
    let capacity = match field(5) {
        Some("none") => Some(f64::INFINITY),
        other => other.map(|s| number("capacity", s)).transpose()?,
    };
    match (wants, capacity) {
        (Some(w), _) if w < 0.0 => return Err(format!("wants {w} is negative")),
        (_, Some(c)) if c < 0.0 => return Err(format!("capacity {c} is negative")),
        (Some(_), Some(_)) => {
            return Err("give wants (a client) or capacity (a group), not both".into())
        }
        (None, None) => return Err("give wants (a client) or capacity (a group)".into()),
        _ => {}
    }
    let weight = field(2)
        .map(|s| number("weight", s))
        .transpose()?
        .unwrap_or(1.0);
    if weight <= 0.0 {
        return Err(format!("weight {weight} must be > 0"));
    }
    let priority = match field(3) {
        Some(s) => s.parse::<Criticality>().map_err(|e| e.to_string())?,
        None => Criticality::Critical,
    };
    Ok(Row {
        name: client.to_string(),
        line: n,
        demand: wants.map(|wants| Demand {
            wants,
            weight,
            priority,
        }),
        capacity,
        parent: field(4).map(str::to_string),
        weight,
    })
}

/// A share as a short decimal: 9 decimal places at most, trailing zeros dropped (`2.7`, `3`).
pub fn decimal(x: f64) -> String {
    let s = format!("{x:.9}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// The CSV answer for `input`'s rows and their shares of `capacity` under `algorithm`, and the
/// total; an error names the line (`source`) or the allocator's complaint.
pub fn answer(
    capacity: f64,
    algorithm: Division,
    input: &Demands,
    source: &str,
) -> Result<(String, f64), InputError> {
    let fail = |line: usize, message: String| InputError {
        source_name: source.to_string(),
        line,
        message,
    };
    let shares = if input.nested {
        if algorithm != Division::FairShare {
            return Err(fail(
                0,
                "nested quotas are divided by fair_share (nested weighted max-min)".into(),
            ));
        }
        nested_shares(capacity, &input.rows).map_err(|(line, m)| fail(line, m))?
    } else {
        let demands: Vec<Demand> = input.rows.iter().filter_map(|r| r.demand).collect();
        let mut shares = Vec::with_capacity(demands.len());
        allocate(capacity, algorithm, &demands, &mut shares).map_err(|e| fail(0, e.to_string()))?;
        shares
    };
    let mut out = String::from("client,share\n");
    for (row, share) in input.rows.iter().zip(&shares) {
        out.push_str(&row.name);
        out.push(',');
        out.push_str(&decimal(*share));
        out.push('\n');
    }
    let total = input
        .rows
        .iter()
        .zip(&shares)
        .filter(|(r, _)| r.parent.is_none())
        .map(|(_, s)| s)
        .sum();
    Ok((out, total))
}

/// Every row's share of `capacity` by nested max-min: a client's its own, a group's the sum of
/// its rows'. Errors: (line, message).
fn nested_shares(capacity: f64, rows: &[Row]) -> Result<Vec<f64>, (usize, String)> {
    let index: HashMap<&str, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    let mut parent_of = vec![None; rows.len()];
    for (i, r) in rows.iter().enumerate() {
        let Some(p) = &r.parent else {
            continue;
        };
        let &pi = index
            .get(p.as_str())
            .ok_or_else(|| (r.line, format!("parent {p:?} is not a row of this input")))?;
        if rows[pi].demand.is_some() {
            return Err((
                r.line,
                format!("parent {p:?} is a client (it has wants): only groups, rows with a capacity, have rows under them"),
            ));
        }
        if let (Some(c), Some(pc)) = (r.capacity, rows[pi].capacity) {
            if c > pc {
                return Err((
                    r.line,
                    format!("capacity {c} is more than its parent {p:?} has ({pc})"),
                ));
            }
        }
        parent_of[i] = Some(pi);
    }
    let forest = Forest::from_parents(parent_of);
    if let Some(i) = forest.first_unreachable() {
        // Every entry no root reaches is in a loop or under one: name the loop, at its line.
        let cycle = loop_from(i, |at| forest.parent[at]).unwrap_or_else(|| vec![i]);
        return Err((
            rows[cycle[0]].line,
            loop_message(cycle.iter().map(|&c| rows[c].name.as_str())),
        ));
    }
    let Forest { children, parent } = forest;
    let top: Vec<usize> = (0..rows.len()).filter(|&i| parent[i].is_none()).collect();
    fn node(i: usize, rows: &[Row], children: &[Vec<usize>], order: &mut Vec<usize>) -> Node {
        order.push(i);
        match rows[i].demand {
            Some(d) => Node::Leaf(d),
            None => Node::Group {
                capacity: rows[i].capacity.unwrap_or(f64::INFINITY),
                weight: rows[i].weight,
                children: children[i]
                    .iter()
                    .map(|&c| node(c, rows, children, order))
                    .collect(),
            },
        }
    }
    let mut order = Vec::new();
    let root = Node::group(
        capacity,
        top.iter()
            .map(|&i| node(i, rows, &children, &mut order))
            .collect(),
    );
    let tree = Tree::new(&root).map_err(|e| (0, e.to_string()))?;
    let leaf_shares = tree.allocate();
    let mut shares = vec![0.0; rows.len()];
    let mut leaf = leaf_shares.into_iter();
    for &i in &order {
        if rows[i].demand.is_some() {
            shares[i] = leaf.next().unwrap_or(0.0);
        }
    }
    // Groups: what their rows get, deepest first (children come after their parent).
    for &i in order.iter().rev() {
        if rows[i].demand.is_none() {
            shares[i] = children[i].iter().map(|&c| shares[c]).sum();
        }
    }
    Ok(shares)
}

/// Reads a `weir simulate quota` scenario: `t_ms,client,demand` per line (an optional header,
/// blank lines and `#` comments skipped); demand in units/s, or `leave` (the client gives its
/// lease back and stops). Times must not go backwards.
pub fn read_scenario(
    reader: impl BufRead,
    source: &str,
) -> Result<Vec<weir_quota::sim::Shift>, InputError> {
    let fail = |line: usize, message: String| InputError {
        source_name: source.to_string(),
        line,
        message,
    };
    let mut out: Vec<weir_quota::sim::Shift> = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|e| fail(n, format!("cannot read: {e}")))?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || (out.is_empty() && line.starts_with("t_ms"))
        {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let [t, client, demand] = f[..] else {
            return Err(fail(
                n,
                format!("expected t_ms,client,demand, got {} fields", f.len()),
            ));
        };
        let t: u64 = t
            .parse()
            .map_err(|_| fail(n, format!("t_ms {t:?} is not a whole number of ms")))?;
        if client.is_empty() {
            return Err(fail(n, "empty client".into()));
        }
        let demand = if demand == "leave" {
            None
        } else {
            let d: f64 = demand
                .parse()
                .ok()
                .filter(|d: &f64| d.is_finite() && *d >= 0.0)
                .ok_or_else(|| {
                    fail(
                        n,
                        format!("demand {demand:?}: expected units/s ≥ 0 or `leave`"),
                    )
                })?;
            Some(d)
        };
        let at = std::time::Duration::from_millis(t);
        if out.last().is_some_and(|p| p.at > at) {
            return Err(fail(n, format!("t_ms {t} goes back in time")));
        }
        out.push(weir_quota::sim::Shift {
            at,
            client: client.to_string(),
            demand,
        });
    }
    if out.is_empty() {
        return Err(fail(0, "no rows".into()));
    }
    Ok(out)
}

/// A tree simulation's report as one JSON object.
pub fn tree_json(r: &weir_quota::sim_tree::TreeReport, capacity: f64) -> String {
    let opt = |v: Option<f64>| v.map_or("null".to_string(), |v| format!("{v:.4}"));
    format!(
        "{{\"utilisation\":{:.4},\"peak_ratio\":{:.4},\"max_fairness_error\":{:.3},\"fairness_error_ratio\":{:.5},\"misplaced_ratio\":{:.5},\"converge_ms\":{:?},\"converge_ms_max\":{},\"reconverge_ms\":{},\"bound_ms\":{},\"cut_peak_ratio\":{},\"cut_mean_ratio\":{}}}",
        r.utilisation,
        r.peak_ratio,
        r.max_fairness_error,
        r.max_fairness_error / capacity,
        r.max_misplaced_ratio,
        r.converge_ms,
        r.converge_ms_max,
        r.reconverge_ms.map_or("null".to_string(), |m| m.to_string()),
        r.bound_ms,
        opt(r.cut_peak_ratio),
        opt(r.cut_mean_ratio),
    )
}

/// A tree simulation's report for people.
pub fn tree_text(r: &weir_quota::sim_tree::TreeReport, capacity: f64) -> String {
    let mut out = format!(
        "utilisation under excess demand {:.1} %\npeak {:.1} % of capacity\nfairness error at most {:.1} units/s ({:.2} % of capacity) against one flat server; capacity misplaced at most {:.2} %\nconvergence after each demand change: {:?} ms (bound {} ms: 3 refresh intervals per level)\n",
        100.0 * r.utilisation,
        100.0 * r.peak_ratio,
        r.max_fairness_error,
        100.0 * r.max_fairness_error / capacity,
        100.0 * r.max_misplaced_ratio,
        r.converge_ms,
        r.bound_ms
    );
    if let (Some(p), Some(m)) = (r.cut_peak_ratio, r.cut_mean_ratio) {
        out.push_str(&format!(
            "region cut off: peak {:.1} %, mean {:.1} % of capacity; back to the shares {} ms after it ends\n",
            100.0 * p,
            100.0 * m,
            r.reconverge_ms.unwrap_or(0)
        ));
    }
    out
}

/// The report as one JSON object.
pub fn sim_json(r: &weir_quota::sim::Report) -> String {
    let opt = |v: Option<f64>| v.map_or("null".to_string(), |v| format!("{v:.4}"));
    format!(
        "{{\"utilisation\":{:.4},\"peak_ratio\":{:.4},\"max_fairness_error\":{:.3},\"converge_ms_p99\":{},\"converge_ms\":{:?},\"server_down_peak_ratio\":{},\"server_down_mean_ratio\":{}}}",
        r.utilisation,
        r.peak_ratio,
        r.max_fairness_error,
        r.converge_ms_p99,
        r.converge_ms,
        opt(r.down_peak_ratio),
        opt(r.down_mean_ratio)
    )
}

/// The report's measures, as text (what `weir simulate quota` prints on stderr, beside the
/// CSV on stdout: `> out.csv` is a CSV file).
pub fn sim_summary(r: &weir_quota::sim::Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "utilisation (granted / capacity while demand > capacity): {:.2} %",
        r.utilisation * 100.0
    );
    let _ = writeln!(
        s,
        "peak admitted / capacity (any second): {:.2} %",
        r.peak_ratio * 100.0
    );
    let _ = writeln!(
        s,
        "max fairness error (outside 2 refresh intervals after a shift): {:.3} units/s",
        r.max_fairness_error
    );
    let _ = writeln!(
        s,
        "converge after a shift: p99 {} ms (each: {:?})",
        r.converge_ms_p99, r.converge_ms
    );
    if let (Some(peak), Some(mean)) = (r.down_peak_ratio, r.down_mean_ratio) {
        let _ = writeln!(
            s,
            "server down: admitted mean {:.2} %, peak {:.2} % of capacity",
            mean * 100.0,
            peak * 100.0
        );
    }
    s
}

/// The report's seconds as CSV: a header, then one line per second.
pub fn sim_csv(r: &weir_quota::sim::Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "t_s,demand,granted,admitted,fairness_error,server");
    for x in &r.seconds {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{}",
            x.t,
            decimal(x.demand),
            decimal(x.granted),
            decimal(x.admitted),
            decimal((x.fairness_error * 1000.0).round() / 1000.0),
            if x.down { "down" } else { "up" }
        );
    }
    s
}

/// The report's column for one quota simulation (`--report`): demand, grants and admitted
/// units beside the capacity, the fairness error second by second, and each client's grant
/// beside its exact max-min share at the end.
pub fn sim_report_section(
    settings: &weir_quota::sim::Settings,
    r: &weir_quota::sim::Report,
) -> crate::report::Section {
    use crate::report::{Chart, Section, Series};
    let capacity = settings.resource.capacity;
    let per = |f: fn(&weir_quota::sim::Second) -> f64| -> Vec<(f64, f64)> {
        r.seconds.iter().map(|s| (s.t as f64 + 1.0, f(s))).collect()
    };
    let end = r.seconds.len() as f64;
    let labels: Vec<String> = r.clients.iter().map(|c| c.name.clone()).collect();
    let bars = |f: fn(&weir_quota::sim::ClientShare) -> f64| -> Vec<(f64, f64)> {
        r.clients
            .iter()
            .enumerate()
            .map(|(i, c)| (i as f64, f(c)))
            .collect()
    };
    let mut facts = vec![
        (
            "utilisation under excess demand".into(),
            format!("{:.4}", r.utilisation),
        ),
        (
            "peak admitted ÷ capacity".into(),
            format!("{:.4}", r.peak_ratio),
        ),
        (
            "largest fairness error".into(),
            format!("{:.2} units/s", r.max_fairness_error),
        ),
        (
            "convergence after a shift, p99".into(),
            format!("{} ms", r.converge_ms_p99),
        ),
    ];
    if let (Some(peak), Some(mean)) = (r.down_peak_ratio, r.down_mean_ratio) {
        facts.push((
            "server down: peak, mean ÷ capacity".into(),
            format!("{peak:.4}, {mean:.4}"),
        ));
    }
    Section {
        title: format!(
            "{} {}/s, lease {}s, refresh {}s",
            settings.resource.algorithm.as_str(),
            capacity,
            settings.resource.lease.as_secs_f64(),
            settings.resource.refresh.as_secs_f64()
        ),
        facts,
        charts: vec![
            Chart {
                title: "Units per second, all clients".into(),
                x: "second".into(),
                y: "units/s".into(),
                series: vec![
                    Series::line("demand", per(|s| s.demand)),
                    Series::line("granted", per(|s| s.granted)),
                    Series::line("admitted", per(|s| s.admitted)),
                    Series::reference("capacity", vec![(0.0, capacity), (end, capacity)]),
                ],
                bars: None,
            },
            Chart {
                title: "Fairness error: the largest |grant − max-min share| of a client".into(),
                x: "second".into(),
                y: "units/s".into(),
                series: vec![Series::line("fairness error", per(|s| s.fairness_error))],
                bars: None,
            },
            Chart {
                title: format!(
                    "Second {}, the last of excess demand (else the last): each client's grant beside its max-min share",
                    r.clients_at + 1
                ),
                x: "client".into(),
                y: "units/s".into(),
                series: vec![
                    Series::line("granted", bars(|c| c.granted)),
                    Series::reference("max-min share", bars(|c| c.share)),
                    Series::reference("demand", bars(|c| c.demand)),
                ],
                bars: Some(labels),
            },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_example_prints_2_2_6_2_7_2_7() {
        let input = read_demands("client,wants\na,2\nb,2.6\nc,4\nd,5\n".as_bytes(), "t").unwrap();
        let (out, total) = answer(10.0, Division::FairShare, &input, "t").unwrap();
        assert_eq!(out, "client,share\na,2\nb,2.6\nc,2.7\nd,2.7\n");
        assert!((total - 10.0).abs() < 1e-9);
    }

    #[test]
    fn bad_lines_are_named() {
        let e = |text: &str| {
            read_demands(text.as_bytes(), "in.csv")
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e("a,1\nb\n"),
            "in.csv:2: expected client,wants[,weight[,priority]], got 1 fields"
        );
        assert_eq!(e("a,x\n"), "in.csv:1: wants \"x\" is not a number");
        assert_eq!(e("a,-1\n"), "in.csv:1: wants -1 is negative");
        assert_eq!(e("a,1,0\n"), "in.csv:1: weight 0 must be > 0");
        assert!(e("a,1,1,URGENT\n").starts_with("in.csv:1: unknown criticality"));
        assert_eq!(e("a,1\na,2\n"), "in.csv:2: client \"a\" appears twice");
        assert_eq!(e("a,inf\n"), "in.csv:1: wants \"inf\" is not a number");
    }

    #[test]
    fn scenarios_read_rows_and_name_bad_lines() {
        let s = read_scenario(
            "t_ms,client,demand\n0,a,10\n500,b,2.5\n900,a,leave\n".as_bytes(),
            "s",
        )
        .unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[2].demand, None);
        assert_eq!(s[1].at, std::time::Duration::from_millis(500));
        let e = |t: &str| {
            read_scenario(t.as_bytes(), "s.csv")
                .unwrap_err()
                .to_string()
        };
        assert_eq!(e("5,a,1\n4,b,1\n"), "s.csv:2: t_ms 4 goes back in time");
        assert_eq!(
            e("0,a,-1\n"),
            "s.csv:1: demand \"-1\": expected units/s ≥ 0 or `leave`"
        );
        assert_eq!(
            e("x,a,1\n"),
            "s.csv:1: t_ms \"x\" is not a whole number of ms"
        );
        assert_eq!(e("# nothing\n"), "s.csv: no rows");
    }

    #[test]
    fn weights_priorities_comments_and_decimals() {
        let text = "# demands\nclient,wants,weight,priority\nx,10,1,SHEDDABLE\n\ny,10,3\nz,6,,critical_plus\n";
        let input = read_demands(text.as_bytes(), "t").unwrap();
        let (out, _) = answer(10.0, Division::FairShare, &input, "t").unwrap();
        assert_eq!(out, "client,share\nx,0\ny,4\nz,6\n");
        assert_eq!(decimal(1.0 / 3.0), "0.333333333");
        assert_eq!(decimal(5.4 / 2.0 + f64::EPSILON), "2.7");
    }
}
