//! Which workloads `bench workloads` knows: each one's program, arguments at a scale, footprint,
//! and the figure compared (higher is better for all of them).

use crate::programs::{build, num, parse, parse_sysbench, Parser};
use crate::BenchError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The workloads' names, in the order they run.
pub const NAMES: [&str; 7] = [
    "stream",
    "gups",
    "scan",
    "ptrchase",
    "skewed",
    "sysbench-write",
    "sysbench-read",
];

/// A workload: its program, arguments, footprint and the metric to compare (higher is better).
pub struct Workload {
    /// Its name (one of [`NAMES`]).
    pub name: &'static str,
    /// An installed program (held out: nobody here wrote it), and the package that has it;
    /// `None` for a C program of `bench/` named `name`.
    installed: Option<(&'static str, &'static str)>,
    /// The program's arguments.
    pub args: Vec<String>,
    /// Memory it touches, bytes (what the local buffers and the swap peers' budgets are shares of).
    pub footprint: u64,
    /// The figure compared.
    pub metric: &'static str,
    /// How its output becomes key/value pairs.
    pub parse: Parser,
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
    pub fn program(&self, bench_dir: &Path, tmp: &Path) -> Result<PathBuf, BenchError> {
        match self.installed {
            Some((prog, package)) => std::env::var_os("PATH")
                .iter()
                .flat_map(std::env::split_paths)
                .map(|d| d.join(prog))
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    BenchError::Workload(format!(
                        "{prog} is not installed: apt-get install {package} (./scripts/programs.sh does)"
                    ))
                }),
            None => build(bench_dir, self.name, tmp),
        }
    }

    /// The compared figure of one run's key/value pairs.
    pub fn metric_of(&self, kv: &BTreeMap<String, String>) -> f64 {
        if self.metric == "steps_per_s" {
            1e9 / num(kv, "ns_per_step")
        } else {
            num(kv, self.metric)
        }
    }
}

/// Every workload at size factor `scale` (1.0: about 1 GiB for most), in the order of [`NAMES`].
pub fn all(scale: f64) -> Vec<Workload> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_matches_its_names_and_scales() {
        let names: Vec<&str> = all(1.0).iter().map(|w| w.name).collect();
        assert_eq!(names, NAMES);
        let small = all(0.01);
        assert!(small
            .iter()
            .all(|w| w.footprint > 0 && w.footprint < all(1.0)[2].footprint));
    }
}
