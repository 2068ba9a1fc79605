//! The charts of `rackmem bench`, drawn with `plotters` into SVG: bars of performance as a
//! fraction of the native run (log scale, one group per workload), and latency bars (median,
//! with a whisker to the 99th percentile). Text is left to the viewer's fonts: no font file is
//! read, so charts are drawn the same on any machine.

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

/// One bar.
pub struct Bar {
    /// Group (workload).
    pub group: String,
    /// Setup label.
    pub label: String,
    /// Fraction of native (higher is better).
    pub fraction: f64,
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

const WIDTH: u32 = 1000;
const ROW: u32 = 20;
/// The lowest fraction of native the log scale shows (a bar below it is drawn at it).
const FLOOR: f64 = 1e-4;

type Drawn = Result<(), Box<dyn std::error::Error>>;

/// Draws with `draw` into an SVG document of `height`; a drawing error is written into the
/// document as its only text, so a chart never takes a benchmark's figures down with it.
fn render(height: u32, draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, plotters::coord::Shift>) -> Drawn) -> String {
    let mut out = String::new();
    let failed = {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        let r = root.fill(&WHITE).map_err(Into::into).and_then(|()| draw(&root));
        let r = r.and_then(|()| root.present().map_err(Into::into));
        r.err().map(|e| e.to_string())
    };
    match failed {
        None => out,
        Some(e) => {
            let mut fallback = String::new();
            {
                let root = SVGBackend::with_string(&mut fallback, (WIDTH, 40)).into_drawing_area();
                let _ = root.fill(&WHITE);
                let _ = root.draw(&Text::new(
                    format!("chart not drawn: {e}"),
                    (10, 12),
                    ("sans-serif", 14),
                ));
                let _ = root.present();
            }
            fallback
        }
    }
}

/// Where a bar of `fraction` ends on the log scale: clamped to it, a non-finite one at its floor.
fn bar_end(fraction: f64) -> f64 {
    if fraction.is_finite() {
        fraction.clamp(FLOOR, 2.0)
    } else {
        FLOOR
    }
}

/// The groups in the order they first appear, and the bars group by group (each group's in
/// their own order).
fn grouped(bars: &[Bar]) -> (Vec<&str>, Vec<&Bar>) {
    let mut groups: Vec<&str> = Vec::new();
    for b in bars {
        if !groups.contains(&b.group.as_str()) {
            groups.push(&b.group);
        }
    }
    let rows = groups
        .iter()
        .flat_map(|g| bars.iter().filter(move |b| b.group == *g))
        .collect();
    (groups, rows)
}

/// Renders the bars as an SVG document: one row per bar, grouped by workload, the bar's length
/// its fraction of native on a log scale from 10⁻⁴ to 2.
pub fn svg(title: &str, bars: &[Bar]) -> String {
    let (groups, rows) = grouped(bars);
    let labels: Vec<String> = rows.iter().map(|b| format!("{} · {}", b.group, b.label)).collect();
    let n = rows.len().max(1);
    let height = 110 + ROW * n as u32;
    render(height, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(45)
            .y_label_area_size(330)
            .build_cartesian_2d((FLOOR..2.0f64).log_scale(), (0..n).into_segmented())?;
        // Row i is drawn at segment n - 1 - i, so the first row is at the top.
        let at = |i: usize| n - 1 - i;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(k) => labels.get(n - 1 - *k).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .x_desc("performance as a fraction of the native (all-local) run, log scale; higher is better")
            .x_label_formatter(&|x| format!("{x}×"))
            .draw()?;
        chart.draw_series(rows.iter().enumerate().map(|(i, b)| {
            let colour = Palette99::pick(groups.iter().position(|g| *g == b.group).unwrap_or(0)).filled();
            let f = bar_end(b.fraction);
            Rectangle::new(
                [(FLOOR, SegmentValue::Exact(at(i))), (f, SegmentValue::Exact(at(i) + 1))],
                colour,
            )
        }))?;
        chart.draw_series(rows.iter().enumerate().map(|(i, b)| {
            let f = bar_end(b.fraction);
            Text::new(
                format!("{:.4}", b.fraction),
                (f, SegmentValue::CenterOf(at(i))),
                ("sans-serif", 11),
            )
        }))?;
        Ok(())
    })
}

/// Renders latencies as horizontal bars on a linear scale: a bar to the median and a whisker
/// on to the 99th percentile, so floors and the remote fault read side by side.
pub fn latency_svg(title: &str, rows: &[LatencyBar]) -> String {
    let n = rows.len().max(1);
    let end = rows
        .iter()
        .map(|r| r.p99_us.max(r.p50_us))
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max)
        * 1.15;
    let height = 110 + (ROW + 4) * n as u32;
    render(height, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(45)
            .y_label_area_size(420)
            .build_cartesian_2d(0.0..end, (0..n).into_segmented())?;
        // Row i is drawn at segment n - 1 - i, so the first row is at the top.
        let at = |i: usize| n - 1 - i;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(k) => rows.get(n - 1 - *k).map(|r| r.label.clone()).unwrap_or_default(),
                _ => String::new(),
            })
            .x_desc("µs; bar: median, whisker: 99th percentile; labels: median / p99")
            .draw()?;
        let clean = |v: f64| if v.is_finite() { v.clamp(0.0, end) } else { 0.0 };
        chart.draw_series(rows.iter().enumerate().map(|(i, r)| {
            Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(at(i))),
                    (clean(r.p50_us), SegmentValue::Exact(at(i) + 1)),
                ],
                BLUE.mix(0.7).filled(),
            )
        }))?;
        chart.draw_series(rows.iter().enumerate().map(|(i, r)| {
            let (p50, p99) = (clean(r.p50_us), clean(r.p99_us.max(r.p50_us)));
            PathElement::new(
                vec![
                    (p50, SegmentValue::CenterOf(at(i))),
                    (p99, SegmentValue::CenterOf(at(i))),
                ],
                BLACK.stroke_width(1),
            )
        }))?;
        chart.draw_series(rows.iter().enumerate().map(|(i, r)| {
            let p99 = clean(r.p99_us.max(r.p50_us));
            Text::new(
                format!("{:.1} / {:.1}", r.p50_us, r.p99_us),
                (p99, SegmentValue::CenterOf(at(i))),
                ("sans-serif", 11),
            )
        }))?;
        Ok(())
    })
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
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"), "{s}");
        assert!(s.contains("uffd &lt;floor&gt;"), "labels must be escaped: {s}");
        assert!(!s.contains("NaN\""), "no NaN coordinates: {s}");
        assert!(s.contains("15.0 / 40.0") && s.contains("remote"), "{s}");
    }

    #[test]
    fn fraction_chart_labels_every_bar_with_its_group() {
        let bars = [
            Bar {
                group: "scan".into(),
                label: "a".into(),
                fraction: 0.5,
            },
            Bar {
                group: "gups".into(),
                label: "b".into(),
                fraction: 0.0,
            },
            Bar {
                group: "scan".into(),
                label: "c".into(),
                fraction: f64::INFINITY,
            },
        ];
        let s = svg("t & u", &bars);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"), "{s}");
        for l in ["scan · a", "scan · c", "gups · b", "t &amp; u", "0.5000"] {
            assert!(s.contains(l), "{l} missing: {s}");
        }
        // Groups stay together, in the order they first appear.
        let (groups, rows) = grouped(&bars);
        assert_eq!(groups, ["scan", "gups"]);
        let labels: Vec<&str> = rows.iter().map(|b| b.label.as_str()).collect();
        assert_eq!(labels, ["a", "c", "b"]);
        assert!(!s.contains("NaN") && !s.contains("inf\""), "{s}");
    }
}
