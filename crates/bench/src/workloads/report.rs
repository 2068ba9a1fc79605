//! The results of `bench workloads`: one [`Row`] per workload, setup and local buffer; the
//! ratios between rows (against native, against each swap peer, current ÷ baseline); the table,
//! and the bars of the chart.

use crate::baseline::Ratio;
use crate::rackmem::Build;

/// One row: a workload in one setup at one local buffer.
#[derive(Debug, serde::Serialize, Clone)]
pub struct Row {
    /// The workload.
    pub workload: String,
    /// `native`, `rackmem NAME` (NAME a setup, `NAME@baseline` with the baseline build), `zram`
    /// or `swap file`.
    pub setup: String,
    /// Local buffer, percent of the footprint (100 for native).
    pub local_pct: u32,
    /// What `value` measures (higher is better).
    pub metric: String,
    /// Median of `values`.
    pub value: f64,
    /// Every measured value (`--repeat`), in the order run; `value` is their median.
    pub values: Vec<f64>,
    /// When each of `values` started, in seconds since the bench started (shows how the
    /// setups took turns, and lines figures up with whatever else the machine did).
    pub started_s: Vec<f64>,
    /// `value` / native's.
    pub vs_native: f64,
    /// `value` / zram's at the same local buffer (rackmem rows).
    pub speedup_vs_zram: Option<f64>,
    /// `value` / the swap file's at the same local buffer (rackmem rows).
    pub speedup_vs_swap_file: Option<f64>,
    /// `value` / the same setup's with the baseline build (current rows, with a baseline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_baseline: Option<f64>,
    /// Why the run produced no figure (a peer killed by its cgroup's OOM killer).
    pub error: Option<String>,
    /// Wall-clock seconds of each run, whole process (native and rackmem rows).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub wall_s: Vec<f64>,
    /// The runtime's counters of each run (rackmem rows), what `rackmem model check` predicts
    /// the slowdown from.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<Counters>,
}

/// A rackmem run's fault counters (its busiest process's).
#[derive(Debug, serde::Serialize, serde::Deserialize, Clone, Copy, PartialEq)]
pub struct Counters {
    /// Faults.
    pub faults: u64,
    /// Mean fault service time, ns.
    pub fault_mean_ns: u64,
    /// Faults in flight, time-weighted mean (miss concurrency).
    pub miss_concurrency: f64,
}

/// The row name of setup `name` run with `build`.
pub fn rackmem_setup(name: &str, build: Build) -> String {
    format!("rackmem {name}{}", build.suffix())
}

/// Fills in the rackmem rows' speed-ups over the peers at the same workload and local buffer,
/// and their ratios to the baseline; returns the current ÷ baseline ratios.
pub fn add_ratios(rows: &mut [Row]) -> Vec<Ratio> {
    let snapshot = rows.to_vec();
    let find = |r: &Row, setup: &str| {
        snapshot
            .iter()
            .find(|p| p.workload == r.workload && p.local_pct == r.local_pct && p.setup == setup && p.error.is_none())
    };
    let mut ratios = Vec::new();
    for r in rows.iter_mut().filter(|r| r.setup.starts_with("rackmem")) {
        r.speedup_vs_zram = find(r, "zram").map(|p| r.value / p.value);
        r.speedup_vs_swap_file = find(r, "swap file").map(|p| r.value / p.value);
        if r.setup.ends_with(Build::Baseline.suffix()) {
            continue;
        }
        if let Some(b) = find(r, &format!("{}{}", r.setup, Build::Baseline.suffix())) {
            let name = r.setup.strip_prefix("rackmem ").unwrap_or(&r.setup);
            let ratio = Ratio::new(&r.workload, name, r.local_pct, &r.metric, true, r.value, b.value);
            r.vs_baseline = Some(ratio.ratio);
            ratios.push(ratio);
        }
    }
    ratios
}

/// The rows as a table, with what `value` is when it is a median of `repeat` runs (ends with a
/// newline).
pub fn table(rows: &[Row], repeat: u32) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "workload",
        "setup",
        "local",
        "metric",
        "value",
        "vs native",
        "× zram",
        "× swap file",
    ]);
    let f = |v: Option<f64>| v.map_or("".to_string(), |x| format!("{x:.2}"));
    for r in rows {
        t.add_row(vec![
            r.workload.clone(),
            r.setup.clone(),
            format!("{}%", r.local_pct),
            r.metric.clone(),
            r.error
                .clone()
                .map_or_else(|| format!("{:.1}", r.value), |_| "OOM-killed".into()),
            format!("{:.4}", r.vs_native),
            f(r.speedup_vs_zram),
            f(r.speedup_vs_swap_file),
        ]);
    }
    let of = if repeat > 1 {
        format!("value = median of {repeat} runs; ")
    } else {
        String::new()
    };
    format!("Workloads (same run; {of}\"× peer\" = rackmem's speed-up over the peer at the same local buffer)\n{t}\n")
}

/// The rows other than native, as bars (fraction of native) for [`crate::chart::svg`].
pub fn bars(rows: &[Row]) -> Vec<crate::chart::Bar> {
    rows.iter()
        .filter(|r| r.setup != "native" && r.error.is_none())
        .map(|r| crate::chart::Bar {
            group: r.workload.clone(),
            label: format!("{} {}%", r.setup, r.local_pct),
            fraction: r.vs_native,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(setup: &str, value: f64) -> Row {
        Row {
            workload: "scan".into(),
            setup: setup.into(),
            local_pct: 25,
            metric: "mb_per_s".into(),
            value,
            values: vec![value],
            started_s: vec![0.0],
            vs_native: 0.0,
            speedup_vs_zram: None,
            speedup_vs_swap_file: None,
            vs_baseline: None,
            error: None,
            wall_s: Vec::new(),
            counters: Vec::new(),
        }
    }

    #[test]
    fn rackmem_rows_get_peer_and_baseline_ratios() {
        let mut rows = vec![
            row("rackmem defaults", 300.0),
            row("rackmem defaults@baseline", 200.0),
            row("rackmem fifo", 150.0),
            row("zram", 100.0),
        ];
        let ratios = add_ratios(&mut rows);
        assert_eq!(rows[0].speedup_vs_zram, Some(3.0));
        assert_eq!(rows[1].speedup_vs_zram, Some(2.0));
        assert_eq!(rows[0].vs_baseline, Some(1.5));
        assert_eq!((rows[1].vs_baseline, rows[2].vs_baseline), (None, None));
        assert_eq!(ratios.len(), 1);
        assert_eq!((ratios[0].setup.as_str(), ratios[0].ratio), ("defaults", 1.5));
        let json = serde_json::to_value(&rows[2]).expect("json");
        assert!(json.get("vs_baseline").is_none(), "no key without a baseline: {json}");
    }
}
