//! Read-ahead accuracy in the statistics is a measurement: a program that reads sequentially
//! uses nearly every page its faults fetch ahead; one that reads four pages and jumps far uses
//! few of them. One that reads a page and skips seven is a strided stream: its runs are the
//! pages the stride predicts, which it reads (fetching the seven pages between, as a
//! sequential stream with gaps did, used about one in ten). Over shared memory (the default)
//! and a Unix socket brick, each run checked against the native run's checksum.

mod common;
use common::*;
use std::process::Command;

/// Runs `stride_read 64 BURST STRIDE 3` at 25% local, one page read ahead in `sample` left
/// remote as a probe; returns its statistics.
fn run(burst: &str, stride: &str, sample: &str, extra: &[&str]) -> ProcStats {
    let prog = program("stride_read");
    let args = ["64", burst, stride, "3"];
    let n = native(&prog, &args);
    let stats = std::env::temp_dir().join(format!("rackmem-stride_read-{}-{}.jsonl", std::process::id(), unique()));
    let mut c = Command::new(rackmem());
    c.env("RACKMEM_READAHEAD_SAMPLE", sample)
        .args(["run", "--local", "25%", "--stats-json"])
        .arg(&stats)
        .args(extra)
        .arg("--")
        .arg(&prog)
        .args(args);
    let r = run_with_deadline(c, LIMIT);
    assert!(r.status.success(), "stride_read {args:?} {extra:?}: {}", show(&r));
    assert!(!checksums(&n).is_empty(), "no checksum printed: {}", show(&n));
    assert_eq!(
        checksums(&n),
        checksums(&r),
        "stride_read {args:?} {extra:?}: what it read under rackmem differs from the native run"
    );
    let all = read_stats(&stats);
    let _ = std::fs::remove_file(&stats);
    let s = busiest(&all).clone();
    assert_used_remote_memory_at(&s, 25);
    s
}

/// The accuracy and the number of sampled pages it was estimated on; checks that the estimate
/// splits the pages fetched ahead.
fn accuracy(s: &ProcStats) -> (f64, u64) {
    let a = s.raw["readahead_accuracy"]
        .as_f64()
        .unwrap_or_else(|| panic!("no readahead_accuracy: {s:?}"));
    let (used, wasted) = (s.extra("readahead_sample_used"), s.extra("readahead_sample_wasted"));
    assert!(
        (a - used as f64 / (used + wasted) as f64).abs() < 1e-9,
        "accuracy {a} is not used {used} of {}",
        used + wasted
    );
    assert_eq!(
        s.extra("readahead_pages_used") + s.extra("readahead_pages_wasted"),
        s.bytes_prefetched / 4096,
        "the estimate must split every page fetched ahead: {s:?}"
    );
    (a, used + wasted)
}

fn reads_of_three_shapes(extra: &[&str]) {
    // The runtime's own sampling rate.
    let (seq, seq_n) = accuracy(&run("1", "1", "256", extra));
    assert!(seq_n >= 50, "too few sampled pages ({seq_n}) {extra:?}");
    assert!(seq >= 0.8, "sequential reads: read-ahead accuracy {seq:.2} {extra:?}");
    // Four pages, then far: the stream's last run fetches three pages never read. Sampled one
    // in four, for enough samples from the few runs fetched ahead.
    let (burst, burst_n) = accuracy(&run("4", "64", "4", extra));
    assert!(burst_n >= 50, "too few sampled pages ({burst_n}) {extra:?}");
    assert!(
        burst <= 0.5 && burst + 0.3 <= seq,
        "four pages read, then a jump: read-ahead accuracy {burst:.2} (sequential {seq:.2}) {extra:?}"
    );
    // One page in eight: a strided stream, whose runs fetch the pages the stride predicts.
    // Fetching the seven pages between (a run covering them) would use one in eight, about 0.1:
    // an accuracy above 0.6 says the prediction is what was fetched.
    let (strided, strided_n) = accuracy(&run("1", "8", "16", extra));
    assert!(strided_n >= 50, "too few sampled pages ({strided_n}) {extra:?}");
    assert!(
        strided >= 0.6,
        "a page read, then a jump of 8: read-ahead accuracy {strided:.2} (sequential {seq:.2}) {extra:?}"
    );
}

#[test]
fn read_ahead_accuracy_on_shared_memory() {
    require_root();
    reads_of_three_shapes(&[]);
}

#[test]
fn read_ahead_accuracy_over_a_unix_socket_brick() {
    require_root();
    reads_of_three_shapes(&["--no-shared-memory"]);
}
