//! Where a run's program runs ([`Launch`]: natively, under `rackmem run`, or in a swap peer's
//! memory cgroup) and what the run gives: an [`Outcome`], or a [`Failure`] that carries the
//! cgroup's OOM report when the program died there.

use crate::rackmem::Rackmem;
use crate::swap::MemoryCgroup;
use crate::BenchError;
use std::path::Path;
use std::process::{Command, ExitStatus};

/// One successful run.
#[derive(Debug, Clone, Default)]
pub(super) struct Outcome {
    pub(super) metric: f64,
    pub(super) p99_ms: Option<f64>,
    pub(super) result: String,
    pub(super) peak_rss_bytes: Option<u64>,
}

/// One failed run: why, and the cgroup's report when it died there.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) reason: String,
    pub(super) oom: Option<Box<crate::oom::OomReport>>,
}

impl From<BenchError> for Failure {
    fn from(e: BenchError) -> Failure {
        Failure {
            reason: e.to_string(),
            oom: None,
        }
    }
}

pub(super) fn fail(reason: impl Into<String>) -> Failure {
    Failure {
        reason: reason.into(),
        oom: None,
    }
}

/// A rackmem run's local buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Local {
    /// `--local P%`: P% of the window's peak footprint so far, growing with it.
    Percent(u32),
    /// `--local BYTES`: a byte budget fixed from the start, as a memory cgroup's limit is.
    Bytes(u64),
}

impl Local {
    /// The value of `--local`.
    pub(super) fn arg(self) -> String {
        match self {
            Local::Percent(p) => format!("{p}%"),
            Local::Bytes(b) => b.to_string(),
        }
    }
}

/// Where a program runs.
pub(super) enum Launch<'a> {
    /// Natively, its peak RSS measured.
    Native,
    /// Under `rackmem run --local LOCAL OPTIONS…` of a build, every process appending its
    /// statistics to the file (`RACKMEM_STATS_FILE`).
    Rackmem(&'a Rackmem, &'a [String], Local, &'a Path),
    /// In a memory cgroup (a swap peer).
    Cgroup(&'a mut MemoryCgroup),
}

impl Launch<'_> {
    pub(super) fn command(&mut self, prog: &Path, args: &[String]) -> Command {
        match self {
            Launch::Native => {
                let mut c = Command::new(prog);
                c.args(args);
                c
            }
            Launch::Rackmem(rackmem, options, local, stats) => {
                let mut c = rackmem.run(&local.arg(), options, prog, args);
                c.env(rackmem_runtime::config::env::STATS_FILE, stats);
                c
            }
            Launch::Cgroup(cg) => {
                cg.start_sampling();
                cg.command(prog, args)
            }
        }
    }

    /// Why a program that ended with `status` failed: the cgroup's OOM report if it ran in one
    /// and was killed.
    pub(super) fn failure(&mut self, what: &str, status: ExitStatus, stderr: &str) -> Failure {
        use std::os::unix::process::ExitStatusExt;
        let exit = match status.signal() {
            Some(9) => "killed by SIGKILL".to_string(),
            Some(s) => format!("killed by signal {s}"),
            None => format!("exit status {}", status.code().unwrap_or(-1)),
        };
        let tail: String = stderr.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
        match self {
            Launch::Cgroup(cg) => {
                let rep = cg.report(exit.clone());
                if rep.oom_kills.is_some_and(|k| k > 0) || rep.kernel.is_some() {
                    Failure {
                        reason: format!("{what} OOM-killed by its cgroup: {}", rep.summary()),
                        oom: Some(Box::new(rep)),
                    }
                } else {
                    fail(format!("{what} failed ({exit}): {tail}"))
                }
            }
            _ => fail(format!("{what} failed ({exit}): {tail}")),
        }
    }
}

/// What a run under rackmem moved, from the statistics its processes appended (one JSON line
/// each, `RACKMEM_STATS_FILE`): summed over the processes (a server's forks, a shell's children),
/// the longest hold the greatest. What the speed alone does not say: how many faults, how many
/// bytes came back and went out, whether load control held threads.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunStats {
    /// Processes that wrote statistics.
    pub processes: u64,
    /// Page faults served.
    pub faults: u64,
    /// Bytes fetched on demand.
    pub bytes_fetched: u64,
    /// Bytes read ahead (fetched beyond the faulting page).
    pub bytes_prefetched: u64,
    /// Bytes written back to bricks.
    pub bytes_written_back: u64,
    /// Pages evicted from the local buffer.
    pub evictions: u64,
    /// Faults load control held.
    pub load_holds: u64,
    /// The longest a fault was held, ns.
    pub load_hold_max_ns: u64,
}

impl RunStats {
    /// Reads the statistics file of one run (`None` if no process wrote one).
    pub(super) fn read(path: &Path) -> Option<RunStats> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut s = RunStats::default();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
            s.processes += 1;
            s.faults += n("faults");
            s.bytes_fetched += n("bytes_fetched");
            s.bytes_prefetched += n("bytes_prefetched");
            s.bytes_written_back += n("bytes_written_back");
            s.evictions += n("evictions");
            s.load_holds += n("load_holds");
            s.load_hold_max_ns = s.load_hold_max_ns.max(n("load_hold_max_ns"));
        }
        (s.processes > 0).then_some(s)
    }
}
