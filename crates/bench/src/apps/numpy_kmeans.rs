//! The `numpy-kmeans` application: `bench/numpy_kmeans.py`, Lloyd's K-means in whole-array NumPy
//! (distances and new centers through matrix products, a one-hot n × k matrix per iteration) over
//! 16-dimensional float64 points, 16 clusters, 8 iterations; points × iterations per second, CRCs
//! of the labels and centers the result.
//!
//! One BLAS thread: its products are n × 16 by 16 × 16, too thin for a second thread to pay,
//! and one thread computes the same bits in every run, so the centers can be compared exactly.

use super::app::{blas_threads, python, script, Prepared, Sizes};
use super::AppsConfig;
use crate::BenchError;
use std::path::PathBuf;

/// `python3 bench/numpy_kmeans.py POINTS 16 16 8`, one BLAS thread.
pub(super) fn prepare(cfg: &AppsConfig, sizes: Sizes, dir: PathBuf) -> Result<Prepared, BenchError> {
    Ok(Prepared {
        name: "numpy-kmeans",
        metric: "points_per_s",
        prog: python(true)?,
        args: vec![
            script(cfg, "numpy_kmeans.py")?.to_string_lossy().into_owned(),
            sizes.numpy_kmeans_points.to_string(),
            "16".into(),
            "16".into(),
            "8".into(),
            "1".into(),
        ],
        input: None,
        stdin: None,
        sizes,
        dir,
        env: blas_threads(1),
    })
}
