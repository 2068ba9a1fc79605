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
