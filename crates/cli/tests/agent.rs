//! The whole control path with real processes: `rackmem control` (SQLite), two managed bricks,
//! `rackmem agent`, and an unmodified program under `rackmem run --agent` whose memory grows,
//! shrinks and grows again. Data is checked word by word by the program and by checksum against
//! a native run; the control plane's state is checked through `rackmem ctl`.

mod common;
#[path = "../../control/tests/lossy_proxy/mod.rs"]
mod lossy_proxy;
use common::*;
use lossy_proxy::LossyProxy;
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
    agent: Option<Guard>,
    /// The agent's command line, to start it again.
    agent_args: Vec<String>,
    socket: PathBuf,
    metrics: String,
    /// Each brick's `--metrics` address.
    brick_metrics: Vec<String>,
    /// Each brick's standard error, drained (so a full pipe never blocks a brick) and shown
    /// when a wait on the bricks fails.
    _brick_logs: Vec<std::sync::mpsc::Receiver<String>>,
    /// Between agent and control plane, when asked for.
    proxy: Option<LossyProxy>,
}

impl Cluster {
    /// What the agent printed so far.
    fn agent_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// (Re)starts the agent and waits for its socket.
    fn start_agent(&mut self) {
        let mut cmd = Command::new(rackmem());
        // Its log goes to a file, for a failing test to show.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("agent.log"))
            .expect("agent log");
        cmd.args(&self.agent_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.agent = Some(Guard::spawn(&mut cmd));
        let socket = self.socket.clone();
        wait_for("the agent's socket", || UnixStream::connect(&socket).is_ok());
        // Its metrics endpoint opens just after the socket.
        let metrics = self.metrics.clone();
        wait_for("the agent's metrics endpoint", || {
            std::net::TcpStream::connect(&metrics).is_ok()
        });
    }
}

fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").to_string()
}

/// [`wait_for`], failing with what the processes behind `logs` printed.
fn wait_for_or(what: &str, logs: &[std::sync::mpsc::Receiver<String>], mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + START_LIMIT;
    while !ok() {
        if Instant::now() >= deadline {
            let printed: Vec<String> = logs.iter().flat_map(|l| l.try_iter()).collect();
            panic!(
                "timed out waiting for {what}; the processes printed:\n{}",
                printed.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The address a process's "metrics at http://ADDR/metrics" line names.
fn metrics_address(log: &std::sync::mpsc::Receiver<String>, who: &str) -> String {
    let deadline = Instant::now() + START_LIMIT;
    let mut printed = Vec::new();
    loop {
        match log.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                if let Some(rest) = line.split("metrics at http://").nth(1) {
                    return rest.trim_end_matches("/metrics").to_string();
                }
                printed.push(line);
            }
            Err(e) => panic!(
                "{who} did not say where its metrics are ({e}); it printed:\n{}",
                printed.join("\n")
            ),
        }
    }
}

/// A control plane on a fixed port (so it can be restarted), two 1 GiB bricks over Unix
/// sockets, and an agent spreading each allocation over both bricks.
fn cluster() -> Cluster {
    cluster_with(&[], false)
}

/// [`cluster`] with more agent options, and the agent talking to the control plane through a
/// [`LossyProxy`] when `proxy` is set.
fn cluster_with(agent_extra: &[&str], proxy: bool) -> Cluster {
    cluster_on(agent_extra, proxy, false, 2)
}

/// [`cluster_with`], the bricks serving `tls://127.0.0.1:0` with a certificate from a CA
/// written to `ca.pem` in the cluster's directory, when `tls` is set; `n_bricks` bricks (b0,
/// b1, ...).
fn cluster_on(agent_extra: &[&str], proxy: bool, tls: bool, n_bricks: usize) -> Cluster {
    cluster_sized(agent_extra, proxy, tls, n_bricks, "1GiB", &[])
}

/// [`cluster_on`] with bricks of `brick_size` and more `rackmem control` options.
fn cluster_sized(
    agent_extra: &[&str],
    proxy: bool,
    tls: bool,
    n_bricks: usize,
    brick_size: &str,
    control_extra: &[&str],
) -> Cluster {
    let dir = tempfile::tempdir().expect("tempdir");
    // Tests run clients as another user: they must reach the socket's directory.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let listen = free_port();
    let (control, url) = if control_extra.is_empty() {
        start_control_on(&dir.path().join("control.db"), &listen)
    } else {
        let store = format!("sqlite:{}", dir.path().join("control.db").display());
        let mut args = vec!["--listen", &listen, "--brick-timeout", "5s", "--store", &store];
        args.extend_from_slice(control_extra);
        start_control_with(&args)
    };
    let mut bricks = Vec::new();
    let mut brick_metrics = Vec::new();
    let mut brick_logs = Vec::new();
    let tls_files = tls.then(|| tls_files(dir.path()));
    for i in 0..n_bricks {
        let (g, metrics, log) = spawn_brick_sized(dir.path(), &url, i, tls_files.as_ref(), brick_size);
        brick_metrics.push(metrics);
        bricks.push(g);
        brick_logs.push(log);
    }
    wait_for_or("the bricks to register", &brick_logs, || {
        ctl_json(&url, &["bricks"]).as_array().map_or(0, Vec::len) == n_bricks
    });
    let socket = dir.path().join("agent.sock");
    let metrics = free_port();
    let proxy = proxy.then(|| LossyProxy::start(&url, 0));
    let agent_control = proxy.as_ref().map_or(url.clone(), |p| p.url.clone());
    let mut agent_args: Vec<String> = [
        "agent",
        "--control",
        &agent_control,
        "--name",
        "n1",
        "--stripe",
        "2",
        "--metrics",
        &metrics,
        "--socket",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    agent_args.push(socket.display().to_string());
    agent_args.extend(agent_extra.iter().map(|s| s.to_string()));
    let mut c = Cluster {
        dir,
        url,
        listen,
        control: Some(control),
        _bricks: bricks,
        agent: None,
        agent_args,
        socket,
        metrics,
        brick_metrics,
        _brick_logs: brick_logs,
        proxy,
    };
    c.start_agent();
    c
}

/// Starts managed brick `b{i}` of 1 GiB (on a Unix socket in `dir`, or TLS with `tls`'s
/// certificate and key) registering with `url`: its guard, its metrics address and its
/// standard error.
fn spawn_brick(
    dir: &Path,
    url: &str,
    i: usize,
    tls: Option<&(String, String, String)>,
) -> (Guard, String, std::sync::mpsc::Receiver<String>) {
    spawn_brick_sized(dir, url, i, tls, "1GiB")
}

/// [`spawn_brick`] of `size`.
fn spawn_brick_sized(
    dir: &Path,
    url: &str,
    i: usize,
    tls: Option<&(String, String, String)>,
    size: &str,
) -> (Guard, String, std::sync::mpsc::Receiver<String>) {
    let mut cmd = Command::new(rackmem());
    cmd.args(["brick", "--listen"]);
    match tls {
        None => cmd.arg(format!("unix:{}", dir.join(format!("b{i}.sock")).display())),
        Some((_, cert, key)) => cmd.args(["tls://127.0.0.1:0", "--tls-cert", cert, "--tls-key", key]),
    };
    // Port 0, and the address read back from the brick: a port picked here and released
    // could be taken by another process's connection before the brick binds it (a brick
    // that failed that way once left this test waiting for its registration, unexplained).
    cmd.args(["--size", size, "--control", url, "--name", &format!("b{i}")])
        .args(["--heartbeat-ms", "100", "--metrics", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut g = Guard::spawn(&mut cmd);
    let log = lines_of(g.child().stderr.take().expect("stderr"));
    let metrics = metrics_address(&log, &format!("brick b{i}"));
    (g, metrics, log)
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
fn memory_from_tls_bricks_through_the_agent() {
    require_root();
    // Managed bricks on tls:// register tls:// addresses; the program's links verify them
    // against the CA given to rackmem run.
    let c = cluster_on(&[], false, true, 2);
    let addresses: Vec<String> = ctl_json(&c.url, &["bricks"])
        .as_array()
        .expect("bricks")
        .iter()
        .filter_map(|b| b["address"].as_str().map(str::to_string))
        .collect();
    assert!(addresses.iter().all(|a| a.starts_with("tls://")), "{addresses:?}");
    let args = ["8", "16", "200"];
    let want = checksums(&native(&program("grow"), &args));
    let stats = c.dir.path().join("stats.jsonl");
    let ca = c.dir.path().join("ca.pem").display().to_string();
    let (mut g, lines) = run_grow_with(&c, &["--tls-ca", &ca], &args, &stats);
    assert_eq!(vec![checksum_of(&lines)], want, "same data as natively");
    let status = g.wait_until(LIMIT).expect("the program finished");
    assert!(status.success(), "{status:?}");
    let s = read_stats(&stats);
    let s = busiest(&s);
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

/// The value of the sample `name{labels}` whose labels include every `want` (`key="value"`).
fn sample(text: &str, name: &str, want: &[&str]) -> Option<f64> {
    text.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, labels) = series.split_once('{').unwrap_or((series, ""));
        (n == name && want.iter().all(|w| labels.contains(w))).then(|| value.parse().ok())?
    })
}

#[test]
fn a_running_programs_figures_reach_the_agent_the_control_plane_and_the_bricks_metrics() {
    require_root();
    let c = cluster();
    let stats = c.dir.path().join("stats.jsonl");
    let args = ["6", "16", "1500"];
    let (mut g, lines) = run_grow(&c, &args, &stats);
    wait_line(&lines, "step 3");
    let grow = program("grow");
    let grow = grow.to_str().expect("path");
    let prog = format!("program=\"{grow}\"");
    // The agent: the program's figures while it runs, in its metrics, per process.
    let mut m = String::new();
    wait_for("the program's figures in the agent's metrics", || {
        m = scrape(&c.metrics);
        sample(&m, "rackmem_agent_process_faults_total", &[&prog]).is_some_and(|v| v > 0.0)
    });
    let count = sample(&m, "rackmem_agent_process_fault_seconds_count", &[&prog]).expect("histogram");
    let inf = sample(
        &m,
        "rackmem_agent_process_fault_seconds_bucket",
        &[&prog, "le=\"+Inf\""],
    )
    .expect("+Inf");
    assert!(count > 0.0 && inf == count, "{m}");
    assert!(
        sample(&m, "rackmem_agent_process_window_bytes", &[&prog]).is_some_and(|v| v >= (1 << 24) as f64),
        "a 16 MiB step at least (the report may be a second old): {m}"
    );
    // The control plane: the same process under its node, with C-AMAT computed.
    let mut p = serde_json::Value::Null;
    wait_for("the program in GET /v1/processes", || {
        p = ctl_json(&c.url, &["processes"])
            .as_array()
            .and_then(|a| a.iter().find(|v| v["report"]["program"] == grow).cloned())
            .unwrap_or_default();
        p["report"]["faults"].as_u64().is_some_and(|f| f > 0)
    });
    assert_eq!(p["node_name"], "n1", "{p}");
    let r = &p["report"];
    let cumulative: Vec<u64> = r["fault_latency"]["cumulative"]
        .as_array()
        .expect("cumulative")
        .iter()
        .map(|v| v.as_u64().expect("count"))
        .collect();
    assert!(cumulative.windows(2).all(|w| w[0] <= w[1]), "{p}");
    assert!(r["fault_latency"]["count"].as_u64().is_some_and(|n| n > 0), "{p}");
    assert!(p["bricks_camat_ns"].as_f64().is_some_and(|v| v > 0.0), "{p}");
    assert!(
        p["stall_share"].as_f64().is_some_and(|v| (0.0..=1.0).contains(&v)),
        "{p}"
    );
    assert!(r["budget_bytes"].as_u64().is_some_and(|b| b > 0), "{p}");
    // The bricks' level brick by brick: the program's pages come from the two bricks.
    let levels = p["bricks"].as_array().expect("bricks' levels").clone();
    assert!(!levels.is_empty(), "no brick's level reported: {p}");
    for l in &levels {
        let brick = l["brick"].as_str().expect("brick");
        assert!(brick.ends_with("b0.sock") || brick.ends_with("b1.sock"), "{l}");
        let faults = l["faults"].as_u64().expect("faults");
        assert!(l["pure_misses"].as_u64().is_some_and(|m| m <= faults), "{l}");
        if faults > 0 {
            assert!(l["camat_ns"].as_f64().is_some_and(|v| v > 0.0), "{l}");
            assert!(l["miss_concurrency"].as_f64().is_some_and(|v| v >= 1.0), "{l}");
        }
    }
    assert!(levels.iter().any(|l| l["faults"].as_u64() > Some(0)), "{p}");
    // The agent's metrics carry them too, per process and brick.
    wait_for("the bricks' levels in the agent's metrics", || {
        m = scrape(&c.metrics);
        sample(&m, "rackmem_agent_process_brick_faults_total", &[&prog, "brick=\""]).is_some_and(|v| v > 0.0)
    });
    assert!(
        sample(&m, "rackmem_agent_process_brick_camat_seconds", &[&prog, "brick=\""]).is_some(),
        "{m}"
    );
    // `rackmem top --once` shows it too.
    let o = Command::new(rackmem())
        .args(["top", "--once", "--control", &c.url])
        .output()
        .expect("rackmem top");
    let top = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && top.contains("grow") && top.contains("b0"),
        "{top}{}",
        show(&o)
    );
    assert!(
        top.contains("pure miss penalty") && top.contains(".sock"),
        "the per-brick table: {top}"
    );
    // The bricks: requests served to it, timed per opcode, and its segments.
    let bricks: Vec<String> = c.brick_metrics.iter().map(|a| scrape(a)).collect();
    for b in &bricks {
        assert!(b.ends_with("# EOF\n"), "{b}");
        assert!(
            sample(b, "rackmem_brick_segments", &[]).is_some_and(|v| v >= 1.0),
            "{b}"
        );
        assert_eq!(
            sample(b, "rackmem_brick_capacity_bytes", &[]),
            Some((1u64 << 30) as f64),
            "{b}"
        );
    }
    let timed: f64 = bricks
        .iter()
        .flat_map(|b| {
            b.lines()
                .filter(|l| l.starts_with("rackmem_brick_request_seconds_count{"))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert!(timed > 0.0, "no request timed on either brick: {bricks:?}");
    assert_eq!(vec![checksum_of(&lines)], checksums(&native(&program("grow"), &args)));
    assert!(g.wait_until(LIMIT).expect("finished").success());
    // Gone from the agent once it exits.
    wait_for("the program to leave the agent's metrics", || {
        sample(&scrape(&c.metrics), "rackmem_agent_process_faults_total", &[&prog]).is_none()
    });
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
    assert!(
        ["insufficient_capacity", "invalid", "quota_exceeded"].contains(&code(&r).as_str()),
        "{r}"
    );
    let r = ask(&mut conn, r#"{"op":"grow","bytes":0}"#);
    assert_eq!(r["ok"], false, "{r}");
    let r = ask(&mut conn, r#"{"op":"release","allocation":424242}"#);
    assert_eq!(code(&r), "not_found", "{r}");
    // A report with a histogram of the wrong shape, and one missing its figures: refused, and
    // nothing shows in the metrics.
    let mut bad = serde_json::to_value(rackmem_proto::ProcessReport::default()).expect("json");
    bad["op"] = "report".into();
    let r = ask(&mut conn, &bad.to_string());
    assert_eq!(code(&r), "bad_request", "{r}");
    assert!(r.to_string().contains("fault_latency"), "{r}");
    let r = ask(&mut conn, r#"{"op":"report","pid":1}"#);
    assert_eq!(code(&r), "bad_request", "{r}");
    assert!(!scrape(&c.metrics).contains("rackmem_agent_process_faults_total{"));
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

/// The segments of every live allocation.
fn live_segments(url: &str) -> usize {
    live_allocations(url)
        .iter()
        .map(|a| a["segments"].as_array().map_or(0, Vec::len))
        .sum()
}

#[test]
fn a_forked_child_on_agent_memory_reads_and_writes_its_own_copy() {
    require_root();
    // The child checks the parent's data as of the fork, then child and parent write their own
    // halves at once, pass after pass, each checking it sees only its own writes (`fork_rw`):
    // over the bricks' sockets (pool clones share chunks) and mapped (memory-file clones).
    let c = cluster();
    let want = checksums(&native(&program("fork_rw"), &["32", "3"]));
    for extra in [&["--no-shared-memory"][..], &[]] {
        let stats = c.dir.path().join(format!("fork-rw-{}.jsonl", extra.len()));
        let mut cmd = Command::new(rackmem());
        cmd.arg("run")
            .arg("--agent")
            .arg(&c.socket)
            .args(["--local", "25%", "--stats-json"])
            .arg(&stats)
            .args(extra)
            .arg("--")
            .arg(program("fork_rw"))
            .args(["32", "3"])
            .env("RACKMEM_GROW", "16MiB");
        let o = run_with_deadline(cmd, LIMIT);
        assert!(o.status.success(), "{extra:?}: {}", show(&o));
        assert_eq!(checksums(&o), want, "{extra:?}: {}", show(&o));
        let s = read_stats(&stats);
        assert!(s.len() >= 2, "{extra:?}: statistics of the parent and the child: {s:?}");
        // The run's budget is a quarter of its footprint, shared by parent and child.
        s.iter().for_each(|s| assert_used_remote_memory_at(s, 25));
        wait_for("the parent's and the child's allocations to be returned", || {
            live_allocations(&c.url).is_empty()
        });
    }
}

#[test]
fn a_forked_childs_clones_go_back_when_it_exits() {
    require_root();
    let c = cluster();
    // Natively too, the child takes the first line and the parent, after it, the second.
    let mut n = Command::new(program("fork_wait"))
        .arg("32")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run fork_wait");
    n.stdin
        .take()
        .expect("stdin")
        .write_all(b"\n\n")
        .expect("write its lines");
    let o = n.wait_with_output().expect("fork_wait natively");
    assert!(o.status.success(), "{}", show(&o));
    let want = checksums(&o);
    let mut cmd = Command::new(rackmem());
    cmd.arg("run")
        .arg("--agent")
        .arg(&c.socket)
        .args(["--local", "25%", "--"])
        .arg(program("fork_wait"))
        .arg("32")
        .env("RACKMEM_GROW", "16MiB")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut g = Guard::spawn(&mut cmd);
    let mut stdin = g.child().stdin.take().expect("stdin");
    let lines = lines_of(g.child().stdout.take().expect("stdout"));
    wait_line(&lines, "child ready");
    // The child holds a clone of each of its parent's segments, placed on the same bricks.
    let both = live_segments(&c.url);
    // On the same bricks as their sources: each brick holds as many of the clones as of the
    // parent's segments.
    let per_brick = |list: &[serde_json::Value]| {
        let mut m = std::collections::BTreeMap::<u64, usize>::new();
        for s in list
            .iter()
            .flat_map(|a| a["segments"].as_array().cloned().unwrap_or_default())
        {
            *m.entry(s["brick_id"].as_u64().unwrap_or(0)).or_default() += 1;
        }
        m
    };
    let with_clones = per_brick(&live_allocations(&c.url));
    assert!(
        both >= 2 && both.is_multiple_of(2),
        "parent's segments and their clones: {both}"
    );
    stdin.write_all(b"\n").expect("let the child end");
    wait_line(&lines, "child gone");
    wait_for("the child's clones to be returned", || {
        live_segments(&c.url) == both / 2
    });
    let without = per_brick(&live_allocations(&c.url));
    assert!(
        with_clones
            .iter()
            .all(|(b, n)| without.get(b).is_some_and(|m| 2 * m == *n)),
        "{with_clones:?} against {without:?}"
    );
    stdin.write_all(b"\n").expect("let the parent end");
    let mut got = Vec::new();
    while let Ok(l) = lines.recv_timeout(LIMIT) {
        got.push(l);
    }
    let status = g.wait_until(LIMIT).expect("the program finished");
    assert!(status.success(), "{status:?}: {got:?}");
    let sums: Vec<String> = got.into_iter().filter(|l| l.contains("checksum=")).collect();
    assert_eq!(sums, want, "the parent's data as natively");
    wait_for("every allocation to be returned", || {
        live_allocations(&c.url).is_empty()
    });
}

#[test]
fn a_clone_over_the_node_quota_is_refused_and_the_child_says_why() {
    require_root();
    let c = cluster();
    let mut cmd = Command::new(rackmem());
    cmd.arg("run")
        .arg("--agent")
        .arg(&c.socket)
        .args(["--local", "25%", "--"])
        .arg(program("fork_wait"))
        .args(["32", "refused"])
        .env("RACKMEM_GROW", "16MiB")
        .env("RACKMEM_VERBOSE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut g = Guard::spawn(&mut cmd);
    let mut stdin = g.child().stdin.take().expect("stdin");
    let lines = lines_of(g.child().stdout.take().expect("stdout"));
    let errors = lines_of(g.child().stderr.take().expect("stderr"));
    wait_line(&lines, "filled");
    // The node may hold what it holds now, and no more: the clone cannot be placed.
    let held: u64 = live_allocations(&c.url)
        .iter()
        .filter_map(|a| a["size_bytes"].as_u64())
        .sum();
    let o = ctl(&c.url, &["node-quota", "n1", &held.to_string()]);
    assert!(o.status.success(), "{}", show(&o));
    let before = live_segments(&c.url);
    stdin.write_all(b"\n\n").expect("let it fork");
    wait_line(&lines, "child gone");
    let mut got = Vec::new();
    while let Ok(l) = lines.recv_timeout(LIMIT) {
        got.push(l);
    }
    let status = g.wait_until(LIMIT).expect("the program finished");
    let said: Vec<String> = errors.try_iter().collect();
    assert!(status.success(), "{status:?}: {got:?} {said:?}");
    assert!(got.iter().any(|l| l.contains("parent checksum=")), "{got:?}");
    assert!(
        said.iter()
            .any(|l| l.contains("has no access to its parent's remote memory") && l.contains("quota_exceeded")),
        "the child says why under RACKMEM_VERBOSE: {said:?}"
    );
    assert_eq!(live_segments(&c.url), 0, "nothing left behind");
    assert!(before > 0);
    wait_for("every allocation to be returned", || {
        live_allocations(&c.url).is_empty()
    });
}

#[test]
fn clones_are_for_the_forked_child_only() {
    require_root();
    let c = cluster();
    let mut a = connect(&c.socket);
    let mut b = connect(&c.socket);
    assert_eq!(ask(&mut a, HELLO)["ok"], true);
    assert_eq!(ask(&mut b, HELLO)["ok"], true);
    let r = ask(&mut a, r#"{"op":"grow","bytes":4194304}"#);
    let id = r["allocation"].as_u64().expect("allocation id");
    let segs: Vec<u64> = r["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .filter_map(|s| s["segment_id"].as_u64())
        .collect();
    // Another process cannot clone what it does not hold.
    let req = format!(r#"{{"op":"clone","sources":[{{"allocation":{id},"segments":{segs:?}}}]}}"#);
    let r = ask(&mut b, &req);
    assert_eq!(code_of(&r), "not_found", "{r}");
    let r = ask(&mut a, &req);
    assert_eq!(r["ok"], true, "{r}");
    let clone = r["clones"][0]["allocation"].as_u64().expect("clone id");
    let ticket = r["ticket"].as_str().expect("ticket").to_string();
    assert_eq!(
        r["clones"][0]["segments"].as_array().map(Vec::len),
        Some(segs.len()),
        "{r}"
    );
    // Neither a wrong ticket, nor the asker itself, nor a process that is not its child (a
    // grandchild: the shell forks the client) can adopt it.
    let r = ask(
        &mut b,
        &format!(r#"{{"op":"adopt","allocations":[{clone}],"ticket":"00"}}"#),
    );
    assert_eq!(code_of(&r), "not_found", "{r}");
    let adopt = format!(r#"{{"op":"adopt","allocations":[{clone}],"ticket":"{ticket}"}}"#);
    let r = ask(&mut b, &adopt);
    assert_eq!(code_of(&r), "not_found", "the asker itself: {r}");
    let o = Command::new("sh")
        .arg("-c")
        .arg(r#""$0" "$1" 0 "$2" "$3"; true"#)
        .arg(program("agent_client"))
        .arg(&c.socket)
        .args([HELLO, adopt.as_str()])
        .output()
        .expect("run agent_client");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let r = json(out.lines().nth(1).unwrap_or_else(|| panic!("two answers: {out}")));
    assert_eq!(code_of(&r), "permission_denied", "{r}");
    // The clone is the node's like any allocation; its parent's goes back when its connection
    // closes, the clone when nobody adopted it in time.
    assert_eq!(live_allocations(&c.url).len(), 2);
    drop(a);
    drop(b);
    wait_for("the parent's allocation to be returned", || {
        live_allocations(&c.url).len() == 1
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !live_allocations(&c.url).is_empty() {
        assert!(Instant::now() < deadline, "the clone nobody adopted was never returned");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(c.agent_log().contains("did not adopt it"), "{}", c.agent_log());
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

/// The user tests run clients as (nobody, nogroup on Debian-like systems).
const NOBODY: u32 = 65534;
const HELLO: &str = r#"{"op":"hello","pid":1,"program":"test"}"#;

fn code_of(v: &serde_json::Value) -> String {
    v["error"]["code"].as_str().unwrap_or("").to_string()
}

/// Runs `tests/c/agent_client` (as `uid`:`uid`, or as this test's user) sending `lines`;
/// returns the lines it printed.
fn agent_client(socket: &Path, uid: Option<u32>, lines: &[&str]) -> Vec<String> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program("agent_client"));
    cmd.arg(socket).arg("0").args(lines);
    if let Some(u) = uid {
        cmd.uid(u).gid(u);
    }
    let o = run_with_deadline(cmd, LIMIT);
    String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect()
}

fn json(line: &str) -> serde_json::Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"))
}

fn connect(socket: &Path) -> (UnixStream, BufReader<UnixStream>) {
    let s = UnixStream::connect(socket).expect("connect to the agent");
    // A generous deadline: an agent that never answers fails the test instead of hanging it.
    s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    (s.try_clone().expect("clone"), BufReader::new(s))
}

fn mode_of(p: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).expect("socket metadata");
    (m.mode() & 0o777, m.gid())
}

#[test]
fn only_root_and_the_agents_user_are_admitted_unless_others_are_allowed() {
    require_root();
    let c = cluster();
    // By default the socket is the agent's user's alone: another user cannot even open it.
    assert_eq!(mode_of(&c.socket).0, 0o600);
    let out = agent_client(&c.socket, Some(NOBODY), &[HELLO]);
    assert!(
        out.first().is_some_and(|l| l.starts_with("connect:")),
        "nobody must not reach a default agent: {out:?}"
    );
    let mut conn = connect(&c.socket);
    assert_eq!(ask(&mut conn, HELLO)["ok"], true, "root is admitted");

    // Admitting another user opens the file to all; the kernel's credentials still keep
    // nobody out, with a line naming the options that would let it in.
    let sock2 = c.dir.path().join("a2.sock");
    let _a2 = spawn_agent(&c.url, "n2", &sock2, &["--allow-uid", "12345"]);
    assert_eq!(mode_of(&sock2).0, 0o666);
    let out = agent_client(&sock2, Some(NOBODY), &[HELLO, r#"{"op":"grow","bytes":1048576}"#]);
    // (The agent may close before the client has written: it reports that, then the line.)
    let v = json(out.iter().find(|l| l.starts_with('{')).map_or("", String::as_str));
    assert_eq!(
        (v["ok"].as_bool(), code_of(&v).as_str()),
        (Some(false), "permission_denied"),
        "{out:?}"
    );
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("--allow-uid 65534") && msg.contains("--allow-gid 65534"),
        "{msg}"
    );
    assert!(
        !out.iter().any(|l| l.contains("\"ok\":true")),
        "the refused peer got nothing more: {out:?}"
    );

    // Admitting nobody's group: the socket belongs to that group (0660) and nobody is served.
    let sock3 = c.dir.path().join("a3.sock");
    let _a3 = spawn_agent(&c.url, "n3", &sock3, &["--allow-gid", &NOBODY.to_string()]);
    assert_eq!(mode_of(&sock3), (0o660, NOBODY));
    let out = agent_client(&sock3, Some(NOBODY), &[HELLO, r#"{"op":"grow","bytes":1048576}"#]);
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(json(&out[0])["ok"], true, "{out:?}");
    let grown = json(&out[1]);
    assert_eq!(grown["ok"], true, "{out:?}");
    let id = grown["allocation"].as_u64().expect("allocation id");
    wait_for("nobody's allocation to go back when it exits", || {
        !live_allocations(&c.url).iter().any(|a| a["id"].as_u64() == Some(id))
    });
}

#[test]
fn quotas_per_process_and_per_user_are_checked_before_the_control_plane() {
    require_root();
    let c = cluster_with(&["--quota-per-process", "8MiB", "--quota-per-uid", "12MiB"], false);
    let grow = |mib: u64| format!(r#"{{"op":"grow","bytes":{}}}"#, mib << 20);
    let mut a = connect(&c.socket);
    assert_eq!(ask(&mut a, HELLO)["ok"], true);
    for _ in 0..2 {
        let r = ask(&mut a, &grow(4));
        assert_eq!(r["ok"], true, "{r}");
    }
    let r = ask(&mut a, &grow(1));
    assert_eq!(code_of(&r), "quota_exceeded", "{r}");
    let msg = r["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("8388608") && msg.contains("--quota-per-process"),
        "the message gives the numbers and the option: {msg}"
    );
    // A second connection of the same process counts with the first (the kernel's pid).
    let mut b = connect(&c.socket);
    assert_eq!(ask(&mut b, HELLO)["ok"], true);
    assert_eq!(code_of(&ask(&mut b, &grow(1))), "quota_exceeded");
    // Another process of the same user gets what is left of the user's 12 MiB, no more.
    let out = agent_client(&c.socket, None, &[HELLO, &grow(4), &grow(1)]);
    assert_eq!(out.len(), 3, "{out:?}");
    assert_eq!(json(&out[1])["ok"], true, "{out:?}");
    let r = json(&out[2]);
    assert_eq!(code_of(&r), "quota_exceeded", "{out:?}");
    let msg = r["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("--quota-per-uid") && msg.contains("12582912"), "{msg}");
    // The refused grows reserved nothing: the first process's two allocations are all there
    // is (the other process has exited and given its own back).
    wait_for("the other process's allocation to go back", || {
        live_allocations(&c.url).len() == 2
    });
    // Released memory counts no more.
    let id = live_allocations(&c.url)[0]["id"].as_u64().expect("id");
    let r = ask(&mut a, &format!(r#"{{"op":"release","allocation":{id}}}"#));
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(ask(&mut b, &grow(4))["ok"], true, "within the quota again");
}

/// Threads of process `pid`.
fn threads_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

#[test]
fn connections_are_capped_and_every_request_gets_an_answer() {
    require_root();
    let cap = 20;
    let c = cluster_with(
        &["--max-connections", &cap.to_string(), "--request-timeout", "1s"],
        false,
    );
    let agent_pid = c.agent.as_ref().expect("agent").id();
    // Up to the cap, every connection is served; past it each gets one line and is closed.
    let mut served = Vec::new();
    for _ in 0..cap {
        let mut conn = connect(&c.socket);
        assert_eq!(ask(&mut conn, HELLO)["ok"], true);
        served.push(conn);
    }
    for _ in 0..3 * cap {
        let mut extra = connect(&c.socket);
        let mut line = String::new();
        extra.1.read_line(&mut line).expect("a refusal line");
        let v = json(&line);
        assert_eq!(code_of(&v), "too_many_connections", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("--max-connections"),
            "{v}"
        );
        line.clear();
        assert_eq!(extra.1.read_line(&mut line).ok(), Some(0), "then closed: {line:?}");
    }
    let threads = threads_of(agent_pid);
    // One thread per served connection, and a handful of the agent's own (main, accept,
    // release and reconcile, metrics): the refused connections cost none.
    assert!(threads <= cap + 8, "{threads} threads for {cap} connections");
    // One closes: a new one is served.
    drop(served.pop());
    wait_for("a free connection slot", || {
        let mut conn = connect(&c.socket);
        conn.0
            .write_all(HELLO.as_bytes())
            .and_then(|_| conn.0.write_all(b"\n"))
            .is_ok()
            && {
                let mut line = String::new();
                conn.1.read_line(&mut line).is_ok() && json(&line)["ok"] == true && {
                    served.push(conn);
                    true
                }
            }
    });

    // Malformed requests each get a JSON error with a code, and the connection goes on.
    let conn = served.last_mut().expect("a connection");
    for (line, want) in [
        ("this is not json", "bad_request"),
        ("", "bad_request"),
        ("[1,2,3]", "bad_request"),
        (r#"{"op":"fly"}"#, "unknown_op"),
        (r#"{"op":7}"#, "bad_request"),
        (r#"{"op":"grow","bytes":"many"}"#, "bad_request"),
        (r#"{"op":"grow","bytes":-1}"#, "bad_request"),
        (r#"{"op":"grow"}"#, "bad_request"),
        (r#"{"op":"release","allocation":1.5}"#, "bad_request"),
    ] {
        let r = ask(conn, line);
        assert_eq!(
            (r["ok"].as_bool(), code_of(&r).as_str()),
            (Some(false), want),
            "{line:?}: {r}"
        );
    }
    // Not UTF-8.
    conn.0.write_all(b"\xff\xfe{\n").expect("send");
    let mut answer = String::new();
    conn.1.read_line(&mut answer).expect("answer");
    assert_eq!(code_of(&json(&answer)), "bad_request", "{answer}");
    assert_eq!(ask(conn, r#"{"op":"rates"}"#)["ok"], true, "still served");

    // Too long: answered, then closed.
    let conn = &mut served[0];
    let long = format!(r#"{{"op":"hello","program":"{}"}}"#, "x".repeat(70 << 10));
    // The agent may close before the whole line is written: only its answer matters.
    let _ = conn.0.write_all(long.as_bytes());
    let mut answer = String::new();
    conn.1.read_line(&mut answer).expect("answer");
    assert_eq!(code_of(&json(&answer)), "request_too_long", "{answer}");
    answer.clear();
    assert_eq!(conn.1.read_line(&mut answer).ok(), Some(0), "closed after: {answer:?}");
    let conn = served.last_mut().expect("a connection");
    // Idle between requests is fine (processes hold their connection for life)...
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(ask(conn, r#"{"op":"rates"}"#)["ok"], true, "an idle connection is kept");
    // ...a request that trickles in is not: one line, then closed, within a generous deadline.
    conn.0.write_all(br#"{"op":"#).expect("send");
    let mut answer = String::new();
    conn.1.read_line(&mut answer).expect("answer");
    assert_eq!(code_of(&json(&answer)), "request_timeout", "{answer}");
    answer.clear();
    assert_eq!(conn.1.read_line(&mut answer).ok(), Some(0), "closed after: {answer:?}");
    assert!(live_allocations(&c.url).is_empty(), "nothing was allocated");
}

/// The agent's counter `name` from its metrics page.
fn metric(c: &Cluster, name: &str) -> u64 {
    let m = scrape(&c.metrics);
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {name} in {m}"))
}

#[test]
fn lost_replies_are_retried_and_allocations_nobody_holds_are_reclaimed() {
    require_root();
    // The pool is looked at once, at start: its requests would take replies the proxy is told
    // to lose (and the by-hand allocation below stays out of it, as it is not what this tests).
    let mut c = cluster_with(&["--reconcile-interval", "500ms", "--pool-interval", "1h"], true);
    let grow = r#"{"op":"grow","bytes":4194304}"#;
    let ids = |c: &Cluster| -> Vec<u64> {
        live_allocations(&c.url)
            .iter()
            .filter_map(|a| a["id"].as_u64())
            .collect()
    };
    let proxy = c.proxy.as_ref().expect("proxy");
    // A reply lost after the commit: the agent's retry carries the same key and gets the same
    // allocation; the control plane holds exactly one.
    let mut conn = connect(&c.socket);
    assert_eq!(ask(&mut conn, HELLO)["ok"], true);
    proxy.lose(1);
    let r = ask(&mut conn, grow);
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(proxy.lost(), 1);
    let held = r["allocation"].as_u64().expect("id");
    assert_eq!(ids(&c), vec![held], "one allocation for one grow");
    let live = live_allocations(&c.url);
    let holder = &live[0]["holder"];
    assert_eq!(holder["pid"].as_u64(), Some(u64::from(std::process::id())), "{holder}");
    assert!(holder["agent"].as_str().is_some_and(|a| !a.is_empty()), "{holder}");

    // Every attempt's reply lost: the process hears of a failure, the control plane has
    // committed an allocation nobody holds: an orphan.
    proxy.lose(3);
    let r = ask(&mut conn, grow);
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(proxy.lost(), 4);
    let orphan = *ids(&c).iter().find(|i| **i != held).expect("the committed orphan");
    // An allocation made by hand has no holder: no agent ever reclaims it.
    let o = ctl(&c.url, &["--json", "alloc", "--node", "n1", "--size", "4MiB"]);
    assert!(o.status.success(), "{}", show(&o));
    let by_hand = *ids(&c).iter().find(|i| ![held, orphan].contains(i)).expect("by hand");
    // A program that outlives its agent keeps its memory (the runtime keeps the segments it
    // attached); when it exits later, the next agent gives its memory back.
    let mut survivor_cmd = Command::new(program("agent_client"));
    survivor_cmd
        .arg(&c.socket)
        .arg("60000")
        .args([HELLO, grow])
        .stdout(Stdio::piped());
    let mut survivor = Guard::spawn(&mut survivor_cmd);
    let lines = lines_of(survivor.child().stdout.take().expect("stdout"));
    let _hello = lines.recv_timeout(LIMIT).expect("hello answered");
    let grown = json(&lines.recv_timeout(LIMIT).expect("grow answered"));
    let survivors = grown["allocation"].as_u64().expect("id");

    wait_for("the orphan to be reclaimed", || !ids(&c).contains(&orphan));
    assert!(metric(&c, "rackmem_agent_reclaimed_total ") >= 1);
    let reclaimed = metric(&c, "rackmem_agent_reclaimed_total ");
    // Several more reconciliations: what is held or made by hand stays.
    std::thread::sleep(Duration::from_millis(2000));
    let mut now = ids(&c);
    now.sort_unstable();
    let mut want = vec![held, by_hand, survivors];
    want.sort_unstable();
    assert_eq!(now, want);
    assert_eq!(metric(&c, "rackmem_agent_reclaimed_total "), reclaimed);

    // The agent dies (SIGKILL: no clean-up) and a new one starts: the programs it served are
    // alive, so it releases nothing.
    if let Some(mut a) = c.agent.take() {
        a.kill_group();
    }
    c.start_agent();
    std::thread::sleep(Duration::from_millis(2000));
    let mut now = ids(&c);
    now.sort_unstable();
    assert_eq!(now, want, "live programs keep their memory across an agent restart");
    // The survivor exits: no connection saw it go, reconciliation does.
    survivor.kill_group();
    wait_for("the exited program's memory to be reclaimed", || {
        !ids(&c).contains(&survivors)
    });
    let mut now = ids(&c);
    now.sort_unstable();
    assert_eq!(now, vec![held, by_hand], "the live process and the admin keep theirs");
}

#[test]
fn the_agent_renews_the_grants_of_memory_in_use_and_only_that() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite:{}", dir.path().join("control.db").display());
    let (_control, url) =
        start_control_with(&["--listen", "127.0.0.1:0", "--store", &store, "--grant-lifetime", "30s"]);
    let listen = format!("unix:{}", dir.path().join("b.sock").display());
    let _brick = start_managed_brick(&url, &listen, "256MiB", "b0", |_| {});
    let socket = dir.path().join("agent.sock");
    let _agent = spawn_agent(&url, "n1", &socket, &["--reconcile-interval", "1s"]);
    let mut conn = connect(&socket);
    assert_eq!(ask(&mut conn, HELLO)["ok"], true);
    let r = ask(&mut conn, r#"{"op":"grow","bytes":4194304}"#);
    assert_eq!(r["ok"], true, "{r}");
    let expiry = || -> Option<u64> {
        live_allocations(&url)
            .first()
            .and_then(|a| a["segments"][0]["grant_expires_unix_s"].as_u64())
    };
    let first = expiry().expect("the allocation and its expiry");
    assert!(first > 0, "grants of a 30 s lease must expire");
    // Held by a live connection: renewed, so its expiry moves on.
    wait_for("the agent to renew the lease", || expiry().is_some_and(|e| e > first));
    // Released when the connection closes; nothing left to renew.
    drop(conn);
    wait_for("the release", || live_allocations(&url).is_empty());
}

#[test]
fn a_cluster_runs_on_role_tokens_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite:{}", dir.path().join("control.db").display());
    let (_control, url) = start_control_with(&["--listen", "127.0.0.1:0", "--store", &store]);
    let token_file = |role: &str, name: &str| {
        let o = ctl(&url, &["token", "create", "--role", role, "--name", name]);
        assert!(o.status.success(), "{}", show(&o));
        let p = dir.path().join(format!("{name}.token"));
        std::fs::write(&p, &o.stdout).expect("token file");
        p
    };
    let (brick_token, node_token) = (token_file("brick", "b0"), token_file("node", "n1"));
    // Neither process sees the admin token: each has its own role's.
    let listen = format!("unix:{}", dir.path().join("b.sock").display());
    let _brick = start_managed_brick(&url, &listen, "256MiB", "b0", |cmd| {
        cmd.env_remove("RACKMEM_TOKEN_FILE")
            .arg("--token-file")
            .arg(&brick_token);
    });
    let socket = dir.path().join("agent.sock");
    let mut cmd = Command::new(rackmem());
    cmd.env_remove("RACKMEM_TOKEN_FILE")
        .args(["agent", "--control", &url, "--name", "n1", "--socket"])
        .arg(&socket)
        .arg("--token-file")
        .arg(&node_token)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _agent = Guard::spawn(&mut cmd);
    wait_for("the agent's socket", || UnixStream::connect(&socket).is_ok());
    let mut conn = connect(&socket);
    assert_eq!(ask(&mut conn, HELLO)["ok"], true);
    let r = ask(&mut conn, r#"{"op":"grow","bytes":4194304}"#);
    assert_eq!(r["ok"], true, "{r}");
    let all = live_allocations(&url);
    assert_eq!(all.len(), 1, "{all:?}");
    let nodes = ctl_json(&url, &["nodes"]);
    assert_eq!(nodes[0]["name"], "n1", "{nodes}");
    assert_eq!(all[0]["node"], nodes[0]["id"]);
    drop(conn);
    wait_for("the release", || live_allocations(&url).is_empty());
}

/// Chromium's headless `--dump-dom` (the DOM after the page's script ran) or `--screenshot` of
/// `url`, with a throwaway profile.
fn chromium(dir: &Path, url: &str, extra: &[&str]) -> std::process::Output {
    let found = ["chromium", "chromium-browser"].into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some(exe) = found else {
        panic!("this test needs Chromium (Debian's package chromium; scripts/setup.sh installs it)");
    };
    let profile = dir.join(format!("chromium-profile-{}", unique()));
    let mut c = Command::new(exe);
    c.args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--virtual-time-budget=6000")
        .args(extra)
        .arg(url)
        .stdin(Stdio::null());
    run_with_deadline(c, Duration::from_secs(90))
}

#[test]
fn the_dashboard_shows_what_the_api_says() {
    require_root();
    let c = cluster();
    let stats = c.dir.path().join("stats.jsonl");
    // A program holding memory through the agent, slowly, so the page sees it.
    let (mut g, lines) = run_grow(&c, &["6", "16", "1500"], &stats);
    wait_line(&lines, "step 3");
    let grow = program("grow").to_str().expect("path").to_string();
    let reported = |url: &str| -> u64 {
        ctl_json(url, &["processes"])
            .as_array()
            .and_then(|a| a.iter().find(|v| v["report"]["program"] == grow.as_str()).cloned())
            .and_then(|p| p["report"]["faults"].as_u64())
            .unwrap_or(0)
    };
    wait_for("the program's report to reach the control plane", || {
        reported(&c.url) > 0
    });
    let before = live_allocations(&c.url);
    let page = format!("{}/ui/#token={}", c.url, admin_token());
    let o = chromium(c.dir.path(), &page, &["--dump-dom"]);
    assert!(o.status.success(), "{}", show(&o));
    let after = live_allocations(&c.url);
    let dom = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        dom.contains("data-loaded=\"true\""),
        "the page never loaded its data: {dom}"
    );
    assert!(dom.contains(">signed in<"), "{dom}");
    // Bricks: every brick the API lists, with its capacity and state.
    for b in ctl_json(&c.url, &["bricks"]).as_array().expect("bricks") {
        let name = b["name"].as_str().expect("name");
        assert!(
            dom.contains(&format!("data-value=\"{name}\"")),
            "brick {name} missing: {dom}"
        );
        assert!(
            dom.contains(&format!("data-value=\"{}\"", b["capacity_bytes"])),
            "{b} {dom}"
        );
    }
    assert!(dom.contains("<b id=\"t-bricks\">2 / 2</b>"), "{dom}");
    // The node and its allocations: each shown allocation is one the API listed just before or
    // just after the page loaded (the program grows meanwhile), with the same size.
    assert!(dom.contains("data-value=\"n1\""), "node n1 missing: {dom}");
    let tbody = dom
        .split("<table id=\"allocations\">")
        .nth(1)
        .and_then(|t| t.split("<tbody>").nth(1))
        .and_then(|t| t.split("</tbody>").next())
        .expect("allocations table");
    let shown: Vec<&str> = tbody.split("<tr>").skip(1).collect();
    assert!(
        !shown.is_empty(),
        "no allocation shown while the program holds some: {tbody}"
    );
    for row in shown {
        let id = row
            .split("data-value=\"")
            .nth(1)
            .and_then(|v| v.split('"').next())
            .and_then(|v| v.parse::<u64>().ok())
            .expect("allocation id cell");
        let listed = before.iter().chain(&after).find(|a| a["id"].as_u64() == Some(id));
        let a = listed.unwrap_or_else(|| panic!("allocation {id} shown but never listed: {row}"));
        assert!(
            row.contains(&format!("data-value=\"{}\"", a["size_bytes"])),
            "{a} vs {row}"
        );
    }
    // The program, with at most the faults the API reports after the page loaded.
    let faults_after = reported(&c.url);
    let procs = dom
        .split("<table id=\"processes\">")
        .nth(1)
        .and_then(|t| t.split("</tbody>").next())
        .expect("processes table");
    let row = procs
        .split("<tr>")
        .find(|r| r.contains(&format!("data-value=\"{grow}\"")))
        .unwrap_or_else(|| panic!("the program is not shown: {procs}"));
    let shown: Vec<u64> = row
        .split("data-value=\"")
        .skip(1)
        .filter_map(|v| v.split('"').next()?.parse().ok())
        .collect();
    assert!(
        shown.iter().any(|f| *f > 0 && *f <= faults_after),
        "no fault count in 1..={faults_after} shown: {row}"
    );
    assert!(row.contains("class=\"hist\""), "{row}");
    // The bricks' level brick by brick: a brick the program's runtime reported, with at most the
    // faults the API reports for it after the page loaded.
    let brick_faults_after: Vec<(String, u64)> = ctl_json(&c.url, &["processes"])
        .as_array()
        .and_then(|a| a.iter().find(|v| v["report"]["program"] == grow.as_str()).cloned())
        .and_then(|p| p["bricks"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|l| Some((l["brick"].as_str()?.to_string(), l["faults"].as_u64()?)))
        .collect();
    let level = row
        .split("data-brick=\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no brick's level shown: {row}"));
    let shown_brick = level.split('"').next().expect("brick");
    let shown_faults: u64 = level
        .split("data-faults=\"")
        .nth(1)
        .and_then(|v| v.split('"').next()?.parse().ok())
        .expect("a brick's faults");
    let api = brick_faults_after.iter().find(|(b, _)| b == shown_brick);
    assert!(
        api.is_some_and(|(_, f)| shown_faults <= *f),
        "brick {shown_brick} with {shown_faults} faults shown, the API has {brick_faults_after:?}"
    );
    // A screenshot, for people (docs/img/dashboard.png is one).
    let shot = c.dir.path().join("dashboard.png");
    let o = chromium(
        c.dir.path(),
        &page,
        &["--window-size=1280,900", &format!("--screenshot={}", shot.display())],
    );
    assert!(o.status.success(), "{}", show(&o));
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());
    if let Ok(dir) = std::env::var("RACKMEM_SCREENSHOT_DIR") {
        let _ = std::fs::copy(&shot, Path::new(&dir).join("dashboard.png"));
    }
    // A refused token: the page says so and shows no data.
    let o = chromium(
        c.dir.path(),
        &format!("{}/ui/#token=rmk_1_bogus", c.url),
        &["--dump-dom"],
    );
    let dom = String::from_utf8_lossy(&o.stdout);
    assert!(dom.contains("the token was refused"), "{dom}");
    assert!(!dom.contains("data-value=\"b0\""), "{dom}");
    assert_eq!(
        vec![checksum_of(&lines)],
        checksums(&native(&program("grow"), &["6", "16", "1500"]))
    );
    assert!(g.wait_until(LIMIT).expect("finished").success());
}

#[test]
fn one_user_cannot_hold_every_connection_and_lock_out_roots_programs() {
    require_root();
    // The probe's attack: an admitted user opens as many idle connections as the agent serves
    // (1,024 by default).
    let c = cluster_with(&["--allow-uid", &NOBODY.to_string()], false);
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program("agent_hold"));
    cmd.arg(&c.socket)
        .arg("1024")
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut flood = Guard::spawn(&mut cmd);
    let lines = lines_of(flood.child().stdout.take().expect("stdout"));
    let counts = lines.recv_timeout(LIMIT).expect("agent_hold reports");
    assert_eq!(
        counts, "held=256 refused=768",
        "one user holds at most --max-connections-per-uid (256)"
    );
    // Root's programs are still served while the flood holds its connections: a connection
    // that grows, and a real program whose memory comes through the agent.
    let mut conn = connect(&c.socket);
    assert_eq!(ask(&mut conn, HELLO)["ok"], true);
    assert_eq!(ask(&mut conn, r#"{"op":"grow","bytes":1048576}"#)["ok"], true);
    let args = ["8", "16", "200"];
    let want = checksums(&native(&program("grow"), &args));
    let stats = c.dir.path().join("stats.jsonl");
    let (mut g, out) = run_grow(&c, &args, &stats);
    assert_eq!(vec![checksum_of(&out)], want, "same data as natively");
    let status = g.wait_until(LIMIT).expect("the program finished");
    assert!(status.success(), "{status:?}");
    assert_used_remote_memory_at(busiest(&read_stats(&stats)), 25);
    // The flood's refusals name the option.
    let m = scrape(&c.metrics);
    assert!(m.contains("rackmem_agent_connections_refused_total 768"), "{m}");
    drop(flood);
}

#[test]
fn a_request_line_trickled_a_byte_at_a_time_is_cut_at_its_deadline() {
    require_root();
    let c = cluster_with(&["--request-timeout", "1s"], false);
    let mut conn = connect(&c.socket);
    // A byte every 200 ms: each well within any per-read timeout, the whole line (8 s) far
    // beyond the deadline of its first byte. The agent must cut it before it is whole.
    let line = format!("{HELLO}\n");
    let mut sent = 0;
    for b in line.bytes() {
        if conn.0.write_all(&[b]).is_err() {
            break;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut answer = String::new();
    conn.1.read_line(&mut answer).expect("an answer");
    assert_eq!(code_of(&json(&answer)), "request_timeout", "{answer}");
    answer.clear();
    assert_eq!(conn.1.read_line(&mut answer).ok(), Some(0), "then closed: {answer:?}");
    assert!(
        sent < line.len(),
        "cut before the line was whole ({sent} of {} bytes)",
        line.len()
    );
}

#[test]
fn idle_scraper_connections_do_not_hold_up_metrics_scrapes() {
    require_root();
    let c = cluster();
    // Scraper connections that send nothing: one at a time, each used to hold the responder
    // for its 2 s read timeout, so these 100 would have delayed a scrape by minutes.
    let idle: Vec<std::net::TcpStream> = (0..100)
        .map(|_| std::net::TcpStream::connect(&c.metrics).expect("connect"))
        .collect();
    for _ in 0..5 {
        let mut s = std::net::TcpStream::connect(&c.metrics).expect("metrics endpoint");
        // Generous, but far below what the queue of idle connections used to cost.
        s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
        let mut out = String::new();
        use std::io::Read;
        s.read_to_string(&mut out).expect("the scrape is answered");
        assert!(
            out.starts_with("HTTP/1.1 200") && out.contains("rackmem_agent_processes"),
            "{out}"
        );
    }
    drop(idle);
}

/// Memory pushed to a node (issue 26, item 4): `rackmem ctl alloc --node` makes an allocation
/// the node's agent attaches into its pool at once; a program's first grow is served from the
/// pool, not by a new allocation, and its data is right; `rackmem ctl nodes` shows the pool and
/// what is in use; a release asked while the program uses it waits for the program to exit,
/// and then the agent releases it.
#[test]
fn memory_pushed_to_a_node_serves_its_programs_and_is_released_once_unused() {
    require_root();
    let c = cluster();
    wait_for("the agent to register node n1", || {
        ctl_json(&c.url, &["nodes"]).as_array().is_some_and(|n| !n.is_empty())
    });
    let pushed = ctl_json(&c.url, &["alloc", "--node", "n1", "--size", "64MiB", "--stripe", "2"]);
    let id = pushed["id"].as_u64().expect("allocation id");
    let node = |c: &Cluster| ctl_json(&c.url, &["nodes"])[0].clone();
    wait_for("the agent to attach the pushed memory", || {
        node(&c)["pool_attached_bytes"].as_u64() == Some(64 << 20)
    });
    let n = node(&c);
    assert_eq!(
        (n["pool_bytes"].as_u64(), n["pool_in_use_bytes"].as_u64()),
        (Some(64 << 20), Some(0)),
        "{n}"
    );
    let shown = ctl(&c.url, &["nodes"]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("64.0 MiB (64.0 MiB, 0 B)"),
        "{}",
        show(&shown)
    );

    // A program that grows by 16 MiB steps: its first grow is the pushed allocation.
    let args = ["8", "16", "200"];
    let want = checksums(&native(&program("grow"), &args));
    let stats = c.dir.path().join("stats.jsonl");
    let (mut g, lines) = run_grow_with(&c, &["--no-shared-memory"], &args, &stats);
    wait_line(&lines, "step 4");
    let n = node(&c);
    assert_eq!(
        n["pool_in_use_bytes"].as_u64(),
        Some(64 << 20),
        "the program uses the pool: {n}"
    );
    let live = live_allocations(&c.url);
    let pushed_live = live.iter().filter(|a| a["holder"].is_null()).count();
    assert_eq!(
        pushed_live, 1,
        "no allocation is made by hand but the pushed one: {live:?}"
    );

    // Released while in use: deferred, nothing taken from the program.
    let r = ctl_json(&c.url, &["free", &id.to_string()]);
    assert_eq!(r["deferred"], true, "{r}");
    assert!(
        live_allocations(&c.url).iter().any(|a| a["id"] == id),
        "still live while used"
    );
    assert_eq!(vec![checksum_of(&lines)], want, "same data as natively");
    let status = g.wait_until(LIMIT).expect("the program finished");
    assert!(status.success(), "{status:?}");
    // The program is gone: the agent releases the pushed allocation, and the program's own.
    wait_for("every allocation to be released", || {
        live_allocations(&c.url).is_empty()
    });
    let n = node(&c);
    assert_eq!(n["pool_bytes"].as_u64(), Some(0), "{n}");

    // Pushed again and released while unused: released at once, and gone from the pool.
    let again = ctl_json(&c.url, &["alloc", "--node", "n1", "--size", "32MiB"]);
    wait_for("the agent to attach it", || {
        node(&c)["pool_attached_bytes"].as_u64() == Some(32 << 20)
    });
    let r = ctl_json(&c.url, &["free", &again["id"].as_u64().expect("id").to_string()]);
    assert_eq!(r["deferred"], false, "{r}");
    assert!(live_allocations(&c.url).is_empty());
}

/// A migration's target: a grow on a named brick is one segment there, placed and accounted by
/// the control plane like any allocation; a brick the control plane does not know is refused.
#[test]
fn a_grow_on_a_named_brick_places_one_segment_there() {
    require_root();
    let c = cluster();
    let bricks = ctl_json(&c.url, &["bricks"]);
    let list = bricks.as_array().expect("bricks");
    let b1 = list.iter().find(|b| b["name"] == "b1").expect("brick b1");
    let (b1_id, b1_address) = (
        b1["id"].as_u64().expect("id"),
        b1["address"].as_str().expect("address").to_string(),
    );
    let s = UnixStream::connect(&c.socket).expect("connect");
    let mut conn = (s.try_clone().expect("clone"), BufReader::new(s));
    let r = ask(&mut conn, r#"{"op":"hello","pid":1,"program":"test"}"#);
    assert_eq!(r["ok"], true, "{r}");
    let grow = serde_json::json!({"op": "grow", "bytes": 8u64 << 20, "brick": b1_address});
    let r = ask(&mut conn, &grow.to_string());
    assert_eq!(r["ok"], true, "{r}");
    let segments = r["segments"].as_array().expect("segments");
    assert_eq!(segments.len(), 1, "one segment, though the agent stripes over 2: {r}");
    assert_eq!(segments[0]["brick_address"], b1_address.as_str(), "{r}");
    let id = r["allocation"].as_u64().expect("allocation id");
    let live = live_allocations(&c.url);
    assert_eq!(live.len(), 1, "{live:?}");
    let placed: Vec<u64> = live[0]["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .filter_map(|s| s["brick_id"].as_u64())
        .collect();
    assert_eq!(placed, vec![b1_id], "accounted on b1: {live:?}");
    let r = ask(
        &mut conn,
        r#"{"op":"grow","bytes":8388608,"brick":"unix:/nonexistent/brick.sock"}"#,
    );
    assert_eq!(code_of(&r), "not_found", "{r}");
    let r = ask(&mut conn, &format!(r#"{{"op":"release","allocation":{id}}}"#));
    assert_eq!(r["ok"], true, "{r}");
    assert!(live_allocations(&c.url).is_empty());
}

/// Migration on managed memory (issue 23): a program on agent memory moves its buffer between
/// the control plane's two bricks and its local buffer while another of its threads keeps
/// writing it; the targets are segments the control plane places on the named brick; the buffer
/// ends equal to the program's model, and every allocation goes back when it exits.
#[test]
fn a_buffer_on_agent_memory_moves_between_bricks_while_written() {
    require_root();
    let c = cluster();
    let bricks = ctl_json(&c.url, &["bricks"]);
    let address = |name: &str| -> String {
        let list = bricks.as_array().expect("bricks");
        let b = list.iter().find(|b| b["name"] == name).expect("brick");
        b["address"].as_str().expect("address").to_string()
    };
    let (a, b) = (address("b0"), address("b1"));
    let stats = c.dir.path().join("stats.jsonl");
    let mut cmd = Command::new(rackmem());
    cmd.arg("run")
        .arg("--agent")
        .arg(&c.socket)
        .args(["--local", "8MiB", "--stats-json"])
        .arg(&stats)
        .arg("--")
        .arg(program("migrate_rw"))
        .args(["moves", "32", &a, &b, "2"]);
    let o = run_with_deadline(cmd, LIMIT);
    assert!(o.status.success(), "{}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.starts_with("checksum "))
        .unwrap_or_else(|| panic!("no checksum line in:\n{out}"));
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(w[1], w[3], "the buffer differs from the program's model:\n{out}");
    let moved_to_b = out
        .lines()
        .filter(|l| l.starts_with(&format!("migrated 32 MiB to {b}:")))
        .count();
    assert_eq!(moved_to_b, 2, "two moves to brick b1:\n{out}");
    let s = read_stats(&stats);
    let s = busiest(&s);
    assert_eq!(s.extra("migrations"), 7, "migrations counted in --stats-json");
    assert!(s.extra("migration_bytes") >= 32 << 20, "{}", s.extra("migration_bytes"));
    assert!(
        s.extra("migration_pieces_direct") >= 2,
        "the moves of the whole buffer between bricks are pulled directly: {} direct, {} bounced",
        s.extra("migration_pieces_direct"),
        s.extra("migration_pieces_bounced")
    );
    wait_for("the program's allocations to go back", || {
        live_allocations(&c.url).is_empty()
    });
}

/// `rackmem migrate` against `socket`, with `args`; its output.
fn migrate_cmd(socket: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(rackmem());
    cmd.arg("migrate").arg("--agent").arg(socket).args(args);
    run_with_deadline(cmd, LIMIT)
}

/// `rackmem migrate --pid` (issue 23): an operator moves a running program's buffer between the
/// control plane's two bricks and its local buffer, through the agent and the program's order
/// connection, while a thread of the program keeps writing it; the buffer ends equal to the
/// program's model. Bad requests get their codes and exit statuses, and a user who is neither
/// root nor the process's owner is refused.
#[test]
fn an_operator_moves_a_running_programs_memory_with_migrate_pid() {
    require_root();
    let c = cluster_with(&["--allow-uid", "65534"], false);
    let writer = Writer::start(&c, "32");
    let first = writer.first.clone();
    // "buffer ADDR LEN pid PID"
    let w: Vec<&str> = first.split_whitespace().collect();
    assert!(w.len() == 5 && w[0] == "buffer", "unexpected first line {first:?}");
    let (addr, pid) = (w[1].to_string(), w[4].to_string());
    let whole = format!("{addr}:32MiB");
    let eighth = format!("{addr}:4MiB");
    let fail = |o: &std::process::Output, what: &str| -> String { format!("{what}: {}", show(o)) };

    // A brick by name, JSON for scripts.
    let o = migrate_cmd(&c.socket, &["--pid", &pid, "--range", &whole, "--to", "b1", "--json"]);
    assert!(o.status.success(), "{}", fail(&o, "to b1"));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert!(v["bytes"].as_u64().unwrap_or(0) > 0, "nothing carried: {v}");
    for step in ["setup_ns", "allocate_ns", "transfer_ns", "finalize_ns"] {
        assert!(v[step].is_u64(), "no {step} in {v}");
    }
    // Part of it into the local buffer (pinned), then all of it back to b0, as a table.
    let o = migrate_cmd(&c.socket, &["--pid", &pid, "--range", &eighth, "--to", "local"]);
    assert!(o.status.success(), "{}", fail(&o, "to local"));
    let o = migrate_cmd(&c.socket, &["--pid", &pid, "--range", &whole, "--to", "b0"]);
    assert!(o.status.success(), "{}", fail(&o, "to b0"));
    let table = String::from_utf8_lossy(&o.stdout);
    for step in ["setup", "allocate", "transfer", "finalize"] {
        assert!(table.contains(step), "no {step} row in:\n{table}");
    }

    // Bad requests: their codes and exit statuses.
    let bad = |args: &[&str], status: i32, code: &str| {
        let mut a = args.to_vec();
        a.push("--json");
        let o = migrate_cmd(&c.socket, &a);
        assert_eq!(o.status.code(), Some(status), "{args:?}: {}", show(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert_eq!(v["error"]["code"], code, "{args:?}: {v}");
    };
    bad(
        &["--pid", "999999", "--range", &whole, "--to", "b1"],
        67,
        "unknown_process",
    );
    bad(&["--pid", &pid, "--range", &whole, "--to", "nope"], 65, "unknown_brick");
    bad(
        &["--pid", &pid, "--range", "0x1000:4096", "--to", "b1"],
        65,
        "outside_window",
    );
    // Pinning all of it needs more than the local buffer allows.
    bad(&["--pid", &pid, "--range", &whole, "--to", "local"], 73, "no_space");
    // An admitted user who does not own the process.
    let order = format!(r#"{{"op":"migrate","pid":{pid},"addr":{},"len":4096,"to":"b1"}}"#, {
        let h = addr.trim_start_matches("0x");
        u64::from_str_radix(h, 16).expect("hex address")
    });
    let replies = agent_client(&c.socket, Some(65534), &[r#"{"op":"hello"}"#, &order]);
    assert_eq!(replies.len(), 2, "{replies:?}");
    assert_eq!(code_of(&json(&replies[1])), "permission_denied", "{replies:?}");

    writer.finish("migrate_rw");
    // The process is gone: its order connection with it.
    bad(&["--pid", &pid, "--range", &whole, "--to", "b1"], 67, "unknown_process");
    wait_for("the program's allocations to go back", || {
        live_allocations(&c.url).is_empty()
    });
}

/// A `migrate_rw external` program on agent memory, its writer running: (guard, stdin, stdout,
/// stderr, pid).
struct Writer {
    /// Its first line: "buffer ADDR LEN pid PID".
    first: String,
    run: Guard,
    stdin: Option<std::process::ChildStdin>,
    stdout: std::sync::mpsc::Receiver<String>,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl Writer {
    fn start(c: &Cluster, mib: &str) -> Writer {
        let mut cmd = Command::new(rackmem());
        cmd.arg("run")
            .arg("--agent")
            .arg(&c.socket)
            .args(["--local", "8MiB", "--"])
            .arg(program("migrate_rw"))
            .args(["external", mib, "-", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut run = Guard::spawn(&mut cmd);
        let stdin = run.child().stdin.take();
        let stdout = lines_of(run.child().stdout.take().expect("stdout"));
        let stderr = lines_of(run.child().stderr.take().expect("stderr"));
        let first = match stdout.recv_timeout(LIMIT) {
            Ok(l) if l.starts_with("buffer ") => l,
            other => {
                run.kill_group();
                let err: Vec<String> = stderr.try_iter().collect();
                panic!(
                    "migrate_rw never said where its buffer is ({other:?}):\n{}",
                    err.join("\n")
                );
            }
        };
        Writer {
            first,
            run,
            stdin,
            stdout,
            stderr,
        }
    }

    /// Lets the writer finish and checks its buffer against its model.
    fn finish(mut self, who: &str) {
        writeln!(self.stdin.as_mut().expect("stdin"), "go").expect("write to the program");
        drop(self.stdin.take());
        let status = self.run.wait_until(LIMIT);
        let out: Vec<String> = self.stdout.try_iter().collect();
        let err: Vec<String> = self.stderr.try_iter().collect();
        let out = out.join("\n");
        let Some(status) = status else {
            self.run.kill_group();
            panic!("{who} did not finish:\n{out}\n{}", err.join("\n"));
        };
        assert!(status.success(), "{who}: exit {status:?}:\n{out}\n{}", err.join("\n"));
        let line = out
            .lines()
            .find(|l| l.starts_with("checksum "))
            .unwrap_or_else(|| panic!("{who}: no checksum line in:\n{out}"));
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w[1], w[3], "{who}: the buffer differs from its model:\n{out}");
    }
}

/// Bytes in segments on the brick named `name`.
fn used_on(url: &str, name: &str) -> u64 {
    let b = brick_named(url, name);
    b["capacity_bytes"].as_u64().unwrap_or(0) - b["free_bytes"].as_u64().unwrap_or(0)
}

#[test]
fn a_brick_that_joins_under_running_writers_takes_load_when_the_rack_rebalances() {
    require_root();
    // Two bricks, each allocation striped over both; two writers keep rewriting their buffers.
    let mut c = cluster_on(&[], false, false, 2);
    let one = Writer::start(&c, "32");
    let two = Writer::start(&c, "24");
    let before = (used_on(&c.url, "b0"), used_on(&c.url, "b1"));
    assert!(before.0 > 0 && before.1 > 0, "the writers hold nothing: {before:?}");

    // A third brick joins; a dry run plans moves onto it and moves nothing.
    let (g, _, log) = spawn_brick(c.dir.path(), &c.url, 2, None);
    c._bricks.push(g);
    c._brick_logs.push(log);
    wait_for("b2 to register", || {
        ctl_json(&c.url, &["bricks"]).as_array().map_or(0, Vec::len) == 3
    });
    let plan = ctl_json(&c.url, &["rebalance", "--dry-run", "--tolerance", "1"]);
    let moves = plan["moves"].as_array().cloned().unwrap_or_default();
    assert!(!moves.is_empty(), "no move planned onto the new brick: {plan}");
    let b2 = brick_named(&c.url, "b2");
    let b2_id = b2["id"].as_u64().expect("id");
    assert!(
        moves.iter().all(|m| m["segments"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["to_brick_id"] == b2_id))),
        "every move sends a segment to b2: {plan}"
    );
    assert_eq!(b2["segments"], 0, "a dry run moved something: {b2}");
    let o = ctl(&c.url, &["rebalance", "--dry-run", "--tolerance", "1"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains("a dry run") && text.contains("planned"),
        "{}",
        show(&o)
    );

    // The rebalance: the planned moves happen while both write, and end done.
    let o = ctl(
        &c.url,
        &["--json", "rebalance", "--tolerance", "1", "--timeout", "100s"],
    );
    assert!(o.status.success(), "rebalance: {}\nagent:\n{}", show(&o), c.agent_log());
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let moves = r["moves"].as_array().cloned().unwrap_or_default();
    assert!(
        r["finished"] == true && !moves.is_empty() && moves.iter().all(|m| m["state"] == "done"),
        "{r}"
    );
    let after = (used_on(&c.url, "b0"), used_on(&c.url, "b1"), used_on(&c.url, "b2"));
    assert!(after.2 > 0, "b2 took nothing: {after:?}");
    assert!(after.0 < before.0, "b0 gave nothing: {before:?} -> {after:?}");
    let b2 = brick_named(&c.url, "b2");
    assert!(
        b2["segments"].as_u64().unwrap_or(0) > 0,
        "ctl bricks shows no segment on b2: {b2}"
    );

    one.finish("the first writer");
    two.finish("the second writer");
    wait_for("the programs' allocations to go back", || {
        live_allocations(&c.url).is_empty()
    });
}

/// `rackmem control --rebalance-on-join`: a brick that registers starts a rebalance by itself,
/// with the default tolerance (10 points), and the programs writing meanwhile lose nothing.
/// Bricks of 384 MiB: a program's window grows by two 128 MiB segments (one on each brick), so
/// the two writers hold 256 MiB of each of b0 and b1 (67%), more than 10 points above the mean of
/// three (44%), and a move has room for the copy of the allocation's segment that stays.
#[test]
fn a_brick_that_joins_takes_load_by_itself_when_the_control_plane_rebalances_on_join() {
    require_root();
    let mut c = cluster_sized(
        &[],
        false,
        false,
        2,
        "384MiB",
        &["--rebalance-on-join", "--node-quota", "1GiB"],
    );
    let one = Writer::start(&c, "32");
    let two = Writer::start(&c, "24");
    let before = (used_on(&c.url, "b0"), used_on(&c.url, "b1"));
    assert!(before.0 > 0 && before.1 > 0, "the writers hold nothing: {before:?}");
    // The bricks registered before anything was held: no rebalance moved anything yet.
    let o = ctl(&c.url, &["--json", "rebalance", "--status"]);
    if o.status.success() {
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        let moves = r["moves"].as_array().map_or(0, Vec::len);
        assert_eq!(moves, 0, "a rebalance moved something before a brick joined: {r}");
    } else {
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("no rebalance"),
            "ctl rebalance --status before any: {}",
            show(&o)
        );
    }

    let (g, _, log) = spawn_brick_sized(c.dir.path(), &c.url, 2, None, "384MiB");
    c._bricks.push(g);
    c._brick_logs.push(log);
    wait_for("b2 to register", || {
        ctl_json(&c.url, &["bricks"]).as_array().map_or(0, Vec::len) == 3
    });
    // Nobody asks: the join starts the rebalance, and b2 ends up holding segments.
    wait_for("b2 to take segments by itself", || {
        brick_named(&c.url, "b2")["segments"].as_u64().unwrap_or(0) > 0
    });
    wait_for("the rebalance to finish", || {
        let r = ctl_json(&c.url, &["rebalance", "--status"]);
        r["finished"] == true
    });
    let r = ctl_json(&c.url, &["rebalance", "--status"]);
    let moves = r["moves"].as_array().cloned().unwrap_or_default();
    assert!(
        !moves.is_empty() && moves.iter().all(|m| m["state"] == "done"),
        "the rebalance on join: {r}\nagent:\n{}",
        c.agent_log()
    );
    let after = (used_on(&c.url, "b0"), used_on(&c.url, "b1"), used_on(&c.url, "b2"));
    assert!(
        after.2 > 0 && after.0 + after.1 < before.0 + before.1,
        "{before:?} -> {after:?}"
    );

    // Both writers kept writing through the moves; their buffers equal their models.
    one.finish("the first writer");
    two.finish("the second writer");
    wait_for("the programs' allocations to go back", || {
        live_allocations(&c.url).is_empty()
    });
}

/// The brick named `name` as `ctl bricks --json` shows it.
fn brick_named(url: &str, name: &str) -> serde_json::Value {
    ctl_json(url, &["bricks"])
        .as_array()
        .and_then(|a| a.iter().find(|b| b["name"] == name).cloned())
        .unwrap_or_else(|| panic!("no brick {name}"))
}

#[test]
fn a_drain_moves_every_segment_off_a_brick_under_two_running_writers() {
    require_root();
    // Three bricks; each allocation striped over two of them, so draining one moves segments
    // of allocations that also hold a segment elsewhere.
    let c = cluster_on(&[], false, false, 3);
    let one = Writer::start(&c, "32");
    let two = Writer::start(&c, "24");
    let held = brick_named(&c.url, "b0")["segments"].as_u64().unwrap_or(0);
    assert!(
        held > 0,
        "the writers hold nothing on b0: {}",
        brick_named(&c.url, "b0")
    );

    // Drain b0 while both write: it ends holding nothing, and says so.
    let o = ctl(&c.url, &["--json", "drain", "b0", "--timeout", "50s"]);
    assert!(o.status.success(), "drain b0: {}\nagent:\n{}", show(&o), c.agent_log());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert!(v["drained"] == true && v["segments"] == 0, "{v}");
    let b0 = brick_named(&c.url, "b0");
    assert!(b0["drained"] == true && b0["segments"] == 0, "{b0}");
    let table = String::from_utf8_lossy(&ctl(&c.url, &["bricks"]).stdout).to_string();
    assert!(table.contains("drained"), "ctl bricks does not show it:\n{table}");

    // Started and cancelled at once: whatever moved or not, the brick takes segments again
    // and nothing is lost (the checksums below).
    let o = ctl(&c.url, &["drain", "b2", "--no-wait"]);
    assert!(o.status.success(), "drain b2 --no-wait: {}", show(&o));
    let o = ctl(&c.url, &["--json", "drain", "b2", "--cancel"]);
    assert!(o.status.success(), "drain b2 --cancel: {}", show(&o));
    let b2 = brick_named(&c.url, "b2");
    assert!(b2["draining"] == false, "{b2}");

    // b0 still draining, b1 holding segments: draining b1 and b2 both leaves nowhere to go:
    // refused, clearly, and nothing changes.
    let o = ctl(&c.url, &["drain", "b1", "--timeout", "50s"]);
    assert!(o.status.success(), "drain b1: {}\nagent:\n{}", show(&o), c.agent_log());
    let o = ctl(&c.url, &["drain", "b2", "--timeout", "30s"]);
    assert_eq!(o.status.code(), Some(1), "drain b2 with nowhere to go: {}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no other brick"), "unclear refusal: {}", show(&o));
    assert!(brick_named(&c.url, "b2")["draining"] == false);

    one.finish("the first writer");
    two.finish("the second writer");
    wait_for("the programs' allocations to go back", || {
        live_allocations(&c.url).is_empty()
    });
}
