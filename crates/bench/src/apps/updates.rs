//! The `updates-1`, `updates-2` and `updates-all` applications: `bench/updates.c`, random 8-byte
//! XOR updates over one array (512 MiB at `--scale 1`) from 1, 2 or every CPU's thread, the same
//! total number of updates split between them: seed 002's GUPS kind of work, and issue 21's test
//! of faults from several threads at once. Updates per second; the FNV-1a of the whole array the
//! result, the same for every thread count (the updates commute).

use super::app::{Prepared, Sizes};
use super::AppsConfig;
use crate::BenchError;
use std::path::PathBuf;

/// `bench/updates.c MIB UPDATES THREADS`, built; `threads` 0 is every online CPU.
pub(super) fn prepare(
    cfg: &AppsConfig,
    sizes: Sizes,
    dir: PathBuf,
    name: &'static str,
    threads: u32,
) -> Result<Prepared, BenchError> {
    Ok(Prepared {
        name,
        metric: "updates_per_s",
        prog: crate::programs::build(&cfg.bench_dir, "updates", &cfg.tmp)?,
        args: vec![
            sizes.updates_mib.to_string(),
            sizes.updates.to_string(),
            threads.to_string(),
            "1".into(),
        ],
        input: None,
        stdin: None,
        sizes,
        dir,
        env: Vec::new(),
    })
}
