//! The `xz` application: Debian's `xz -T2 -3` over a generated text-like input cut into two
//! blocks, so that two threads compress at once. Each thread's match finder (a hash table and
//! hash chains over its 4 MiB dictionary, about 30 MiB) is read and written at random for every
//! input byte: random access from two threads, with a working set a little above a quarter of
//! the footprint. MB/s; the hash of the compressed output is the result.

use super::app::{Prepared, Sizes};
use super::launch::Failure;
use super::process::Done;
use super::zstd::{measured_compressor, prepare_compressor};
use crate::BenchError;
use std::path::PathBuf;

/// `xz` reading the generated input from a file (removed when the [`Prepared`] is dropped).
pub(super) fn prepare(sizes: Sizes, dir: PathBuf) -> Result<Prepared, BenchError> {
    // Two blocks of half the input each: `-T2` compresses blocks in parallel, and xz's own
    // block size at `-3` (three dictionaries, 12 MiB) would leave a smaller input one block.
    let block = (sizes.xz_bytes / 2).max(1 << 16);
    let args = vec![
        "-T2".into(),
        "-3".into(),
        format!("--block-size={block}"),
        "-q".into(),
        "-c".into(),
    ];
    prepare_compressor("xz", sizes.xz_bytes, args, sizes, dir)
}

/// Input MB per second of wall time and the hash of the compressed output.
pub(super) fn measured(p: &Prepared, d: &Done) -> Result<(f64, String), Failure> {
    measured_compressor(p, p.sizes.xz_bytes, d)
}
