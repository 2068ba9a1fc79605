//! `rackmem bench seeds`: two published experiments rerun on rackmem, with the link emulated as
//! the paper's network (`rackmem run --emulate`), our slowdowns beside theirs.
//!
//! - **Seed 002, section 4.3, Fig. 4**: a conjugate-gradient solver on MiniFE's 27-point
//!   operator (`bench/cg.c`), a tiled DGEMM (`bench/dgemm.c`), Graph500 BFS (`bench/bfs.c`,
//!   single-threaded) and GUPS-style random updates (`bench/updates.c`), each all-local (Lmem),
//!   with 75% and with 25% of its footprint local (Xmem(75%), Xmem(25%)), on 1 thread and on
//!   every CPU, over the seed's InfiniBand (preset `ib-seed002`: about 3 µs, 12 GB/s). The
//!   slowdown is the time over Lmem's at the same threads, as in the seed.
//! - **Seed 004, section VI, Fig. 6**: STREAM (`bench/stream.c`) on 1 to every CPU with its
//!   arrays remote (10% local) over a 10 Gbit/s link, its bandwidth beside the link's payload
//!   ceiling, as the seed draws its transceiver's 1280 MiB/s.
//!
//! Beside each slowdown, the one C-AMAT predicts from the run's own counters (seed 002 Eq. 7
//! and 9 with the overlap of computation and misses taken as none, κ = 1): the native time plus
//! the time any fault was outstanding, `faults × mean fault time ÷ miss concurrency`. Where it
//! falls short of the measured slowdown, time went somewhere the fault counters do not see
//! (evictions and write-back beside the faults, the kernel's delivery of each fault); where it
//! overshoots, the program's other threads computed while one waited (κ < 1).

use crate::programs::{build, num, run as run_program};
use crate::rackmem::Rackmem;
use crate::{BenchError, Output};
use rackmem_model::link::{presets, Link, LinkSpec, Transfer};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What `bench seeds` runs.
#[derive(Debug, Clone)]
pub struct SeedsConfig {
    /// Size factor (1: footprints of about 100 to 200 MiB).
    pub scale: f64,
    /// Thread counts (0: every CPU).
    pub threads: Vec<usize>,
    /// The network of seed 002's runs.
    pub link: Link,
    /// The network of seed 004's STREAM.
    pub stream_link: Link,
    /// The `rackmem` measured.
    pub rackmem: Rackmem,
    /// Directory with the C programs.
    pub bench_dir: PathBuf,
    /// Scratch directory.
    pub tmp: PathBuf,
}

/// Seed 002's Xmem(25%) slowdowns over its thread counts (section 4.3).
pub const SEED002_XMEM25: [(&str, f64, f64); 4] = [
    ("cg", 3.3, 4.9),
    ("dgemm", 2.6, 9.1),
    ("bfs", 10.7, 17.5),
    ("updates", 29.5, 86.8),
];

/// The default network of seed 004's STREAM: a 10 Gbit/s transceiver, its controller's cut-through
/// overhead (134 cycles at 156.25 MHz) as latency.
pub fn seed004_link() -> Link {
    // A constant specification: parsing it cannot fail.
    "latency=1us,bandwidth=10Gbit"
        .parse::<LinkSpec>()
        .map(|l| l.0)
        .unwrap_or_else(|_| presets()[0].clone())
}

struct App {
    name: &'static str,
    prog: &'static str,
    args: Box<dyn Fn(usize) -> Vec<String>>,
    threaded: bool,
}

fn apps(scale: f64) -> Vec<App> {
    let s = scale.max(0.01);
    // Floors keep every array in the window (large allocations) even at tiny scales.
    let cg_n = ((64.0 * s.cbrt()).round() as usize).max(24);
    let dgemm_n = ((1280.0 * s.sqrt()).round() as usize).max(512);
    let bfs_scale = (19.0 + s.log2()).round().clamp(14.0, 26.0) as u32;
    let gups_mib = ((256.0 * s).round() as usize).max(16);
    let gups_updates = ((400_000.0 * s).round() as usize).max(20_000);
    vec![
        App {
            name: "cg",
            prog: "cg",
            args: Box::new(move |t| vec![cg_n.to_string(), "20".into(), t.to_string()]),
            threaded: true,
        },
        App {
            name: "dgemm",
            prog: "dgemm",
            args: Box::new(move |t| vec![dgemm_n.to_string(), t.to_string()]),
            threaded: true,
        },
        App {
            name: "bfs",
            prog: "bfs",
            args: Box::new(move |_| vec![bfs_scale.to_string(), "16".into(), "4".into()]),
            threaded: false,
        },
        App {
            name: "updates",
            prog: "updates",
            args: Box::new(move |t| vec![gups_mib.to_string(), gups_updates.to_string(), t.to_string()]),
            threaded: true,
        },
    ]
}

/// One run's figures: its time, and from its statistics faults, mean fault time and miss
/// concurrency.
#[derive(Debug, Clone, serde::Serialize)]
struct Run {
    seconds: f64,
    /// The whole process, setup included (what the fault counters cover).
    wall_s: f64,
    faults: u64,
    fault_mean_us: f64,
    miss_concurrency: f64,
    checksum: String,
}

fn timed(cmd: std::process::Command, stats: Option<&PathBuf>) -> Result<Run, BenchError> {
    if let Some(p) = stats {
        let _ = std::fs::remove_file(p);
    }
    let started = std::time::Instant::now();
    let kv = run_program(cmd)?;
    let wall_s = started.elapsed().as_secs_f64();
    let snap = stats.and_then(|p| crate::workloads::busiest_stats(p));
    Ok(Run {
        seconds: num(&kv, "seconds"),
        wall_s,
        faults: snap.as_ref().map_or(0, |s| s.faults),
        fault_mean_us: snap.as_ref().map_or(0.0, |s| s.fault_mean_ns as f64 / 1000.0),
        miss_concurrency: snap.as_ref().map_or(0.0, |s| s.faults_in_flight_mean),
        checksum: kv.get("checksum").cloned().unwrap_or_default(),
    })
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `bench seeds`.
pub fn run(cfg: &SeedsConfig) -> Result<Output, BenchError> {
    let threads: Vec<usize> = {
        let mut t: Vec<usize> = cfg.threads.iter().map(|&t| if t == 0 { cpus() } else { t }).collect();
        t.dedup();
        t
    };
    let apps = apps(cfg.scale);
    let runs = apps
        .iter()
        .map(|a| if a.threaded { threads.len() as u64 } else { 1 })
        .sum::<u64>()
        * 3
        + threads.len() as u64 * 2;
    let pb = crate::progress::bar(runs);
    let r = measure(cfg, &apps, &threads, &pb);
    pb.finish_and_clear();
    r
}

fn measure(
    cfg: &SeedsConfig,
    apps: &[App],
    threads: &[usize],
    pb: &indicatif::ProgressBar,
) -> Result<Output, BenchError> {
    let stats = cfg.tmp.join("seeds-stats.jsonl");
    let stats_arg = stats.display().to_string();
    let emulate: Vec<String> = vec![
        "--emulate".into(),
        cfg.link.name.clone(),
        "--stats-json".into(),
        stats_arg.clone(),
    ];
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "app",
        "threads",
        "Lmem s",
        "Xmem(75%) s (slowdown)",
        "Xmem(25%) s (slowdown)",
        "seed 002 Xmem(25%)",
        "C-AMAT predicts (25%, whole run)",
        "miss concurrency (25%)",
    ]);
    let mut rows = Vec::new();
    let mut bars = Vec::new();
    for app in apps {
        let prog = build(&cfg.bench_dir, app.prog, &cfg.tmp)?;
        let ts: Vec<usize> = if app.threaded { threads.to_vec() } else { vec![1] };
        for &th in &ts {
            let args = (app.args)(th);
            pb.set_message(format!("{} on {th} thread(s): Lmem", app.name));
            let mut native = std::process::Command::new(&prog);
            native.args(&args);
            let lmem = timed(native, None)?;
            pb.inc(1);
            let mut x = BTreeMap::new();
            for pct in [75u32, 25] {
                pb.set_message(format!("{} on {th} thread(s): Xmem({pct}%)", app.name));
                let r = timed(
                    cfg.rackmem.run(&format!("{pct}%"), &emulate, &prog, &args),
                    Some(&stats),
                )?;
                if r.checksum != lmem.checksum {
                    return Err(BenchError::Workload(format!(
                        "{} at {pct}% local computed checksum {} where the native run computed {}",
                        app.name, r.checksum, lmem.checksum
                    )));
                }
                x.insert(pct, r);
                pb.inc(1);
            }
            let (x75, x25) = (&x[&75], &x[&25]);
            // The counters cover the whole process, setup included: predict its wall time.
            let stall = x25.faults as f64 * x25.fault_mean_us * 1e-6 / x25.miss_concurrency.max(1.0);
            let predicted = (lmem.wall_s + stall) / lmem.wall_s;
            let seed = SEED002_XMEM25.iter().find(|s| s.0 == app.name);
            t.add_row(vec![
                app.name.to_string(),
                th.to_string(),
                format!("{:.2}", lmem.seconds),
                format!("{:.2} ({:.1} ×)", x75.seconds, x75.seconds / lmem.seconds),
                format!("{:.2} ({:.1} ×)", x25.seconds, x25.seconds / lmem.seconds),
                seed.map_or(String::new(), |s| format!("{}–{} ×", s.1, s.2)),
                format!("{predicted:.1} × (measured {:.1} ×)", x25.wall_s / lmem.wall_s),
                format!("{:.2}", x25.miss_concurrency),
            ]);
            for (label, r) in [("Xmem(75%)", x75), ("Xmem(25%)", x25)] {
                bars.push(crate::chart::Bar {
                    group: format!("{} on {th} thread(s)", app.name),
                    label: label.to_string(),
                    fraction: lmem.seconds / r.seconds,
                });
            }
            rows.push(serde_json::json!({
                "app": app.name, "threads": th, "args": args, "lmem": lmem, "xmem75": x75, "xmem25": x25,
                "slowdown75": x75.seconds / lmem.seconds, "slowdown25": x25.seconds / lmem.seconds,
                "camat_predicted_slowdown25": predicted,
                "seed002_slowdown25": seed.map(|s| [s.1, s.2]),
            }));
        }
    }
    let mut text = format!(
        "Seed 002 Fig. 4 on rackmem, link emulated as {} (median of one run each; slowdown = time ÷ Lmem's at the \
         same threads)\n{t}\n",
        cfg.link.name
    );

    // Seed 004: STREAM with its arrays remote, against the link's payload ceiling.
    let stream = build(&cfg.bench_dir, "stream", &cfg.tmp)?;
    let elements = ((10_000_000.0 * cfg.scale).round() as usize).max(100_000);
    let ceiling = cfg.stream_link.bandwidth_bytes_per_s * cfg.stream_link.efficiency(Transfer::read(16)) / 1e6;
    let mut st = comfy_table::Table::new();
    st.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    st.set_header(vec![
        "threads",
        "kernel",
        "local MB/s",
        "remote MB/s",
        "remote ÷ local",
        "remote ÷ link payload ceiling",
    ]);
    let mut stream_rows = Vec::new();
    for &th in threads {
        // Varied values: constant arrays are same-filled pages, which never cross the link.
        let args = vec![elements.to_string(), "3".into(), th.to_string(), "varied".into()];
        pb.set_message(format!("STREAM on {th} thread(s): local"));
        let local = run_program({
            let mut c = std::process::Command::new(&stream);
            c.args(&args);
            c
        })?;
        pb.inc(1);
        pb.set_message(format!("STREAM on {th} thread(s): remote"));
        let extra = vec!["--emulate".to_string(), cfg.stream_link.name.clone()];
        let remote = run_program(cfg.rackmem.run("10%", &extra, &stream, &args))?;
        pb.inc(1);
        if local.get("checksum") != remote.get("checksum") {
            return Err(BenchError::Workload("STREAM's arrays differ under rackmem".into()));
        }
        for k in ["copy", "scale", "add", "triad"] {
            let key = format!("{k}_mb_s");
            let (l, r) = (num(&local, &key), num(&remote, &key));
            st.add_row(vec![
                th.to_string(),
                k.to_string(),
                format!("{l:.0}"),
                format!("{r:.0}"),
                format!("{:.3}", r / l),
                format!("{:.2}", r / ceiling),
            ]);
            stream_rows.push(serde_json::json!({
                "threads": th, "kernel": k, "local_mb_s": l, "remote_mb_s": r, "ceiling_mb_s": ceiling,
            }));
        }
    }
    text += &format!(
        "Seed 004 Fig. 6 on rackmem: STREAM of {elements} elements, 10% local, link emulated as {} (payload ceiling \
         {ceiling:.0} MB/s; the seed: remote 1.8 to 5 × slower than local, its copy kernel 582 MiB/s on one core \
         against a 1280 MiB/s transceiver)\n{st}\n",
        cfg.stream_link.name
    );
    Ok(Output {
        text,
        chart: Some(crate::chart::fractions(
            &format!(
                "Seed 002 Fig. 4 on rackmem over {}: performance against Lmem",
                cfg.link.name
            ),
            bars,
        )),
        json: serde_json::json!({
            "link": cfg.link, "stream_link": cfg.stream_link, "fig4": rows, "stream": stream_rows,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_links_are_the_seeds() {
        let ib = presets().into_iter().find(|l| l.name == "ib-seed002").expect("preset");
        assert_eq!(ib.latency_s, 3e-6);
        let l = seed004_link();
        assert_eq!(l.bandwidth_bytes_per_s, 10e9 / 8.0);
        assert_eq!(l.name, "latency=1us,bandwidth=10Gbit");
    }

    #[test]
    fn sizes_follow_the_scale() {
        let small = apps(0.1);
        let big = apps(1.0);
        assert_eq!(small.len(), 4);
        assert!((small[0].args)(1)[0].parse::<usize>().unwrap() < (big[0].args)(1)[0].parse::<usize>().unwrap());
        assert_eq!((big[3].args)(2)[2], "2");
    }
}
