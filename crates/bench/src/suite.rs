//! The whole suite in one run: `rackmem bench` without a subcommand runs every part (floors,
//! latency, workloads, apps, control) and gathers their documents into one JSON object (each
//! part's under its name) and their charts into one SVG (one drawing area split between them,
//! each under its part's name: [`crate::chart::stack`]).
//!
//! Each part hands back its [`Output`] as when run alone: its JSON and its chart as data, so a
//! part needs no knowledge of the suite. [`run`] runs them in turn under one progress display,
//! a failed part recorded in its place while the others go on.

use crate::chart::Chart;
use crate::{BenchError, Output};
use std::path::Path;

/// The parts, in the order the suite runs them.
pub const PARTS: [&str; 5] = ["floors", "latency", "workloads", "apps", "control"];

/// What the suite gathered so far.
#[derive(Debug, Default)]
pub struct Report {
    json: serde_json::Map<String, serde_json::Value>,
    charts: Vec<(String, Chart)>,
}

impl Report {
    /// Adds part `name`'s JSON document and chart (a part without a chart adds none).
    pub fn add(&mut self, name: &str, out: Output) {
        self.json.insert(name.to_string(), out.json);
        if let Some(c) = out.chart {
            self.charts.push((name.to_string(), c));
        }
    }

    /// Records that part `name` failed, with why, in place of its document.
    pub fn failed(&mut self, name: &str, why: &str) {
        self.json.insert(name.to_string(), serde_json::json!({ "error": why }));
    }

    /// The JSON document: `{ "floors": …, "latency": …, … }`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::Value::Object(self.json.clone())
    }

    /// The charts, one under the other, in one SVG document.
    pub fn svg(&self) -> String {
        crate::chart::stack(&self.charts)
    }

    /// Writes the charts to `svg` and the document to `json` (each when given).
    pub fn save(&self, json: Option<&Path>, svg: Option<&Path>) -> Result<(), BenchError> {
        if let Some(p) = svg {
            crate::output::write(p, &self.svg())?;
            eprintln!("rackmem bench: charts written to {}", p.display());
        }
        crate::output::write_json(json, &self.json())
    }
}

/// Runs every part of [`PARTS`] in turn: `run_part(part)` runs one as if alone and hands back
/// its output. Returns what the parts handed back, and the parts that failed.
pub fn run<E: std::fmt::Display>(
    mut run_part: impl FnMut(&'static str) -> Result<Output, E>,
) -> (Report, Vec<&'static str>) {
    let suite = crate::progress::Suite::start(PARTS.len() as u64);
    let mut report = Report::default();
    let mut failed = Vec::new();
    for part in PARTS {
        suite.overall.set_message(part);
        match run_part(part) {
            Ok(out) => report.add(part, out),
            Err(e) => {
                let e = format!("{e:#}");
                suite.overall.println(format!("rackmem bench: part {part} failed: {e}"));
                report.failed(part, &e);
                failed.push(part);
            }
        }
        suite.overall.inc(1);
    }
    drop(suite);
    (report, failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::{Bar, LatencyBar};

    #[test]
    fn the_report_draws_every_part_that_has_a_chart_in_order() {
        let mut r = Report::default();
        let bars = vec![Bar {
            group: "scan".into(),
            label: "rackmem 25%".into(),
            fraction: 0.5,
        }];
        let rows = vec![LatencyBar {
            label: "uffd floor".into(),
            p50_us: 7.0,
            p99_us: 9.0,
        }];
        r.add(
            "floors",
            Output {
                chart: Some(crate::chart::latencies("floors chart", rows)),
                json: serde_json::json!({"floors": 1}),
                text: String::new(),
            },
        );
        r.add(
            "model",
            Output {
                chart: None,
                json: serde_json::json!(2),
                text: String::new(),
            },
        );
        r.failed("apps", "no sqlite3");
        r.add(
            "workloads",
            Output {
                chart: Some(crate::chart::fractions("workloads chart", bars)),
                json: serde_json::json!([3]),
                text: String::new(),
            },
        );
        let j = r.json();
        assert_eq!(j["floors"]["floors"], 1);
        assert_eq!(j["model"], 2);
        assert_eq!(j["apps"]["error"], "no sqlite3");
        let p = crate::chart::tests::parse(&r.svg());
        let at = |t: &str| p.texts.iter().position(|x| x == t);
        for t in [
            "floors",
            "floors chart",
            "uffd floor",
            "workloads",
            "workloads chart",
            "scan · rackmem 25%",
        ] {
            assert!(at(t).is_some(), "{t} missing: {:?}", p.texts);
        }
        assert!(at("floors") < at("workloads"));
        assert!(at("model").is_none() && at("apps").is_none(), "{:?}", p.texts);
    }
}
