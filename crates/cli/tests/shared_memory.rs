//! Shared memory, the default for bricks on this host: unmodified programs whose segments are
//! mapped from the embedded brick or a `unix:` brick, with no option asking for it. Results
//! must equal the native run's, the pages must really have gone to the brick and come back by
//! memory copy, and a brick reached over TCP falls back to its link (`--shared-memory`, which
//! makes a failure to map an error, is still accepted). `--cpus` confines the program (and
//! with it the fault handler) to CPUs. The socket path is covered by the twins of these tests
//! in `programs.rs`, which ask for it with `--no-shared-memory`.

mod common;
use common::*;

#[test]
fn threads_passing_over_shared_memory_see_their_data() {
    require_root();
    let s = same_as_native("passes", &["48", "4", "2"]);
    let p = busiest(&s);
    assert_used_remote_memory(p);
    assert_eq!(
        p.extra("bytes_fetched_shared"),
        p.bytes_fetched + p.extra("bytes_prefetched"),
        "every fetch must come by memory copy: {p:?}"
    );
    let by_copy = p.extra("bytes_written_shared");
    assert!(
        by_copy > 0 && by_copy <= p.bytes_written_back,
        "write-backs by memory copy are part of all write-backs: {p:?}"
    );
}

#[test]
fn concurrent_writes_survive_eviction_over_shared_memory() {
    require_root();
    // A local buffer of 2% keeps every page moving in and out while three threads write to it.
    let prog = program("evict_race");
    let args = ["8", "3", "10"];
    let n = native(&prog, &args);
    let (r, stats) = remote(&prog, &args, "2%", &[]);
    assert!(r.status.success(), "evict_race under rackmem: {}", show(&r));
    assert_eq!(checksums(&n), checksums(&r));
    let s = busiest(&stats);
    assert!(s.evictions > 10_000, "the test must churn the local buffer: {s:?}");
    assert!(s.extra("bytes_fetched_shared") > 0, "{s:?}");
}

#[test]
fn pages_only_read_are_not_written_back_to_a_shared_segment() {
    require_root();
    only_changed_pages_are_written_back(&[]);
}

#[test]
fn pages_of_one_word_come_back_exactly_from_a_shared_segment() {
    require_root();
    same_filled_pages_round_trip(&[]);
}

#[test]
fn forked_child_gets_a_copy_of_a_shared_segment() {
    require_root();
    let s = same_as_native("fork_rw", &["32", "3"]);
    assert!(s.len() >= 2, "expected the parent's and the child's statistics: {s:?}");
    for p in &s {
        assert_used_remote_memory_forked(p);
    }
    // The parent reads its mapped segment; the lazily forked child reads its lazy clone over
    // its link (docs/architecture.md, "fork").
    assert!(s.iter().any(|p| p.extra("bytes_fetched_shared") > 0), "{s:?}");
}

/// Each child's clone is a lazy clone of the parent's memory file (CLONE_LAZY,
/// docs/architecture.md, "fork"): every child must see the parent's memory as of its own fork,
/// and the parent none of the children's writes.
#[test]
fn a_loop_of_forks_over_shared_memory_gives_each_child_the_memory_as_of_its_fork() {
    require_root();
    for touch in ["0", "16"] {
        let s = same_as_native("fork_many", &["32", "12", touch]);
        assert!(
            s.len() >= 13,
            "expected the parent's and 12 children's statistics: {s:?}"
        );
        assert_used_remote_memory(busiest(&s));
        // The parent reads its mapped segment.
        assert!(
            s.iter().any(|p| p.extra("bytes_fetched_shared") > 0),
            "no process read a mapped segment: {s:?}"
        );
    }
}

/// Lazy clones (CLONE_LAZY): four children of one parent read their fork-time views while the
/// parent overwrites every page twice under a 10% local buffer, so its write-backs land on
/// pages the children still share; a child forks a grandchild (a clone of a lazy clone). Every
/// page of every view is checked; the output must equal the native run's. The same over a Unix
/// socket, where a clone shares the pool's chunks copy-on-write. (A parent that exits while its
/// child still shares its pages: `programs::daemonized_child_keeps_using_remote_memory`.)
#[test]
fn children_keep_their_fork_time_view_while_the_parent_overwrites_the_pages_they_share() {
    require_root();
    for extra in [&[][..], &["--no-shared-memory"][..]] {
        let s = same_as_native_with("fork_cow", &["32", "4"], extra);
        assert!(
            s.len() >= 6,
            "expected the statistics of the parent, 4 children and a grandchild ({extra:?}): {s:?}"
        );
        let parent = s.iter().max_by_key(|p| p.bytes_written_back).expect("statistics");
        assert!(
            parent.bytes_written_back >= 32 << 20,
            "the parent must write back over the pages its children share ({extra:?}): {parent:?}"
        );
    }
}

#[test]
fn a_program_in_a_memory_cgroup_the_size_of_its_local_buffer_runs_on_shared_memory() {
    require_root();
    let cgroups = rackmem_bench::swap::detect_cgroups()
        .unwrap_or_else(|e| panic!("this test needs a memory cgroup controller (cgroup v1 or v2 with memory): {e}"));
    // Linux charges a page of shared memory to whoever allocates it. A program in a memory
    // cgroup of 48 MiB with a 96 MiB buffer on a brick (outside the cgroup) must not be charged
    // for the brick's pages, or the cgroup's OOM killer stops it: the pages it writes back for
    // the first time go over the link, or into pages the brick populated. The segment is mapped
    // by default: no option asks for it.
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("b.sock");
    let (_brick, addr) = start_brick(&format!("unix:{}", sock.display()), "1GiB", "c");
    let prog = program("passes");
    let args = ["96", "1", "2"];
    let n = native(&prog, &args);
    let stats = dir.path().join("stats.jsonl");
    let mut cmd: Vec<String> = ["run", "--brick", &addr, "--secret", "c", "--local", "8MiB"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    cmd.extend(["--stats-json".to_string(), stats.display().to_string(), "--".into()]);
    cmd.push(prog.display().to_string());
    cmd.extend(args.iter().map(|s| s.to_string()));
    let r = rackmem_bench::swap::run_in_memory_cgroup(&cgroups, 48 << 20, std::path::Path::new(rackmem()), &cmd)
        .expect("run in a memory cgroup");
    assert!(
        r.status.success(),
        "the program was stopped in its cgroup (charged for the brick's memory?): {}",
        show(&r)
    );
    assert_eq!(checksums(&n), checksums(&r));
    let s = read_stats(&stats);
    let p = busiest(&s);
    assert_used_remote_memory(p);
    assert!(p.extra("bytes_fetched_shared") > 0, "{p:?}");
}

#[test]
fn a_tcp_brick_keeps_its_link() {
    require_root();
    let (_brick, addr) = start_brick("tcp://127.0.0.1:0", "1GiB", "t");
    let s = same_as_native_with(
        "passes",
        &["32", "1", "2"],
        &["--shared-memory", "--brick", &addr, "--secret", "t"],
    );
    let p = busiest(&s);
    assert_used_remote_memory(p);
    assert_eq!(p.extra("bytes_fetched_shared"), 0, "TCP cannot share memory: {p:?}");
}

#[test]
fn a_bad_setting_is_refused_by_name() {
    require_root();
    let prog = program("passes");
    let mut c = std::process::Command::new(rackmem());
    c.env("RACKMEM_SHARED_MEMORY", "sometimes")
        .args(["run", "--local", "10%", "--"])
        .arg(&prog)
        .args(["8", "1", "1"]);
    let o = c.output().expect("rackmem run");
    assert!(
        !o.status.success(),
        "a malformed setting must not be ignored: {}",
        show(&o)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("RACKMEM_SHARED_MEMORY"), "{}", show(&o));
}

#[test]
fn cpus_confines_the_program_and_its_handler() {
    require_root();
    // The program sees the mask it was given, and computes what it computes natively.
    let o = std::process::Command::new(rackmem())
        .args([
            "run",
            "--cpus",
            "0",
            "--",
            "sh",
            "-c",
            "grep Cpus_allowed_list /proc/self/status",
        ])
        .output()
        .expect("rackmem run");
    assert!(o.status.success(), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.split_whitespace().nth(1) == Some("0"), "{}", show(&o));
    let s = same_as_native_with("passes", &["32", "1", "2"], &["--cpus", "0"]);
    assert_used_remote_memory(busiest(&s));
}

#[test]
fn a_bad_cpu_list_is_refused_before_the_program_starts() {
    for bad in ["x", "3-1", "5000"] {
        let o = std::process::Command::new(rackmem())
            .args(["run", "--cpus", bad, "--", "true"])
            .output()
            .expect("rackmem run");
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", show(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains("CPU list"), "{}", show(&o));
    }
}

#[test]
fn the_handler_follows_a_lone_faulting_thread_and_never_confines_new_threads() {
    require_root();
    let cpus = |o: &std::process::Output, who: &str| -> String {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{who} Cpus_allowed_list:")))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| panic!("{who} printed no CPU list: {}", show(o)))
    };
    let prog = program("follow_spawn");
    let args = ["32", "200000"];
    let n = native(&prog, &args);
    let all = cpus(&n, "main");
    assert_ne!(
        all.split([',', '-']).count(),
        1,
        "this test needs a machine with two CPUs or more (this one allows {all})"
    );
    // One thread faults alone at 10% local: the handler follows it (both on its CPU). Then it
    // starts a thread, which inherits the confined mask until the watchdog's next tick gives
    // the masks back: after a pause both see every CPU again.
    let (r, stats) = remote(&prog, &args, "10%", &[]);
    assert!(r.status.success(), "{}", show(&r));
    assert_eq!(checksums(&n), checksums(&r));
    let p = busiest(&stats);
    assert_used_remote_memory(p);
    assert!(
        p.extra("handler_moves") > 0,
        "the handler never moved to the lone faulting thread: {p:?}"
    );
    assert_eq!(cpus(&r, "worker"), all, "a new thread stayed confined: {}", show(&r));
    assert_eq!(
        cpus(&r, "main"),
        all,
        "the followed thread kept a confined mask: {}",
        show(&r)
    );
}

/// A thread the handler confines to its CPU while it faults alone is told its own mask by
/// `sched_getaffinity` and `pthread_getaffinity_np`: programs size their thread pools from it
/// (NumPy's OpenBLAS, imported while Python's main thread faulted alone, ran one thread on two
/// CPUs for the whole run).
#[test]
fn a_confined_faulting_thread_is_told_its_own_cpus() {
    require_root();
    let field = |o: &std::process::Output, key: &str| -> i64 {
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key}= in the output: {}", show(o)))
    };
    let prog = program("follow_affinity");
    let args = ["32", "200000", "400"];
    let n = native(&prog, &args);
    let all = field(&n, "kernel");
    assert!(
        all >= 2,
        "this test needs a machine with two CPUs or more (this one allows {all})"
    );
    assert_eq!(field(&n, "sched_getaffinity"), all, "{}", show(&n));
    let (r, stats) = remote(&prog, &args, "10%", &[]);
    assert!(r.status.success(), "{}", show(&r));
    assert_eq!(checksums(&n), checksums(&r));
    let p = busiest(&stats);
    assert_used_remote_memory(p);
    // The kernel's mask was confined during the checks: otherwise this proves nothing.
    assert!(
        field(&r, "confined_checks") > 0 && p.extra("handler_moves") > 0,
        "the handler never confined the lone faulting thread during a check: {}",
        show(&r)
    );
    assert_eq!(
        field(&r, "sched_getaffinity"),
        all,
        "sched_getaffinity told the confinement: {}",
        show(&r)
    );
    assert_eq!(
        field(&r, "pthread_getaffinity_np"),
        all,
        "pthread_getaffinity_np told the confinement: {}",
        show(&r)
    );
}

/// A server keeping 14 children and forking short-lived ones one after the other: the embedded
/// brick holds sixteen window-sized ranges, and an exited child's clone gives its range back a
/// moment after the exit, so a CLONE right behind it found none free and the child stopped
/// (exit 111, about half of the forks under load). A CLONE now waits for that range.
#[test]
fn a_server_forking_beside_long_lived_children_gets_a_clone_for_every_child() {
    require_root();
    // 40 children alive at once: more than an embedded brick of 256 GiB held (fifteen 16 GiB
    // clones beside the parent's window), which stopped the sixteenth with exit 111.
    let s = same_as_native("fork_hold", &["40", "100"]);
    assert!(
        s.len() >= 141,
        "expected the parent's and 140 children's statistics: {}",
        s.len()
    );
    assert_used_remote_memory(busiest(&s));
}
