//! The `bfs` application: `bench/bfs.c`, Graph500-style BFS on a Kronecker graph (edge factor 16,
//! 2 roots); TEPS, the BFS tree validated, its checksum the result.

use super::app::{kv, number, Prepared, Sizes};
use super::launch::{fail, Failure};
use super::process::Done;
use super::AppsConfig;
use crate::BenchError;
use std::path::PathBuf;

/// `bench/bfs.c`, built.
pub(super) fn prepare(cfg: &AppsConfig, sizes: Sizes, dir: PathBuf) -> Result<Prepared, BenchError> {
    Ok(Prepared {
        name: "bfs",
        metric: "teps",
        prog: crate::programs::build(&cfg.bench_dir, "bfs", &cfg.tmp)?,
        args: vec![sizes.bfs_scale.to_string(), "16".into(), "2".into(), "1".into()],
        input: None,
        stdin: None,
        sizes,
        dir,
        env: Vec::new(),
    })
}

/// TEPS and the checksum, from the program's result line; a tree that failed validation fails
/// the run.
pub(super) fn measured(d: &Done) -> Result<(f64, String), Failure> {
    let m = kv(&d.stdout)?;
    if m.get("valid").map(String::as_str) != Some("1") {
        return Err(fail("bfs: the BFS tree failed validation"));
    }
    Ok((number(&m, "teps")?, m.get("checksum").cloned().unwrap_or_default()))
}
