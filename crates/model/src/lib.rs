//! Models that explain why a program runs as it does on remote memory, with no I/O.
//!
//! - [`camat`]: C-AMAT (concurrent average memory access time), seed 002's Eq. 1, 2, 4, 5, 7
//!   and 9 restated for rackmem's memory levels (the local buffer, then each brick), and
//!   [`camat::Trace`], which measures every parameter of those equations exactly from the
//!   intervals of a run's accesses, hits and misses from any number of threads (seed 002's
//!   multicore form, Eq. 3, is the same measurement over all threads at once).
//! - [`concurrency`]: the online form of the same measurement for a runtime, which sees misses
//!   (faults) begin and end but never sees hits: outstanding faults integrated over time, so
//!   miss concurrency and pure misses are known without keeping a trace.
//! - [`link`]: a link model in the spirit of seed 000's Table I: how a request and its
//!   response are cut into frames and packets, what that costs on the wire one at a time and
//!   pipelined, and from it a fault's latency and a stream's throughput over a given link.
//!   [`link::LinkSpec`] parses the `latency=5us,bandwidth=25Gbit` form users write.
//!
//! What this crate is not: it measures nothing itself (the runtime and `rackmem bench` do),
//! knows no userfaultfd, socket or brick, and prints nothing (`rackmem model` does).

pub mod camat;
pub mod concurrency;
pub mod link;

pub use camat::{Camat, Level, Trace};
pub use concurrency::{LevelClock, LevelCounts, MissClock};
pub use link::{Link, LinkSpec, Software, Transfer};

/// Why a model could not be built from what it was given.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ModelError {
    /// A link specification (`latency=5us,bandwidth=25Gbit`) could not be parsed.
    #[error("link specification {spec:?}: {reason}")]
    Spec {
        /// The text given.
        spec: String,
        /// What is wrong with it and what was expected.
        reason: String,
    },
    /// An interval ends before it starts, or a value is negative or not finite.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// Which input.
        what: &'static str,
        /// Why.
        reason: String,
    },
}
