//! Shared helpers of the end-to-end tests: build the C test programs, run them natively and
//! under `rackmem run`, with deadlines, and read the statistics the runtime wrote.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use rackmem_runtime::stats::StatsSnapshot;

pub fn rackmem() -> &'static str {
    env!("CARGO_BIN_EXE_rackmem")
}

/// The tests need userfaultfd without UFFD_USER_MODE_ONLY: say so plainly instead of skipping.
pub fn require_root() {
    // SAFETY-free check: read the effective uid from /proc.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap_or("0");
    assert_eq!(
        euid, "0",
        "these tests run programs on remote memory and need root (userfaultfd); run ./scripts/test as root"
    );
}

fn build_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("rackmem-tests-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    })
}

/// Compiles `tests/c/NAME.c` (once per test binary) and returns the executable.
pub fn program(name: &str) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let out = build_dir().join(name);
    if out.exists() {
        return out;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/c")
        .join(format!("{name}.c"));
    let o = Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
        .expect("gcc runs");
    assert!(
        o.status.success(),
        "gcc {}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Kills the child when dropped (a failing test leaves nothing running).
pub struct Guard(pub Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `cmd` to completion, killing it after `limit`.
pub fn run_with_deadline(mut cmd: Command, limit: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn");
    let mut guard = Guard(Some(child));
    let start = Instant::now();
    loop {
        let c = guard.0.as_mut().expect("child");
        if c.try_wait().expect("try_wait").is_some() {
            let c = guard.0.take().expect("child");
            return c.wait_with_output().expect("output");
        }
        assert!(start.elapsed() < limit, "{cmd:?} did not finish within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub const LIMIT: Duration = Duration::from_secs(120);

pub fn native(prog: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(prog);
    c.args(args);
    let o = run_with_deadline(c, LIMIT);
    assert!(
        o.status.success(),
        "native {prog:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Runs under `rackmem run --local LOCAL --stats-json`, returns the output and the statistics.
pub fn remote(prog: &Path, args: &[&str], local: &str, extra: &[&str]) -> (Output, Vec<StatsSnapshot>) {
    let stats = build_dir().join(format!(
        "stats-{}-{}.jsonl",
        prog.file_name().and_then(|n| n.to_str()).unwrap_or("p"),
        unique()
    ));
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
    let text = std::fs::read_to_string(&stats).unwrap_or_default();
    let snaps = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    (o, snaps)
}

fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The `checksum=` lines of a program's output, sorted (fork order may vary).
pub fn checksums(o: &Output) -> Vec<String> {
    let mut v: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("checksum="))
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

/// Asserts the run really used remote memory within its local buffer.
pub fn assert_used_remote_memory(s: &StatsSnapshot) {
    assert!(s.faults > 0, "no faults: the program did not use remote memory: {s:?}");
    assert!(
        s.evictions > 0 && s.bytes_written_back > 0,
        "nothing was evicted: the local buffer was never exceeded: {s:?}"
    );
    assert!(s.bytes_fetched > 0, "nothing was fetched back from the brick: {s:?}");
    assert!(
        s.peak_resident_bytes <= s.budget_bytes,
        "peak resident {} exceeds the local buffer {}",
        s.peak_resident_bytes,
        s.budget_bytes
    );
    assert!(
        s.budget_bytes * 9 <= s.peak_window_bytes,
        "budget {} is more than ~10% of the footprint {}",
        s.budget_bytes,
        s.peak_window_bytes
    );
}

/// Runs natively and remotely, compares checksums, returns the remote statistics.
pub fn same_as_native(name: &str, args: &[&str]) -> Vec<StatsSnapshot> {
    require_root();
    let prog = program(name);
    let n = native(&prog, args);
    let (r, stats) = remote(&prog, args, "10%", &[]);
    assert!(
        r.status.success(),
        "{name} under rackmem failed ({:?}): {}",
        r.status,
        String::from_utf8_lossy(&r.stderr)
    );
    let (cn, cr) = (checksums(&n), checksums(&r));
    assert!(!cn.is_empty(), "{name} printed no checksum");
    assert_eq!(cn, cr, "{name}: results under rackmem differ from the native run");
    stats
}
