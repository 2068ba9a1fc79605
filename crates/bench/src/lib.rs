//! Benchmarks of rackmem, measured against floors and peers in the same run: everything
//! `rackmem bench` does. The binary parses options into the config structs here and prints or
//! saves the [`Output`] each part returns; which workloads exist, how setups run and take
//! turns, ratios, tables, JSON and charts are decided here.
//!
//! The parts, one module each:
//! - [`floors`]: what the machine can do at best: a userfaultfd fault resolved from local memory
//!   by a blocking or a busy-polling handler, and a 4 KiB / 64 KiB request-response on each
//!   transport to a brick in this process.
//! - [`latency`]: the remote fault an unmodified program sees, beside the floors.
//! - [`scan`]: a sequential scan under rackmem against all-local, over several links.
//! - [`workloads`]: unmodified programs natively, under `rackmem run` in several setups
//!   ([`setups`]), and under Linux swap ([`swap`]).
//! - [`apps`]: real applications (Redis, memcached ([`kvload`] loads it), SQLite, K-means,
//!   Graph500 BFS, zstd) natively, under `rackmem run` and under Linux swap; [`oom`] explains a
//!   swap peer's OOM kill.
//! - [`control`]: the control plane's allocation latency over HTTP, per store.
//! - [`transfer`]: one-sided put/get by each path and the calibrated engine, beside `memcpy`
//!   and MPI's one-sided operations.
//! - [`suite`]: every part in one run, one JSON and one SVG; [`progress`] its one display.
//!
//! What the parts share: [`programs`] builds and runs the test programs; [`rackmem`] is the
//! `rackmem` executable a program runs under, the current build or a baseline build compared
//! with it in the same run ([`baseline`] holds the ratios); [`loopback`] starts bricks on TCP
//! loopback; [`summary`] and [`chart`] summarise and draw.
//!
//! Every figure is reported next to the floor or peer it should be judged against; ratios, not
//! absolute numbers, are what carry from machine to machine.
//!
//! Not here: argument parsing (the binary), and anything a program under test links (the
//! runtime).

pub mod apps;
pub mod baseline;
pub mod chart;
pub mod control;
pub mod emulate;
pub mod floods;
pub mod floors;
pub mod kvload;
pub mod latency;
pub mod loopback;
pub mod migration;
pub mod model;
pub mod oom;
pub mod output;
pub mod programs;
pub mod progress;
pub mod rackmem;
pub mod rates;
pub mod scan;
pub mod seeds;
pub mod setups;
pub mod suite;
pub mod summary;
pub mod swap;
pub mod transfer;
pub mod workloads;

pub use output::Output;
pub use summary::Summary;

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
    /// The configuration names something unknown or impossible (says which option).
    #[error("{0}")]
    Config(String),
    /// A step of a benchmark failed: what it was doing, and why.
    #[error("{what}: {why}")]
    Step {
        /// What was being done.
        what: String,
        /// Why it failed.
        why: String,
    },
    /// A file could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// SIGINT or SIGTERM stopped the bench between runs.
    #[error("{0}")]
    Interrupted(String),
}

/// Says what was being done when an error happened, as [`BenchError::Step`].
pub(crate) trait Context<T> {
    /// `what: error`.
    fn context(self, what: &str) -> Result<T, BenchError>;
    /// `what(): error`, `what` evaluated on error only.
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T, BenchError>;
}

impl<T, E: std::fmt::Display> Context<T> for Result<T, E> {
    fn context(self, what: &str) -> Result<T, BenchError> {
        self.with_context(|| what.to_string())
    }

    fn with_context(self, what: impl FnOnce() -> String) -> Result<T, BenchError> {
        self.map_err(|e| BenchError::Step {
            what: what(),
            why: e.to_string(),
        })
    }
}
