//! The charts of `rackmem bench`, drawn with `plotters` into SVG: bars of performance as a
//! fraction of the native run (log scale, one group per workload), latency bars (median, with a
//! whisker to the 99th percentile), and lines on log-log axes, one panel each.
//!
//! A part hands its chart up as data ([`Chart`]), not as an SVG document, so that the suite can
//! draw every part's chart into one drawing area split between them ([`stack`]), the same code
//! drawing each chart alone ([`Chart::svg`]) or as a share of a larger one. Text is left to the
//! viewer's fonts: no font file is read, so charts are drawn the same on any machine.

use plotters::coord::ranged1d::SegmentValue;
use plotters::coord::Shift;
use plotters::prelude::*;

/// One bar.
#[derive(Debug, Clone)]
pub struct Bar {
    /// Group (workload).
    pub group: String,
    /// Setup label.
    pub label: String,
    /// Fraction of native (higher is better).
    pub fraction: f64,
}

/// One latency series: its median and 99th percentile.
#[derive(Debug, Clone)]
pub struct LatencyBar {
    /// What was measured.
    pub label: String,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
}

/// One line of a [`LinePanel`]: its points in the order drawn.
#[derive(Debug, Clone)]
pub struct Line {
    /// The legend's label.
    pub label: String,
    /// (x, y) points; a point with a non-positive or non-finite coordinate is left out (the
    /// axes are logarithmic).
    pub points: Vec<(f64, f64)>,
}

/// A panel of lines on log-log axes.
#[derive(Debug, Clone)]
pub struct LinePanel {
    /// The panel's caption.
    pub title: String,
    /// What x is, with its unit.
    pub x_desc: String,
    /// What y is, with its unit.
    pub y_desc: String,
    /// The lines.
    pub lines: Vec<Line>,
}

/// A chart's data: what a bench part hands back, drawn alone by [`Chart::svg`] or with others
/// by [`stack`].
#[derive(Debug, Clone)]
pub enum Chart {
    /// Horizontal bars of fractions of native, log scale, grouped (see [`fractions`]).
    Fractions {
        /// Caption.
        title: String,
        /// The bars.
        bars: Vec<Bar>,
    },
    /// Horizontal latency bars, linear scale (see [`latencies`]).
    Latencies {
        /// Caption.
        title: String,
        /// The rows, top to bottom.
        rows: Vec<LatencyBar>,
    },
    /// Panels of lines on log-log axes, one under the other.
    Lines {
        /// The panels, top to bottom.
        panels: Vec<LinePanel>,
    },
}

const WIDTH: u32 = 1000;
const ROW: u32 = 20;
/// Height of one panel of a [`Chart::Lines`].
const PANEL: u32 = 450;
/// Height of the heading over each part in [`stack`].
const HEADING: u32 = 28;
/// The lowest fraction of native the log scale shows (a bar below it is drawn at it).
const FLOOR: f64 = 1e-4;

type Drawn = Result<(), Box<dyn std::error::Error>>;
type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Bars of fractions of native: one row per bar, grouped by workload, the bar's length its
/// fraction of native on a log scale from 10⁻⁴ to 2.
pub fn fractions(title: &str, bars: Vec<Bar>) -> Chart {
    Chart::Fractions {
        title: title.to_string(),
        bars,
    }
}

/// Latencies as horizontal bars on a linear scale: a bar to the median and a whisker on to the
/// 99th percentile, so floors and the remote fault read side by side.
pub fn latencies(title: &str, rows: Vec<LatencyBar>) -> Chart {
    Chart::Latencies {
        title: title.to_string(),
        rows,
    }
}

impl Chart {
    /// The height it is drawn at, in pixels (its width is always 1000).
    pub fn height(&self) -> u32 {
        match self {
            Chart::Fractions { bars, .. } => 110 + ROW * bars.len().max(1) as u32,
            Chart::Latencies { rows, .. } => 110 + (ROW + 4) * rows.len().max(1) as u32,
            Chart::Lines { panels } => PANEL * panels.len().max(1) as u32,
        }
    }

    /// Draws into `area` (sized [`Chart::height`]).
    fn draw(&self, area: &Area<'_>) -> Drawn {
        match self {
            Chart::Fractions { title, bars } => draw_fractions(area, title, bars),
            Chart::Latencies { title, rows } => draw_latencies(area, title, rows),
            Chart::Lines { panels } => {
                let n = panels.len().max(1);
                for (panel, area) in panels.iter().zip(area.split_evenly((n, 1))) {
                    draw_lines(&area, panel)?;
                }
                Ok(())
            }
        }
    }

    /// The chart alone as an SVG document.
    pub fn svg(&self) -> String {
        render(self.height(), |root| self.draw(root))
    }
}

/// Charts drawn one under the other in one SVG document, each under a heading with its name:
/// one drawing area split at the charts' heights, each drawn into its share.
pub fn stack(parts: &[(String, Chart)]) -> String {
    let heights: Vec<u32> = parts.iter().map(|(_, c)| HEADING + c.height()).collect();
    let total = heights.iter().sum::<u32>().max(HEADING);
    render(total, |root| {
        let mut at = 0i32;
        let breaks: Vec<i32> = heights
            .iter()
            .take(heights.len().saturating_sub(1))
            .map(|h| {
                at += *h as i32;
                at
            })
            .collect();
        for ((name, chart), area) in parts
            .iter()
            .zip(root.split_by_breakpoints::<i32, i32, _, _>([], breaks))
        {
            let style = ("sans-serif", 16).into_font().style(FontStyle::Bold);
            let (head, body) = area.split_vertically(HEADING);
            head.draw(&Text::new(name.as_str(), (10, 6), style))?;
            chart.draw(&body)?;
        }
        Ok(())
    })
}

/// Draws with `draw` into an SVG document of `height`; a drawing error is written into the
/// document as its only text, so a chart never takes a benchmark's figures down with it.
fn render(height: u32, draw: impl FnOnce(&Area<'_>) -> Drawn) -> String {
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

fn draw_fractions(root: &Area<'_>, title: &str, bars: &[Bar]) -> Drawn {
    let (groups, rows) = grouped(bars);
    let labels: Vec<String> = rows.iter().map(|b| format!("{} · {}", b.group, b.label)).collect();
    let n = rows.len().max(1);
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
}

fn draw_latencies(root: &Area<'_>, title: &str, rows: &[LatencyBar]) -> Drawn {
    let n = rows.len().max(1);
    let end = rows
        .iter()
        .map(|r| r.p99_us.max(r.p50_us))
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max)
        * 1.15;
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
}

fn draw_lines(root: &Area<'_>, p: &LinePanel) -> Drawn {
    let ok = |(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && *x > 0.0 && *y > 0.0;
    let pts = || p.lines.iter().flat_map(|l| l.points.iter().filter(|q| ok(q)));
    let (x_lo, x_hi) = pts().fold((f64::MAX, f64::MIN), |(lo, hi), q| (lo.min(q.0), hi.max(q.0)));
    let (y_lo, y_hi) = pts().fold((f64::MAX, f64::MIN), |(lo, hi), q| (lo.min(q.1), hi.max(q.1)));
    let (x_lo, x_hi, y_lo, y_hi) = if x_lo <= x_hi {
        (x_lo / 2.0, x_hi * 2.0, y_lo / 2.0, y_hi * 2.0)
    } else {
        (1.0, 10.0, 1.0, 10.0)
    };
    let mut chart = ChartBuilder::on(root)
        .caption(&p.title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc(p.x_desc.as_str())
        .y_desc(p.y_desc.as_str())
        .draw()?;
    for (i, l) in p.lines.iter().enumerate() {
        let c = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                l.points.iter().copied().filter(|q| ok(q)),
                c.stroke_width(2),
            ))?
            .label(l.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What a test reads back from an SVG document: its elements' names in document order, the
    /// root's size, and the texts drawn (entities decoded). Fails on an unbalanced or
    /// mis-nested element, so a chart that reads well here is well-formed XML.
    pub(crate) struct Parsed {
        pub elements: Vec<String>,
        pub width: f64,
        pub height: f64,
        pub texts: Vec<String>,
    }

    fn unescape(s: &str) -> String {
        s.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&#39;", "'")
            .replace("&amp;", "&")
    }

    fn attr(tag: &str, name: &str) -> Option<String> {
        let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        Some(tag[at..].split('"').next()?.to_string())
    }

    pub(crate) fn parse(svg: &str) -> Parsed {
        let mut p = Parsed {
            elements: Vec::new(),
            width: f64::NAN,
            height: f64::NAN,
            texts: Vec::new(),
        };
        let mut open: Vec<String> = Vec::new();
        let mut rest = svg.trim();
        let mut text = String::new();
        while let Some(lt) = rest.find('<') {
            if open.last().is_some_and(|e| e == "text") {
                text += &rest[..lt];
            } else {
                assert!(
                    rest[..lt].trim().is_empty() || !open.is_empty(),
                    "text outside the root: {rest}"
                );
            }
            let gt = rest[lt..].find('>').expect("a tag is closed") + lt;
            let tag = &rest[lt + 1..gt];
            rest = &rest[gt + 1..];
            if tag.starts_with('?') || tag.starts_with('!') {
                continue;
            }
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop().as_deref(), Some(name.trim()), "mis-nested </{name}>");
                if name.trim() == "text" {
                    p.texts.push(unescape(text.trim()));
                    text.clear();
                }
                continue;
            }
            let name = tag.split([' ', '\n', '/']).next().expect("a name").to_string();
            if name == "svg" && p.elements.is_empty() {
                let num = |a| attr(tag, a).and_then(|v| v.trim_end_matches("px").parse().ok());
                p.width = num("width").unwrap_or(f64::NAN);
                p.height = num("height").unwrap_or(f64::NAN);
            }
            assert!(!p.elements.is_empty() || name == "svg", "the root is not <svg>: {tag}");
            p.elements.push(name.clone());
            if !tag.ends_with('/') {
                open.push(name);
            }
        }
        assert!(open.is_empty(), "unclosed elements {open:?}");
        p
    }

    fn has(p: &Parsed, text: &str) -> bool {
        p.texts.iter().any(|t| t == text)
    }

    #[test]
    fn latency_chart_has_one_bar_per_row_and_escapes_labels() {
        let rows = vec![
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
        let s = latencies("t", rows).svg();
        let p = parse(&s);
        for t in ["uffd <floor>", "remote", "15.0 / 40.0", "t"] {
            assert!(has(&p, t), "{t} missing: {:?}", p.texts);
        }
        assert!(!s.contains("NaN\""), "no NaN coordinates: {s}");
    }

    #[test]
    fn fraction_chart_labels_every_bar_with_its_group() {
        let bars = vec![
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
        // Groups stay together, in the order they first appear.
        let (groups, rows) = grouped(&bars);
        assert_eq!(groups, ["scan", "gups"]);
        let labels: Vec<&str> = rows.iter().map(|b| b.label.as_str()).collect();
        assert_eq!(labels, ["a", "c", "b"]);
        let s = fractions("t & u", bars).svg();
        let p = parse(&s);
        for l in ["scan · a", "scan · c", "gups · b", "t & u", "0.5000"] {
            assert!(has(&p, l), "{l} missing: {:?}", p.texts);
        }
        assert_eq!(p.height, 110.0 + 3.0 * ROW as f64);
        assert!(!s.contains("NaN") && !s.contains("inf\""), "{s}");
    }

    #[test]
    fn line_panels_draw_every_line_with_its_legend() {
        let chart = Chart::Lines {
            panels: vec![
                LinePanel {
                    title: "put".into(),
                    x_desc: "bytes".into(),
                    y_desc: "ns".into(),
                    lines: vec![
                        Line {
                            label: "tcp inline".into(),
                            points: vec![(8.0, 100.0), (4096.0, 900.0)],
                        },
                        Line {
                            label: "local memcpy".into(),
                            points: vec![(8.0, 1.0), (4096.0, 0.0), (f64::NAN, 3.0)],
                        },
                    ],
                },
                LinePanel {
                    title: "get".into(),
                    x_desc: "bytes".into(),
                    y_desc: "ns".into(),
                    lines: Vec::new(),
                },
            ],
        };
        let s = chart.svg();
        let p = parse(&s);
        for t in ["put", "get", "tcp inline", "local memcpy", "bytes", "ns"] {
            assert!(has(&p, t), "{t} missing: {:?}", p.texts);
        }
        assert_eq!(p.height, 2.0 * PANEL as f64);
        // Two lines and their two legend marks.
        let wide = s
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains("stroke-width=\"2\""))
            .count();
        assert_eq!(wide, 4, "{s}");
        assert!(!s.contains("NaN"), "{s}");
    }

    #[test]
    fn stacked_charts_are_drawn_into_one_area_in_order() {
        let a = fractions(
            "a chart",
            vec![Bar {
                group: "g".into(),
                label: "l".into(),
                fraction: 0.5,
            }],
        );
        let b = latencies(
            "b chart",
            vec![LatencyBar {
                label: "uffd floor".into(),
                p50_us: 3.0,
                p99_us: 4.0,
            }],
        );
        let (ha, hb) = (a.height(), b.height());
        let s = stack(&[("workloads".into(), a), ("floors".into(), b)]);
        let p = parse(&s);
        assert_eq!(
            p.elements.iter().filter(|e| *e == "svg").count(),
            1,
            "one document, none nested: {s}"
        );
        assert_eq!(p.height, f64::from(ha + hb + 2 * HEADING));
        assert_eq!(p.width, f64::from(WIDTH));
        let at = |t: &str| {
            p.texts
                .iter()
                .position(|x| x == t)
                .unwrap_or_else(|| panic!("{t} missing: {:?}", p.texts))
        };
        assert!(at("workloads") < at("a chart") && at("a chart") < at("g · l"));
        assert!(at("g · l") < at("floors") && at("floors") < at("b chart") && at("b chart") < at("uffd floor"));
        assert_eq!(parse(&stack(&[])).elements, ["svg", "rect"]);
    }
}
