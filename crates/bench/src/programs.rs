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

/// How a workload's output becomes key=value pairs: [`parse`] for the programs of `bench/`,
/// [`parse_sysbench`] for sysbench.
pub type Parser = fn(&[u8]) -> Result<BTreeMap<String, String>, BenchError>;

/// Runs `cmd`; returns the key=value pairs of its `result` line(s), merged.
pub fn run(cmd: Command) -> Result<BTreeMap<String, String>, BenchError> {
    run_parsed(cmd, parse)
}

/// Runs `cmd`; returns what `parser` finds in its output.
pub fn run_parsed(mut cmd: Command, parser: Parser) -> Result<BTreeMap<String, String>, BenchError> {
    let o = cmd
        .output()
        .map_err(|e| BenchError::Workload(format!("{cmd:?}: {e}")))?;
    if !o.status.success() {
        // Programs say why on either stream (sysbench prints its FATAL lines on stdout).
        let tail = |b: &[u8]| {
            let t = String::from_utf8_lossy(b);
            let lines: Vec<&str> = t.lines().filter(|l| !l.trim().is_empty()).collect();
            lines[lines.len().saturating_sub(5)..].join("\n")
        };
        return Err(BenchError::Workload(format!(
            "{cmd:?} failed ({}): {}{}",
            o.status,
            tail(&o.stderr),
            match tail(&o.stdout) {
                t if t.is_empty() => String::new(),
                t => format!("\n(its standard output ends with:)\n{t}"),
            }
        )));
    }
    parser(&o.stdout).map_err(|e| BenchError::Workload(format!("{cmd:?}: {e}")))
}

/// The throughput `sysbench memory` reports (`3072.00 MiB transferred (20198.70 MiB/sec)`), as
/// `mib_per_s`. sysbench is a held-out program: nobody here wrote it.
pub fn parse_sysbench(stdout: &[u8]) -> Result<BTreeMap<String, String>, BenchError> {
    let text = String::from_utf8_lossy(stdout);
    let rate = text
        .lines()
        .find(|l| l.contains("MiB transferred"))
        .and_then(|l| l.split_once('(').map(|(_, r)| r))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| BenchError::Workload("sysbench printed no \"MiB transferred (N MiB/sec)\" line".into()))?;
    Ok(BTreeMap::from([("mib_per_s".to_string(), rate.to_string())]))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysbench_throughput_is_read_and_its_absence_is_an_error() {
        let out = b"Total operations: 3 ( 6.57 per second)\n\n3072.00 MiB transferred (20198.70 MiB/sec)\n";
        assert_eq!(parse_sysbench(out).unwrap()["mib_per_s"], "20198.7");
        assert!(parse_sysbench(b"sysbench: unknown option\n").is_err());
    }

    #[test]
    fn a_failing_program_is_reported_with_what_it_said_on_either_stream() {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "echo 'FATAL: Invalid value for memory-block-size: 51M'; echo oops >&2; exit 1",
        ]);
        let e = run_parsed(c, parse_sysbench).unwrap_err().to_string();
        assert!(e.contains("oops") && e.contains("FATAL: Invalid value"), "{e}");
    }
}
