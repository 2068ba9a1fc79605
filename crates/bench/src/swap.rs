//! The peers a user would pick instead of rackmem: Linux swap to zram and to a swap file, with
//! a memory cgroup limiting the program to the same local budget.
//!
//! [`SwapPeer::enable`] turns one swap backend on; [`SwapPeer::run_limited`] runs a command in a
//! fresh memory cgroup (v1 `memory.limit_in_bytes`, or v2 `memory.max`, whichever the machine
//! has). Everything is undone on drop, also after an error; a benchmark interrupted by Ctrl-C
//! stops its child and drops its peer. The machine is left as it was found: the swap device is
//! switched off and reset, the swap file deleted, the cgroup removed.

use crate::BenchError;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Which swap device backs the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwapBackend {
    /// `/dev/zram0`, compressed RAM (the kernel's own in-memory swap).
    Zram,
    /// A swap file on disk at this path.
    File(PathBuf),
}

impl SwapBackend {
    /// Short name for tables.
    pub fn name(&self) -> &'static str {
        match self {
            SwapBackend::Zram => "zram",
            SwapBackend::File(_) => "swap file",
        }
    }

    /// The backends `names` asks for (`zram`, `file`; empty names skipped), a swap file going
    /// into `swap_dir` under a name of this process.
    pub fn parse_list(names: &[String], swap_dir: &Path) -> Result<Vec<SwapBackend>, BenchError> {
        names
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| match p.as_str() {
                "zram" => Ok(SwapBackend::Zram),
                "file" => Ok(SwapBackend::File(
                    swap_dir.join(format!("rackmem-bench-{}.swap", std::process::id())),
                )),
                other => Err(BenchError::Config(format!("unknown peer {other}: use zram or file"))),
            })
            .collect()
    }
}

/// Which memory cgroup interface the machine offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroups {
    /// cgroup v1 memory controller mounted here.
    V1(PathBuf),
    /// cgroup v2 unified hierarchy with the memory controller, here.
    V2(PathBuf),
}

/// Finds the memory cgroup interface, or says why there is none.
pub fn detect_cgroups() -> Result<Cgroups, BenchError> {
    let v1 = Path::new("/sys/fs/cgroup/memory");
    if v1.join("memory.limit_in_bytes").exists() {
        return Ok(Cgroups::V1(v1.to_path_buf()));
    }
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let r = Path::new(root);
        if std::fs::read_to_string(r.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
        {
            return Ok(Cgroups::V2(r.to_path_buf()));
        }
    }
    Err(BenchError::Workload(
        "no memory cgroup controller (neither cgroup v1 /sys/fs/cgroup/memory nor a cgroup v2 hierarchy with \
         the memory controller): the swap peers cannot be limited to the local budget"
            .into(),
    ))
}

fn sh(cmd: &str, args: &[&str]) -> Result<(), BenchError> {
    let o = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| BenchError::Workload(format!("cannot run {cmd}: {e} (is util-linux installed?)")))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(BenchError::Workload(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        )))
    }
}

fn write(path: &Path, value: &str) -> Result<(), BenchError> {
    std::fs::write(path, value).map_err(|e| BenchError::Workload(format!("writing {value} to {}: {e}", path.display())))
}

/// One swap backend, switched on for the life of this value.
#[derive(Debug)]
pub struct SwapPeer {
    backend: SwapBackend,
    device: PathBuf,
    cgroups: Cgroups,
    active: bool,
}

/// Refuses clearly without root.
pub fn require_root(what: &str) -> Result<(), BenchError> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap_or("");
    if euid == "0" {
        Ok(())
    } else {
        Err(BenchError::Workload(format!(
            "{what} needs root (it switches swap on and off and creates memory cgroups)"
        )))
    }
}

/// Makes `/dev/zram0` when it is missing: the module may not be loaded, or loaded with its
/// device removed (`zramctl --reset` on a recent util-linux removes the device it resets).
fn add_zram0() -> Result<(), BenchError> {
    let control = Path::new("/sys/class/zram-control/hot_add");
    if !control.exists() {
        // Not loaded: loading it makes zram0. Failure is reported below, as no device.
        let _ = sh("modprobe", &["zram"]);
    }
    if !Path::new("/sys/block/zram0").exists() && control.exists() {
        // Reading hot_add adds the lowest free device and says its number.
        let added = std::fs::read_to_string(control).unwrap_or_default();
        if added.trim() != "0" {
            // Not the device the peer uses: take it back.
            let _ = std::fs::write("/sys/class/zram-control/hot_remove", added.trim());
            return Err(BenchError::Workload(format!(
                "no /dev/zram0, and adding a zram device made zram{} instead; remove the other zram \
                 devices or add zram0 by hand",
                added.trim()
            )));
        }
    }
    if Path::new("/sys/block/zram0").exists() {
        Ok(())
    } else {
        Err(BenchError::Workload(
            "no /dev/zram0, and none could be added: this kernel has no zram (modprobe zram failed)".into(),
        ))
    }
}

impl SwapPeer {
    /// Switches the backend on with room for `size_bytes` of swapped pages.
    pub fn enable(backend: SwapBackend, size_bytes: u64) -> Result<SwapPeer, BenchError> {
        require_root("the swap peer")?;
        let cgroups = detect_cgroups()?;
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        if swaps.lines().count() > 1 {
            return Err(BenchError::Workload(format!(
                "swap is already on ({}); switch it off first so that the peers measure only their own device",
                swaps
                    .lines()
                    .skip(1)
                    .map(|l| l.split_whitespace().next().unwrap_or(""))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let device = match &backend {
            SwapBackend::Zram => {
                let z = Path::new("/sys/block/zram0");
                if !z.exists() {
                    add_zram0()?;
                }
                if std::fs::read_to_string(z.join("initstate"))
                    .map(|s| s.trim() != "0")
                    .unwrap_or(true)
                {
                    return Err(BenchError::Workload(
                        "/dev/zram0 is already in use; reset it or free it first".into(),
                    ));
                }
                PathBuf::from("/dev/zram0")
            }
            SwapBackend::File(p) => p.clone(),
        };
        let mut peer = SwapPeer {
            backend,
            device,
            cgroups,
            active: true,
        };
        match &peer.backend {
            SwapBackend::Zram => {
                write(Path::new("/sys/block/zram0/disksize"), &size_bytes.to_string())?;
                sh("mkswap", &[peer.dev()])?;
                sh("swapon", &["-p", "100", peer.dev()])?;
            }
            SwapBackend::File(p) => {
                let f = std::fs::File::create(p)
                    .map_err(|e| BenchError::Workload(format!("creating {}: {e}", p.display())))?;
                // A swap file must have its blocks allocated: write it rather than truncate.
                use std::io::Write;
                let mut w = std::io::BufWriter::new(f);
                let zeros = vec![0u8; 1 << 20];
                for _ in 0..size_bytes.div_ceil(1 << 20) {
                    w.write_all(&zeros)
                        .map_err(|e| BenchError::Workload(format!("writing {}: {e}", p.display())))?;
                }
                w.flush()
                    .map_err(|e| BenchError::Workload(format!("writing {}: {e}", p.display())))?;
                drop(w);
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600));
                sh("mkswap", &[peer.dev()])?;
                sh("swapon", &[peer.dev()])?;
            }
        }
        peer.active = true;
        Ok(peer)
    }

    fn dev(&self) -> &str {
        self.device.to_str().unwrap_or("")
    }

    /// The backend.
    pub fn backend(&self) -> &SwapBackend {
        &self.backend
    }

    /// The memory cgroup interface the peer limits its programs with.
    pub fn cgroups(&self) -> &Cgroups {
        &self.cgroups
    }

    /// Runs `cmd` in a new memory cgroup limited to `limit_bytes`; the cgroup is removed after.
    pub fn run_limited(&self, limit_bytes: u64, program: &Path, args: &[String]) -> Result<Output, BenchError> {
        run_in_memory_cgroup(&self.cgroups, limit_bytes, program, args)
    }
}

/// Runs `program` with `args` in a new memory cgroup limited to `limit_bytes` (swap as the
/// machine has it), waits for it, and removes the cgroup.
pub fn run_in_memory_cgroup(
    cgroups: &Cgroups,
    limit_bytes: u64,
    program: &Path,
    args: &[String],
) -> Result<Output, BenchError> {
    let cg = MemoryCgroup::create(cgroups, limit_bytes)?;
    let out = cg
        .command(program, args)
        .output()
        .map_err(|e| BenchError::Workload(format!("running {}: {e}", program.display())))?;
    drop(cg);
    Ok(out)
}

/// `s` quoted for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A memory cgroup of its own for one program (a batch program or a server), kept until
/// dropped, so that its counters can be read after the program died: [`MemoryCgroup::report`]
/// says why (see [`crate::oom`]).
pub struct MemoryCgroup {
    cgroups: Cgroups,
    dir: PathBuf,
    name: String,
    limit_bytes: u64,
    sampler: Option<Sampler>,
}

/// The thread sampling `memory.stat`: its stop flag, and the last sample it returns.
type Sampler = (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<std::collections::BTreeMap<String, u64>>,
);

impl MemoryCgroup {
    /// Creates the cgroup, limited to `limit_bytes` of memory (swap as the machine has it).
    pub fn create(cgroups: &Cgroups, limit_bytes: u64) -> Result<MemoryCgroup, BenchError> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("rackmem-bench-app-{}-{n}", std::process::id());
        let (dir, limit_file) = match cgroups {
            Cgroups::V1(root) => (root.join(&name), "memory.limit_in_bytes"),
            Cgroups::V2(root) => {
                let _ = write(&root.join("cgroup.subtree_control"), "+memory");
                (root.join(&name), "memory.max")
            }
        };
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir)
            .map_err(|e| BenchError::Workload(format!("creating cgroup {}: {e}", dir.display())))?;
        let cg = MemoryCgroup {
            cgroups: cgroups.clone(),
            dir,
            name,
            limit_bytes,
            sampler: None,
        };
        write(&cg.dir.join(limit_file), &limit_bytes.to_string())?;
        if let Cgroups::V1(_) = cgroups {
            // The kernel's defaults otherwise: swappiness 60, no memory+swap limit (swap is
            // unbounded, so only RAM is limited), no page-cache limit (v1 has none apart from
            // the one limit, which counts cache too; the zstd input sits on tmpfs, charged to
            // the bench). When the peer is OOM-killed anyway, its report shows why: at tight
            // limits every charged page was on the active list and was being refaulted as soon
            // as it was swapped (a working set larger than the limit), so reclaim made no
            // progress. Swappiness does not change that (it weighs anonymous pages against a
            // page cache there is none of), and oom_kill_disable would hang the program instead;
            // the peers measure what a program in a container of that size would get.
            let _ = write(&cg.dir.join("memory.swappiness"), "60");
        }
        Ok(cg)
    }

    /// The limit, bytes.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// A command that runs `program args` inside the cgroup (a shell joins it, then execs the
    /// program, so the program's pid is the child's).
    pub fn command(&self, program: &Path, args: &[String]) -> Command {
        let mut script = format!(
            "echo $$ > {} && exec {}",
            quote(&self.dir.join("cgroup.procs").to_string_lossy()),
            quote(&program.to_string_lossy())
        );
        for a in args {
            script.push(' ');
            script.push_str(&quote(a));
        }
        let mut c = Command::new("sh");
        c.args(["-c", &script]);
        c
    }

    /// Starts sampling `memory.stat` (every 50 ms) while the program runs: the cgroup's figures
    /// are gone once it exits, and an OOM report wants the last ones before the kill.
    pub fn start_sampling(&mut self) {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let path = self.dir.join("memory.stat");
        let s = stop.clone();
        let h = std::thread::spawn(move || {
            let mut last = std::collections::BTreeMap::new();
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(t) = std::fs::read_to_string(&path) {
                    let m = crate::oom::parse_key_values(&t);
                    let used = ["rss", "anon", "swap"]
                        .iter()
                        .any(|k| m.get(*k).is_some_and(|v| *v > 0));
                    if used {
                        last = m;
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            last
        });
        self.sampler = Some((stop, h));
    }

    fn read_u64(&self, file: &str) -> Option<u64> {
        std::fs::read_to_string(self.dir.join(file)).ok()?.trim().parse().ok()
    }

    /// Why the program in this cgroup died (`exit` says how): the cgroup's counters, the last
    /// `memory.stat` sampled, and the kernel's OOM report from `dmesg` if it has one.
    pub fn report(&mut self, exit: String) -> crate::oom::OomReport {
        let last_stat = match self.sampler.take() {
            Some((stop, h)) => {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                h.join().unwrap_or_default()
            }
            None => Default::default(),
        };
        let (failcnt, max_usage, oom_kills) = match &self.cgroups {
            Cgroups::V1(_) => (
                self.read_u64("memory.failcnt"),
                self.read_u64("memory.max_usage_in_bytes"),
                std::fs::read_to_string(self.dir.join("memory.oom_control"))
                    .ok()
                    .and_then(|t| crate::oom::parse_key_values(&t).get("oom_kill").copied()),
            ),
            Cgroups::V2(_) => {
                let ev = std::fs::read_to_string(self.dir.join("memory.events"))
                    .map(|t| crate::oom::parse_key_values(&t))
                    .unwrap_or_default();
                (
                    ev.get("max").copied(),
                    self.read_u64("memory.peak"),
                    ev.get("oom_kill").copied(),
                )
            }
        };
        // The kernel logs the report asynchronously to our reading of the exit; it is written
        // before the victim is reaped, so one read suffices.
        let kernel = Command::new("dmesg").output().ok().and_then(|o| {
            crate::oom::parse_kernel_log(&String::from_utf8_lossy(&o.stdout), &format!("/{}", self.name))
        });
        crate::oom::OomReport {
            limit_bytes: self.limit_bytes,
            failcnt,
            max_usage_bytes: max_usage,
            oom_kills,
            last_stat,
            kernel,
            exit,
        }
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        if let Some((stop, h)) = self.sampler.take() {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = h.join();
        }
        drop(CgroupDir(self.dir.clone()));
    }
}

/// Removes a cgroup directory when dropped (after its process has exited).
struct CgroupDir(PathBuf);

impl Drop for CgroupDir {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!("rackmem bench: warning: could not remove cgroup {}", self.0.display());
    }
}

impl Drop for SwapPeer {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        if let Err(e) = sh("swapoff", &[self.dev()]) {
            eprintln!("rackmem bench: warning: {e}");
        }
        match &self.backend {
            SwapBackend::Zram => {
                if let Err(e) = write(Path::new("/sys/block/zram0/reset"), "1") {
                    eprintln!("rackmem bench: warning: {e}");
                }
            }
            SwapBackend::File(p) => {
                let _ = std::fs::remove_file(p);
            }
        }
        self.active = false;
    }
}
