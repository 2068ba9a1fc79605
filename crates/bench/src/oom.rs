//! Why a swap peer's program died in its memory cgroup: the cgroup's own counters and the
//! kernel's OOM report, parsed into one [`OomReport`] for the table and the JSON.
//!
//! A program killed by its cgroup's OOM killer leaves two traces. The cgroup directory (still
//! there until it is removed) keeps `memory.failcnt` (how often the limit was hit),
//! `memory.max_usage_in_bytes` (v1) or `memory.peak` (v2), and the OOM kill count in
//! `memory.oom_control` (v1) or `memory.events` (v2); its `memory.stat` is already emptied by the
//! exit, so [`crate::swap::MemoryCgroup`] samples it while the program runs. The kernel log holds
//! the figures at the moment of the kill: `memory: usage …kB, limit …kB, failcnt …`,
//! `memory+swap: usage …`, the cgroup's `memory.stat` dump (`rss`, `cache`, `swap`, …) and the
//! `Killed process PID (name) total-vm:…, anon-rss:…, file-rss:…` line. [`parse_kernel_log`]
//! picks out the last such report for one cgroup.

use std::collections::BTreeMap;

/// The kernel's OOM report for one cgroup, as `dmesg` printed it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KernelOom {
    /// Charged memory at the kill, bytes (`memory: usage`).
    pub usage_bytes: Option<u64>,
    /// The cgroup's limit, bytes (`memory: limit`).
    pub limit_bytes: Option<u64>,
    /// Times the limit was hit (`memory: failcnt`).
    pub failcnt: Option<u64>,
    /// Memory plus swap charged at the kill, bytes (`memory+swap: usage`, cgroup v1 only).
    pub memsw_usage_bytes: Option<u64>,
    /// The cgroup's `memory.stat` at the kill (bytes), e.g. `rss`, `cache`, `swap` (v1) or
    /// `anon`, `file` (v2).
    pub stat: BTreeMap<String, u64>,
    /// The `Killed process …` line, verbatim after its timestamp.
    pub killed: Option<String>,
    /// The killed process's anonymous resident memory at the kill, bytes (`anon-rss`).
    pub killed_anon_rss_bytes: Option<u64>,
}

/// Everything known about a program's death in its cgroup.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OomReport {
    /// The cgroup's limit, bytes.
    pub limit_bytes: u64,
    /// `memory.failcnt` after the run.
    pub failcnt: Option<u64>,
    /// Highest charge seen, bytes (`memory.max_usage_in_bytes` / `memory.peak`).
    pub max_usage_bytes: Option<u64>,
    /// OOM kills in the cgroup (`memory.oom_control`'s / `memory.events`' `oom_kill`).
    pub oom_kills: Option<u64>,
    /// The last `memory.stat` sampled while the program ran (bytes).
    pub last_stat: BTreeMap<String, u64>,
    /// The kernel's report, when the log still holds it.
    pub kernel: Option<KernelOom>,
    /// The program's exit: a signal or an exit status.
    pub exit: String,
}

/// Parses `key value` lines (`memory.stat`, `memory.events`, `memory.oom_control`).
pub fn parse_key_values(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let k = it.next()?;
            let v = it.next()?.parse().ok()?;
            Some((k.to_string(), v))
        })
        .collect()
}

/// The text of a kernel log line after its `[ seconds]` timestamp.
fn strip_stamp(line: &str) -> &str {
    match line.trim_start().strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(line, |(_, r)| r.trim_start()),
        None => line.trim(),
    }
}

/// `12345kB` → bytes.
fn kb(s: &str) -> Option<u64> {
    s.trim()
        .trim_end_matches(',')
        .strip_suffix("kB")?
        .parse::<u64>()
        .ok()
        .map(|k| k * 1024)
}

/// The value after `key` in a `key: usage 1kB, limit 2kB, failcnt 3` line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(key)? + key.len();
    line[at..].split([',', ' ']).find(|s| !s.is_empty())
}

/// The kernel's last OOM report about the cgroup named `cgroup` (its path below the memory
/// hierarchy's root, e.g. `/rackmem-bench-1-0`) in the text `dmesg` printed, if any.
pub fn parse_kernel_log(log: &str, cgroup: &str) -> Option<KernelOom> {
    let lines: Vec<&str> = log.lines().map(strip_stamp).collect();
    let memcg = format!("oom_memcg={cgroup},");
    // The report ends with the `oom-kill:` summary and the `Killed process` line; its figures
    // come before, from the `memory: usage` line on.
    let end = lines
        .iter()
        .rposition(|l| l.starts_with("oom-kill:") && l.contains(&memcg))?;
    let start = lines[..end].iter().rposition(|l| l.starts_with("memory: usage"))?;
    let mut r = KernelOom::default();
    let head = lines[start];
    r.usage_bytes = field(head, "usage").and_then(kb);
    r.limit_bytes = field(head, "limit").and_then(kb);
    r.failcnt = field(head, "failcnt").and_then(|v| v.parse().ok());
    let mut in_stat = false;
    for l in &lines[start + 1..end] {
        if l.starts_with("memory+swap: usage") {
            r.memsw_usage_bytes = field(l, "usage").and_then(kb);
        } else if l.starts_with("Memory cgroup stats for") {
            in_stat = true;
        } else if l.starts_with("Tasks state") || l.starts_with('[') {
            in_stat = false;
        } else if in_stat {
            let mut it = l.split_whitespace();
            if let (Some(k), Some(Ok(v)), None) = (it.next(), it.next().map(str::parse::<u64>), it.next()) {
                r.stat.insert(k.to_string(), v);
            }
        }
    }
    if let Some(k) = lines[end..].iter().take(4).find(|l| l.contains("Killed process")) {
        r.killed = Some(k.to_string());
        r.killed_anon_rss_bytes = field(k, "anon-rss:").and_then(kb);
    }
    Some(r)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

impl OomReport {
    /// One line for the table: what was charged where when the program died.
    pub fn summary(&self) -> String {
        let mut s = format!("{} in a cgroup of {}", self.exit, mib(self.limit_bytes));
        if let Some(k) = self.oom_kills {
            s += &format!(", oom_kill {k}");
        }
        if let Some(f) = self.failcnt {
            s += &format!(", failcnt {f}");
        }
        if let Some(m) = self.max_usage_bytes {
            s += &format!(", max usage {}", mib(m));
        }
        let stat = self.kernel.as_ref().map_or(&self.last_stat, |k| &k.stat);
        let from = if self.kernel.is_some() {
            "at the kill"
        } else {
            "last sample"
        };
        let pick = |keys: &[&str]| keys.iter().find_map(|k| stat.get(*k).copied());
        let parts: Vec<String> = [
            ("rss", pick(&["rss", "anon"])),
            ("cache", pick(&["cache", "file"])),
            ("swap", pick(&["swap"])),
            ("swap cache", pick(&["swapcached"])),
        ]
        .iter()
        .filter_map(|(n, v)| v.map(|v| format!("{n} {}", mib(v))))
        .collect();
        if !parts.is_empty() {
            s += &format!("; {from}: {}", parts.join(", "));
        }
        // Pages evicted and faulted straight back: reclaim found nothing that stayed out, which
        // is why the kernel gave up and killed (a working set larger than the limit).
        if let Some(r) = pick(&["workingset_refault_anon"]).filter(|r| *r > 0) {
            s += &format!(", {r} anonymous pages refaulted");
        }
        if let Some(k) = &self.kernel {
            if let Some(u) = k.memsw_usage_bytes {
                s += &format!(", memory+swap {}", mib(u));
            }
            if let Some(a) = k.killed_anon_rss_bytes {
                s += &format!("; kernel: killed with anon-rss {}", mib(a));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
[ 8218.333985]  </TASK>
[ 8218.334051] memory: usage 19528kB, limit 19528kB, failcnt 37
[ 8218.334070] memory+swap: usage 19528kB, limit 9007199254740988kB, failcnt 0
[ 8218.334072] kmem: usage 116kB, limit 9007199254740988kB, failcnt 0
[ 8218.334073] Memory cgroup stats for /rackmem-bench-7-0:
[ 8218.339737] cache 4096
[ 8218.339744] rss 19877888
[ 8218.339754] swap 123256832
[ 8218.339957] Tasks state (memory values in pages):
[ 8218.339958] [  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes swapents oom_score_adj name
[ 8218.339962] [  12454]     0 12454    36002     5177     4832      345         0   102400        0             0 bfs
[ 8218.339986] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/rackmem-bench-7-0,task_memcg=/rackmem-bench-7-0,task=bfs,pid=12454,uid=0
[ 8218.340031] Memory cgroup out of memory: Killed process 12454 (bfs) total-vm:144008kB, anon-rss:19328kB, file-rss:1380kB, shmem-rss:0kB, UID:0 pgtables:100kB oom_score_adj:0
";

    #[test]
    fn kernel_report_of_the_right_cgroup() {
        let r = parse_kernel_log(LOG, "/rackmem-bench-7-0").expect("report found");
        assert_eq!(r.usage_bytes, Some(19528 * 1024));
        assert_eq!(r.limit_bytes, Some(19528 * 1024));
        assert_eq!(r.failcnt, Some(37));
        assert_eq!(r.memsw_usage_bytes, Some(19528 * 1024));
        assert_eq!(r.stat.get("rss"), Some(&19877888));
        assert_eq!(r.stat.get("swap"), Some(&123256832));
        assert_eq!(r.stat.get("cache"), Some(&4096));
        assert_eq!(r.stat.len(), 3, "the task table is not stat: {:?}", r.stat);
        assert_eq!(r.killed_anon_rss_bytes, Some(19328 * 1024));
        assert!(r
            .killed
            .as_deref()
            .is_some_and(|k| k.starts_with("Memory cgroup out of memory: Killed process 12454 (bfs)")));
        // Another cgroup's report, or a prefix of this one's name, is not this one's.
        assert_eq!(parse_kernel_log(LOG, "/rackmem-bench-7-1"), None);
        assert_eq!(parse_kernel_log(LOG, "/rackmem-bench-7"), None);
        assert_eq!(parse_kernel_log("", "/rackmem-bench-7-0"), None);
    }

    #[test]
    fn the_last_of_two_reports_counts() {
        let second = LOG.replace("failcnt 37", "failcnt 99");
        let r = parse_kernel_log(&format!("{LOG}{second}"), "/rackmem-bench-7-0").expect("report");
        assert_eq!(r.failcnt, Some(99));
    }

    #[test]
    fn summary_names_the_figures() {
        let rep = OomReport {
            limit_bytes: 20 << 20,
            failcnt: Some(37),
            max_usage_bytes: Some(20 << 20),
            oom_kills: Some(1),
            last_stat: parse_key_values("rss 1048576\ncache 0\nswap 2097152\n"),
            kernel: None,
            exit: "killed by SIGKILL".into(),
        };
        let s = rep.summary();
        for want in [
            "killed by SIGKILL in a cgroup of 20.0 MiB",
            "oom_kill 1",
            "failcnt 37",
            "max usage 20.0 MiB",
            "last sample: rss 1.0 MiB, cache 0.0 MiB, swap 2.0 MiB",
        ] {
            assert!(s.contains(want), "{want:?} missing from {s:?}");
        }
        let with_kernel = OomReport {
            kernel: parse_kernel_log(LOG, "/rackmem-bench-7-0"),
            ..rep
        };
        let s = with_kernel.summary();
        assert!(
            s.contains("at the kill: rss 19.0 MiB, cache 0.0 MiB, swap 117.5 MiB"),
            "{s}"
        );
        assert!(s.contains("kernel: killed with anon-rss 18.9 MiB"), "{s}");
    }

    #[test]
    fn key_values_skip_malformed_lines() {
        let m = parse_key_values("oom_kill_disable 0\nunder_oom 0\noom_kill 2\nbogus\nx y\n");
        assert_eq!(m.get("oom_kill"), Some(&2));
        assert_eq!(m.len(), 3);
    }
}
