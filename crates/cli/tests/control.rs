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

    let _brick = start_managed_brick(&url, "tcp://127.0.0.1:0", "64MiB", "mem1", |c| {
        c.args(["--port", "p0:5GB/s"]);
    });
    let brick = ctl_json(&url, &["bricks"])
        .as_array()
        .and_then(|a| a.first())
        .cloned()
        .expect("the brick registered");
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

#[test]
fn ctl_tokens_give_each_role_its_own_objects_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_control, url) = start_control(&dir.path().join("control.db"));
    // The control plane made no token but the admin file's: without it, nothing.
    let mut c = Command::new(rackmem());
    c.env_remove("RACKMEM_TOKEN_FILE")
        .args(["ctl", "--control", &url, "nodes"]);
    let o = run_with_deadline(c, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(77), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("token"), "{}", show(&o));

    let o = ctl(&url, &["token", "create", "--role", "node", "--name", "web1"]);
    assert!(o.status.success(), "{}", show(&o));
    let web1 = dir.path().join("web1.token");
    std::fs::write(&web1, &o.stdout).expect("writing the token file");
    let as_web1 = |args: &[&str]| {
        let mut c = Command::new(rackmem());
        c.env_remove("RACKMEM_TOKEN_FILE")
            .args(["ctl", "--control", &url, "--token-file"])
            .arg(&web1)
            .args(args);
        run_with_deadline(c, Duration::from_secs(60))
    };
    let o = as_web1(&["add-node", "--name", "web1"]);
    assert!(o.status.success(), "{}", show(&o));
    // Admin-only listings are refused with 77 and a message naming the principal.
    let o = as_web1(&["bricks"]);
    assert_eq!(o.status.code(), Some(77), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("web1"), "{}", show(&o));
    let o = as_web1(&["add-node", "--name", "web2"]);
    assert_eq!(o.status.code(), Some(77), "{}", show(&o));
    // Listing and revoking: the token stops working.
    let tokens = ctl_json(&url, &["token", "list"]);
    let t = tokens
        .as_array()
        .and_then(|v| v.iter().find(|t| t["name"] == "web1"))
        .unwrap_or_else(|| panic!("web1's token is not listed: {tokens}"));
    assert_eq!(t["role"], "node");
    assert!(
        !tokens.to_string().contains("rmk_"),
        "token list shows a secret: {tokens}"
    );
    let id = t["id"].as_u64().expect("token id").to_string();
    let o = ctl(&url, &["token", "revoke", &id]);
    assert!(o.status.success(), "{}", show(&o));
    let o = as_web1(&["allocations"]);
    assert_eq!(o.status.code(), Some(77), "{}", show(&o));
}

/// Opens `n` TCP connections to `addr` that never send a byte.
fn silent_connections(addr: std::net::SocketAddr, n: usize) -> Vec<std::net::TcpStream> {
    (0..n)
        .filter_map(|_| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
        .collect()
}

/// `GET /healthz` from the source address 127.0.0.2, another peer than the flood's.
fn healthz_from_another_peer(addr: std::net::SocketAddr) -> Result<String, String> {
    use std::io::{Read as _, Write as _};
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).map_err(|e| e.to_string())?;
    let from: std::net::SocketAddr = "127.0.0.2:0".parse().map_err(|e| format!("{e}"))?;
    s.bind(&from.into()).map_err(|e| format!("binding 127.0.0.2: {e}"))?;
    s.connect_timeout(&addr.into(), Duration::from_secs(10))
        .map_err(|e| format!("connecting: {e}"))?;
    let mut s: std::net::TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| format!("reading: {e}"))?;
    Ok(out)
}

#[test]
fn control_plane_answers_healthz_under_an_idle_connection_flood() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite:{}", dir.path().join("control.db").display());
    // As found: 256 descriptors, 300 silent connections.
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "ulimit -n 256 && exec {} control --listen 127.0.0.1:0 --store {store} --admin-token-file {}",
            rackmem(),
            admin_token_file().display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut g = Guard::spawn(&mut cmd);
    let lines = lines_of(g.child().stderr.take().expect("stderr"));
    let url = loop {
        let l = lines
            .recv_timeout(START_LIMIT)
            .expect("rackmem control announced no URL");
        if let Some(u) = l.split_whitespace().find(|w| w.starts_with("http://")) {
            break u.to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().expect("address");
    let flood = silent_connections(addr, 300);
    assert!(flood.len() >= 64, "the flood itself could not connect: {}", flood.len());
    let reply = healthz_from_another_peer(addr).unwrap_or_else(|e| panic!("/healthz under the flood: {e}"));
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // The flood's own connections are closed by the header timeout: all of them, eventually.
    let deadline = Instant::now() + Duration::from_secs(60);
    for mut s in flood {
        use std::io::Read as _;
        s.set_read_timeout(Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ))
        .expect("timeout");
        let mut b = [0u8; 1];
        assert!(
            matches!(s.read(&mut b), Ok(0) | Err(_)) && Instant::now() < deadline,
            "a silent connection was kept past the header timeout"
        );
    }
}

#[test]
fn an_expired_grant_is_refused_and_a_renewed_one_reaches_the_same_data() {
    use rackmem_proto::{Grant, Status};
    use rackmem_transport::{BrickAddr, Link, LinkError};
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite:{}", dir.path().join("control.db").display());
    let (_control, url) = start_control_with(&["--listen", "127.0.0.1:0", "--store", &store, "--grant-lifetime", "2s"]);
    let _brick = start_managed_brick(&url, "tcp://127.0.0.1:0", "64MiB", "lease1", |_| {});
    let o = ctl(&url, &["add-node", "--name", "n1"]);
    assert!(o.status.success(), "{}", show(&o));
    let a = ctl_json(&url, &["alloc", "--node", "n1", "--size", "4MiB"]);
    let seg = &a["segments"][0];
    let creds = |seg: &serde_json::Value| {
        let g = hex::decode(seg["grant_hex"].as_str().expect("grant")).expect("hex");
        let k = hex::decode(seg["session_key_hex"].as_str().expect("key")).expect("hex");
        (
            Grant::decode(&g).expect("grant decodes"),
            <[u8; 32]>::try_from(k).expect("32-byte key"),
        )
    };
    let (grant, key) = creds(seg);
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    assert!(
        grant.expiry_unix_s > now_s && grant.expiry_unix_s <= now_s + 3,
        "{grant:?}"
    );
    assert_eq!(seg["grant_expires_unix_s"], grant.expiry_unix_s);
    let addr: BrickAddr = seg["brick_address"]
        .as_str()
        .expect("address")
        .parse()
        .expect("brick address");
    // The segment is created by its first ATTACH; write a page of a known pattern.
    let page: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    {
        let link = Link::connect(&addr, Duration::from_secs(10)).expect("connect");
        link.attach(&grant, &key).expect("a fresh grant attaches");
        link.write_pages(&[(8192, 4096)], &page).expect("write");
    }
    // Past its expiry, the same grant (stolen, say) is refused.
    std::thread::sleep(Duration::from_millis(3200));
    let link = Link::connect(&addr, Duration::from_secs(10)).expect("connect");
    match link.attach(&grant, &key) {
        Err(LinkError::Refused { status, .. }) => assert_eq!(status, Status::GrantExpired),
        other => panic!("an expired grant attached: {other:?}"),
    }
    // Renewed (as its node's agent would), it reaches the same data.
    let id = a["id"].as_u64().expect("id");
    let client = rackmem_control::client::Client::new(&[url.as_str()])
        .expect("client")
        .with_token(Some(admin_token()));
    let renewed = client.renew(id).expect("renew");
    let (g2, k2) = creds(&serde_json::to_value(&renewed.segments[0]).expect("json"));
    assert!(g2.expiry_unix_s > grant.expiry_unix_s, "{g2:?}");
    assert_eq!(
        (g2.segment_id, g2.brick_offset, g2.size_bytes),
        (grant.segment_id, grant.brick_offset, grant.size_bytes)
    );
    let link = Link::connect(&addr, Duration::from_secs(10)).expect("connect");
    link.attach(&g2, &k2).expect("the renewed grant attaches");
    let mut back = vec![0u8; 4096];
    link.read_pages(&[(8192, 4096)], &mut back).expect("read");
    assert_eq!(back, page, "the renewed grant reached other data");
}

/// `rackmem ctl drain` (issue 23): a draining brick takes no new segments, `ctl bricks` shows it
/// draining then drained, the command times out (exit 75) while the brick holds a segment and
/// exits 0 once it holds none; `--cancel` ends the drain.
#[test]
fn a_drained_brick_takes_no_segments_and_drain_waits_until_it_holds_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_control, url) = start_control(&dir.path().join("control.db"));
    let _bricks: Vec<Guard> = ["mem1", "mem2"]
        .iter()
        .map(|name| start_managed_brick(&url, "tcp://127.0.0.1:0", "64MiB", name, |_| {}))
        .collect();
    let list = ctl_json(&url, &["bricks"]);
    let id_of = |name: &str| -> String {
        let b = list
            .as_array()
            .and_then(|a| a.iter().find(|b| b["name"] == name))
            .expect("brick");
        b["id"].as_u64().expect("id").to_string()
    };
    let (mem1, mem2) = (id_of("mem1"), id_of("mem2"));
    ctl_json(&url, &["add-node", "--name", "web1"]);
    let held = ctl_json(&url, &["alloc", "--node", "web1", "--size", "8MiB", "--brick", &mem1]);
    let held = held["id"].as_u64().expect("allocation id").to_string();

    let o = ctl(&url, &["drain", "mem1", "--timeout", "1s"]);
    assert_eq!(o.status.code(), Some(75), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("still holds 1 segment"),
        "{}",
        show(&o)
    );
    let o = ctl(&url, &["bricks"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("up, draining"),
        "{}",
        show(&o)
    );
    // New segments go to the other brick only, and not to mem1 by name.
    for _ in 0..3 {
        let a = ctl_json(&url, &["alloc", "--node", "web1", "--size", "4MiB"]);
        assert_eq!(
            a["segments"][0]["brick_id"].as_u64().map(|i| i.to_string()),
            Some(mem2.clone()),
            "{a}"
        );
    }
    let o = ctl(&url, &["alloc", "--node", "web1", "--size", "4MiB", "--brick", &mem1]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("drained"), "{}", show(&o));

    // The segment goes while drain waits: it exits 0.
    let mut cmd = Command::new(rackmem());
    cmd.args(["ctl", "--control", &url, "--json", "drain", "mem1", "--timeout", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut waiting = Guard::spawn(&mut cmd);
    std::thread::sleep(Duration::from_millis(500));
    ctl_json(&url, &["free", &held]);
    let status = waiting
        .wait_until(Duration::from_secs(60))
        .expect("drain did not return");
    assert!(status.success(), "drain exited {status:?}");
    let b = ctl_json(&url, &["bricks"]);
    let b = b
        .as_array()
        .and_then(|a| a.iter().find(|b| b["name"] == "mem1"))
        .cloned()
        .expect("mem1");
    assert_eq!(
        (b["draining"].as_bool(), b["drained"].as_bool(), b["segments"].as_u64()),
        (Some(true), Some(true), Some(0))
    );
    let o = ctl(&url, &["bricks"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("up, drained"),
        "{}",
        show(&o)
    );

    // Cancelled: it takes segments again.
    let b = ctl_json(&url, &["drain", "mem1", "--cancel"]);
    assert_eq!(b["draining"], false);
    ctl_json(&url, &["alloc", "--node", "web1", "--size", "4MiB", "--brick", &mem1]);
}
