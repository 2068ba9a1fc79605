//! The `zstd` application: `zstd --long=27` over a generated input whose repeats lie up to
//! 120 MiB apart, so the 128 MiB window is used; MB/s; the hash of the compressed output is the
//! result.

use super::app::{hash_hex, which, Prepared, Sizes};
use super::launch::{fail, Failure};
use super::process::Done;
use crate::BenchError;
use std::path::{Path, PathBuf};

/// The `zstd` application's input: text-like blocks, and blocks repeated (slightly changed)
/// from 16 to 120 MiB back, which only a window as long as `--long=27`'s finds.
pub fn zstd_input(bytes: u64) -> Vec<u8> {
    const BLOCK: usize = 1 << 20;
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut out: Vec<u8> = Vec::with_capacity(bytes as usize);
    let words: Vec<String> = (0..4096)
        .map(|_| {
            let r = next();
            // A word's ninth letter shifts by 64: `wrapping_shr` masks that to 0, as `>>` does in
            // a release build, where a debug build's `>>` panicked.
            (0..3 + r % 7)
                .map(|i| (b'a' + (r.wrapping_shr((8 * i) as u32) % 26) as u8) as char)
                .collect()
        })
        .collect();
    while (out.len() as u64) < bytes {
        let blocks = out.len() / BLOCK;
        let r = next();
        if blocks >= 16 && r % 4 != 0 {
            let back = 16 + (r >> 8) as usize % (blocks.min(120) - 15);
            let from = out.len() - back * BLOCK;
            out.extend_from_within(from..from + BLOCK);
            let at = out.len() - BLOCK;
            for _ in 0..64 {
                let i = at + (next() as usize % BLOCK);
                out[i] = b'A' + (next() % 26) as u8;
            }
        } else {
            let end = out.len() + BLOCK;
            while out.len() < end {
                let w = &words[(next() % words.len() as u64) as usize];
                out.extend_from_slice(w.as_bytes());
                out.push(b' ');
            }
            out.truncate(end);
        }
    }
    out.truncate(bytes as usize);
    out
}

/// `zstd` reading the generated input from a file (removed when the [`Prepared`] is dropped).
pub(super) fn prepare(sizes: Sizes, dir: PathBuf) -> Result<Prepared, BenchError> {
    let bytes = sizes.zstd_bytes;
    let args = ["-T1", "-3", "--long=27", "-q", "-c"].map(String::from).to_vec();
    prepare_compressor("zstd", bytes, args, sizes, dir)
}

/// A compressor `name` (the program of that name) run with `args` and then the path of a
/// generated input of `bytes` ([`zstd_input`]), which is removed when the [`Prepared`] is
/// dropped.
pub(super) fn prepare_compressor(
    name: &'static str,
    bytes: u64,
    mut args: Vec<String>,
    sizes: Sizes,
    dir: PathBuf,
) -> Result<Prepared, BenchError> {
    // On tmpfs when there is one: the input's pages are then charged to the bench, not
    // to the cgroup of the compressor that reads it, and reading it costs no disk.
    let shm = Path::new("/dev/shm");
    let at = if shm.is_dir() { shm.to_path_buf() } else { dir.clone() };
    let input = at.join(format!("rackmem-bench-{name}-{}.in", std::process::id()));
    std::fs::write(&input, zstd_input(bytes))
        .map_err(|e| BenchError::Workload(format!("writing {}: {e}", input.display())))?;
    args.push(input.to_string_lossy().into_owned());
    Ok(Prepared {
        name,
        metric: "mb_per_s",
        prog: which(name)?,
        args,
        input: Some(input),
        stdin: None,
        sizes,
        dir,
        env: Vec::new(),
    })
}

/// Input MB per second of wall time and the hash of the compressed output.
pub(super) fn measured(p: &Prepared, d: &Done) -> Result<(f64, String), Failure> {
    measured_compressor(p, p.sizes.zstd_bytes, d)
}

/// A compressor's input MB (of `bytes`) per second of wall time and the hash of its output.
pub(super) fn measured_compressor(p: &Prepared, bytes: u64, d: &Done) -> Result<(f64, String), Failure> {
    if d.stdout.is_empty() {
        return Err(fail(format!("{} wrote no output", p.name)));
    }
    Ok((bytes as f64 / 1e6 / d.wall.as_secs_f64(), hash_hex(&d.stdout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zstd_input_is_deterministic_and_repeats_far_back() {
        let a = zstd_input(40 << 20);
        assert_eq!(a.len(), 40 << 20);
        assert_eq!(hash_hex(&a), hash_hex(&zstd_input(40 << 20)));
        // Some block past the first 16 MiB is (nearly) a copy of one at least 16 MiB before it.
        let block = 1 << 20;
        let far = (16..40).any(|b| {
            (0..=b - 16).any(|o| {
                let same = a[b * block..(b + 1) * block]
                    .iter()
                    .zip(&a[o * block..(o + 1) * block])
                    .filter(|(x, y)| x == y)
                    .count();
                same > block - 1000
            })
        });
        assert!(far, "no long-range repeats");
    }
}
