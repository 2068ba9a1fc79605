//! `rackmem control`, `rackmem ctl` and `rackmem brick --control` as processes: a managed brick
//! registers, `ctl` allocates and frees, exit statuses follow the documented contract, and the
//! control plane stops cleanly on SIGTERM.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn ctl_against_a_real_control_plane_and_managed_brick() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut control, url) = start_control(&dir.path().join("control.db"));

    let mut cmd = Command::new(rackmem());
    cmd.args([
        "brick",
        "--listen",
        "tcp://127.0.0.1:0",
        "--size",
        "64MiB",
        "--control",
        &url,
        "--name",
        "mem1",
        "--port",
        "p0:5GB/s",
        "--heartbeat-ms",
        "100",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let _brick = Guard::spawn(&mut cmd);
    let deadline = Instant::now() + START_LIMIT;
    let brick = loop {
        let bricks = ctl_json(&url, &["bricks"]);
        if let Some(b) = bricks.as_array().and_then(|a| a.first()).cloned() {
            break b;
        }
        assert!(Instant::now() < deadline, "the brick never registered");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(brick["name"], "mem1");
    assert_eq!(brick["state"], "up");
    assert_eq!(brick["capacity_bytes"], 64 << 20);
    assert_eq!(brick["ports"][0]["bandwidth_bps"], 5_000_000_000u64);
    assert!(brick["address"]
        .as_str()
        .is_some_and(|a| a.starts_with("tcp://127.0.0.1:")));

    let node = ctl_json(&url, &["add-node", "--name", "web1", "--port", "eth0:1GB/s"]);
    let node_id = node["id"].as_u64().expect("node id");
    let a = ctl_json(
        &url,
        &["alloc", "--node", "web1", "--size", "8MiB", "--bandwidth", "100MB/s"],
    );
    assert_eq!(a["node"], node_id);
    assert_eq!(a["segments"][0]["size_bytes"], 8 << 20);
    assert_eq!(a["segments"][0]["rate_limit_bps"], 100_000_000u64);
    let id = a["id"].as_u64().expect("allocation id").to_string();
    let listed = ctl_json(&url, &["allocations"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(1));

    // Human output: tables that name what they show.
    for what in ["bricks", "nodes", "allocations", "graph"] {
        let o = ctl(&url, &[what]);
        assert!(o.status.success(), "{what}: {}", show(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("mem1") || what != "bricks");
    }

    // Exit statuses: server errors 1, bad input 65, usage 2, unreachable 69.
    let o = ctl(&url, &["alloc", "--node", "web1", "--size", "1TiB"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("insufficient_capacity"),
        "{}",
        show(&o)
    );
    let o = ctl(&url, &["free", "12345"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let o = ctl(&url, &["alloc", "--node", "nobody", "--size", "1MiB"]);
    assert_eq!(o.status.code(), Some(65), "{}", show(&o));
    let o = ctl(&url, &["alloc", "--node", "web1", "--size", "lots"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let o = ctl("ftp://nowhere", &["bricks"]);
    assert_eq!(o.status.code(), Some(65), "{}", show(&o));
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("addr"))
    };
    let o = ctl(&dead, &["bricks"]);
    assert_eq!(o.status.code(), Some(69), "{}", show(&o));
    // Fail-over: a dead URL first, the live one second.
    let o = ctl(&format!("{dead},{url}"), &["nodes"]);
    assert!(o.status.success(), "{}", show(&o));

    let released = ctl_json(&url, &["free", &id]);
    assert_eq!(released["extents"].as_array().map(Vec::len), Some(1));
    assert_eq!(ctl_json(&url, &["allocations"]).as_array().map(Vec::len), Some(0));

    // SIGTERM stops the control plane cleanly.
    let _ = Command::new("kill").args(["-TERM", &control.id().to_string()]).status();
    let status = control
        .wait_until(Duration::from_secs(30))
        .expect("rackmem control did not stop on SIGTERM");
    assert!(status.success(), "{status:?}");
}
