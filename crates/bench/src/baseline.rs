//! Current ÷ baseline: each figure of a setup run with the current build divided by the same
//! figure of that setup run with the baseline build, in the same run (the two take turns in
//! every round, so a slow spell of the machine hits both). Whether above 1 is better depends on
//! the metric, and every ratio says which.

/// One ratio.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Ratio {
    /// The workload or application.
    pub workload: String,
    /// The setup, without `rackmem ` and `@baseline`.
    pub setup: String,
    /// Local buffer, percent of the footprint.
    pub local_pct: u32,
    /// What was compared.
    pub metric: String,
    /// Whether a higher figure is better (throughput) or a lower one (latency).
    pub higher_is_better: bool,
    /// The current build's figure (median of its runs).
    pub current: f64,
    /// The baseline's figure (median of its runs).
    pub baseline: f64,
    /// `current / baseline`.
    pub ratio: f64,
}

impl Ratio {
    /// `current / baseline` of `metric`.
    pub fn new(
        workload: &str,
        setup: &str,
        local_pct: u32,
        metric: &str,
        higher_is_better: bool,
        current: f64,
        baseline: f64,
    ) -> Ratio {
        Ratio {
            workload: workload.to_string(),
            setup: setup.to_string(),
            local_pct,
            metric: metric.to_string(),
            higher_is_better,
            current,
            baseline,
            ratio: current / baseline,
        }
    }

    /// Whether the current build did better (by any amount; noise is for the reader to judge).
    pub fn current_is_better(&self) -> bool {
        if self.higher_is_better {
            self.ratio > 1.0
        } else {
            self.ratio < 1.0
        }
    }
}

/// The ratios as a table under a title naming the baseline executable (ends with a newline).
pub fn table(baseline_exe: &std::path::Path, ratios: &[Ratio]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "workload",
        "setup",
        "local",
        "metric",
        "better",
        "current",
        "baseline",
        "current ÷ baseline",
    ]);
    for r in ratios {
        t.add_row(vec![
            r.workload.clone(),
            r.setup.clone(),
            format!("{}%", r.local_pct),
            r.metric.clone(),
            if r.higher_is_better { "higher" } else { "lower" }.to_string(),
            format!("{:.1}", r.current),
            format!("{:.1}", r.baseline),
            format!("{:.3}", r.ratio),
        ]);
    }
    format!(
        "Current ÷ baseline ({}; same run, the two builds taking turns in every round; \
         \"better\": whether a higher or a lower figure is better)\n{t}\n",
        baseline_exe.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_direction_decides_which_side_of_one_is_better() {
        let up = Ratio::new("scan", "defaults", 25, "mb_per_s", true, 110.0, 100.0);
        assert!((up.ratio - 1.1).abs() < 1e-12 && up.current_is_better());
        let p99 = Ratio::new("redis", "defaults", 25, "p99_ms", false, 1.1, 1.0);
        assert!(!p99.current_is_better());
        let t = table(std::path::Path::new("/old/rackmem"), &[up, p99]);
        assert!(
            t.contains("/old/rackmem") && t.contains("higher") && t.contains("lower") && t.contains("1.100"),
            "{t}"
        );
    }
}
