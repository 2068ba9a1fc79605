//! The `qsort` application: `bench/qsort.c`, the C library's `qsort` on one large array of
//! pseudo-random 64-bit keys (glibc merge-sorts through a temporary copy, so about twice the
//! array is live); keys sorted per second, the FNV-1a of the sorted keys the result.

use super::app::{Prepared, Sizes};
use super::AppsConfig;
use crate::BenchError;
use std::path::PathBuf;

/// `bench/qsort.c`, built.
pub(super) fn prepare(cfg: &AppsConfig, sizes: Sizes, dir: PathBuf) -> Result<Prepared, BenchError> {
    Ok(Prepared {
        name: "qsort",
        metric: "elements_per_s",
        prog: crate::programs::build(&cfg.bench_dir, "qsort", &cfg.tmp)?,
        args: vec![sizes.qsort_elements.to_string(), "1".into()],
        input: None,
        stdin: None,
        sizes,
        dir,
        env: Vec::new(),
    })
}
