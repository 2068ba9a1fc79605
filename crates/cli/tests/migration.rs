//! User-managed migration (`rackmem_migrate`, issue 23): a program's buffer moves between two
//! bricks and the local buffer while another of its threads keeps writing it, and ends equal
//! to the program's own model; a target brick killed half-way leaves the program running on the
//! source with the error reported; bad requests get their errno.

mod common;
use common::*;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `rackmem run` of `migrate_rw` over two bricks, with `--local LOCAL`.
fn run_cmd(prog: &std::path::Path, local: &str, a: &str, b: &str, args: &[&str], stats: &std::path::Path) -> Command {
    let mut c = Command::new(rackmem());
    c.args(["run", "--local", local, "--secret", "m1gr"])
        .args(["--brick", a, "--brick", b, "--stats-json"])
        .arg(stats)
        .arg("--")
        .arg(prog)
        .args(args);
    c
}

/// The buffer's checksum and the model's, from the program's last line.
fn checksum_line(stdout: &str) -> (String, String) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("checksum "))
        .unwrap_or_else(|| panic!("no checksum line in:\n{stdout}"));
    let w: Vec<&str> = line.split_whitespace().collect();
    (w[1].to_string(), w[3].to_string())
}

fn moves_while_writing(listen_a: &str, listen_b: &str, extra: &[&str]) {
    require_root();
    let prog = program("migrate_rw");
    let (_a, a) = start_brick(listen_a, "1GiB", "m1gr");
    let (_b, b) = start_brick(listen_b, "1GiB", "m1gr");
    let stats = build_dir().join(format!("stats-migrate-{}.jsonl", unique()));
    let mut c = run_cmd(&prog, "8MiB", &a, &b, &["moves", "32", &a, &b, "2"], &stats);
    c.args(extra);
    let o = run_with_deadline(c, LIMIT);
    assert!(o.status.success(), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let (have, want) = checksum_line(&out);
    assert_eq!(have, want, "the buffer differs from the program's model:\n{out}");
    let moved_to_b = out
        .lines()
        .filter(|l| l.starts_with(&format!("migrated 32 MiB to {b}:")))
        .count();
    assert_eq!(moved_to_b, 2, "two moves to brick B:\n{out}");
    let s = read_stats(&stats);
    let s = busiest(&s);
    // 1 (to A at start) + 2 rounds of 3.
    assert_eq!(s.extra("migrations"), 7, "migrations counted in --stats-json");
    // The local buffer (8 MiB) holds a quarter of the buffer: the rest lived on the bricks and
    // was carried, both ways.
    assert!(
        s.extra("migration_bytes") >= 32 << 20,
        "only {} bytes carried:\n{out}",
        s.extra("migration_bytes")
    );
    assert!(s.extra("migration_transfer_ns") > 0 && s.extra("migration_setup_ns") > 0);
    assert_used_remote_memory_at(s, 25);
}

#[test]
fn a_buffer_moves_between_two_unix_bricks_and_the_local_buffer_while_written() {
    let d = build_dir();
    let a = format!("unix:{}/mig-a-{}.sock", d.display(), unique());
    let b = format!("unix:{}/mig-b-{}.sock", d.display(), unique());
    moves_while_writing(&a, &b, &[]);
}

#[test]
fn a_buffer_moves_between_two_tcp_bricks_while_written() {
    moves_while_writing("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", &[]);
}

#[test]
fn a_target_brick_killed_half_way_leaves_the_program_on_its_source() {
    require_root();
    let prog = program("migrate_rw");
    let (_a, a) = start_brick("tcp://127.0.0.1:0", "1GiB", "m1gr");
    let (mut bg, b) = start_brick("tcp://127.0.0.1:0", "1GiB", "m1gr");
    let stats = build_dir().join(format!("stats-migrate-kill-{}.jsonl", unique()));
    let mut c = run_cmd(&prog, "8MiB", &a, &b, &["kill", "32", &a, &b], &stats);
    c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut run = Guard::spawn(&mut c);
    let mut stdin = run.child().stdin.take().expect("stdin");
    let stdout = lines_of(run.child().stdout.take().expect("stdout"));
    let stderr = lines_of(run.child().stderr.take().expect("stderr"));
    let mut seen = Vec::new();
    let deadline = Instant::now() + LIMIT;
    loop {
        match stdout.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) if l == "kill-target" => break,
            Ok(l) => seen.push(l),
            Err(e) => {
                run.kill_group();
                let err: Vec<String> = stderr.try_iter().collect();
                panic!(
                    "migrate_rw never asked for the kill ({e:?}): {seen:?}\n{}",
                    err.join("\n")
                );
            }
        }
    }
    bg.kill_group();
    let _ = bg.wait_until(Duration::from_secs(10));
    writeln!(stdin, "go").expect("write to the program");
    drop(stdin);
    let status = run.wait_until(LIMIT);
    let rest: Vec<String> = stdout.try_iter().collect();
    let err: Vec<String> = stderr.try_iter().collect();
    let out = [seen, rest].concat().join("\n");
    let Some(status) = status else {
        run.kill_group();
        panic!(
            "migrate_rw did not finish after its target died:\n{out}\n{}",
            err.join("\n")
        );
    };
    assert!(status.success(), "exit {status:?}:\n{out}\n{}", err.join("\n"));
    assert!(
        out.contains("target-lost errno=EIO"),
        "the failed migration was not reported as EIO:\n{out}"
    );
    let (have, want) = checksum_line(&out);
    assert_eq!(have, want, "the buffer differs from the program's model:\n{out}");
}

#[test]
fn bad_migration_requests_get_their_errno() {
    require_root();
    let prog = program("migrate_rw");
    let (_a, a) = start_brick("tcp://127.0.0.1:0", "1GiB", "m1gr");
    // A brick the window's segment fills but for 48 MiB: no room for a migration segment.
    let (_b, b) = start_brick("tcp://127.0.0.1:0", "64MiB", "m1gr");
    let stats = build_dir().join(format!("stats-migrate-bad-{}.jsonl", unique()));
    let c = run_cmd(&prog, "10%", &a, &b, &["bad", "32", &a, &b], &stats);
    let o = run_with_deadline(c, LIMIT);
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("bad-requests ok"),
        "{}",
        show(&o)
    );
}

#[test]
fn a_forked_child_reads_a_migrated_range_from_the_clones() {
    require_root();
    let prog = program("migrate_rw");
    let (_a, a) = start_brick("tcp://127.0.0.1:0", "1GiB", "m1gr");
    let (_b, b) = start_brick("tcp://127.0.0.1:0", "1GiB", "m1gr");
    let stats = build_dir().join(format!("stats-migrate-fork-{}.jsonl", unique()));
    let c = run_cmd(&prog, "8MiB", &a, &b, &["fork", "32", &a, &b], &stats);
    let o = run_with_deadline(c, LIMIT);
    assert!(o.status.success(), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("fork ok"), "{}", show(&o));
    let (have, want) = checksum_line(&out);
    assert_eq!(have, want, "{out}");
}

#[test]
fn without_rackmem_the_program_says_so() {
    let prog = program("migrate_rw");
    let o = native(&prog, &["moves", "1", "a", "b"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "rackmem=absent");
}
