//! The results of `bench apps`: one [`AppRow`] per application, setup and local buffer; the
//! current ÷ baseline ratios between rows; the table, and the bars of the chart.

/// One row of the results: an application in one setup.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AppRow {
    /// Application.
    pub app: String,
    /// `native`, `rackmem` (its defaults), `rackmem NAME` (an extra setup), either with
    /// `@baseline` (run with the baseline build), `zram` or `swap file`.
    pub setup: String,
    /// Local buffer, percent of the footprint (100 for native).
    pub local_pct: u32,
    /// What `value` measures (higher is better).
    pub metric: String,
    /// Median of `values` (0 when the setup failed).
    pub value: f64,
    /// Every measured value, in the order run.
    pub values: Vec<f64>,
    /// When each run started, seconds since the bench started.
    pub started_s: Vec<f64>,
    /// 99th-percentile latency, ms (key-value servers): median and every value.
    pub p99_ms: Option<f64>,
    /// Every run's p99, ms.
    pub p99_ms_values: Vec<f64>,
    /// `value` / native's.
    pub vs_native: f64,
    /// `value` / zram's at the same local buffer (rackmem and swap file rows).
    pub vs_zram: Option<f64>,
    /// `value` / the same setup's with the baseline build (current rackmem rows, with a
    /// baseline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_baseline: Option<f64>,
    /// Every run's result (checksum, digest or output hash).
    pub results: Vec<String>,
    /// Whether every run's result equals the native run's.
    pub result_matches_native: bool,
    /// Peak RSS measured natively, bytes (the footprint the budgets are taken from).
    pub footprint_bytes: u64,
    /// The memory cgroup's limit (swap peers), bytes.
    pub cgroup_limit_bytes: Option<u64>,
    /// Why the setup produced no figure, or what is wrong with it.
    pub error: Option<String>,
    /// Why the program died in its cgroup, when it did.
    pub oom: Option<crate::oom::OomReport>,
}

/// Current ÷ baseline of every current rackmem row that has a baseline twin: its metric (higher
/// is better) and its p99 (lower is better), when both runs produced them.
pub fn baseline_ratios(rows: &mut [AppRow]) -> Vec<crate::baseline::Ratio> {
    use crate::baseline::Ratio;
    let suffix = crate::rackmem::Build::Baseline.suffix();
    let snapshot = rows.to_vec();
    let mut ratios = Vec::new();
    for r in rows
        .iter_mut()
        .filter(|r| r.setup.starts_with("rackmem") && !r.setup.ends_with(suffix) && r.error.is_none())
    {
        let twin = format!("{}{suffix}", r.setup);
        let Some(b) = snapshot
            .iter()
            .find(|b| b.app == r.app && b.local_pct == r.local_pct && b.setup == twin && b.error.is_none())
        else {
            continue;
        };
        let setup = r.setup.strip_prefix("rackmem ").unwrap_or("defaults");
        let ratio = Ratio::new(&r.app, setup, r.local_pct, &r.metric, true, r.value, b.value);
        r.vs_baseline = Some(ratio.ratio);
        ratios.push(ratio);
        if let (Some(c), Some(p)) = (r.p99_ms, b.p99_ms) {
            ratios.push(Ratio::new(&r.app, setup, r.local_pct, "p99_ms", false, c, p));
        }
    }
    ratios
}

/// The results as a table.
pub fn table(rows: &[AppRow]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "app",
        "footprint",
        "setup",
        "local",
        "metric",
        "value",
        "p99 ms",
        "vs native",
        "× zram",
        "result",
    ]);
    for r in rows {
        t.add_row(vec![
            r.app.clone(),
            format!("{:.0} MiB", r.footprint_bytes as f64 / 1048576.0),
            r.setup.clone(),
            format!("{}%", r.local_pct),
            r.metric.clone(),
            if r.values.is_empty() {
                "—".into()
            } else {
                format!("{:.1}", r.value)
            },
            r.p99_ms.map_or(String::new(), |p| format!("{p:.2}")),
            format!("{:.3}", r.vs_native),
            r.vs_zram.map_or(String::new(), |v| format!("{v:.2}")),
            match &r.error {
                None => "= native".into(),
                Some(e) => e.clone(),
            },
        ]);
    }
    t.to_string()
}

/// The results as bars (fraction of native) for [`crate::chart::svg`].
pub fn bars(rows: &[AppRow]) -> Vec<crate::chart::Bar> {
    rows.iter()
        .filter(|r| r.setup != "native" && !r.values.is_empty())
        .map(|r| crate::chart::Bar {
            group: r.app.clone(),
            label: format!("{} {}%", r.setup, r.local_pct),
            fraction: r.vs_native,
        })
        .collect()
}
