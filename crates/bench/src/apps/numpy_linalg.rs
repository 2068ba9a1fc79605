//! The `numpy-linalg` application: `bench/numpy_linalg.py`, NumPy's matrix multiply and solve of
//! n × n doubles (C = A·B, then X = solve(A, C), checked against B): seed 002's DGEMM kind of
//! work, through the OpenBLAS that NumPy's wheels ship. GFLOP/s; the sums of C and X the result.
//!
//! BLAS threads are pinned to every CPU this process may use (OpenBLAS's own default, written
//! out so that native, rackmem and the swap peers run the same number of threads whatever their
//! environment says): dense linear algebra is the kind of program that faults from several
//! threads at once.

use super::app::{blas_threads, cpus, python, script, Prepared, Sizes};
use super::AppsConfig;
use crate::BenchError;
use std::path::PathBuf;

/// `python3 bench/numpy_linalg.py N`, BLAS on every CPU.
pub(super) fn prepare(cfg: &AppsConfig, sizes: Sizes, dir: PathBuf) -> Result<Prepared, BenchError> {
    Ok(Prepared {
        name: "numpy-linalg",
        metric: "gflop_per_s",
        prog: python(true)?,
        args: vec![
            script(cfg, "numpy_linalg.py")?.to_string_lossy().into_owned(),
            sizes.linalg_n.to_string(),
            "1".into(),
        ],
        input: None,
        stdin: None,
        sizes,
        dir,
        env: blas_threads(cpus()),
    })
}
