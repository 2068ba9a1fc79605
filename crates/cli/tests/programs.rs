//! Unmodified C programs (`tests/c/`) on remote memory with a local buffer of 10% of their
//! footprint: their results must be identical to a native run, and the statistics must show
//! that the memory really went to the brick and came back while the local buffer was honoured.
//!
//! Bricks on this host map their segments into the program by default (`shared_memory.rs`
//! covers that path); the tests here that have a twin there ask for the socket path with
//! `--no-shared-memory` (`SOCKET`), so that both paths stay tested.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Reach the embedded brick over its Unix socket, not by mapping its segment.
const SOCKET: &[&str] = &["--no-shared-memory"];

#[test]
fn sequential_and_random_passes() {
    require_root();
    let s = same_as_native_with("passes", &["48", "1", "3"], SOCKET);
    assert_used_remote_memory(busiest(&s));
}

#[test]
fn pages_of_one_word_come_back_exactly_across_passes_and_fork() {
    require_root();
    same_filled_pages_round_trip(SOCKET);
}

#[test]
fn pages_only_read_are_not_written_back() {
    require_root();
    only_changed_pages_are_written_back(SOCKET);
}

#[test]
fn several_threads_fault_on_the_same_pages() {
    require_root();
    let s = same_as_native_with("passes", &["48", "4", "2"], SOCKET);
    assert_used_remote_memory(busiest(&s));
}

#[test]
fn read_and_write_syscalls_on_remote_buffers() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8 path");
    let s = same_as_native("fileio", &[d, "32"]);
    assert_used_remote_memory(busiest(&s));
}

#[test]
fn realloc_across_the_threshold_and_aligned_allocators() {
    require_root();
    let s = same_as_native("realloc_grow", &["64"]);
    let p = busiest(&s);
    assert_used_remote_memory(p);
    // 4 MiB, 16 MiB, 64 MiB, the shrink, calloc twice and five aligned allocations at least.
    assert!(
        p.extra("window_allocations") > 5,
        "the large allocations did not land in the window: {p:?}"
    );
}

#[test]
fn anonymous_mmap_munmap_madvise_mremap() {
    require_root();
    let s = same_as_native("mmap_ops", &["48"]);
    let p = busiest(&s);
    assert_used_remote_memory(p);
    assert!(
        p.extra("events") > 0,
        "the raw madvise must reach the handler as a REMOVE event: {p:?}"
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
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "rackmem=present remote=1 faults>0"
    );
}

#[test]
fn brick_over_tcp() {
    require_root();
    let prog = program("passes");
    let (_brick, addr) = start_brick("tcp://127.0.0.1:0", "1GiB", "t");
    let args = ["32", "2", "2"];
    let n = native(&prog, &args);
    let (r, stats) = remote(&prog, &args, "10%", &["--brick", &addr, "--secret", "t"]);
    assert!(r.status.success(), "{}", show(&r));
    assert_eq!(checksums(&n), checksums(&r));
    assert_used_remote_memory(busiest(&stats));
}

#[test]
fn brick_over_tls() {
    require_root();
    let prog = program("passes");
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, key) = tls_files(dir.path());
    let (_brick, addr) = start_brick_with(
        "tls://127.0.0.1:0",
        "1GiB",
        "t",
        &["--tls-cert", &cert, "--tls-key", &key],
    );
    assert!(addr.starts_with("tls://"), "{addr}");
    let args = ["32", "2", "2"];
    let n = native(&prog, &args);
    let (r, stats) = remote(
        &prog,
        &args,
        "10%",
        &["--brick", &addr, "--secret", "t", "--tls-ca", &ca],
    );
    assert!(r.status.success(), "{}", show(&r));
    assert_eq!(checksums(&n), checksums(&r));
    assert_used_remote_memory(busiest(&stats));
    // Without the CA the run stops before the program starts, saying what is missing.
    let (r, _) = remote(&prog, &args, "10%", &["--brick", &addr, "--secret", "t"]);
    assert!(
        !r.status.success(),
        "ran against a tls:// brick without a CA: {}",
        show(&r)
    );
    assert!(String::from_utf8_lossy(&r.stderr).contains("--tls-ca"), "{}", show(&r));
}

#[test]
fn brick_over_unix_socket() {
    require_root();
    let prog = program("passes");
    let dir = tempfile::tempdir().expect("tempdir");
    let listen = format!("unix:{}", dir.path().join("b.sock").display());
    let (_brick, addr) = start_brick(&listen, "1GiB", "u");
    let args = ["32", "1", "2"];
    let n = native(&prog, &args);
    let (r, stats) = remote(
        &prog,
        &args,
        "10%",
        &["--brick", &addr, "--secret", "u", "--no-shared-memory"],
    );
    assert!(r.status.success(), "{}", show(&r));
    assert_eq!(checksums(&n), checksums(&r));
    let p = busiest(&stats);
    assert_used_remote_memory(p);
    assert_eq!(p.extra("bytes_fetched_shared"), 0, "asked for the socket: {p:?}");
}

#[test]
fn fork_then_exec() {
    require_root();
    let s = same_as_native("fork_exec", &["32"]);
    // The parent and the exec'd copy each had a runtime, a window and a local buffer of their own.
    let big: Vec<&ProcStats> = s.iter().filter(|p| p.footprint_bytes() >= 32 << 20).collect();
    assert!(
        big.len() >= 2,
        "expected statistics from the parent and the exec'd child: {s:?}"
    );
    big.into_iter().for_each(assert_used_remote_memory);
}

#[test]
fn forked_child_and_parent_each_see_their_own_copy() {
    require_root();
    let s = same_as_native_with("fork_rw", &["32", "3"], SOCKET);
    // Both the parent and the child wrote more than their buffers and read it back.
    assert!(
        s.len() >= 2,
        "expected statistics from the parent and the forked child: {s:?}"
    );
    s.iter().for_each(assert_used_remote_memory_forked);
}

/// A lazy fork (the default): the child inherits the window and keeps the parent's resident
/// pages, copy-on-write, instead of refetching them, and the parent writes nothing back at the
/// fork. `fork_rw` makes both sides read the parent's resident and remote pages and write
/// afterwards, each checking it sees only its own writes; checksums equal the native run's on
/// shared memory and over the socket. Evicting a page still shared with the other process makes
/// it private first (`evictions_shared`). The eager fork (`RACKMEM_FORK=eager`: window not
/// inherited, dirty pages written back, every page refetched) gives the same results and never
/// meets a shared page.
/// A child made without the C library's fork (the raw clone system call: no atfork hook runs,
/// so no runtime registers its window) must find no window: a touch of the parent's buffer
/// stops it with a signal. It must never read zeros where the parent's pages were remote (the
/// lazy fork inherits the window only for forks that run the hooks). Natively the child reads
/// the parent's data; the parent's own data is checked in every run.
#[test]
fn a_child_made_without_fork_hooks_has_no_window() {
    require_root();
    let prog = program("raw_fork");
    let n = native(&prog, &["32"]);
    assert!(n.status.success(), "native raw_fork: {}", show(&n));
    assert!(
        String::from_utf8_lossy(&n.stdout).contains("child: data"),
        "natively the child reads its parent's data: {}",
        show(&n)
    );
    for (fork, extra) in [("lazy", &[][..]), ("lazy", SOCKET), ("eager", &[][..])] {
        let mut c = Command::new(rackmem());
        c.env("RACKMEM_FORK", fork)
            .args(["run", "--local", "25%"])
            .args(extra)
            .arg("--")
            .arg(&prog)
            .arg("32");
        let o = run_with_deadline(c, LIMIT);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains("child: signal"),
            "{fork} fork {extra:?}: a child made without fork hooks must be stopped by a signal: {}",
            show(&o)
        );
        assert_eq!(
            checksums(&o),
            checksums(&n),
            "{fork} fork {extra:?}: the parent's data changed"
        );
    }
}

#[test]
fn a_lazily_forked_child_keeps_its_parents_resident_pages() {
    require_root();
    let prog = program("fork_rw");
    let args = ["32", "3"];
    let want = checksums(&native(&prog, &args));
    assert_eq!(want.len(), 2, "fork_rw natively printed no checksums");
    for (fork, extra) in [
        ("lazy", &[][..]),
        ("lazy", SOCKET),
        ("eager", &[][..]),
        ("eager", SOCKET),
    ] {
        let stats = build_dir().join(format!("stats-fork-{fork}-{}.jsonl", unique()));
        let mut c = Command::new(rackmem());
        c.env("RACKMEM_FORK", fork)
            .args(["run", "--local", "10%", "--stats-json"])
            .arg(&stats)
            .args(extra)
            .arg("--")
            .arg(&prog)
            .args(args);
        let o = run_with_deadline(c, LIMIT);
        assert!(o.status.success(), "fork_rw, {fork} fork {extra:?}: {}", show(&o));
        assert_eq!(
            checksums(&o),
            want,
            "fork_rw, {fork} fork {extra:?}: results differ from native"
        );
        let s = read_stats(&stats);
        assert!(s.len() >= 2, "expected the parent's and the child's statistics: {s:?}");
        s.iter().for_each(assert_used_remote_memory_forked);
        let shared: u64 = s.iter().map(|p| p.extra("evictions_shared")).sum();
        if fork == "lazy" {
            assert!(
                shared > 0,
                "no eviction met a page shared after the fork {extra:?}: {s:?}"
            );
        } else {
            assert_eq!(shared, 0, "an eager fork shares no page {extra:?}: {s:?}");
        }
    }
}

/// Signals sent to the process all the time, blocked by the program's threads (they may reach
/// only the runtime's) and then taken by the program's thread while it frees window blocks,
/// in a parent and in its forked child: no signal
/// may pass for a brick that stopped answering (PostgreSQL's backends stopped with "no
/// response within 10s" that way), and the data must be the native run's. On the defaults and
/// over the socket.
#[test]
fn signals_sent_to_the_program_never_pass_for_a_lost_brick() {
    require_root();
    for extra in [&[][..], SOCKET] {
        let s = same_as_native_with("signal_storm", &["48", "2", "fork"], extra);
        assert!(s.len() >= 2, "expected the parent's and the child's statistics: {s:?}");
        assert_used_remote_memory(busiest(&s));
    }
}

/// A lazily forked child starts its fault handlers only: its write-back and watchdog threads
/// start at its first write-back job, or once it has lived a watchdog tick (250 ms). Children
/// whose pages start going back to the brick at once, and after 400 ms idle (the threads then
/// started by the tick, before any write-back), each see the parent's memory as of their fork,
/// write back and refetch their own data, and leave the parent's alone: checksums equal the
/// native run's, on the defaults and over the socket.
#[test]
fn a_forked_childs_deferred_threads_start_at_its_first_write_back_or_after_a_tick() {
    require_root();
    for extra in [&[][..], SOCKET] {
        let s = same_as_native_with("fork_late", &["32", "0", "400"], extra);
        assert!(
            s.len() >= 3,
            "expected the parent's and two children's statistics {extra:?}: {s:?}"
        );
        // Each child writes its statistics when it exits, before the parent.
        for child in &s[..2] {
            assert!(
                child.bytes_written_back > 0,
                "a child wrote nothing back {extra:?}: {child:?}"
            );
            assert_used_remote_memory_forked(child);
        }
    }
}

#[test]
fn a_loop_of_forks_gives_each_child_the_memory_as_of_its_fork() {
    require_root();
    // Children that exit at once, then children that read and write 16 pages each: the parent
    // changes a page before every fork and checks its whole buffer at the end.
    for touch in ["0", "16"] {
        let s = same_as_native_with("fork_many", &["32", "12", touch], SOCKET);
        assert!(
            s.len() >= 13,
            "expected the parent's and 12 children's statistics: {s:?}"
        );
        assert_used_remote_memory(busiest(&s));
    }
}

/// A server forking per connection whose children all read the same pages of its memory while
/// the parent holds them remote (`fork_hot.c`; PostgreSQL's postmaster and its backends): the
/// first children fetch those pages from their lazy clones and report them, the parent takes
/// them back (`fork_hot.rs`), and the later children inherit them resident. The parent writes
/// pages its live children share, and grandchildren check theirs: the data must be the native
/// run's, on the defaults (mapped segments) and over the socket. At `--local 50%`: the parent
/// takes pages back into free room only, and at 10% four live children holding its pages as
/// inherited ones leave it none (the run's budget counts a page shared at fork in each process).
#[test]
fn a_forking_parent_takes_back_the_pages_its_children_fetch() {
    require_root();
    let prog = program("fork_hot");
    let args = ["8", "100", "64"];
    let want = checksums(&native(&prog, &args));
    assert_eq!(want.len(), 1, "fork_hot natively printed no checksum");
    for extra in [&[][..], SOCKET] {
        let (o, mut s) = remote(&prog, &args, "50%", extra);
        assert!(o.status.success(), "fork_hot {extra:?}: {}", show(&o));
        assert_eq!(checksums(&o), want, "fork_hot {extra:?}: results differ from native");
        assert!(
            s.len() >= 101,
            "expected the parent's and 100 children's statistics {extra:?}: {s:?}"
        );
        s.sort_by_key(|p| p.pid);
        let (parent, children) = s.split_first().expect("statistics");
        let reported: u64 = children.iter().map(|p| p.extra("fork_pages_reported")).sum();
        let back = parent.extra("fork_pages_taken_back");
        assert!(reported > 0, "no child reported a page it fetched {extra:?}: {s:?}");
        assert!(
            back > 0,
            "the parent took back none of the {reported} pages its children reported {extra:?}: {parent:?}"
        );
        let remote = |c: &[ProcStats]| c.iter().map(|p| p.extra("faults_remote")).sum::<u64>();
        let (first, last) = (remote(&children[..10]), remote(&children[children.len() - 10..]));
        assert!(
            last < first,
            "the last children faulted {last} times on remote pages, the first {first}: the pages taken back \
             should have been inherited {extra:?}: {s:?}"
        );
    }
}

#[test]
fn daemonized_child_keeps_using_remote_memory() {
    require_root();
    let prog = program("daemonize");
    let dir = tempfile::tempdir().expect("tempdir");
    let native_out = dir.path().join("native.txt");
    let remote_out = dir.path().join("remote.txt");
    // Natively the parent returns at once; the result appears when the daemon is done.
    native(&prog, &[native_out.to_str().expect("path"), "32"]);
    let (o, stats) = remote(&prog, &[remote_out.to_str().expect("path"), "32"], "10%", &[]);
    assert!(o.status.success(), "daemonize under rackmem: {}", show(&o));
    let wait = |p: &std::path::Path| {
        let start = Instant::now();
        while !p.exists() {
            assert!(
                start.elapsed() < LIMIT,
                "the daemon never wrote {}; rackmem run said: {}",
                p.display(),
                show(&o)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::fs::read_to_string(p).expect("result")
    };
    let (want, got) = (wait(&native_out), wait(&remote_out));
    assert!(want.starts_with("checksum="), "native result: {want}");
    assert_eq!(got, want, "the daemon computed something else on remote memory");
    // The daemon, whose parent (and the parent's runtime) exited first, faulted in and wrote
    // back pages of its own.
    assert!(
        stats.len() >= 2,
        "expected statistics from the parent and the daemon: {stats:?}"
    );
    assert_used_remote_memory(busiest(&stats));
}

#[test]
fn concurrent_writes_survive_eviction() {
    require_root();
    // A local buffer of 2% keeps every page moving in and out while three threads write to it.
    let prog = program("evict_race");
    let args = ["8", "3", "10"];
    let n = native(&prog, &args);
    let (r, stats) = remote(&prog, &args, "2%", SOCKET);
    assert!(r.status.success(), "evict_race under rackmem: {}", show(&r));
    assert_eq!(checksums(&n), checksums(&r));
    let s = busiest(&stats);
    assert!(s.evictions > 10_000, "the test must churn the local buffer: {s:?}");
}

/// Context switches of every thread of process `pid`, by thread id, with the thread's name.
fn switches(pid: u32) -> std::collections::BTreeMap<u32, (String, u64)> {
    let mut m = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return m;
    };
    for e in dir.flatten() {
        let Ok(tid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let name = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let n: u64 = status
            .lines()
            .filter(|l| l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary_ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        m.insert(tid, (name.trim().to_string(), n));
    }
    m
}

#[test]
fn an_idle_program_leaves_its_cpu_alone() {
    require_root();
    // While a program under rackmem computes on resident pages (here: waits on stdin), no thread
    // of rackmem may wake on a timer of its own faster than the watchdog's 4 Hz: not the fault
    // handler, not `rackmem run` waiting for the program, not the embedded brick's acceptor.
    // On a CPU shared with the program each such wake-up is time taken from it.
    use std::io::Write;
    let prog = program("idle");
    let run = |mut cmd: Command, sample: bool| -> (String, Vec<String>) {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut g = Guard::spawn(&mut cmd);
        let lines = lines_of(g.child().stdout.take().expect("stdout"));
        let ready = lines.recv_timeout(LIMIT).expect("the program said ready");
        let pid: u32 = ready
            .strip_prefix("ready pid=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {ready:?}"));
        let mut slow = Vec::new();
        // Write-back of the pages evicted while filling may still be under way at "ready": real
        // work, not a timer. A timer wakes its thread in every one-second window; work ends.
        for _ in 0..if sample { 5 } else { 0 } {
            slow.clear();
            let pids = [g.id(), pid];
            let before: Vec<_> = pids.iter().map(|&p| switches(p)).collect();
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs(1));
            let after: Vec<_> = pids.iter().map(|&p| switches(p)).collect();
            // The watchdog's 4 per second, and some slack for a machine that delays this thread.
            let allowed = (t0.elapsed().as_secs_f64() * 5.0).ceil() as u64 + 4;
            for (b, a) in before.iter().zip(&after) {
                for (tid, (name, n)) in a {
                    let woke = n - b.get(tid).map_or(0, |x| x.1);
                    if woke > allowed {
                        slow.push(format!("{name} (thread {tid}) woke {woke} times, allowed {allowed}"));
                    }
                }
            }
            if slow.is_empty() {
                break;
            }
        }
        g.child()
            .stdin
            .take()
            .expect("stdin")
            .write_all(b"go\n")
            .expect("go-ahead");
        let status = g.wait_until(LIMIT).expect("the program finished");
        let rest: Vec<String> = lines.iter().collect();
        assert!(status.success(), "{cmd:?}: {status:?} {rest:?}");
        (rest.join("\n"), slow)
    };
    let (want, _) = run(
        {
            let mut c = Command::new(&prog);
            c.arg("32");
            c
        },
        false,
    );
    let (got, slow) = run(
        {
            let mut c = Command::new(rackmem());
            c.args(["run", "--local", "50%", "--"]).arg(&prog).arg("32");
            c
        },
        true,
    );
    assert!(want.starts_with("checksum="), "{want}");
    assert_eq!(got, want, "the buffer came back different after idling");
    assert!(slow.is_empty(), "threads woke while the program idled: {slow:?}");
}

/// Runs `hot_updates` natively with the number of updates a run under rackmem reported (in
/// `out`, one `updates=`/`checksum=` pair per process, in any order) and checks each checksum.
fn same_updates_as_native(out: &std::process::Output) {
    let prog = program("hot_updates");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let counts: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("updates=")).collect();
    assert!(!counts.is_empty(), "hot_updates reported no updates: {}", show(out));
    let mut want: Vec<String> = Vec::new();
    for (n, args) in counts
        .iter()
        .zip(text.lines().filter(|l| l.starts_with("hot=")).map(|l| &l[4..]))
    {
        let (mib, hot) = args.split_once(',').expect("hot=MiB,PCT");
        want.extend(checksums(&native(&prog, &[mib, hot, "0", n])));
    }
    want.sort();
    assert_eq!(
        checksums(out),
        want,
        "results under rackmem differ from native runs of as many updates"
    );
}

#[test]
fn a_program_that_outruns_its_link_is_told_once_what_local_buffer_fits() {
    require_root();
    // Two processes of one run update a hot 40% of 64 MiB at random for 8 s with 10% local:
    // nearly every update faults. One notice for the run, naming a local buffer that holds the
    // hot part (the estimate comes from the pages re-fetched, so somewhat above 40%).
    let prog = program("hot_updates");
    let p = prog.display();
    let script = format!("echo hot=64,40; {p} 64 40 8 & echo hot=64,40; {p} 64 40 8; wait");
    let mut c = Command::new(rackmem());
    c.args(["run", "--local", "10%", "--", "sh", "-c", &script]);
    let o = run_with_deadline(c, LIMIT);
    assert!(o.status.success(), "{}", show(&o));
    same_updates_as_native(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    let notices: Vec<&str> = err.lines().filter(|l| l.contains("outruns its link")).collect();
    assert_eq!(
        notices.len(),
        1,
        "one notice per rackmem run, not per process: {}",
        show(&o)
    );
    let pct: u32 = notices[0]
        .split("--local ")
        .nth(1)
        .and_then(|s| s.split('%').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("the notice names no --local N%: {}", notices[0]));
    assert!(
        (40..=70).contains(&pct),
        "a working set of 40% of the footprint needs --local of 40% or a little more, not {pct}%: {}",
        notices[0]
    );
    assert!(
        notices[0].contains("faults/s"),
        "the notice gives the fault rate: {}",
        notices[0]
    );

    // A hot part of 5% fits a local buffer of 10%: after the first touches, nothing to say.
    let mut c = Command::new(rackmem());
    c.args(["run", "--local", "10%", "--", "sh", "-c"])
        .arg(format!("echo hot=64,5; {p} 64 5 7"));
    let o = run_with_deadline(c, LIMIT);
    assert!(o.status.success(), "{}", show(&o));
    same_updates_as_native(&o);
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("outruns its link"),
        "a program whose working set fits its local buffer was told it outruns its link: {}",
        show(&o)
    );
}

/// Reserve-then-commit as JVMs, V8 and mimalloc manage their heaps (`tests/c/reserve_commit.c`):
/// PROT_NONE reservations with and without hints, commits by mprotect and MAP_FIXED, decommits,
/// a file mapped into a reservation, read-only data through evictions, SIGSEGV on PROT_NONE
/// pages and fork. Same checksums and the same SIGSEGVs as natively; the committed memory went
/// to the brick. At 25% local: pages that are not read-write stay resident (UFFDIO_MOVE needs
/// equal protections on both sides) and count against the local buffer, so the buffer must hold
/// the program's 16 MiB read-only range; the read-write pages make room for it.
#[test]
fn reserve_then_commit_heaps() {
    require_root();
    let prog = program("reserve_commit");
    let n = native(&prog, &["48"]);
    let (r, stats) = remote(&prog, &["48"], "25%", &[]);
    assert!(r.status.success(), "reserve_commit under rackmem failed: {}", show(&r));
    assert_eq!(
        checksums(&n),
        checksums(&r),
        "results under rackmem differ from the native run"
    );
    let segv = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.starts_with("segv faults="))
            .map(str::to_string)
    };
    assert!(
        segv(&n).is_some(),
        "reserve_commit printed no SIGSEGV count: {}",
        show(&n)
    );
    assert_eq!(
        segv(&n),
        segv(&r),
        "SIGSEGVs on PROT_NONE pages differ from the native run"
    );
    assert_used_remote_memory_at(busiest(&stats), 25);
}

/// `--local 50%` is half of the peak footprint: after the program frees an 80 MiB scratch array,
/// its 48 MiB kept array still fits the 64 MiB local buffer, and passes over it stop reading
/// from the brick. (When the budget followed the footprint now, it fell to 24 MiB and every pass
/// read the whole array again.)
#[test]
fn freeing_memory_does_not_shrink_the_local_buffer() {
    require_root();
    let prog = program("budget_peak");
    let args = ["80", "48", "4"];
    let native = native(&prog, &args);
    let (o, stats) = remote(&prog, &args, "50%", &[]);
    assert!(o.status.success(), "budget_peak failed: {}", show(&o));
    assert_eq!(
        checksums(&o),
        checksums(&native),
        "the kept array differs from the native run"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let field = |k: &str| -> u64 {
        out.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("budget_peak printed no {k}: {out}"))
    };
    let s = busiest(&stats);
    assert_used_remote_memory_at(s, 50);
    let peak = s.extra("peak_footprint_bytes");
    assert!(
        peak >= 128 << 20,
        "the peak footprint should count both arrays (128 MiB), statistics say {peak} bytes"
    );
    assert_eq!(
        field("budget_mib="),
        (peak / 2) >> 20,
        "the budget after the free should be half the peak footprint"
    );
    let read = field("read_after_first_pass=");
    assert!(
        read < (48 << 20) / 20,
        "three passes over a 48 MiB array that fits the 64 MiB local buffer read {read} bytes from the brick \
         (a budget of half the footprint now, 24 MiB, reads the whole array again at every pass)"
    );
}

/// Pages evicted earlier that come back in random order while the local buffer has room (the
/// program freed a larger array) are read around: a fault takes the remote pages after it too,
/// as Linux's swap reads a cluster around a fault. `random_reread` reads one word of each of the
/// 12,288 pages of a 48 MiB array in random order after freeing 64 MiB at 50% local (the whole
/// array fits the 56 MiB buffer again): with the default read-around far fewer faults than pages,
/// with `RACKMEM_READ_AROUND=1` (the faulting page alone) about one fault per page. Both runs must
/// read what the native run reads, on the mapped segment and over the socket.
#[test]
fn pages_coming_back_at_random_into_free_room_are_read_around() {
    require_root();
    let prog = program("random_reread");
    let args = ["64", "48"];
    let want = checksums(&native(&prog, &args));
    let faults = |read_around: Option<&str>, extra: &[&str]| -> (u64, u64) {
        let stats = build_dir().join(format!("stats-random_reread-{}.jsonl", unique()));
        let mut c = Command::new(rackmem());
        c.args(["run", "--local", "50%", "--stats-json"])
            .arg(&stats)
            .args(extra)
            .arg("--")
            .arg(&prog)
            .args(args);
        c.env_remove("RACKMEM_READ_AROUND");
        if let Some(v) = read_around {
            c.env("RACKMEM_READ_AROUND", v);
        }
        let o = run_with_deadline(c, LIMIT);
        assert!(o.status.success(), "random_reread failed: {}", show(&o));
        assert_eq!(checksums(&o), want, "the array read back differs from the native run");
        assert_used_remote_memory_at(busiest(&read_stats(&stats)), 50);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let field = |k: &str| -> u64 {
            out.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("random_reread printed no {k}: {out}"))
        };
        (field("pages="), field("reread_faults="))
    };
    for extra in [&[][..], SOCKET] {
        let (pages, around) = faults(None, extra);
        assert!(
            around * 3 < pages,
            "with read-around ({extra:?}), {around} faults brought back {pages} pages in random order into free room: \
             expected under a third as many faults as pages"
        );
        let (pages, alone) = faults(Some("1"), extra);
        assert!(
            alone * 10 >= pages * 9,
            "without read-around ({extra:?}), {alone} faults brought back {pages} pages: expected about one a page"
        );
    }
}

/// Runs `rackmem run --local 25% -- PROG ARGS` and returns its standard error, after checking
/// that the program's output is the native run's.
fn stderr_of_unreachable(prog: &str, args: &[&str], installed_by: &str) -> String {
    let path = std::path::Path::new(prog);
    assert!(
        path.exists(),
        "this test runs {prog}, which {installed_by} installs: run ./scripts/programs.sh (as root)"
    );
    let native = native(path, args);
    let mut c = Command::new(rackmem());
    c.args(["run", "--local", "25%", "--"]).arg(prog).args(args);
    let o = run_with_deadline(c, Duration::from_secs(60));
    assert!(o.status.success(), "{prog} under rackmem failed: {}", show(&o));
    assert_eq!(o.stdout, native.stdout, "{prog}: output differs from the native run");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A static program cannot load the runtime: the user is told at start why its memory stays
/// local, and at exit how much that was (busybox's dd with a 64 MiB block holds at least that).
#[test]
fn a_static_program_is_told_its_memory_stays_local_and_how_much() {
    let err = stderr_of_unreachable(
        "/bin/busybox",
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1", "status=none"],
        "Debian's busybox-static (scripts/programs.sh)",
    );
    assert_eq!(
        err.matches("is statically linked: the runtime is loaded by the dynamic loader")
            .count(),
        1,
        "one notice at start: {err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("resident, all of it local"))
        .unwrap_or_else(|| panic!("no notice at exit of how much memory stayed local: {err}"));
    let mib: f64 = line
        .split("held up to ")
        .nth(1)
        .and_then(|r| r.split(" MiB").next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("the exit notice gives no size in MiB: {line}"));
    assert!(
        mib >= 64.0,
        "dd with a 64 MiB block held {mib} MiB by the notice: {line}"
    );
}

/// A Go program maps its heap itself: told once, naming Go.
#[test]
fn a_go_program_is_told_its_heap_stays_local() {
    let err = stderr_of_unreachable(
        "/usr/bin/etcdctl",
        &["version"],
        "Debian's etcd-client (scripts/programs.sh)",
    );
    assert_eq!(
        err.matches("is a Go program: the Go runtime").count(),
        1,
        "one notice at start: {err}"
    );
    assert!(err.contains("all of it local (it is a Go program)"), "{err}");
}

/// A dynamically linked program gets no such notice.
#[test]
fn a_dynamic_program_gets_no_notice() {
    let err = stderr_of_unreachable("/bin/ls", &["/"], "Debian's coreutils");
    assert!(!err.contains("notice"), "ls is dynamically linked: {err}");
}

/// Shared anonymous memory keeps its meaning (a child's writes reach the parent) and stays
/// local: the user is told once, with its size, and the statistics count it.
#[test]
fn shared_memory_stays_local_and_the_user_is_told() {
    require_root();
    let prog = program("shared_anon");
    let args = ["64", "64"];
    let n = native(&prog, &args);
    let (o, stats) = remote(&prog, &args, "25%", &[]);
    assert!(o.status.success(), "shared_anon under rackmem failed: {}", show(&o));
    assert_eq!(checksums(&o), checksums(&n), "results differ from the native run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("maps shared memory (MAP_SHARED|MAP_ANONYMOUS, 64 MiB here): shared mappings stay local")
            .count(),
        1,
        "one notice, naming the size: {err}"
    );
    let parent = busiest(&stats);
    assert_used_remote_memory_at(parent, 25);
    assert_eq!(
        parent.extra("shared_local_bytes"),
        64 << 20,
        "the statistics count the shared memory: {parent:?}"
    );
}

/// Read-only and `PROT_NONE` window pages are evicted like read-write ones (through a staging
/// slot given their protection) and come back intact, read-only and after being made
/// read-write again; the local buffer holds its budget; the statistics count them.
#[test]
fn read_only_and_prot_none_pages_are_evicted_and_come_back() {
    require_root();
    for extra in [&[][..], SOCKET] {
        let s = same_as_native_with("protected_evict", &["32"], extra);
        let p = busiest(&s);
        assert_used_remote_memory(p);
        assert!(
            p.extra("evictions_protected") > 0,
            "no page that was not read-write was evicted ({extra:?}): {p:?}"
        );
    }
}
