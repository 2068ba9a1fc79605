//! `rackmem run`: start a program with `librackmem.so` preloaded and the runtime configured.

use crate::brick_cmd::{random_hex, read_secret};
use crate::values::parse_size_arg;
use anyhow::{bail, Context, Result};
use clap::Args;
use rackmem_brick::{Brick, BrickConfig, ListenAddr};
use rackmem_runtime::config::env;
use rackmem_runtime::policy::Eviction;
use rackmem_runtime::size::{format_size, Budget};
use rackmem_runtime::stats::StatsSnapshot;
use rackmem_transport::{BrickAddr, Link};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What `rackmem run` does unless told otherwise, for `--help`.
const DEFAULTS_HELP: &str = "\
Defaults (each can be overridden):
  What goes remote: blocks of the malloc family of at least --threshold, private anonymous mmap
    of at least --threshold, and, for programs on glibc's allocator, smaller blocks too: after
    the program's first MiB of them, the runtime serves them from a heap in remote memory
    (RACKMEM_SMALL_BLOCKS=off leaves them to glibc; RACKMEM_SMALL_BLOCKS_AFTER=BYTES moves the
    switch). A program that brings jemalloc, tcmalloc or mimalloc keeps it. Statically linked,
    Go and set-user-ID programs cannot be reached: rackmem says so at start.
  Shared memory: the segments of bricks on this host (the embedded brick, unix: bricks, and those
    the node agent hands out on unix: bricks) are mapped into the program, so a fault or a
    write-back is a memory copy rather than a request over the socket. --no-shared-memory or
    RACKMEM_SHARED_MEMORY=0 keeps the sockets; --shared-memory makes a failure to map an error.
    Bricks reached over TCP or TLS always use their links.
  Fault handler: placed by the runtime from the CPUs the program may use and the threads that
    fault. When one thread raises nearly all faults, it and the handler run on that thread's
    CPU and the handler sleeps between faults, so a fault costs a context switch rather than a
    wake-up across CPUs; the thread gets its own CPU mask back as soon as other threads fault,
    faults stop for a second, the program starts a thread, or it forks. While several threads fault, the handler runs on
    any of the program's CPUs and spins 200 µs after each fault. On one CPU (--cpus N, taskset)
    it sleeps between faults. --handler MODE (auto, blocking, busy-poll, hybrid[:µs]) sets the
    mode; --cpus confines the whole program. Faults in flight: one handler by default (on two
    CPUs a second one measured slower); --handlers N (RACKMEM_HANDLERS) starts N, which serve
    faults of different pages at once, for bricks across a network where a fault waits on it.
    Over a link (Unix socket without shared memory, TCP) a handler about to wait on a brick
    first sends the reads of up to 16 faults queued behind it (--pipeline N, RACKMEM_PIPELINE;
    0: one fault at a time).
  Eviction: refault. When the local buffer is full, pages seen once leave first in, first out;
    a page that faults back soon after its eviction is protected, and leaves only for pages
    that came back more often, so the hot set stays local. --eviction fifo (RACKMEM_EVICTION=fifo)
    evicts strictly in the order pages came in.
  Load control: on. When nearly every fault fetches back a page evicted shortly before and
    several threads raise them, one thread is favoured: its faults are served and the others'
    are held for a slice of at most 500 ms (at once released if the favoured thread waits for
    something), then the favour rotates. --no-load-control (RACKMEM_LOAD_CONTROL=0) serves every
    fault as it comes.
  Pages: 4 KiB. --huge-pages (RACKMEM_HUGE_PAGES=1) moves 2 MiB transparent huge pages instead,
    where the kernel allows them.
  Outrunning the link: a program that spends more than half of its time waiting on faults for
    5 s, mostly re-fetching pages evicted earlier, is told once on standard error, with its
    fault rate and a --local that would hold its working set.
  Migration (rackmem_migrate to another brick): direct. The target brick pulls pieces of 1 MiB
    and more from the source brick with a pull grant for exactly that range; smaller pieces, and
    pieces whose target cannot reach the source, are bounced through the program.
    RACKMEM_MIGRATION=bounce bounces every piece; RACKMEM_MIGRATION=direct is the default.";

#[derive(Args)]
#[command(trailing_var_arg = true, after_help = DEFAULTS_HELP)]
pub struct RunArgs {
    /// Local buffer: bytes (512MiB), or a percentage of the program's peak footprint in remote
    /// memory so far (25%). A percentage is a limit, like a memory cgroup's: it grows with the
    /// footprint and never shrinks when the program frees memory. A size stays that size. It is
    /// the limit of the whole run, like a cgroup's: every process the program forks or execs
    /// shares it (the footprint is theirs together). A percentage never gives the run less than
    /// 8 MiB, or its whole footprint so far when that is smaller (early in a run, P% of the
    /// footprint so far is far below P% of its final peak); RACKMEM_LOCAL_FLOOR sets another
    /// floor, 0 none.
    #[arg(long, value_name = "SIZE|PCT", default_value = "50%")]
    local: Budget,
    /// A memory brick to use (tcp://HOST:PORT, tls://HOST:PORT or unix:PATH); repeat for several. Without one, an
    /// embedded brick serves this run and stops after it.
    #[arg(long = "brick", value_name = "ADDR")]
    bricks: Vec<BrickAddr>,
    /// The node agent's socket: memory then comes from the control plane, attached as the
    /// program's allocations grow and returned when they shrink or the program exits. Without
    /// --agent or --brick, an embedded brick serves this run.
    #[arg(long, value_name = "SOCKET", env = env::AGENT, conflicts_with = "bricks")]
    agent: Option<PathBuf>,
    /// Shared secret of the bricks given with --brick.
    #[arg(long, value_name = "SECRET", env = env::SECRET, hide_env_values = true)]
    secret: Option<String>,
    /// File holding the shared secret (first line).
    #[arg(long, value_name = "PATH")]
    secret_file: Option<PathBuf>,
    /// PEM file of the CA certificates that tls:// bricks' certificates must chain to (the
    /// program's links verify each brick's certificate against them, for the host in its
    /// address). Needed for tls:// bricks, given with --brick or by the control plane.
    #[arg(long, value_name = "PEM", env = rackmem_transport::TLS_CA_ENV)]
    tls_ca: Option<PathBuf>,
    /// Allocations of at least this size go to remote memory.
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = parse_size_arg)]
    threshold: u64,
    /// Window (remote address space) per process; default: a quarter of each brick, at most 16 GiB each.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    window: Option<u64>,
    /// Size of the embedded brick (lazily backed: address space until written). Each forked
    /// child's copy-on-write clone takes a range the size of the window (16 GiB by default), so
    /// the default holds 255 children alive at once beside their parent.
    #[arg(long, value_name = "SIZE", default_value = "4TiB", value_parser = parse_size_arg)]
    embedded_size: u64,
    /// How the fault handler waits: auto (the default: placed by the runtime, see below),
    /// blocking, busy-poll, or hybrid[:MICROSECONDS].
    #[arg(long, value_name = "MODE")]
    handler: Option<String>,
    /// Fault handler threads (1 to 4, at most the program's CPUs), serving faults of different
    /// pages at once (default 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4))]
    handlers: Option<u32>,
    /// Faults each fault handler keeps in flight over a link (0 to 64, default 16): while it
    /// waits on a brick for one fault, the brick reads of the faults queued behind it are sent
    /// (also RACKMEM_PIPELINE; 0: one fault at a time).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=64))]
    pipeline: Option<u32>,
    /// Most pages fetched per fault on a sequential stream (0 disables prefetch).
    #[arg(long, value_name = "PAGES")]
    prefetch: Option<u32>,
    /// Shortest fetched run, in 4 KiB pages, received into recycled pages and moved into the
    /// window; shorter runs are copied into fresh pages (also RACKMEM_RECYCLE_MIN_PAGES). By
    /// default rackmem measures both on this machine at start (a few milliseconds) and takes
    /// the run length from which moving is no slower; --verbose prints the measurement.
    #[arg(long, value_name = "PAGES", value_parser = clap::value_parser!(u64).range(1..))]
    recycle_min_pages: Option<u64>,
    /// Which resident pages leave the local buffer when it is full (also RACKMEM_EVICTION):
    /// refault (the default) protects pages that fault back soon after they were evicted, the
    /// program's hot set, which eviction then leaves alone; pages seen once leave first in,
    /// first out, so a scan or a stream that never comes back is evicted as fifo would evict
    /// it. fifo evicts strictly in the order pages came in, hot or not.
    #[arg(long, value_name = "NAME", value_parser = parse_eviction)]
    eviction: Option<Eviction>,
    /// Serve every fault as it comes, even when several threads thrash the local buffer
    /// together (also RACKMEM_LOAD_CONTROL=0). By default one of them is favoured at a time
    /// (see Load control below).
    #[arg(long)]
    no_load_control: bool,
    /// Back the window by 2 MiB transparent huge pages (also RACKMEM_HUGE_PAGES=1): faults
    /// fetch, install and evict 2 MiB units (one request, one UFFDIO_MOVE each), the local
    /// buffer counts 2 MiB per resident unit, and write-back sends only the 4 KiB subpages that
    /// changed. Where THP is "never", or memory comes from the node agent, rackmem says so and
    /// keeps 4 KiB pages.
    #[arg(long)]
    huge_pages: bool,
    /// Require shared memory: fail if a brick on this host cannot map its segments into the
    /// program. Mapping them is already the default (see --no-shared-memory).
    #[arg(long, conflicts_with = "no_shared_memory")]
    shared_memory: bool,
    /// Reach bricks on this host over their Unix sockets instead of mapping their segments into
    /// the program (also RACKMEM_SHARED_MEMORY=0). By default the segments of the embedded brick
    /// and of unix: bricks (also those the node agent hands out) are mapped, so faults and
    /// write-back are memory copies, not socket round trips; bricks reached over TCP always use
    /// their links.
    #[arg(long)]
    no_shared_memory: bool,
    /// Pretend the bricks are across a given network: every link delays its responses as that
    /// network would (latency each way, line rate shared by the requests in flight, packet
    /// overhead), on top of what the real link costs. SPEC is `latency=5us,bandwidth=25Gbit`
    /// (optional `,lanes=N`, `,mtu=BYTES`, `,packet-overhead=BYTES`) or a preset: 25gbe,
    /// ib-seed002, 100g-rdma, cxl-switch (with overrides: `100g-rdma,latency=3us`). Implies
    /// --no-shared-memory. `rackmem model link` predicts the same networks; docs/model.md.
    #[arg(long, value_name = "SPEC", conflicts_with = "shared_memory")]
    emulate: Option<rackmem_model::link::LinkSpec>,
    /// Run the program on these CPUs only (a list as `taskset -c` takes it: 0, 0,2, 0-3). On
    /// one CPU, a single-threaded program and its fault handler take turns there: a fault is a
    /// context switch instead of a wake-up across CPUs (the handler then blocks rather than
    /// spins, unless --handler says otherwise). Rarely needed: by default the runtime runs the
    /// handler beside a thread that does all the faulting, without confining the others.
    #[arg(long, value_name = "LIST", value_parser = crate::sys::cpu_list)]
    cpus: Option<crate::sys::CpuList>,
    /// Print faults, bytes fetched/written back/prefetched and fault latency at exit.
    #[arg(long)]
    stats: bool,
    /// Write the statistics as JSON lines (one per process) to FILE.
    #[arg(long, value_name = "FILE")]
    stats_json: Option<PathBuf>,
    /// Print C-AMAT at exit (seed 002; docs/model.md): the program's page accesses (sampled:
    /// pages touched, counted once per 50 ms, from the kernel's accessed bits, a lower bound),
    /// faults and miss ratio at the local buffer, the bricks' C-AMAT (mean fault time over miss
    /// concurrency), and the share of the run a fault was outstanding. With --stats-json, the
    /// program's line gains a "camat" object. Samples the program's own process, not its
    /// children.
    #[arg(long)]
    camat: bool,
    /// Explain what the runtime does at start, fork and exit.
    #[arg(long, short)]
    verbose: bool,
    /// The program and its arguments.
    #[arg(required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// A brick named on the command line cannot be reached.
#[derive(Debug)]
pub struct Unreachable(pub String);

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Unreachable {}

fn parse_eviction(s: &str) -> Result<Eviction, String> {
    s.parse()
        .map_err(|e: rackmem_runtime::policy::UnknownEviction| e.to_string())
}

fn find_preload() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env::PRELOAD) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating the rackmem executable")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for cand in [
        dir.join("librackmem.so"),
        dir.join("../lib/librackmem.so"),
        dir.join("../librackmem.so"),
    ] {
        if cand.exists() {
            return Ok(cand.canonicalize().unwrap_or(cand));
        }
    }
    bail!(
        "librackmem.so not found next to {} (build it with `cargo build --release`, or set RACKMEM_PRELOAD)",
        exe.display()
    )
}

/// This user cannot open a userfaultfd that serves faults raised in system calls.
#[derive(Debug)]
pub struct NoPermission(pub String);

impl std::fmt::Display for NoPermission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for NoPermission {}

pub fn run(args: RunArgs) -> Result<i32> {
    let preload = find_preload()?;
    // The program would fail at its first large allocation: say it now, before it starts.
    if let Err(e) = rackmem_uffd::Uffd::open(&rackmem_uffd::OpenOptions::default()) {
        return Err(NoPermission(e.to_string()).into());
    }
    let tmp = std::env::temp_dir().join(format!("rackmem-run-{}-{}", std::process::id(), random_hex(4)?));
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let _cleanup = RemoveDir(tmp.clone());

    let mut embedded = None;
    let (bricks, secret) = if let Some(sock) = &args.agent {
        std::os::unix::net::UnixStream::connect(sock)
            .map_err(|e| Unreachable(format!("cannot reach the node agent at {}: {e}", sock.display())))?;
        (Vec::new(), String::new())
    } else if args.bricks.is_empty() {
        let secret = random_hex(16)?;
        let sock = tmp.join("brick.sock");
        let handle = Brick::start(BrickConfig {
            listen: ListenAddr::Unix(sock),
            size_bytes: args.embedded_size,
            key: random_hex(32)?.into_bytes(),
            secret: Some(secret.clone().into_bytes()),
            managed: false,
            limits: Default::default(),
            tls: None,
        })
        .context("starting the embedded brick")?;
        let addr: BrickAddr = handle.local_addr().parse().context("embedded brick address")?;
        embedded = Some(handle);
        (vec![addr], secret)
    } else {
        let secret = read_secret(args.secret.clone(), args.secret_file.as_deref())?
            .context("--brick needs the bricks' shared secret: pass --secret, --secret-file or RACKMEM_SECRET")?;
        let tls = match &args.tls_ca {
            Some(p) => Some(
                rackmem_transport::TlsClient::from_ca_file(p)
                    .map_err(anyhow::Error::msg)
                    .context("loading --tls-ca (RACKMEM_TLS_CA)")?,
            ),
            None => None,
        };
        for b in &args.bricks {
            let link = Link::connect_with(b, Duration::from_secs(5), tls.as_ref())
                .map_err(|e| Unreachable(format!("cannot reach brick {b}: {e}")))?;
            link.ping()
                .map_err(|e| Unreachable(format!("brick {b} does not answer: {e}")))?;
        }
        (args.bricks.clone(), String::from_utf8_lossy(&secret).into_owned())
    };

    let stats_file = match (&args.stats_json, args.stats || args.camat) {
        (Some(p), _) => {
            let _ = std::fs::remove_file(p);
            Some(p.clone())
        }
        (None, true) => Some(tmp.join("stats.jsonl")),
        (None, false) => None,
    };

    // One budget for every process of the run: see rackmem_runtime::run_budget.
    let run_budget = tmp.join("budget");
    rackmem_runtime::run_budget::create(&run_budget)
        .with_context(|| format!("creating the run's budget file {}", run_budget.display()))?;
    // The program may switch user (PostgreSQL's server does): the directory must let it in.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("opening {} to the program", tmp.display()))?;
    }

    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    let ld_preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", preload.display()),
        _ => preload.display().to_string(),
    };
    cmd.env("LD_PRELOAD", ld_preload)
        .env(
            env::BRICKS,
            bricks.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(","),
        )
        .env(env::SECRET, &secret)
        .env(env::AGENT, args.agent.as_deref().unwrap_or(Path::new("")))
        .env(env::LOCAL, args.local.to_string().replace(' ', ""))
        .env(env::THRESHOLD, args.threshold.to_string())
        // Notices such as "this program outruns its link" come once per run, not per child.
        .env(env::NOTICE_DIR, &tmp)
        .env(env::RUN_BUDGET, &run_budget);
    if let Some(ca) = &args.tls_ca {
        // Absolute: the program may change directory before it connects (fork, exec).
        cmd.env(
            rackmem_transport::TLS_CA_ENV,
            std::path::absolute(ca).unwrap_or_else(|_| ca.clone()),
        );
    }
    if let Budget::Bytes(b) = args.local {
        cmd.env(env::LOCAL, b.to_string());
    }
    if let Some(w) = args.window {
        cmd.env(env::WINDOW, w.to_string());
    }
    if let Some(h) = &args.handler {
        cmd.env(env::HANDLER, h);
    }
    if let Some(n) = args.handlers {
        cmd.env(env::HANDLERS, n.to_string());
    }
    if let Some(n) = args.pipeline {
        cmd.env(env::PIPELINE, n.to_string());
    }
    if let Some(p) = args.prefetch {
        cmd.env(env::PREFETCH, p.to_string());
    }
    if let Some(n) = args.recycle_min_pages {
        cmd.env(env::RECYCLE_MIN_PAGES, n.to_string());
    } else if std::env::var_os(env::RECYCLE_MIN_PAGES).is_none() {
        // Measured once per run, for every process of it (they share the machine).
        match rackmem_runtime::calibrate::recycle_crossover() {
            Ok(c) => {
                if args.verbose {
                    eprintln!("rackmem: {}", c.describe());
                }
                cmd.env(env::RECYCLE_MIN_PAGES, c.min_pages.to_string());
            }
            // The program's own start fails with the same cause and says it; here the pager's
            // default stays.
            Err(e) if args.verbose => eprintln!(
                "rackmem: could not measure copy against move ({e}); runs of {} pages and more move in recycled pages",
                rackmem_runtime::calibrate::DEFAULT_MIN_PAGES
            ),
            Err(_) => {}
        }
    }
    if let Some(e) = args.eviction {
        cmd.env(env::EVICTION, e.name());
    }
    if args.huge_pages {
        cmd.env(env::HUGE_PAGES, "1");
    }
    if args.no_load_control {
        cmd.env(env::LOAD_CONTROL, "0");
    }
    if let Some(spec) = &args.emulate {
        cmd.env(rackmem_transport::EMULATE_ENV, &spec.0.name);
        cmd.env(env::SHARED_MEMORY, "0");
    } else if args.shared_memory {
        cmd.env(env::SHARED_MEMORY, "1");
    } else if args.no_shared_memory {
        cmd.env(env::SHARED_MEMORY, "0");
    }
    if let Some(f) = &stats_file {
        cmd.env(env::STATS_FILE, f);
    }
    if args.verbose {
        cmd.env(env::VERBOSE, "1");
        eprintln!(
            "rackmem: running {:?} with local buffer {} on {}",
            args.command,
            args.local,
            match &args.agent {
                Some(a) => format!("memory from the node agent at {}", a.display()),
                None => bricks.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", "),
            }
        );
    }

    // Ctrl-C reaches the program through the terminal's process group; rackmem stays up to
    // report and clean up. A SIGTERM sent to rackmem itself is passed on. SIGCHLD says the
    // program ended: rackmem sleeps until a signal comes, never on a timer, since it may share
    // the program's CPU (`--cpus`).
    use signal_hook::consts::{SIGCHLD, SIGINT, SIGQUIT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGQUIT, SIGCHLD])
        .context("installing signal handlers")?;
    if let Some(c) = &args.cpus {
        // This thread only: the program inherits the mask, the embedded brick's threads (started
        // above) keep theirs.
        crate::sys::pin_this_thread(&c.0).with_context(|| format!("confining the program to CPUs {:?}", c.0))?;
    }
    // A program the runtime cannot enter is told so now, not found out from its memory use.
    let unreachable = crate::reach::examine(Path::new(&args.command[0]));
    if let Some(v) = &unreachable {
        eprintln!("{}", v.at_start());
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rackmem: cannot start {}: {e}", args.command[0]);
            return Ok(crate::exit::CANNOT_EXEC);
        }
    };
    let started = Instant::now();
    let sampler = args.camat.then(|| crate::camat::Sampler::start(child.id()));
    let status = loop {
        // Before blocking: a SIGCHLD that came before this point is still pending in `signals`.
        if let Some(s) = child.try_wait().context("waiting for the program")? {
            break s;
        }
        for sig in signals.wait() {
            if sig == SIGTERM {
                crate::sys::send_signal(child.id(), sig);
            }
        }
    };
    drop(signals);
    let wall = started.elapsed();
    let page_accesses = sampler.map(crate::camat::Sampler::finish);
    let code = match (status.code(), std::os::unix::process::ExitStatusExt::signal(&status)) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    };

    if let Some(v) = &unreachable {
        if let Ok(peak) = rackmem_sys::process::children_max_rss_bytes() {
            eprintln!("{}", v.at_exit(peak));
        }
    }

    if let Some(handle) = embedded {
        // A program that daemonized still uses the embedded brick: serve it until it is done.
        let start = Instant::now();
        let mut told = false;
        while handle.stats().connections > 0 {
            if !told && start.elapsed() > Duration::from_millis(500) {
                eprintln!("rackmem: the program exited; background processes still use remote memory, serving them until they exit");
                told = true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        handle.shutdown();
    }

    if let Some(f) = &stats_file {
        if args.stats {
            print_stats(f);
            if let Some(r) = rackmem_runtime::run_budget::read_summary(&run_budget) {
                eprintln!(
                    "rackmem: the run ({} process{}): budget {} of a peak footprint of {}; local at most {} of window pages, {} RssAnon (summed over its processes, sampled)",
                    r.processes,
                    if r.processes == 1 { "" } else { "es" },
                    format_size(r.budget_bytes),
                    format_size(r.peak_footprint_bytes),
                    format_size(r.peak_resident_bytes),
                    format_size(r.peak_rss_anon_bytes),
                );
            }
        }
        if let Some(accesses) = page_accesses {
            crate::camat::report(f, child.id(), accesses, wall, args.stats_json.is_some());
        }
    }
    Ok(code)
}

fn print_stats(path: &Path) {
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!("rackmem: no statistics: the program made no allocation large enough for remote memory");
        return;
    };
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    table.set_header(vec![
        "pid",
        "faults",
        "fetched",
        "prefetched",
        "read-ahead used",
        "early reads used",
        "written back",
        "evictions",
        "same-filled",
        "peak local",
        "budget",
        "peak footprint",
        "peak RssAnon",
        "fault p50",
        "p99",
        "in flight",
    ]);
    for line in text.lines() {
        let Ok(s) = serde_json::from_str::<StatsSnapshot>(line) else {
            continue;
        };
        table.add_row(vec![
            s.pid.to_string(),
            s.faults.to_string(),
            format_size(s.bytes_fetched),
            format_size(s.bytes_prefetched),
            match s.readahead_accuracy {
                Some(a) => format!(
                    "{:.0}% ({} of {})",
                    a * 100.0,
                    s.readahead_sample_used,
                    s.readahead_sample_used + s.readahead_sample_wasted
                ),
                None => "-".into(),
            },
            match s.reads_early {
                0 => "-".into(),
                sent => format!("{} of {sent}", s.reads_early_used),
            },
            format_size(s.bytes_written_back),
            s.evictions.to_string(),
            s.evictions_same_filled.to_string(),
            format_size(s.peak_resident_bytes),
            format_size(s.budget_bytes),
            format_size(s.peak_footprint_bytes),
            format_size(s.peak_rss_anon_bytes),
            format!("{:.1} µs", s.fault_p50_ns as f64 / 1000.0),
            format!("{:.1} µs", s.fault_p99_ns as f64 / 1000.0),
            format!("{:.2} (max {})", s.faults_in_flight_mean, s.faults_in_flight_max),
        ]);
    }
    eprintln!(
        "rackmem statistics (peak local: window pages resident at once; budget: the local buffer, of the peak \
         footprint in the window; read-ahead used: the share of the pages fetched beyond the \
         faulting page that the program used, estimated on a sample (used of sampled); early reads used: one-page reads the handler sent \
         over a link for faults queued behind the one it served, and how many of them a fault \
         collected (`--pipeline`); peak RssAnon: all anonymous memory the process held, sampled; fault latency: \
         the handler's service time; in flight: faults served at once, mean over the time any was, and most at \
         once):\n{table}"
    );
}

struct RemoveDir(PathBuf);
impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
