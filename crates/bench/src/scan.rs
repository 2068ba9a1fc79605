//! `rackmem bench scan`: a sequential read+write scan (`bench/scan.c`) natively, and under
//! `rackmem run` (its defaults) with 100%, 50% and 25% local buffers, over the embedded brick
//! and over each loopback brick asked for (with `tcp` and `tls`: TLS ÷ TCP per local buffer).
//! Every run's checksum must equal the native run's.

use crate::loopback::{LinkKind, LoopbackBrick};
use crate::programs::{build, num, run as run_program};
use crate::rackmem::Rackmem;
use crate::{BenchError, Output};
use std::path::PathBuf;
use std::process::Command;

/// The local buffers, in the order run.
const LOCALS: [&str; 3] = ["100%", "50%", "25%"];

/// What `bench scan` measures.
#[derive(Debug, Clone)]
pub struct ScanConfig {
    /// Footprint, MiB.
    pub mib: usize,
    /// Passes over the buffer.
    pub passes: usize,
    /// Loopback bricks to run against too.
    pub links: Vec<LinkKind>,
    /// The `rackmem` the program runs under.
    pub rackmem: Rackmem,
    /// Directory with the C programs.
    pub bench_dir: PathBuf,
    /// Scratch directory.
    pub tmp: PathBuf,
}

/// Runs `bench scan`.
pub fn run(cfg: &ScanConfig) -> Result<Output, BenchError> {
    let bricks = LoopbackBrick::start_each(&cfg.links, 64 << 30, &cfg.tmp)?;
    let pb = crate::progress::bar(4 + 3 * bricks.len() as u64);
    let r = measure(cfg, &bricks, &pb);
    pb.finish_and_clear();
    r
}

fn measure(cfg: &ScanConfig, bricks: &[LoopbackBrick], pb: &indicatif::ProgressBar) -> Result<Output, BenchError> {
    let mib = cfg.mib;
    pb.set_message("scan, native");
    let prog = build(&cfg.bench_dir, "scan", &cfg.tmp)?;
    let pargs = vec![mib.to_string(), cfg.passes.to_string()];
    let native = run_program({
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
    let mut bars = Vec::new();
    pb.inc(1);
    // The default setup (embedded brick), then each loopback brick asked for.
    let mut setups: Vec<(String, Vec<String>)> = vec![("defaults".into(), Vec::new())];
    for b in bricks {
        let kind = b.addr.split("://").next().unwrap_or("tcp");
        setups.push((format!("{kind} link (loopback)"), b.run_args()));
    }
    let mut by_setup: Vec<(String, String, f64)> = Vec::new();
    for (setup, extra) in &setups {
        for local in LOCALS {
            pb.set_message(format!("scan, rackmem, {local} local, {setup}"));
            let kv = run_program(cfg.rackmem.run(local, extra, &prog, &pargs))?;
            pb.inc(1);
            if kv.get("checksum") != native.get("checksum") {
                return Err(BenchError::Workload(format!(
                    "scan under rackmem --local {local} ({setup}) computed a different checksum"
                )));
            }
            let r = num(&kv, "mb_per_s");
            by_setup.push((setup.clone(), local.to_string(), r));
            t.add_row(vec![
                format!("rackmem, {local} local, {setup}"),
                format!("{r:.0}"),
                format!("{:.3}", r / base),
            ]);
            json.push(
                serde_json::json!({"setup": format!("rackmem {local} {setup}"), "mb_per_s": r, "vs_native": r / base}),
            );
            bars.push(crate::chart::Bar {
                group: format!("scan, {mib} MiB"),
                label: format!("rackmem {local} local, {setup}"),
                fraction: r / base,
            });
        }
    }
    let mut text = String::new();
    let mut ratios = Vec::new();
    let find = |s: &str, l: &str| {
        by_setup
            .iter()
            .find(|(a, b, _)| a.starts_with(s) && b == l)
            .map(|x| x.2)
    };
    for local in LOCALS {
        if let (Some(tcp), Some(tls)) = (find("tcp", local), find("tls", local)) {
            text += &format!(
                "TLS ÷ TCP, scan throughput at {local} local (same run): {:.2} ({tls:.0} / {tcp:.0} MB/s)\n",
                tls / tcp
            );
            ratios.push(
                serde_json::json!({"local": local, "ratio": tls / tcp, "tls_mb_per_s": tls, "tcp_mb_per_s": tcp}),
            );
        }
    }
    text += &format!("Sequential scan, {mib} MiB, {} passes (same run)\n{t}\n", cfg.passes);
    Ok(Output {
        text,
        chart: Some(crate::chart::fractions(
            "Sequential scan under rackmem against all-local (same run)",
            bars,
        )),
        json: serde_json::json!({ "scan": json, "tls_vs_tcp": ratios }),
    })
}
