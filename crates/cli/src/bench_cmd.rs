//! `rackmem bench`: the options of every part, turned into the configs of `rackmem-bench`,
//! which measures; this module prints the tables it returns and saves its JSON and chart.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use rackmem_bench::loopback::LinkKind;
use rackmem_bench::rackmem::Rackmem;
use rackmem_bench::setups::Setup;
use rackmem_bench::swap::SwapBackend;
use rackmem_bench::Output;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

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
    /// One-sided put/get (include/rackmem.h) from 8 B to 64 MiB on shared memory, a Unix socket
    /// and TCP: the inline path, the bulk path and the calibrated engine, beside a local memcpy
    /// and Open MPI's MPI_Put/MPI_Get (passive target, two ranks), rounds interleaved; the
    /// crossover and how far the engine stays from the better path.
    Transfer {
        /// Sizes in bytes (default 8 B to 64 MiB, ×8 apart).
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<u64>,
        /// Interleaved rounds per size (the median counts).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Link kinds (granted-tcp: a named segment granted by a control plane in this process,
        /// on a managed brick on TCP loopback, as rackmem_seg_open gets it on agent memory).
        #[arg(long, value_delimiter = ',', default_value = "shm,unix,tcp", value_parser = ["shm", "unix", "tcp", "granted-tcp"])]
        links: Vec<String>,
        /// Leave out the MPI peer (which needs mpicc and mpirun: scripts/programs.sh installs them).
        #[arg(long)]
        no_mpi: bool,
        /// How long the engine's links may poll for an answer before sleeping, µs (as
        /// RACKMEM_PUTGET_SPIN_US does for rackmem_put/rackmem_get, with the same default; 0
        /// never polls; above 0 each link measures both and takes the faster).
        #[arg(long, default_value_t = rackmem_bench::transfer::DEFAULT_LINK_SPIN_US)]
        link_spin_us: u64,
    },
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
    /// Checks the link emulator (`rackmem run --emulate`): the remote 4 KiB fault emulated at
    /// each setting against the link model's prediction (the plain link's fault plus what the
    /// wire adds), rounds interleaved; with --veth RATE (root), a scan over a brick in another
    /// network namespace behind a veth pair shaped by tbf against the emulator at that rate.
    Emulate {
        /// Networks to emulate (`latency=5us,bandwidth=25Gbit` or a preset); default: three
        /// settings from latency-bound to bandwidth-bound.
        #[arg(long = "setting", value_name = "SPEC")]
        settings: Vec<rackmem_model::link::LinkSpec>,
        /// Random touches of the fault program per run.
        #[arg(long, default_value_t = 4000)]
        samples: usize,
        /// Footprint of the fault program.
        #[arg(long, default_value_t = 128)]
        mib: usize,
        /// Interleaved rounds (figures are medians over them).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=25))]
        repeat: u32,
        /// Also compare with a veth pair shaped by tbf to this rate (`1Gbit`, `500Mbit`).
        #[arg(long, value_name = "RATE")]
        veth: Option<String>,
        /// Footprint of the scan of the veth comparison.
        #[arg(long, default_value_t = 256)]
        scan_mib: usize,
    },
    /// Two published experiments rerun with the link emulated as the paper's network: seed 002's
    /// Fig. 4 (CG on MiniFE's operator, DGEMM, Graph500 BFS, GUPS-style updates at all-local,
    /// 75% and 25% local, 1 thread and every CPU, over its ~3 µs 12 GB/s InfiniBand) and seed
    /// 004's STREAM against a 10 Gbit/s link's ceiling; our slowdowns beside the papers', and the
    /// slowdown C-AMAT predicts from each run's own fault counters.
    Seeds {
        /// Size factor (1: footprints of about 100 to 200 MiB).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Thread counts (0: every CPU).
        #[arg(long, value_delimiter = ',', default_value = "1,0")]
        threads: Vec<usize>,
        /// The network of the seed 002 runs.
        #[arg(long, value_name = "SPEC", default_value = "ib-seed002")]
        link: rackmem_model::link::LinkSpec,
        /// The network of the STREAM runs.
        #[arg(long, value_name = "SPEC", default_value = "latency=1us,bandwidth=10Gbit")]
        stream_link: rackmem_model::link::LinkSpec,
    },
    /// Unmodified workloads (STREAM, GUPS, scan, pointer chase) natively, under rackmem with
    /// several local buffers and transports, and under Linux swap to zram and to a swap file
    /// with a memory cgroup limited to the same budget. Needs root for the swap peers.
    Workloads(WorkloadArgs),
    /// Real applications (Redis under redis-benchmark, memcached, SQLite building an index, K-means, Graph500
    /// BFS, zstd --long, xz -T2, NumPy linear algebra and K-means, qsort, a Python dict, random updates
    /// from 1, 2 and all CPUs) natively, under `rackmem run --local P%` and under Linux swap to zram and
    /// to a swap file with a memory cgroup limited to P% of the footprint measured natively (and
    /// 8 MiB); with swap peers, also under `rackmem run --local BYTES` of that cgroup's limit
    /// (`rackmem same-memory`: the same bytes, fixed from the start). Needs root for the swap
    /// peers.
    Apps(AppArgs),
    /// The control plane over HTTP: allocation and release latency and throughput with 1,000
    /// bricks and 10,000 live allocations, on SQLite and on etcd, beside the GET /healthz floor.
    Control(ControlArgs),
    /// Migration (seed 001's Tables I-III): buffers of 4 KiB to 32 MiB on a loopback brick moved
    /// into the local buffer on demand (faults) and by `rackmem_migrate`, and to a second brick
    /// bounced through the process and pulled by it (direct), beside the link's floor (a plain
    /// read of the same size), with the four step times; medians of interleaved rounds, over TCP
    /// loopback and over Unix sockets (shared memory).
    Migration {
        /// Interleaved rounds.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=25))]
        rounds: u32,
    },
    /// Rates the brick enforces: two clients that ignore their limits on one managed brick
    /// serving a fraction of its capacity measured in the same round, each given half by the
    /// control plane; prints each client's throughput ÷ its share (target: within 10%).
    Rates {
        /// Rounds (capacity, then paced), interleaved.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Seconds each half of a round reads for.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// The paced brick's total as a fraction of the measured capacity (each client's share
        /// is half of it): 1 is the "half its capacity each".
        #[arg(long, default_value_t = 1.0)]
        fraction: f64,
        /// Bytes per READ.
        #[arg(long, default_value_t = 256 << 10)]
        request: u32,
    },
    /// A legitimate client under the security probe's floods (640 idle connections to the
    /// control plane from one /24, thousands of silent ones to a brick, 200 from each /24): p50/p99
    /// of an allocation and of a new program's first fault (connect, attach, one 4 KiB read),
    /// quiet and flooded batches alternating (target: p99 flooded under 2 x quiet).
    Floods {
        /// Rounds, each a quiet batch then a flooded one.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=20))]
        rounds: u64,
        /// Samples per batch.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        samples: u64,
        /// Silent connections to the brick during a flooded batch (both ends are in this
        /// process: twice as many open files).
        #[arg(long, default_value_t = 8_000, value_parser = clap::value_parser!(u64).range(0..=40_000))]
        brick_flood: u64,
    },
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
    /// loopback link), shm (`--shared-memory`), huge (`--huge-pages`: 2 MiB units on the
    /// defaults). `--setup` adds more.
    #[arg(long, value_delimiter = ',', default_value = "defaults,previous-defaults,tcp")]
    transports: Vec<String>,
    #[command(flatten)]
    compare: CompareArgs,
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
    /// every rackmem setup once (with --baseline: with each build in turn), so a slow spell of the machine hits them alike; the swap peers
    /// run their repeats together (swap is set up once per peer). On a VM a single run can be
    /// 10% off, even all fitting in memory; take ratios from the median of 3 or 5.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=25))]
    repeat: u32,
}

#[derive(Args)]
pub struct AppArgs {
    /// Applications to run: redis, memcached, sqlite, kmeans, bfs, zstd, xz, and the far-memory
    /// papers' kinds of work: numpy-linalg (NumPy matrix multiply and solve), numpy-kmeans, qsort
    /// (the C library's), pydict (a Python dict of small objects), updates-1, updates-2,
    /// updates-all (random 8-byte updates from 1, 2 and every CPU's thread, the same total work).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "redis,memcached,sqlite,kmeans,bfs,zstd,xz,numpy-linalg,numpy-kmeans,qsort,pydict,updates-1,updates-2,updates-all"
    )]
    only: Vec<String>,
    /// Local buffers, in percent of each application's footprint (rackmem and the swap peers).
    #[arg(long, value_delimiter = ',', default_value = "25,50")]
    locals: Vec<u32>,
    #[command(flatten)]
    compare: CompareArgs,
    /// Swap peers: zram, file (empty to skip). With peers, rackmem's defaults also run at the
    /// bytes of the peers' cgroup limit (`rackmem same-memory` rows).
    #[arg(long, value_delimiter = ',', default_value = "zram,file")]
    peers: Vec<String>,
    /// Where the swap file goes (a directory on the disk to measure).
    #[arg(long, default_value = "/var/tmp")]
    swap_dir: PathBuf,
    /// Scale every application's size (0.05 for a quick check).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Run every setup this many times and report the median (the JSON keeps every value).
    /// Native and the rackmem setups (with --baseline: with each build) take turns each round; the swap peers run their repeats
    /// together (swap is set up once per peer).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=25))]
    repeat: u32,
}

/// Comparisons within one run: more configurations, and another build.
#[derive(Args)]
pub struct CompareArgs {
    /// An extra rackmem setup (repeatable): NAME=ARGS runs `rackmem run ARGS…` (split on
    /// whitespace) and shows it as `rackmem NAME` beside the others, in every ratio, e.g.
    /// --setup 'no-prefetch=--prefetch 0'. NAME: letters, digits, `-`, `_`, `.`, `+`; not a
    /// built-in setup's.
    #[arg(long = "setup", value_name = "NAME=ARGS")]
    setups: Vec<Setup>,
    /// Another rackmem executable to compare with, e.g. one built from an older commit
    /// (scripts/before-after builds one). Every rackmem setup also runs with it, named
    /// `…@baseline`, taking turns with this build in every round; a table and the JSON's
    /// `baseline` give current ÷ baseline per workload, local buffer and setup, saying whether
    /// higher or lower is better. Its runs preload the librackmem.so next to it.
    #[arg(long, value_name = "PATH")]
    baseline: Option<PathBuf>,
}

impl CompareArgs {
    /// The baseline build, checked.
    fn baseline(&self) -> Result<Option<Rackmem>> {
        Ok(self.baseline.as_deref().map(Rackmem::baseline).transpose()?)
    }
}

#[derive(Args)]
pub struct ControlArgs {
    /// Bricks in the resource graph (64 GiB each, registered through the API).
    #[arg(long, default_value_t = 1000)]
    bricks: usize,
    /// Live allocations while measuring (1 to 64 MiB, striped over 1 to 4 bricks).
    #[arg(long, default_value_t = 10_000)]
    allocations: usize,
    /// Allocations, releases and floor round trips timed per store.
    #[arg(long, default_value_t = 2000)]
    samples: usize,
    /// Stores to measure: sqlite, etcd (etcd needs a build with the cargo feature `etcd` and
    /// Debian's etcd-server; it is skipped with a message otherwise).
    #[arg(long, value_delimiter = ',', default_value = "sqlite,etcd")]
    stores: Vec<String>,
}

/// A flag SIGINT and SIGTERM set: the bench stops between runs and undoes what it set up.
fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(stop)
}

fn current() -> Result<Rackmem> {
    Ok(Rackmem::current(std::env::current_exe().context("locating rackmem")?))
}

fn links(names: &[String]) -> Result<Vec<LinkKind>> {
    Ok(names.iter().map(|l| l.parse()).collect::<Result<_, _>>()?)
}

/// Runs one part, in scratch directory `tmp`.
fn run_part(which: Which, bench_dir: &Path, tmp: &Path) -> Result<Output> {
    use rackmem_bench::{apps, control, floors, latency, scan, workloads};
    let (bench_dir, tmp) = (bench_dir.to_path_buf(), tmp.to_path_buf());
    Ok(match which {
        Which::Floors { samples } => floors::run(samples)?,
        Which::Transfer {
            sizes,
            rounds,
            links,
            no_mpi,
            link_spin_us,
        } => rackmem_bench::transfer::run(&rackmem_bench::transfer::TransferConfig {
            sizes: if sizes.is_empty() {
                rackmem_bench::transfer::DEFAULT_SIZES.to_vec()
            } else {
                sizes
            },
            rounds,
            links,
            mpi: !no_mpi,
            bench_dir,
            tmp,
            link_spin: std::time::Duration::from_micros(link_spin_us),
        })?,
        Which::Emulate {
            settings,
            samples,
            mib,
            repeat,
            veth,
            scan_mib,
        } => rackmem_bench::emulate::run(&rackmem_bench::emulate::EmulateConfig {
            settings: if settings.is_empty() {
                rackmem_bench::emulate::DEFAULT_SETTINGS
                    .iter()
                    .map(|s| s.parse::<rackmem_model::link::LinkSpec>().map(|l| l.0))
                    .collect::<Result<_, _>>()?
            } else {
                settings.into_iter().map(|l| l.0).collect()
            },
            samples,
            mib,
            repeat,
            veth,
            scan_mib,
            rackmem: current()?,
            bench_dir,
            tmp,
        })?,
        Which::Seeds {
            scale,
            threads,
            link,
            stream_link,
        } => rackmem_bench::seeds::run(&rackmem_bench::seeds::SeedsConfig {
            scale,
            threads,
            link: link.0,
            stream_link: stream_link.0,
            rackmem: current()?,
            bench_dir,
            tmp,
        })?,
        Which::Latency { samples, mib, links: l } => latency::run(&latency::LatencyConfig {
            samples,
            mib,
            links: links(&l)?,
            rackmem: current()?,
            bench_dir,
            tmp,
        })?,
        Which::Migration { rounds } => rackmem_bench::migration::run(&rackmem_bench::migration::MigrationConfig {
            rounds,
            rackmem: current()?,
            bench_dir,
            tmp,
        })?,
        Which::Scan { mib, passes, links: l } => scan::run(&scan::ScanConfig {
            mib,
            passes,
            links: links(&l)?,
            rackmem: current()?,
            bench_dir,
            tmp,
        })?,
        Which::Workloads(a) => {
            let cfg = workloads::WorkloadsConfig {
                peers: SwapBackend::parse_list(&a.peers, &a.swap_dir)?,
                baseline: a.compare.baseline()?,
                extra_setups: a.compare.setups,
                only: a.only,
                locals: a.locals,
                transports: a.transports,
                peer_locals: a.peer_locals,
                scale: a.scale,
                repeat: a.repeat,
                cpus: a.cpus.map(|c| c.0),
                rackmem: current()?,
                bench_dir,
                tmp,
                stop: stop_on_signals()?,
            };
            if let Some(c) = &cfg.cpus {
                // Before anything starts: every process and thread this command starts inherits it.
                crate::sys::pin_this_thread(c).with_context(|| format!("confining the bench to CPUs {c:?}"))?;
            }
            workloads::run(&cfg)?
        }
        Which::Apps(a) => apps::run(&apps::AppsConfig {
            peers: SwapBackend::parse_list(&a.peers, &a.swap_dir)?,
            baseline: a.compare.baseline()?,
            extra_setups: a.compare.setups,
            only: a.only,
            locals: a.locals,
            scale: a.scale,
            repeat: a.repeat,
            rackmem: current()?,
            bench_dir,
            tmp,
            stop: stop_on_signals()?,
        })?,
        Which::Rates {
            rounds,
            seconds,
            fraction,
            request,
        } => rackmem_bench::rates::run(&rackmem_bench::rates::RatesConfig {
            rounds,
            seconds,
            fraction,
            request_bytes: request,
        })?,
        Which::Floods {
            rounds,
            samples,
            brick_flood,
        } => rackmem_bench::floods::run(&rackmem_bench::floods::FloodsConfig {
            rounds: rounds as usize,
            samples: samples as usize,
            brick_flood: brick_flood as usize,
        })?,
        Which::Control(a) => control::run(&control::ControlConfig {
            bricks: a.bricks,
            allocations: a.allocations,
            samples: a.samples,
            stores: a.stores,
        })?,
    })
}

/// `rackmem bench` without a subcommand: every part in turn, each as if run alone with the
/// common options, its JSON and chart gathered into one of each.
fn run_suite(args: &BenchArgs) -> Result<i32> {
    let (report, failed) = rackmem_bench::suite::run(|part| -> Result<Output> {
        let mut argv: Vec<std::ffi::OsString> = vec!["bench".into(), part.into()];
        if ["workloads", "apps"].contains(&part) {
            if let Some(r) = args.repeat {
                argv.extend(["--repeat".into(), r.to_string().into()]);
            }
            if let Some(x) = args.scale {
                argv.extend(["--scale".into(), x.to_string().into()]);
            }
        }
        argv.extend(["--bench-dir".into(), args.bench_dir.clone().into()]);
        let cmd = <BenchArgs as clap::Args>::augment_args(clap::Command::new("bench"));
        let part_args: BenchArgs = clap::FromArgMatches::from_arg_matches(&cmd.try_get_matches_from(argv)?)?;
        let which = part_args.which.context("a part of the suite names its subcommand")?;
        let out = run_in_scratch(which, &part_args.bench_dir)?;
        print!("{}", out.text);
        Ok(out)
    });
    report.save(args.json.as_deref(), args.svg.as_deref())?;
    anyhow::ensure!(failed.is_empty(), "parts failed: {}", failed.join(", "));
    Ok(0)
}

/// Runs one part with a scratch directory of its own, removed afterwards.
fn run_in_scratch(which: Which, bench_dir: &Path) -> Result<Output> {
    let tmp = std::env::temp_dir().join(format!("rackmem-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let out = run_part(which, bench_dir, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    out
}

pub fn run_bench(args: BenchArgs) -> Result<i32> {
    let Some(which) = args.which else {
        return run_suite(&args);
    };
    let out = run_in_scratch(which, &args.bench_dir)?;
    print!("{}", out.text);
    out.save(args.json.as_deref(), args.svg.as_deref())?;
    Ok(0)
}
