//! Benchmarks of rackmem, measured against floors and peers in the same run.
//!
//! - [`floors`]: what the machine can do at best: a userfaultfd fault resolved from local memory
//!   by a blocking or a busy-polling handler, and a 4 KiB / 64 KiB request-response on each
//!   transport to a brick in this process.
//! - [`workloads`]: unmodified C programs from `bench/`, run natively and under `rackmem run`.
//! - [`apps`]: real applications (Redis, memcached ([`kvload`] loads it), SQLite, K-means, Graph500 BFS, zstd) natively, under
//!   `rackmem run` and under Linux swap ([`swap`]); [`oom`] explains a swap peer's OOM kill.
//! - [`suite`]: every part in one run, one JSON and one SVG; [`progress`] its one display.
//!
//! Every figure is reported next to the floor or peer it should be judged against; ratios, not
//! absolute numbers, are what carry from machine to machine.

pub mod apps;
pub mod chart;
pub mod floors;
pub mod kvload;
pub mod loopback;
pub mod oom;
pub mod progress;
pub mod suite;
pub mod swap;
pub mod workloads;

/// Latency summary of one measured series, in microseconds.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// What was measured.
    pub name: String,
    /// Samples.
    pub samples: usize,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Mean.
    pub mean_us: f64,
}

impl Summary {
    /// Summarises nanosecond samples.
    pub fn from_ns(name: &str, mut ns: Vec<u64>) -> Summary {
        if ns.is_empty() {
            return Summary {
                name: name.into(),
                ..Default::default()
            };
        }
        ns.sort_unstable();
        let q = |f: f64| ns[((ns.len() as f64 * f) as usize).min(ns.len() - 1)] as f64 / 1000.0;
        Summary {
            name: name.into(),
            samples: ns.len(),
            p50_us: q(0.5),
            p99_us: q(0.99),
            mean_us: ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0,
        }
    }
}

/// Errors of benchmarks.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// userfaultfd call.
    #[error(transparent)]
    Uffd(#[from] rackmem_uffd::UffdError),
    /// Memory call.
    #[error(transparent)]
    Sys(#[from] rackmem_sys::SysError),
    /// Brick or link.
    #[error("{0}")]
    Brick(String),
    /// A workload failed.
    #[error("{0}")]
    Workload(String),
}
