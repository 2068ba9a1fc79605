//! Rates the brick enforces (issue 26, item 1): a real control plane and a real managed brick
//! that serves 64 MiB/s in total; two segments on it get 32 MiB/s each, in their grants and in
//! the heartbeat replies, and two clients that ignore their limits and read as fast as the
//! brick lets them are held to them. Checked by counters: the bytes each was served against
//! what its rate allows over the span it measured itself (a bound a slow machine only makes
//! easier to meet), and the requests the brick reports it delayed.

mod common;
use common::*;
use rackmem_proto::Grant;
use rackmem_transport::{BrickAddr, Link};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const SERVE: u64 = 64 * MIB;
const SEGMENT: u64 = 8 * MIB;
/// Bytes each client reads after writing its segment once.
const READ: u64 = 48 * MIB;

fn page_byte(client: u64, offset: u64) -> u8 {
    ((offset / 4096).wrapping_mul(31).wrapping_add(client * 7) % 251) as u8
}

/// Attaches to one segment of an allocation, fills it, then reads it back in 1 MiB requests
/// until `READ` bytes came back, checking every byte; returns the bytes moved and the span.
fn flood(client: u64, seg: &serde_json::Value) -> (u64, Duration) {
    let addr: BrickAddr = seg["brick_address"]
        .as_str()
        .expect("address")
        .parse()
        .expect("brick address");
    let grant = Grant::decode(&hex::decode(seg["grant_hex"].as_str().expect("grant")).expect("hex")).expect("grant");
    let key: [u8; 32] = hex::decode(seg["session_key_hex"].as_str().expect("key"))
        .expect("hex")
        .try_into()
        .expect("32-byte session key");
    let link = Link::connect(&addr, Duration::from_secs(30)).expect("connect");
    link.attach(&grant, &key).expect("attach");
    let chunk = MIB as usize;
    let start = Instant::now();
    let mut moved = 0u64;
    for off in (0..SEGMENT).step_by(chunk) {
        let data: Vec<u8> = (0..chunk as u64).map(|i| page_byte(client, off + i)).collect();
        link.write_pages(&[(off, chunk as u32)], &data).expect("write");
        moved += chunk as u64;
    }
    let mut buf = vec![0u8; chunk];
    let mut read = 0u64;
    while read < READ {
        let off = read % SEGMENT;
        link.read_pages(&[(off, chunk as u32)], &mut buf).expect("read");
        let bad = (0..chunk as u64).find(|&i| buf[i as usize] != page_byte(client, off + i));
        assert_eq!(bad, None, "client {client}: wrong byte at {off:#x}+{bad:?}");
        read += chunk as u64;
    }
    moved += read;
    (moved, start.elapsed())
}

#[test]
fn a_brick_holds_clients_that_ignore_their_limits_to_the_rates_the_control_plane_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_control, url) = start_control(&dir.path().join("control.db"));
    let _brick = start_managed_brick(&url, "tcp://127.0.0.1:0", "64MiB", "mem1", |c| {
        c.args(["--serve-rate", "64MiB/s", "--port", "p0:10GB/s"]);
    });
    let brick = &ctl_json(&url, &["bricks"])[0];
    assert_eq!(brick["serve_bps"], SERVE, "the brick registers what it serves: {brick}");
    ctl_json(&url, &["add-node", "--name", "web1", "--port", "eth0:10GB/s"]);

    let first = ctl_json(&url, &["alloc", "--node", "web1", "--size", "8MiB"]);
    let g1 = Grant::decode(&hex::decode(first["segments"][0]["grant_hex"].as_str().expect("grant")).expect("hex"))
        .expect("grant");
    assert_eq!(
        g1.rate_bps, SERVE,
        "alone on the brick, the segment may take all it serves"
    );
    let second = ctl_json(&url, &["alloc", "--node", "web1", "--size", "8MiB"]);
    let g2 = Grant::decode(&hex::decode(second["segments"][0]["grant_hex"].as_str().expect("grant")).expect("hex"))
        .expect("grant");
    assert_eq!(g2.rate_bps, SERVE / 2, "the grant carries the segment's share");
    let allocated = ctl_json(&url, &["allocations"]);
    let segs: Vec<serde_json::Value> = allocated
        .as_array()
        .expect("allocations")
        .iter()
        .map(|a| a["segments"][0].clone())
        .collect();
    assert_eq!(segs.len(), 2);
    for s in &segs {
        assert_eq!(s["rate_limit_bps"], SERVE / 2, "both share the brick's memory: {s}");
    }
    let brick = &ctl_json(&url, &["bricks"])[0];
    assert_eq!(brick["promised_bps"], SERVE, "no more promised than served: {brick}");

    // The first grant still says 64 MiB/s: the heartbeat replies (every 100 ms) carry the
    // segment's new rate. Two heartbeats after the second allocation, the brick has it.
    let since = brick["last_heartbeat_unix_ms"].as_u64().expect("heartbeat time");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let b = &ctl_json(&url, &["bricks"])[0];
        if b["last_heartbeat_unix_ms"].as_u64().is_some_and(|t| t > since + 250) {
            break;
        }
        assert!(Instant::now() < deadline, "no heartbeat after the allocations: {b}");
        std::thread::sleep(Duration::from_millis(50));
    }

    let results: Vec<(u64, Duration)> = std::thread::scope(|s| {
        let handles: Vec<_> = segs
            .iter()
            .enumerate()
            .map(|(i, seg)| s.spawn(move || flood(i as u64, seg)))
            .collect();
        handles.into_iter().map(|h| h.join().expect("client")).collect()
    });
    let rate = SERVE / 2;
    for (i, (moved, span)) in results.iter().enumerate() {
        // A token bucket lets through at most its burst (20 ms at its rate, at least 256 KiB)
        // plus its rate over the span, plus the one request it runs into debt for.
        let burst = (rate / 50).max(256 << 10);
        let allowed = rate as f64 * span.as_secs_f64() + (burst + MIB) as f64;
        assert!(
            (*moved as f64) <= allowed,
            "client {i} moved {moved} bytes in {span:?}: more than {allowed:.0} its rate of {rate} bytes/s allows"
        );
    }

    // The brick reports what it held back with its next heartbeats.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let b = &ctl_json(&url, &["bricks"])[0];
        let stats = &b["stats"];
        let served = stats["bytes_served"].as_u64().unwrap_or(0);
        if served >= 2 * (SEGMENT + READ) {
            let delayed = stats["requests_delayed"].as_u64().unwrap_or(0);
            assert!(
                delayed > 0,
                "the clients asked for more than their rates, yet no request was delayed: {b}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the heartbeats never reported the traffic: {b}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An operator's rate (`rackmem ctl bricks rate`) reaches the brick's own total pacing, which
/// the brick reports with its heartbeats, and outlives the brick's restart with a rate of its
/// own on the command line: the control plane keeps the operator's, the brick enforces it, and
/// a segment placed afterwards is granted it.
#[test]
fn an_operators_rate_reaches_the_bricks_own_pacing_and_outlives_its_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_control, url) = start_control(&dir.path().join("control.db"));
    let key = dir.path().join("mem1.key");
    let start = |own_rate: Option<&str>| {
        start_managed_brick(&url, "tcp://127.0.0.1:0", "64MiB", "mem1", |c| {
            c.arg("--key-file").arg(&key).args(["--port", "p0:10GB/s"]);
            if let Some(r) = own_rate {
                c.args(["--serve-rate", r]);
            }
        })
    };
    let enforced_after = |since_ms: u64, want: u64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let b = ctl_json(&url, &["bricks"])[0].clone();
            let fresh = b["last_heartbeat_unix_ms"].as_u64().is_some_and(|t| t > since_ms);
            if fresh && b["stats"]["enforced_serve_bps"].as_u64() == Some(want) {
                return b;
            }
            assert!(
                Instant::now() < deadline,
                "the brick never reported enforcing {want} bytes/s: {b}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    let mut brick = start(None);
    let b = enforced_after(0, 0);
    assert!(b["serve_bps"].is_null() && b["serve_rate_by_operator"] == false, "{b}");

    let set = ctl_json(&url, &["bricks", "rate", "mem1", "16MiB"]);
    assert_eq!(set["serve_bps"], 16 * MIB, "{set}");
    assert_eq!(set["serve_rate_by_operator"], true, "{set}");
    enforced_after(now_ms(), 16 * MIB);

    // Restarted with a rate of its own: the operator's stays, and the brick enforces it once
    // a heartbeat reply has told it (the replies before were the old process's).
    brick.kill_group();
    let _ = brick.wait_until(Duration::from_secs(10));
    let restarted = now_ms();
    let _brick = start(Some("64MiB/s"));
    let b = enforced_after(restarted + 500, 16 * MIB);
    assert_eq!(b["serve_bps"], 16 * MIB, "the operator's rate was replaced: {b}");
    assert_eq!(b["serve_rate_by_operator"], true, "{b}");

    ctl_json(&url, &["add-node", "--name", "web1", "--port", "eth0:10GB/s"]);
    let a = ctl_json(&url, &["alloc", "--node", "web1", "--size", "8MiB"]);
    let g = Grant::decode(&hex::decode(a["segments"][0]["grant_hex"].as_str().expect("grant")).expect("hex"))
        .expect("grant");
    assert_eq!(
        g.rate_bps,
        16 * MIB,
        "a segment alone on the brick gets all the operator allows"
    );
}

/// `rackmem bench rates` on a short run: it runs, writes well-formed JSON with a round per
/// `--rounds` and a figure per client, and a chart. Figures are never asserted.
#[test]
fn bench_rates_on_a_short_run_writes_json_and_a_chart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (o, v, chart) = bench_part(
        dir.path(),
        &["rates", "--rounds", "2", "--seconds", "0.3", "--fraction", "0.5"],
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("÷ share"), "{}", show(&o));
    let rounds = v["rates"]["rounds"].as_array().expect("rounds");
    assert_eq!(rounds.len(), 2, "{v}");
    for r in rounds {
        assert_eq!(r["ratio"].as_array().map(Vec::len), Some(2), "{r}");
        assert_eq!(
            r["share_bps"][0], r["share_bps"][1],
            "the two segments share the brick equally: {r}"
        );
        let serve = r["serve_bps"].as_u64().expect("serve_bps");
        let shares: u64 = r["share_bps"]
            .as_array()
            .expect("shares")
            .iter()
            .filter_map(|x| x.as_u64())
            .sum();
        assert!(shares <= serve, "more promised than the brick serves: {r}");
    }
    assert!(v["rates"]["target_met"].is_boolean());
    assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
}

/// `rackmem bench floods` on a short run: every legitimate sample succeeds under the floods,
/// the control plane keeps no more of the flood's connections than its per-prefix cap, the
/// brick keeps the silent ones without refusing the client, and the JSON and chart are
/// written. Latencies are never asserted.
#[test]
fn bench_floods_serves_the_legitimate_client_under_both_floods() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, v, chart) = bench_part(
        dir.path(),
        &["floods", "--rounds", "1", "--samples", "20", "--brick-flood", "2000"],
    );
    let f = &v["floods"];
    for batch in ["quiet", "flooded"] {
        assert_eq!(f[batch]["failed"], 0, "{batch} samples failed: {f}");
        assert_eq!(f[batch]["allocation_us"].as_array().map(Vec::len), Some(20), "{f}");
        assert_eq!(f[batch]["first_fault_us"].as_array().map(Vec::len), Some(20), "{f}");
    }
    // The control plane's cap per /24 (128 by default) holds however many the flood opens.
    let control_held = f["control_held"].as_u64().expect("control_held");
    assert!(
        control_held <= 128,
        "the control plane kept {control_held} of one /24's connections: {f}"
    );
    assert_eq!(f["brick_held"], 2000, "the brick holds silent connections apart: {f}");
    assert!(f["allocation"]["p99_ratio"].as_f64().is_some_and(f64::is_finite), "{f}");
    assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
}
