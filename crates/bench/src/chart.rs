//! A dependency-free SVG bar chart: one group of bars per workload, one bar per setup, the bar's
//! length the setup's performance as a fraction of the native run on a log scale.

/// One bar.
pub struct Bar {
    /// Group (workload).
    pub group: String,
    /// Setup label.
    pub label: String,
    /// Fraction of native (higher is better).
    pub fraction: f64,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Renders the bars as an SVG document.
pub fn svg(title: &str, bars: &[Bar]) -> String {
    let row = 16.0;
    let left = 260.0;
    let width = 900.0;
    let plot = width - left - 80.0;
    // Log scale from 1e-4 to 2 (fractions of native).
    let (lo, hi) = (1e-4f64.log10(), 2f64.log10());
    let x = |f: f64| left + (f.max(1e-4).log10() - lo) / (hi - lo) * plot;
    let mut groups: Vec<&str> = Vec::new();
    for b in bars {
        if !groups.contains(&b.group.as_str()) {
            groups.push(&b.group);
        }
    }
    let height = 60.0 + bars.len() as f64 * row + groups.len() as f64 * 24.0 + 40.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"20\" font-size=\"14\">{}</text>\n",
        esc(title)
    );
    for t in [1e-4, 1e-3, 1e-2, 1e-1, 1.0] {
        let xt = x(t);
        out += &format!(
            "<line x1=\"{xt:.1}\" y1=\"35\" x2=\"{xt:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{xt:.1}\" y=\"32\" text-anchor=\"middle\">{t}×</text>\n",
            height - 30.0
        );
    }
    let mut y = 50.0;
    let colors = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    ];
    for g in &groups {
        out += &format!(
            "<text x=\"10\" y=\"{:.1}\" font-weight=\"bold\">{}</text>\n",
            y + 10.0,
            esc(g)
        );
        y += 16.0;
        for (i, b) in bars.iter().filter(|b| b.group == *g).enumerate() {
            let w = (x(b.fraction) - left).max(1.0);
            out += &format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text><rect x=\"{left}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{}\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\">{:.4}</text>\n",
                left - 6.0,
                y + 11.0,
                esc(&b.label),
                y + 2.0,
                row - 4.0,
                colors[i % colors.len()],
                left + w + 4.0,
                y + 11.0,
                b.fraction
            );
            y += row;
        }
        y += 8.0;
    }
    out += &format!(
        "<text x=\"{left}\" y=\"{:.1}\">performance as a fraction of the native (all-local) run, log scale; higher is better</text>\n</svg>\n",
        height - 10.0
    );
    out
}

/// One latency series: its median and 99th percentile.
pub struct LatencyBar {
    /// What was measured.
    pub label: String,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
}

/// Renders latencies as horizontal bars on a linear scale: a solid bar to the median and a thin
/// whisker on to the 99th percentile, so floors and the remote fault read side by side.
pub fn latency_svg(title: &str, rows: &[LatencyBar]) -> String {
    let row = 22.0;
    let left = 420.0;
    let width = 1000.0;
    let plot = width - left - 90.0;
    let max = rows
        .iter()
        .map(|r| r.p99_us.max(r.p50_us))
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max);
    // A round scale end so the grid lines land on readable values.
    let step = [
        1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
    ]
    .into_iter()
    .find(|s| max / s <= 8.0)
    .unwrap_or(10000.0);
    let end = (max / step).ceil() * step;
    let x = |v: f64| left + (v.clamp(0.0, end) / end) * plot;
    let height = 70.0 + rows.len() as f64 * row + 30.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"20\" font-size=\"14\">{}</text>\n",
        esc(title)
    );
    let mut t = 0.0;
    while t <= end + 1e-9 {
        let xt = x(t);
        out += &format!(
            "<line x1=\"{xt:.1}\" y1=\"40\" x2=\"{xt:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{xt:.1}\" y=\"36\" text-anchor=\"middle\">{t} µs</text>\n",
            height - 30.0
        );
        t += step;
    }
    let mut y = 48.0;
    for r in rows {
        let (p50, p99) = (r.p50_us.max(0.0), r.p99_us.max(r.p50_us).max(0.0));
        out += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{left}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#1f77b4\"/>\
             <line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#333\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{p50:.1} / {p99:.1}</text>\n",
            left - 6.0,
            y + 13.0,
            esc(&r.label),
            y + 3.0,
            (x(p50) - left).max(1.0),
            row - 6.0,
            x(p50),
            y + row / 2.0,
            x(p99),
            y + row / 2.0,
            x(p99) + 4.0,
            y + 13.0,
        );
        y += row;
    }
    out += &format!(
        "<text x=\"{left}\" y=\"{:.1}\">bar: median; whisker: 99th percentile (µs); labels: median / p99</text>\n</svg>\n",
        height - 10.0
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_chart_has_one_bar_per_row_and_escapes_labels() {
        let rows = [
            LatencyBar {
                label: "uffd <floor>".into(),
                p50_us: 15.0,
                p99_us: 40.0,
            },
            LatencyBar {
                label: "remote".into(),
                p50_us: 41.0,
                p99_us: f64::NAN,
            },
        ];
        let s = latency_svg("t", &rows);
        assert_eq!(s.matches("<rect x=").count(), 2);
        assert!(s.contains("uffd &lt;floor&gt;"));
        assert!(!s.contains("NaN\""), "no NaN coordinates: {s}");
        assert!(s.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn fraction_chart_groups_bars() {
        let bars = [
            Bar {
                group: "scan".into(),
                label: "a".into(),
                fraction: 0.5,
            },
            Bar {
                group: "scan".into(),
                label: "b".into(),
                fraction: 0.0,
            },
        ];
        let s = svg("t", &bars);
        assert_eq!(s.matches("font-weight=\"bold\">scan<").count(), 1);
        assert_eq!(s.matches("<rect x=").count(), 2);
    }
}
