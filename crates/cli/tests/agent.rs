//! The whole control path with real processes: `rackmem control` (SQLite), two managed bricks,
//! `rackmem agent`, and an unmodified program under `rackmem run --agent` whose memory grows,
//! shrinks and grows again. Data is checked word by word by the program and by checksum against
//! a native run; the control plane's state is checked through `rackmem ctl`.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Cluster {
    dir: tempfile::TempDir,
    url: String,
    listen: String,
    control: Option<Guard>,
    _bricks: Vec<Guard>,
    _agent: Guard,
    socket: PathBuf,
    metrics: String,
}

fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").to_string()
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + START_LIMIT;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A control plane on a fixed port (so it can be restarted), two 1 GiB bricks over Unix
/// sockets, and an agent spreading each allocation over both bricks.
fn cluster() -> Cluster {
    let dir = tempfile::tempdir().expect("tempdir");
    let listen = free_port();
    let (control, url) = start_control_on(&dir.path().join("control.db"), &listen);
    let mut bricks = Vec::new();
    for i in 0..2 {
        let mut cmd = Command::new(rackmem());
        cmd.args(["brick", "--listen"])
            .arg(format!("unix:{}", dir.path().join(format!("b{i}.sock")).display()))
            .args(["--size", "1GiB", "--control", &url, "--name", &format!("b{i}")])
            .args(["--heartbeat-ms", "100"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        bricks.push(Guard::spawn(&mut cmd));
    }
    wait_for("two bricks to register", || {
        ctl_json(&url, &["bricks"]).as_array().map_or(0, Vec::len) == 2
    });
    let socket = dir.path().join("agent.sock");
    let metrics = free_port();
    let mut cmd = Command::new(rackmem());
    cmd.args([
        "agent",
        "--control",
        &url,
        "--name",
        "n1",
        "--stripe",
        "2",
        "--metrics",
        &metrics,
        "--socket",
    ])
    .arg(&socket)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let agent = Guard::spawn(&mut cmd);
    wait_for("the agent's socket", || UnixStream::connect(&socket).is_ok());
    Cluster {
        dir,
        url,
        listen,
        control: Some(control),
        _bricks: bricks,
        _agent: agent,
        socket,
        metrics,
    }
}

fn live_allocations(url: &str) -> Vec<serde_json::Value> {
    ctl_json(url, &["allocations"]).as_array().cloned().unwrap_or_default()
}

/// `rackmem run --agent` of `tests/c/grow`, stdout lines streamed.
fn run_grow(c: &Cluster, args: &[&str], stats: &Path) -> (Guard, std::sync::mpsc::Receiver<String>) {
    run_grow_with(c, &[], args, stats)
}

/// [`run_grow`] with more `rackmem run` options.
fn run_grow_with(
    c: &Cluster,
    extra: &[&str],
    args: &[&str],
    stats: &Path,
) -> (Guard, std::sync::mpsc::Receiver<String>) {
    let mut cmd = Command::new(rackmem());
    cmd.arg("run")
        .arg("--agent")
        .arg(&c.socket)
        .args(["--local", "25%", "--stats-json"])
        .arg(stats)
        .args(extra)
        .arg("--")
        .arg(program("grow"))
        .args(args)
        .env("RACKMEM_GROW", "16MiB")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut g = Guard::spawn(&mut cmd);
    let lines = lines_of(g.child().stdout.take().expect("stdout"));
    (g, lines)
}

fn checksum_of(lines: &std::sync::mpsc::Receiver<String>) -> String {
    let deadline = Instant::now() + LIMIT;
    loop {
        let l = lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the program ended without a checksum");
        if l.starts_with("checksum=") {
            return l;
        }
    }
}

fn wait_line(lines: &std::sync::mpsc::Receiver<String>, want: &str) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let l = lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|e| panic!("no line {want:?} from the program: {e}"));
        if l.starts_with(want) {
            return;
        }
    }
}

#[test]
fn memory_grows_through_the_agent_and_goes_back_at_exit() {
    require_root();
    let c = cluster();
    let args = ["8", "16", "200"];
    let native = native(&program("grow"), &args);
    let want = checksums(&native);
    let stats = c.dir.path().join("stats.jsonl");
    // Over the bricks' sockets (the default maps them: the next test).
    let (mut g, lines) = run_grow_with(&c, &["--no-shared-memory"], &args, &stats);
    // While it runs, its memory is allocations of node n1, each striped over both bricks.
    wait_line(&lines, "step 4");
    let live = live_allocations(&c.url);
    assert!(!live.is_empty(), "the program holds allocations");
    let bricks: std::collections::BTreeSet<u64> = live
        .iter()
        .flat_map(|a| a["segments"].as_array().cloned().unwrap_or_default())
        .filter_map(|s| s["brick_id"].as_u64())
        .collect();
    assert_eq!(bricks.len(), 2, "striped over both bricks: {live:?}");
    assert_eq!(vec![checksum_of(&lines)], want, "same data as natively");
    let status = g.wait_until(LIMIT).expect("the program finished");
    assert!(status.success(), "{status:?}");
    let s = read_stats(&stats);
    let s = busiest(&s);
    // A quarter of the footprint stayed local: the rest went to the bricks and came back.
    assert!(
        s.peak_resident_bytes <= s.window_bytes_allocated / 4 + (1 << 20),
        "{s:?}"
    );
    assert!(
        s.bytes_written_back > 0 && s.bytes_fetched + s.bytes_prefetched > 0,
        "{s:?}"
    );
    wait_for("every allocation to be returned", || {
        live_allocations(&c.url).is_empty()
    });
}

#[test]
fn managed_bricks_share_segments_with_programs_on_their_host() {
    require_root();
    // The agent's segments come from control-plane grants; SHARE needs only the attached grant.
    // Mapping them is the default for bricks on this host: no option asks for it.
    let c = cluster();
    let args = ["8", "16", "200"];
    let want = checksums(&native(&program("grow"), &args));
    let stats = c.dir.path().join("stats.jsonl");
    let (mut g, lines) = run_grow(&c, &args, &stats);
    assert_eq!(vec![checksum_of(&lines)], want, "same data as natively");
    let status = g.wait_until(LIMIT).expect("the program finished");
    assert!(status.success(), "{status:?}");
    let s = read_stats(&stats);
    let s = busiest(&s);
    assert!(s.bytes_written_back > 0, "{s:?}");
    assert!(
        s.extra("bytes_fetched_shared") > 0,
        "pages came back by memory copy: {s:?}"
    );
    wait_for("every allocation to be returned", || {
        live_allocations(&c.url).is_empty()
    });
}

#[test]
fn control_plane_restarts_mid_run_without_losing_anything() {
    require_root();
    let mut c = cluster();
    let args = ["8", "16", "300"];
    let want = checksums(&native(&program("grow"), &args));
    let stats = c.dir.path().join("stats.jsonl");
    let (mut g, lines) = run_grow(&c, &args, &stats);
    wait_line(&lines, "step 3");
    let before = live_allocations(&c.url);
    assert!(!before.is_empty());
    // SIGKILL: no clean shutdown; the SQLite store must hold every allocation.
    if let Some(mut ctl_process) = c.control.take() {
        ctl_process.kill_group();
    }
    let (control, url) = start_control_on(&c.dir.path().join("control.db"), &c.listen);
    c.control = Some(control);
    assert_eq!(url, c.url);
    let after = live_allocations(&c.url);
    for a in &before {
        assert!(
            after
                .iter()
                .any(|b| b["id"] == a["id"] && b["segments"] == a["segments"]),
            "allocation {} survived the restart with its segments and grants",
            a["id"]
        );
    }
    // The program goes on growing (through the restarted control plane) and its earlier
    // buffers, on the bricks since before the restart, still check out word by word.
    assert_eq!(vec![checksum_of(&lines)], want);
    let status = g.wait_until(LIMIT).expect("the program finished");
    assert!(status.success(), "{status:?}");
    wait_for("every allocation to be returned", || {
        live_allocations(&c.url).is_empty()
    });
}

#[test]
fn a_killed_program_gives_its_memory_back() {
    require_root();
    let c = cluster();
    let stats = c.dir.path().join("stats.jsonl");
    // It sleeps a minute after its first step: killed while it holds memory.
    let (mut g, lines) = run_grow(&c, &["4", "16", "60000"], &stats);
    wait_line(&lines, "step 1");
    assert!(!live_allocations(&c.url).is_empty());
    g.kill_group();
    wait_for("the killed program's allocations to be returned", || {
        live_allocations(&c.url).is_empty()
    });
}

/// The agent's metrics page.
fn scrape(addr: &str) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).expect("metrics endpoint");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// One request line to the agent, one JSON reply.
fn ask(conn: &mut (UnixStream, BufReader<UnixStream>), line: &str) -> serde_json::Value {
    conn.0.write_all(line.as_bytes()).expect("send");
    conn.0.write_all(b"\n").expect("send");
    let mut answer = String::new();
    conn.1.read_line(&mut answer).expect("answer");
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("agent answered {answer:?}: {e}"))
}

#[test]
fn the_agent_refuses_bad_requests_clearly_and_keeps_nothing() {
    require_root();
    let c = cluster();
    let s = UnixStream::connect(&c.socket).expect("connect");
    let mut conn = (s.try_clone().expect("clone"), BufReader::new(s));
    let code = |v: &serde_json::Value| v["error"]["code"].as_str().unwrap_or("").to_string();

    let r = ask(&mut conn, r#"{"op":"grow","bytes":1048576}"#);
    assert_eq!(
        (r["ok"].as_bool(), code(&r).as_str()),
        (Some(false), "bad_request"),
        "{r}"
    );
    let r = ask(&mut conn, "this is not json");
    assert_eq!(code(&r), "bad_request", "{r}");
    let r = ask(&mut conn, r#"{"op":"hello","pid":1,"program":"test"}"#);
    assert_eq!(r["ok"], true, "{r}");
    assert!(r["node"].as_u64().is_some_and(|n| n > 0), "{r}");
    let r = ask(&mut conn, r#"{"op":"grow","bytes":1099511627776}"#);
    assert_eq!(r["ok"], false, "a terabyte cannot be had: {r}");
    assert!(["insufficient_capacity", "invalid"].contains(&code(&r).as_str()), "{r}");
    let r = ask(&mut conn, r#"{"op":"grow","bytes":0}"#);
    assert_eq!(r["ok"], false, "{r}");
    let r = ask(&mut conn, r#"{"op":"release","allocation":424242}"#);
    assert_eq!(code(&r), "not_found", "{r}");
    assert!(live_allocations(&c.url).is_empty(), "refused requests reserved nothing");

    let r = ask(&mut conn, r#"{"op":"grow","bytes":4194304}"#);
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["segments"].as_array().map(Vec::len), Some(2), "striped: {r}");
    let id = r["allocation"].as_u64().expect("allocation id");
    let r = ask(&mut conn, r#"{"op":"rates"}"#);
    assert_eq!(r["rates"].as_array().map(Vec::len), Some(2), "{r}");
    let m = scrape(&c.metrics);
    for line in [
        "rackmem_agent_processes 1",
        "rackmem_agent_allocations 1",
        "rackmem_agent_allocated_bytes 4194304",
    ] {
        assert!(m.lines().any(|l| l == line), "metrics lack {line:?}: {m}");
    }
    assert!(m.contains("rackmem_agent_refusals_total "), "{m}");
    let r = ask(&mut conn, &format!(r#"{{"op":"release","allocation":{id}}}"#));
    assert_eq!(r["ok"], true, "{r}");
    assert!(live_allocations(&c.url).is_empty());
}

#[test]
fn a_forking_program_on_agent_memory_execs_its_children() {
    require_root();
    // The children exec (a shell, then this program again, which gets memory of its own from
    // the agent); the parent's data survives both.
    let c = cluster();
    let want = checksums(&native(&program("fork_exec"), &["16"]));
    let mut cmd = Command::new(rackmem());
    cmd.arg("run")
        .arg("--agent")
        .arg(&c.socket)
        .args(["--local", "25%", "--"])
        .arg(program("fork_exec"))
        .arg("16")
        .env("RACKMEM_GROW", "16MiB");
    let o = run_with_deadline(cmd, LIMIT);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(checksums(&o), want, "{}", show(&o));
    wait_for("every allocation to be returned", || {
        live_allocations(&c.url).is_empty()
    });
}

#[test]
fn an_unreachable_agent_is_a_clear_error_before_the_program_starts() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(rackmem());
    cmd.arg("run")
        .arg("--agent")
        .arg(dir.path().join("no-agent.sock"))
        .args(["--", "sh", "-c", "echo started"]);
    let o = run_with_deadline(cmd, LIMIT);
    assert_eq!(o.status.code(), Some(69), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot reach the node agent"), "{err}");
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("started"),
        "the program must not run"
    );
}
