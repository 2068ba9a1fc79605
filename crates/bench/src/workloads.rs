//! Unmodified C programs from `bench/`, built with the system C compiler and run natively or
//! under `rackmem run`; their `result` lines are parsed into key/value maps.

use crate::BenchError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles `DIR/NAME.c` into `out_dir/NAME`.
pub fn build(bench_dir: &Path, name: &str, out_dir: &Path) -> Result<PathBuf, BenchError> {
    let src = bench_dir.join(format!("{name}.c"));
    let out = out_dir.join(name);
    let o = Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-std=gnu11", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-lm")
        .output()
        .map_err(|e| BenchError::Workload(format!("cannot run gcc: {e}")))?;
    if !o.status.success() {
        return Err(BenchError::Workload(format!(
            "gcc {}: {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    Ok(out)
}

/// Runs `cmd`; returns the key=value pairs of its `result` line(s), merged.
pub fn run(mut cmd: Command) -> Result<BTreeMap<String, String>, BenchError> {
    let o = cmd
        .output()
        .map_err(|e| BenchError::Workload(format!("{cmd:?}: {e}")))?;
    if !o.status.success() {
        return Err(BenchError::Workload(format!(
            "{cmd:?} failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    parse(&o.stdout).map_err(|e| BenchError::Workload(format!("{cmd:?}: {e}")))
}

/// The key=value pairs of the `result` line(s) in a program's output.
pub fn parse(stdout: &[u8]) -> Result<BTreeMap<String, String>, BenchError> {
    let mut kv = BTreeMap::new();
    for line in String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| l.starts_with("result "))
    {
        for pair in line.split_whitespace().skip(1) {
            if let Some((k, v)) = pair.split_once('=') {
                kv.insert(k.to_string(), v.to_string());
            }
        }
    }
    if kv.is_empty() {
        return Err(BenchError::Workload("the program printed no result line".into()));
    }
    Ok(kv)
}

/// A parsed number from a result map.
pub fn num(kv: &BTreeMap<String, String>, key: &str) -> f64 {
    kv.get(key).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}
