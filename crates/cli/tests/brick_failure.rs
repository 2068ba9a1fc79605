//! Bricks that die or cannot be reached: the program stops with an error naming the brick, in
//! bounded time, and never computes on zero-filled pages.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn brick_killed_mid_run_stops_the_program_with_a_clear_error() {
    require_root();
    let prog = program("brick_loss");
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("b.sock");
    let addr = format!("unix:{}", sock.display());
    let brick = Command::new(rackmem())
        .args(["brick", "--listen", &addr, "--size", "1GiB", "--secret", "s3cret"])
        .stderr(Stdio::null())
        .spawn()
        .expect("brick starts");
    let mut brick = Guard(Some(brick));
    let start = Instant::now();
    while !sock.exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "brick did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let run = Command::new(rackmem())
        .args(["run", "--brick", &addr, "--secret", "s3cret", "--local", "10%", "--"])
        .arg(&prog)
        .arg("32")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run starts");
    let mut run = Guard(Some(run));
    let stdout = run.0.as_mut().and_then(|c| c.stdout.take()).expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match lines.next() {
            Some(Ok(l)) => seen.push(l),
            other => {
                let mut c = run.0.take().expect("child");
                let _ = c.kill();
                let out = c.wait_with_output().expect("output");
                panic!(
                    "program stopped before two passes: {other:?} {seen:?} status {:?} stderr: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    // Kill the brick while the program is working on remote memory.
    if let Some(b) = brick.0.as_mut() {
        b.kill().expect("kill brick");
        b.wait().expect("reap brick");
    }
    brick.0 = None;
    let killed_at = Instant::now();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let mut child = run.0.take().expect("child");
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(60),
            "the program hung after its brick died"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr).expect("stderr");
    assert!(!status.success(), "the program must fail when its brick dies");
    assert_eq!(
        status.code(),
        Some(112),
        "exit status 112 means remote memory lost; stderr: {stderr}"
    );
    assert!(
        stderr.contains("brick") && stderr.contains(&addr),
        "the error must name the brick: {stderr}"
    );
    assert!(
        rest.iter().chain(&seen).all(|l| l.ends_with(" ok")),
        "a pass printed something wrong: {rest:?}"
    );
    assert!(
        !stderr.contains("CORRUPTION"),
        "the program computed on bad pages: {stderr}"
    );
}

#[test]
fn unreachable_brick_is_reported_before_the_program_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("ran");
    let addr = format!("unix:{}", dir.path().join("nobody.sock").display());
    let mut c = Command::new(rackmem());
    c.args(["run", "--brick", &addr, "--secret", "x", "--", "/bin/sh", "-c"])
        .arg(format!("touch {}", marker.display()));
    let o = run_with_deadline(c, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(69), "unreachable brick exit status");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&addr), "the error must name the address: {err}");
    assert!(!marker.exists(), "the program must not run");
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
    let child = Command::new(rackmem())
        .args([
            "brick",
            "--listen",
            &format!("unix:{}", sock.display()),
            "--size",
            "64MiB",
            "--secret",
            "x",
        ])
        .stderr(Stdio::null())
        .spawn()
        .expect("brick");
    let mut g = Guard(Some(child));
    let start = Instant::now();
    while !sock.exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "brick did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = g.0.as_ref().map(|c| c.id()).expect("pid");
    let kill = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let mut c = g.0.take().expect("child");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = c.try_wait().expect("wait") {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "brick did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
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
    ] {
        let mut c = Command::new(rackmem());
        c.args(&args);
        let o = run_with_deadline(c, Duration::from_secs(30));
        assert!(!o.status.success(), "{args:?} must fail");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
