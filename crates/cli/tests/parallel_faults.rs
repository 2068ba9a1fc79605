//! Several threads of one program faulting at once: with the default single handler (which
//! pipelines the brick reads of queued faults over a link), and with several handlers forced
//! (`--handlers 2`: faults in flight at once): threads faulting on their own pages and on
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

/// Threads faulting over a link with one handler that pipelines (the default `--pipeline`): the
/// reads of faults queued behind the one being served go out before it waits on the brick, and
/// are collected in their turn. Results equal the native run's, and the early reads were sent
/// and used (the path ran, and did not just fall back to one fault at a time), and `--stats`
/// shows the same counts.
fn threads_fault_with_reads_pipelined(brick: &[&str]) {
    let prog = program("parallel_faults");
    for (threads, mode) in [("2", "disjoint"), ("4", "shared")] {
        let args = ["32", threads, mode, "200000"];
        let n = native(&prog, &args);
        assert!(n.status.success(), "native parallel_faults {args:?}: {}", show(&n));
        let extra: Vec<&str> = brick.iter().copied().chain(["--handlers", "1", "--stats"]).collect();
        let (r, stats) = remote(&prog, &args, "25%", &extra);
        assert!(r.status.success(), "parallel_faults {args:?} {extra:?}: {}", show(&r));
        assert!(!checksums(&n).is_empty(), "no checksum printed: {}", show(&n));
        assert_eq!(
            checksums(&n),
            checksums(&r),
            "parallel_faults {args:?} {extra:?}: results with pipelined reads differ from the native run"
        );
        let s = busiest(&stats);
        assert_used_remote_memory_at(s, 25);
        let (sent, used) = (s.extra("reads_early"), s.extra("reads_early_used"));
        assert!(
            sent > 0 && used > 0 && used <= sent,
            "{threads} threads over {brick:?}: no early reads pipelined (sent {sent}, used {used}): {s:?}"
        );
        let table = String::from_utf8_lossy(&r.stderr);
        assert!(
            table.contains("early reads used") && table.contains(&format!(" {used} of {sent} ")),
            "--stats does not show the early reads ({used} of {sent}): {table}"
        );
        let max = s.extra("faults_in_flight_max");
        assert!(
            max >= 2,
            "several threads, one pipelining handler: at most {max} fault in flight: {s:?}"
        );
    }
}

#[test]
fn threads_fault_with_reads_pipelined_over_a_unix_socket_brick() {
    require_root();
    threads_fault_with_reads_pipelined(&["--no-shared-memory"]);
}

#[test]
fn threads_fault_with_reads_pipelined_over_a_tcp_brick() {
    require_root();
    let (_brick, addr) = start_brick("tcp://127.0.0.1:0", "1GiB", "s3cret");
    threads_fault_with_reads_pipelined(&["--brick", &addr, "--secret", "s3cret"]);
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
    brick_dies_with_faults_in_flight(&["--handlers", "2", "--pipeline", "0"]);
}

/// One handler keeps the reads of several queued faults on the link (the default pipeline) when
/// the brick dies: the program stops with exit 112 and says which brick, never installing a zero
/// page for a read that got no answer.
#[test]
fn a_brick_dying_with_reads_pipelined_stops_the_program() {
    require_root();
    brick_dies_with_faults_in_flight(&["--handlers", "1"]);
}

fn brick_dies_with_faults_in_flight(extra: &[&str]) {
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
        .arg("--no-shared-memory")
        .args(extra)
        .arg("--")
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

/// A swap file switched on for one test and off again when dropped.
struct SwapFile(std::path::PathBuf);

impl SwapFile {
    fn on(mib: u64) -> SwapFile {
        let path = build_dir().join(format!("swapfile-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let sh = |cmd: &str, args: &[&str]| {
            let o = Command::new(cmd)
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("this test needs `{cmd}` (util-linux) to make swap: {e}"));
            assert!(
                o.status.success(),
                "this test needs swap it can switch on (root, a file system that holds swap files): {cmd} {args:?}: {}",
                show(&o)
            );
        };
        let p = path.to_str().expect("build directory path is UTF-8");
        sh("fallocate", &["-l", &format!("{mib}M"), p]);
        sh("chmod", &["600", p]);
        sh("mkswap", &[p]);
        // Lowest priority: a zram device another test switches on is used first.
        sh("swapon", &["-p", "-5", p]);
        SwapFile(path)
    }
}

impl SwapFile {
    /// Whether the kernel still lists this file as swap.
    fn listed(&self) -> bool {
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        let p = self.0.to_string_lossy();
        swaps.lines().any(|l| l.split_whitespace().next() == Some(&*p))
    }
}

impl Drop for SwapFile {
    /// `swapoff` reads every swapped page back first and can fail while memory is short
    /// (`ENOMEM`) or be interrupted; a swap file left on changes every later test and benchmark
    /// on the machine (the peers' cgroups swap to it), so retry, and fail the test if it stays on.
    fn drop(&mut self) {
        let mut last = String::new();
        for attempt in 0..20 {
            if !self.listed() {
                break;
            }
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(500));
            }
            match Command::new("swapoff").arg(&self.0).output() {
                Ok(o) => last = show(&o),
                Err(e) => last = format!("cannot run swapoff: {e}"),
            }
        }
        let still_on = self.listed();
        if !still_on {
            let _ = std::fs::remove_file(&self.0);
        }
        if still_on {
            let msg = format!(
                "the test's swap file {} is still switched on after 20 tries of swapoff; switch it \
                 off by hand (`swapoff {}`) before running more tests; last attempt: {last}",
                self.0.display(),
                self.0.display()
            );
            if std::thread::panicking() {
                eprintln!("{msg}");
            } else {
                panic!("{msg}");
            }
        }
    }
}

/// The kernel's own reclaim takes pages of the program (window pages and the runtime's staging
/// slots) to swap while its threads fault: `UFFDIO_MOVE` of a swapped-out page can report it as
/// not moved when it did move (Linux 6.18), and a runtime that believed it lost that page (wrong
/// checksums under load, found with this workload). A helper asks the kernel to reclaim the
/// program's memory every 20 ms (`MADV_PAGEOUT`, what memory pressure does); the results must
/// equal the native run's, and the program must really have had pages swapped out.
#[test]
fn pages_the_kernel_swaps_out_while_threads_fault_come_back_exactly() {
    require_root();
    let _swap = SwapFile::on(256);
    let prog = program("parallel_faults");
    let pageout = program("pageout");
    let args = ["32", "4", "shared", "600000"];
    let n = native(&prog, &args);
    assert!(n.status.success(), "native parallel_faults {args:?}: {}", show(&n));
    // Over a socket with two handlers (where it was found) twice, and on the defaults.
    let socket = &["--no-shared-memory", "--handlers", "2"][..];
    for extra in [socket, socket, &[][..]] {
        let reclaim = Command::new(&pageout)
            .arg(&prog)
            .arg("60")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start pageout");
        let (r, stats) = remote(&prog, &args, "25%", extra);
        // SIGTERM: it stops and says how much of the program it saw in swap.
        let _ = Command::new("kill").arg(reclaim.id().to_string()).status();
        let o = reclaim.wait_with_output().expect("pageout");
        let swapped_kb: u64 = String::from_utf8_lossy(&o.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("swapped_kb_max=")?.trim().parse().ok())
            .unwrap_or_else(|| panic!("pageout printed no figure: {}", show(&o)));
        assert!(
            r.status.success(),
            "parallel_faults {args:?} {extra:?} under rackmem: {}",
            show(&r)
        );
        let s = busiest(&stats);
        assert_eq!(
            checksums(&n),
            checksums(&r),
            "parallel_faults {args:?} {extra:?} with its pages reclaimed: results differ from the native run \
             (moves recounted {})",
            s.extra("moves_recounted")
        );
        assert_used_remote_memory_at(s, 25);
        assert!(
            swapped_kb > 0,
            "the kernel swapped none of the program's memory out {extra:?}, so this run proved nothing: {}",
            show(&o)
        );
    }
}

/// Load control (`docs/architecture.md`, "Load control"): two threads whose working sets fit the
/// local buffer one at a time but not together, at 50% local. The results equal the native
/// run's, and load control engaged (faults were held while the other thread was favoured); every
/// hold ended within its slice (500 ms) and a stall.
#[test]
fn two_threads_whose_working_sets_fit_one_at_a_time_are_served_in_turn() {
    require_root();
    let prog = program("thrash_threads");
    let args = ["16", "2000000", "plain"];
    let n = native(&prog, &args);
    assert!(!checksums(&n).is_empty(), "no checksum printed: {}", show(&n));
    for extra in [&[][..], &["--no-load-control"][..]] {
        let (r, stats) = remote(&prog, &args, "50%", extra);
        assert!(r.status.success(), "thrash_threads {args:?} {extra:?}: {}", show(&r));
        assert_eq!(
            checksums(&n),
            checksums(&r),
            "thrash_threads {args:?} {extra:?}: results differ from the native run"
        );
        let s = busiest(&stats);
        assert_used_remote_memory_at(s, 50);
        let holds = s.extra("load_holds");
        if extra.is_empty() {
            assert!(
                holds > 0,
                "two threads refaulting on each other's pages, and load control never held a fault: {s:?}"
            );
            let longest = s.extra("load_hold_max_ns");
            assert!(
                longest <= 2_000_000_000,
                "a fault was held {longest} ns, past its bound (a 500 ms slice; 2 s allows for a loaded machine): {s:?}"
            );
        } else {
            assert_eq!(holds, 0, "--no-load-control held faults: {s:?}");
        }
    }
}

/// Load control's other side: two threads that refault one working set together (both update
/// anywhere in one buffer, as a server's workers do on one table) thrash the local buffer as
/// much, but favouring one would not shrink what must be resident, only hold the other's work
/// for a slice: load control stays off (the build before this rule held 4-7 faults for up to
/// 500 ms in this run). The results equal the native run's.
#[test]
fn threads_that_share_one_working_set_are_never_held() {
    require_root();
    let prog = program("parallel_faults");
    let args = ["64", "2", "shared", "400000"];
    let n = native(&prog, &args);
    assert!(!checksums(&n).is_empty(), "no checksum printed: {}", show(&n));
    let (r, stats) = remote(&prog, &args, "50%", &[]);
    assert!(r.status.success(), "parallel_faults {args:?}: {}", show(&r));
    assert_eq!(
        checksums(&n),
        checksums(&r),
        "parallel_faults {args:?}: results differ from the native run"
    );
    let s = busiest(&stats);
    assert_used_remote_memory_at(s, 50);
    assert!(
        s.extra("faults") >= 50_000,
        "too few faults to judge load control (the buffer did not thrash): {s:?}"
    );
    assert_eq!(
        s.extra("load_holds"),
        0,
        "load control held a thread that shares its working set with the favoured one: {s:?}"
    );
}

/// The hazard of load control: a held thread may hold a lock the favoured thread needs. Here
/// each thread makes its updates with a mutex shared by both held, faulting while it holds
/// it. The program finishes (within the test's deadline: no hang) with the native results.
#[test]
fn a_thread_faulting_while_it_holds_a_mutex_the_other_needs_does_not_hang_load_control() {
    require_root();
    let prog = program("thrash_threads");
    let args = ["16", "200000", "mutex"];
    let n = native(&prog, &args);
    assert!(!checksums(&n).is_empty(), "no checksum printed: {}", show(&n));
    let (r, stats) = remote(&prog, &args, "50%", &[]);
    assert!(r.status.success(), "thrash_threads {args:?}: {}", show(&r));
    assert_eq!(
        checksums(&n),
        checksums(&r),
        "thrash_threads {args:?}: results under load control differ from the native run"
    );
    assert_used_remote_memory_at(busiest(&stats), 50);
}
