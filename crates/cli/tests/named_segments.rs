//! Named one-sided segments on agent memory (issue 24): a control plane, a managed brick and two
//! node agents on this machine (two nodes), with programs under `rackmem run --agent` on each
//! that open the same name through their agent. Their atomics, run at once from both nodes, sum
//! exactly; one node's puts are read by the other's gets, checked word by word and by checksum;
//! another user's open of the name is refused; a holder killed with SIGKILL gives its hold back;
//! and the last close frees the segment on the brick (its own statistics say so).

mod common;
use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Instant;

/// The user tests run another tenant's process as (nobody on Debian-like systems).
const NOBODY: u32 = 65534;
const MIB: u64 = 1 << 20;

/// `tests/c/named_seg` under `rackmem run --agent SOCKET`, driven a line at a time.
struct Prog {
    guard: Guard,
    input: ChildStdin,
    lines: Receiver<String>,
    /// Its standard error, line by line, for a program started by [`Prog::linked`].
    errs: Option<Receiver<String>>,
    pid: u32,
}

impl Prog {
    /// Started on the agent at `socket`, `extra` options to `rackmem run`.
    fn start(socket: &Path, extra: &[&str]) -> Prog {
        let mut cmd = Command::new(rackmem());
        cmd.arg("run")
            .arg("--agent")
            .arg(socket)
            .args(extra)
            .arg("--")
            .arg(program("named_seg"))
            // Its window needs little: small steps keep the nodes' quotas for the segments.
            .env("RACKMEM_GROW", "16MiB");
        Prog::spawn(cmd)
    }

    /// `named_seg` linked with `-lrackmem`, not under `rackmem run`: no window, so nothing
    /// but its one-sided segments uses a brick (a test can restart the brick under it).
    fn linked(socket: &Path, env: &[(&str, &str)]) -> Prog {
        let mut cmd = Command::new(linked_program("named_seg"));
        cmd.env_remove("LD_PRELOAD")
            .env_remove("RACKMEM_BRICKS")
            .env("RACKMEM_AGENT", socket)
            .envs(env.iter().copied())
            .stderr(Stdio::piped());
        Prog::spawn(cmd)
    }

    fn spawn(mut cmd: Command) -> Prog {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut guard = Guard::spawn(&mut cmd);
        let input = guard.child().stdin.take().expect("stdin");
        let lines = lines_of(guard.child().stdout.take().expect("stdout"));
        let errs = guard.child().stderr.take().map(lines_of);
        let mut p = Prog {
            guard,
            input,
            lines,
            errs,
            pid: 0,
        };
        let pid = p.ask("pid");
        p.pid = pid
            .strip_prefix("ok ")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no pid: {pid}"));
        p
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.input, "{cmd}").unwrap_or_else(|e| panic!("sending {cmd:?}: {e}"));
    }

    fn answer(&mut self, cmd: &str) -> String {
        match self.lines.recv_timeout(LIMIT) {
            Ok(l) => l,
            Err(e) => {
                // What a linked program said on its way out.
                std::thread::sleep(std::time::Duration::from_millis(200));
                panic!("no answer to {cmd:?}: {e}; its standard error: {:?}", self.errors())
            }
        }
    }

    fn ask(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.answer(cmd)
    }

    /// What the program printed on its standard error so far (a [`Prog::linked`] one).
    fn errors(&mut self) -> Vec<String> {
        self.errs.as_ref().map(|r| r.try_iter().collect()).unwrap_or_default()
    }

    /// `cmd`, which must succeed; what follows "ok".
    fn ok(&mut self, cmd: &str) -> String {
        let a = self.ask(cmd);
        assert!(a == "ok" || a.starts_with("ok "), "{cmd}: {a}");
        a.trim_start_matches("ok").trim().to_string()
    }
}

fn segments(url: &str) -> Vec<serde_json::Value> {
    ctl_json(url, &["segments"]).as_array().cloned().unwrap_or_default()
}

fn holder_pids(url: &str, name: &str) -> Vec<u64> {
    segments(url)
        .iter()
        .filter(|s| s["name"] == name)
        .flat_map(|s| s["holders"].as_array().cloned().unwrap_or_default())
        .filter_map(|h| h["holder"]["pid"].as_u64())
        .collect()
}

/// The brick's own count of live segments (`rackmem_brick_segments` on its metrics page).
fn brick_segments(metrics: &str) -> u64 {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(metrics).expect("the brick's metrics endpoint");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out.lines()
        .find_map(|l| l.strip_prefix("rackmem_brick_segments "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no rackmem_brick_segments on the brick's page: {out}")) as u64
}

/// Where a process's "metrics at http://ADDR/metrics" line says its metrics are.
fn metrics_address(log: &Receiver<String>) -> String {
    let deadline = Instant::now() + START_LIMIT;
    loop {
        let line = log
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the brick said where its metrics are");
        if let Some(rest) = line.split("metrics at http://").nth(1) {
            return rest.trim_end_matches("/metrics").to_string();
        }
    }
}

/// One request line to an agent as user `uid`, through `tests/c/agent_client`; its answers.
fn agent_client_as(socket: &Path, uid: u32, lines: &[&str]) -> Vec<serde_json::Value> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program("agent_client"));
    cmd.arg(socket).arg("0").args(lines).uid(uid).gid(uid);
    let o = run_with_deadline(cmd, LIMIT);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn processes_on_two_nodes_share_a_named_segment() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    // nobody's client must reach the sockets in this directory.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (_control, url) = start_control(&dir.path().join("control.db"));
    let brick_sock = format!("unix:{}", dir.path().join("b0.sock").display());
    let mut brick = start_managed_brick(&url, &brick_sock, "256MiB", "b0", |c| {
        c.args(["--metrics", "127.0.0.1:0"]).stderr(Stdio::piped());
    });
    let brick_log = lines_of(brick.child().stderr.take().expect("the brick's stderr"));
    let brick_metrics = metrics_address(&brick_log);
    std::thread::spawn(move || for _ in brick_log {});
    let sockets: Vec<PathBuf> = ["n1", "n2"]
        .iter()
        .map(|n| dir.path().join(format!("{n}.sock")))
        .collect();
    let _agents: Vec<Guard> = ["n1", "n2"]
        .iter()
        .zip(&sockets)
        .map(|(n, s)| spawn_agent(&url, n, s, &["--allow-uid", &NOBODY.to_string()]))
        .collect();
    let before = brick_segments(&brick_metrics);
    assert_eq!(before, 0, "a new brick");

    // Node 1 creates it, node 2 opens it (size 0: open only), each over its own agent.
    // Node 1's processes map the brick's memory (it is on this host), node 2's go over its
    // socket: their atomics meet as the processor's and the brick's on the same words.
    let mut p1 = Prog::start(&sockets[0], &[]);
    let mut p2 = Prog::start(&sockets[1], &["--no-shared-memory"]);
    assert_eq!(
        p2.ask("open counter 0"),
        format!("err {}", libc::ENOENT),
        "no such name yet"
    );
    assert_eq!(p1.ok(&format!("open counter {}", 4 * MIB)), (4 * MIB).to_string());
    assert_eq!(p2.ok("open counter 0"), (4 * MIB).to_string());
    assert_eq!(
        p2.ask(&format!("open counter {}", 8 * MIB)),
        format!("err {}", libc::EEXIST),
        "larger than it is"
    );
    let mut pids = holder_pids(&url, "counter");
    pids.sort_unstable();
    let mut want = vec![u64::from(p1.pid), u64::from(p2.pid)];
    want.sort_unstable();
    assert_eq!(pids, want, "{:?}", segments(&url));
    let nodes: Vec<u64> = segments(&url)[0]["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .filter_map(|h| h["node"].as_u64())
        .collect();
    assert_eq!(nodes.len(), 2);
    assert_ne!(nodes[0], nodes[1], "the holders are on two nodes");
    // The larger open failed and left p2 its segment: a close and an open again.
    p2.ok("free");
    assert_eq!(p2.ok("open counter 0"), (4 * MIB).to_string());

    // Puts on one node, gets on the other, both ways, word by word and by checksum.
    p1.ok(&format!("fill 7 0 {MIB}"));
    let sum = p2.ok(&format!("check 7 0 {MIB}"));
    assert_eq!(p1.ok(&format!("check 7 0 {MIB}")), sum);
    p2.ok(&format!("fill 9 {} 65536", 2 * MIB));
    p1.ok(&format!("check 9 {} 65536", 2 * MIB));

    // Atomics from both nodes at once (and a second process on each): the exact total.
    let mut p3 = Prog::start(&sockets[0], &[]);
    let mut p4 = Prog::start(&sockets[1], &["--no-shared-memory"]);
    p3.ok("open counter 0");
    p4.ok("open counter 0");
    let off = 3 * MIB;
    let n = 3000;
    let mut all = [p1, p2, p3, p4];
    for p in all.iter_mut() {
        p.send(&format!("add {off} {n}"));
    }
    for p in all.iter_mut() {
        let a = p.answer("add");
        assert_eq!(a, "ok", "add: {a}");
    }
    let [mut p1, mut p2, mut p3, mut p4] = all;
    assert_eq!(p1.ok(&format!("word {off}")), (4 * n).to_string());
    assert_eq!(p2.ok(&format!("word {off}")), (4 * n).to_string());

    // Another user's process may not open the name (nor is told more than that).
    let refused = agent_client_as(
        &sockets[1],
        NOBODY,
        &[
            r#"{"op":"hello","pid":1,"program":"test"}"#,
            r#"{"op":"segment","name":"counter","bytes":0}"#,
        ],
    );
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert_eq!(refused[1]["ok"], false, "{refused:?}");
    assert_eq!(refused[1]["error"]["code"], "forbidden", "{refused:?}");

    // An open of an existing name asks for 0 bytes, but the hold counts the segment's size: a
    // process whose quota (1 MiB on node 3) cannot hold 4 MiB is refused, and holds nothing.
    let small = dir.path().join("n3.sock");
    let _n3 = spawn_agent(
        &url,
        "n3",
        &small,
        &["--allow-uid", &NOBODY.to_string(), "--quota-per-process", "1MiB"],
    );
    let over = agent_client_as(
        &small,
        0,
        &[
            r#"{"op":"hello","pid":1,"program":"test"}"#,
            r#"{"op":"segment","name":"counter","bytes":0}"#,
        ],
    );
    assert_eq!(over.len(), 2, "{over:?}");
    assert_eq!(over[1]["ok"], false, "{over:?}");
    assert_eq!(over[1]["error"]["code"], "quota_exceeded", "{over:?}");
    assert_eq!(holder_pids(&url, "counter").len(), 4, "{:?}", segments(&url));

    // A holder killed with SIGKILL: its agent sees its connection close and closes its hold.
    let killed = p4.pid;
    p4.guard.kill_group();
    wait_for("the killed holder's hold to go", || {
        !holder_pids(&url, "counter").contains(&u64::from(killed))
    });
    assert_eq!(holder_pids(&url, "counter").len(), 3);

    // The last close frees it: on the control plane, and on the brick.
    assert!(brick_segments(&brick_metrics) > before, "the brick holds the segment");
    p3.ok("free");
    p2.ok("free");
    assert_eq!(segments(&url).len(), 1, "still held by one process");
    // The programs' windows hold segments of their own on the brick too (none of them grows
    // meanwhile: they only wait for their next line).
    let held = brick_segments(&brick_metrics);
    p1.ok("free");
    wait_for("the named segment to go", || segments(&url).is_empty());
    wait_for("the brick to free the segment", || {
        brick_segments(&brick_metrics) == held - 1
    });
    // The name is free again: a new segment, zero-filled.
    assert_eq!(p2.ok(&format!("open counter {MIB}")), MIB.to_string());
    assert_eq!(p2.ok(&format!("word {}", MIB / 2)), "0");
    p2.ok("free");
    drop(p1.input);
    drop(p2.input);
    drop(p3.input);
    for g in [&mut p1.guard, &mut p2.guard, &mut p3.guard] {
        let st = g.wait_until(LIMIT).expect("the program exits at the end of its input");
        assert!(st.success(), "{st:?}");
    }
}

/// A named segment's holders lose their links and come back by themselves (issue 23 item 4).
/// Two processes on two nodes (linked with `-lrackmem`, no window, so the brick serves nothing
/// else of theirs) hold one segment of a TCP brick that closes links idle for 2 s: after 3 s of
/// silence their next calls re-attach with fresh grants and find the data (a checksum, the
/// exact count of their atomics). The brick then restarts on the same address with the same
/// key: its pool starts empty, so the holders' calls fail with EIO, every one of them after
/// (never the new brick's zeros), until the program closes the name and opens it again. With
/// the brick gone for good, a call fails with EIO after a bounded wait. The holds are counted
/// once throughout: the last close removes the name.
#[test]
fn holders_reattach_after_a_broken_link_and_a_restarted_brick_is_reported_lost() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let (_control, url) = start_control(&dir.path().join("control.db"));
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let addr = format!("tcp://127.0.0.1:{port}");
    let key = dir.path().join("b0.key");
    let key_arg = key.display().to_string();
    let brick_args = ["--key-file", key_arg.as_str(), "--idle-timeout-s", "2"];
    let mut brick = start_managed_brick(&url, &addr, "256MiB", "b0", |c| {
        c.args(brick_args);
    });
    let sockets: Vec<PathBuf> = ["n1", "n2"]
        .iter()
        .map(|n| dir.path().join(format!("{n}.sock")))
        .collect();
    let _agents: Vec<Guard> = ["n1", "n2"]
        .iter()
        .zip(&sockets)
        .map(|(n, s)| spawn_agent(&url, n, s, &[]))
        .collect();
    let env = [("RACKMEM_VERBOSE", "1")];
    let mut p1 = Prog::linked(&sockets[0], &env);
    let mut p2 = Prog::linked(&sockets[1], &env);
    assert_eq!(p1.ok(&format!("open survivor {}", 4 * MIB)), (4 * MIB).to_string());
    assert_eq!(p2.ok("open survivor 0"), (4 * MIB).to_string());
    p1.ok(&format!("fill 7 0 {MIB}"));
    let sum = p2.ok(&format!("check 7 0 {MIB}"));
    let off = 3 * MIB;
    p1.ok(&format!("add {off} 100"));
    p2.ok(&format!("add {off} 100"));

    // Silent for longer than the brick's idle timeout: it closes both links.
    std::thread::sleep(std::time::Duration::from_millis(3500));
    // p1's first call is an atomic (the closed link seen before it is sent, so it is sent
    // once, on the new link); p2's a get (retried, a repeat being harmless).
    p1.ok(&format!("add {off} 500"));
    assert_eq!(p2.ok(&format!("check 7 0 {MIB}")), sum, "the data after a re-attach");
    p2.ok(&format!("add {off} 500"));
    assert_eq!(
        p2.ok(&format!("word {off}")),
        "1200",
        "atomics exact across the re-attach"
    );
    for p in [&mut p1, &mut p2] {
        let errs = p.errors();
        assert!(
            errs.iter().any(|l| l.contains("re-attached")),
            "pid {} never re-attached: {errs:?}",
            p.pid
        );
    }
    assert_eq!(holder_pids(&url, "survivor").len(), 2, "{:?}", segments(&url));

    // The brick restarts on the same address, with the same key: its pool is new and empty.
    brick.kill_group();
    drop(brick);
    let mut brick = start_managed_brick(&url, &addr, "256MiB", "b0", |c| {
        c.args(brick_args);
    });
    wait_for("the restarted brick to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let eio = format!("err {}", libc::EIO);
    assert_eq!(
        p1.ask(&format!("word {off}")),
        eio,
        "a restarted brick's zeros read as data"
    );
    assert_eq!(p1.ask(&format!("check 7 0 {MIB}")), eio, "a lost segment stays lost");
    assert_eq!(p2.ask(&format!("fill 9 0 {MIB}")), eio, "a put into a lost segment");
    assert_eq!(p2.ask(&format!("add {off} 1")), eio);
    assert!(
        p1.errors().iter().any(|l| l.contains("restarted")),
        "the loss is reported on standard error"
    );
    // Closed and opened again, knowingly: the restarted brick's memory, zero-filled.
    p1.ok("free");
    assert_eq!(p1.ok("open survivor 0"), (4 * MIB).to_string());
    assert_eq!(p1.ok(&format!("word {off}")), "0");
    p1.ok(&format!("fill 9 0 {MIB}"));

    // The brick gone for good: EIO after a bounded wait, not a hang.
    brick.kill_group();
    drop(brick);
    let t = Instant::now();
    assert_eq!(p1.ask(&format!("check 9 0 {MIB}")), eio);
    println!("a call on a brick gone for good failed after {:?}", t.elapsed());

    // One hold each throughout: two closes remove the name.
    p1.ok("free");
    p2.ok("free");
    wait_for("the name to go with its last hold", || segments(&url).is_empty());
    drop(p1.input);
    drop(p2.input);
    for g in [&mut p1.guard, &mut p2.guard] {
        let st = g.wait_until(LIMIT).expect("the program exits at the end of its input");
        assert!(st.success(), "{st:?}");
    }
}

/// One brick as `rackmem ctl --json bricks` shows it.
fn brick_view(url: &str, name: &str) -> serde_json::Value {
    ctl_json(url, &["bricks"])
        .as_array()
        .and_then(|b| b.iter().find(|b| b["name"] == name).cloned())
        .unwrap_or_else(|| panic!("no brick {name}"))
}

/// A free TCP address for a brick.
fn tcp_address() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    format!("tcp://{}", l.local_addr().expect("addr"))
}

/// The longest wait for a move a program reported ("a call waited X ms for its move").
fn longest_move_wait_ms(lines: &[String]) -> Option<f64> {
    lines
        .iter()
        .filter_map(|l| {
            l.split("a call waited ")
                .nth(1)?
                .split(" ms")
                .next()?
                .parse::<f64>()
                .ok()
        })
        .reduce(f64::max)
}

/// A drain moves a named segment while processes on two nodes use it (issue 23 item 4): a
/// 64 MiB segment on TCP brick b0, opened through two agents by programs linked with
/// `-lrackmem`; two of them run fetch-add and compare-and-swap on one word, a third puts and
/// reads back pages (each compared) and a fourth does the same with non-blocking transfers,
/// while `ctl drain b0` freezes the segment, has b1 pull it
/// and points the name at b1. The drain exits 0 with b0 holding nothing; the atomics sum
/// exactly, every put read back, and the data written before the drain is all there (a
/// checksum taken before, on the other node). Prints how long a call waited for the move,
/// beside a holder's get of the whole segment over its link in the same run.
#[test]
fn a_named_segment_moves_off_a_draining_brick_while_two_nodes_use_it() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let (_control, url) = start_control(&dir.path().join("control.db"));
    let _b0 = start_managed_brick(&url, &tcp_address(), "256MiB", "b0", |_| {});
    let sockets: Vec<PathBuf> = ["n1", "n2"]
        .iter()
        .map(|n| dir.path().join(format!("{n}.sock")))
        .collect();
    let _agents: Vec<Guard> = ["n1", "n2"]
        .iter()
        .zip(&sockets)
        .map(|(n, s)| spawn_agent(&url, n, s, &[]))
        .collect();
    let env = [("RACKMEM_VERBOSE", "1")];
    let size = 64 * MIB;
    let mut p1 = Prog::linked(&sockets[0], &env);
    let mut p2 = Prog::linked(&sockets[1], &env);
    let mut p3 = Prog::linked(&sockets[1], &env);
    let mut p4 = Prog::linked(&sockets[0], &env);
    // A holder that makes no call during the move, nor in the grace after it.
    let mut idle = Prog::linked(&sockets[1], &env);
    assert_eq!(p1.ok(&format!("open mover {size}")), size.to_string());
    assert_eq!(p2.ok("open mover 0"), size.to_string());
    assert_eq!(p3.ok("open mover 0"), size.to_string());
    assert_eq!(p4.ok("open mover 0"), size.to_string());
    assert_eq!(idle.ok("open mover 0"), size.to_string());
    p1.ok(&format!("fill 7 0 {size}"));
    // The floor the move's wait is measured against, in the same run: a holder's get of the
    // whole segment over its own link.
    let t = Instant::now();
    p2.ok(&format!("check 7 0 {size}"));
    let floor = t.elapsed();
    let sum = p2.ok(&format!("check 7 0 {}", 48 * MIB));
    // b1 joins only now, so the segment is on b0.
    let _b1 = start_managed_brick(&url, &tcp_address(), "256MiB", "b1", |_| {});
    assert_eq!(brick_view(&url, "b0")["named_segments"][0], "mover");

    let off = 56 * MIB;
    let n = 50_000u64;
    let before: u64 = p1.ok(&format!("word {off}")).parse().expect("a word");
    p1.send(&format!("add {off} {n}"));
    p2.send(&format!("add {off} {n}"));
    p3.send(&format!("rounds 11 {} 65536 3000", 60 * MIB));
    p4.send(&format!("nbirounds 21 {} 65536 3000", 62 * MIB));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let t = Instant::now();
    let o = ctl(&url, &["--json", "drain", "b0", "--timeout", "60s"]);
    let took = t.elapsed();
    assert!(o.status.success(), "drain b0: {}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert!(v["drained"] == true && v["segments"] == 0, "{v}");
    assert!(v["named_segments"].as_array().is_none_or(|a| a.is_empty()), "{v}");
    assert_eq!(brick_view(&url, "b1")["named_segments"][0], "mover");
    for (p, what) in [
        (&mut p1, "add"),
        (&mut p2, "add"),
        (&mut p3, "rounds"),
        (&mut p4, "nbirounds"),
    ] {
        let a = p.answer(what);
        assert_eq!(
            a,
            "ok",
            "{what} across the move: {a}; its standard error: {:?}",
            p.errors()
        );
    }
    assert_eq!(
        p1.ok(&format!("word {off}")),
        before.wrapping_add(2 * n).to_string(),
        "atomics exact across the move"
    );
    assert_eq!(
        p1.ok(&format!("check 7 0 {}", 48 * MIB)),
        sum,
        "the data written before the move"
    );
    assert_eq!(p3.ok(&format!("check 7 0 {}", 48 * MIB)), sum);
    let mut waits = Vec::new();
    for p in [&mut p1, &mut p2, &mut p3, &mut p4] {
        let errs = p.errors();
        assert!(
            errs.iter().any(|l| l.contains("re-attached")),
            "pid {} never followed the segment: {errs:?}",
            p.pid
        );
        waits.extend(longest_move_wait_ms(&errs));
    }
    let longest = waits.iter().copied().fold(0.0, f64::max);
    println!(
        "drain of b0 holding a 64 MiB named segment in use: {took:?}; longest wait of a call for the \
         move: {longest:.1} ms (per process: {waits:?}); a holder's get of all 64 MiB: {:.1} ms; \
         ratio {:.2}",
        floor.as_secs_f64() * 1e3,
        longest / (floor.as_secs_f64() * 1e3)
    );
    assert!(!waits.is_empty(), "no call waited for the move: was it frozen at all?");
    // The source holds nothing (after the grace in which it answers `Moved`); a holder that
    // was idle all along finds the segment gone there, re-opens it and reads it on b1.
    assert_eq!(brick_view(&url, "b0")["segments"], 0);
    assert_eq!(
        idle.ok(&format!("check 7 0 {}", 48 * MIB)),
        sum,
        "an idle holder after the move"
    );
    assert!(idle.errors().iter().any(|l| l.contains("re-attached")));
    idle.ok("free");
    for p in [&mut p1, &mut p2, &mut p3, &mut p4] {
        p.ok("free");
    }
    wait_for("the name to go with its last hold", || segments(&url).is_empty());
    for p in [p1, p2, p3, p4, idle] {
        let Prog { mut guard, input, .. } = p;
        drop(input);
        let st = guard
            .wait_until(LIMIT)
            .expect("the program exits at the end of its input");
        assert!(st.success(), "{st:?}");
    }
}

/// A move whose target brick dies half-way ends, and the segment stays where it was, serving:
/// b0 serves at 16 MiB/s, so pulling the 64 MiB segment takes about 4 s; b1 is killed during
/// it. The holder's calls meanwhile wait (not executed) and go on on b0 once the control plane
/// ends the move; its data and atomics are intact, and the brick says why the segment waits.
#[test]
fn a_move_whose_target_dies_leaves_the_named_segment_serving_on_its_brick() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let (_control, url) = start_control(&dir.path().join("control.db"));
    let _b0 = start_managed_brick(&url, &tcp_address(), "256MiB", "b0", |c| {
        c.args(["--serve-rate", "16MiB"]);
    });
    let socket = dir.path().join("n1.sock");
    let _agent = spawn_agent(&url, "n1", &socket, &[]);
    let size = 64 * MIB;
    let mut p1 = Prog::linked(&socket, &[("RACKMEM_VERBOSE", "1")]);
    assert_eq!(p1.ok(&format!("open stay {size}")), size.to_string());
    p1.ok(&format!("fill 5 0 {MIB}"));
    let sum = p1.ok(&format!("check 5 0 {MIB}"));
    let off = 2 * MIB;
    p1.ok(&format!("add {off} 10"));
    let mut b1 = start_managed_brick(&url, &tcp_address(), "256MiB", "b1", |_| {});
    let o = ctl(&url, &["drain", "b0", "--no-wait"]);
    assert!(o.status.success(), "drain b0 --no-wait: {}", show(&o));
    wait_for("the move to start", || {
        brick_view(&url, "b0")["named_moving"][0] == "stay"
    });
    std::thread::sleep(std::time::Duration::from_millis(1000));
    b1.kill_group();
    drop(b1);
    // The holder's call waits for the move to end, then runs on b0.
    let t = Instant::now();
    p1.ok(&format!("add {off} 10"));
    println!("a call made while the move's target was dead waited {:?}", t.elapsed());
    wait_for("the failure to be shown", || {
        let v = brick_view(&url, "b0");
        v["named_waiting"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w.as_str().is_some_and(|w| w.starts_with("stay: "))))
    });
    let v = brick_view(&url, "b0");
    println!("b0's waiting named segments: {}", v["named_waiting"]);
    assert_eq!(v["named_segments"][0], "stay");
    assert_eq!(p1.ok(&format!("word {off}")), "20", "atomics exact");
    assert_eq!(p1.ok(&format!("check 5 0 {MIB}")), sum, "the data on b0");
    // The drain, waited for, says why it cannot finish.
    let o = ctl(&url, &["drain", "b0", "--timeout", "2s"]);
    assert_eq!(o.status.code(), Some(75), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("stay: "), "{}", show(&o));
    let o = ctl(&url, &["drain", "b0", "--cancel"]);
    assert!(o.status.success(), "{}", show(&o));
    p1.ok("free");
    wait_for("the name to go", || segments(&url).is_empty());
    let Prog { mut guard, input, .. } = p1;
    drop(input);
    let st = guard
        .wait_until(LIMIT)
        .expect("the program exits at the end of its input");
    assert!(st.success(), "{st:?}");
}

/// A named segment that a process on the brick's host maps is not moved (its stores are the
/// processor's, which the brick cannot refuse): the drain waits, saying why, nothing is frozen,
/// and the holder's writes and atomics go on where they are.
#[test]
fn a_drain_waits_for_a_mapped_named_segment_saying_why() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let (_control, url) = start_control(&dir.path().join("control.db"));
    let b0_sock = format!("unix:{}", dir.path().join("b0.sock").display());
    let _b0 = start_managed_brick(&url, &b0_sock, "256MiB", "b0", |_| {});
    let socket = dir.path().join("n1.sock");
    let _agent = spawn_agent(&url, "n1", &socket, &[]);
    let mut p1 = Prog::linked(&socket, &[("RACKMEM_SHARED_MEMORY", "1")]);
    assert_eq!(p1.ok(&format!("open pinned {}", 4 * MIB)), (4 * MIB).to_string());
    p1.ok(&format!("fill 3 0 {MIB}"));
    let _b1 = start_managed_brick(&url, &tcp_address(), "256MiB", "b1", |_| {});
    let o = ctl(&url, &["drain", "b0", "--timeout", "3s"]);
    assert_eq!(o.status.code(), Some(75), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("pinned: ") && err.contains("maps it"), "{}", show(&o));
    assert!(brick_view(&url, "b0")["named_moving"]
        .as_array()
        .is_none_or(|a| a.is_empty()));
    let off = 2 * MIB;
    p1.ok(&format!("add {off} 100"));
    assert_eq!(p1.ok(&format!("word {off}")), "100");
    let sum = p1.ok(&format!("check 3 0 {MIB}"));
    assert_eq!(brick_view(&url, "b0")["named_segments"][0], "pinned");
    let o = ctl(&url, &["drain", "b0", "--cancel"]);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(p1.ok(&format!("check 3 0 {MIB}")), sum);
    p1.ok("free");
    wait_for("the name to go", || segments(&url).is_empty());
    let Prog { mut guard, input, .. } = p1;
    drop(input);
    let st = guard
        .wait_until(LIMIT)
        .expect("the program exits at the end of its input");
    assert!(st.success(), "{st:?}");
}
