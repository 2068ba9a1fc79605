//! The whole suite in one run: `rackmem bench` without a subcommand runs every part (floors,
//! latency, workloads, apps, control) and gathers their documents into one JSON object (each
//! part's under its name) and their charts into one SVG (stacked, each under its part's name).
//!
//! The parts write their JSON and SVG as they do when run alone; [`Report`] reads them back, so
//! a part needs no knowledge of the suite. [`run`] runs them in turn under one progress display,
//! a failed part recorded in its place while the others go on.

use crate::BenchError;
use std::path::Path;

/// The parts, in the order the suite runs them.
pub const PARTS: [&str; 5] = ["floors", "latency", "workloads", "apps", "control"];

/// What the suite gathered so far.
#[derive(Debug, Default)]
pub struct Report {
    json: serde_json::Map<String, serde_json::Value>,
    charts: Vec<(String, String)>,
}

impl Report {
    /// Adds part `name`'s JSON document and chart (files it wrote; a missing chart is skipped).
    pub fn add(&mut self, name: &str, json: &Path, svg: &Path) -> Result<(), BenchError> {
        let text = std::fs::read_to_string(json)
            .map_err(|e| BenchError::Workload(format!("part {name} wrote no JSON at {}: {e}", json.display())))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| BenchError::Workload(format!("part {name}'s JSON at {}: {e}", json.display())))?;
        self.json.insert(name.to_string(), v);
        if let Ok(s) = std::fs::read_to_string(svg) {
            self.charts.push((name.to_string(), s));
        }
        Ok(())
    }

    /// Records that part `name` failed, with why, in place of its document.
    pub fn failed(&mut self, name: &str, why: &str) {
        self.json.insert(name.to_string(), serde_json::json!({ "error": why }));
    }

    /// The JSON document: `{ "floors": …, "latency": …, … }`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::Value::Object(self.json.clone())
    }

    /// The charts stacked in one SVG.
    pub fn svg(&self) -> String {
        stack(&self.charts)
    }

    /// Writes the stacked charts to `svg` and the document to `json` (each when given).
    pub fn save(&self, json: Option<&Path>, svg: Option<&Path>) -> Result<(), BenchError> {
        if let Some(p) = svg {
            crate::output::write(p, &self.svg())?;
            eprintln!("rackmem bench: charts written to {}", p.display());
        }
        crate::output::write_json(json, &self.json())
    }
}

/// Runs every part of [`PARTS`] in turn: `run_part(part, json, svg)` runs one as if alone,
/// writing its document to `json` and its chart to `svg` (in a scratch directory of this
/// function). Returns what the parts wrote, and the parts that failed.
pub fn run<E: std::fmt::Display>(
    mut run_part: impl FnMut(&'static str, &Path, &Path) -> Result<(), E>,
) -> Result<(Report, Vec<&'static str>), BenchError> {
    let dir = std::env::temp_dir().join(format!("rackmem-bench-suite-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    let suite = crate::progress::Suite::start(PARTS.len() as u64);
    let mut report = Report::default();
    let mut failed = Vec::new();
    for part in PARTS {
        suite.overall.set_message(part);
        let (j, s) = (dir.join(format!("{part}.json")), dir.join(format!("{part}.svg")));
        let r = run_part(part, &j, &s)
            .map_err(|e| format!("{e:#}"))
            .and_then(|_| report.add(part, &j, &s).map_err(|e| e.to_string()));
        if let Err(e) = r {
            suite.overall.println(format!("rackmem bench: part {part} failed: {e}"));
            report.failed(part, &e);
            failed.push(part);
        }
        suite.overall.inc(1);
    }
    drop(suite);
    let _ = std::fs::remove_dir_all(&dir);
    Ok((report, failed))
}

/// A numeric attribute of an SVG's root element (`width="900"`).
fn attr(svg: &str, name: &str) -> Option<f64> {
    let open = &svg[svg.find("<svg")?..];
    let open = &open[..open.find('>')?];
    let at = open.find(&format!(" {name}=\""))? + name.len() + 3;
    open[at..].split('"').next()?.trim_end_matches("px").parse().ok()
}

/// SVG documents stacked top to bottom, each under a heading with its name; each keeps its own
/// coordinates (a nested `<svg>` placed at its offset).
pub fn stack(parts: &[(String, String)]) -> String {
    let heading = 28.0;
    let mut y = 0.0;
    let mut width: f64 = 400.0;
    let mut body = String::new();
    for (name, svg) in parts {
        let Some(start) = svg.find("<svg") else { continue };
        let (w, h) = (
            attr(svg, "width").unwrap_or(900.0),
            attr(svg, "height").unwrap_or(400.0),
        );
        width = width.max(w);
        body += &format!(
            "<text x=\"10\" y=\"{:.1}\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
            y + 20.0,
            name.replace('&', "&amp;").replace('<', "&lt;")
        );
        y += heading;
        body += &format!("<svg x=\"0\" y=\"{y:.1}\" {}\n", &svg[start + 4..].trim_start());
        y += h + 10.0;
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{y}\" font-family=\"sans-serif\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{body}</svg>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacked_charts_keep_their_size_and_order() {
        let a = crate::chart::svg(
            "a",
            &[crate::chart::Bar {
                group: "g".into(),
                label: "l".into(),
                fraction: 0.5,
            }],
        );
        let b = crate::chart::latency_svg("b", &[]);
        let (ha, hb) = (attr(&a, "height").expect("height"), attr(&b, "height").expect("height"));
        let s = stack(&[("workloads".into(), a), ("floors".into(), b)]);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<svg").count(), 3, "{s}");
        assert!(s.find(">workloads<") < s.find(">floors<"));
        assert_eq!(attr(&s, "height"), Some(ha + hb + 2.0 * 38.0));
        assert!(
            s.contains(&format!("<svg x=\"0\" y=\"{:.1}\"", 28.0 + ha + 10.0 + 28.0)),
            "{s}"
        );
    }
}
