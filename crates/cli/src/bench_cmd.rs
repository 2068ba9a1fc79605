//! `rackmem bench`: measurements, each printed as a table next to its floor or peer and written
//! as JSON.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use rackmem_bench::floors::{link_floor, uffd_floor, Waiting};
use rackmem_bench::workloads::{build, num, parse, parse_sysbench, run, run_parsed, Parser};
use rackmem_bench::Summary;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Args)]
pub struct BenchArgs {
    /// Without a subcommand: the whole suite (floors, latency, workloads, apps, control), one
    /// progress display, one JSON (each part's document under its name), one SVG (the parts'
    /// charts stacked).
    #[command(subcommand)]
    which: Option<Which>,
    /// The whole suite only: runs per measurement, passed to the parts that repeat (workloads,
    /// apps).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=25))]
    repeat: Option<u32>,
    /// The whole suite only: size factor, passed to the parts that scale (workloads, apps).
    #[arg(long)]
    scale: Option<f64>,
    /// Where to write the JSON results.
    #[arg(long, global = true, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Where to write an SVG chart of the results.
    #[arg(long, global = true, value_name = "FILE")]
    svg: Option<PathBuf>,
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
        /// Also run the program against a brick on TCP loopback over these links: tcp (plain),
        /// tls (TLS, with a certificate from a CA made for the run). With both, prints what TLS
        /// costs as TLS ÷ TCP, measured in the same run.
        #[arg(long, value_delimiter = ',', value_parser = ["tcp", "tls"], value_name = "tcp,tls")]
        links: Vec<String>,
    },
    /// Unmodified workloads (STREAM, GUPS, scan, pointer chase) natively, under rackmem with
    /// several local buffers and transports, and under Linux swap to zram and to a swap file
    /// with a memory cgroup limited to the same budget. Needs root for the swap peers.
    Workloads(WorkloadArgs),
    /// Real applications (Redis under redis-benchmark, memcached, SQLite building an index, K-means, Graph500
    /// BFS, zstd --long) natively, under `rackmem run --local P%` and under Linux swap to zram and
    /// to a swap file with a memory cgroup limited to P% of the footprint measured natively.
    /// Needs root for the swap peers.
    Apps(AppArgs),
    /// The control plane over HTTP: allocation and release latency and throughput with 1,000
    /// bricks and 10,000 live allocations, on SQLite and on etcd, beside the GET /healthz floor.
    Control(crate::bench_control::ControlBenchArgs),
    /// Sequential read+write scan: native, and under `rackmem run` (its defaults) with 25%, 50%, 100% local buffers.
    Scan {
        /// Footprint.
        #[arg(long, default_value_t = 1024)]
        mib: usize,
        /// Passes over the buffer.
        #[arg(long, default_value_t = 3)]
        passes: usize,
        /// Also run the program against a brick on TCP loopback over these links: tcp (plain),
        /// tls (TLS, with a certificate from a CA made for the run). With both, prints what TLS
        /// costs as TLS ÷ TCP, measured in the same run.
        #[arg(long, value_delimiter = ',', value_parser = ["tcp", "tls"], value_name = "tcp,tls")]
        links: Vec<String>,
    },
}

#[derive(Args)]
pub struct WorkloadArgs {
    /// Workloads to run: stream, gups, scan, ptrchase, skewed (four in five updates to a hot
    /// fifth of the pages) (C programs of `bench/`), and
    /// sysbench-write, sysbench-read (Debian's sysbench sweeping 1 GiB three times: a held-out
    /// program, nobody here wrote it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "stream,gups,scan,ptrchase,skewed,sysbench-write"
    )]
    only: Vec<String>,
    /// Local buffers, in percent of each workload's footprint.
    #[arg(long, value_delimiter = ',', default_value = "25,50,75,100")]
    locals: Vec<u32>,
    /// rackmem setups: defaults (`rackmem run` with no option: shared memory, handler placed
    /// by the runtime), previous-defaults (`--no-shared-memory --handler hybrid:200`, what
    /// `rackmem run` did before), unix (Unix-socket link, `--no-shared-memory`), tcp (TCP
    /// loopback link), shm (`--shared-memory`).
    #[arg(long, value_delimiter = ',', default_value = "defaults,previous-defaults,tcp")]
    transports: Vec<String>,
    /// Swap peers: zram, file (empty to skip).
    #[arg(long, value_delimiter = ',', default_value = "zram,file")]
    peers: Vec<String>,
    /// Local buffers (percent) at which the swap peers run.
    #[arg(long, value_delimiter = ',', default_value = "25,75")]
    peer_locals: Vec<u32>,
    /// Where the swap file goes (a directory on the disk to measure).
    #[arg(long, default_value = "/var/tmp")]
    swap_dir: PathBuf,
    /// Scale every workload's size (0.01 for a quick check).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Run every setup (native, rackmem, its bricks, the swap peers) on these CPUs only, as
    /// `taskset -c` would: the same CPUs for all, kernel threads (kswapd) excepted. See
    /// `rackmem run --cpus`.
    #[arg(long, value_name = "LIST", value_parser = crate::sys::cpu_list)]
    cpus: Option<crate::sys::CpuList>,
    /// Run every measurement this many times and report the median (the JSON keeps every value,
    /// in the order run). Native and the rackmem setups take turns: each round runs native, then
    /// every rackmem setup once, so a slow spell of the machine hits them alike; the swap peers
    /// run their repeats together (swap is set up once per peer). On a VM a single run can be
    /// 10% off, even all fitting in memory; take ratios from the median of 3 or 5.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=25))]
    repeat: u32,
}

/// The rackmem setups `--transports` names.
const SETUPS: [&str; 5] = ["defaults", "previous-defaults", "unix", "tcp", "shm"];

/// What `rackmem run` did by default before shared memory and the runtime-placed handler: the
/// embedded brick over its socket, a handler spinning 200 µs after each fault.
const PREVIOUS_DEFAULTS: [&str; 3] = ["--no-shared-memory", "--handler", "hybrid:200"];

#[derive(Args)]
pub struct AppArgs {
    /// Applications to run: redis, memcached, sqlite, kmeans, bfs, zstd.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "redis,memcached,sqlite,kmeans,bfs,zstd"
    )]
    only: Vec<String>,
    /// Local buffers, in percent of each application's footprint (rackmem and the swap peers).
    #[arg(long, value_delimiter = ',', default_value = "25,50")]
    locals: Vec<u32>,
    /// Swap peers: zram, file (empty to skip).
    #[arg(long, value_delimiter = ',', default_value = "zram,file")]
    peers: Vec<String>,
    /// Where the swap file goes (a directory on the disk to measure).
    #[arg(long, default_value = "/var/tmp")]
    swap_dir: PathBuf,
    /// Scale every application's size (0.05 for a quick check).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Run every setup this many times and report the median (the JSON keeps every value).
    /// Native and the rackmem setups take turns each round; the swap peers run their repeats
    /// together (swap is set up once per peer).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=25))]
    repeat: u32,
}

fn swap_backends(names: &[String], swap_dir: &Path) -> Result<Vec<rackmem_bench::swap::SwapBackend>> {
    use rackmem_bench::swap::SwapBackend;
    names
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| match p.as_str() {
            "zram" => Ok(SwapBackend::Zram),
            "file" => Ok(SwapBackend::File(
                swap_dir.join(format!("rackmem-bench-{}.swap", std::process::id())),
            )),
            other => Err(anyhow::anyhow!("unknown peer {other}: use zram or file")),
        })
        .collect()
}

fn run_apps(a: AppArgs, bench_dir: &Path, tmp: &Path, json: Option<&Path>, svg: Option<&Path>) -> Result<()> {
    use rackmem_bench::apps;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let cfg = apps::AppsConfig {
        only: a.only,
        locals: a.locals,
        peers: swap_backends(&a.peers, &a.swap_dir)?,
        scale: a.scale,
        repeat: a.repeat,
        rackmem: std::env::current_exe().context("locating rackmem")?,
        bench_dir: bench_dir.to_path_buf(),
        tmp: tmp.to_path_buf(),
        stop,
    };
    let pb = rackmem_bench::progress::bar(apps::runs(&cfg));
    let rows = apps::run(&cfg, &pb);
    pb.finish_and_clear();
    let rows = rows?;
    let of = if a.repeat > 1 {
        format!("value = median of {} runs; ", a.repeat)
    } else {
        String::new()
    };
    println!(
        "Applications (same run; {of}swap peers in a memory cgroup of the same share of the footprint; \"× zram\" = speed-up over zram at the same local buffer)\n{}",
        apps::table(&rows)
    );
    if let Some(p) = svg {
        std::fs::write(
            p,
            rackmem_bench::chart::svg(
                "Applications under rackmem and Linux swap against native, same run",
                &apps::bars(&rows),
            ),
        )
        .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("rackmem bench: chart written to {}", p.display());
    }
    write_json(
        json,
        &serde_json::json!({
            "apps": rows,
            "repeat": a.repeat,
            "scale": a.scale,
            "sizes": apps::Sizes::at(a.scale),
        }),
    )
}

/// `rackmem bench` without a subcommand: every part in turn, each as if run alone with the
/// common options, its JSON and chart gathered into one of each.
fn run_suite(args: &BenchArgs) -> Result<i32> {
    use rackmem_bench::suite::{Report, PARTS};
    let dir = std::env::temp_dir().join(format!("rackmem-bench-suite-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let suite = rackmem_bench::progress::Suite::start(PARTS.len() as u64);
    let mut report = Report::default();
    let mut failed = Vec::new();
    for part in PARTS {
        suite.overall.set_message(part);
        let (j, s) = (dir.join(format!("{part}.json")), dir.join(format!("{part}.svg")));
        let mut argv: Vec<std::ffi::OsString> = vec!["bench".into(), part.into()];
        if ["workloads", "apps"].contains(&part) {
            if let Some(r) = args.repeat {
                argv.extend(["--repeat".into(), r.to_string().into()]);
            }
            if let Some(x) = args.scale {
                argv.extend(["--scale".into(), x.to_string().into()]);
            }
        }
        argv.extend(["--json".into(), j.clone().into(), "--svg".into(), s.clone().into()]);
        argv.extend(["--bench-dir".into(), args.bench_dir.clone().into()]);
        let cmd = <BenchArgs as clap::Args>::augment_args(clap::Command::new("bench"));
        let part_args = clap::FromArgMatches::from_arg_matches(&cmd.try_get_matches_from(argv)?)?;
        let r = run_bench(part_args).and_then(|_| Ok(report.add(part, &j, &s)?));
        if let Err(e) = r {
            suite
                .overall
                .println(format!("rackmem bench: part {part} failed: {e:#}"));
            report.failed(part, &format!("{e:#}"));
            failed.push(part);
        }
        suite.overall.inc(1);
    }
    drop(suite);
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(p) = &args.svg {
        std::fs::write(p, report.svg()).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("rackmem bench: charts written to {}", p.display());
    }
    write_json(args.json.as_deref(), &report.json())?;
    anyhow::ensure!(failed.is_empty(), "parts failed: {}", failed.join(", "));
    Ok(0)
}

/// The median of `v` (not empty); the mean of the two middle values for an even count.
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// A workload: its program, arguments, footprint and the metric to compare (higher is better).
struct Workload {
    name: &'static str,
    /// An installed program (held out: nobody here wrote it), and the package that has it;
    /// `None` for a C program of `bench/` named `name`.
    installed: Option<(&'static str, &'static str)>,
    args: Vec<String>,
    footprint: u64,
    metric: &'static str,
    parse: Parser,
}

impl Workload {
    fn ours(name: &'static str, args: Vec<String>, footprint: u64, metric: &'static str) -> Workload {
        Workload {
            name,
            installed: None,
            args,
            footprint,
            metric,
            parse,
        }
    }

    /// `sysbench memory` sweeping one block of `mib` MiB three times, sequentially.
    fn sysbench(name: &'static str, oper: &str, mib: u64) -> Workload {
        Workload {
            name,
            installed: Some(("sysbench", "sysbench")),
            args: vec![
                "memory".into(),
                "--threads=1".into(),
                format!("--memory-block-size={mib}M"),
                format!("--memory-total-size={}M", mib * 3),
                "--memory-access-mode=seq".into(),
                format!("--memory-oper={oper}"),
                "run".into(),
            ],
            footprint: mib << 20,
            metric: "mib_per_s",
            parse: parse_sysbench,
        }
    }

    /// The program to run: an installed one found on PATH, or ours compiled into `tmp`.
    fn program(&self, bench_dir: &Path, tmp: &Path) -> Result<PathBuf> {
        match self.installed {
            Some((prog, package)) => std::env::var_os("PATH")
                .iter()
                .flat_map(std::env::split_paths)
                .map(|d| d.join(prog))
                .find(|p| p.is_file())
                .with_context(|| {
                    format!("{prog} is not installed: apt-get install {package} (./scripts/programs.sh does)")
                }),
            None => Ok(build(bench_dir, self.name, tmp)?),
        }
    }
}

fn workloads(scale: f64) -> Vec<Workload> {
    let sz = |v: f64| ((v * scale) as u64).max(1);
    let stream_n = sz(10_000_000.0);
    vec![
        Workload::ours(
            "stream",
            vec![stream_n.to_string(), "3".into()],
            stream_n * 24,
            "triad_mb_s",
        ),
        Workload::ours(
            "gups",
            vec![sz(1024.0).to_string(), sz(200_000.0).to_string()],
            sz(1024.0) << 20,
            "updates_per_s",
        ),
        Workload::ours(
            "scan",
            vec![sz(1024.0).to_string(), "3".into()],
            sz(1024.0) << 20,
            "mb_per_s",
        ),
        Workload::ours(
            "ptrchase",
            vec![sz(256.0).to_string(), sz(100_000.0).to_string()],
            sz(256.0) << 20,
            "steps_per_s",
        ),
        // Four in five updates to a hot fifth of the pages: what tells an eviction policy that
        // keeps the hot set from one that cannot (FIFO).
        Workload::ours(
            "skewed",
            vec![sz(1024.0).to_string(), sz(400_000.0).to_string()],
            sz(1024.0) << 20,
            "updates_per_s",
        ),
        // sysbench takes block sizes that are powers of two only.
        Workload::sysbench("sysbench-write", "write", 1 << sz(1024.0).ilog2()),
        Workload::sysbench("sysbench-read", "read", 1 << sz(1024.0).ilog2()),
    ]
}

#[derive(serde::Serialize, Clone)]
struct Row {
    workload: String,
    setup: String,
    local_pct: u32,
    metric: String,
    value: f64,
    /// Every measured value (`--repeat`), in the order run; `value` is their median.
    values: Vec<f64>,
    /// When each of `values` started, in seconds since the bench started (shows how the
    /// setups took turns, and lines figures up with whatever else the machine did).
    started_s: Vec<f64>,
    vs_native: f64,
    speedup_vs_zram: Option<f64>,
    speedup_vs_swap_file: Option<f64>,
    /// Why the run produced no figure (a peer killed by its cgroup's OOM killer).
    error: Option<String>,
}

/// One run of a workload: its `result` key/value pairs and when it started.
#[derive(Clone)]
struct Timed {
    started_s: f64,
    kv: std::collections::BTreeMap<String, String>,
}

impl Timed {
    fn run(
        t0: std::time::Instant,
        f: impl FnOnce() -> Result<std::collections::BTreeMap<String, String>>,
    ) -> Result<Timed> {
        let started_s = t0.elapsed().as_secs_f64();
        Ok(Timed { started_s, kv: f()? })
    }
}

fn metric_of(w: &Workload, kv: &std::collections::BTreeMap<String, String>) -> f64 {
    if w.metric == "steps_per_s" {
        1e9 / num(kv, "ns_per_step")
    } else {
        num(kv, w.metric)
    }
}

fn run_workloads(a: WorkloadArgs, bench_dir: &Path, tmp: &Path, json: Option<&Path>, svg: Option<&Path>) -> Result<()> {
    use rackmem_bench::swap::{SwapBackend, SwapPeer};
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let all = workloads(a.scale);
    let chosen: Vec<&Workload> = all.iter().filter(|w| a.only.iter().any(|o| o == w.name)).collect();
    anyhow::ensure!(
        !chosen.is_empty(),
        "--only names no known workload (stream, gups, scan, ptrchase, skewed, sysbench-write, sysbench-read)"
    );
    let peers: Vec<SwapBackend> = a
        .peers
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| match p.as_str() {
            "zram" => Ok(SwapBackend::Zram),
            "file" => Ok(SwapBackend::File(
                a.swap_dir.join(format!("rackmem-bench-{}.swap", std::process::id())),
            )),
            other => Err(anyhow::anyhow!("unknown peer {other}: use zram or file")),
        })
        .collect::<Result<_>>()?;
    if let Some(t) = a.transports.iter().find(|t| !SETUPS.contains(&t.as_str())) {
        anyhow::bail!("unknown setup {t}: use {}", SETUPS.join(", "));
    }
    if let Some(c) = &a.cpus {
        // Before anything starts: every process and thread this command starts inherits it.
        crate::sys::pin_this_thread(&c.0).with_context(|| format!("confining the bench to CPUs {:?}", c.0))?;
    }
    // A brick on TCP loopback for the tcp transport (the unix one is rackmem run's embedded brick).
    let tcp_brick = if a.transports.iter().any(|t| t == "tcp") {
        Some(
            rackmem_brick::Brick::start(rackmem_brick::BrickConfig {
                listen: rackmem_brick::ListenAddr::Tcp("127.0.0.1:0".into()),
                size_bytes: 256 << 30,
                key: b"bench".to_vec(),
                secret: Some(b"bench".to_vec()),
                managed: false,
                limits: Default::default(),
                tls: None,
            })
            .context("starting the TCP brick")?,
        )
    } else {
        None
    };
    let repeat = a.repeat as usize;
    let total = repeat * chosen.len() * (1 + a.locals.len() * a.transports.len() + peers.len() * a.peer_locals.len());
    let pb = rackmem_bench::progress::bar(total as u64);
    let mut rows: Vec<Row> = Vec::new();
    let t0 = std::time::Instant::now();
    for w in &chosen {
        let prog = w.program(bench_dir, tmp)?;
        // The rackmem setups, each run once per round right after a native run: a drift of the
        // machine (host memory, other guests) then hits native and every setup alike, instead of
        // whichever setup happened to run while it lasted.
        let mut setups: Vec<(u32, &str, Vec<String>)> = Vec::new();
        for &local in &a.locals {
            for t in &a.transports {
                let extra = match t.as_str() {
                    "tcp" => {
                        let b = tcp_brick.as_ref().context("tcp brick")?;
                        vec!["--brick".into(), b.local_addr(), "--secret".into(), "bench".into()]
                    }
                    "shm" => vec!["--shared-memory".into()],
                    "unix" => vec!["--no-shared-memory".into()],
                    "previous-defaults" => PREVIOUS_DEFAULTS.iter().map(|s| s.to_string()).collect(),
                    _ => vec![],
                };
                setups.push((local, t.as_str(), extra));
            }
        }
        let mut natives: Vec<Timed> = Vec::with_capacity(repeat);
        let mut measured: Vec<Vec<Timed>> = vec![Vec::with_capacity(repeat); setups.len()];
        for _ in 0..repeat {
            anyhow::ensure!(!stop.load(std::sync::atomic::Ordering::Relaxed), "interrupted");
            pb.set_message(format!("{} native", w.name));
            natives.push(Timed::run(t0, || {
                run_parsed(
                    {
                        let mut c = Command::new(&prog);
                        c.args(&w.args);
                        c
                    },
                    w.parse,
                )
                .map_err(Into::into)
            })?);
            pb.inc(1);
            for ((local, t, extra), kvs) in setups.iter().zip(measured.iter_mut()) {
                anyhow::ensure!(!stop.load(std::sync::atomic::Ordering::Relaxed), "interrupted");
                pb.set_message(format!("{} rackmem {local}% {t}", w.name));
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                kvs.push(Timed::run(t0, || {
                    Ok(run_parsed(
                        rackmem_run(&format!("{local}%"), &extra, &prog, &w.args)?,
                        w.parse,
                    )?)
                })?);
                pb.inc(1);
            }
        }
        let native_values: Vec<f64> = natives.iter().map(|r| metric_of(w, &r.kv)).collect();
        let base = median(&native_values);
        let native = &natives[0].kv;
        let row_of = |setup: String, local: u32, runs: &[Timed]| -> Result<Row> {
            anyhow::ensure!(
                runs.iter().all(|r| r.kv.get("checksum") == native.get("checksum")),
                "{} under {setup} computed a different checksum than natively",
                w.name
            );
            let values: Vec<f64> = runs.iter().map(|r| metric_of(w, &r.kv)).collect();
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
                error: None,
            })
        };
        rows.push(row_of("native".into(), 100, &natives)?);
        for ((local, t, _), kvs) in setups.iter().zip(&measured) {
            rows.push(row_of(format!("rackmem {t}"), *local, kvs)?);
        }
        for p in &peers {
            // Room for the whole footprint in swap, plus slack.
            let peer = SwapPeer::enable(p.clone(), w.footprint * 2 + (64 << 20))
                .with_context(|| format!("enabling {}", p.name()))?;
            for &local in &a.peer_locals {
                anyhow::ensure!(!stop.load(std::sync::atomic::Ordering::Relaxed), "interrupted");
                pb.set_message(format!("{} {} {local}%", w.name, p.name()));
                let limit = w.footprint * local as u64 / 100 + (8 << 20);
                let mut kvs = Vec::with_capacity(repeat);
                let mut failed = None;
                for _ in 0..repeat {
                    let started_s = t0.elapsed().as_secs_f64();
                    let out = peer.run_limited(limit, &prog, &w.args)?;
                    pb.inc(1);
                    // Ctrl-C reaches the workload too: stop here, and let the peer's drop undo swap.
                    anyhow::ensure!(
                        !stop.load(std::sync::atomic::Ordering::Relaxed),
                        "interrupted; swap and cgroups were restored"
                    );
                    if !out.status.success() {
                        failed = Some(out);
                        break;
                    }
                    kvs.push(Timed {
                        started_s,
                        kv: (w.parse)(&out.stdout)?,
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
                        error: Some(why),
                    });
                    continue;
                }
                rows.push(row_of(p.name().to_string(), local, &kvs)?);
            }
            drop(peer);
        }
    }
    pb.finish_and_clear();
    drop(tcp_brick);
    anyhow::ensure!(!stop.load(std::sync::atomic::Ordering::Relaxed), "interrupted");
    // Speed-ups against each peer at the same workload and local buffer.
    let snapshot = rows.clone();
    for r in rows.iter_mut().filter(|r| r.setup.starts_with("rackmem")) {
        let peer = |name: &str| {
            snapshot
                .iter()
                .find(|p| {
                    p.workload == r.workload && p.local_pct == r.local_pct && p.setup == name && p.error.is_none()
                })
                .map(|p| r.value / p.value)
        };
        r.speedup_vs_zram = peer("zram");
        r.speedup_vs_swap_file = peer("swap file");
    }
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "workload",
        "setup",
        "local",
        "metric",
        "value",
        "vs native",
        "× zram",
        "× swap file",
    ]);
    let f = |v: Option<f64>| v.map_or("".to_string(), |x| format!("{x:.2}"));
    for r in &rows {
        t.add_row(vec![
            r.workload.clone(),
            r.setup.clone(),
            format!("{}%", r.local_pct),
            r.metric.clone(),
            r.error
                .clone()
                .map_or_else(|| format!("{:.1}", r.value), |_| "OOM-killed".into()),
            format!("{:.4}", r.vs_native),
            f(r.speedup_vs_zram),
            f(r.speedup_vs_swap_file),
        ]);
    }
    let of = if a.repeat > 1 {
        format!("value = median of {} runs; ", a.repeat)
    } else {
        String::new()
    };
    println!("Workloads (same run; {of}\"× peer\" = rackmem's speed-up over the peer at the same local buffer)\n{t}");
    if let Some(p) = svg {
        let bars: Vec<rackmem_bench::chart::Bar> = rows
            .iter()
            .filter(|r| r.setup != "native" && r.error.is_none())
            .map(|r| rackmem_bench::chart::Bar {
                group: r.workload.clone(),
                label: format!("{} {}%", r.setup, r.local_pct),
                fraction: r.vs_native,
            })
            .collect();
        std::fs::write(
            p,
            rackmem_bench::chart::svg("rackmem and Linux swap against all-local, same run", &bars),
        )
        .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("rackmem bench: chart written to {}", p.display());
    }
    write_json(
        json,
        &serde_json::json!({
            "workloads": rows,
            "cpus": a.cpus.as_ref().map(|c| c.0.clone()),
            "repeat": a.repeat,
        }),
    )
}

/// Floors measured by [`floors`], for the progress bar's length.
const FLOOR_STEPS: u64 = 6;

fn progress(len: u64) -> indicatif::ProgressBar {
    rackmem_bench::progress::bar(len)
}

fn floors(samples: usize, pb: &indicatif::ProgressBar) -> Result<Vec<Summary>> {
    let mut v = Vec::new();
    for w in [Waiting::Blocking, Waiting::BusyPoll] {
        pb.set_message(format!("userfaultfd floor, {w:?} handler"));
        v.push(uffd_floor(w, samples).context("userfaultfd floor")?);
        pb.inc(1);
    }
    for t in ["unix", "tcp"] {
        for bytes in [4096, 65536] {
            pb.set_message(format!("link floor, {t}, {} KiB", bytes / 1024));
            v.push(link_floor(t, bytes, samples / 4).context("link floor")?);
            pb.inc(1);
        }
    }
    Ok(v)
}

fn write_latency_svg(path: Option<&Path>, title: &str, rows: &[Summary]) -> Result<()> {
    if let Some(p) = path {
        let bars: Vec<rackmem_bench::chart::LatencyBar> = rows
            .iter()
            .map(|s| rackmem_bench::chart::LatencyBar {
                label: s.name.clone(),
                p50_us: s.p50_us,
                p99_us: s.p99_us,
            })
            .collect();
        std::fs::write(p, rackmem_bench::chart::latency_svg(title, &bars))
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("rackmem bench: chart written to {}", p.display());
    }
    Ok(())
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

/// Loopback bricks for `--links` (see [`rackmem_bench::loopback`]), certificates in `tmp`.
fn loopback_bricks(links: &[String], tmp: &Path) -> Result<Vec<rackmem_bench::loopback::LoopbackBrick>> {
    use rackmem_bench::loopback::{LinkKind, LoopbackBrick};
    links
        .iter()
        .map(|l| {
            let kind = if l == "tls" { LinkKind::Tls } else { LinkKind::Tcp };
            LoopbackBrick::start(kind, 64 << 30, tmp).context("starting a loopback brick")
        })
        .collect()
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
    let Some(which) = args.which else {
        return run_suite(&args);
    };
    let tmp = std::env::temp_dir().join(format!("rackmem-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = match which {
        Which::Apps(a) => run_apps(a, &args.bench_dir, &tmp, args.json.as_deref(), args.svg.as_deref()),
        Which::Workloads(a) => run_workloads(a, &args.bench_dir, &tmp, args.json.as_deref(), args.svg.as_deref()),
        Which::Control(a) => crate::bench_control::run(a, args.json.as_deref(), args.svg.as_deref()),
        Which::Floors { samples } => {
            let pb = progress(FLOOR_STEPS);
            let f = floors(samples, &pb)?;
            pb.finish_and_clear();
            print_summaries("Floors (same run)", &f);
            write_latency_svg(
                args.svg.as_deref(),
                "Floors: the best this machine can do (same run)",
                &f,
            )?;
            write_json(args.json.as_deref(), &serde_json::json!({ "floors": f }))
        }
        Which::Latency { samples, mib, links } => {
            let bricks = loopback_bricks(&links, &tmp)?;
            let pb = progress(FLOOR_STEPS + 4 + bricks.len() as u64);
            let f = floors(samples, &pb)?;
            pb.set_message("fault_latency, native");
            let prog = build(&args.bench_dir, "fault_latency", &tmp)?;
            let pargs = vec![mib.to_string(), samples.to_string()];
            let native = run({
                let mut c = Command::new(&prog);
                c.args(&pargs);
                c
            })?;
            pb.inc(1);
            pb.set_message("fault_latency, rackmem, 25% local");
            let stats_path = tmp.join("latency-stats.jsonl");
            let stats_arg = stats_path.to_string_lossy().into_owned();
            let unix = run(rackmem_run(
                "25%",
                &["--prefetch", "0", "--no-shared-memory", "--stats-json", &stats_arg],
                &prog,
                &pargs,
            )?)?;
            pb.inc(1);
            pb.set_message("fault_latency, rackmem, 25% local, shared memory");
            let shm = run(rackmem_run(
                "25%",
                &["--prefetch", "0", "--shared-memory"],
                &prog,
                &pargs,
            )?)?;
            pb.inc(1);
            pb.set_message("fault_latency, rackmem, 25% local, shared memory, one CPU");
            let shm_one_cpu = run(rackmem_run(
                "25%",
                &["--prefetch", "0", "--shared-memory", "--cpus", "0"],
                &prog,
                &pargs,
            )?)?;
            pb.inc(1);
            let mut over_links = Vec::new();
            for b in &bricks {
                let kind = b.addr.split("://").next().unwrap_or("tcp").to_string();
                pb.set_message(format!("fault_latency, rackmem, 25% local, {kind} loopback brick"));
                let mut extra: Vec<String> = ["--prefetch", "0"].iter().map(|s| s.to_string()).collect();
                extra.extend(b.run_args());
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                over_links.push((kind, run(rackmem_run("25%", &extra, &prog, &pargs)?)?));
                pb.inc(1);
            }
            pb.finish_and_clear();
            let snap: Option<rackmem_runtime::stats::StatsSnapshot> = std::fs::read_to_string(&stats_path)
                .ok()
                .and_then(|t| t.lines().next().and_then(|l| serde_json::from_str(l).ok()));
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
                rows.push(Summary {
                    name: name.into(),
                    samples,
                    p50_us: num(kv, "p50_us"),
                    p99_us: num(kv, "p99_us"),
                    mean_us: num(kv, "mean_us"),
                });
            }
            for (kind, kv) in &over_links {
                rows.push(Summary {
                    name: format!("remote 4 KiB fault, rackmem, {kind} link (loopback), 25% local, prefetch off"),
                    samples,
                    p50_us: num(kv, "p50_us"),
                    p99_us: num(kv, "p99_us"),
                    mean_us: num(kv, "mean_us"),
                });
            }
            let by_kind = |k: &str| over_links.iter().find(|(n, _)| n == k).map(|(_, kv)| kv);
            let mut tls_vs_tcp = serde_json::Value::Null;
            if let (Some(tcp), Some(tls)) = (by_kind("tcp"), by_kind("tls")) {
                let ratio = |m: &str| num(tls, m) / num(tcp, m);
                println!(
                    "TLS ÷ TCP, remote 4 KiB fault (same run): p50 {:.2} ({:.1} / {:.1} µs), p99 {:.2}, mean {:.2}",
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
            print_summaries("Remote fault latency beside the floors (same run)", &rows);
            write_latency_svg(
                args.svg.as_deref(),
                "Remote 4 KiB fault latency beside the floors (same run)",
                &rows,
            )?;
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
            println!(
                "shared-memory fault p50 {:.1} µs = {:.2} × best uffd floor (no link on this path); \
                 with the program and its handler on one CPU: {:.1} µs",
                num(&shm, "p50_us"),
                num(&shm, "p50_us") / uffd,
                num(&shm_one_cpu, "p50_us"),
            );
            let mut breakdown = serde_json::Value::Null;
            if let Some(sn) = &snap {
                // Steps inside the handler (means, so they add up), and the rest of what the
                // program saw: the kernel's fault delivery and the two wake-ups.
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
                // Three quarters of the touches are remote faults, so the program's median touch
                // is a remote fault; its mean is diluted by resident hits.
                let seen_p50 = num(&unix, "p50_us");
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
                    format!("{seen_p50:.1}"),
                    String::new(),
                ]);
                let kernel = (seen_p50 - handler_p50).max(0.0);
                t.add_row(vec![
                    "kernel fault delivery + wake-ups (program median − handler median)".to_string(),
                    format!("{kernel:.1}"),
                    String::new(),
                ]);
                parts.push(("kernel fault delivery + wake-ups".into(), kernel));
                println!("Where a remote fault's time goes\n{t}");
                breakdown = serde_json::json!(parts
                    .iter()
                    .map(|(n, v)| serde_json::json!({"step": n, "mean_us": v}))
                    .collect::<Vec<_>>());
            }
            write_json(
                args.json.as_deref(),
                &serde_json::json!({
                    "rows": rows,
                    "ratio_to_floors": remote / (uffd + link),
                    "breakdown": breakdown,
                    "tls_vs_tcp": tls_vs_tcp,
                }),
            )
        }
        Which::Scan { mib, passes, links } => {
            let bricks = loopback_bricks(&links, &tmp)?;
            let pb = progress(4 + 3 * bricks.len() as u64);
            pb.set_message("scan, native");
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
            let mut bars = Vec::new();
            pb.inc(1);
            // The default setup (embedded brick), then each loopback brick asked for.
            let mut setups: Vec<(String, Vec<String>)> = vec![("defaults".into(), Vec::new())];
            for b in &bricks {
                let kind = b.addr.split("://").next().unwrap_or("tcp");
                setups.push((format!("{kind} link (loopback)"), b.run_args()));
            }
            let mut by_setup: Vec<(String, String, f64)> = Vec::new();
            for (setup, extra) in &setups {
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                for local in ["100%", "50%", "25%"] {
                    pb.set_message(format!("scan, rackmem, {local} local, {setup}"));
                    let kv = run(rackmem_run(local, &extra, &prog, &pargs)?)?;
                    pb.inc(1);
                    if kv.get("checksum") != native.get("checksum") {
                        anyhow::bail!("scan under rackmem --local {local} ({setup}) computed a different checksum");
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
                    bars.push(rackmem_bench::chart::Bar {
                        group: format!("scan, {mib} MiB"),
                        label: format!("rackmem {local} local, {setup}"),
                        fraction: r / base,
                    });
                }
            }
            pb.finish_and_clear();
            let mut ratios = Vec::new();
            let find = |s: &str, l: &str| {
                by_setup
                    .iter()
                    .find(|(a, b, _)| a.starts_with(s) && b == l)
                    .map(|x| x.2)
            };
            for local in ["100%", "50%", "25%"] {
                if let (Some(tcp), Some(tls)) = (find("tcp", local), find("tls", local)) {
                    println!(
                        "TLS ÷ TCP, scan throughput at {local} local (same run): {:.2} ({tls:.0} / {tcp:.0} MB/s)",
                        tls / tcp
                    );
                    ratios.push(serde_json::json!({"local": local, "ratio": tls / tcp, "tls_mb_per_s": tls, "tcp_mb_per_s": tcp}));
                }
            }
            if let Some(p) = args.svg.as_deref() {
                std::fs::write(
                    p,
                    rackmem_bench::chart::svg("Sequential scan under rackmem against all-local (same run)", &bars),
                )
                .with_context(|| format!("writing {}", p.display()))?;
                eprintln!("rackmem bench: chart written to {}", p.display());
            }
            println!("Sequential scan, {mib} MiB, {passes} passes (same run)\n{t}");
            write_json(
                args.json.as_deref(),
                &serde_json::json!({ "scan": json, "tls_vs_tcp": ratios }),
            )
        }
    };
    let _ = std::fs::remove_dir_all(&tmp);
    result.map(|_| 0)
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
