//! Bricks that die or cannot be reached: the program stops with an error naming the brick, in
//! bounded time, and never computes on zero-filled pages. Also the exit status contract of
//! `rackmem run` and the brick's own lifecycle.

mod common;
use common::*;
use rackmem_runtime::sys::EXIT_BRICK_LOST;
use std::process::{Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

/// How long a program may keep running after its brick died.
const STOP_LIMIT: Duration = Duration::from_secs(30);

/// Runs `brick_loss` against a standalone brick listening on `listen`, kills the brick with
/// SIGKILL after two verified passes, and checks how the program ends.
fn program_stops_when_its_brick_dies(listen: &str) {
    let prog = program("brick_loss");
    let (mut brick, addr) = start_brick(listen, "1GiB", "s3cret");
    let mut cmd = Command::new(rackmem());
    // Over the link: a mapped segment outlives its brick's process (the program holds the
    // memory), so the link is where a dead brick shows.
    cmd.args(["run", "--brick", &addr, "--secret", "s3cret", "--local", "10%"])
        .args(["--no-shared-memory", "--"])
        .arg(&prog)
        .arg("32")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut run = Guard::spawn(&mut cmd);
    let stdout = lines_of(run.child().stdout.take().expect("stdout"));
    let stderr = lines_of(run.child().stderr.take().expect("stderr"));
    let stderr_text = |until: Instant| {
        let mut v = Vec::new();
        while let Ok(l) = stderr.recv_timeout(until.saturating_duration_since(Instant::now())) {
            v.push(l);
        }
        v.join("\n")
    };

    // Two passes over remote memory first, so pages live on the brick and are being written back.
    let mut seen = Vec::new();
    let deadline = Instant::now() + LIMIT;
    while seen.len() < 2 {
        match stdout.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => seen.push(l),
            Err(e) => {
                run.kill_group();
                panic!(
                    "brick_loss did not print two passes ({e:?}); printed {seen:?}; stderr:\n{}",
                    stderr_text(Instant::now() + Duration::from_secs(2))
                );
            }
        }
    }

    let killed_at = Instant::now();
    brick.kill_group();
    let _ = brick.wait_until(Duration::from_secs(10));
    let Some(status) = run.wait_until(STOP_LIMIT) else {
        run.kill_group();
        panic!(
            "the program still ran {STOP_LIMIT:?} after its brick died (it must stop, not hang); \
             stdout {seen:?}; stderr:\n{}",
            stderr_text(Instant::now() + Duration::from_secs(2))
        );
    };
    let stopped_after = killed_at.elapsed();
    // Whatever is left in the pipes, now that the program is gone.
    let grace = Instant::now() + Duration::from_secs(5);
    loop {
        match stdout.recv_timeout(grace.saturating_duration_since(Instant::now())) {
            Ok(l) => seen.push(l),
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => panic!("stdout stayed open after the program exited"),
        }
    }
    let err = stderr_text(grace);
    eprintln!("{addr}: the program stopped {stopped_after:?} after its brick was killed ({status:?}):\n{err}");

    assert!(
        !seen.iter().any(|l| l.contains("DATA CORRUPTION")) && !err.contains("DATA CORRUPTION"),
        "the program computed on wrong (e.g. zero-filled) pages after its brick died:\n\
         stdout {seen:?}\nstderr:\n{err}"
    );
    assert!(
        seen.iter().all(|l| l.starts_with("pass ") && l.ends_with(" ok")),
        "a pass printed something unexpected: {seen:?}"
    );
    assert!(
        !status.success(),
        "the program must fail when its brick dies; stderr:\n{err}"
    );
    assert_ne!(
        status.code(),
        Some(128 + 13),
        "the program died of SIGPIPE without a word: a write to the dead brick's socket raised \
         SIGPIPE in the program's process (send with MSG_NOSIGNAL, or block SIGPIPE in the \
         runtime's threads); stderr:\n{err}"
    );
    assert_eq!(
        status.code(),
        Some(EXIT_BRICK_LOST),
        "exit status {EXIT_BRICK_LOST} means remote memory lost; got {status:?}; stderr:\n{err}"
    );
    assert!(
        err.contains("brick") && err.contains(&addr),
        "the error must mention the brick and its address {addr}:\n{err}"
    );
}

#[test]
fn brick_killed_mid_run_stops_the_program_with_a_clear_error() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    program_stops_when_its_brick_dies(&format!("unix:{}", dir.path().join("b.sock").display()));
}

#[test]
fn brick_over_tcp_killed_mid_run_stops_the_program_with_a_clear_error() {
    require_root();
    program_stops_when_its_brick_dies("tcp://127.0.0.1:0");
}

#[test]
fn unreachable_brick_is_reported_before_the_program_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("ran");
    for addr in [
        "unix:/nonexistent.sock".to_string(),
        format!("unix:{}", dir.path().join("nobody.sock").display()),
    ] {
        let mut c = Command::new(rackmem());
        c.args(["run", "--brick", &addr, "--secret", "x", "--", "/bin/sh", "-c"])
            .arg(format!("touch {}", marker.display()));
        let start = Instant::now();
        let o = run_with_deadline(c, Duration::from_secs(30));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{addr}: rackmem run must fail: {}", show(&o));
        assert_eq!(
            o.status.code(),
            Some(69),
            "{addr}: exit status for an unreachable brick: {err}"
        );
        assert!(err.contains(&addr), "the error must name the address {addr}: {err}");
        assert!(
            !marker.exists(),
            "the program must not run when its brick is unreachable"
        );
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{addr}: took {:?} to report an unreachable brick",
            start.elapsed()
        );
    }
}

#[test]
fn program_exit_status_is_passed_through() {
    require_root();
    let mut c = Command::new(rackmem());
    c.args(["run", "--", "/bin/sh", "-c", "exit 42"]);
    assert_eq!(run_with_deadline(c, Duration::from_secs(30)).status.code(), Some(42));
    let mut c = Command::new(rackmem());
    c.args(["run", "--", "/bin/sh", "-c", "kill -TERM $$"]);
    assert_eq!(
        run_with_deadline(c, Duration::from_secs(30)).status.code(),
        Some(128 + 15)
    );
}

#[test]
fn sigterm_to_rackmem_run_reaches_the_program() {
    require_root();
    // A service manager stops `rackmem run`, not the program: rackmem passes SIGTERM on, lets the
    // program shut down its own way, and exits with its status.
    let mut c = Command::new(rackmem());
    c.args([
        "run",
        "--",
        "/bin/sh",
        "-c",
        "trap 'echo stopping; exit 7' TERM; echo ready; while :; do sleep 0.05; done",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    let mut g = Guard::spawn(&mut c);
    let lines = lines_of(g.child().stdout.take().expect("stdout"));
    assert_eq!(lines.recv_timeout(Duration::from_secs(30)).as_deref(), Ok("ready"));
    let _ = Command::new("kill").args(["-TERM", &g.id().to_string()]).status();
    let status = g
        .wait_until(Duration::from_secs(30))
        .expect("rackmem run did not stop within 30 s of SIGTERM");
    assert_eq!(status.code(), Some(7), "the program's own exit status");
    assert_eq!(lines.recv_timeout(Duration::from_secs(5)).as_deref(), Ok("stopping"));
}

#[test]
fn missing_privilege_is_reported_before_the_program_starts() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("ran");
    // Run as `nobody`, with vm.unprivileged_userfaultfd=0 as on this kind of machine.
    if std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
        .map(|v| v.trim() == "1")
        .unwrap_or(false)
    {
        panic!("this test needs vm.unprivileged_userfaultfd=0 (the default)");
    }
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        rackmem(),
        "run",
        "--",
        "/bin/sh",
        "-c",
    ])
    .arg(format!("touch {}", marker.display()));
    let o = run_with_deadline(c, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(77), "{err}");
    assert!(
        err.contains("vm.unprivileged_userfaultfd=1") && err.contains("root"),
        "the error must say what is needed: {err}"
    );
    assert!(!marker.exists(), "the program must not run");
}

#[test]
fn brick_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("b.sock");
    let (mut g, _) = start_brick(&format!("unix:{}", sock.display()), "64MiB", "x");
    let kill = Command::new("kill")
        .args(["-TERM", &g.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = g
        .wait_until(Duration::from_secs(10))
        .expect("brick did not stop within 10 s of SIGTERM");
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    assert!(!sock.exists(), "the socket file is removed");
}

#[test]
fn bad_arguments_get_clear_errors() {
    for (args, needle) in [
        (
            vec!["brick", "--listen", "nowhere", "--size", "1GiB"],
            "tcp://HOST:PORT",
        ),
        (
            vec!["brick", "--listen", "unix:/tmp/x.sock", "--size", "lots"],
            "not a size",
        ),
        (vec!["run", "--local", "150%", "--", "/bin/true"], "percentage"),
        (
            vec!["run", "--brick", "ftp://x", "--", "/bin/true"],
            "not a brick address",
        ),
        (
            vec![
                "brick",
                "--listen",
                "tls://127.0.0.1:0",
                "--size",
                "64MiB",
                "--secret",
                "s",
            ],
            "needs a certificate and its key (--tls-cert, --tls-key)",
        ),
        (
            vec![
                "brick",
                "--listen",
                "tcp://127.0.0.1:0",
                "--size",
                "64MiB",
                "--secret",
                "s",
                "--tls-cert",
                "c.pem",
                "--tls-key",
                "k.pem",
            ],
            "listen on tls://HOST:PORT",
        ),
        (
            vec![
                "brick",
                "--listen",
                "tls://127.0.0.1:0",
                "--size",
                "64MiB",
                "--secret",
                "s",
                "--tls-cert",
                "/nonexistent/c.pem",
                "--tls-key",
                "/nonexistent/k.pem",
            ],
            "reading the certificate /nonexistent/c.pem",
        ),
        (
            vec![
                "run",
                "--brick",
                "tls://127.0.0.1:1",
                "--secret",
                "s",
                "--tls-ca",
                "/nonexistent/ca.pem",
                "--",
                "/bin/true",
            ],
            "cannot read the CA file /nonexistent/ca.pem",
        ),
    ] {
        let mut c = Command::new(rackmem());
        c.args(&args);
        let o = run_with_deadline(c, Duration::from_secs(30));
        assert!(!o.status.success(), "{args:?} must fail");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
