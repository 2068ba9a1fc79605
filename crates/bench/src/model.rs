//! `rackmem model link`: what a remote fault and a stream would cost over other networks, from
//! the link model of `rackmem-model` and this machine's software costs.
//!
//! The software costs are the floors: userfaultfd's own fault (trap, event, wake), and a 4 KiB
//! and a 64 KiB read over a loopback link (what framing, system calls and copies cost per
//! request and per page when the wire costs nothing). They are measured in this run, or read
//! from the JSON of an earlier `rackmem bench floors` or `rackmem bench latency`; the latter
//! also carries the runtime's own overhead per fault (the program's remote fault over the
//! link minus both floors), which is added per request.

use crate::{BenchError, Output, Summary};
use rackmem_model::link::{Link, Software, Transfer};
use std::path::PathBuf;

/// What `rackmem model link` predicts for.
#[derive(Debug, Clone)]
pub struct LinkModelConfig {
    /// The networks, as parsed link specifications.
    pub links: Vec<Link>,
    /// The loopback transport whose floors stand for the software: `unix` or `tcp`.
    pub transport: String,
    /// Read the floors from this JSON instead of measuring them.
    pub calibrate: Option<PathBuf>,
    /// Samples per floor when measuring.
    pub samples: usize,
}

/// The software figures, and where they came from.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Calibration {
    /// Per fault, per request, per page.
    pub software: Software,
    /// The floors used (median microseconds).
    pub uffd_floor_us: f64,
    /// The 4 KiB link floor.
    pub link_4k_us: f64,
    /// The 64 KiB link floor.
    pub link_64k_us: f64,
    /// The runtime's own overhead per remote fault, when the source had it.
    pub runtime_overhead_us: Option<f64>,
    /// `measured in this run` or the file's path.
    pub source: String,
    /// The loopback transport whose floors were used.
    pub transport: String,
}

/// Every object with `name` and `p50_us` anywhere in a bench document.
fn summaries(v: &serde_json::Value, out: &mut Vec<Summary>) {
    match v {
        serde_json::Value::Array(a) => a.iter().for_each(|x| summaries(x, out)),
        serde_json::Value::Object(o) => {
            if o.contains_key("name") && o.contains_key("p50_us") {
                if let Ok(s) = serde_json::from_value::<Summary>(v.clone()) {
                    out.push(s);
                }
            } else {
                o.values().for_each(|x| summaries(x, out));
            }
        }
        _ => {}
    }
}

/// The software figures from floors (and, when present, a remote fault over the same
/// transport's link) named as `bench floors` and `bench latency` name them.
pub fn calibrate(rows: &[Summary], transport: &str, source: &str) -> Result<Calibration, BenchError> {
    let find = |needle: &str| {
        rows.iter()
            .find(|s| s.name.contains(needle) && s.p50_us > 0.0)
            .map(|s| s.p50_us)
    };
    let missing = |what: &str| {
        BenchError::Config(format!(
            "{source}: no {what} among its figures (give the JSON of `rackmem bench floors` or `rackmem bench latency`)"
        ))
    };
    let uffd = [find("uffd floor, busy-polling"), find("uffd floor, blocking")]
        .into_iter()
        .flatten()
        .reduce(f64::min)
        .ok_or_else(|| missing("userfaultfd floor"))?;
    let l4 = find(&format!("link floor, {transport}, 4 KiB"))
        .ok_or_else(|| missing(&format!("{transport} 4 KiB link floor")))?;
    let l64 = find(&format!("link floor, {transport}, 64 KiB"))
        .ok_or_else(|| missing(&format!("{transport} 64 KiB link floor")))?;
    let link_name = if transport == "unix" { "unix link" } else { "tcp link" };
    let overhead = rows
        .iter()
        .find(|s| s.name.starts_with("remote 4 KiB fault") && s.name.contains(link_name))
        .map(|s| (s.p50_us - uffd - l4).max(0.0));
    // Per page: what 15 more pages added to the 64 KiB read; per request: the rest of the 4 KiB
    // read, plus the runtime's own bookkeeping when known.
    let page_us = ((l64 - l4) / 15.0).max(0.0);
    let request_us = (l4 - page_us).max(0.0) + overhead.unwrap_or(0.0);
    Ok(Calibration {
        software: Software {
            fault_s: uffd * 1e-6,
            request_s: request_us * 1e-6,
            page_s: page_us * 1e-6,
        },
        uffd_floor_us: uffd,
        link_4k_us: l4,
        link_64k_us: l64,
        runtime_overhead_us: overhead,
        source: source.to_string(),
        transport: transport.to_string(),
    })
}

/// Runs `rackmem model link`.
pub fn run_link(cfg: &LinkModelConfig) -> Result<Output, BenchError> {
    if !matches!(cfg.transport.as_str(), "unix" | "tcp") {
        return Err(BenchError::Config(format!(
            "--software-of {:?}: unix or tcp",
            cfg.transport
        )));
    }
    let cal = match &cfg.calibrate {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| BenchError::Config(format!("{}: {e}", p.display())))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| BenchError::Config(format!("{}: not JSON: {e}", p.display())))?;
            let mut rows = Vec::new();
            summaries(&v, &mut rows);
            calibrate(&rows, &cfg.transport, &p.display().to_string())?
        }
        None => {
            let pb = crate::progress::bar(crate::floors::STEPS);
            let f = crate::floors::all(cfg.samples, &pb);
            pb.finish_and_clear();
            calibrate(&f?, &cfg.transport, "measured in this run")?
        }
    };
    Ok(predict(&cfg.links, &cal))
}

/// The prediction tables for `links` with the software of `cal`.
pub fn predict(links: &[Link], cal: &Calibration) -> Output {
    let sw = cal.software;
    let us = |s: f64| s * 1e6;
    let gbs = |b: f64| b / 1e9;
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "link",
        "one-way latency µs",
        "line rate GB/s",
        "4 KiB fault µs",
        "64 KiB fault µs",
        "stream GB/s, 1 in flight",
        "stream GB/s, 16 in flight",
        "wire efficiency 4 KiB / 64 KiB",
    ]);
    let mut json_links = Vec::new();
    for l in links {
        let (one, sixteen) = (Transfer::read(1), Transfer::read(16));
        let row = serde_json::json!({
            "link": l,
            "fault_4k_us": us(l.fault_s(one, sw)),
            "fault_64k_us": us(l.fault_s(sixteen, sw)),
            "stream_64k_depth1_gb_per_s": gbs(l.stream_bytes_per_s(sixteen, sw, 1)),
            "stream_64k_depth16_gb_per_s": gbs(l.stream_bytes_per_s(sixteen, sw, 16)),
            "efficiency_4k": l.efficiency(one),
            "efficiency_64k": l.efficiency(sixteen),
        });
        t.add_row(vec![
            l.name.clone(),
            format!("{:.2}", us(l.latency_s)),
            format!("{:.2}", gbs(l.bandwidth_bytes_per_s * f64::from(l.lanes))),
            format!("{:.1}", us(l.fault_s(one, sw))),
            format!("{:.1}", us(l.fault_s(sixteen, sw))),
            format!("{:.2}", gbs(l.stream_bytes_per_s(sixteen, sw, 1))),
            format!("{:.2}", gbs(l.stream_bytes_per_s(sixteen, sw, 16))),
            format!(
                "{:.0}% / {:.0}%",
                100.0 * l.efficiency(one),
                100.0 * l.efficiency(sixteen)
            ),
        ]);
        json_links.push(row);
    }
    // Seed 000's Table I, one level up: what a read of b pages puts on the first link's wire,
    // and how busy the link is one request at a time against pipelined.
    let mut p = comfy_table::Table::new();
    p.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    p.set_header(vec![
        "pages per read",
        "request bytes (packets)",
        "response bytes (packets)",
        "on the wire",
        "payload share, pipelined",
        "payload share, one at a time",
    ]);
    let mut packetization = Vec::new();
    if let Some(l) = links.first() {
        for b in [1u32, 4, 16, 64, 256] {
            let tr = Transfer::read(b);
            let (rq, rs) = (tr.request_bytes(), tr.response_bytes());
            p.add_row(vec![
                b.to_string(),
                format!("{rq} ({})", l.packets(rq)),
                format!("{rs} ({})", l.packets(rs)),
                format!("{}", l.wire_bytes(rq) + l.wire_bytes(rs)),
                format!("{:.1}%", 100.0 * l.efficiency(tr)),
                format!("{:.1}%", 100.0 * l.one_at_a_time_utilisation(tr, sw)),
            ]);
            packetization.push(serde_json::json!({
                "pages": b, "request_bytes": rq, "response_bytes": rs,
                "request_packets": l.packets(rq), "response_packets": l.packets(rs),
                "wire_bytes": l.wire_bytes(rq) + l.wire_bytes(rs),
                "efficiency_pipelined": l.efficiency(tr),
                "utilisation_one_at_a_time": l.one_at_a_time_utilisation(tr, sw),
            }));
        }
    }
    let overhead = cal.runtime_overhead_us.map_or(
        "not in the source: add `rackmem bench latency`'s JSON to include it".to_string(),
        |o| format!("{o:.1} µs"),
    );
    let text = format!(
        "Software of this machine ({}): userfaultfd floor {:.1} µs; {} loopback link floors 4 KiB {:.1} µs, 64 KiB {:.1} µs \
         → per request {:.1} µs, per page {:.2} µs; runtime overhead per fault {}\n\
         Predicted remote faults and streams (model: docs/model.md)\n{t}\n\
         Frames on the wire of {}, reads of b pages (seed 000 Table I, one level up)\n{p}\n",
        cal.source,
        cal.uffd_floor_us,
        cal.transport,
        cal.link_4k_us,
        cal.link_64k_us,
        us(sw.request_s),
        us(sw.page_s),
        overhead,
        links.first().map_or("", |l| l.name.as_str()),
    );
    Output {
        text,
        chart: None,
        json: serde_json::json!({
            "calibration": cal,
            "links": json_links,
            "packetization": packetization,
        }),
    }
}

/// One prediction of `rackmem model check`: a rackmem run's slowdown over the native run,
/// measured and predicted from its counters.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Checked {
    /// Workload or application.
    pub name: String,
    /// The setup (and threads, for seed runs).
    pub setup: String,
    /// Local buffer, percent.
    pub local_pct: u32,
    /// Measured slowdown (time ÷ native time).
    pub measured: f64,
    /// Predicted: (native time + faults × C-AMAT₂) ÷ native time.
    pub predicted: f64,
}

impl Checked {
    /// Predicted ÷ measured.
    pub fn ratio(&self) -> f64 {
        self.predicted / self.measured
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// The slowdown C-AMAT predicts: the native time plus the time any fault was outstanding.
fn predict_slowdown(native_s: f64, faults: f64, fault_mean_s: f64, concurrency: f64) -> f64 {
    (native_s + faults * fault_mean_s / concurrency.max(1.0)) / native_s
}

/// Every prediction a bench document allows: `bench workloads` rows with counters (whole
/// process wall time), and `bench seeds` runs.
pub fn predictions(doc: &serde_json::Value) -> Vec<Checked> {
    let mut out = Vec::new();
    if let Some(rows) = doc["workloads"].as_array() {
        for r in rows {
            let (Some(counters), Some(walls)) = (r["counters"].as_array(), r["wall_s"].as_array()) else {
                continue;
            };
            let name = r["workload"].as_str().unwrap_or_default();
            let Some(native) = rows
                .iter()
                .find(|n| n["workload"] == r["workload"] && n["setup"] == "native")
                .and_then(|n| median(n["wall_s"].as_array()?.iter().filter_map(|x| x.as_f64()).collect()))
            else {
                continue;
            };
            let measured = median(walls.iter().filter_map(|x| x.as_f64()).collect());
            let predicted = median(
                counters
                    .iter()
                    .map(|c| {
                        predict_slowdown(
                            native,
                            c["faults"].as_f64().unwrap_or(0.0),
                            c["fault_mean_ns"].as_f64().unwrap_or(0.0) * 1e-9,
                            c["miss_concurrency"].as_f64().unwrap_or(1.0),
                        )
                    })
                    .collect(),
            );
            if let (Some(m), Some(p)) = (measured, predicted) {
                out.push(Checked {
                    name: name.to_string(),
                    setup: r["setup"].as_str().unwrap_or_default().to_string(),
                    local_pct: r["local_pct"].as_u64().unwrap_or(0) as u32,
                    measured: m / native,
                    predicted: p,
                });
            }
        }
    }
    if let Some(rows) = doc["fig4"].as_array() {
        for r in rows {
            // Whole-process wall time where recorded (the counters cover setup too).
            let time = |x: &serde_json::Value| x["wall_s"].as_f64().or_else(|| x["seconds"].as_f64());
            let native = time(&r["lmem"]).unwrap_or(f64::NAN);
            for (key, pct) in [("xmem75", 75), ("xmem25", 25)] {
                let x = &r[key];
                let (Some(s), Some(f), Some(m), Some(c)) = (
                    time(x),
                    x["faults"].as_f64(),
                    x["fault_mean_us"].as_f64(),
                    x["miss_concurrency"].as_f64(),
                ) else {
                    continue;
                };
                if native > 0.0 {
                    out.push(Checked {
                        name: r["app"].as_str().unwrap_or_default().to_string(),
                        setup: format!("{} thread(s)", r["threads"]),
                        local_pct: pct,
                        measured: s / native,
                        predicted: predict_slowdown(native, f, m * 1e-6, c),
                    });
                }
            }
        }
    }
    out
}

/// `rackmem model check FILE`: predicted against measured slowdowns for a bench document.
pub fn check(doc: &serde_json::Value, source: &str) -> Result<Output, BenchError> {
    let checked = predictions(doc);
    if checked.is_empty() {
        return Err(BenchError::Config(format!(
            "{source}: no run with counters (give the JSON of `rackmem bench workloads` or `rackmem bench seeds` from \
             this version)"
        )));
    }
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "workload",
        "setup",
        "local",
        "measured slowdown",
        "C-AMAT predicts",
        "predicted ÷ measured",
    ]);
    for c in &checked {
        t.add_row(vec![
            c.name.clone(),
            c.setup.clone(),
            format!("{}%", c.local_pct),
            format!("{:.2} ×", c.measured),
            format!("{:.2} ×", c.predicted),
            format!("{:.3}", c.ratio()),
        ]);
    }
    let within = checked.iter().filter(|c| (c.ratio() - 1.0).abs() <= 0.15).count();
    let text = format!(
        "C-AMAT from each run's counters against its measured slowdown ({source}; docs/model.md): predicted = (native \
         time + faults × mean fault time ÷ miss concurrency) ÷ native time\n{t}\n{within} of {} within 15%\n",
        checked.len()
    );
    Ok(Output {
        text,
        chart: None,
        json: serde_json::json!({ "checked": checked, "within_15_percent": within }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(name: &str, p50: f64) -> Summary {
        Summary {
            name: name.into(),
            samples: 1,
            p50_us: p50,
            p99_us: p50,
            mean_us: p50,
        }
    }

    #[test]
    fn calibration_reads_the_floors_and_the_runtime_overhead() {
        let rows = vec![
            s("uffd floor, blocking handler", 40.0),
            s("uffd floor, busy-polling handler", 16.0),
            s("link floor, unix, 4 KiB read", 26.0),
            s("link floor, unix, 64 KiB read", 41.0),
            s("remote 4 KiB fault, rackmem, unix link, 25% local, prefetch off", 45.0),
        ];
        let c = calibrate(&rows, "unix", "test").unwrap();
        assert_eq!(c.uffd_floor_us, 16.0);
        assert!((c.software.page_s - 1e-6).abs() < 1e-12);
        assert_eq!(c.runtime_overhead_us, Some(3.0));
        assert!((c.software.request_s - 28e-6).abs() < 1e-12);
        assert!(calibrate(&rows, "tcp", "test").is_err());
    }

    #[test]
    fn check_predicts_workload_and_seed_runs_from_their_counters() {
        let doc = serde_json::json!({
            "workloads": [
                {"workload": "gups", "setup": "native", "local_pct": 100, "wall_s": [1.0, 1.2, 0.8]},
                {"workload": "gups", "setup": "rackmem defaults", "local_pct": 25, "wall_s": [3.0],
                 "counters": [{"faults": 100000, "fault_mean_ns": 20000, "miss_concurrency": 1.0}]},
                {"workload": "gups", "setup": "zram", "local_pct": 25, "wall_s": [9.0]},
            ],
            "fig4": [
                {"app": "cg", "threads": 2, "lmem": {"seconds": 2.0},
                 "xmem25": {"seconds": 4.0, "faults": 50000.0, "fault_mean_us": 40.0, "miss_concurrency": 2.0}},
            ],
        });
        let p = predictions(&doc);
        assert_eq!(p.len(), 2, "{p:?}");
        // 1 s native + 100,000 × 20 µs = 3 s: exactly the measured 3 s.
        assert!((p[0].predicted - 3.0).abs() < 1e-9 && (p[0].measured - 3.0).abs() < 1e-9);
        // 2 s + 50,000 × 40 µs ÷ 2 = 3 s against 4 s measured: 1.5 × against 2 ×.
        assert!((p[1].predicted - 1.5).abs() < 1e-9 && (p[1].measured - 2.0).abs() < 1e-9);
        let out = check(&doc, "test").unwrap();
        assert!(out.text.contains("1 of 2 within 15%"), "{}", out.text);
        assert!(check(&serde_json::json!({"rows": []}), "x").is_err());
    }

    #[test]
    fn predictions_name_every_link_and_json_carries_them() {
        let cal = calibrate(
            &[
                s("uffd floor, busy-polling handler", 10.0),
                s("link floor, unix, 4 KiB read", 20.0),
                s("link floor, unix, 64 KiB read", 35.0),
            ],
            "unix",
            "test",
        )
        .unwrap();
        let links = rackmem_model::link::presets();
        let out = predict(&links, &cal);
        for l in &links {
            assert!(out.text.contains(&l.name));
        }
        assert_eq!(out.json["links"].as_array().map(Vec::len), Some(links.len()));
        assert_eq!(out.json["packetization"].as_array().map(Vec::len), Some(5));
    }
}
