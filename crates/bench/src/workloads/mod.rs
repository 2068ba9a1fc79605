//! `rackmem bench workloads`: unmodified programs ([`catalog`]) natively, under `rackmem run`
//! in several setups and local buffers, and under Linux swap with a memory cgroup of the same
//! budget; [`report`] turns the runs into rows, ratios, a table and a chart.
//!
//! Rounds interleave: each round runs native, then every rackmem setup at every local buffer
//! once (each setup with the current build, then with the baseline when one is given), so a
//! drift of the machine (host memory, other guests) hits them all alike instead of whichever
//! ran while it lasted. The swap peers run their repeats together after (swap is switched on
//! once per peer). Every run's checksum must equal the native run's.

pub mod catalog;
pub mod report;

use crate::loopback::{LinkKind, LoopbackBrick};
use crate::programs::run_parsed;
use crate::rackmem::Rackmem;
use crate::setups::Setup;
use crate::summary::median;
use crate::swap::{SwapBackend, SwapPeer};
use crate::{BenchError, Output};
use catalog::Workload;
use report::Row;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What `bench workloads` runs.
#[derive(Debug, Clone)]
pub struct WorkloadsConfig {
    /// Workloads to run (names from [`catalog::NAMES`]).
    pub only: Vec<String>,
    /// Local buffers of the rackmem setups, percent of each workload's footprint.
    pub locals: Vec<u32>,
    /// Built-in rackmem setups (names from [`crate::setups::BUILT_IN`]).
    pub transports: Vec<String>,
    /// More rackmem setups, run after the built-in ones.
    pub extra_setups: Vec<Setup>,
    /// Swap peers.
    pub peers: Vec<SwapBackend>,
    /// Local buffers (percent) at which the swap peers run.
    pub peer_locals: Vec<u32>,
    /// Size factor (1.0: about 1 GiB for most workloads).
    pub scale: f64,
    /// Runs per measurement; the median is reported.
    pub repeat: u32,
    /// The CPUs the caller confined this process (and so every run) to, for the record.
    pub cpus: Option<Vec<usize>>,
    /// The build measured.
    pub rackmem: Rackmem,
    /// The build it is compared with, every setup run with both.
    pub baseline: Option<Rackmem>,
    /// Directory with the C programs.
    pub bench_dir: PathBuf,
    /// Scratch directory.
    pub tmp: PathBuf,
    /// Set by SIGINT/SIGTERM: stop between runs.
    pub stop: Arc<AtomicBool>,
}

/// One run of a workload: its `result` key/value pairs, when it started, how long the whole
/// process took, and (under rackmem) the runtime's counters.
#[derive(Clone)]
struct Timed {
    started_s: f64,
    wall_s: f64,
    kv: BTreeMap<String, String>,
    counters: Option<report::Counters>,
}

impl Timed {
    fn run(t0: Instant, f: impl FnOnce() -> Result<BTreeMap<String, String>, BenchError>) -> Result<Timed, BenchError> {
        let started = Instant::now();
        let started_s = t0.elapsed().as_secs_f64();
        let kv = f()?;
        Ok(Timed {
            started_s,
            wall_s: started.elapsed().as_secs_f64(),
            kv,
            counters: None,
        })
    }
}

/// The statistics of the process that faulted most, in a `--stats-json` file (a program's
/// helpers and children write lines of their own).
pub(crate) fn busiest_stats(path: &std::path::Path) -> Option<rackmem_runtime::stats::StatsSnapshot> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<rackmem_runtime::stats::StatsSnapshot>(l).ok())
        .max_by_key(|s| s.faults)
}

/// The counters of the busiest process in a `--stats-json` file.
fn counters_of(path: &std::path::Path) -> Option<report::Counters> {
    busiest_stats(path).map(|s| report::Counters {
        faults: s.faults,
        fault_mean_ns: s.fault_mean_ns,
        miss_concurrency: s.faults_in_flight_mean,
    })
}

/// One rackmem setup at one local buffer with one build: what a round runs after native.
struct Variant<'a> {
    local: u32,
    /// The row's setup (`rackmem NAME` or `rackmem NAME@baseline`).
    setup: String,
    rackmem: &'a Rackmem,
    args: &'a [String],
}

/// Runs `bench workloads`.
pub fn run(cfg: &WorkloadsConfig) -> Result<Output, BenchError> {
    let all = catalog::all(cfg.scale);
    let chosen: Vec<&Workload> = all.iter().filter(|w| cfg.only.iter().any(|o| o == w.name)).collect();
    if chosen.is_empty() {
        return Err(BenchError::Config(format!(
            "--only names no known workload ({})",
            catalog::NAMES.join(", ")
        )));
    }
    Setup::check(&cfg.transports, &cfg.extra_setups)?;
    // A brick on TCP loopback for the tcp setup (the others use rackmem run's embedded brick).
    let tcp_brick = if cfg.transports.iter().any(|t| t == "tcp") {
        Some(LoopbackBrick::start(LinkKind::Tcp, 256 << 30, &cfg.tmp)?)
    } else {
        None
    };
    let mut setups = cfg
        .transports
        .iter()
        .map(|t| Setup::built_in(t, tcp_brick.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    setups.extend(cfg.extra_setups.iter().cloned());
    let builds: Vec<&Rackmem> = std::iter::once(&cfg.rackmem).chain(&cfg.baseline).collect();
    let mut variants = Vec::new();
    for &local in &cfg.locals {
        for s in &setups {
            for b in &builds {
                variants.push(Variant {
                    local,
                    setup: report::rackmem_setup(&s.name, b.build),
                    rackmem: b,
                    args: &s.args,
                });
            }
        }
    }
    let repeat = cfg.repeat as usize;
    let total = repeat * chosen.len() * (1 + variants.len() + cfg.peers.len() * cfg.peer_locals.len());
    let pb = crate::progress::bar(total as u64);
    let rows = measure(cfg, &chosen, &variants, &pb);
    pb.finish_and_clear();
    drop(tcp_brick);
    let mut rows = rows?;
    interrupted(cfg, "interrupted")?;
    let ratios = report::add_ratios(&mut rows);
    let mut text = report::table(&rows, cfg.repeat);
    let mut json = serde_json::json!({
        "workloads": rows,
        "cpus": cfg.cpus,
        "repeat": cfg.repeat,
    });
    if !cfg.extra_setups.is_empty() {
        json["setups"] = serde_json::json!(cfg
            .extra_setups
            .iter()
            .map(|s| serde_json::json!({"name": s.name, "args": s.args}))
            .collect::<Vec<_>>());
    }
    if let Some(b) = &cfg.baseline {
        text += &crate::baseline::table(&b.exe, &ratios);
        json["baseline"] = serde_json::json!({
            "rackmem": b.exe,
            "preload": b.preload,
            "vs_baseline": ratios,
        });
    }
    Ok(Output {
        text,
        chart: Some(crate::chart::fractions(
            "rackmem and Linux swap against all-local, same run",
            report::bars(&rows),
        )),
        json,
    })
}

fn interrupted(cfg: &WorkloadsConfig, what: &str) -> Result<(), BenchError> {
    if cfg.stop.load(Ordering::Relaxed) {
        return Err(BenchError::Interrupted(what.into()));
    }
    Ok(())
}

fn measure(
    cfg: &WorkloadsConfig,
    chosen: &[&Workload],
    variants: &[Variant],
    pb: &indicatif::ProgressBar,
) -> Result<Vec<Row>, BenchError> {
    let repeat = cfg.repeat as usize;
    let mut rows: Vec<Row> = Vec::new();
    let t0 = Instant::now();
    for w in chosen {
        let prog = w.program(&cfg.bench_dir, &cfg.tmp)?;
        let mut natives: Vec<Timed> = Vec::with_capacity(repeat);
        let mut measured: Vec<Vec<Timed>> = vec![Vec::with_capacity(repeat); variants.len()];
        for _ in 0..repeat {
            interrupted(cfg, "interrupted")?;
            pb.set_message(format!("{} native", w.name));
            natives.push(Timed::run(t0, || {
                let mut c = Command::new(&prog);
                c.args(&w.args);
                run_parsed(c, w.parse)
            })?);
            pb.inc(1);
            for (v, kvs) in variants.iter().zip(measured.iter_mut()) {
                interrupted(cfg, "interrupted")?;
                pb.set_message(format!("{} {} at {}%", w.name, v.setup, v.local));
                let local = format!("{}%", v.local);
                let stats = cfg.tmp.join("workload-stats.jsonl");
                let _ = std::fs::remove_file(&stats);
                let mut args = v.args.to_vec();
                args.extend(["--stats-json".to_string(), stats.display().to_string()]);
                let mut run = Timed::run(t0, || run_parsed(v.rackmem.run(&local, &args, &prog, &w.args), w.parse))?;
                run.counters = counters_of(&stats);
                kvs.push(run);
                pb.inc(1);
            }
        }
        let native_values: Vec<f64> = natives.iter().map(|r| w.metric_of(&r.kv)).collect();
        let base = median(&native_values);
        let native = &natives[0].kv;
        let row_of = |setup: String, local: u32, runs: &[Timed]| -> Result<Row, BenchError> {
            if runs.iter().any(|r| r.kv.get("checksum") != native.get("checksum")) {
                return Err(BenchError::Workload(format!(
                    "{} under {setup} computed a different checksum than natively",
                    w.name
                )));
            }
            let values: Vec<f64> = runs.iter().map(|r| w.metric_of(&r.kv)).collect();
            let v = median(&values);
            Ok(Row {
                workload: w.name.into(),
                setup,
                local_pct: local,
                metric: w.metric.into(),
                value: v,
                values,
                started_s: runs.iter().map(|r| r.started_s).collect(),
                vs_native: v / base,
                speedup_vs_zram: None,
                speedup_vs_swap_file: None,
                vs_baseline: None,
                error: None,
                wall_s: runs.iter().map(|r| r.wall_s).collect(),
                counters: runs.iter().filter_map(|r| r.counters).collect(),
            })
        };
        rows.push(row_of("native".into(), 100, &natives)?);
        for (v, kvs) in variants.iter().zip(&measured) {
            rows.push(row_of(v.setup.clone(), v.local, kvs)?);
        }
        for p in &cfg.peers {
            // Room for the whole footprint in swap, plus slack.
            let peer = SwapPeer::enable(p.clone(), w.footprint * 2 + (64 << 20))
                .map_err(|e| BenchError::Workload(format!("enabling {}: {e}", p.name())))?;
            for &local in &cfg.peer_locals {
                interrupted(cfg, "interrupted")?;
                pb.set_message(format!("{} {} {local}%", w.name, p.name()));
                let limit = w.footprint * local as u64 / 100 + (8 << 20);
                let mut kvs = Vec::with_capacity(repeat);
                let mut failed = None;
                for _ in 0..repeat {
                    let started_s = t0.elapsed().as_secs_f64();
                    let out = peer.run_limited(limit, &prog, &w.args)?;
                    pb.inc(1);
                    // Ctrl-C reaches the workload too: stop here, and let the peer's drop undo swap.
                    interrupted(cfg, "interrupted; swap and cgroups were restored")?;
                    if !out.status.success() {
                        failed = Some(out);
                        break;
                    }
                    kvs.push(Timed {
                        started_s,
                        wall_s: t0.elapsed().as_secs_f64() - started_s,
                        kv: (w.parse)(&out.stdout)?,
                        counters: None,
                    });
                }
                if let Some(out) = failed {
                    // Kernel swap under a tight cgroup limit can be OOM-killed (no multi-gen LRU
                    // on this kernel): that is a result, recorded as such, not a bench failure.
                    let why = match std::os::unix::process::ExitStatusExt::signal(&out.status) {
                        Some(9) => "killed (SIGKILL: the cgroup's OOM killer)".to_string(),
                        _ => format!("failed: {} {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
                    };
                    pb.println(format!("{} under {} at {local}%: {why}", w.name, p.name()));
                    rows.push(Row {
                        workload: w.name.into(),
                        setup: p.name().to_string(),
                        local_pct: local,
                        metric: w.metric.into(),
                        value: 0.0,
                        values: Vec::new(),
                        started_s: Vec::new(),
                        vs_native: 0.0,
                        speedup_vs_zram: None,
                        speedup_vs_swap_file: None,
                        vs_baseline: None,
                        error: Some(why),
                        wall_s: Vec::new(),
                        counters: Vec::new(),
                    });
                    continue;
                }
                rows.push(row_of(p.name().to_string(), local, &kvs)?);
            }
            drop(peer);
        }
    }
    Ok(rows)
}
