//! `rackmem bench`: measurements, each printed as a table next to its floor or peer and written
//! as JSON.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use rackmem_bench::floors::{link_floor, uffd_floor, Waiting};
use rackmem_bench::workloads::{build, num, run};
use rackmem_bench::Summary;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    which: Which,
    /// Where to write the JSON results.
    #[arg(long, global = true, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Directory with the C workloads.
    #[arg(long, global = true, value_name = "DIR", default_value = "bench")]
    bench_dir: PathBuf,
}

#[derive(Subcommand)]
enum Which {
    /// The floors: userfaultfd fault from local memory (blocking and busy-polling handler) and
    /// 4 KiB / 64 KiB request-response on each transport.
    Floors {
        /// Samples per floor.
        #[arg(long, default_value_t = 20000)]
        samples: usize,
    },
    /// Remote 4 KiB fault latency seen by an unmodified program (prefetch off), beside the floors.
    Latency {
        /// Samples per floor and random touches of the program.
        #[arg(long, default_value_t = 20000)]
        samples: usize,
        /// Footprint of the program.
        #[arg(long, default_value_t = 256)]
        mib: usize,
    },
    /// Sequential read+write scan: native, and under rackmem with 25%, 50%, 100% local buffers.
    Scan {
        /// Footprint.
        #[arg(long, default_value_t = 1024)]
        mib: usize,
        /// Passes over the buffer.
        #[arg(long, default_value_t = 3)]
        passes: usize,
    },
}

fn floors(samples: usize) -> Result<Vec<Summary>> {
    let mut v = Vec::new();
    for w in [Waiting::Blocking, Waiting::BusyPoll] {
        v.push(uffd_floor(w, samples).context("userfaultfd floor")?);
    }
    for t in ["unix", "tcp"] {
        for bytes in [4096, 65536] {
            v.push(link_floor(t, bytes, samples / 4).context("link floor")?);
        }
    }
    Ok(v)
}

fn print_summaries(title: &str, rows: &[Summary]) {
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
    println!("{title}\n{t}");
}

fn write_json(path: Option<&Path>, value: &serde_json::Value) -> Result<()> {
    if let Some(p) = path {
        std::fs::write(p, serde_json::to_string_pretty(value)?).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("rackmem bench: results written to {}", p.display());
    }
    Ok(())
}

fn rackmem_run(local: &str, extra: &[&str], prog: &Path, args: &[String]) -> Result<Command> {
    let mut c = Command::new(std::env::current_exe().context("locating rackmem")?);
    c.args(["run", "--local", local])
        .args(extra)
        .arg("--")
        .arg(prog)
        .args(args);
    Ok(c)
}

pub fn run_bench(args: BenchArgs) -> Result<i32> {
    let tmp = std::env::temp_dir().join(format!("rackmem-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = match args.which {
        Which::Floors { samples } => {
            let f = floors(samples)?;
            print_summaries("Floors (same run)", &f);
            write_json(args.json.as_deref(), &serde_json::json!({ "floors": f }))
        }
        Which::Latency { samples, mib } => {
            let f = floors(samples)?;
            let prog = build(&args.bench_dir, "fault_latency", &tmp)?;
            let pargs = vec![mib.to_string(), samples.to_string()];
            let native = run({
                let mut c = Command::new(&prog);
                c.args(&pargs);
                c
            })?;
            let unix = run(rackmem_run("25%", &["--prefetch", "0"], &prog, &pargs)?)?;
            let mut rows = f.clone();
            for (name, kv) in [
                ("touch, native (resident page)", &native),
                ("remote 4 KiB fault, rackmem, unix link, 25% local, prefetch off", &unix),
            ] {
                rows.push(Summary {
                    name: name.into(),
                    samples,
                    p50_us: num(kv, "p50_us"),
                    p99_us: num(kv, "p99_us"),
                    mean_us: num(kv, "mean_us"),
                });
            }
            print_summaries("Remote fault latency beside the floors (same run)", &rows);
            let floor = |n: &str| f.iter().find(|s| s.name.contains(n)).map_or(f64::NAN, |s| s.p50_us);
            let uffd = floor("busy-polling").min(floor("blocking"));
            let link = floor("unix, 4 KiB");
            let remote = num(&unix, "p50_us");
            println!(
                "remote fault p50 {:.1} µs = {:.2} × (best uffd floor {:.1} µs + unix 4 KiB link floor {:.1} µs)",
                remote,
                remote / (uffd + link),
                uffd,
                link
            );
            write_json(
                args.json.as_deref(),
                &serde_json::json!({ "rows": rows, "ratio_to_floors": remote / (uffd + link) }),
            )
        }
        Which::Scan { mib, passes } => {
            let prog = build(&args.bench_dir, "scan", &tmp)?;
            let pargs = vec![mib.to_string(), passes.to_string()];
            let native = run({
                let mut c = Command::new(&prog);
                c.args(&pargs);
                c
            })?;
            let base = num(&native, "mb_per_s");
            let mut t = comfy_table::Table::new();
            t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
            t.set_header(vec!["setup", "MB/s", "vs native"]);
            t.add_row(vec![
                "native (all local)".to_string(),
                format!("{base:.0}"),
                "1.00".into(),
            ]);
            let mut json = vec![serde_json::json!({"setup": "native", "mb_per_s": base})];
            for local in ["100%", "50%", "25%"] {
                let kv = run(rackmem_run(local, &[], &prog, &pargs)?)?;
                if kv.get("checksum") != native.get("checksum") {
                    anyhow::bail!("scan under rackmem --local {local} computed a different checksum");
                }
                let r = num(&kv, "mb_per_s");
                t.add_row(vec![
                    format!("rackmem, {local} local, unix link"),
                    format!("{r:.0}"),
                    format!("{:.3}", r / base),
                ]);
                json.push(
                    serde_json::json!({"setup": format!("rackmem {local}"), "mb_per_s": r, "vs_native": r / base}),
                );
            }
            println!("Sequential scan, {mib} MiB, {passes} passes (same run)\n{t}");
            write_json(args.json.as_deref(), &serde_json::json!({ "scan": json }))
        }
    };
    let _ = std::fs::remove_dir_all(&tmp);
    result.map(|_| 0)
}
