//! Unmodified C programs on remote memory with a local buffer of 10% of their footprint: their
//! results must be identical to a native run, and the statistics must show the memory really
//! went to the brick and came back.

mod common;
use common::*;

fn main_process(stats: &[StatsSnapshot]) -> &StatsSnapshot {
    stats
        .iter()
        .max_by_key(|s| s.faults)
        .expect("the runtime wrote statistics")
}

#[test]
fn sequential_and_random_passes() {
    let s = same_as_native("passes", &["48", "1", "3"]);
    assert_used_remote_memory(main_process(&s));
}

#[test]
fn several_threads() {
    let s = same_as_native("passes", &["48", "4", "2"]);
    assert_used_remote_memory(main_process(&s));
}

#[test]
fn read_and_write_syscalls_on_remote_buffers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8 path");
    let s = same_as_native("fileio", &[d, "32"]);
    assert_used_remote_memory(main_process(&s));
}

#[test]
fn realloc_across_the_threshold_and_aligned_allocators() {
    let s = same_as_native("realloc_grow", &["64"]);
    assert!(main_process(&s).window_allocations > 5);
}

#[test]
fn anonymous_mmap_munmap_madvise_mremap() {
    let s = same_as_native("mmap_ops", &["48"]);
    assert_used_remote_memory(main_process(&s));
    assert!(
        main_process(&s).events > 0,
        "the raw madvise must reach the handler as a REMOVE event"
    );
}

#[test]
fn explicit_c_api() {
    require_root();
    let prog = program("explicit_api");
    assert_eq!(
        String::from_utf8_lossy(&native(&prog, &[]).stdout).trim(),
        "rackmem=absent"
    );
    let (o, _) = remote(&prog, &[], "50%", &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "rackmem=present remote=1 faults>0"
    );
}

#[test]
fn brick_over_tcp() {
    require_root();
    let prog = program("passes");
    let brick = std::process::Command::new(rackmem())
        .args([
            "brick",
            "--listen",
            "tcp://127.0.0.1:0",
            "--size",
            "1GiB",
            "--secret",
            "t",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("brick");
    let mut brick = Guard(Some(brick));
    // The brick prints the address it bound ("serving ... on tcp://127.0.0.1:PORT").
    let mut line = String::new();
    let stderr = brick.0.as_mut().and_then(|c| c.stderr.take()).expect("stderr");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stderr), &mut line).expect("brick banner");
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("tcp://"))
        .expect("address in banner")
        .to_string();
    let n = native(&prog, &["32", "2", "2"]);
    let (r, stats) = remote(&prog, &["32", "2", "2"], "10%", &["--brick", &addr, "--secret", "t"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(checksums(&n), checksums(&r));
    assert_used_remote_memory(main_process(&stats));
}

#[test]
fn fork_then_exec() {
    let s = same_as_native("fork_exec", &["32"]);
    // The parent and the exec'd child each had a runtime of their own.
    assert!(
        s.len() >= 2,
        "expected statistics from the parent and the exec'd child: {s:?}"
    );
}

#[test]
fn forked_child_and_parent_each_see_their_own_copy() {
    same_as_native("fork_rw", &["32", "3"]);
}

#[test]
fn daemonized_child_keeps_using_remote_memory() {
    require_root();
    let prog = program("daemonize");
    let dir = tempfile::tempdir().expect("tempdir");
    let native_out = dir.path().join("native.txt");
    let remote_out = dir.path().join("remote.txt");
    native(&prog, &[native_out.to_str().expect("path"), "32"]);
    let (o, _) = remote(&prog, &[remote_out.to_str().expect("path"), "32"], "10%", &[]);
    assert!(
        o.status.success(),
        "daemonize under rackmem: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let wait = |p: &std::path::Path| {
        let start = std::time::Instant::now();
        while !p.exists() {
            assert!(start.elapsed() < LIMIT, "the daemon never wrote {}", p.display());
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        std::fs::read_to_string(p).expect("result")
    };
    assert_eq!(wait(&remote_out), wait(&native_out));
}

#[test]
fn concurrent_writes_survive_eviction() {
    // A local buffer of 2% keeps every page moving in and out while three threads write to it.
    require_root();
    let prog = program("evict_race");
    let args = ["8", "3", "10"];
    let n = native(&prog, &args);
    let (r, stats) = remote(&prog, &args, "2%", &[]);
    assert!(
        r.status.success(),
        "evict_race under rackmem: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert_eq!(checksums(&n), checksums(&r));
    let s = main_process(&stats);
    assert!(s.evictions > 10_000, "the test must churn the local buffer: {s:?}");
}
