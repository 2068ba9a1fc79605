//! Shared helpers of the end-to-end tests: build the C test programs in `tests/c/`, run them
//! natively and under `rackmem run`, always with a deadline, and read the statistics the runtime
//! wrote with `--stats-json`.
//!
//! Every child is started in a process group of its own and held by a [`Guard`] that kills the
//! whole group when dropped, so a failing (panicking) test leaves neither `rackmem` nor the
//! program it runs behind. Only a program that leaves the group on purpose (the `daemonize`
//! test program calls `setsid`) escapes that; it stops by itself.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long one program run (native or remote) may take before the test fails.
pub const LIMIT: Duration = Duration::from_secs(120);

pub fn rackmem() -> &'static str {
    test_credentials();
    env!("CARGO_BIN_EXE_rackmem")
}

/// The admin token every control plane these tests start accepts (`--admin-token-file`), and
/// that every `rackmem` they run sends (RACKMEM_TOKEN_FILE, inherited); XDG_STATE_HOME points
/// into a temporary directory so bricks' key files stay out of the home directory.
pub fn admin_token_file() -> &'static Path {
    test_credentials()
}

/// The runtime's variable for the least a percentage budget gives a run (see `test_credentials`).
pub const LOCAL_FLOOR_ENV: &str = rackmem_runtime::config::env::LOCAL_FLOOR;

fn test_credentials() -> &'static Path {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("rackmem-test-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir).expect("creating the tests' state directory");
        let file = dir.join("admin.token");
        let mut b = [0u8; 32];
        let mut f = std::fs::File::open("/dev/urandom").expect("opening /dev/urandom");
        f.read_exact(&mut b).expect("reading /dev/urandom");
        let token = format!("rmk_0_{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>());
        std::fs::write(&file, format!("{token}\n")).expect("writing the tests' admin token");
        // Set before any child process exists; the tests' own threads read no such variable.
        std::env::set_var("RACKMEM_TOKEN_FILE", &file);
        std::env::set_var("XDG_STATE_HOME", dir.join("state"));
        // The tests' programs are small (8 to 64 MiB, to run fast) and test what happens when
        // their pages leave: the floor a percentage gives a run (8 MiB) would keep many of them
        // local. Their runs go without it; the floor's own tests (`run_budget.rs`) and the
        // compat suite's real programs remove this.
        std::env::set_var(LOCAL_FLOOR_ENV, "0");
        file
    })
}

/// Fails the test unless it can run programs on remote memory: that needs root (a userfaultfd
/// that also catches faults taken inside system calls). A test that cannot run fails with what
/// it needs; it never skips and passes.
pub fn require_root() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2));
    assert!(
        euid == Some("0"),
        "this test runs programs on remote memory and needs root (userfaultfd without \
         UFFD_USER_MODE_ONLY); effective uid is {euid:?}. Run ./scripts/test as root."
    );
}

/// A directory for this test binary's compiled programs and statistics files, removed at exit
/// of the process only by the OS temp cleaner: the binaries are useful after a failure.
pub fn build_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("rackmem-tests-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create the test build directory");
        d
    })
}

/// Compiles `tests/c/NAME.c` (once per test binary, whichever test asks first) and returns the
/// executable. A compilation error fails the test with gcc's messages.
pub fn program(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, Result<PathBuf, String>)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, r)) = built.iter().find(|(n, _)| n == name) {
        return r.clone().unwrap_or_else(|e| panic!("{e}"));
    }
    let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/c");
    let src = src_dir.join(format!("{name}.c"));
    let out = build_dir().join(name);
    let r = match Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .output()
    {
        Ok(o) if o.status.success() => Ok(out),
        Ok(o) => Err(format!(
            "gcc {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Err(format!("cannot run gcc for {}: {e}", src.display())),
    };
    built.push((name.to_string(), r.clone()));
    r.unwrap_or_else(|e| panic!("{e}"))
}

/// `tests/c/NAME.c` linked with `-lrackmem` (the librackmem.so next to the `rackmem` binary), to
/// run without `LD_PRELOAD` and without a window: its one-sided calls are the library's, and
/// nothing else of it needs a brick.
pub fn linked_program(name: &str) -> PathBuf {
    let dir = Path::new(rackmem())
        .parent()
        .expect("the rackmem binary's directory")
        .to_path_buf();
    assert!(
        dir.join("librackmem.so").exists(),
        "this test links a program with -lrackmem and needs {}: build it with `cargo build \
         --release --all-features` (./scripts/test does)",
        dir.join("librackmem.so").display()
    );
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/c/{name}.c"));
    let out = build_dir().join(format!("{name}-linked"));
    let o = Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .arg(format!("-L{}", dir.display()))
        .arg("-lrackmem")
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .output()
        .unwrap_or_else(|e| panic!("cannot run gcc for {}: {e}", src.display()));
    assert!(
        o.status.success(),
        "gcc {} -lrackmem failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// A child process (and its process group) that is killed when the guard is dropped.
pub struct Guard {
    child: Option<Child>,
    pgid: u32,
}

impl Guard {
    /// Starts `cmd` as the leader of a new process group.
    pub fn spawn(cmd: &mut Command) -> Guard {
        cmd.process_group(0);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let pgid = child.id();
        Guard {
            child: Some(child),
            pgid,
        }
    }

    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the child is still held")
    }

    pub fn id(&self) -> u32 {
        self.pgid
    }

    /// Sends SIGKILL to every process of the group (the program under `rackmem run` too).
    pub fn kill_group(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.pgid)])
            .stderr(Stdio::null())
            .status();
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
        }
    }

    /// Waits up to `limit` for the direct child to exit; `None` if it is still running.
    pub fn wait_until(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child().try_wait().expect("try_wait") {
                return Some(s);
            }
            if start.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Even after the leader exited, members of its group may remain.
        self.kill_group();
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

/// Reads a pipe to its end on a thread of its own; the bytes arrive on the returned channel.
fn drain<R: Read + Send + 'static>(mut r: R) -> Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    rx
}

/// Sends each line of a pipe on the returned channel as it arrives (closed at end of file).
pub fn lines_of<R: Read + Send + 'static>(r: R) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Collects what a drained pipe produced, waiting until `deadline` at most.
fn collect(rx: &Receiver<Vec<u8>>, deadline: Instant) -> Option<Vec<u8>> {
    rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).ok()
}

/// Runs `cmd` to completion (its exit and the end of its output) within `limit`; otherwise kills
/// its process group and fails the test, showing what it printed.
pub fn run_with_deadline(mut cmd: Command, limit: Duration) -> Output {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let deadline = Instant::now() + limit;
    let mut g = Guard::spawn(&mut cmd);
    let out = drain(g.child().stdout.take().expect("stdout"));
    let err = drain(g.child().stderr.take().expect("stderr"));
    let status = g.wait_until(limit);
    // The pipes close when the last process holding them exits (a daemon may outlive `cmd`).
    let (o, e) = (collect(&out, deadline), collect(&err, deadline));
    match (status, o, e) {
        (Some(status), Some(stdout), Some(stderr)) => Output { status, stdout, stderr },
        (status, o, e) => {
            g.kill_group();
            let grace = Instant::now() + Duration::from_secs(2);
            let o = o.or_else(|| collect(&out, grace)).unwrap_or_default();
            let e = e.or_else(|| collect(&err, grace)).unwrap_or_default();
            panic!(
                "{cmd:?} did not finish within {limit:?} (exit status: {status:?}); killed.\n\
                 stdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&o),
                String::from_utf8_lossy(&e)
            );
        }
    }
}

/// What a process printed, for assertion messages.
pub fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a program without rackmem; it must succeed.
pub fn native(prog: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(prog);
    c.args(args);
    let o = run_with_deadline(c, LIMIT);
    assert!(o.status.success(), "native {prog:?} {args:?} failed: {}", show(&o));
    o
}

/// The statistics of one process that used the window, as `rackmem run --stats-json` writes
/// them (one JSON object per line). The keys named here are the CLI's contract: a missing one
/// fails the test.
#[derive(Debug, Clone)]
pub struct ProcStats {
    pub pid: u64,
    pub faults: u64,
    pub bytes_fetched: u64,
    pub bytes_written_back: u64,
    pub bytes_prefetched: u64,
    pub evictions: u64,
    pub peak_resident_bytes: u64,
    pub budget_bytes: u64,
    pub window_bytes_allocated: u64,
    /// Everything the runtime wrote, for keys beyond the contract.
    pub raw: serde_json::Value,
}

impl ProcStats {
    fn parse(line: &str) -> ProcStats {
        let raw: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("statistics line is not JSON ({e}): {line}"));
        let n = |k: &str| {
            raw.get(k)
                .and_then(serde_json::Value::as_u64)
                .unwrap_or_else(|| panic!("statistics lack the number {k:?}: {line}"))
        };
        ProcStats {
            pid: n("pid"),
            faults: n("faults"),
            bytes_fetched: n("bytes_fetched"),
            bytes_written_back: n("bytes_written_back"),
            bytes_prefetched: n("bytes_prefetched"),
            evictions: n("evictions"),
            peak_resident_bytes: n("peak_resident_bytes"),
            budget_bytes: n("budget_bytes"),
            window_bytes_allocated: n("window_bytes_allocated"),
            raw,
        }
    }

    /// A key beyond the contract (0 when absent).
    pub fn extra(&self, key: &str) -> u64 {
        self.raw.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0)
    }

    /// The largest window footprint the process had (inherited across fork included).
    pub fn footprint_bytes(&self) -> u64 {
        self.window_bytes_allocated.max(self.extra("peak_window_bytes"))
    }
}

/// Reads a `--stats-json` file.
pub fn read_stats(path: &Path) -> Vec<ProcStats> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(ProcStats::parse)
        .collect()
}

/// Runs under `rackmem run --local LOCAL --stats-json F EXTRA... -- PROG ARGS...`; returns the
/// output and the statistics of every process that used the window.
pub fn remote(prog: &Path, args: &[&str], local: &str, extra: &[&str]) -> (Output, Vec<ProcStats>) {
    let name = prog.file_name().and_then(|n| n.to_str()).unwrap_or("p");
    let stats = build_dir().join(format!("stats-{name}-{}.jsonl", unique()));
    let mut c = Command::new(rackmem());
    c.arg("run")
        .arg("--local")
        .arg(local)
        .arg("--stats-json")
        .arg(&stats)
        .args(extra)
        .arg("--")
        .arg(prog)
        .args(args);
    let o = run_with_deadline(c, LIMIT);
    (o, read_stats(&stats))
}

pub fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The `checksum=` lines of a program's output, sorted (a parent and its child print in either
/// order).
pub fn checksums(o: &Output) -> Vec<String> {
    let mut v: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("checksum="))
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

/// Resident pages may pass the budget by at most this much (one batch of a fault in flight).
pub const RESIDENT_SLACK_BYTES: u64 = 64 << 10;

/// Asserts that a process really ran on remote memory within its local buffer: it faulted,
/// evicted and wrote back (the footprint exceeded the buffer), fetched pages back, never held
/// more than the buffer resident, and the buffer was at most ~10% of its footprint.
pub fn assert_used_remote_memory(s: &ProcStats) {
    assert_used_remote_memory_at(s, 10);
}

/// [`assert_used_remote_memory`] for a local buffer of about `percent`% of the footprint.
pub fn assert_used_remote_memory_at(s: &ProcStats, percent: u64) {
    assert!(s.faults > 0, "no faults: the program did not use remote memory: {s:?}");
    assert!(
        s.evictions > 0 && s.bytes_written_back > 0,
        "nothing was evicted and written back: the local buffer was never exceeded: {s:?}"
    );
    assert!(s.bytes_fetched > 0, "nothing was fetched back from the brick: {s:?}");
    assert!(s.budget_bytes > 0, "no local buffer reported: {s:?}");
    assert!(
        s.peak_resident_bytes <= s.budget_bytes + RESIDENT_SLACK_BYTES,
        "peak resident {} exceeds the local buffer {} (+{} slack): {s:?}",
        s.peak_resident_bytes,
        s.budget_bytes,
        RESIDENT_SLACK_BYTES
    );
    // With the run's shared budget (every process of one `rackmem run`), the percentage is of
    // the run's footprint, and one process may use all of it while the others hold nothing.
    let (budget, footprint) = match s.extra("run_budget_bytes") {
        0 => (s.budget_bytes, s.footprint_bytes()),
        run => {
            assert!(
                s.budget_bytes <= run.max(MIN_BUDGET_BYTES),
                "a process's local buffer {} exceeds the run's {run}: {s:?}",
                s.budget_bytes
            );
            (run, s.extra("run_peak_footprint_bytes"))
        }
    };
    assert!(
        budget * 90 <= footprint * percent,
        "local buffer {budget} is more than ~{percent}% of the footprint {footprint}: {s:?}"
    );
}

/// [`assert_used_remote_memory`] for the processes of a program that forks: a lazily forked
/// child starts with its parent's resident pages (copy-on-write), which may be more than its
/// own share of the run's budget until it gives the excess back (its watchdog rings within a
/// quarter second), so its peak is bounded by the run's budget, which bounded its parent's.
pub fn assert_used_remote_memory_forked(s: &ProcStats) {
    let run = s.extra("run_budget_bytes");
    if run == 0 || s.peak_resident_bytes <= s.budget_bytes + RESIDENT_SLACK_BYTES {
        return assert_used_remote_memory(s);
    }
    assert!(
        s.peak_resident_bytes <= run + RESIDENT_SLACK_BYTES,
        "peak resident {} exceeds the run's budget {run} (+{RESIDENT_SLACK_BYTES} slack): {s:?}",
        s.peak_resident_bytes
    );
    let mut within = s.clone();
    within.peak_resident_bytes = within.budget_bytes;
    assert_used_remote_memory(&within);
}

/// The least local buffer a process keeps whatever its share (the runtime's 32 pages).
const MIN_BUDGET_BYTES: u64 = 32 * 4096;

/// The process that did the most remote work (the main program, not a short-lived helper).
pub fn busiest(stats: &[ProcStats]) -> &ProcStats {
    stats
        .iter()
        .max_by_key(|s| s.faults)
        .expect("rackmem run --stats-json wrote no statistics")
}

/// Runs NAME natively and under `rackmem run --local 10%`; both must succeed and print the same
/// checksums. Returns the statistics of the remote run.
pub fn same_as_native(name: &str, args: &[&str]) -> Vec<ProcStats> {
    same_as_native_with(name, args, &[])
}

/// [`same_as_native`] with more `rackmem run` options.
pub fn same_as_native_with(name: &str, args: &[&str], extra: &[&str]) -> Vec<ProcStats> {
    let prog = program(name);
    let n = native(&prog, args);
    let (r, stats) = remote(&prog, args, "10%", extra);
    assert!(r.status.success(), "{name} under rackmem failed: {}", show(&r));
    let (cn, cr) = (checksums(&n), checksums(&r));
    assert!(!cn.is_empty(), "{name} printed no checksum: {}", show(&n));
    assert_eq!(cn, cr, "{name}: results under rackmem differ from the native run");
    stats
}

/// Runs `reread` (fill, read-only passes, words changed and restored, half rewritten) with
/// `extra` options and checks that only pages whose contents changed went back to the brick:
/// the fill's pages once and the rewritten half once, not the pages of every read-only pass.
pub fn only_changed_pages_are_written_back(extra: &[&str]) {
    const MIB: u64 = 32;
    let s = same_as_native_with("reread", &[&MIB.to_string(), "4"], extra);
    let p = busiest(&s);
    assert_used_remote_memory(p);
    let footprint = MIB << 20;
    assert!(
        p.bytes_written_back <= footprint * 8 / 5,
        "read-only passes wrote pages back ({} MiB written back for a {MIB} MiB buffer): {p:?}",
        p.bytes_written_back >> 20
    );
    assert!(
        p.extra("evictions_clean") * 4096 >= 3 * footprint,
        "the pages of the read-only passes must be evicted as clean: {p:?}"
    );
}

/// Starts `rackmem brick --listen ADDR --size SIZE --secret SECRET` and waits until it serves
/// (a Unix socket appears, or a TCP address is announced on stderr). Returns the guard and the
/// address to give `--brick`.
pub fn start_brick(listen: &str, size: &str, secret: &str) -> (Guard, String) {
    start_brick_with(listen, size, secret, &[])
}

/// [`start_brick`] with more `rackmem brick` options.
pub fn start_brick_with(listen: &str, size: &str, secret: &str, extra: &[&str]) -> (Guard, String) {
    let mut cmd = Command::new(rackmem());
    cmd.args(["brick", "--listen", listen, "--size", size, "--secret", secret])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut g = Guard::spawn(&mut cmd);
    let lines = lines_of(g.child().stderr.take().expect("stderr"));
    let deadline = Instant::now() + Duration::from_secs(15);
    if let Some(path) = listen.strip_prefix("unix:") {
        // Keep reading stderr in the background so the brick never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        while !Path::new(path).exists() {
            if let Some(s) = g.child().try_wait().expect("try_wait") {
                panic!("brick on {listen} exited before serving: {s:?}");
            }
            assert!(Instant::now() < deadline, "brick did not create {path} within 15 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        return (g, listen.to_string());
    }
    // TCP and TLS: the brick announces the address it bound ("... tcp://127.0.0.1:PORT").
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => {
                if let Some(a) = l
                    .split_whitespace()
                    .find(|w| w.starts_with("tcp://") || w.starts_with("tls://"))
                {
                    let a = a.trim_end_matches([',', '.', ')']).to_string();
                    std::thread::spawn(move || for _ in lines {});
                    return (g, a);
                }
                seen.push(l);
            }
            Err(RecvTimeoutError::Timeout) => panic!("brick on {listen} announced no address: {seen:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("brick on {listen} exited: {seen:?}"),
        }
    }
}

// --- Control plane processes -------------------------------------------------------------

pub const START_LIMIT: Duration = Duration::from_secs(30);

/// Waits until `ok` holds, checking every 50 ms, and fails the test after [`START_LIMIT`].
pub fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + START_LIMIT;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `rackmem agent` for node `name` of the control plane at `url`, on `socket`, with
/// `extra` options, and waits until its socket takes connections.
pub fn spawn_agent(url: &str, name: &str, socket: &Path, extra: &[&str]) -> Guard {
    let mut cmd = Command::new(rackmem());
    cmd.args(["agent", "--control", url, "--name", name, "--socket"])
        .arg(socket)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let g = Guard::spawn(&mut cmd);
    wait_for("the agent's socket", || {
        std::os::unix::net::UnixStream::connect(socket).is_ok()
    });
    g
}

/// Starts `rackmem control` on an ephemeral port; returns the guard and its URL.
pub fn start_control(db: &std::path::Path) -> (Guard, String) {
    start_control_on(db, "127.0.0.1:0")
}

/// Starts `rackmem control` listening on `listen` (a fixed port survives a restart).
pub fn start_control_on(db: &std::path::Path, listen: &str) -> (Guard, String) {
    let store = format!("sqlite:{}", db.display());
    start_control_with(&["--listen", listen, "--brick-timeout", "5s", "--store", &store])
}

/// Starts `rackmem control ARGS...`; returns the guard and the URL it announces.
pub fn start_control_with(args: &[&str]) -> (Guard, String) {
    let mut cmd = Command::new(rackmem());
    cmd.arg("control").args(args);
    if !args.contains(&"--admin-token-file") {
        cmd.arg("--admin-token-file").arg(admin_token_file());
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut g = Guard::spawn(&mut cmd);
    let lines = lines_of(g.child().stderr.take().expect("stderr"));
    let deadline = Instant::now() + START_LIMIT;
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => {
                if let Some(url) = l.split_whitespace().find(|w| w.starts_with("http://")) {
                    let url = url.to_string();
                    std::thread::spawn(move || for _ in lines {});
                    return (g, url);
                }
                seen.push(l);
            }
            Err(RecvTimeoutError::Timeout) => panic!("rackmem control announced no URL: {seen:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("rackmem control exited: {seen:?}"),
        }
    }
}

pub fn ctl(url: &str, args: &[&str]) -> std::process::Output {
    let mut c = Command::new(rackmem());
    c.args(["ctl", "--control", url]).args(args);
    run_with_deadline(c, Duration::from_secs(60))
}

pub fn ctl_json(url: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let o = ctl(url, &all);
    assert!(o.status.success(), "ctl {args:?}: {}", show(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("ctl {args:?} printed no JSON ({e}): {}", show(&o)))
}

/// Runs `same_filled` (pages of one repeated word beside pages that nearly are, changing kind
/// while remote, then a fork) with `extra` options: the results must match the native run's,
/// and the one-word pages must have been kept as their word at eviction.
pub fn same_filled_pages_round_trip(extra: &[&str]) {
    let s = same_as_native_with("same_filled", &["32", "4"], extra);
    assert!(s.len() >= 2, "expected the parent's and the child's statistics: {s:?}");
    let parent = busiest(&s);
    assert_used_remote_memory(parent);
    for p in &s {
        assert!(
            p.extra("evictions_same_filled") > 0,
            "no page was evicted as same-filled, though most pages are one word: {p:?}"
        );
    }
}

/// The tests' admin token (see [`admin_token_file`]).
pub fn admin_token() -> String {
    std::fs::read_to_string(admin_token_file())
        .expect("reading the tests' admin token")
        .trim()
        .to_string()
}

// --- TLS ----------------------------------------------------------------------------------

/// A private CA (PEM) and a brick certificate it signs for 127.0.0.1, with its key (PEM).
pub fn test_ca_and_brick_certificate() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params.distinguished_name.push(DnType::CommonName, "rackmem test CA");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().expect("brick key");
    let mut p = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
    p.distinguished_name.push(DnType::CommonName, "brick");
    let cert = p.signed_by(&key, &issuer).expect("brick certificate");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// [`test_ca_and_brick_certificate`] written into `dir`: paths of the CA, the brick's
/// certificate and its key.
pub fn tls_files(dir: &Path) -> (String, String, String) {
    let (ca, cert, key) = test_ca_and_brick_certificate();
    let file = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write PEM");
        p.display().to_string()
    };
    (file("ca.pem", &ca), file("brick.pem", &cert), file("brick.key", &key))
}

/// Starts `rackmem brick --listen LISTEN --size SIZE --control URL --name NAME` (heartbeats every
/// 100 ms), after `configure` adds to the command, and waits until the control plane lists it.
pub fn start_managed_brick(
    url: &str,
    listen: &str,
    size: &str,
    name: &str,
    configure: impl FnOnce(&mut Command),
) -> Guard {
    let mut cmd = Command::new(rackmem());
    cmd.args([
        "brick",
        "--listen",
        listen,
        "--size",
        size,
        "--control",
        url,
        "--name",
        name,
    ])
    .args(["--heartbeat-ms", "100"])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    configure(&mut cmd);
    let g = Guard::spawn(&mut cmd);
    let deadline = Instant::now() + START_LIMIT;
    loop {
        let bricks = ctl_json(url, &["bricks"]);
        if bricks.as_array().is_some_and(|b| b.iter().any(|b| b["name"] == name)) {
            return g;
        }
        assert!(Instant::now() < deadline, "brick {name} never registered: {bricks}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `rackmem bench ARGS --json DIR/bench.json --svg DIR/bench.svg` within 300 s and fails,
/// showing what it printed, unless it succeeds; returns its output, its JSON and its chart.
pub fn bench_part(dir: &Path, args: &[&str]) -> (Output, serde_json::Value, String) {
    let (json, svg) = (dir.join("bench.json"), dir.join("bench.svg"));
    let mut c = Command::new(rackmem());
    c.arg("bench")
        .args(args)
        .arg("--json")
        .arg(&json)
        .arg("--svg")
        .arg(&svg);
    let o = run_with_deadline(c, Duration::from_secs(300));
    assert!(o.status.success(), "{}", show(&o));
    let v = serde_json::from_str(&std::fs::read_to_string(&json).expect("json written")).expect("well-formed JSON");
    let chart = std::fs::read_to_string(&svg).expect("chart written");
    (o, v, chart)
}

/// The descendants of `pid` (itself included).
pub fn tree_of(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after its closing paren.
        if let Some(pp) = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
        {
            parents.push((p, pp));
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let cur = out[i];
        out.extend(parents.iter().filter(|(_, pp)| *pp == cur).map(|(p, _)| *p));
        i += 1;
    }
    out
}

/// `RssAnon` of `pid` in bytes (0 if it is gone), unless it is `rackmem` itself.
pub fn rss_anon(pid: u32) -> u64 {
    if std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "rackmem") {
        return 0;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// What [`run_sampled_tree`] saw of the processes' anonymous memory.
#[derive(Debug, Clone, Copy)]
pub struct RssSample {
    /// The largest `RssAnon` of any one process.
    pub largest_process: u64,
    /// The largest sum of `RssAnon` over the processes alive at once.
    pub largest_sum: u64,
}

/// Runs `cmd` to completion (within [`LIMIT`]), sampling the `RssAnon` of every process it
/// starts (not `rackmem run` itself) every 10 ms.
pub fn run_sampled_tree(mut cmd: Command) -> (Output, RssSample) {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("create stdout file"))
        .stderr(std::fs::File::create(&err).expect("create stderr file"));
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let deadline = Instant::now() + LIMIT;
    let mut peak = RssSample {
        largest_process: 0,
        largest_sum: 0,
    };
    let status = loop {
        let mut sum = 0;
        for q in tree_of(child.id()) {
            let r = rss_anon(q);
            peak.largest_process = peak.largest_process.max(r);
            sum += r;
        }
        peak.largest_sum = peak.largest_sum.max(sum);
        if let Some(st) = child.try_wait().expect("wait for the program") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} did not finish within {LIMIT:?}; killed. stderr:\n{}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let read = |p: &Path| std::fs::read(p).unwrap_or_default();
    (
        Output {
            status,
            stdout: read(&out),
            stderr: read(&err),
        },
        peak,
    )
}
