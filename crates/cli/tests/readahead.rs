//! Read-ahead accuracy in the statistics is a measurement: a program that reads sequentially
//! uses nearly every page its faults fetch ahead, one that reads a page and jumps eight uses one
//! in eight; both over shared memory (the default) and a Unix socket brick, each run checked
//! against the native run's checksum.

mod common;
use common::*;

/// Runs `stride_read 64 STRIDE 3` at 25% local; returns the read-ahead accuracy and the sample
/// it was estimated on.
fn accuracy(stride: &str, extra: &[&str]) -> (f64, u64) {
    let prog = program("stride_read");
    let args = ["64", stride, "3"];
    let n = native(&prog, &args);
    let (r, stats) = remote(&prog, &args, "25%", extra);
    assert!(r.status.success(), "stride_read {args:?} {extra:?}: {}", show(&r));
    assert!(!checksums(&n).is_empty(), "no checksum printed: {}", show(&n));
    assert_eq!(
        checksums(&n),
        checksums(&r),
        "stride_read {args:?} {extra:?}: what it read under rackmem differs from the native run"
    );
    let s = busiest(&stats);
    assert_used_remote_memory_at(s, 25);
    let a = s.raw["readahead_accuracy"]
        .as_f64()
        .unwrap_or_else(|| panic!("no readahead_accuracy for stride {stride} {extra:?}: {s:?}"));
    let (used, wasted) = (s.extra("readahead_sample_used"), s.extra("readahead_sample_wasted"));
    assert!(
        (a - used as f64 / (used + wasted) as f64).abs() < 1e-9,
        "accuracy {a} is not used {used} of {}",
        used + wasted
    );
    // The estimate splits every page fetched ahead into used and wasted.
    assert_eq!(
        s.extra("readahead_pages_used") + s.extra("readahead_pages_wasted"),
        s.bytes_prefetched / 4096,
        "{s:?}"
    );
    (a, used + wasted)
}

fn sequential_reads_use_what_is_read_ahead_and_strided_ones_do_not(extra: &[&str]) {
    let (seq, seq_n) = accuracy("1", extra);
    let (strided, strided_n) = accuracy("8", extra);
    assert!(
        seq_n >= 50 && strided_n >= 50,
        "too few sampled pages to judge ({seq_n} sequential, {strided_n} strided) {extra:?}"
    );
    assert!(seq >= 0.8, "sequential reads: read-ahead accuracy {seq:.2} {extra:?}");
    assert!(
        strided <= 0.35,
        "a page read, then a jump of 8: read-ahead accuracy {strided:.2} {extra:?}"
    );
}

#[test]
fn read_ahead_accuracy_on_shared_memory() {
    require_root();
    sequential_reads_use_what_is_read_ahead_and_strided_ones_do_not(&[]);
}

#[test]
fn read_ahead_accuracy_over_a_unix_socket_brick() {
    require_root();
    sequential_reads_use_what_is_read_ahead_and_strided_ones_do_not(&["--no-shared-memory"]);
}
