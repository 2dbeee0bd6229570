//! Self-contained HTML reports of the simulators (`--report FILE`): line and bar charts drawn
//! as inline SVG — no script, no external asset, readable offline and in a code review — one
//! column per configuration, side by side with `--compare`.

use std::fmt::Write;

/// One line of a chart: its name (in the legend) and its points (x, y).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its name.
    pub name: String,
    /// Its points, x increasing.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (a limit or a reference, not a measure).
    pub dashed: bool,
}

impl Series {
    /// A measured line.
    pub fn line(name: &str, points: Vec<(f64, f64)>) -> Self {
        Self {
            name: name.to_string(),
            points,
            dashed: false,
        }
    }

    /// A reference line (a limit, a capacity, a fair share).
    pub fn reference(name: &str, points: Vec<(f64, f64)>) -> Self {
        Self {
            dashed: true,
            ..Self::line(name, points)
        }
    }
}

/// One chart: lines over a shared x axis, or bars (one per x label) with `bars`.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Its title.
    pub title: String,
    /// What x is (with its unit).
    pub x: String,
    /// What y is (with its unit).
    pub y: String,
    /// The lines.
    pub series: Vec<Series>,
    /// Bars instead of lines: the labels of the x positions 0, 1, 2 …
    pub bars: Option<Vec<String>>,
}

/// One column: a configuration, its figures and its charts.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    /// The configuration, as its command line would name it.
    pub title: String,
    /// Its headline figures, (name, value).
    pub facts: Vec<(String, String)>,
    /// Its charts.
    pub charts: Vec<Chart>,
}

const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
];
/// A chart's size and margins, SVG units.
const W: f64 = 560.0;
const H: f64 = 260.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 40.0;

/// The page: `title`, then the sections side by side.
pub fn html(title: &str, sections: &[Section]) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{t}</title><style>{STYLE}</style></head><body><h1>{t}</h1><main>",
        t = escape(title)
    );
    for s in sections {
        let _ = write!(out, "<section><h2>{}</h2><table>", escape(&s.title));
        for (k, v) in &s.facts {
            let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", escape(k), escape(v));
        }
        out.push_str("</table>");
        for c in &s.charts {
            out.push_str(&svg(c));
        }
        out.push_str("</section>");
    }
    out.push_str("</main></body></html>\n");
    out
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:16px;color:#222;background:#fff}\
main{display:grid;grid-template-columns:repeat(auto-fit,minmax(580px,1fr));gap:24px}\
h1{font-size:20px}h2{font-size:16px;font-family:monospace}table{border-collapse:collapse;margin:8px 0}\
th{text-align:left;font-weight:normal;color:#555;padding:1px 12px 1px 0}td{font-family:monospace}\
figure{margin:12px 0}figcaption{font-weight:600;margin-bottom:4px}svg{max-width:100%;height:auto}\
.legend span{margin-right:14px;white-space:nowrap}.legend i{display:inline-block;width:18px;height:3px;vertical-align:middle;margin-right:4px}";

/// Where a chart's values land in its SVG: the x range and the y top.
struct Frame {
    x0: f64,
    x1: f64,
    y1: f64,
}

impl Frame {
    /// The ranges that hold every finite point of `c` (bars: one slot per label).
    fn of(c: &Chart) -> Self {
        let points = c.series.iter().flat_map(|s| s.points.iter());
        let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
        for &(x, y) in points.filter(|(x, y)| x.is_finite() && y.is_finite()) {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
        if let Some(labels) = &c.bars {
            (x0, x1) = (-0.5, labels.len() as f64 - 0.5);
        }
        if x0.partial_cmp(&x1) != Some(std::cmp::Ordering::Less) {
            (x0, x1) = (0.0, 1.0);
        }
        let y1 = nice(if y1 > 0.0 { y1 * 1.05 } else { 1.0 });
        Self { x0, x1, y1 }
    }

    fn px(&self, x: f64) -> f64 {
        LEFT + (x - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT)
    }

    fn py(&self, y: f64) -> f64 {
        TOP + (1.0 - y / self.y1) * (H - TOP - BOTTOM)
    }
}

/// One chart as a figure with an inline SVG and its legend.
fn svg(c: &Chart) -> String {
    let f = Frame::of(c);
    let mut out = String::new();
    let _ = write!(
        out,
        "<figure><figcaption>{}</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" aria-label=\"{}\">",
        escape(&c.title),
        escape(&c.title)
    );
    axes(&mut out, c, &f);
    let n = c.series.len().max(1) as f64;
    for (k, s) in c.series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        if c.bars.is_some() {
            bars(&mut out, &f, s, k, n, colour);
        } else {
            line(&mut out, &f, s, colour);
        }
    }
    out.push_str("</svg><div class=\"legend\">");
    for (k, s) in c.series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let _ = write!(
            out,
            "<span><i style=\"background:{colour}{}\"></i>{}</span>",
            if s.dashed { ";opacity:.5" } else { "" },
            escape(&s.name)
        );
    }
    out.push_str("</div></figure>");
    out
}

/// The grid, the ticks of both axes and their titles.
fn axes(out: &mut String, c: &Chart, f: &Frame) {
    for i in 0..=4 {
        let y = f.y1 * f64::from(i) / 4.0;
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#e4e4e4\"/>\
             <text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#555\">{}</text>",
            W - RIGHT,
            f.py(y),
            f.py(y),
            LEFT - 6.0,
            f.py(y) + 4.0,
            number(y)
        );
    }
    let tick = |out: &mut String, x: f64, label: &str| {
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#555\">{}</text>",
            f.px(x),
            H - BOTTOM + 14.0,
            label
        );
    };
    match &c.bars {
        Some(labels) => {
            for (i, l) in labels.iter().enumerate() {
                tick(out, i as f64, &escape(l));
            }
        }
        None => {
            for i in 0..=5 {
                let x = f.x0 + (f.x1 - f.x0) * f64::from(i) / 5.0;
                tick(out, x, &number(x));
            }
        }
    }
    let _ = write!(
        out,
        "<text x=\"{:.1}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#333\">{}</text>\
         <text x=\"12\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#333\" transform=\"rotate(-90 12 {:.1})\">{}</text>",
        (LEFT + W - RIGHT) / 2.0,
        H - 6.0,
        escape(&c.x),
        (TOP + H - BOTTOM) / 2.0,
        (TOP + H - BOTTOM) / 2.0,
        escape(&c.y)
    );
}

/// Series `s`, the `k`-th of `n`, as bars side by side within each x position.
fn bars(out: &mut String, f: &Frame, s: &Series, k: usize, n: f64, colour: &str) {
    let slot = (f.px(1.0) - f.px(0.0)) * 0.8 / n;
    for &(x, y) in s.points.iter().filter(|(_, y)| y.is_finite()) {
        let left = f.px(x) - slot * n / 2.0 + slot * k as f64;
        let _ = write!(
            out,
            "<rect x=\"{left:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{colour}\" opacity=\"{}\"/>",
            f.py(y),
            slot * 0.92,
            (f.py(0.0) - f.py(y)).max(0.0),
            if s.dashed { "0.45" } else { "0.9" }
        );
    }
}

/// Series `s` as a line.
fn line(out: &mut String, f: &Frame, s: &Series, colour: &str) {
    let path: Vec<String> = s
        .points
        .iter()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .map(|&(x, y)| format!("{:.1},{:.1}", f.px(x), f.py(y)))
        .collect();
    let _ = write!(
        out,
        "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"{}\"{} points=\"{}\"/>",
        if s.dashed { 1.5 } else { 2.0 },
        if s.dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        },
        path.join(" ")
    );
}

/// A round upper bound for an axis: 1, 2, 2.5 or 5 times a power of ten.
fn nice(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 4.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * p)
}

/// A tick's number: whole when it is, else three significant digits.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{:.3}", v)
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

/// Text for HTML (and SVG) content and attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> String {
        html(
            "a <report>",
            &[Section {
                title: "gcra \"10/s\"".into(),
                facts: vec![("admitted".into(), "10".into())],
                charts: vec![
                    Chart {
                        title: "over time".into(),
                        x: "s".into(),
                        y: "units".into(),
                        series: vec![
                            Series::line("admitted", vec![(0.0, 1.0), (1.0, 9.0)]),
                            Series::reference("limit", vec![(0.0, 10.0), (1.0, 10.0)]),
                        ],
                        bars: None,
                    },
                    Chart {
                        title: "per client".into(),
                        x: "client".into(),
                        y: "units/s".into(),
                        series: vec![Series::line("granted", vec![(0.0, 3.0), (1.0, 4.0)])],
                        bars: Some(vec!["a".into(), "b".into()]),
                    },
                ],
            }],
        )
    }

    #[test]
    fn a_page_is_self_contained_and_escaped() {
        let p = page();
        assert!(p.starts_with("<!DOCTYPE html>"));
        assert!(p.contains("<title>a &lt;report&gt;</title>"));
        assert!(p.contains("gcra &quot;10/s&quot;"));
        assert_eq!(p.matches("<svg").count(), 2);
        assert!(p.contains("stroke-dasharray"), "the limit is dashed");
        assert_eq!(p.matches("<rect").count(), 2, "one bar per client");
        // Nothing fetched: no script, no link, no src.
        for external in ["<script", "<link", "src=", "href=", "url("] {
            assert!(!p.contains(external), "{external} in the page");
        }
    }

    #[test]
    fn axes_end_on_round_numbers() {
        assert_eq!(nice(7.3), 10.0);
        assert_eq!(nice(1.2), 2.0);
        assert_eq!(nice(210.0), 250.0);
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(1000.0), "1000");
    }
}
