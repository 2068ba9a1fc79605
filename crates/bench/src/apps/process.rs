//! The processes a run starts: a command run with a deadline, a server with its standard error
//! kept, a program stopped with everything it started, and a live process's peak RSS.

use super::launch::{fail, Failure};
use std::io::{Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Output of a command run with a deadline.
pub(super) struct Done {
    pub(super) status: ExitStatus,
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: String,
    pub(super) wall: Duration,
}

/// Runs `cmd` (stdin from `input` if given), killing it after `limit`.
pub(super) fn run_deadline(mut cmd: Command, input: Option<Vec<u8>>, limit: Duration) -> Result<Done, Failure> {
    cmd.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = cmd.spawn().map_err(|e| fail(format!("{cmd:?}: {e}")))?;
    let feeder = match (input, child.stdin.take()) {
        (Some(data), Some(mut w)) => Some(std::thread::spawn(move || {
            let _ = w.write_all(&data);
        })),
        _ => None,
    };
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_end(&mut v);
        }
        v
    });
    let ereader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if t0.elapsed() > limit => {
                stop(&mut child);
                let _ = child.wait();
                return Err(fail(format!("{cmd:?} did not finish within {} s", limit.as_secs())));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(fail(format!("waiting for {cmd:?}: {e}"))),
        }
    };
    let wall = t0.elapsed();
    if let Some(f) = feeder {
        let _ = f.join();
    }
    Ok(Done {
        status,
        stdout: reader.join().unwrap_or_default(),
        stderr: ereader.join().unwrap_or_default(),
        wall,
    })
}

/// Whether `child` has exited, or does within `grace`: a server killed by its cgroup closes
/// its sockets (which the load generator sees at once) a moment before it can be reaped.
pub(super) fn exited(child: &mut std::process::Child, grace: Duration) -> bool {
    let t0 = Instant::now();
    loop {
        if child.try_wait().ok().flatten().is_some() {
            return true;
        }
        if t0.elapsed() >= grace {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a server with its standard error read to its end by a thread (its last lines explain a
/// failure), standard input and output closed.
pub(super) fn start_server(
    mut cmd: Command,
    what: &str,
) -> Result<(std::process::Child, std::thread::JoinHandle<String>), Failure> {
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| fail(format!("starting {what}: {e}")))?;
    let mut stderr = child.stderr.take();
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    Ok((child, errs))
}

/// Stops a program this bench started: SIGTERM (which `rackmem run` passes on to its program),
/// then after 10 s SIGKILL to it and everything it started. SIGKILL alone would stop `rackmem
/// run` and leave its program running, holding the pipes the bench reads to their end.
pub(super) fn stop(child: &mut std::process::Child) {
    let pid = child.id();
    signal(pid, "TERM");
    if exited(child, Duration::from_secs(10)) {
        return;
    }
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        all.extend(children_of(all[i]));
        i += 1;
    }
    for p in all {
        signal(p, "KILL");
    }
}

/// kill(1): this crate makes no system calls of its own.
fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after its closing paren.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            if let Ok(c) = e.file_name().to_string_lossy().parse() {
                out.push(c);
            }
        }
    }
    out
}

/// Peak RSS of a live process (`VmHWM`), bytes.
pub(super) fn vm_hwm(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    l.split_whitespace().nth(1)?.parse::<u64>().ok().map(|k| k * 1024)
}
