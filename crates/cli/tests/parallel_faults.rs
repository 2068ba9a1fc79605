//! Several threads of one program faulting at once: with the default single handler, and with
//! several handlers forced (`--handlers 2`: faults in flight at once): threads faulting on their own pages and on
//! the same pages, over shared memory and over a Unix socket, a fork while they fault, and a brick
//! dying while several faults wait on it. Results are checked against native runs.

mod common;
use common::*;
use rackmem_runtime::sys::EXIT_BRICK_LOST;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `parallel_faults` with 2 and 4 threads, on disjoint and on the same pages, at 25% local
/// with `extra` options; each run must print the native run's checksum and report its faults in
/// flight.
fn threads_fault_at_once(extra: &[&str]) {
    let prog = program("parallel_faults");
    for (threads, mode) in [("2", "disjoint"), ("4", "disjoint"), ("2", "shared"), ("4", "shared")] {
        let args = ["32", threads, mode, "200000"];
        let n = native(&prog, &args);
        assert!(n.status.success(), "native parallel_faults {args:?}: {}", show(&n));
        let (r, stats) = remote(&prog, &args, "25%", extra);
        assert!(
            r.status.success(),
            "parallel_faults {args:?} under rackmem: {}",
            show(&r)
        );
        assert!(!checksums(&n).is_empty(), "no checksum printed: {}", show(&n));
        assert_eq!(
            checksums(&n),
            checksums(&r),
            "parallel_faults {args:?} {extra:?}: results under rackmem differ from the native run"
        );
        let s = busiest(&stats);
        assert_used_remote_memory_at(s, 25);
        let mean = s.raw["faults_in_flight_mean"].as_f64().unwrap_or(0.0);
        let max = s.extra("faults_in_flight_max");
        assert!(
            mean >= 1.0 && max >= 1 && (max as f64) >= mean,
            "faults in flight not reported (mean {mean}, max {max}): {s:?}"
        );
        assert!(s.extra("fault_handlers") >= 1, "fault handlers not reported: {s:?}");
    }
}

#[test]
fn two_and_four_threads_fault_on_their_own_and_the_same_pages() {
    require_root();
    threads_fault_at_once(&[]);
}

#[test]
fn two_and_four_threads_fault_on_shared_memory_with_two_handlers_forced() {
    require_root();
    threads_fault_at_once(&["--handlers", "2"]);
}

#[test]
fn two_and_four_threads_fault_at_once_over_a_unix_socket_brick() {
    require_root();
    threads_fault_at_once(&["--no-shared-memory", "--handlers", "2"]);
}

#[test]
fn a_fork_while_threads_fault_gives_the_child_the_parents_pages() {
    require_root();
    // Every handler parks for the fork while four threads fault on the same pages; each child
    // verifies a buffer whose pages live on the brick, and the parent's result is the native one.
    let prog = program("parallel_faults");
    let args = ["32", "4", "shared", "400000", "3"];
    let n = native(&prog, &args);
    assert!(n.status.success(), "native: {}", show(&n));
    for extra in [&["--handlers", "2"][..], &["--no-shared-memory", "--handlers", "2"][..]] {
        let (r, stats) = remote(&prog, &args, "25%", extra);
        assert!(r.status.success(), "parallel_faults {args:?} {extra:?}: {}", show(&r));
        assert!(
            String::from_utf8_lossy(&r.stdout).contains("forks=3"),
            "three forks did not all verify their pages: {}",
            show(&r)
        );
        assert_eq!(checksums(&n), checksums(&r), "{extra:?}: results differ from native");
        assert!(busiest(&stats).faults > 0, "no faults: {stats:?}");
    }
}

#[test]
fn a_brick_dying_with_several_faults_in_flight_stops_the_program() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let prog = program("parallel_faults");
    let (mut brick, addr) = start_brick(
        &format!("unix:{}", dir.path().join("b.sock").display()),
        "1GiB",
        "s3cret",
    );
    let mut cmd = Command::new(rackmem());
    // Over the link (a mapped segment outlives its brick's process); four threads keep several
    // faults waiting on the brick when it dies.
    cmd.args(["run", "--brick", &addr, "--secret", "s3cret", "--local", "10%"])
        .args(["--no-shared-memory", "--handlers", "2", "--"])
        .arg(&prog)
        .args(["64", "4", "shared", "1000000000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut run = Guard::spawn(&mut cmd);
    let stdout = lines_of(run.child().stdout.take().expect("stdout"));
    let stderr = lines_of(run.child().stderr.take().expect("stderr"));
    match stdout.recv_timeout(LIMIT) {
        Ok(l) if l == "running" => {}
        other => {
            run.kill_group();
            panic!("parallel_faults did not start its threads: {other:?}");
        }
    }
    // Let the threads fault for a while (the fill already pushed most pages to the brick).
    std::thread::sleep(Duration::from_millis(500));
    brick.kill_group();
    let _ = brick.wait_until(Duration::from_secs(10));
    let limit = Duration::from_secs(30);
    let Some(status) = run.wait_until(limit) else {
        run.kill_group();
        panic!("the program still ran {limit:?} after its brick died with faults in flight: it must stop, not hang");
    };
    let mut err = Vec::new();
    let grace = Instant::now() + Duration::from_secs(5);
    while let Ok(l) = stderr.recv_timeout(grace.saturating_duration_since(Instant::now())) {
        err.push(l);
    }
    let err = err.join("\n");
    assert_eq!(
        status.code(),
        Some(EXIT_BRICK_LOST),
        "exit status {EXIT_BRICK_LOST} means remote memory lost; got {status:?}; stderr:\n{err}"
    );
    assert!(
        err.contains("lost memory brick") && err.contains(&addr),
        "the error must say the brick {addr} was lost:\n{err}"
    );
}
