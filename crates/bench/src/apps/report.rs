//! The results of `bench apps`: one [`AppRow`] per application, setup and local buffer; the
//! current ÷ baseline ratios between rows; the table, and the bars of the chart.

/// One row of the results: an application in one setup.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AppRow {
    /// Application.
    pub app: String,
    /// `native`, `rackmem` (its defaults), `rackmem NAME` (an extra setup), `rackmem
    /// same-memory` (the defaults at the swap peers' bytes), each with `@baseline` (run with the
    /// baseline build), `zram` or `swap file`.
    pub setup: String,
    /// Local buffer, percent of the footprint (100 for native).
    pub local_pct: u32,
    /// The fixed byte budget rackmem ran with (`--local BYTES`), when it was not `local_pct`%:
    /// the `rackmem same-memory` rows, at the swap peers' cgroup limit for `local_pct`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_bytes: Option<u64>,
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
    /// Native's `value` / this one: how many times slower than native (0 when the setup failed).
    #[serde(default)]
    pub slowdown_vs_native: f64,
    /// `value` / zram's at the same local buffer (rackmem and swap file rows).
    pub vs_zram: Option<f64>,
    /// The swap peers (`zram`, `swap file`) whose cgroup OOM-killed the program at this local
    /// buffer: a rackmem row that finished has no ratio to them, only this.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers_oom_killed: Vec<String>,
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
    /// Under rackmem: what each successful run moved (faults, bytes, load control's holds), in
    /// the order of `values`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rackmem_stats: Vec<super::RunStats>,
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
        "slowdown",
        "× zram",
        "result",
    ]);
    for r in rows {
        t.add_row(vec![
            r.app.clone(),
            format!("{:.0} MiB", r.footprint_bytes as f64 / 1048576.0),
            r.setup.clone(),
            match r.local_bytes {
                Some(b) => format!("{}% = {:.1} MiB", r.local_pct, b as f64 / 1048576.0),
                None => format!("{}%", r.local_pct),
            },
            r.metric.clone(),
            if r.values.is_empty() {
                "—".into()
            } else if r.value < 10.0 {
                // xz's MB/s under a small buffer is a fraction of one: keep two figures.
                format!("{:.2}", r.value)
            } else {
                format!("{:.1}", r.value)
            },
            r.p99_ms.map_or(String::new(), |p| format!("{p:.2}")),
            format!("{:.3}", r.vs_native),
            slowdown(r),
            match r.vs_zram {
                Some(v) => format!("{v:.2}"),
                None if r.peers_oom_killed.iter().any(|p| p == "zram") => "zram OOM-killed".into(),
                None => String::new(),
            },
            match &r.error {
                None => "= native".into(),
                Some(e) => e.clone(),
            },
        ]);
    }
    t.to_string()
}

fn slowdown(r: &AppRow) -> String {
    if r.slowdown_vs_native > 0.0 {
        format!("{:.2}×", r.slowdown_vs_native)
    } else {
        "—".into()
    }
}

/// Seed 002's published slowdowns at Xmem(25%) (§4.3, Fig. 4: the RAN far memory at Argonne,
/// a quarter of each application's footprint in the node's local buffer, against all local):
/// the application of `bench apps` doing the same kind of work, the paper's application, and
/// its range of slowdowns over thread counts.
pub const SEED_002_XMEM_25: [(&str, &str, f64, f64); 5] = [
    ("numpy-linalg", "DGEMM", 2.6, 9.1),
    ("bfs", "Graph500", 10.7, 17.5),
    ("updates-1", "GUPS", 29.5, 86.8),
    ("updates-2", "GUPS", 29.5, 86.8),
    ("updates-all", "GUPS", 29.5, 86.8),
];

/// The geometric mean of `ratios` (`None` when empty).
pub fn geomean(ratios: &[f64]) -> Option<f64> {
    (!ratios.is_empty()).then(|| (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp())
}

/// rackmem's defaults (the rows of `setup`, current build: `rackmem` at P% of the footprint, or
/// `rackmem same-memory` at the peers' bytes) against native, seed 002 and the swap peers, one
/// line per application: the slowdown at each local buffer, seed 002's at Xmem(25%) where the
/// work is of the same kind, and rackmem ÷ each peer, or that the peer's cgroup OOM-killed the
/// program where rackmem finished. Then the geometric mean of rackmem ÷ zram over the
/// applications zram finished, per local buffer and over all. The text, and the same as JSON.
pub fn against_peers(rows: &[AppRow], locals: &[u32], setup: &str) -> (String, serde_json::Value) {
    let mut apps: Vec<&str> = Vec::new();
    for r in rows {
        if !apps.contains(&r.app.as_str()) {
            apps.push(&r.app);
        }
    }
    let find = |app: &str, setup: &str, pct: u32| {
        rows.iter()
            .find(|r| r.app == app && r.setup == setup && r.local_pct == pct)
    };
    // Only the peers that ran (`--peers` picks them).
    let peers: Vec<&str> = ["zram", "swap file"]
        .into_iter()
        .filter(|p| rows.iter().any(|r| r.setup == *p))
        .collect();
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    let mut header = vec!["app".to_string(), "footprint".into()];
    header.extend(locals.iter().map(|p| format!("slowdown {p}%")));
    header.push("seed 002, Xmem(25%)".into());
    for peer in &peers {
        header.extend(locals.iter().map(|p| format!("÷ {peer} {p}%")));
    }
    t.set_header(header);
    let mut per_local: Vec<(u32, Vec<f64>)> = locals.iter().map(|&p| (p, Vec::new())).collect();
    let mut json_apps = Vec::new();
    let mut oom_killed = 0;
    for app in &apps {
        let footprint = rows.iter().find(|r| r.app == *app).map_or(0, |r| r.footprint_bytes);
        let mut cells = vec![app.to_string(), format!("{:.0} MiB", footprint as f64 / 1048576.0)];
        let mut j = serde_json::json!({"app": app});
        for &pct in locals {
            let cell = match find(app, setup, pct) {
                Some(r) if r.error.is_none() => {
                    j["slowdown"][pct.to_string()] = serde_json::json!(r.slowdown_vs_native);
                    format!("{:.2}×", r.slowdown_vs_native)
                }
                Some(_) => "failed".into(),
                None => String::new(),
            };
            cells.push(cell);
        }
        match SEED_002_XMEM_25.iter().find(|s| s.0 == *app) {
            Some((_, kind, lo, hi)) => {
                cells.push(format!("{kind} {lo}–{hi}×"));
                j["seed_002_xmem_25"] = serde_json::json!({"app": kind, "slowdown_min": lo, "slowdown_max": hi});
            }
            None => cells.push(String::new()),
        }
        for &peer in &peers {
            for (i, &pct) in locals.iter().enumerate() {
                let (Some(r), Some(p)) = (find(app, setup, pct), find(app, peer, pct)) else {
                    cells.push(String::new());
                    continue;
                };
                let key = format!("{peer} {pct}");
                let cell = if r.error.is_some() {
                    "rackmem failed".to_string()
                } else if p.oom.is_some() {
                    oom_killed += (peer == "zram") as usize;
                    j["vs_peer"][&key] = serde_json::json!("OOM-killed");
                    format!("{peer} OOM-killed, rackmem finished")
                } else if p.error.is_some() || p.value <= 0.0 {
                    format!("{peer} failed")
                } else {
                    let ratio = r.value / p.value;
                    if peer == "zram" {
                        per_local[i].1.push(ratio);
                    }
                    j["vs_peer"][&key] = serde_json::json!(ratio);
                    format!("{ratio:.2}")
                };
                cells.push(cell);
            }
        }
        t.add_row(cells);
        json_apps.push(j);
    }
    let what = if setup == "rackmem" {
        "rackmem (defaults, --local P% of the footprint so far)".to_string()
    } else {
        format!("{setup} (defaults, --local of the peers' cgroup limit in bytes, fixed from the start)")
    };
    let mut text = format!(
        "{what} against native, seed 002 and the swap peers (slowdown = native ÷ rackmem; \
         \"÷ peer\" = rackmem's speed over the peer's at the same share)\n{t}\n"
    );
    let all: Vec<f64> = per_local.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    let mut means = serde_json::Map::new();
    let mut parts = Vec::new();
    for (pct, v) in per_local
        .iter()
        .map(|(p, v)| (p.to_string() + "%", v))
        .chain([("all".to_string(), &all)])
    {
        if let Some(g) = geomean(v) {
            parts.push(format!("{pct} {g:.2} ({} apps)", v.len()));
            means.insert(pct.trim_end_matches('%').to_string(), serde_json::json!(g));
        }
    }
    if !parts.is_empty() {
        text += &format!("geometric mean of {setup} ÷ zram: {}", parts.join(", "));
        if oom_killed > 0 {
            text += &format!(" (without the {oom_killed} where zram's cgroup OOM-killed the program)");
        }
        text += "\n";
    }
    (
        text,
        serde_json::json!({"apps": json_apps, "geomean_vs_zram": means, "zram_oom_killed": oom_killed}),
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(app: &str, setup: &str, pct: u32, value: f64, native: f64) -> AppRow {
        AppRow {
            app: app.into(),
            setup: setup.into(),
            local_pct: pct,
            metric: "ops".into(),
            value,
            values: vec![value],
            started_s: vec![0.0],
            p99_ms: None,
            p99_ms_values: Vec::new(),
            vs_native: value / native,
            slowdown_vs_native: native / value,
            vs_zram: None,
            peers_oom_killed: Vec::new(),
            vs_baseline: None,
            results: vec!["x".into()],
            result_matches_native: true,
            footprint_bytes: 100 << 20,
            cgroup_limit_bytes: None,
            local_bytes: None,
            error: None,
            oom: None,
            rackmem_stats: Vec::new(),
        }
    }

    fn killed(mut r: AppRow) -> AppRow {
        r.value = 0.0;
        r.values.clear();
        r.error = Some("OOM-killed by its cgroup".into());
        r.oom = Some(crate::oom::OomReport::default());
        r
    }

    #[test]
    fn an_oom_killed_peer_is_reported_never_as_a_ratio_nor_in_the_mean() {
        let rows = vec![
            row("numpy-linalg", "native", 100, 10.0, 10.0),
            row("numpy-linalg", "rackmem", 25, 2.0, 10.0),
            row("numpy-linalg", "zram", 25, 1.0, 10.0),
            row("numpy-linalg", "swap file", 25, 0.5, 10.0),
            row("qsort", "native", 100, 8.0, 8.0),
            row("qsort", "rackmem", 25, 4.0, 8.0),
            killed(row("qsort", "zram", 25, 1.0, 8.0)),
            row("qsort", "swap file", 25, 0.5, 8.0),
            row("pydict", "native", 100, 8.0, 8.0),
            row("pydict", "rackmem", 25, 1.0, 8.0),
            row("pydict", "zram", 25, 2.0, 8.0),
        ];
        let (text, json) = against_peers(&rows, &[25], "rackmem");
        assert!(text.contains("zram OOM-killed, rackmem finished"), "{text}");
        assert!(text.contains("DGEMM 2.6–9.1×"), "{text}");
        assert!(text.contains("5.00×"), "numpy-linalg's slowdown: {text}");
        // rackmem ÷ zram: 2.0 (linalg) and 0.5 (pydict); qsort's zram was killed.
        let g = json["geomean_vs_zram"]["25"].as_f64().expect("a mean at 25%");
        assert!((g - 1.0).abs() < 1e-9, "{json}");
        assert_eq!(json["geomean_vs_zram"]["all"].as_f64(), Some(g), "{json}");
        assert_eq!(json["zram_oom_killed"], 1, "{json}");
        let qsort = &json["apps"][1];
        assert_eq!(qsort["vs_peer"]["zram 25"], "OOM-killed", "{json}");
        assert_eq!(qsort["vs_peer"]["swap file 25"].as_f64(), Some(8.0), "{json}");
        assert!(text.contains("without the 1 where zram's cgroup OOM-killed"), "{text}");
        let zram_only: Vec<AppRow> = rows.into_iter().filter(|r| r.setup != "swap file").collect();
        let (text, _) = against_peers(&zram_only, &[25], "rackmem");
        assert!(
            !text.contains("swap file"),
            "a peer that did not run has no column: {text}"
        );
    }

    #[test]
    fn geomean_of_ratios() {
        assert_eq!(geomean(&[]), None);
        let g = geomean(&[2.0, 8.0]).expect("mean");
        assert!((g - 4.0).abs() < 1e-12);
    }
}
