//! The compatibility suite: real programs from Debian and PyPI (installed by
//! `scripts/programs.sh`), each run natively and under `rackmem run --local 25%` and
//! `--local 10%`. What a program computes (hashes of its results, the values a server returns)
//! must be identical to the native run's, and the statistics each process wrote with
//! `--stats-json` must show its memory went remote where it should (the window held its large
//! allocations, pages were evicted and fetched back within the local buffer) and stayed local
//! where it must (a static binary, a Go runtime).
//!
//! One test per program, so a failure names it. A program that is not installed fails its test
//! with the package to install. Workload sources live in `tests/compat/`; sizes are small
//! enough that the whole suite runs in minutes at both budgets.
//!
//! `cargo test --release -p rackmem-cli --test compat -- --ignored compat_table` runs every
//! program natively, under rackmem at 25% and under Linux swap to zram in a memory cgroup
//! limited to 25% of the native run's peak usage, and prints the table of `docs/compat.md`.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// The budgets every program runs at.
const BUDGETS: [u32; 2] = [25, 10];

/// How long a server may take to start answering.
const SERVER_START: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A workload file from `tests/compat/`.
fn source(name: &str) -> PathBuf {
    repo().join("tests/compat").join(name)
}

/// The path of an installed program, or a failure naming the package that provides it.
fn need(program: &str, package: &str) -> PathBuf {
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![PathBuf::from(program)]
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(program)).collect())
            .unwrap_or_default()
    };
    candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("{program} is not installed: install the package {package} (./scripts/programs.sh does)")
    })
}

/// 64-bit FNV-1a: a digest of results that is the same on every run (no dependency needed).
fn fnv(h: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *h = (*h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv_file(path: &Path) -> String {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut h = FNV_START;
    fnv(&mut h, &data);
    format!("{} bytes fnv={h:016x}", data.len())
}

/// A TCP port that was free a moment ago (the kernel picked it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

// --- How a program is run: natively, under rackmem, or in a memory cgroup ----------------

/// A memory cgroup (v1 or v2, whichever the machine has) removed on drop.
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    fn new(limit_bytes: Option<u64>) -> Cgroup {
        use rackmem_bench::swap::{detect_cgroups, Cgroups};
        let cg = detect_cgroups().unwrap_or_else(|e| panic!("{e}"));
        let name = format!("rackmem-compat-{}-{}", std::process::id(), unique());
        let (dir, v2) = match cg {
            Cgroups::V1(root) => (root.join(name), false),
            Cgroups::V2(root) => {
                let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
                (root.join(name), true)
            }
        };
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating cgroup {}: {e}", dir.display()));
        let g = Cgroup { dir, v2 };
        if let Some(l) = limit_bytes {
            let f = if v2 { "memory.max" } else { "memory.limit_in_bytes" };
            std::fs::write(g.dir.join(f), l.to_string()).unwrap_or_else(|e| panic!("setting {f}: {e}"));
            if !v2 {
                let _ = std::fs::write(g.dir.join("memory.swappiness"), "60");
            }
        }
        g
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// The most memory the cgroup's processes used at once (the counter the limit applies to:
    /// anonymous memory plus the page cache they brought in).
    fn peak_bytes(&self) -> u64 {
        let f = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(f))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("cannot read {f} of {}", self.dir.display()))
    }
}

impl Cgroup {
    /// Processes of the cgroup its OOM killer has killed (`oom_kill` of v1's
    /// `memory.oom_control`, of v2's `memory.events`).
    fn oom_kills(&self) -> u64 {
        let f = if self.v2 { "memory.events" } else { "memory.oom_control" };
        std::fs::read_to_string(self.dir.join(f))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..250 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("warning: could not remove cgroup {}", self.dir.display());
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Native,
    /// `rackmem run --local PCT%`.
    Rackmem(u32),
    /// `rackmem run --local BYTES`: a limit fixed from the start, as a cgroup's is.
    RackmemBytes(u64),
    /// `rackmem run --agent SOCKET --local PCT%`: memory from a node agent, its control plane and
    /// a managed brick, started for the run.
    Agent(u32),
    /// Natively, in a memory cgroup: with a limit (the swap peer) or without (to measure the peak).
    Cgroup(Option<u64>),
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::Native => f.write_str("native"),
            Mode::Rackmem(p) => write!(f, "rackmem --local {p}%"),
            Mode::RackmemBytes(b) => write!(f, "rackmem --local {}MiB", b >> 20),
            Mode::Agent(p) => write!(f, "rackmem --agent --local {p}%"),
            Mode::Cgroup(None) => f.write_str("native (cgroup)"),
            Mode::Cgroup(Some(l)) => write!(f, "cgroup limit {} MiB", l >> 20),
        }
    }
}

/// One run of one program's workload: its scratch directory, and how the program under test
/// (never its clients) is started.
struct Run {
    // Stopped before its directory goes.
    agent: Option<AgentMemory>,
    mode: Mode,
    dir: tempfile::TempDir,
    stats_files: Vec<PathBuf>,
    cgroup: Option<Cgroup>,
}

/// A control plane, one managed brick and a node agent, for [`Mode::Agent`] runs: stopped when
/// the run ends.
struct AgentMemory {
    url: String,
    socket: PathBuf,
    // Dropped after the socket's users, in this order: the agent first.
    _agent: Guard,
    _brick: Guard,
    _control: Guard,
}

impl AgentMemory {
    fn start(dir: &Path) -> AgentMemory {
        let (control, url) = start_control(&dir.join("control.db"));
        let listen = format!("unix:{}", dir.join("brick.sock").display());
        let brick = start_managed_brick(&url, &listen, "4GiB", "b0", |_| {});
        let socket = dir.join("agent.sock");
        let mut cmd = Command::new(rackmem());
        cmd.args(["agent", "--control", &url, "--name", "n1", "--socket"])
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let agent = Guard::spawn(&mut cmd);
        let deadline = Instant::now() + START_LIMIT;
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "the agent never opened {}", socket.display());
            std::thread::sleep(Duration::from_millis(50));
        }
        AgentMemory {
            url,
            socket,
            _agent: agent,
            _brick: brick,
            _control: control,
        }
    }

    /// Segments of every live allocation.
    fn segments(&self) -> usize {
        ctl_json(&self.url, &["allocations"]).as_array().map_or(0, |a| {
            a.iter().map(|a| a["segments"].as_array().map_or(0, Vec::len)).sum()
        })
    }
}

impl Run {
    fn new(mode: Mode) -> Run {
        let dir = tempfile::Builder::new()
            .prefix("rackmem-compat-")
            .tempdir()
            .expect("create a scratch directory");
        let cgroup = match mode {
            Mode::Cgroup(limit) => Some(Cgroup::new(limit)),
            _ => None,
        };
        let agent = matches!(mode, Mode::Agent(_)).then(|| AgentMemory::start(dir.path()));
        Run {
            mode,
            dir,
            stats_files: Vec::new(),
            cgroup,
            agent,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `cmd` as this run starts the program under test.
    fn wrap(&mut self, cmd: Command) -> Command {
        self.wrap_as(cmd, None)
    }

    /// `cmd` started as `user` (through runuser), as this run starts the program under test:
    /// under rackmem, `rackmem run` itself runs as that user, as an administrator would start it.
    fn wrap_as(&mut self, cmd: Command, user: Option<&str>) -> Command {
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if let Some(u) = user {
            argv.extend(["runuser".into(), "-u".into(), u.into(), "--".into()]);
        }
        match self.mode {
            Mode::Native => {}
            Mode::Rackmem(_) | Mode::RackmemBytes(_) => {
                let local = match self.mode {
                    Mode::RackmemBytes(b) => format!("{}MiB", b >> 20),
                    Mode::Rackmem(pct) => format!("{pct}%"),
                    _ => unreachable!("a rackmem mode"),
                };
                let stats = self.path(&format!("stats-{}.jsonl", self.stats_files.len()));
                self.stats_files.push(stats.clone());
                argv.extend([
                    rackmem().into(),
                    "run".into(),
                    "--local".into(),
                    local.into(),
                    "--stats-json".into(),
                    stats.into_os_string(),
                    "--".into(),
                ]);
            }
            Mode::Agent(pct) => {
                let stats = self.path(&format!("stats-{}.jsonl", self.stats_files.len()));
                self.stats_files.push(stats.clone());
                let socket = &self.agent.as_ref().expect("an agent run has its agent").socket;
                argv.extend([
                    rackmem().into(),
                    "run".into(),
                    "--agent".into(),
                    socket.clone().into_os_string(),
                    "--local".into(),
                    format!("{pct}%").into(),
                    "--stats-json".into(),
                    stats.into_os_string(),
                    "--".into(),
                ]);
            }
            Mode::Cgroup(_) => {
                let procs = self.cgroup.as_ref().expect("a cgroup run has its cgroup").procs();
                let mut sh: Vec<std::ffi::OsString> = vec![
                    "sh".into(),
                    "-c".into(),
                    format!("echo $$ > '{}' && exec \"$@\"", procs.display()).into(),
                    "sh".into(),
                ];
                sh.append(&mut argv);
                argv = sh;
            }
        }
        argv.push(cmd.get_program().to_owned());
        argv.extend(cmd.get_args().map(ToOwned::to_owned));
        let mut w = Command::new(&argv[0]);
        w.args(&argv[1..]);
        // Real programs run with the defaults, the floor of a percentage budget included.
        w.env_remove(LOCAL_FLOOR_ENV);
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => w.env(k, v),
                None => w.env_remove(k),
            };
        }
        if let Some(d) = cmd.get_current_dir() {
            w.current_dir(d);
        }
        w
    }

    /// Runs the program under test to completion; it must succeed. Returns its stdout.
    fn run_ok(&mut self, cmd: Command) -> String {
        let shown = format!("{cmd:?}");
        let o = run_with_deadline(self.wrap(cmd), LIMIT);
        assert!(o.status.success(), "{} ({}) failed: {}", shown, self.mode, show(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The statistics every process under rackmem wrote.
    fn stats(&self) -> Vec<ProcStats> {
        self.stats_files.iter().flat_map(|f| read_stats(f)).collect()
    }
}

/// A long log cut to what explains a failure (see `Server::log`).
fn log_excerpt(log: &str) -> String {
    const HEAD: usize = 60;
    const TAIL: usize = 40;
    // Redis and others prefix lines with "pid:role day month year time": compare the rest.
    let body = |l: &str| {
        l.split_once(" # ")
            .or_else(|| l.split_once(" * "))
            .map_or(l, |(_, b)| b)
            .to_string()
    };
    let mut folded: Vec<(String, usize)> = Vec::new();
    for line in log.lines() {
        match folded.last_mut() {
            Some((last, n)) if body(last) == body(line) => *n += 1,
            _ => folded.push((line.to_string(), 1)),
        }
    }
    // A repeated block (a report printed over and over) folds to its first copy.
    let mut seen = std::collections::HashSet::new();
    let mut kept: Vec<String> = Vec::new();
    let mut hidden = 0usize;
    for (i, (line, n)) in folded.iter().enumerate() {
        let show = i < HEAD || i + TAIL >= folded.len() || line.contains("rackmem");
        if !show || !seen.insert(body(line)) {
            hidden += n;
            continue;
        }
        kept.push(if *n > 1 {
            format!("{line}   [{n} times]")
        } else {
            line.clone()
        });
    }
    if hidden > 0 {
        kept.push(format!("[{hidden} other lines of {} not shown]", log.lines().count()));
    }
    kept.join("\n") + "\n"
}

#[test]
fn a_server_log_is_cut_to_its_start_the_runtime_lines_and_its_end() {
    let mut log = String::from("1:M 25 Nov 06:38:06.700 * Server started\nrackmem: warning: something ran out\n");
    for i in 0..500 {
        log += &format!("1:M 25 Nov 06:38:06.{i:03} # Out Of Memory allocating 23 bytes!\n");
        log += &format!("1:M 25 Nov 06:38:06.{i:03} # ------ STACK TRACE ------\n");
    }
    log += "1:M 25 Nov 06:38:07.000 # the last line\n";
    let cut = log_excerpt(&log);
    assert!(
        cut.starts_with("1:M 25 Nov 06:38:06.700 * Server started\nrackmem: warning: something ran out\n"),
        "{cut}"
    );
    assert!(cut.contains("the last line"), "{cut}");
    assert_eq!(cut.matches("Out Of Memory").count(), 1, "{cut}");
    assert!(cut.lines().count() < 10, "{cut}");
    assert!(cut.contains("of 1003 not shown"), "{cut}");
}

/// A long-running program under test (a server), its output in a log file; killed with its
/// process group if the test fails before it is stopped.
struct Server {
    guard: Guard,
    log: PathBuf,
    name: String,
}

impl Server {
    fn start(run: &mut Run, name: &str, cmd: Command, user: Option<&str>) -> Server {
        let log = run.path(&format!("{name}.log"));
        let f = std::fs::File::create(&log).expect("create the server log");
        let mut w = run.wrap_as(cmd, user);
        w.stdin(Stdio::null())
            .stdout(f.try_clone().expect("dup the log"))
            .stderr(f);
        Server {
            guard: Guard::spawn(&mut w),
            log,
            name: format!("{name} ({})", run.mode),
        }
    }

    /// The server's log for a failure message: its beginning (where the runtime's warnings
    /// land), every line the runtime wrote, and its end, with runs of lines that differ only in
    /// their timestamps folded (a server that panics while panicking repeats its report).
    fn log(&self) -> String {
        log_excerpt(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Fails the test if the server has exited.
    fn assert_alive(&mut self) {
        if let Some(s) = self.guard.child().try_wait().expect("try_wait") {
            panic!(
                "{} exited ({s:?}) before it was stopped; its log:\n{}",
                self.name,
                self.log()
            );
        }
    }

    /// Calls `ready` until it returns true (the server answers), failing on exit or deadline.
    fn wait_ready(&mut self, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + SERVER_START;
        while !ready() {
            self.assert_alive();
            assert!(
                Instant::now() < deadline,
                "{} did not answer within {SERVER_START:?}; its log:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the server to exit after it was asked to stop; its exit status must be 0.
    fn wait_stopped(self) {
        self.wait_stopped_by(None);
    }

    /// Waits for the server to exit after it was asked to stop: with status 0, or killed by
    /// `signal` (a program that re-raises the signal it handled; `rackmem run` reports that
    /// death as 128 + the signal).
    fn wait_stopped_by(mut self, signal: Option<i32>) {
        use std::os::unix::process::ExitStatusExt;
        match self.guard.wait_until(LIMIT) {
            Some(s) => assert!(
                s.success() || (signal.is_some() && (s.signal() == signal || s.code() == signal.map(|n| 128 + n))),
                "{} exited with {s:?} when stopped; its log:\n{}",
                self.name,
                self.log()
            ),
            None => panic!("{} did not stop within {LIMIT:?}; its log:\n{}", self.name, self.log()),
        }
    }

    /// Sends `signal` to the server's own process (the child of `rackmem run`, `runuser` or the
    /// cgroup's shell, which forward it or exec'd it).
    fn signal(&self, signal: &str) {
        signal_pid(self.guard.id(), signal);
    }
}

impl Drop for Server {
    /// A test that fails while a server runs (a client's connection reset, say) shows what the
    /// server said, and whether it is still alive: that is where the cause is.
    fn drop(&mut self) {
        if std::thread::panicking() {
            let state = match self.guard.child().try_wait() {
                Ok(Some(s)) => format!("exited ({s:?})"),
                _ => "still running".to_string(),
            };
            eprintln!("--- {} ({state}); its log:\n{}---", self.name, self.log());
        }
    }
}

fn signal_pid(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status();
}

// --- What is checked -------------------------------------------------------------------

/// Where a program's memory must be while it runs under rackmem.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// In the window: some process had at least this much there, was evicted (its footprint
    /// exceeded the local buffer) and kept to its local buffer.
    Remote { min_footprint: u64 },
    /// In the window (at least this much), but the program touches less than its local buffer
    /// holds, so nothing needs to be evicted (a compressor's dictionary on a small input).
    InWindow { min_footprint: u64 },
    /// Nowhere near the window: a static binary or a runtime that maps its own memory by system
    /// call; no process may report window use.
    Local,
    /// Only that it works (the results match); the statistics are shown, not judged.
    Works,
}

fn budget_ok(s: &ProcStats, pct: u32) {
    // A lazily forked child starts with its parent's resident pages (shared copy-on-write),
    // which may pass its own share until it evicts them: its share plus what it inherited.
    let inherited = s.extra("inherited_resident_bytes");
    assert!(
        s.peak_resident_bytes <= s.budget_bytes.max(inherited) + RESIDENT_SLACK_BYTES,
        "peak resident {} exceeds the local buffer {} (and the {inherited} bytes it kept at a fork): {s:?}",
        s.peak_resident_bytes,
        s.budget_bytes
    );
    // The budget is PCT of the footprint (plus the rounding of a few pages): of the run's
    // footprint, all its processes together, with the run's shared budget; or the floor a
    // percentage gives a run, when that is more (never more than the footprint).
    let (budget, footprint) = match s.extra("run_budget_bytes") {
        0 => (s.budget_bytes, s.footprint_bytes()),
        run => (run.max(s.budget_bytes), s.extra("run_peak_footprint_bytes")),
    };
    let floor = rackmem_runtime::config::LOCAL_FLOOR_BYTES.min(footprint);
    assert!(
        budget * 100 <= (footprint * u64::from(pct)).max(floor * 100) + 100 * MIB,
        "local buffer {budget} is more than {pct}% of the footprint {footprint} and more than the floor \
         of a percentage ({floor}): {s:?}"
    );
}

fn check_stats(program: &str, expect: Expect, pct: u32, stats: &[ProcStats]) {
    let biggest = stats.iter().max_by_key(|s| s.footprint_bytes());
    match expect {
        Expect::Remote { min_footprint } | Expect::InWindow { min_footprint } => {
            let s = biggest.unwrap_or_else(|| {
                panic!("{program} at {pct}%: no process wrote statistics: its memory never reached the window")
            });
            assert!(
                s.footprint_bytes() >= min_footprint,
                "{program} at {pct}%: only {} MiB in the window, expected at least {} MiB: {s:?}",
                s.footprint_bytes() >> 20,
                min_footprint >> 20
            );
            assert!(s.faults > 0, "{program} at {pct}%: no faults: {s:?}");
            if let Expect::Remote { .. } = expect {
                assert!(
                    s.evictions > 0,
                    "{program} at {pct}%: nothing evicted, the local buffer was never full: {s:?}"
                );
                assert!(
                    s.bytes_fetched + s.bytes_prefetched + s.bytes_written_back > 0
                        || s.extra("evictions_same_filled") > 0,
                    "{program} at {pct}%: no page went to the brick and back: {s:?}"
                );
            }
            for s in stats {
                budget_ok(s, pct);
            }
        }
        Expect::Local => {
            for s in stats {
                assert!(
                    s.footprint_bytes() == 0 && s.faults == 0,
                    "{program} at {pct}%: must stay local but used the window: {s:?}"
                );
            }
        }
        Expect::Works => {
            for s in stats {
                budget_ok(s, pct);
            }
        }
    }
}

/// One program's workload: starts the program under test through `run`, returns what it
/// computed (compared across runs).
type Workload = fn(&mut Run) -> String;

/// Runs `workload` natively and at each budget: the results must match the native run's and
/// the statistics must match `expect`.
fn compat(program: &str, workload: Workload, expect: Expect) {
    require_root();
    let start = Instant::now();
    let native = workload(&mut Run::new(Mode::Native));
    eprintln!("{program}: native run took {:.1} s", start.elapsed().as_secs_f64());
    assert!(
        !native.trim().is_empty(),
        "{program}: the native run produced no result"
    );
    for pct in BUDGETS {
        let mut run = Run::new(Mode::Rackmem(pct));
        let start = Instant::now();
        let got = workload(&mut run);
        eprintln!("{program}: run at {pct}% took {:.1} s", start.elapsed().as_secs_f64());
        assert_eq!(
            got, native,
            "{program}: results under rackmem --local {pct}% differ from the native run"
        );
        let stats = run.stats();
        for s in &stats {
            eprintln!(
                "{program} {pct}%: pid {} {}: footprint {} MiB, faults {}, evictions {}, fetched {} MiB, written back {} MiB, budget {} MiB",
                s.pid,
                s.raw.get("program").and_then(|p| p.as_str()).unwrap_or("?"),
                s.footprint_bytes() >> 20,
                s.faults,
                s.evictions,
                (s.bytes_fetched + s.bytes_prefetched) >> 20,
                s.bytes_written_back >> 20,
                s.budget_bytes >> 20
            );
        }
        check_stats(program, expect, pct, &stats);
    }
}

// --- Workloads ---------------------------------------------------------------------------

/// Keys and values of the Redis and memcached workloads: a deterministic value of 500..4500
/// bytes per key and generation.
fn value(i: u64, generation: u64) -> Vec<u8> {
    let len = 500 + (i * 7919 + generation * 31) % 4000;
    (0..len)
        .map(|k| b'a' + ((i * 31 + k * 7 + generation * 13) % 26) as u8)
        .collect()
}

mod resp {
    //! A minimal Redis client (RESP2) over one TCP connection, pipelining commands.
    use super::*;

    #[derive(Debug, PartialEq, Eq)]
    pub enum Reply {
        Status(String),
        Error(String),
        Int(i64),
        Bulk(Option<Vec<u8>>),
        Array(Vec<Reply>),
    }

    pub struct Client {
        r: BufReader<TcpStream>,
        w: std::io::BufWriter<TcpStream>,
    }

    impl Client {
        pub fn connect(port: u16) -> std::io::Result<Client> {
            let s = TcpStream::connect(("127.0.0.1", port))?;
            s.set_read_timeout(Some(Duration::from_secs(60)))?;
            Ok(Client {
                r: BufReader::new(s.try_clone()?),
                w: std::io::BufWriter::new(s),
            })
        }

        pub fn send(&mut self, args: &[&[u8]]) {
            let mut out = format!("*{}\r\n", args.len()).into_bytes();
            for a in args {
                out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                out.extend_from_slice(a);
                out.extend_from_slice(b"\r\n");
            }
            self.w.write_all(&out).expect("send to redis");
        }

        pub fn read(&mut self) -> Reply {
            self.w.flush().expect("send to redis");
            let mut line = String::new();
            self.r.read_line(&mut line).expect("read from redis");
            let (kind, rest) = line.trim_end().split_at(1);
            let n = || {
                rest.parse::<i64>()
                    .unwrap_or_else(|_| panic!("bad reply line {line:?}"))
            };
            match kind {
                "+" => Reply::Status(rest.to_string()),
                "-" => Reply::Error(rest.to_string()),
                ":" => Reply::Int(n()),
                "$" if n() < 0 => Reply::Bulk(None),
                "$" => {
                    let mut b = vec![0; n() as usize + 2];
                    self.r.read_exact(&mut b).expect("read a bulk reply");
                    b.truncate(b.len() - 2);
                    Reply::Bulk(Some(b))
                }
                "*" => Reply::Array((0..n().max(0)).map(|_| self.read()).collect()),
                _ => panic!("unexpected reply line {line:?}"),
            }
        }

        pub fn call(&mut self, args: &[&[u8]]) -> Reply {
            self.send(args);
            self.read()
        }

        /// SHUTDOWN NOSAVE: the server closes the connection instead of answering.
        pub fn shutdown(&mut self) {
            self.send(&[b"SHUTDOWN", b"NOSAVE"]);
            let _ = self.w.flush();
        }

        pub fn info(&mut self, field: &str) -> String {
            match self.call(&[b"INFO", b"all"]) {
                Reply::Bulk(Some(b)) => String::from_utf8_lossy(&b)
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{field}:")).map(str::to_string))
                    .unwrap_or_else(|| panic!("INFO has no {field}")),
                r => panic!("INFO: {r:?}"),
            }
        }
    }
}

/// Sets keys `range` to generation `generation`, pipelined.
fn redis_set(c: &mut resp::Client, range: std::ops::Range<u64>, generation: u64) {
    for chunk in range.collect::<Vec<_>>().chunks(500) {
        for &i in chunk {
            c.send(&[b"SET", format!("key:{i}").as_bytes(), &value(i, generation)]);
        }
        for _ in chunk {
            assert_eq!(c.read(), resp::Reply::Status("OK".into()));
        }
    }
}

/// Reads every key of `0..keys` and checks it against `expected(i)`; returns the number of keys
/// present and a digest of their values.
fn redis_verify(c: &mut resp::Client, keys: u64, expected: impl Fn(u64) -> Option<Vec<u8>>, what: &str) -> String {
    let mut h = FNV_START;
    let mut present = 0u64;
    for chunk in (0..keys).collect::<Vec<_>>().chunks(500) {
        let names: Vec<Vec<u8>> = chunk.iter().map(|i| format!("key:{i}").into_bytes()).collect();
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(names.iter().map(Vec::as_slice));
        let resp::Reply::Array(values) = c.call(&args) else {
            panic!("MGET returned no array");
        };
        for (&i, v) in chunk.iter().zip(values) {
            let resp::Reply::Bulk(v) = v else {
                panic!("MGET element is not a bulk string")
            };
            assert!(v == expected(i), "{what}: key:{i} holds the wrong value");
            if let Some(v) = v {
                present += 1;
                fnv(&mut h, &v);
            }
        }
    }
    assert_eq!(
        c.call(&[b"DBSIZE"]),
        resp::Reply::Int(present as i64),
        "{what}: keys beyond those written"
    );
    format!("{what}: keys={present} fnv={h:016x}")
}

fn redis_connect(server: &mut Server, port: u16) -> resp::Client {
    let mut client = None;
    server.wait_ready(|| match resp::Client::connect(port) {
        Ok(mut c) => {
            let ok = c.call(&[b"PING"]) == resp::Reply::Status("PONG".into());
            if ok {
                client = Some(c);
            }
            ok
        }
        Err(_) => false,
    });
    client.expect("connected")
}

/// The children of process `pid` (the fork that saves a snapshot).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after its closing paren.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        if rest.split_whitespace().nth(1) == Some(&pid.to_string()) {
            if let Ok(child) = e.file_name().to_string_lossy().parse() {
                out.push(child);
            }
        }
    }
    out
}

const REDIS_KEYS: u64 = 40_000;
const REDIS_OVERWRITTEN: u64 = 10_000;
const REDIS_ADDED: u64 = 10_000;

/// The value key `i` holds after the writes made while the snapshot was being saved.
fn redis_after(i: u64) -> Option<Vec<u8>> {
    if i < REDIS_OVERWRITTEN {
        Some(value(i, 1))
    } else if i < 2 * REDIS_OVERWRITTEN && i % 10 == 9 {
        None // deleted
    } else if i < REDIS_KEYS {
        Some(value(i, 0))
    } else if i < REDIS_KEYS + REDIS_ADDED {
        Some(value(i, 1))
    } else {
        None
    }
}

fn redis_before(i: u64) -> Option<Vec<u8>> {
    (i < REDIS_KEYS).then(|| value(i, 0))
}

fn redis_server(run: &mut Run, dir: &Path, port: u16, wrapped: bool) -> Server {
    let mut cmd = Command::new(need("redis-server", "redis-server"));
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ])
    .args(["--daemonize", "no", "--dbfilename", "snapshot.rdb", "--dir"])
    .arg(dir);
    if wrapped {
        Server::start(run, "redis-server", cmd, None)
    } else {
        // The server that checks the snapshot always runs natively.
        let mut native = Run::new(Mode::Native);
        let s = Server::start(&mut native, "redis-server (checking the snapshot)", cmd, None);
        // Keep its scratch directory (the log) for as long as the server lives.
        std::mem::forget(native.dir);
        s
    }
}

/// redis-server (linked with jemalloc): load keys, BGSAVE, and keep writing (overwrites, new
/// keys, deletions) while the forked child saves; the snapshot must hold exactly the state at
/// the fork, the live server exactly the state after the writes.
fn redis(run: &mut Run) -> String {
    let dir = run.path("data");
    std::fs::create_dir(&dir).expect("create the redis directory");
    let port = free_port();
    let mut server = redis_server(run, &dir, port, true);
    let mut c = redis_connect(&mut server, port);
    redis_set(&mut c, 0..REDIS_KEYS, 0);
    let mut out = vec![redis_verify(&mut c, REDIS_KEYS, redis_before, "loaded")];

    // The child saves slowly (a delay per key) and is stopped as soon as it exists, so every
    // write below happens while the snapshot is in progress.
    assert_eq!(
        c.call(&[b"CONFIG", b"SET", b"rdb-key-save-delay", b"20"]),
        resp::Reply::Status("OK".into())
    );
    let server_pid: u32 = c.info("process_id").trim().parse().expect("process_id");
    assert!(matches!(c.call(&[b"BGSAVE"]), resp::Reply::Status(_)), "BGSAVE refused");
    let saver = children_of(server_pid);
    assert_eq!(
        saver.len(),
        1,
        "expected one child saving the snapshot, found {saver:?}"
    );
    signal_pid(saver[0], "STOP");
    redis_set(&mut c, 0..REDIS_OVERWRITTEN, 1);
    redis_set(&mut c, REDIS_KEYS..REDIS_KEYS + REDIS_ADDED, 1);
    for i in (REDIS_OVERWRITTEN..2 * REDIS_OVERWRITTEN).filter(|i| i % 10 == 9) {
        c.send(&[b"DEL", format!("key:{i}").as_bytes()]);
    }
    for _ in (REDIS_OVERWRITTEN..2 * REDIS_OVERWRITTEN).filter(|i| i % 10 == 9) {
        assert_eq!(c.read(), resp::Reply::Int(1));
    }
    assert_eq!(
        c.info("rdb_bgsave_in_progress").trim(),
        "1",
        "the snapshot finished before the writes"
    );
    signal_pid(saver[0], "CONT");
    let deadline = Instant::now() + LIMIT;
    while c.info("rdb_bgsave_in_progress").trim() != "0" {
        server.assert_alive();
        assert!(Instant::now() < deadline, "BGSAVE did not finish within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        c.info("rdb_last_bgsave_status").trim(),
        "ok",
        "BGSAVE failed: {}",
        server.log()
    );
    out.push(redis_verify(
        &mut c,
        REDIS_KEYS + REDIS_ADDED,
        redis_after,
        "live after the writes",
    ));
    c.shutdown();
    server.wait_stopped();

    // The snapshot, loaded by a native server.
    let check = run.path("check");
    std::fs::create_dir(&check).expect("create the check directory");
    std::fs::copy(dir.join("snapshot.rdb"), check.join("snapshot.rdb")).expect("copy the snapshot");
    let port = free_port();
    let mut native = redis_server(run, &check, port, false);
    let mut c = redis_connect(&mut native, port);
    out.push(redis_verify(&mut c, REDIS_KEYS + REDIS_ADDED, redis_before, "snapshot"));
    c.shutdown();
    native.wait_stopped();
    out.join("\n")
}

/// A C program that allocates, frees and reallocates with another allocator preloaded.
fn preloaded_allocator(run: &mut Run, library: &str, package: &str) -> String {
    let lib = need(&format!("/usr/lib/x86_64-linux-gnu/{library}"), package);
    let exe = compile_c(run, "alloc_churn");
    let mut cmd = Command::new(exe);
    cmd.args(["128", "6"]).env("LD_PRELOAD", lib);
    run.run_ok(cmd)
}

/// Compiles `tests/compat/NAME.c` into the run's directory (C11, no warnings).
fn compile_c(run: &Run, name: &str) -> PathBuf {
    let out = run.path(name);
    let o = Command::new("gcc")
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(source(&format!("{name}.c")))
        .output()
        .expect("run gcc (install gcc)");
    assert!(
        o.status.success(),
        "gcc {name}.c: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn tcmalloc(run: &mut Run) -> String {
    preloaded_allocator(run, "libtcmalloc_minimal.so.4", "libtcmalloc-minimal4")
}

fn mimalloc(run: &mut Run) -> String {
    preloaded_allocator(run, "libmimalloc.so.2", "libmimalloc2.0")
}

fn numpy(run: &mut Run) -> String {
    let py = need("python3", "python3");
    let o = Command::new(&py)
        .args(["-c", "import numpy"])
        .output()
        .expect("run python3");
    assert!(
        o.status.success(),
        "NumPy is missing for {}: python3 -m pip install numpy (./scripts/programs.sh does)",
        py.display()
    );
    let mut cmd = Command::new(py);
    cmd.arg(source("numpy_hash.py")).arg("64");
    run.run_ok(cmd)
}

const JAVA_HEAP_MIB: u64 = 640;

fn jvm(run: &mut Run) -> String {
    let javac = need("javac", "openjdk-17-jdk-headless");
    let java = need("java", "openjdk-17-jdk-headless");
    let classes = run.path("classes");
    let o = Command::new(javac)
        .arg("-d")
        .arg(&classes)
        .arg(source("HeapFill.java"))
        .output()
        .expect("run javac");
    assert!(o.status.success(), "javac: {}", String::from_utf8_lossy(&o.stderr));
    let mut cmd = Command::new(java);
    cmd.args(["-Xmx1g", "-XX:-UsePerfData", "-cp"])
        .arg(&classes)
        .args(["HeapFill", &JAVA_HEAP_MIB.to_string()]);
    run.run_ok(cmd)
}

const NODE_BUFFERS_MIB: u64 = 128;

fn node(run: &mut Run) -> String {
    let mut cmd = Command::new(need("node", "nodejs"));
    cmd.arg("--max-old-space-size=1024")
        .arg(source("heap.js"))
        .args([&NODE_BUFFERS_MIB.to_string(), "1200000"]);
    run.run_ok(cmd)
}

fn sqlite(run: &mut Run) -> String {
    let mut cmd = Command::new(need("sqlite3", "sqlite3"));
    // The page cache in one buffer of 24000 slots of a 4 KiB page and its header (100 MiB):
    // the database grows to about 50 MiB, so the cache holds all of it.
    cmd.args(["-pagecache", "4368", "24000"])
        .arg(run.path("compat.db"))
        .arg(format!(".read {}", source("sqlite.sql").display()));
    run.run_ok(cmd)
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

fn chown_to(path: &Path, user: &str) {
    let o = Command::new("chown")
        .arg("-R")
        .arg(user)
        .arg(path)
        .output()
        .expect("run chown");
    assert!(
        o.status.success(),
        "chown {user} {}: {}",
        path.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Lets user postgres open /dev/userfaultfd while it lives (the access `rackmem run` asks an
/// administrator to grant a user other than root), and takes the access back when the last
/// one is dropped, in this process and in any other: each holds a shared lock on a file for
/// the user while it lives, and the access goes only with the exclusive lock (tests of the same
/// user run at the same time, and test processes too: a measuring run beside the test suite).
struct UffdAccess {
    user: &'static str,
    held: std::fs::File,
}

/// The lock file of `user`'s access.
fn uffd_access_lock(user: &str) -> std::fs::File {
    let path = std::env::temp_dir().join(format!("rackmem-test-uffd-access-{user}.lock"));
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

impl UffdAccess {
    fn grant(user: &'static str) -> UffdAccess {
        let held = uffd_access_lock(user);
        // Waits while another test takes the access back, then keeps it from doing so.
        held.lock_shared().expect("lock the userfaultfd access file");
        let setfacl = need("setfacl", "acl");
        let o = Command::new(setfacl)
            .args(["-m", &format!("u:{user}:rw"), "/dev/userfaultfd"])
            .output()
            .expect("run setfacl");
        assert!(
            o.status.success(),
            "cannot let {user} open /dev/userfaultfd: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        UffdAccess { user, held }
    }
}

impl Drop for UffdAccess {
    fn drop(&mut self) {
        let _ = self.held.unlock();
        // Exclusive only if no other grant of this user lives, here or in another process.
        let last = uffd_access_lock(self.user);
        if last.try_lock().is_ok() {
            let _ = Command::new("setfacl")
                .args(["-x", &format!("u:{}", self.user), "/dev/userfaultfd"])
                .status();
        }
    }
}

fn psql(socket_dir: &Path, port: u16, sql: &str) -> String {
    let o = Command::new(need("psql", "postgresql-client"))
        .arg("-h")
        .arg(socket_dir)
        .args([
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ])
        .output()
        .expect("run psql");
    assert!(o.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A PostgreSQL server of a workload: stopped (fast shutdown) by [`Postgres::stop`].
struct Postgres {
    server: Server,
    sock: PathBuf,
    port: u16,
    data: PathBuf,
    _access: Option<UffdAccess>,
}

/// PostgreSQL, as user postgres: initdb and the server under the same `rackmem run` setup.
fn start_postgres(run: &mut Run) -> Postgres {
    need(&format!("{PG_BIN}/postgres"), "postgresql");
    let access = matches!(run.mode, Mode::Rackmem(_) | Mode::RackmemBytes(_)).then(|| UffdAccess::grant("postgres"));
    chown_to(run.dir.path(), "postgres");
    let data = run.path("data");
    let mut initdb = Command::new(format!("{PG_BIN}/initdb"));
    initdb
        .arg("-D")
        .arg(&data)
        .args(["-A", "trust", "-U", "postgres", "--no-sync", "--no-instructions"])
        .current_dir(run.dir.path());
    let shown = format!("{initdb:?}");
    let o = run_with_deadline(run.wrap_as(initdb, Some("postgres")), LIMIT);
    assert!(o.status.success(), "{shown} ({}): {}", run.mode, show(&o));

    let port = free_port();
    let sock = run.dir.path().to_path_buf();
    let mut cmd = Command::new(format!("{PG_BIN}/postgres"));
    cmd.arg("-D")
        .arg(&data)
        .args(["-p", &port.to_string(), "-k"])
        .arg(&sock)
        .args([
            "-c",
            "listen_addresses=",
            "-c",
            "shared_buffers=64MB",
            "-c",
            "fsync=off",
        ])
        .args(["-c", "max_parallel_workers_per_gather=0", "-c", "work_mem=256MB"])
        .current_dir(run.dir.path());
    let mut server = Server::start(run, "postgres", cmd, Some("postgres"));
    server.wait_ready(|| {
        Command::new(need("pg_isready", "postgresql-client"))
            .arg("-h")
            .arg(&sock)
            .args(["-p", &port.to_string(), "-q"])
            .status()
            .is_ok_and(|s| s.success())
    });
    Postgres {
        server,
        sock,
        port,
        data,
        _access: access,
    }
}

impl Postgres {
    fn pgbench(&self, args: &[&str]) -> String {
        let o = Command::new(need("pgbench", "postgresql-client"))
            .arg("-h")
            .arg(&self.sock)
            .args(["-p", &self.port.to_string(), "-U", "postgres"])
            .args(args)
            .arg("postgres")
            .output()
            .expect("run pgbench");
        assert!(
            o.status.success(),
            "pgbench {args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn stop(self) {
        // Fast shutdown: SIGINT to the postmaster, whose pid is the first line of postmaster.pid.
        let pid = std::fs::read_to_string(self.data.join("postmaster.pid")).expect("read postmaster.pid");
        signal_pid(
            pid.lines()
                .next()
                .and_then(|l| l.trim().parse().ok())
                .expect("postmaster pid"),
            "INT",
        );
        self.server.wait_stopped();
    }
}

/// PostgreSQL: pgbench's tables, then sorts, a hash join and aggregates with a large work_mem.
fn postgres(run: &mut Run) -> String {
    let pg = start_postgres(run);
    let (sock, port) = (pg.sock.clone(), pg.port);
    pg.pgbench(&["-i", "-q", "-s", "1"]);
    let queries = [
        "select count(*), sum(abalance), sum(bid) from pgbench_accounts",
        "select md5(string_agg(aid::text, ',' order by md5(aid::text))) from pgbench_accounts",
        "select md5(string_agg(x::text, ',' order by md5(x::text) desc)) from generate_series(1, 200000) x",
        "select count(*), sum(a.aid - b.aid) from pgbench_accounts a join pgbench_accounts b on a.aid = b.aid + 1",
        "select bid, count(distinct md5(aid::text)) from pgbench_accounts group by bid order by bid",
    ];
    let out: Vec<String> = queries.iter().map(|q| psql(&sock, port, q)).collect();
    pg.stop();
    out.join("\n")
}

/// PostgreSQL under pgbench after `pgbench -i -s 4`: select-only with 4 clients, select-only
/// with a new connection (a forked backend) per transaction, and TPC-B-like with 4 clients.
/// The output is what does not depend on timing: the transactions processed and TPC-B's
/// invariants (every account, teller and branch balance sums to the same; one history row per
/// transaction).
fn pgbench(run: &mut Run) -> String {
    let pg = start_postgres(run);
    // Each phase's time goes to stderr: where a slow run loses its time.
    let t = Instant::now();
    pg.pgbench(&["-i", "-q", "-s", "4"]);
    eprintln!("pgbench ({}) -i: {:.2} s", run.mode, t.elapsed().as_secs_f64());
    let mut out = Vec::new();
    for args in [
        &["-S", "-c", "4", "-j", "2", "-t", "5000"][..],
        &["-S", "-C", "-c", "4", "-j", "2", "-t", "150"][..],
        &["-c", "4", "-j", "2", "-t", "1000"][..],
    ] {
        let t = Instant::now();
        let o = pg.pgbench(args);
        eprintln!("pgbench ({}) {args:?}: {:.2} s", run.mode, t.elapsed().as_secs_f64());
        let done = o
            .lines()
            .find(|l| l.starts_with("number of transactions actually processed"))
            .unwrap_or("no transaction count")
            .to_string();
        out.push(format!("{args:?}: {done}"));
    }
    out.push(psql(
        &pg.sock,
        pg.port,
        "select (select sum(abalance) from pgbench_accounts) = (select sum(tbalance) from pgbench_tellers) \
         and (select sum(tbalance) from pgbench_tellers) = (select sum(bbalance) from pgbench_branches), \
         (select count(*) from pgbench_history)",
    ));
    pg.stop();
    out.join("\n")
}

mod memcache {
    //! A minimal memcached client (ASCII protocol), pipelining sets and multi-key gets.
    use super::*;

    pub struct Client {
        r: BufReader<TcpStream>,
        w: std::io::BufWriter<TcpStream>,
    }

    impl Client {
        pub fn connect(port: u16) -> std::io::Result<Client> {
            let s = TcpStream::connect(("127.0.0.1", port))?;
            s.set_read_timeout(Some(Duration::from_secs(60)))?;
            Ok(Client {
                r: BufReader::new(s.try_clone()?),
                w: std::io::BufWriter::new(s),
            })
        }

        fn line(&mut self) -> String {
            let mut l = String::new();
            self.r.read_line(&mut l).expect("read from memcached");
            l.trim_end().to_string()
        }

        pub fn set_all(&mut self, keys: &[u64], generation: u64) {
            for &i in keys {
                let v = value(i, generation);
                write!(self.w, "set key:{i} 0 0 {}\r\n", v.len()).expect("send");
                self.w.write_all(&v).expect("send");
                self.w.write_all(b"\r\n").expect("send");
            }
            self.w.flush().expect("send");
            for _ in keys {
                let l = self.line();
                assert_eq!(l, "STORED");
            }
        }

        /// Values of `keys`, by key (absent ones missing).
        pub fn get_all(&mut self, keys: &[u64]) -> Vec<(u64, Vec<u8>)> {
            let names: Vec<String> = keys.iter().map(|i| format!("key:{i}")).collect();
            write!(self.w, "get {}\r\n", names.join(" ")).expect("send");
            self.w.flush().expect("send");
            let mut out = Vec::new();
            loop {
                let l = self.line();
                if l == "END" {
                    return out;
                }
                let parts: Vec<&str> = l.split(' ').collect();
                assert!(parts.len() == 4 && parts[0] == "VALUE", "unexpected reply {l:?}");
                let i: u64 = parts[1].trim_start_matches("key:").parse().expect("key number");
                let n: usize = parts[3].parse().expect("length");
                let mut v = vec![0; n + 2];
                self.r.read_exact(&mut v).expect("read a value");
                v.truncate(n);
                out.push((i, v));
            }
        }

        pub fn ping(&mut self) -> bool {
            write!(self.w, "version\r\n").is_ok() && self.w.flush().is_ok() && self.line().starts_with("VERSION")
        }
    }
}

const MEMCACHED_KEYS: u64 = 30_000;

/// memcached with a large -m: sets, overwrites and reads back every value.
fn memcached(run: &mut Run) -> String {
    let port = free_port();
    let mut cmd = Command::new(need("memcached", "memcached"));
    cmd.args([
        "-l",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-m",
        "2048",
        "-t",
        "2",
        "-u",
        "root",
    ]);
    let mut server = Server::start(run, "memcached", cmd, None);
    let mut client = None;
    server.wait_ready(|| match memcache::Client::connect(port) {
        Ok(mut c) => {
            let ok = c.ping();
            if ok {
                client = Some(c);
            }
            ok
        }
        Err(_) => false,
    });
    let mut c = client.expect("connected");
    let keys: Vec<u64> = (0..MEMCACHED_KEYS).collect();
    for chunk in keys.chunks(500) {
        c.set_all(chunk, 0);
    }
    // Overwrite every third key with a value of another size.
    let third: Vec<u64> = keys.iter().copied().filter(|i| i % 3 == 0).collect();
    for chunk in third.chunks(500) {
        c.set_all(chunk, 1);
    }
    let mut h = FNV_START;
    let mut found = 0;
    for chunk in keys.chunks(100) {
        let got = c.get_all(chunk);
        assert_eq!(got.len(), chunk.len(), "memcached lost values (evicted or corrupted)");
        for (i, v) in got {
            let expected = value(i, if i % 3 == 0 { 1 } else { 0 });
            assert!(v == expected, "memcached key:{i} holds the wrong value");
            fnv(&mut h, &v);
            found += 1;
        }
    }
    server.signal("TERM");
    server.wait_stopped();
    format!("values={found} fnv={h:016x}")
}

/// A deterministic text file of `lines` lines.
fn text_file(path: &Path, lines: u64) {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).expect("create the input"));
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for i in 0..lines {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        writeln!(
            w,
            "{:016x} {} line {i} {}",
            x,
            x % 1000,
            "abcdefgh".repeat((x % 5) as usize)
        )
        .expect("write the input");
    }
    w.flush().expect("write the input");
}

/// GNU sort with a large -S buffer (four times the input: sort allocates all of it).
fn gnu_sort(run: &mut Run) -> String {
    let input = run.path("input.txt");
    text_file(&input, 300_000);
    let output = run.path("sorted.txt");
    let mut cmd = Command::new(need("sort", "coreutils"));
    cmd.args(["-S", "64M", "--parallel=1", "-k", "2,2n", "-k", "1,1", "-o"])
        .arg(&output)
        .arg(&input)
        .env("LC_ALL", "C");
    run.run_ok(cmd);
    format!("sorted: {}", fnv_file(&output))
}

/// A small input for the compressors: text with repeats far apart (a large window pays off).
fn compressor_input(path: &Path) {
    text_file(path, 12_000);
    let chunk = std::fs::read(path).expect("read the input");
    let mut all = chunk.clone();
    all.extend_from_slice(&chunk[..chunk.len() / 2]);
    all.extend_from_slice(&chunk);
    std::fs::write(path, all).expect("write the input");
}

fn decompress(tool: &Path, compressed: &Path, original: &Path) {
    let o = Command::new(tool)
        .arg("-d")
        .arg("-c")
        .arg(compressed)
        .output()
        .expect("run the decompressor");
    assert!(
        o.status.success(),
        "{} -d: {}",
        tool.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let orig = std::fs::read(original).expect("read the input");
    assert!(
        o.stdout == orig,
        "{} does not decompress to the input",
        compressed.display()
    );
}

/// xz with a 256 MiB dictionary on a small input.
fn xz(run: &mut Run) -> String {
    let tool = need("xz", "xz-utils");
    let input = run.path("input.txt");
    compressor_input(&input);
    let mut cmd = Command::new(&tool);
    cmd.args(["-T1", "-k", "-c", "--lzma2=preset=6,dict=256MiB"])
        .arg(&input);
    let shown = format!("{cmd:?}");
    let o = run_with_deadline(run.wrap(cmd), LIMIT);
    assert!(o.status.success(), "{shown} ({}): {}", run.mode, show(&o));
    let out = run.path("input.txt.xz");
    std::fs::write(&out, &o.stdout).expect("write the compressed file");
    decompress(&tool, &out, &input);
    format!("xz: {}", fnv_file(&out))
}

/// zstd at its highest level with a 128 MiB long-distance window on a small input. The input
/// comes on stdin, so zstd cannot shrink its tables to the input's size: it allocates them
/// for a 128 MiB window (3 GiB) and touches a fraction.
fn zstd(run: &mut Run) -> String {
    let tool = need("zstd", "zstd");
    let input = run.path("input.txt");
    compressor_input(&input);
    let out = run.path("input.txt.zst");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("exec \"$0\" -q -T1 --ultra -22 --long=27 -c < \"$1\" > \"$2\"")
        .arg(&tool)
        .arg(&input)
        .arg(&out);
    run.run_ok(cmd);
    let o = Command::new(&tool)
        .args(["-d", "-c", "--long=27"])
        .arg(&out)
        .output()
        .expect("run zstd -d");
    assert!(o.status.success(), "zstd -d: {}", String::from_utf8_lossy(&o.stderr));
    assert!(
        o.stdout == std::fs::read(&input).expect("read the input"),
        "zstd does not decompress to the input"
    );
    format!("zstd: {}", fnv_file(&out))
}

/// busybox-static: a shell pipeline of busybox applets (static: no preload can reach it).
fn busybox(run: &mut Run) -> String {
    let bb = need("/bin/busybox", "busybox-static");
    let mut cmd = Command::new(&bb);
    cmd.args([
        "sh",
        "-c",
        "i=0; while [ $i -lt 20000 ]; do echo \"$((i * 7919 % 10007)) line $i\"; i=$((i + 1)); done \
         | busybox sort -n | busybox md5sum; busybox seq 1 100000 | busybox awk '{s += $1 * $1} END {print s}'",
    ]);
    run.run_ok(cmd)
}

/// etcd (Go): `etcd --version`, then a short-lived single-member cluster doing puts and gets.
fn etcd(run: &mut Run) -> String {
    let etcd = need("etcd", "etcd-server");
    let etcdctl = need("etcdctl", "etcd-client");
    let mut version = Command::new(&etcd);
    version.arg("--version");
    let mut out = run
        .run_ok(version)
        .lines()
        .filter(|l| l.starts_with("etcd Version"))
        .collect::<Vec<_>>()
        .join("\n");
    let (client, peer) = (free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut cmd = Command::new(&etcd);
    cmd.args(["--name", "compat", "--data-dir"])
        .arg(run.path("etcd"))
        .args([
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("compat={peer_url}")]);
    let mut server = Server::start(run, "etcd", cmd, None);
    let ctl = |args: &[&str]| {
        Command::new(&etcdctl)
            .args(["--endpoints", &client_url, "--dial-timeout", "2s"])
            .args(args)
            .env("ETCDCTL_API", "3")
            .output()
            .expect("run etcdctl")
    };
    server.wait_ready(|| ctl(&["endpoint", "health"]).status.success());
    for i in 0..25 {
        let o = ctl(&["put", &format!("compat/{i:03}"), &format!("value {}", i * 7919 % 10007)]);
        assert!(
            o.status.success(),
            "etcdctl put: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = ctl(&["get", "--prefix", "compat/"]);
    assert!(
        o.status.success(),
        "etcdctl get: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out.push('\n');
    out.push_str(&String::from_utf8_lossy(&o.stdout));
    server.signal("TERM");
    // etcd re-raises SIGTERM after its clean shutdown.
    server.wait_stopped_by(Some(15));
    out
}

// --- One test per program ------------------------------------------------------------------

#[test]
fn redis_server_jemalloc_bgsave_while_writing() {
    compat(
        "redis-server",
        redis,
        Expect::Remote {
            min_footprint: 64 * MIB,
        },
    );
}

/// BGSAVE on agent memory: the forked saver gets copy-on-write clones of the server's segments
/// from the control plane, so the snapshot holds the state at the fork while the server keeps
/// writing; the clones go back when the saver exits.
#[test]
fn redis_server_bgsave_on_agent_memory() {
    require_root();
    let native = redis(&mut Run::new(Mode::Native));
    let mut run = Run::new(Mode::Agent(25));
    let got = redis(&mut run);
    assert_eq!(got, native, "redis-server on agent memory differs from the native run");
    // The saver ends with _exit (no statistics of its own): the snapshot, loaded back with the
    // state as of the fork while the server kept writing, is what shows it had its clones.
    let stats = run.stats();
    check_stats(
        "redis-server on agent memory",
        Expect::Remote {
            min_footprint: 64 * MIB,
        },
        25,
        &stats,
    );
    let agent = run.agent.as_ref().expect("agent memory");
    let deadline = Instant::now() + START_LIMIT;
    while agent.segments() != 0 {
        assert!(
            Instant::now() < deadline,
            "the server's and the saver's memory was never returned"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn tcmalloc_preloaded_c_program() {
    compat(
        "alloc_churn + tcmalloc",
        tcmalloc,
        Expect::Remote {
            min_footprint: 64 * MIB,
        },
    );
}

#[test]
fn mimalloc_preloaded_c_program() {
    compat(
        "alloc_churn + mimalloc",
        mimalloc,
        Expect::Remote {
            min_footprint: 64 * MIB,
        },
    );
}

#[test]
fn python_numpy() {
    compat(
        "python3 + numpy",
        numpy,
        Expect::Remote {
            min_footprint: 128 * MIB,
        },
    );
}

#[test]
fn java_1g_heap() {
    // The heap is what must go remote, not just the JVM's own large mallocs.
    compat(
        "java -Xmx1g",
        jvm,
        Expect::Remote {
            min_footprint: JAVA_HEAP_MIB * MIB * 3 / 4,
        },
    );
}

#[test]
fn nodejs_buffers_and_js_heap() {
    // The ArrayBuffers and at least 100 MiB of the JS heap (about 200 MiB of live objects).
    compat(
        "node",
        node,
        Expect::Remote {
            min_footprint: (NODE_BUFFERS_MIB + 100) * MIB,
        },
    );
}

#[test]
fn sqlite_large_cache() {
    compat(
        "sqlite3",
        sqlite,
        Expect::Remote {
            min_footprint: 96 * MIB,
        },
    );
}

#[test]
fn postgresql_pgbench_clients_and_connections() {
    compat("postgres (pgbench clients)", pgbench, Expect::Works);
}

#[test]
fn postgresql_pgbench_and_large_sorts() {
    compat("postgres", postgres, Expect::Works);
}

#[test]
fn memcached_under_load() {
    compat(
        "memcached",
        memcached,
        Expect::Remote {
            min_footprint: 64 * MIB,
        },
    );
}

#[test]
fn gnu_sort_large_buffer() {
    compat(
        "sort",
        gnu_sort,
        Expect::Remote {
            min_footprint: 48 * MIB,
        },
    );
}

#[test]
fn xz_256mib_dictionary() {
    compat(
        "xz",
        xz,
        Expect::InWindow {
            min_footprint: 256 * MIB,
        },
    );
}

#[test]
fn zstd_ultra_long_window() {
    compat(
        "zstd",
        zstd,
        Expect::InWindow {
            min_footprint: 128 * MIB,
        },
    );
}

#[test]
fn busybox_static_stays_local() {
    compat("busybox", busybox, Expect::Local);
}

#[test]
fn etcd_go_stays_local() {
    compat("etcd", etcd, Expect::Local);
}

// --- The table of docs/compat.md -----------------------------------------------------------

/// Every program of the suite: its name in the table, its workload, and the command that prints
/// its version.
const PROGRAMS: &[(&str, Workload, &[&str])] = &[
    (
        "redis-server (jemalloc), BGSAVE while writing",
        redis,
        &["redis-server", "--version"],
    ),
    (
        "C program, tcmalloc preloaded",
        tcmalloc,
        &["dpkg-query", "-W", "-f=${Version}", "libtcmalloc-minimal4"],
    ),
    (
        "C program, mimalloc preloaded",
        mimalloc,
        &["dpkg-query", "-W", "-f=${Version}", "libmimalloc2.0"],
    ),
    (
        "python3 + NumPy",
        numpy,
        &[
            "python3",
            "-c",
            "import sys, numpy; print(sys.version.split()[0], numpy.__version__)",
        ],
    ),
    ("java -Xmx1g (OpenJDK)", jvm, &["java", "-version"]),
    ("node (ArrayBuffers + JS heap)", node, &["node", "--version"]),
    ("sqlite3, large page cache", sqlite, &["sqlite3", "--version"]),
    (
        "PostgreSQL (pgbench -i, sorts)",
        postgres,
        &["/usr/lib/postgresql/15/bin/postgres", "--version"],
    ),
    (
        "PostgreSQL pgbench (select-only, per-connection, TPC-B-like; 4 clients)",
        pgbench,
        &["/usr/lib/postgresql/15/bin/postgres", "--version"],
    ),
    ("memcached -m 2048", memcached, &["memcached", "-V"]),
    ("GNU sort -S 64M", gnu_sort, &["sort", "--version"]),
    ("xz --lzma2=dict=256MiB", xz, &["xz", "--version"]),
    ("zstd --ultra -22 --long=27", zstd, &["zstd", "--version"]),
    ("busybox (static)", busybox, &["busybox"]),
    ("etcd (Go)", etcd, &["etcd", "--version"]),
];

/// The first line of a version command's output, shortened to the version itself.
fn version_of(cmd: &[&str]) -> String {
    let o = Command::new(cmd[0]).args(&cmd[1..]).output();
    let text = o
        .map(|o| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .unwrap_or_default();
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("?").trim();
    // The version numbers in the banner (`v=7.0.15`, `"17.0.21.1"`, `v1.5.4,`): dotted numbers
    // once a `v`, `v=`, quotes and punctuation are trimmed; the whole line when there is none
    // (dpkg-query prints the package version alone).
    let words: Vec<&str> = line
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| matches!(c, '"' | ',' | '(' | ')'))
                .trim_start_matches("v=")
                .trim_start_matches('v')
        })
        .filter(|w| {
            w.contains('.')
                && w.split('.')
                    .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        })
        .take(2)
        .collect();
    if words.is_empty() {
        line.to_string()
    } else {
        words.join(" ")
    }
}

/// One timed run of a workload; `None` if it failed (the panic message is printed).
fn timed(program: &str, workload: Workload, run: &mut Run) -> Option<(Duration, String)> {
    let start = Instant::now();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| workload(run)));
    let t = start.elapsed();
    match r {
        Ok(out) => Some((t, out)),
        Err(e) => {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            eprintln!("{program} ({}) failed: {msg}", run.mode);
            None
        }
    }
}

/// Waits until no one else uses /dev/zram0 (another benchmark may hold it), then switches
/// swap to zram on for the life of the returned peer.
fn zram_peer() -> rackmem_bench::swap::SwapPeer {
    use rackmem_bench::swap::{SwapBackend, SwapPeer};
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        let busy = swaps.lines().count() > 1
            || std::fs::read_to_string("/sys/block/zram0/initstate").is_ok_and(|s| s.trim() != "0");
        if !busy {
            match SwapPeer::enable(SwapBackend::Zram, 8 << 30) {
                Ok(p) => return p,
                Err(e) => eprintln!("zram: {e}; waiting"),
            }
        } else {
            eprintln!("swap or /dev/zram0 is in use (another benchmark?); waiting for it to be free");
        }
        assert!(Instant::now() < deadline, "/dev/zram0 stayed busy for an hour");
        std::thread::sleep(Duration::from_secs(15));
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

/// Prints the table of docs/compat.md: each program natively (in a cgroup, to measure its peak
/// memory use), under `rackmem run --local 25%`, and under swap to zram in a memory cgroup
/// limited to 25% of that peak. Times are the wall time of the whole workload (its clients and
/// checks included), one run each.
#[test]
#[ignore = "measures (minutes, needs root and /dev/zram0): cargo test --release -p rackmem-cli --test compat -- --ignored compat_table"]
fn compat_table() {
    require_root();
    let only = std::env::var("COMPAT_ONLY").unwrap_or_default();
    let mut rows = Vec::new();
    for &(name, workload, version) in PROGRAMS {
        if !only.is_empty() && !only.split(',').any(|o| name.contains(o)) {
            continue;
        }
        let mut native_run = Run::new(Mode::Cgroup(None));
        let Some((t_native, expected)) = timed(name, workload, &mut native_run) else {
            rows.push(format!(
                "| {name} | {} | native run failed | | | | | |",
                version_of(version)
            ));
            continue;
        };
        let peak = native_run.cgroup.as_ref().expect("cgroup").peak_bytes();
        drop(native_run);

        let mut rm = Run::new(Mode::Rackmem(25));
        let remote = timed(name, workload, &mut rm);
        let stats = rm.stats();
        if std::env::var_os("COMPAT_STATS").is_some() {
            // Every process's statistics, for a breakdown of where the time went.
            for s in &stats {
                eprintln!("stats {name}: {}", s.raw);
            }
        }
        let window = stats.iter().map(ProcStats::footprint_bytes).max().unwrap_or(0);
        let works = match &remote {
            Some((_, out)) if *out == expected => "yes",
            Some(_) => "**no** (results differ)",
            None => "**no** (fails)",
        };

        // The same local memory for both peers. Natively the program's peak (`peak`, all a
        // cgroup charges: private memory, shared buffers, page cache) includes the window pages
        // it touched, `window`, summed over its processes at the run's peak (a forked child's
        // inherited pages once, in the parent, as the cgroup charges them). rackmem keeps a
        // quarter of the window local and the rest remote, so the swap peer's limit is the
        // native peak less three quarters of the window: every page outside the window stays
        // local in both. The window is the least of what a run at 100% local made resident and
        // what the run at 25% committed (a child at 100% faults its inherited pages in again,
        // which natively it shares). At least a quarter of the native peak.
        let run_figure = |stats: &[ProcStats], key: &str, own: fn(&ProcStats) -> u64| {
            stats.iter().map(|s| s.extra(key).max(own(s))).max().unwrap_or(0)
        };
        let committed = run_figure(&stats, "run_peak_footprint_bytes", |s| s.extra("peak_footprint_bytes"));
        let touched = {
            let mut all = Run::new(Mode::Rackmem(100));
            let _ = timed(name, workload, &mut all);
            run_figure(&all.stats(), "run_peak_resident_bytes", |s| s.peak_resident_bytes)
        };
        let touched_window = touched.min(committed).min(peak);
        let limit = peak.saturating_sub(touched_window * 3 / 4).max(peak / 4);
        let zram = {
            let _peer = zram_peer();
            let mut z = Run::new(Mode::Cgroup(Some(limit)));
            let r = timed(name, workload, &mut z).map(|(t, out)| (t, out == expected));
            let kills = z.cgroup.as_ref().map_or(0, Cgroup::oom_kills);
            r.ok_or(kills)
        };
        // `--local 25%` is a quarter of the peak footprint so far, which grows as the program
        // does, where the cgroup's limit is fixed from the start: early phases of a run get less
        // room under rackmem than under the cgroup. The run at a fixed byte budget, the quarter
        // of the window the cgroup's limit leaves room for, is the same memory at every moment.
        if touched_window >= 4 * MIB {
            let bytes = (touched_window / 4).next_multiple_of(MIB);
            let mut fixed = Run::new(Mode::RackmemBytes(bytes));
            let r = timed(name, workload, &mut fixed);
            let z = zram.as_ref().ok().filter(|(_, same)| *same).map(|(t, _)| *t);
            eprintln!(
                "same memory {name}: window {} MiB (committed {} MiB, touched {} MiB); rackmem --local {} MiB: {}; cgroup {} MiB: {}; speed-up over zram: {}",
                touched_window >> 20,
                committed >> 20,
                touched >> 20,
                bytes >> 20,
                r.as_ref().map_or("fails".into(), |(t, out)| format!(
                    "{} s{}",
                    seconds(*t),
                    if *out == expected { "" } else { " (results differ)" }
                )),
                limit >> 20,
                z.map_or("–".into(), seconds),
                match (&r, z) {
                    (Some((t, out)), Some(z)) if *out == expected => format!("{:.2}", z.as_secs_f64() / t.as_secs_f64()),
                    _ => "–".into(),
                }
            );
        }
        let ratio = |t: Duration| format!("{:.2}", t.as_secs_f64() / t_native.as_secs_f64());
        let (rm_time, rm_ratio) = match &remote {
            Some((t, _)) => (seconds(*t), ratio(*t)),
            None => ("–".into(), "–".into()),
        };
        let (z_time, z_ratio, vs_zram) = match (&zram, &remote) {
            (Ok((t, true)), Some((tr, _))) => (
                seconds(*t),
                ratio(*t),
                format!("{:.2}", t.as_secs_f64() / tr.as_secs_f64()),
            ),
            (Ok((t, true)), None) => (seconds(*t), ratio(*t), "–".into()),
            (Ok((_, false)), _) => ("results differ".into(), "–".into(), "–".into()),
            (Err(0), _) => ("fails".into(), "–".into(), "–".into()),
            (Err(k), _) => (format!("OOM-killed ({k})"), "–".into(), "–".into()),
        };
        let row = format!(
            "| {name} | {} | {works} | {} | {} | {} | {rm_time} ({rm_ratio} ×) | {} | {z_time} ({z_ratio} ×) | {vs_zram} |",
            version_of(version),
            if window > 0 { format!("yes, {} MiB", window >> 20) } else { "no (local)".into() },
            peak >> 20,
            seconds(t_native),
            limit >> 20,
        );
        eprintln!("{row}");
        rows.push(row);
    }
    println!(
        "| program | version | works at 25% | memory in the window | native peak (MiB) | native (s) | rackmem 25% (s, × native) | zram limit (MiB) | zram 25% (s, × native) | rackmem speed-up over zram |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
