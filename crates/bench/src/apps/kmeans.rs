//! The `kmeans` application: `bench/kmeans.c`, Lloyd's K-means over one large array of points
//! (16 dimensions, 16 clusters, 8 iterations); points per second, its checksum the result.

use super::app::{kv, number, Prepared, Sizes};
use super::launch::Failure;
use super::process::Done;
use super::AppsConfig;
use crate::BenchError;
use std::path::PathBuf;

/// `bench/kmeans.c`, built.
pub(super) fn prepare(cfg: &AppsConfig, sizes: Sizes, dir: PathBuf) -> Result<Prepared, BenchError> {
    Ok(Prepared {
        name: "kmeans",
        metric: "points_per_s",
        prog: crate::programs::build(&cfg.bench_dir, "kmeans", &cfg.tmp)?,
        args: vec![
            sizes.kmeans_points.to_string(),
            "16".into(),
            "16".into(),
            "8".into(),
            "1".into(),
        ],
        input: None,
        stdin: None,
        sizes,
        dir,
        env: Vec::new(),
    })
}

/// Points per second and the checksum, from the program's result line.
pub(super) fn measured(d: &Done) -> Result<(f64, String), Failure> {
    let m = kv(&d.stdout)?;
    Ok((
        number(&m, "points_per_s")?,
        m.get("checksum").cloned().unwrap_or_default(),
    ))
}
