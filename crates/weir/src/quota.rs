//! `weir quota allocate`: the cluster-quota allocator on a CSV of demands.
//!
//! Input: `client,wants[,weight[,priority]]` per line (an optional header line starting with
//! `client`, blank lines and `#` comments skipped); weight > 0 (default 1); priority one of
//! `CRITICAL_PLUS`, `CRITICAL`, `SHEDDABLE_PLUS`, `SHEDDABLE` (default `CRITICAL`). Output:
//! `client,share` in input order, shares as decimals; the total on stderr. Any bad line is one
//! error naming it, and nothing is printed on stdout.

use std::collections::HashSet;
use std::io::BufRead;

use weir_core::Criticality;
use weir_quota::{allocate, Algorithm, Demand};

/// A line the allocator cannot use, or an unreadable input.
#[derive(Debug, thiserror::Error)]
#[error("{source_name}:{line}: {message}")]
pub struct InputError {
    /// Where the input came from.
    pub source_name: String,
    /// 1-based line number (0: the input as a whole).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Reads demands: (client names, demands) in input order.
pub fn read_demands(
    reader: impl BufRead,
    source: &str,
) -> Result<(Vec<String>, Vec<Demand>), InputError> {
    let fail = |line: usize, message: String| InputError {
        source_name: source.to_string(),
        line,
        message,
    };
    let (mut names, mut demands) = (Vec::new(), Vec::new());
    let mut seen = HashSet::new();
    for (i, line) in reader.lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|e| fail(n, format!("cannot read: {e}")))?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if demands.is_empty() && names.is_empty() && line.to_ascii_lowercase().starts_with("client")
        {
            continue; // the header
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if !(2..=4).contains(&fields.len()) {
            return Err(fail(
                n,
                format!(
                    "expected client,wants[,weight[,priority]], got {} fields",
                    fields.len()
                ),
            ));
        }
        let client = fields[0];
        if client.is_empty() {
            return Err(fail(n, "empty client".into()));
        }
        if !seen.insert(client.to_string()) {
            return Err(fail(n, format!("client {client:?} appears twice")));
        }
        let number = |what: &str, s: &str| -> Result<f64, InputError> {
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| fail(n, format!("{what} {s:?} is not a number")))
        };
        let wants = number("wants", fields[1])?;
        if wants < 0.0 {
            return Err(fail(n, format!("wants {wants} is negative")));
        }
        let weight = match fields.get(2).filter(|s| !s.is_empty()) {
            Some(s) => number("weight", s)?,
            None => 1.0,
        };
        if weight <= 0.0 {
            return Err(fail(n, format!("weight {weight} must be > 0")));
        }
        let priority = match fields.get(3).filter(|s| !s.is_empty()) {
            Some(s) => s
                .parse::<Criticality>()
                .map_err(|e| fail(n, e.to_string()))?,
            None => Criticality::Critical,
        };
        names.push(client.to_string());
        demands.push(Demand {
            wants,
            weight,
            priority,
        });
    }
    Ok((names, demands))
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

/// The CSV answer for `names` and their shares of `capacity` under `algorithm`, and the total.
pub fn answer(
    capacity: f64,
    algorithm: Algorithm,
    names: &[String],
    demands: &[Demand],
) -> Result<(String, f64), weir_quota::QuotaError> {
    let mut shares = Vec::with_capacity(demands.len());
    allocate(capacity, algorithm, demands, &mut shares)?;
    let mut out = String::from("client,share\n");
    for (name, share) in names.iter().zip(&shares) {
        out.push_str(name);
        out.push(',');
        out.push_str(&decimal(*share));
        out.push('\n');
    }
    Ok((out, shares.iter().sum()))
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

/// The report as text: the measures, then one line per second.
pub fn sim_text(r: &weir_quota::sim::Report, capacity: f64) -> String {
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
    let _ = capacity;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_example_prints_2_2_6_2_7_2_7() {
        let (names, demands) =
            read_demands("client,wants\na,2\nb,2.6\nc,4\nd,5\n".as_bytes(), "t").unwrap();
        let (out, total) = answer(10.0, Algorithm::FairShare, &names, &demands).unwrap();
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
        assert_eq!(e("# nothing\n"), "s.csv:0: no rows");
    }

    #[test]
    fn weights_priorities_comments_and_decimals() {
        let text = "# demands\nclient,wants,weight,priority\nx,10,1,SHEDDABLE\n\ny,10,3\nz,6,,critical_plus\n";
        let (names, demands) = read_demands(text.as_bytes(), "t").unwrap();
        let (out, _) = answer(10.0, Algorithm::FairShare, &names, &demands).unwrap();
        assert_eq!(out, "client,share\nx,0\ny,4\nz,6\n");
        assert_eq!(decimal(1.0 / 3.0), "0.333333333");
        assert_eq!(decimal(5.4 / 2.0 + f64::EPSILON), "2.7");
    }
}
