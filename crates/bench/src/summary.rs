//! Summaries of measured series: a latency series as percentiles ([`Summary`]), a series of
//! repeated figures as its median ([`median`]), and the table and chart bars of latencies.

/// Latency summary of one measured series, in microseconds.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// What was measured.
    pub name: String,
    /// Samples.
    pub samples: usize,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Mean.
    pub mean_us: f64,
}

impl Summary {
    /// Summarises nanosecond samples.
    pub fn from_ns(name: &str, mut ns: Vec<u64>) -> Summary {
        if ns.is_empty() {
            return Summary {
                name: name.into(),
                ..Default::default()
            };
        }
        ns.sort_unstable();
        let q = |f: f64| ns[((ns.len() as f64 * f) as usize).min(ns.len() - 1)] as f64 / 1000.0;
        Summary {
            name: name.into(),
            samples: ns.len(),
            p50_us: q(0.5),
            p99_us: q(0.99),
            mean_us: ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0,
        }
    }
}

/// The median of `v`; the mean of the two middle values for an even count; NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Latency summaries as a table under `title` (ends with a newline).
pub fn table(title: &str, rows: &[Summary]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec!["measurement", "samples", "p50 µs", "p99 µs", "mean µs"]);
    for s in rows {
        t.add_row(vec![
            s.name.clone(),
            s.samples.to_string(),
            format!("{:.2}", s.p50_us),
            format!("{:.2}", s.p99_us),
            format!("{:.2}", s.mean_us),
        ]);
    }
    format!("{title}\n{t}\n")
}

/// Latency summaries as a chart under `title`.
pub fn latency_chart(title: &str, rows: &[Summary]) -> crate::chart::Chart {
    let bars: Vec<crate::chart::LatencyBar> = rows
        .iter()
        .map(|s| crate::chart::LatencyBar {
            label: s.name.clone(),
            p50_us: s.p50_us,
            p99_us: s.p99_us,
        })
        .collect();
    crate::chart::latencies(title, bars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
