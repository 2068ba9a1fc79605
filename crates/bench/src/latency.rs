//! `rackmem bench latency`: the remote 4 KiB fault latency an unmodified program sees (the
//! `bench/fault_latency.c` program, prefetch off), beside the floors measured in the same run,
//! and where a fault's time goes inside the handler (from the runtime's statistics).
//!
//! The program runs natively (a resident touch), under `rackmem run` over the Unix link, with
//! shared memory, with shared memory on one CPU, and over each loopback brick asked for (`tcp`,
//! `tls`; with both, what TLS costs as TLS ÷ TCP).

use crate::loopback::{LinkKind, LoopbackBrick};
use crate::programs::{build, num, run as run_program};
use crate::rackmem::Rackmem;
use crate::{BenchError, Output, Summary};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// What `bench latency` measures.
#[derive(Debug, Clone)]
pub struct LatencyConfig {
    /// Samples per floor, and random touches of the program.
    pub samples: usize,
    /// Footprint of the program, MiB.
    pub mib: usize,
    /// Loopback bricks to run the program against too.
    pub links: Vec<LinkKind>,
    /// The `rackmem` the program runs under.
    pub rackmem: Rackmem,
    /// Directory with the C programs.
    pub bench_dir: PathBuf,
    /// Scratch directory (program, certificates, statistics).
    pub tmp: PathBuf,
}

/// Runs `bench latency`.
pub fn run(cfg: &LatencyConfig) -> Result<Output, BenchError> {
    let bricks = LoopbackBrick::start_each(&cfg.links, 64 << 30, &cfg.tmp)?;
    let pb = crate::progress::bar(crate::floors::STEPS + 4 + bricks.len() as u64);
    let r = measure(cfg, &bricks, &pb);
    pb.finish_and_clear();
    r
}

fn measure(cfg: &LatencyConfig, bricks: &[LoopbackBrick], pb: &indicatif::ProgressBar) -> Result<Output, BenchError> {
    let samples = cfg.samples;
    let f = crate::floors::all(samples, pb)?;
    pb.set_message("fault_latency, native");
    let prog = build(&cfg.bench_dir, "fault_latency", &cfg.tmp)?;
    let pargs = vec![cfg.mib.to_string(), samples.to_string()];
    let native = run_program({
        let mut c = Command::new(&prog);
        c.args(&pargs);
        c
    })?;
    pb.inc(1);
    let under = |extra: &[&str]| run_program(cfg.rackmem.run("25%", extra, &prog, &pargs));
    pb.set_message("fault_latency, rackmem, 25% local");
    let stats_path = cfg.tmp.join("latency-stats.jsonl");
    let stats_arg = stats_path.to_string_lossy().into_owned();
    let unix = under(&["--prefetch", "0", "--no-shared-memory", "--stats-json", &stats_arg])?;
    pb.inc(1);
    pb.set_message("fault_latency, rackmem, 25% local, shared memory");
    let shm_stats_path = cfg.tmp.join("latency-stats-shm.jsonl");
    let _ = std::fs::remove_file(&shm_stats_path);
    let shm_stats_arg = shm_stats_path.to_string_lossy().into_owned();
    let shm = under(&["--prefetch", "0", "--shared-memory", "--stats-json", &shm_stats_arg])?;
    pb.inc(1);
    pb.set_message("fault_latency, rackmem, 25% local, shared memory, one CPU");
    let shm_one_cpu = under(&["--prefetch", "0", "--shared-memory", "--cpus", "0"])?;
    pb.inc(1);
    let mut over_links = Vec::new();
    for b in bricks {
        let kind = b.addr.split("://").next().unwrap_or("tcp").to_string();
        pb.set_message(format!("fault_latency, rackmem, 25% local, {kind} loopback brick"));
        let mut extra: Vec<String> = vec!["--prefetch".into(), "0".into()];
        extra.extend(b.run_args());
        over_links.push((kind, run_program(cfg.rackmem.run("25%", &extra, &prog, &pargs))?));
        pb.inc(1);
    }
    let first_snap = |p: &std::path::Path| -> Option<rackmem_runtime::stats::StatsSnapshot> {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| serde_json::from_str(l).ok()))
    };
    let snap = first_snap(&stats_path);
    let shm_snap = first_snap(&shm_stats_path);

    let summary = |name: String, kv: &BTreeMap<String, String>| Summary {
        name,
        samples,
        p50_us: num(kv, "p50_us"),
        p99_us: num(kv, "p99_us"),
        mean_us: num(kv, "mean_us"),
    };
    let mut rows = f.clone();
    for (name, kv) in [
        ("touch, native (resident page)", &native),
        ("remote 4 KiB fault, rackmem, unix link, 25% local, prefetch off", &unix),
        (
            "remote 4 KiB fault, rackmem, shared memory, 25% local, prefetch off",
            &shm,
        ),
        (
            "remote 4 KiB fault, rackmem, shared memory, program and handler on CPU 0",
            &shm_one_cpu,
        ),
    ] {
        rows.push(summary(name.into(), kv));
    }
    for (kind, kv) in &over_links {
        rows.push(summary(
            format!("remote 4 KiB fault, rackmem, {kind} link (loopback), 25% local, prefetch off"),
            kv,
        ));
    }

    let mut text = String::new();
    let by_kind = |k: &str| over_links.iter().find(|(n, _)| n == k).map(|(_, kv)| kv);
    let mut tls_vs_tcp = serde_json::Value::Null;
    if let (Some(tcp), Some(tls)) = (by_kind("tcp"), by_kind("tls")) {
        let ratio = |m: &str| num(tls, m) / num(tcp, m);
        text += &format!(
            "TLS ÷ TCP, remote 4 KiB fault (same run): p50 {:.2} ({:.1} / {:.1} µs), p99 {:.2}, mean {:.2}\n",
            ratio("p50_us"),
            num(tls, "p50_us"),
            num(tcp, "p50_us"),
            ratio("p99_us"),
            ratio("mean_us"),
        );
        tls_vs_tcp = serde_json::json!({
            "p50": ratio("p50_us"), "p99": ratio("p99_us"), "mean": ratio("mean_us"),
        });
    }
    text += &crate::summary::table("Remote fault latency beside the floors (same run)", &rows);
    let floor = |n: &str| f.iter().find(|s| s.name.contains(n)).map_or(f64::NAN, |s| s.p50_us);
    let uffd = floor("busy-polling").min(floor("blocking"));
    let link = floor("unix, 4 KiB");
    let remote = num(&unix, "p50_us");
    text += &format!(
        "remote fault p50 {:.1} µs = {:.2} × (best uffd floor {:.1} µs + unix 4 KiB link floor {:.1} µs)\n",
        remote,
        remote / (uffd + link),
        uffd,
        link
    );
    text += &format!(
        "shared-memory fault p50 {:.1} µs = {:.2} × best uffd floor (no link on this path); \
         with the program and its handler on one CPU: {:.1} µs\n",
        num(&shm, "p50_us"),
        num(&shm, "p50_us") / uffd,
        num(&shm_one_cpu, "p50_us"),
    );
    let mut breakdown = serde_json::Value::Null;
    if let Some(sn) = &snap {
        let (table, parts) = where_time_goes(sn, num(&unix, "p50_us"));
        text += &format!("Where a remote fault's time goes (Unix link)\n{table}\n");
        breakdown = serde_json::json!(parts
            .iter()
            .map(|(n, v)| serde_json::json!({"step": n, "mean_us": v}))
            .collect::<Vec<_>>());
    }
    // The defaults' fault: the handler follows the one faulting thread onto its CPU, so the
    // install step also holds the time the woken program runs before the handler gets the CPU
    // back (the steps do not separate there; perf shows where the CPU goes).
    let mut breakdown_shm = serde_json::Value::Null;
    if let Some(sn) = &shm_snap {
        let (table, parts) = where_time_goes(sn, num(&shm, "p50_us"));
        text += &format!(
            "Where a shared-memory fault's time goes (the defaults; the install step includes the program's \
             run until the handler gets its CPU back)\n{table}\n"
        );
        breakdown_shm = serde_json::json!(parts
            .iter()
            .map(|(n, v)| serde_json::json!({"step": n, "mean_us": v}))
            .collect::<Vec<_>>());
    }
    Ok(Output {
        text,
        chart: Some(crate::summary::latency_chart(
            "Remote 4 KiB fault latency beside the floors (same run)",
            &rows,
        )),
        json: serde_json::json!({
            "rows": rows,
            "ratio_to_floors": remote / (uffd + link),
            "breakdown": breakdown,
            "breakdown_shared_memory": breakdown_shm,
            "tls_vs_tcp": tls_vs_tcp,
        }),
    })
}

/// The steps of a remote fault inside the handler (means, so they add up), and the rest of what
/// the program saw (`seen_p50_us`): the kernel's fault delivery and the two wake-ups. Returns
/// the table and the (step, µs) parts.
fn where_time_goes(
    sn: &rackmem_runtime::stats::StatsSnapshot,
    seen_p50_us: f64,
) -> (comfy_table::Table, Vec<(String, f64)>) {
    let us = |ns: u64| ns as f64 / 1000.0;
    let steps = [
        (
            "make room (choose victims, wait for staging slots)",
            us(sn.step_make_room.mean_ns),
        ),
        (
            "stage victims (UFFDIO_MOVE out of the window)",
            us(sn.step_stage.mean_ns),
        ),
        ("fetch from the brick (link round trip)", us(sn.step_fetch.mean_ns)),
        (
            "install (checksum, UFFDIO_COPY or MOVE, wake)",
            us(sn.step_install.mean_ns),
        ),
    ];
    let handler_mean = us(sn.remote_fault_handler.mean_ns);
    let handler_p50 = us(sn.remote_fault_handler.p50_ns);
    // Three quarters of the touches are remote faults, so the program's median touch is a
    // remote fault; its mean is diluted by resident hits.
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "step of a remote fault, in the handler (means)",
        "µs",
        "share of handler time",
    ]);
    let mut parts: Vec<(String, f64)> = steps.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    let other = handler_mean - steps.iter().map(|s| s.1).sum::<f64>();
    parts.push(("handler bookkeeping (state, locks, statistics)".into(), other.max(0.0)));
    for (n, v) in &parts {
        t.add_row(vec![
            n.clone(),
            format!("{v:.1}"),
            format!("{:.0}%", 100.0 * v / handler_mean),
        ]);
    }
    t.add_row(vec![
        "handler total (mean / median)".to_string(),
        format!("{handler_mean:.1} / {handler_p50:.1}"),
        "100%".into(),
    ]);
    t.add_row(vec![
        "program-observed median".to_string(),
        format!("{seen_p50_us:.1}"),
        String::new(),
    ]);
    let kernel = (seen_p50_us - handler_p50).max(0.0);
    t.add_row(vec![
        "kernel fault delivery + wake-ups (program median − handler median)".to_string(),
        format!("{kernel:.1}"),
        String::new(),
    ]);
    parts.push(("kernel fault delivery + wake-ups".into(), kernel));
    (t, parts)
}
