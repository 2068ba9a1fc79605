//! What a bench part hands back to its caller: the text to print (its tables and the lines
//! under them), the JSON document and the chart's data. The caller decides where they go;
//! [`Output::save`] writes the document and draws the chart where the command line asked, and
//! the suite draws every part's chart into one document.

use crate::BenchError;
use std::path::Path;

/// A part's results.
#[derive(Debug, Clone, Default)]
pub struct Output {
    /// Tables and lines for standard output, each ending with a newline.
    pub text: String,
    /// The JSON document.
    pub json: serde_json::Value,
    /// The chart, if the part draws one.
    pub chart: Option<crate::chart::Chart>,
}

impl Output {
    /// Writes the chart to `svg` and the document to `json` (each when given), saying so on
    /// standard error.
    pub fn save(&self, json: Option<&Path>, svg: Option<&Path>) -> Result<(), BenchError> {
        match (svg, &self.chart) {
            (Some(p), Some(c)) => {
                write(p, &c.svg())?;
                eprintln!("rackmem bench: chart written to {}", p.display());
            }
            (Some(p), None) => eprintln!(
                "rackmem bench: this command draws no chart; {} not written",
                p.display()
            ),
            (None, _) => {}
        }
        write_json(json, &self.json)
    }
}

/// Writes a JSON document (pretty-printed) to `path` when given.
pub fn write_json(path: Option<&Path>, value: &serde_json::Value) -> Result<(), BenchError> {
    if let Some(p) = path {
        let text = serde_json::to_string_pretty(value).map_err(|e| BenchError::Workload(e.to_string()))?;
        write(p, &text)?;
        eprintln!("rackmem bench: results written to {}", p.display());
    }
    Ok(())
}

/// Writes `text` to `path`.
pub fn write(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|source| BenchError::Io {
        what: format!("writing {}", path.display()),
        source,
    })
}
