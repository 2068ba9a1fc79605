//! `rackmem run --huge-pages`: a window of 2 MiB units backed by transparent huge pages. Real
//! bricks (the embedded one mapped or over its Unix socket, a standalone one over TCP and over
//! a Unix socket), real programs (`tests/c/huge_units.c`, `fork_rw.c`), results checked against
//! the native run's checksums, and the statistics read to see that the units were 2 MiB, that
//! the memory went to the brick and came back within the local buffer, and that a small write
//! to a unit sent back one subpage, not 2 MiB.

mod common;
use common::*;

const HUGE: u64 = 2 << 20;

/// The tests need the kernel to give transparent huge pages to `MADV_HUGEPAGE` mappings.
fn require_thp() {
    require_root();
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    assert!(
        mode.contains("[always]") || mode.contains("[madvise]"),
        "these tests need transparent huge pages: /sys/kernel/mm/transparent_hugepage/enabled must be \
         [always] or [madvise], it is {:?} (echo madvise > that file as root)",
        mode.trim()
    );
}

/// Every process's statistics say it moved 2 MiB units.
fn assert_huge(stats: &[ProcStats]) {
    assert!(!stats.is_empty(), "rackmem run --stats-json wrote no statistics");
    for s in stats {
        assert_eq!(s.extra("unit_bytes"), HUGE, "the window did not use huge units: {s:?}");
    }
}

/// `huge_units MODE 128 3` natively and under `--huge-pages --local 10%` with `extra`: same
/// checksums; returns the remote run's stdout and statistics. (128 MiB: the local buffer holds
/// at least 4 units, 8 MiB, whatever its percentage says.)
fn huge_as_native(mode: &str, extra: &[&str]) -> (String, Vec<ProcStats>) {
    let prog = program("huge_units");
    let args = [mode, "128", "3"];
    let n = native(&prog, &args);
    let mut opts = vec!["--huge-pages"];
    opts.extend_from_slice(extra);
    let (r, stats) = remote(&prog, &args, "10%", &opts);
    assert!(
        r.status.success(),
        "huge_units {mode} under rackmem failed: {}",
        show(&r)
    );
    assert!(
        !checksums(&n).is_empty(),
        "huge_units printed no checksum: {}",
        show(&n)
    );
    assert_eq!(
        checksums(&n),
        checksums(&r),
        "huge_units {mode}: results differ from the native run"
    );
    assert_huge(&stats);
    assert_used_remote_memory(busiest(&stats));
    (String::from_utf8_lossy(&r.stdout).into_owned(), stats)
}

#[test]
fn a_scan_with_random_writes_is_exact_on_mapped_shared_memory() {
    require_thp();
    let (_, s) = huge_as_native("scan", &[]);
    assert!(
        busiest(&s).extra("bytes_fetched_shared") > 0,
        "the embedded brick's segment was not mapped: {s:?}"
    );
}

#[test]
fn a_scan_with_random_writes_is_exact_over_a_unix_socket() {
    require_thp();
    let dir = tempfile::tempdir().expect("tempdir");
    let listen = format!("unix:{}", dir.path().join("b.sock").display());
    let (_brick, addr) = start_brick(&listen, "1GiB", "u");
    let (_, s) = huge_as_native("scan", &["--brick", &addr, "--secret", "u", "--no-shared-memory"]);
    assert_eq!(
        busiest(&s).extra("bytes_fetched_shared"),
        0,
        "asked for the socket: {s:?}"
    );
}

#[test]
fn a_scan_with_random_writes_is_exact_over_tcp() {
    require_thp();
    let (_brick, addr) = start_brick("tcp://127.0.0.1:0", "1GiB", "t");
    huge_as_native("scan", &["--brick", &addr, "--secret", "t"]);
}

/// One 8-byte write per unit and pass: each unit comes back and goes again, and what goes back
/// to the brick is the subpage that changed (4 KiB), not its 2 MiB. Over the socket (changed
/// runs as extents of a write request) and on mapped shared memory (compared with the mapping).
#[test]
fn a_small_write_to_a_unit_sends_back_only_its_subpage() {
    require_thp();
    for extra in [&["--no-shared-memory"][..], &[][..]] {
        let (_, s) = huge_as_native("small", extra);
        let p = busiest(&s);
        let footprint = 128u64 << 20;
        let units = footprint / HUGE;
        // The fill goes to the brick once (every subpage is new there); then 3 passes change
        // one subpage of each unit. Whole units would be 3 more footprints.
        let bound = footprint + 3 * units * 4096 + 4 * HUGE;
        assert!(
            p.bytes_written_back <= bound,
            "{extra:?}: {} bytes written back, more than the fill and one subpage per unit and pass \
             ({bound}): {p:?}",
            p.bytes_written_back
        );
        assert!(
            p.bytes_written_back >= footprint - 8 * HUGE,
            "{extra:?}: the fill never reached the brick: {p:?}"
        );
    }
}

/// `madvise(MADV_DONTNEED)` of a few KiB inside units (one resident, one long evicted, one
/// across a unit boundary): they read zeros at once and after every unit left and came back.
#[test]
fn released_subpages_of_a_unit_read_zeros() {
    require_thp();
    for extra in [&["--no-shared-memory"][..], &[][..]] {
        let (out, _) = huge_as_native("holes", extra);
        assert!(
            out.contains("nonzero_in_holes=0"),
            "{extra:?}: released subpages did not read zeros:\n{out}"
        );
    }
}

/// `fork` with huge units: the child gets the parent's memory as of the fork (its clone of the
/// segment, after the parent's changed subpages were written back), each then writes its own.
#[test]
fn forked_child_and_parent_each_see_their_own_copy_with_huge_units() {
    require_thp();
    // 128 MiB: the run's 10% is shared by parent and child, and each share must hold a few
    // whole units (a share smaller than one unit still holds one).
    let s = same_as_native_with("fork_rw", &["128", "2"], &["--huge-pages", "--no-shared-memory"]);
    assert!(
        s.len() >= 2,
        "expected statistics from the parent and the forked child: {s:?}"
    );
    assert_huge(&s);
    s.iter().for_each(assert_used_remote_memory);
}

/// Read-only and `PROT_NONE` ranges in the window: a unit of one protection is evicted whole
/// and comes back (by copy: `UFFDIO_MOVE` will not enter a read-only range from a read-write
/// slot), a unit of several protections stays resident.
#[test]
fn read_only_and_prot_none_units_are_evicted_and_come_back() {
    require_thp();
    let prog = program("protected_evict");
    let n = native(&prog, &["32"]);
    let (r, s) = remote(&prog, &["32"], "25%", &["--huge-pages"]);
    assert!(r.status.success(), "protected_evict under rackmem failed: {}", show(&r));
    assert_eq!(
        checksums(&n),
        checksums(&r),
        "protected_evict: results differ from the native run"
    );
    assert_huge(&s);
    assert_used_remote_memory_at(busiest(&s), 30);
}

/// Several threads fault on the same units, their stacks (with `PROT_NONE` guard pages) in the
/// window too.
#[test]
fn several_threads_fault_on_the_same_units() {
    require_thp();
    // Random words all over the buffer bring whole units back: a small buffer, half local.
    let prog = program("passes");
    let args = ["16", "4", "1"];
    let n = native(&prog, &args);
    let (r, s) = remote(&prog, &args, "50%", &["--huge-pages", "--no-shared-memory"]);
    assert!(r.status.success(), "passes under rackmem failed: {}", show(&r));
    assert_eq!(
        checksums(&n),
        checksums(&r),
        "passes: results differ from the native run"
    );
    assert_huge(&s);
    assert_used_remote_memory_at(busiest(&s), 55);
}

/// The program's small blocks in the window's heap, a local buffer of a few MiB, and forks:
/// the buffer holds at least 4 units (with one, a copy from one unit into another evicted each
/// for the other, forever: the watchdog reported faults waiting for seconds).
#[test]
fn small_blocks_and_forks_progress_with_a_budget_below_four_units() {
    require_thp();
    let prog = program("small_fork");
    let n = native(&prog, &[]);
    let (r, s) = remote(&prog, &[], "25%", &["--huge-pages"]);
    assert!(r.status.success(), "small_fork under rackmem failed: {}", show(&r));
    assert_eq!(
        checksums(&n),
        checksums(&r),
        "small_fork: results differ from the native run"
    );
    assert_huge(&s);
    for p in &s {
        assert!(p.budget_bytes >= 4 * HUGE, "a local buffer below 4 units: {p:?}");
    }
}
