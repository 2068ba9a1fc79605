//! A brick's idle timeout against real programs: a program that computes on its local buffer
//! for longer than the timeout keeps its links (the runtime's watchdog pings them) and its data;
//! without the keep-alive the brick cuts the links and the program stops as on a lost brick.

mod common;
use common::*;
use rackmem_runtime::sys::EXIT_BRICK_LOST;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs `idle` (32 MiB, three quarters remote) against the brick at `addr`, lets it idle for
/// `idle`, then has it verify its buffer; returns its exit status and stdout.
fn idle_program(addr: &str, keepalive_ms: &str, idle: Duration) -> (std::process::ExitStatus, Vec<String>) {
    let prog = program("idle");
    let mut cmd = Command::new(rackmem());
    cmd.args(["run", "--brick", addr, "--secret", "s3cret", "--local", "25%", "--"])
        .arg(&prog)
        .arg("32")
        .env("RACKMEM_KEEPALIVE_MS", keepalive_ms)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut g = Guard::spawn(&mut cmd);
    let lines = lines_of(g.child().stdout.take().expect("stdout"));
    let ready = lines.recv_timeout(LIMIT).expect("the program said ready");
    assert!(ready.starts_with("ready"), "{ready}");
    std::thread::sleep(idle);
    let _ = g.child().stdin.take().expect("stdin").write_all(b"go\n");
    let status = g.wait_until(LIMIT).expect("the program finished");
    (status, lines.iter().collect())
}

#[test]
fn an_idle_program_keeps_its_links_past_the_bricks_idle_timeout() {
    require_root();
    let (_brick, addr) = start_brick_with("tcp://127.0.0.1:0", "1GiB", "s3cret", &["--idle-timeout-s", "2"]);
    // Idle for more than two of the brick's idle timeouts, pinging every 300 ms.
    let (status, out) = idle_program(&addr, "300", Duration::from_secs(5));
    assert!(status.success(), "{status:?} {out:?}");
    // `idle` checks every word of its buffer before it prints its checksum.
    assert!(
        out.iter().any(|l| l.starts_with("checksum=")),
        "verified its buffer: {out:?}"
    );
    // Without the keep-alive the brick closes the idle links, and the program stops as it does
    // when its brick is lost, rather than computing on anything but its own data.
    let (status, out) = idle_program(&addr, "0", Duration::from_secs(5));
    assert_eq!(status.code(), Some(EXIT_BRICK_LOST), "{out:?}");
}
