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
    fn weights_priorities_comments_and_decimals() {
        let text = "# demands\nclient,wants,weight,priority\nx,10,1,SHEDDABLE\n\ny,10,3\nz,6,,critical_plus\n";
        let (names, demands) = read_demands(text.as_bytes(), "t").unwrap();
        let (out, _) = answer(10.0, Algorithm::FairShare, &names, &demands).unwrap();
        assert_eq!(out, "client,share\nx,0\ny,4\nz,6\n");
        assert_eq!(decimal(1.0 / 3.0), "0.333333333");
        assert_eq!(decimal(5.4 / 2.0 + f64::EPSILON), "2.7");
    }
}
