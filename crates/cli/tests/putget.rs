//! One-sided segments from C (`include/rackmem.h`, issue 24) against real bricks: the same
//! random puts, gets, non-blocking transfers and atomics, checked inside the program against a
//! local model, over shared memory, a Unix socket and TCP, under `rackmem run` and in a program
//! linked with `-lrackmem` without it; named segments updated by several processes at once
//! summing exactly; every error case's errno.

mod common;
use common::*;
use std::process::Command;

fn model_checksum(o: &std::process::Output) -> String {
    assert!(o.status.success(), "{}", show(o));
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.starts_with("putget model ok"))
        .unwrap_or_else(|| panic!("no result line: {}", show(o)));
    line.to_string()
}

fn run_under(extra: &[&str], args: &[&str]) -> std::process::Output {
    let prog = program("putget");
    let (o, _) = remote(&prog, args, "50%", extra);
    o
}

/// Without rackmem the program finds no API; with it, the model holds over shared memory (the
/// embedded brick's segments mapped), its Unix socket and a TCP brick, and the results agree.
#[test]
fn put_get_and_atomics_match_a_model_on_every_transport() {
    require_root();
    let prog = program("putget");
    let n = native(&prog, &["model", "8", "7"]);
    assert_eq!(
        String::from_utf8_lossy(&n.stdout).trim(),
        "rackmem=absent",
        "{}",
        show(&n)
    );
    let shm = model_checksum(&run_under(&[], &["model", "8", "7"]));
    let unix = model_checksum(&run_under(&["--no-shared-memory"], &["model", "8", "7"]));
    let (_brick, addr) = start_brick("tcp://127.0.0.1:0", "256MiB", "t");
    let tcp = model_checksum(&run_under(&["--brick", &addr, "--secret", "t"], &["model", "8", "7"]));
    assert_eq!(shm, unix, "shared memory and the Unix socket disagree");
    assert_eq!(shm, tcp, "shared memory and TCP disagree");
    // The inline and bulk paths pinned, over the socket.
    for pin in ["inline", "bulk", "64KiB"] {
        let prog = program("putget");
        let mut c = Command::new(rackmem());
        c.args(["run", "--no-shared-memory", "--"])
            .arg(&prog)
            .args(["model", "8", "7"])
            .env("RACKMEM_TRANSFER_THRESHOLD", pin);
        let o = run_with_deadline(c, LIMIT);
        assert_eq!(model_checksum(&o), shm, "pinned to {pin}");
    }
}

/// A program linked with -lrackmem, configured by the environment alone (no `rackmem run`,
/// no LD_PRELOAD), uses a TCP brick and a brick's Unix socket with shared memory.
#[test]
fn a_program_linked_with_librackmem_works_without_preload() {
    require_root();
    let prog = linked_program("putget");
    let (_tcp, tcp) = start_brick("tcp://127.0.0.1:0", "256MiB", "t");
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = format!("unix:{}", dir.path().join("b.sock").display());
    let (_unix, unix) = start_brick(&sock, "256MiB", "t");
    let mut sums = Vec::new();
    for addr in [&tcp, &unix] {
        let mut c = Command::new(&prog);
        c.args(["model", "8", "9"])
            .env_remove("LD_PRELOAD")
            .env("RACKMEM_BRICKS", addr)
            .env("RACKMEM_SECRET", "t");
        let o = run_with_deadline(c, LIMIT);
        sums.push(model_checksum(&o));
        let mut c = Command::new(&prog);
        c.args(["counter", "linked", "3", "1500"])
            .env_remove("LD_PRELOAD")
            .env("RACKMEM_BRICKS", addr)
            .env("RACKMEM_SECRET", "t");
        let o = run_with_deadline(c, LIMIT);
        assert!(o.status.success(), "{}", show(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "counter=4500 expected=4500");
    }
    assert_eq!(sums[0], sums[1], "TCP and shared memory disagree");
    // Without a brick configured, the calls fail with ENODEV instead of crashing.
    let mut c = Command::new(&prog);
    c.args(["model", "1", "1"])
        .env_remove("LD_PRELOAD")
        .env_remove("RACKMEM_BRICKS")
        .env_remove("RACKMEM_AGENT");
    let o = run_with_deadline(c, LIMIT);
    assert!(!o.status.success(), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("No such device"),
        "expected ENODEV: {}",
        show(&o)
    );
}

/// Four processes add to one word of a named segment at once, by fetch-add and by
/// compare-and-swap retried: no update is lost, over shared memory (processor atomics against
/// each other), the Unix socket and TCP (the brick's).
#[test]
fn concurrent_atomics_from_several_processes_sum_exactly() {
    require_root();
    let (_brick, addr) = start_brick("tcp://127.0.0.1:0", "256MiB", "t");
    for extra in [
        vec![],
        vec!["--no-shared-memory"],
        vec!["--brick", &addr, "--secret", "t"],
    ] {
        let o = run_under(&extra, &["counter", "ctr", "4", "2500"]);
        assert!(o.status.success(), "{extra:?}: {}", show(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            "counter=10000 expected=10000",
            "{extra:?}"
        );
    }
}

/// A child of fork() gets EBADF on its parent's segments, and neither its calls nor its exit
/// disturb the parent's connection or its transfers in flight; it makes segments of its own that
/// work (patterns read back, atomics), and so does its child, which gets EBADF on both
/// ancestors' segments.
#[test]
fn a_forked_child_leaves_its_parents_segments_alone() {
    require_root();
    let (_brick, addr) = start_brick("tcp://127.0.0.1:0", "256MiB", "t");
    for extra in [
        vec![],
        vec!["--no-shared-memory"],
        vec!["--brick", &addr, "--secret", "t"],
    ] {
        let o = run_under(&extra, &["fork"]);
        assert!(o.status.success(), "{extra:?}: {}", show(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "fork ok", "{extra:?}");
    }
}

/// `rackmem bench transfer` on tiny sizes: every link, path and peer measured, JSON and chart
/// well formed (figures are never asserted).
#[test]
fn bench_transfer_writes_json_and_a_chart() {
    require_root();
    for tool in ["mpicc", "mpirun"] {
        assert!(
            Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success()),
            "bench transfer runs Open MPI's one-sided operations beside rackmem's and needs {tool}: \
             apt-get install openmpi-bin libopenmpi-dev (./scripts/programs.sh does)"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, svg) = (dir.path().join("t.json"), dir.path().join("t.svg"));
    let mut c = Command::new(rackmem());
    c.args(["bench", "transfer", "--sizes", "8,300000", "--rounds", "1"])
        // granted-tcp: a segment granted by a control plane, as on agent memory.
        .args(["--links", "shm,unix,tcp,granted-tcp", "--json"])
        .arg(&j)
        .arg("--svg")
        .arg(&svg)
        .arg("--bench-dir")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench"));
    let o = run_with_deadline(c, LIMIT);
    assert!(o.status.success(), "{}", show(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).expect("json")).expect("well-formed JSON");
    let rows = v["transfer"].as_array().expect("rows");
    assert_eq!(rows.len(), 4 * 2 * 2, "4 links × put/get × 2 sizes: {v}");
    for r in rows {
        for k in ["inline_ns", "bulk_ns", "engine_ns", "memcpy_ns"] {
            assert!(r[k].as_f64().is_some_and(|x| x > 0.0), "{k} missing: {r}");
        }
        let with_mpi = r["link"] != "unix";
        assert_eq!(
            r["mpi_ns"].as_f64().is_some(),
            with_mpi,
            "MPI beside shm and the tcp links only: {r}"
        );
    }
    assert!(rows.iter().any(|r| r["link"] == "granted-tcp"), "{v}");
    assert_eq!(v["summary"].as_array().map(Vec::len), Some(8), "{v}");
    let chart = std::fs::read_to_string(&svg).expect("chart");
    assert!(chart.starts_with("<svg") && chart.contains("tcp engine") && chart.contains("MPI (shm)"));
}
