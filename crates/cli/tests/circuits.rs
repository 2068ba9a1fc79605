//! Circuits on Linux hosts acting as switches: network namespaces joined by veth pairs, a
//! "switch" namespace in the middle that forwards nothing until the control plane's nft driver
//! connects two of its ports, and a real brick, agent and program on either side.
//!
//! ```text
//!   node ns (n1)                 switch ns (rack)               brick ns (mem1)
//!   br0 10.231.0.1 ─ n0 ──── sw-n0         sw-b0 ──── b0 ─ br0 10.231.0.2
//!                  └ n1 ──── sw-n1         sw-b1 ──── b1 ┘
//!   m0 10.231.1.2 ── management ── root ns (control plane) ── management ── m0 10.231.2.2
//! ```
//!
//! The node's and the brick's two ports sit on a bridge that floods (ageing 0: it learns
//! nothing), so whichever pair of switch ports a circuit joins carries the traffic, and moving
//! the circuit needs no change on either side. The control plane is reached over a separate
//! management network that routes nothing between the node and the brick.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::Instant;

const DATA_NODE: &str = "10.231.0.1";
const DATA_BRICK: &str = "10.231.0.2";
const BRICK_PORT: u16 = 7070;

fn sh(args: &[&str]) {
    let o = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Fails the test with what it needs unless `nft` and `ip` can be run.
fn require_nft_and_ip() {
    for (prog, arg) in [("nft", "--version"), ("ip", "-V")] {
        let ok = Command::new(prog)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "this test configures a switch namespace with nftables and needs `{prog}` \
             (apt-get install nftables iproute2; scripts/setup.sh does)"
        );
    }
}

/// The three namespaces and the management links; removed when dropped.
struct Lab {
    sw: String,
    node: String,
    brick: String,
    root_links: Vec<String>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in [&self.sw, &self.node, &self.brick] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        for l in &self.root_links {
            let _ = Command::new("ip")
                .args(["link", "del", l])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Lab {
    fn new() -> Lab {
        let tag = format!("{}", std::process::id() % 100_000);
        let lab = Lab {
            sw: format!("rmc-sw-{tag}"),
            node: format!("rmc-node-{tag}"),
            brick: format!("rmc-brick-{tag}"),
            root_links: vec![format!("rmcn{tag}"), format!("rmcb{tag}")],
        };
        for ns in [&lab.sw, &lab.node, &lab.brick] {
            sh(&["ip", "netns", "add", ns]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        for (ns, side) in [(&lab.node, "n"), (&lab.brick, "b")] {
            sh(&[
                "ip",
                "-n",
                ns,
                "link",
                "add",
                "br0",
                "type",
                "bridge",
                "ageing_time",
                "0",
            ]);
            for i in 0..2 {
                let (inner, outer) = (format!("{side}{i}"), format!("sw-{side}{i}"));
                sh(&[
                    "ip", "link", "add", &inner, "netns", ns, "type", "veth", "peer", "name", &outer, "netns", &lab.sw,
                ]);
                sh(&["ip", "-n", ns, "link", "set", &inner, "master", "br0", "up"]);
                sh(&["ip", "-n", &lab.sw, "link", "set", &outer, "up"]);
            }
            sh(&["ip", "-n", ns, "link", "set", "br0", "up"]);
            let addr = if side == "n" { DATA_NODE } else { DATA_BRICK };
            sh(&["ip", "-n", ns, "addr", "add", &format!("{addr}/24"), "dev", "br0"]);
        }
        for (ns, root, net) in [(&lab.node, &lab.root_links[0], 1), (&lab.brick, &lab.root_links[1], 2)] {
            sh(&[
                "ip", "link", "add", root, "type", "veth", "peer", "name", "m0", "netns", ns,
            ]);
            sh(&["ip", "addr", "add", &format!("10.231.{net}.1/30"), "dev", root]);
            sh(&["ip", "link", "set", root, "up"]);
            sh(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("10.231.{net}.2/30"),
                "dev",
                "m0",
            ]);
            sh(&["ip", "-n", ns, "link", "set", "m0", "up"]);
        }
        lab
    }

    /// True when a TCP connection from the node's namespace reaches the brick within 3 s.
    fn node_reaches_brick(&self) -> bool {
        let probe = format!("exec 3<>/dev/tcp/{DATA_BRICK}/{BRICK_PORT}");
        Command::new("ip")
            .args(["netns", "exec", &self.node, "timeout", "3", "bash", "-c", &probe])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The switch namespace's nftables ruleset.
    fn ruleset(&self) -> String {
        let o = Command::new("ip")
            .args(["netns", "exec", &self.sw, "nft", "list", "ruleset"])
            .output()
            .expect("nft list ruleset");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `ip netns exec NS` + `args`, as a command.
    fn exec(&self, ns: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).args(args);
        c
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn wait_line(lines: &std::sync::mpsc::Receiver<String>, want: &str) -> String {
    let deadline = Instant::now() + LIMIT;
    loop {
        let l = lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|e| panic!("no line {want:?} from the program: {e}"));
        if l.starts_with(want) {
            return l;
        }
    }
}

#[test]
fn a_node_reaches_a_brick_only_through_its_circuit_and_loses_nothing_when_it_moves() {
    require_root();
    require_nft_and_ip();
    let lab = Lab::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let switches = dir.path().join("switches.json");
    std::fs::write(
        &switches,
        serde_json::json!({"switches": {"rack": {"netns": lab.sw, "ports": {
            "n1:n0": "sw-n0", "n1:n1": "sw-n1", "mem1:p0": "sw-b0", "mem1:p1": "sw-b1"}}}})
        .to_string(),
    )
    .expect("write switches.json");
    let port = free_port();
    let store = format!("sqlite:{}", dir.path().join("control.db").display());
    let driver = format!("nft:{}", switches.display());
    let (_control, _) = start_control_with(&[
        "--listen",
        &format!("0.0.0.0:{port}"),
        "--store",
        &store,
        "--brick-timeout",
        "5s",
        "--switch-driver",
        &driver,
    ]);
    let url = format!("http://127.0.0.1:{port}");

    let listen = format!("tcp://{DATA_BRICK}:{BRICK_PORT}");
    let mut brick = lab.exec(
        &lab.brick,
        &[
            rackmem(),
            "brick",
            "--listen",
            &listen,
            "--advertise",
            &listen,
            "--size",
            "2GiB",
            "--control",
            &format!("http://10.231.2.1:{port}"),
            "--name",
            "mem1",
            "--port",
            "p0:1GB/s",
            "--port",
            "p1:1GB/s",
            "--heartbeat-ms",
            "100",
        ],
    );
    brick.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let _brick = Guard::spawn(&mut brick);
    let socket = dir.path().join("agent.sock");
    let mut agent = lab.exec(
        &lab.node,
        &[
            rackmem(),
            "agent",
            "--control",
            &format!("http://10.231.1.1:{port}"),
            "--name",
            "n1",
            "--port",
            "n0:1GB/s",
            "--port",
            "n1:1GB/s",
            "--socket",
            &socket.display().to_string(),
        ],
    );
    agent.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let _agent = Guard::spawn(&mut agent);
    wait_for("the brick and the node to register", || {
        ctl_json(&url, &["bricks"]).as_array().is_some_and(|b| b.len() == 1)
            && ctl_json(&url, &["nodes"]).as_array().is_some_and(|n| n.len() == 1)
    });
    let node_id = ctl_json(&url, &["nodes"])[0]["id"].as_u64().expect("node id");
    let brick_id = ctl_json(&url, &["bricks"])[0]["id"].as_u64().expect("brick id");

    // No circuit: the switch forwards nothing, the node cannot reach the brick.
    assert!(
        !lab.node_reaches_brick(),
        "the node reached the brick without a circuit"
    );

    // A circuit pushed to the node: its agent attaches it through the switch.
    let a = ctl_json(&url, &["alloc", "--node", "n1", "--size", "512MiB", "--circuit"]);
    let id = a["id"].as_u64().expect("allocation id");
    assert_eq!(a["circuit"], true, "{a}");
    let k = ctl_json(&url, &["circuits"]);
    assert_eq!(k["driver"], driver, "{k}");
    let rules = &k["circuits"][0]["rules"];
    assert_eq!(
        (rules[0]["a"]["port"].as_str(), rules[0]["b"]["port"].as_str()),
        (Some("n1:n0"), Some("mem1:p0")),
        "{k}"
    );
    assert!(k["switches"][0]["error"].is_null(), "{k}");
    // Shown, never asserted: docs/benchmarks.md quotes it.
    eprintln!(
        "note: the nft driver configured the switch in {} µs",
        k["switches"][0]["apply_us"]
    );
    let rs = lab.ruleset();
    assert!(
        rs.contains("fwd to \"sw-b0\"") && rs.contains("fwd to \"sw-n0\""),
        "{rs}"
    );
    let shown = ctl(&url, &["circuits"]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("mem1:p0"),
        "{}",
        show(&shown)
    );
    wait_for("the agent to attach the circuit's memory", || {
        ctl_json(&url, &["nodes"])[0]["pool_attached_bytes"].as_u64() == Some(512 << 20)
    });
    assert!(
        lab.node_reaches_brick(),
        "the circuit does not connect the node to the brick"
    );

    // A program on it; the circuit moves to the other ports while it runs.
    let args = ["8", "16", "300"];
    let want = checksums(&native(&program("grow"), &args));
    let stats = dir.path().join("stats.jsonl");
    let prog = program("grow");
    let mut run = lab.exec(
        &lab.node,
        &[
            rackmem(),
            "run",
            "--agent",
            &socket.display().to_string(),
            "--local",
            "25%",
            "--no-shared-memory",
            "--stats-json",
            &stats.display().to_string(),
            "--",
            &prog.display().to_string(),
        ],
    );
    run.args(args)
        .env("RACKMEM_GROW", "512MiB")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut g = Guard::spawn(&mut run);
    let lines = lines_of(g.child().stdout.take().expect("stdout"));
    let err_lines = lines_of(g.child().stderr.take().expect("stderr"));
    wait_line(&lines, "step 3");
    let moved = ctl_json(
        &url,
        &[
            "circuits",
            "move",
            &id.to_string(),
            "--avoid",
            &format!("node:{node_id}:n0"),
            "--avoid",
            &format!("brick:{brick_id}:p0"),
        ],
    );
    let held: Vec<&str> = moved["links"]
        .as_array()
        .expect("links")
        .iter()
        .filter_map(|l| l.as_str())
        .collect();
    assert!(
        held.contains(&format!("node:{node_id}:n1").as_str())
            && held.contains(&format!("brick:{brick_id}:p1").as_str()),
        "{moved}"
    );
    let rs = lab.ruleset();
    assert!(
        rs.contains("fwd to \"sw-b1\"") && !rs.contains("sw-n0") && !rs.contains("sw-b0"),
        "{rs}"
    );
    let got = wait_line(&lines, "checksum=");
    let status = g.wait_until(LIMIT).expect("the program finished");
    let errors: Vec<String> = err_lines.try_iter().collect();
    assert!(status.success(), "{status:?}: {errors:?}");
    assert_eq!(vec![got], want, "the program's data through the moved circuit");
    let s = read_stats(&stats);
    let p = busiest(&s);
    assert!(
        p.bytes_fetched > 0 && p.bytes_written_back > 0,
        "the program did not use the brick: {p:?}"
    );

    // Released: the switch forwards nothing again.
    wait_for("the program's pool allocation to be unused", || {
        ctl_json(&url, &["nodes"])[0]["pool_in_use_bytes"].as_u64() == Some(0)
    });
    let r = ctl_json(&url, &["free", &id.to_string()]);
    assert_eq!(r["deferred"], false, "{r}");
    let k = ctl_json(&url, &["circuits"]);
    assert_eq!(k["circuits"].as_array().map(Vec::len), Some(0), "{k}");
    assert!(!lab.ruleset().contains("fwd"), "{}", lab.ruleset());
    assert!(
        !lab.node_reaches_brick(),
        "the node still reaches the brick after its circuit was released"
    );
}
