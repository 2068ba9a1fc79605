//! End-to-end tests of the control plane: a real server on an ephemeral port, a real SQLite file
//! in a temporary directory, real HTTP.

// The helpers below are test code too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use rackmem_control::api::*;
use rackmem_control::client::{Client, ClientError};
use rackmem_control::grant;
use rackmem_control::graph::Topology;
use rackmem_control::heartbeat::spawn_brick_heartbeat;
use rackmem_control::server::{spawn, ServerConfig, ServerHandle};
use rackmem_control::store;
use rackmem_proto::Grant;
use std::path::Path;
use std::time::{Duration, Instant};

mod lossy_proxy;
use lossy_proxy::LossyProxy;

/// The admin token of every control plane these tests start.
const ADMIN: &str = "rmk_0_7e57ad3170ce5e1f00d1dea5c0ffee0123456789abcdef0123456789abcdef";
const MIB: u64 = 1 << 20;
const GBPS: u64 = 1_000_000_000;

fn start(db: &Path, configure: impl FnOnce(&mut ServerConfig)) -> (ServerHandle, Client) {
    let store = store::open(&format!("sqlite:{}", db.display())).unwrap();
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap(), store).with_admin_token(ADMIN);
    configure(&mut cfg);
    let server = spawn(cfg).unwrap();
    let client = Client::new(&[server.url()])
        .unwrap()
        .with_token(Some(ADMIN.to_string()));
    (server, client)
}

fn key_of(name: &str) -> Vec<u8> {
    format!("key-of-{name}-0123456789abcdef").into_bytes()
}

fn brick_reg(name: &str, capacity: u64, bw: u64) -> BrickRegistration {
    BrickRegistration {
        name: name.into(),
        address: format!("tcp://{name}.example:7070"),
        capacity_bytes: capacity,
        ports: vec![PortSpec {
            name: "p0".into(),
            bandwidth_bps: bw,
            switch: None,
        }],
        key_hex: hex::encode(key_of(name)),
        serve_bps: None,
    }
}

fn node_reg(name: &str, bw: u64) -> NodeRegistration {
    NodeRegistration {
        name: name.into(),
        ports: vec![PortSpec {
            name: "eth0".into(),
            bandwidth_bps: bw,
            switch: None,
        }],
    }
}

fn server_err(r: Result<impl std::fmt::Debug, ClientError>) -> (u16, String, String) {
    match r {
        Err(ClientError::Server {
            status, code, message, ..
        }) => (status, code, message),
        other => panic!("expected a server error, got {other:?}"),
    }
}

/// Sends a raw body; returns status and parsed JSON.
/// A request as the admin.
fn raw(url: &str, method: &str, path: &str, content_type: Option<&str>, body: &str) -> (u16, serde_json::Value) {
    raw_as(Some(ADMIN), url, method, path, content_type, body)
}

/// A request with `token` (`None`: no Authorization header).
fn raw_as(
    token: Option<&str>,
    url: &str,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> (u16, serde_json::Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let full = format!("{url}{path}");
    let auth = token.map(|t| format!("Bearer {t}"));
    macro_rules! authed {
        ($b:expr) => {{
            let b = $b;
            match &auth {
                Some(a) => b.header("Authorization", a),
                None => b,
            }
        }};
    }
    let r = match method {
        "POST" => {
            let mut b = authed!(agent.post(&full));
            if let Some(ct) = content_type {
                b = b.content_type(ct);
            }
            b.send(body)
        }
        "PUT" => authed!(agent.put(&full)).content_type("application/json").send(body),
        "PATCH" => authed!(agent.patch(&full)).content_type("application/json").send(body),
        "DELETE" => authed!(agent.delete(&full)).call(),
        _ => authed!(agent.get(&full)).call(),
    };
    let mut resp = r.unwrap();
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    let v = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, v)
}

fn assert_json_error(v: &serde_json::Value, code: &str) {
    assert_eq!(v["error"]["code"], code, "error body: {v}");
    assert!(
        v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
        "error without message: {v}"
    );
}

fn extents_disjoint(allocs: &[Allocation]) {
    let mut by_brick: std::collections::HashMap<u64, Vec<(u64, u64)>> = Default::default();
    for a in allocs {
        for s in &a.segments {
            by_brick.entry(s.brick_id).or_default().push((s.offset, s.size_bytes));
        }
    }
    for (b, mut v) in by_brick {
        v.sort();
        for w in v.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "brick {b}: extents overlap: {w:?}");
        }
    }
}

fn verify_segment(s: &Segment, node: u64) {
    let g = Grant::decode(&hex::decode(&s.grant_hex).unwrap()).unwrap();
    let name = s
        .brick_address
        .strip_prefix("tcp://")
        .and_then(|a| a.split('.').next())
        .unwrap();
    let key = key_of(name);
    g.verify(&key, 1_700_000_000).unwrap();
    assert!(g.verify(b"some other brick's key!!", 1_700_000_000).is_err());
    assert_eq!(
        (g.segment_id, g.brick_offset, g.size_bytes, g.node),
        (s.segment_id, s.offset, s.size_bytes, node)
    );
    assert_eq!(s.session_key_hex, hex::encode(grant::session_key(&key, &g)));
}

#[test]
fn register_allocate_stripe_free_and_resize() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, c) = start(&dir.path().join("control.db"), |_| {});
    let b1 = c.register_brick(&brick_reg("b1", 64 * MIB, 10 * GBPS)).unwrap().id;
    let b2 = c.register_brick(&brick_reg("b2", 64 * MIB, 10 * GBPS)).unwrap().id;
    let b3 = c.register_brick(&brick_reg("b3", 32 * MIB, 10 * GBPS)).unwrap().id;
    assert_eq!(
        c.register_brick(&brick_reg("b1", 64 * MIB, 10 * GBPS)).unwrap().id,
        b1,
        "same name, same id"
    );
    let n = c.register_node(&node_reg("n1", 10 * GBPS)).unwrap().id;
    assert_eq!(c.bricks().unwrap().len(), 3);
    assert_eq!(c.node(n).unwrap().name, "n1");

    // Striped over two bricks: both segments, distinct bricks, whole MiB, valid grants.
    let a = c
        .allocate(&AllocationRequest {
            node: n,
            size_bytes: 10 * MIB + 1,
            stripe: Some(2),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(a.segments.len(), 2);
    assert_ne!(a.segments[0].brick_id, a.segments[1].brick_id);
    assert!(a.segments.iter().all(|s| s.size_bytes == 6 * MIB));
    for s in &a.segments {
        verify_segment(s, n);
        assert!(s.rate_limit_bps > 0 && s.rate_limit_bps <= 10 * GBPS);
    }
    // Many more: extents never overlap, free bytes add up.
    let mut all = vec![a.clone()];
    for i in 0..12 {
        all.push(
            c.allocate(&AllocationRequest {
                node: n,
                size_bytes: (1 + i % 3) * MIB,
                stripe: Some(1 + (i % 2) as u32),
                ..Default::default()
            })
            .unwrap(),
        );
    }
    extents_disjoint(&all);
    let used: u64 = all.iter().flat_map(|a| a.segments.iter().map(|s| s.size_bytes)).sum();
    let free: u64 = c.bricks().unwrap().iter().map(|b| b.free_bytes).sum();
    assert_eq!(used + free, 160 * MIB);

    // Explicit bricks.
    let e = c
        .allocate(&AllocationRequest {
            node: n,
            size_bytes: 2 * MIB,
            bricks: Some(vec![b3, b2]),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(e.segments.iter().map(|s| s.brick_id).collect::<Vec<_>>(), vec![b3, b2]);

    // Delete returns the extents.
    let before = c.brick(b3).unwrap().free_bytes;
    let released = c.free(e.id).unwrap();
    assert_eq!(released.extents.len(), 2);
    assert_eq!(released.extents[0].brick_id, b3);
    assert_eq!(released.extents[0].offset, e.segments[0].offset);
    assert_eq!(c.brick(b3).unwrap().free_bytes, before + MIB);
    assert_eq!(server_err(c.allocation(e.id)).0, 404);
    assert_eq!(server_err(c.free(e.id)).0, 404);

    // Grow adds segments with new ids; shrink drops whole segments from the end.
    let g = c.resize(a.id, 20 * MIB).unwrap();
    assert_eq!(g.segments.len(), 4);
    let no_rate = |v: &[Segment]| -> Vec<Segment> {
        v.iter()
            .cloned()
            .map(|mut s| {
                s.rate_limit_bps = 0;
                s
            })
            .collect()
    };
    assert_eq!(
        no_rate(&g.segments[..2]),
        no_rate(&a.segments),
        "existing segments are kept as they are"
    );
    assert!(g.segments[2].segment_id > a.segments[1].segment_id);
    for s in &g.segments {
        verify_segment(s, n);
    }
    let s = c.resize(a.id, 7 * MIB).unwrap();
    assert_eq!(s.segments.len(), 2, "12 MiB of segments still cover 7 MiB");
    assert_eq!(s.size_bytes, 7 * MIB);
    let s = c.resize(a.id, MIB).unwrap();
    assert_eq!(s.segments.len(), 1);
    assert_eq!(no_rate(&s.segments), no_rate(&a.segments[..1]));
    let (st, code, _) = server_err(c.resize(a.id, 0));
    assert_eq!((st, code.as_str()), (422, "invalid"));

    // Heartbeat lists exactly the live segments of the brick.
    let hb = c.heartbeat(b1, &HeartbeatStats::default()).unwrap();
    let live = c.allocations().unwrap();
    let mut want: Vec<u64> = live
        .iter()
        .flat_map(|a| a.segments.iter())
        .filter(|s| s.brick_id == b1)
        .map(|s| s.segment_id)
        .collect();
    want.sort();
    assert_eq!(hb.segments.iter().map(|s| s.id).collect::<Vec<_>>(), want);
    let rates = c.rates(n).unwrap();
    assert_eq!(
        rates.segments.len(),
        live.iter().map(|a| a.segments.len()).sum::<usize>()
    );
}

#[test]
fn failed_allocation_reserves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, c) = start(&dir.path().join("control.db"), |_| {});
    c.register_brick(&brick_reg("big", 64 * MIB, 10 * GBPS)).unwrap();
    c.register_brick(&brick_reg("small", 4 * MIB, 10 * GBPS)).unwrap();
    let n = c.register_node(&node_reg("n", 10 * GBPS)).unwrap().id;
    let before = c.graph().unwrap();
    // 2 x 16 MiB: the big brick is carved first, the small one cannot hold its half.
    let (status, code, msg) = server_err(c.allocate(&AllocationRequest {
        node: n,
        size_bytes: 32 * MIB,
        stripe: Some(2),
        bandwidth_bps: Some(GBPS),
        ..Default::default()
    }));
    assert_eq!((status, code.as_str()), (409, "insufficient_capacity"), "{msg}");
    assert_eq!(c.graph().unwrap(), before, "nothing reserved after a failed allocation");
    // More than any brick lends.
    let (status, code, _) = server_err(c.allocate(&AllocationRequest {
        node: n,
        size_bytes: 1 << 40,
        ..Default::default()
    }));
    assert_eq!((status, code.as_str()), (409, "insufficient_capacity"));
    // Not representable in whole MiB.
    let (status, code, _) = server_err(c.allocate(&AllocationRequest {
        node: n,
        size_bytes: u64::MAX,
        ..Default::default()
    }));
    assert_eq!((status, code.as_str()), (422, "invalid"));
    assert_eq!(c.graph().unwrap(), before);
    assert!(c.allocations().unwrap().is_empty());
}

#[test]
fn bandwidth_reservations_exhaust_links() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, c) = start(&dir.path().join("control.db"), |_| {});
    c.register_brick(&brick_reg("b1", 256 * MIB, 10 * GBPS)).unwrap();
    c.register_brick(&brick_reg("b2", 256 * MIB, 10 * GBPS)).unwrap();
    // The node's port (4 GB/s) is the bottleneck.
    let n = c.register_node(&node_reg("n", 4 * GBPS)).unwrap().id;
    let mk = |bw| AllocationRequest {
        node: n,
        size_bytes: 8 * MIB,
        bandwidth_bps: Some(bw),
        ..Default::default()
    };
    let unreserved = c
        .allocate(&AllocationRequest {
            node: n,
            size_bytes: MIB,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(unreserved.segments[0].rate_limit_bps, 4 * GBPS);
    let a = c.allocate(&mk(3 * GBPS)).unwrap();
    assert_eq!(a.segments[0].rate_limit_bps, 3 * GBPS);
    assert_eq!(a.segments[0].bandwidth_bps, 3 * GBPS);
    let (status, code, msg) = server_err(c.allocate(&mk(2 * GBPS)));
    assert_eq!((status, code.as_str()), (409, "insufficient_bandwidth"), "{msg}");
    // The unreserved segment now shares what is left.
    assert_eq!(c.allocation(unreserved.id).unwrap().segments[0].rate_limit_bps, GBPS);
    let link = c
        .graph()
        .unwrap()
        .links
        .into_iter()
        .find(|l| l.id == format!("node:{n}:eth0"))
        .unwrap();
    assert_eq!((link.reserved_bps, link.free_bps, link.segments), (3 * GBPS, GBPS, 2));
    c.allocate(&mk(GBPS)).unwrap();
    c.free(a.id).unwrap();
    c.allocate(&mk(3 * GBPS)).unwrap();
    // The sum of the limits on the node port never exceeds its bandwidth.
    let total: u64 = c.rates(n).unwrap().segments.iter().map(|s| s.rate_limit_bps).sum();
    assert!(total <= 4 * GBPS, "{total}");
}

#[test]
fn topology_paths_cross_switches() {
    let dir = tempfile::tempdir().unwrap();
    let topo = Topology::parse(
        r#"{"switches": ["tor-a", "tor-b", "spine"],
            "links": [{"a": "tor-a", "b": "spine", "bandwidth_bps": 2000000000},
                      {"a": "tor-b", "b": "spine", "bandwidth_bps": 2000000000}],
            "ports": {"far:p0": "tor-b"},
            "default_switch": "tor-a"}"#,
    )
    .unwrap();
    let (_server, c) = start(&dir.path().join("control.db"), |cfg| cfg.topology = Some(topo));
    let far = c.register_brick(&brick_reg("far", 64 * MIB, 10 * GBPS)).unwrap().id;
    let n = c.register_node(&node_reg("n", 10 * GBPS)).unwrap().id;
    let a = c
        .allocate(&AllocationRequest {
            node: n,
            size_bytes: MIB,
            bandwidth_bps: Some(GBPS),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        a.segments[0].links,
        vec![
            format!("node:{n}:eth0"),
            "switch:tor-a:spine".to_string(),
            "switch:tor-b:spine".to_string(),
            format!("brick:{far}:p0")
        ]
    );
    let (status, code, _) = server_err(c.allocate(&AllocationRequest {
        node: n,
        size_bytes: MIB,
        bandwidth_bps: Some(GBPS + 1),
        ..Default::default()
    }));
    assert_eq!((status, code.as_str()), (409, "insufficient_bandwidth"));
    let mut bad = brick_reg("x", 64 * MIB, GBPS);
    bad.ports[0].switch = Some("nowhere".into());
    let (status, code, _) = server_err(c.register_brick(&bad));
    assert_eq!((status, code.as_str()), (422, "invalid"));
    let g = c.graph().unwrap();
    assert_eq!(
        g.switches.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        vec!["spine", "tor-a", "tor-b"]
    );
}

#[test]
fn bad_requests_get_json_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (server, c) = start(&dir.path().join("control.db"), |cfg| cfg.body_limit_bytes = 4096);
    let url = server.url();
    c.register_brick(&brick_reg("b", 64 * MIB, GBPS)).unwrap();
    let n = c.register_node(&node_reg("n", GBPS)).unwrap().id;
    let ct = Some("application/json");
    for (body, want) in [
        ("{not json", 400),
        (r#"{"node": 1, "size_bytes": -5}"#, 400),
        (r#"{"node": 1, "size_bytes": "big"}"#, 400),
        (r#"{"node": 1, "size_bytes": 1e30}"#, 400),
        (r#"{"node": 1, "size_bytes": 99999999999999999999999}"#, 400),
        (r#"{"node": 1}"#, 400),
        (r#"{"node": 1, "size_bytes": 1048576, "surprise": true}"#, 400),
        (r#"[]"#, 400),
        ("", 400),
    ] {
        let (status, v) = raw(&url, "POST", "/v1/allocations", ct, body);
        assert_eq!(status, want, "{body}: {v}");
        assert_json_error(&v, "bad_request");
    }
    let (status, v) = raw(&url, "POST", "/v1/allocations", None, r#"{"node": 1, "size_bytes": 1}"#);
    assert_eq!(status, 415, "{v}");
    assert_json_error(&v, "unsupported_media_type");
    let huge = format!(r#"{{"node": 1, "size_bytes": 1, "links": ["{}"]}}"#, "x".repeat(10_000));
    let (status, v) = raw(&url, "POST", "/v1/allocations", ct, &huge);
    assert_eq!(status, 413, "{v}");
    assert_json_error(&v, "payload_too_large");

    let body = |node: u64, size: u64, extra: &str| format!(r#"{{"node": {node}, "size_bytes": {size}{extra}}}"#);
    let (status, v) = raw(&url, "POST", "/v1/allocations", ct, &body(n, 0, ""));
    assert_eq!(status, 422, "{v}");
    assert_json_error(&v, "invalid");
    let (status, v) = raw(&url, "POST", "/v1/allocations", ct, &body(n, MIB, r#", "stripe": 0"#));
    assert_eq!(status, 422, "{v}");
    let (status, v) = raw(&url, "POST", "/v1/allocations", ct, &body(999, MIB, ""));
    assert_eq!(status, 404, "{v}");
    assert_json_error(&v, "not_found");
    let (status, v) = raw(
        &url,
        "POST",
        "/v1/allocations",
        ct,
        &body(n, MIB, r#", "bricks": [77]"#),
    );
    assert_eq!(status, 404, "{v}");
    let (status, v) = raw(&url, "POST", "/v1/allocations", ct, &body(n, MIB, r#", "stripe": 5"#));
    assert_eq!(status, 409, "only one brick: {v}");
    assert_json_error(&v, "insufficient_capacity");

    for (m, path) in [
        ("GET", "/v1/allocations/12345"),
        ("DELETE", "/v1/allocations/12345"),
        ("GET", "/v1/bricks/999"),
        ("GET", "/v1/nodes/999"),
        ("GET", "/v1/nodes/999/rates"),
        ("GET", "/v1/nothing-here"),
    ] {
        let (status, v) = raw(&url, m, path, None, "");
        assert_eq!(status, 404, "{m} {path}: {v}");
        assert_json_error(&v, "not_found");
    }
    let (status, v) = raw(&url, "GET", "/v1/allocations/abc", None, "");
    assert_eq!(status, 400, "{v}");
    assert_json_error(&v, "bad_request");
    let (status, v) = raw(&url, "GET", "/v1/allocations/-1", None, "");
    assert_eq!(status, 400, "{v}");
    let (status, v) = raw(&url, "PATCH", "/v1/allocations/1", None, r#"{"size_bytes": "x"}"#);
    assert_eq!(status, 400, "{v}");
    let (status, v) = raw(&url, "DELETE", "/v1/bricks", None, "");
    assert_eq!(status, 405, "{v}");
    assert_json_error(&v, "method_not_allowed");
    let (status, v) = raw(&url, "PUT", "/v1/bricks/999/heartbeat", None, "");
    assert_eq!(status, 404, "{v}");
    let (status, v) = raw(&url, "PUT", "/v1/bricks/1/heartbeat", None, "{oops");
    assert_eq!(status, 400, "{v}");
    let (status, v) = raw(&url, "PUT", "/v1/bricks/1/heartbeat", None, r#"{"segments": 3}"#);
    assert_eq!(status, 200, "{v}");
    assert_eq!(c.brick(1).unwrap().stats.unwrap().segments, Some(3));

    // Registrations: invalid fields are 422, a conflicting address is 409.
    let mut r = brick_reg("b2", 64 * MIB, GBPS);
    r.key_hex = "zz".into();
    assert_eq!(server_err(c.register_brick(&r)).0, 422);
    let mut r = brick_reg("b2", 0, GBPS);
    r.capacity_bytes = 0;
    assert_eq!(server_err(c.register_brick(&r)).0, 422);
    let mut r = brick_reg("b2", 64 * MIB, GBPS);
    r.address = "b.example:7070".into();
    assert_eq!(server_err(c.register_brick(&r)).0, 422);
    let mut r = brick_reg("b2", 64 * MIB, GBPS);
    r.address = brick_reg("b", 64 * MIB, GBPS).address;
    let (status, code, _) = server_err(c.register_brick(&r));
    assert_eq!((status, code.as_str()), (409, "conflict"));
    let mut r = brick_reg("bad name!", 64 * MIB, GBPS);
    r.ports.clear();
    assert_eq!(server_err(c.register_brick(&r)).0, 422);
    // A re-registration that would orphan live segments is refused.
    let a = c
        .allocate(&AllocationRequest {
            node: n,
            size_bytes: 32 * MIB,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(a.segments[0].offset, 0);
    let (status, code, _) = server_err(c.register_brick(&brick_reg("b", 16 * MIB, GBPS)));
    assert_eq!((status, code.as_str()), (409, "conflict"));
    let mut moved = node_reg("n", GBPS);
    moved.ports[0].name = "eth9".into();
    assert_eq!(server_err(c.register_node(&moved)).0, 409);
    assert!(c.health().is_ok(), "the server survived all of it");
}

#[test]
fn state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state/control.db");
    let (server, c) = start(&db, |_| {});
    c.register_brick(&brick_reg("b1", 64 * MIB, 10 * GBPS)).unwrap();
    c.register_brick(&brick_reg("b2", 64 * MIB, 10 * GBPS)).unwrap();
    let n = c.register_node(&node_reg("n", 10 * GBPS)).unwrap().id;
    let mut before = Vec::new();
    for i in 0..6u64 {
        before.push(
            c.allocate(&AllocationRequest {
                node: n,
                size_bytes: (i + 1) * MIB,
                stripe: Some(1 + (i % 2) as u32),
                bandwidth_bps: (i == 3).then_some(GBPS),
                ..Default::default()
            })
            .unwrap(),
        );
    }
    let freed = before.remove(1);
    c.free(freed.id).unwrap();
    c.resize(before[0].id, 5 * MIB).unwrap();
    // Rate limits move with every allocation: compare against the state right before the stop.
    let before = c.allocations().unwrap();
    let graph_before = c.graph().unwrap();
    server.stop().unwrap();
    assert!(c.health().is_err(), "stopped");

    let (_server, c) = start(&db, |_| {});
    let after = c.allocations().unwrap();
    assert_eq!(after, before, "every allocation, segment and grant is intact");
    for a in &after {
        for s in &a.segments {
            verify_segment(s, n);
        }
    }
    let mut g = c.graph().unwrap();
    for b in &mut g.bricks {
        assert_eq!(b.state, BrickState::Up, "up until the heartbeat timeout passes");
        b.last_heartbeat_unix_ms = None;
    }
    assert_eq!(g, graph_before);
    // New allocations neither overlap old extents nor reuse ids.
    let max_seg = after
        .iter()
        .flat_map(|a| a.segments.iter())
        .map(|s| s.segment_id)
        .max()
        .unwrap();
    let max_id = after.iter().map(|a| a.id).max().unwrap().max(freed.id);
    let mut all = after.clone();
    for _ in 0..8 {
        let a = c
            .allocate(&AllocationRequest {
                node: n,
                size_bytes: 3 * MIB,
                stripe: Some(2),
                ..Default::default()
            })
            .unwrap();
        assert!(a.id > max_id);
        assert!(a.segments.iter().all(|s| s.segment_id > max_seg));
        all.push(a);
    }
    extents_disjoint(&all);
    assert_eq!(c.register_node(&node_reg("n", 10 * GBPS)).unwrap().id, n);
}

#[test]
fn silent_bricks_go_down_and_are_avoided() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, c) = start(&dir.path().join("control.db"), |cfg| {
        cfg.brick_timeout = Duration::from_millis(300);
    });
    let quiet = c.register_brick(&brick_reg("quiet", 256 * MIB, GBPS)).unwrap().id;
    let n = c.register_node(&node_reg("n", GBPS)).unwrap().id;
    // `live` heartbeats through the library thread; `quiet` never does.
    let urls = vec![c.urls()[0].clone()];
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Vec<LiveSegment>>::new()));
    let s2 = seen.clone();
    let hb = spawn_brick_heartbeat(
        Client::new(&urls).unwrap().with_token(Some(ADMIN.to_string())),
        brick_reg("live", 64 * MIB, GBPS),
        Duration::from_millis(50),
        move |reply: &HeartbeatReply, _| s2.lock().unwrap().push(reply.segments.to_vec()),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.brick(quiet).unwrap().state != BrickState::Down {
        assert!(Instant::now() < deadline, "the silent brick was never marked down");
        std::thread::sleep(Duration::from_millis(20));
    }
    let live = hb.brick_id().unwrap();
    assert_eq!(c.brick(live).unwrap().state, BrickState::Up);
    // The quiet brick has more room, but it is down: the allocation goes to the live one.
    let a = c
        .allocate(&AllocationRequest {
            node: n,
            size_bytes: MIB,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(a.segments[0].brick_id, live);
    let (status, code, _) = server_err(c.allocate(&AllocationRequest {
        node: n,
        size_bytes: MIB,
        bricks: Some(vec![quiet]),
        ..Default::default()
    }));
    assert_eq!((status, code.as_str()), (409, "insufficient_capacity"));
    // The heartbeat reply carries the new segment to the brick.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let last = seen.lock().unwrap().last().cloned().unwrap_or_default();
        if last.iter().any(|s| s.id == a.segments[0].segment_id) {
            break;
        }
        assert!(Instant::now() < deadline, "the heartbeat never listed the new segment");
        std::thread::sleep(Duration::from_millis(20));
    }
    hb.stop();
    // A heartbeat brings a down brick back.
    c.heartbeat(quiet, &HeartbeatStats::default()).unwrap();
    assert_eq!(c.brick(quiet).unwrap().state, BrickState::Up);
}

#[test]
fn heartbeat_thread_waits_for_the_control_plane() {
    // Register against a port nobody listens on yet; start the control plane there later.
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let hb = spawn_brick_heartbeat(
        Client::with_timeout(&[url], Duration::from_secs(2))
            .unwrap()
            .with_token(Some(ADMIN.to_string())),
        brick_reg("late", 64 * MIB, GBPS),
        Duration::from_millis(50),
        |_, _| {},
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(hb.brick_id(), None);
    let store = store::open(&format!("sqlite:{}", dir.path().join("c.db").display())).unwrap();
    let server =
        spawn(ServerConfig::new(format!("127.0.0.1:{port}").parse().unwrap(), store).with_admin_token(ADMIN)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while hb.brick_id().is_none() {
        assert!(Instant::now() < deadline, "never registered");
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = Client::new(&[server.url()])
        .unwrap()
        .with_token(Some(ADMIN.to_string()));
    assert_eq!(c.bricks().unwrap()[0].name, "late");
    hb.stop();
}

#[test]
fn client_fails_over_to_the_next_control_plane() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(&dir.path().join("control.db"), |_| {});
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let c = Client::new(&[dead.clone(), server.url()])
        .unwrap()
        .with_token(Some(ADMIN.to_string()));
    assert_eq!(c.health().unwrap().status, "ok");
    let only_dead = Client::new(&[dead]).unwrap().with_token(Some(ADMIN.to_string()));
    assert!(matches!(only_dead.health(), Err(ClientError::Unreachable { .. })));
    assert!(matches!(Client::new(&["ftp://x"]), Err(ClientError::BadUrl(_))));
}

#[test]
fn openapi_lists_every_route_and_metrics_have_the_series() {
    let dir = tempfile::tempdir().unwrap();
    let (server, c) = start(&dir.path().join("control.db"), |_| {});
    let url = server.url();
    c.register_brick(&brick_reg("b", 64 * MIB, GBPS)).unwrap();
    let n = c.register_node(&node_reg("n", GBPS)).unwrap().id;
    c.allocate(&AllocationRequest {
        node: n,
        size_bytes: MIB,
        ..Default::default()
    })
    .unwrap();
    let _ = c.allocation(999);

    let (status, doc) = raw(&url, "GET", "/openapi.json", None, "");
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for (path, methods) in [
        ("/v1/bricks", &["get", "post"][..]),
        ("/v1/bricks/{id}", &["get", "delete"]),
        ("/v1/tokens", &["get", "post"]),
        ("/v1/tokens/{id}", &["delete"]),
        ("/v1/bricks/{id}/heartbeat", &["put"]),
        ("/v1/nodes", &["get", "post"]),
        ("/v1/nodes/{id}", &["get"]),
        ("/v1/nodes/{id}/rates", &["get"]),
        ("/v1/allocations", &["get", "post"]),
        ("/v1/allocations/{id}", &["get", "delete", "patch"]),
        ("/v1/graph", &["get"]),
        ("/healthz", &["get"]),
        ("/metrics", &["get"]),
        ("/openapi.json", &["get"]),
        ("/v1/circuits", &["get"]),
        ("/v1/circuits/{id}/move", &["post"]),
        ("/v1/bricks/{id}/serve-rate", &["put"]),
        ("/v1/allocations/{id}/clone", &["post"]),
        ("/v1/rebalance", &["get", "post"]),
        ("/v1/segments", &["get", "post"]),
        ("/v1/segments/{name}/close", &["post"]),
    ] {
        let p = paths
            .get(path)
            .unwrap_or_else(|| panic!("{path} missing from the OpenAPI document"));
        for m in methods {
            assert!(p.get(*m).is_some(), "{m} {path} missing");
        }
    }
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for s in [
        "Allocation",
        "AllocationRequest",
        "CloneRequest",
        "Segment",
        "Brick",
        "ErrorBody",
        "Graph",
        "Link",
        "SegmentOpen",
        "SegmentClose",
        "NamedSegment",
        "NamedClosed",
    ] {
        assert!(schemas.contains_key(s), "schema {s} missing");
    }
    assert_eq!(rackmem_control::server::openapi().paths.paths.len(), paths.len());

    let (status, v) = raw(&url, "GET", "/metrics", None, "");
    assert_eq!(status, 200);
    let text = v.as_str().unwrap();
    for series in [
        "rackmem_control_allocations 1",
        "rackmem_control_segments 1",
        "rackmem_control_bricks{state=\"up\"} 1",
        "rackmem_control_bricks{state=\"down\"} 0",
        "rackmem_control_brick_free_bytes{brick=\"b\"} 66060288",
        "rackmem_control_brick_allocated_bytes{brick=\"b\"} 1048576",
        "rackmem_control_requests_total{route=\"/v1/allocations\",method=\"POST\",status=\"201\"} 1",
        "rackmem_control_requests_total{route=\"/v1/allocations/{id}\",method=\"GET\",status=\"404\"} 1",
        "rackmem_control_allocation_seconds_count 1",
        "rackmem_control_allocation_seconds_bucket{le=\"+Inf\"} 1",
        "rackmem_control_circuits 0",
        "rackmem_control_circuit_setup_seconds_count 0",
        "rackmem_control_brick_promised_bytes_per_second{brick=\"b\"} ",
        "rackmem_control_node_pool_bytes{node=\"",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
}

// ---------------------------------------------------------------------------------------------
// Authentication and authorization (docs/security.md)

/// A client sending `token`.
fn client_as(server: &ServerHandle, token: &str) -> Client {
    Client::new(&[server.url()])
        .unwrap()
        .with_token(Some(token.to_string()))
}

fn token(c: &Client, role: &str, name: &str) -> String {
    let role = rackmem_control::auth::Role::parse(role).unwrap();
    c.create_token(&TokenRequest {
        role,
        name: name.to_string(),
    })
    .unwrap()
    .token
}

/// Everything the state holds, as the admin sees it.
fn state(c: &Client) -> (Vec<Brick>, Vec<Node>, Vec<Allocation>, Vec<TokenInfo>) {
    (
        c.bricks().unwrap(),
        c.nodes().unwrap(),
        c.allocations().unwrap(),
        c.tokens().unwrap(),
    )
}

#[test]
fn requests_without_a_valid_token_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (server, admin) = start(&dir.path().join("control.db"), |_| {});
    let url = server.url();
    admin.register_brick(&brick_reg("b", 64 * MIB, GBPS)).unwrap();
    let n = admin.register_node(&node_reg("n", GBPS)).unwrap().id;
    let a = admin
        .allocate(&AllocationRequest {
            node: n,
            size_bytes: MIB,
            ..Default::default()
        })
        .unwrap();
    let revoked = admin
        .create_token(&TokenRequest {
            role: rackmem_control::auth::Role::Admin,
            name: "old".into(),
        })
        .unwrap();
    admin.revoke_token(revoked.id).unwrap();
    let before = state(&admin);
    let alloc = format!(r#"{{"node": {n}, "size_bytes": 1048576}}"#);
    let hijack = serde_json::to_string(&BrickRegistration {
        address: "tcp://evil.example:7070".into(),
        key_hex: hex::encode(b"an-attacker-chosen-key-0123456789"),
        serve_bps: None,
        ..brick_reg("b", 64 * MIB, GBPS)
    })
    .unwrap();
    let requests: Vec<(&str, String, String)> = vec![
        ("GET", "/v1/allocations".into(), String::new()),
        ("GET", format!("/v1/allocations/{}", a.id), String::new()),
        ("POST", "/v1/allocations".into(), alloc.clone()),
        ("DELETE", format!("/v1/allocations/{}", a.id), String::new()),
        (
            "PATCH",
            format!("/v1/allocations/{}", a.id),
            r#"{"size_bytes": 8388608}"#.into(),
        ),
        ("POST", "/v1/bricks".into(), hijack.clone()),
        ("GET", "/v1/bricks".into(), String::new()),
        ("PUT", "/v1/bricks/1/heartbeat".into(), String::new()),
        ("DELETE", "/v1/bricks/1".into(), String::new()),
        (
            "POST",
            "/v1/nodes".into(),
            serde_json::to_string(&node_reg("m", GBPS)).unwrap(),
        ),
        ("GET", "/v1/nodes".into(), String::new()),
        ("GET", format!("/v1/nodes/{n}/rates"), String::new()),
        ("GET", "/v1/graph".into(), String::new()),
        ("POST", "/v1/tokens".into(), r#"{"role": "admin", "name": "me"}"#.into()),
        ("GET", "/v1/tokens".into(), String::new()),
        ("GET", "/metrics".into(), String::new()),
        ("GET", "/openapi.json".into(), String::new()),
    ];
    let bad_tokens = [
        None,
        Some("rmk_1_0000000000000000000000000000000000000000000000000000000000000000"),
        Some(revoked.token.as_str()),
        Some("not a token at all"),
    ];
    for (method, path, body) in &requests {
        for t in bad_tokens {
            let (status, v) = raw_as(t, &url, method, path, Some("application/json"), body);
            assert_eq!(status, 401, "{method} {path} with {t:?}: {v}");
            assert_json_error(&v, "unauthorized");
        }
    }
    assert_eq!(state(&admin), before, "a refused request changed the state");
    // Open to all: liveness and where the leader is.
    assert_eq!(raw_as(None, &url, "GET", "/healthz", None, "").0, 200);
    assert_eq!(raw_as(None, &url, "GET", "/v1/leader", None, "").0, 200);
}

#[test]
fn a_node_sees_and_changes_only_its_own_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let (server, admin) = start(&dir.path().join("control.db"), |_| {});
    let url = server.url();
    admin.register_brick(&brick_reg("b", 256 * MIB, GBPS)).unwrap();
    let web1 = client_as(&server, &token(&admin, "node", "web1"));
    let web2_token = token(&admin, "node", "web2");
    let web2 = client_as(&server, &web2_token);
    let n1 = web1.register_node(&node_reg("web1", GBPS)).unwrap().id;
    let n2 = web2.register_node(&node_reg("web2", GBPS)).unwrap().id;
    // A node registers under its own name only.
    assert_eq!(server_err(web1.register_node(&node_reg("web3", GBPS))).1, "forbidden");
    let ask = |node| AllocationRequest {
        node,
        size_bytes: MIB,
        ..Default::default()
    };
    let mine = web1.allocate(&ask(n1)).unwrap();
    let theirs = web2.allocate(&ask(n2)).unwrap();
    let before = state(&admin);

    // Listing shows web1's allocations only: web2's grants and session keys stay hidden.
    let listed = web1.allocations().unwrap();
    assert_eq!(listed.iter().map(|a| a.id).collect::<Vec<_>>(), vec![mine.id]);
    let (status, v) = raw_as(
        Some(&web2_token),
        &url,
        "GET",
        &format!("/v1/allocations?node={n1}"),
        None,
        "",
    );
    assert_eq!(status, 403, "{v}");
    assert_json_error(&v, "forbidden");
    let text = raw_as(Some(&web2_token), &url, "GET", "/v1/allocations", None, "")
        .1
        .to_string();
    assert!(
        !text.contains(&mine.segments[0].session_key_hex) && !text.contains(&mine.segments[0].grant_hex),
        "web2 read web1's grant"
    );
    for (code, r) in [
        ("forbidden", web1.allocation(theirs.id).map(|_| ())),
        ("forbidden", web1.free(theirs.id).map(|_| ())),
        ("forbidden", web1.resize(theirs.id, 4 * MIB).map(|_| ())),
        ("forbidden", web1.allocate(&ask(n2)).map(|_| ())),
        ("forbidden", web1.rates(n2).map(|_| ())),
        ("forbidden", web1.node(n2).map(|_| ())),
        ("forbidden", web1.nodes().map(|_| ())),
        ("forbidden", web1.bricks().map(|_| ())),
        ("forbidden", web1.graph().map(|_| ())),
        ("forbidden", web1.tokens().map(|_| ())),
        (
            "forbidden",
            web1.create_token(&TokenRequest {
                role: rackmem_control::auth::Role::Admin,
                name: "escalate".into(),
            })
            .map(|_| ()),
        ),
        (
            "forbidden",
            web1.register_brick(&brick_reg("rogue", 64 * MIB, GBPS)).map(|_| ()),
        ),
    ] {
        let (status, got, message) = server_err(r);
        assert_eq!((status, got.as_str()), (403, code), "{message}");
        assert!(message.contains("web1"), "the refusal names the principal: {message}");
    }
    assert_eq!(state(&admin), before, "a forbidden request changed the state");
    // Its own: all of it.
    assert_eq!(web1.allocation(mine.id).unwrap().id, mine.id);
    assert_eq!(web1.rates(n1).unwrap().node, n1);
    web1.free(mine.id).unwrap();
    assert_eq!(admin.allocations().unwrap().len(), 1);
    // A revoked node token stops working at once.
    let id = admin
        .tokens()
        .unwrap()
        .into_iter()
        .find(|t| t.name == "web2")
        .unwrap()
        .id;
    admin.revoke_token(id).unwrap();
    assert_eq!(server_err(web2.allocation(theirs.id)).0, 401);
}

#[test]
fn a_brick_name_cannot_be_hijacked() {
    let dir = tempfile::tempdir().unwrap();
    let (server, admin) = start(&dir.path().join("control.db"), |_| {});
    let b1 = client_as(&server, &token(&admin, "brick", "b1"));
    let rogue = client_as(&server, &token(&admin, "brick", "rogue"));
    let id = b1.register_brick(&brick_reg("b1", 64 * MIB, GBPS)).unwrap().id;
    let n = admin.register_node(&node_reg("n", GBPS)).unwrap().id;
    let a = admin
        .allocate(&AllocationRequest {
            node: n,
            size_bytes: MIB,
            ..Default::default()
        })
        .unwrap();
    let before = state(&admin);
    let evil = BrickRegistration {
        address: "tcp://evil.example:7070".into(),
        key_hex: hex::encode(b"an-attacker-chosen-key-0123456789"),
        serve_bps: None,
        ..brick_reg("b1", 64 * MIB, GBPS)
    };
    // Another brick's token may not register under b1's name, nor send its heartbeats.
    assert_eq!(server_err(rogue.register_brick(&evil)).1, "forbidden");
    assert_eq!(
        server_err(rogue.heartbeat(id, &HeartbeatStats::default())).1,
        "forbidden"
    );
    // Even b1's own token (or an admin) cannot re-key the name while it holds live data.
    for c in [&b1, &admin] {
        let (status, code, message) = server_err(c.register_brick(&evil));
        assert_eq!((status, code.as_str()), (409, "conflict"), "{message}");
        assert!(message.contains("key"), "{message}");
    }
    assert_eq!(state(&admin), before, "a refused registration changed the state");
    assert_eq!(admin.brick(id).unwrap().address, "tcp://b1.example:7070");
    // Re-registering with the same key (a restart) is fine; its heartbeats too.
    b1.register_brick(&brick_reg("b1", 64 * MIB, GBPS)).unwrap();
    b1.heartbeat(id, &HeartbeatStats::default()).unwrap();
    // Forgetting a brick needs it empty; then the name is free for a new key.
    assert_eq!(server_err(admin.forget_brick(id)).1, "conflict");
    admin.free(a.id).unwrap();
    assert_eq!(server_err(b1.forget_brick(id)).1, "forbidden");
    admin.forget_brick(id).unwrap();
    assert!(admin.bricks().unwrap().is_empty());
    b1.register_brick(&BrickRegistration {
        key_hex: hex::encode(b"a-new-machine-key-0123456789abcdef"),
        serve_bps: None,
        ..brick_reg("b1", 64 * MIB, GBPS)
    })
    .unwrap();
}

#[test]
fn tokens_survive_a_restart_and_only_their_hash_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("control.db");
    let t = {
        let (_server, admin) = start(&db, |_| {});
        token(&admin, "node", "web1")
    };
    let text = String::from_utf8_lossy(&std::fs::read(&db).unwrap()).to_string();
    let secret = t.rsplit('_').next().unwrap();
    assert!(!text.contains(secret), "the token's secret is in the store");
    let (server, _admin) = start(&db, |_| {});
    let web1 = client_as(&server, &t);
    web1.register_node(&node_reg("web1", GBPS)).unwrap();
}

#[test]
fn slow_headers_and_slow_bodies_are_cut_and_caps_hold() {
    use std::io::{Read as _, Write as _};
    let dir = tempfile::tempdir().unwrap();
    let (server, admin) = start(&dir.path().join("control.db"), |cfg| {
        cfg.limits.header_timeout = Duration::from_millis(500);
        cfg.limits.request_timeout = Duration::from_millis(800);
        cfg.limits.max_connections_per_peer = 8;
    });
    let addr = server.addr();
    let read_all = |s: &mut std::net::TcpStream| {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut out = Vec::new();
        let r = s.read_to_end(&mut out);
        (r.is_ok(), String::from_utf8_lossy(&out).to_string())
    };
    // Half a request head, never finished: closed without an answer.
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
    let (closed, text) = read_all(&mut slow);
    assert!(closed && !text.contains("200 OK"), "a slow head was served: {text}");
    // A body that never arrives whole: 408 with a JSON error.
    let mut trickle = std::net::TcpStream::connect(addr).unwrap();
    write!(
        trickle,
        "POST /v1/nodes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"name\":"
    )
    .unwrap();
    let (_, text) = read_all(&mut trickle);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    // Eight silent connections fill this peer's share; the ninth is closed at once; the
    // refusal is counted; once the silent ones time out the peer is served again.
    let silent: Vec<_> = (0..8).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
    // The server accepts the eight in its own time: until it has, a ninth may still be served
    // (as one of the eight). Once it has, every further one is refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut ninth = std::net::TcpStream::connect(addr).unwrap();
        let _ = ninth.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        let (_, text) = read_all(&mut ninth);
        if text.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "over the per-peer cap yet answered for 10 s: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(silent);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match admin.health() {
            Ok(h) if h.status == "ok" => break,
            r => assert!(Instant::now() < deadline, "never served again: {r:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, metrics) = raw(&server.url(), "GET", "/metrics", None, "");
    let m = metrics.as_str().unwrap().to_string();
    let refused = m
        .lines()
        .find_map(|l| l.strip_prefix("rackmem_control_connections_refused_total "))
        .unwrap();
    assert!(refused.trim().parse::<u64>().unwrap() >= 1, "{m}");
}

#[test]
fn https_with_tokens_and_client_certificates() {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    // A private CA, the server's certificate for 127.0.0.1 and a client certificate node:web1.
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params.distinguished_name.push(DnType::CommonName, "rackmem test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf = |names: Vec<String>, cn: &str| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        let cert = p.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(vec!["127.0.0.1".into()], "control");
    let (web1_cert, web1_key) = leaf(vec![], "node:web1");
    let ca_pem = write("ca.pem", &ca.pem());
    let tls = rackmem_control::serve::TlsFiles {
        cert: write("server.pem", &server_cert),
        key: write("server.key", &server_key),
        client_ca: Some(ca_pem.clone()),
    };
    let (server, _) = start(&dir.path().join("control.db"), |cfg| cfg.tls = Some(tls));
    let url = server.url();
    assert!(url.starts_with("https://"), "{url}");
    let config = |token: Option<&str>, identity: Option<(&str, &str)>| rackmem_control::client::ClientConfig {
        token: token.map(str::to_string),
        ca_file: Some(ca_pem.clone()),
        identity: identity.map(|(c, k)| (write("c.pem", c), write("c.key", k))),
        ..Default::default()
    };
    // A token over HTTPS.
    let admin = Client::with_config(std::slice::from_ref(&url), &config(Some(ADMIN), None)).unwrap();
    admin.register_brick(&brick_reg("b", 64 * MIB, GBPS)).unwrap();
    // The client certificate stands for node web1: its own node only.
    let web1 = Client::with_config(std::slice::from_ref(&url), &config(None, Some((&web1_cert, &web1_key)))).unwrap();
    let n = web1.register_node(&node_reg("web1", GBPS)).unwrap().id;
    web1.allocate(&AllocationRequest {
        node: n,
        size_bytes: MIB,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(server_err(web1.register_node(&node_reg("web2", GBPS))).0, 403);
    assert_eq!(server_err(web1.bricks()).0, 403);
    // Neither: 401. A client that does not trust the CA: no connection at all.
    let nobody = Client::with_config(std::slice::from_ref(&url), &config(None, None)).unwrap();
    assert_eq!(server_err(nobody.nodes()).0, 401);
    let untrusting = Client::with_config(
        &[url],
        &rackmem_control::client::ClientConfig {
            token: Some(ADMIN.into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(untrusting.nodes(), Err(ClientError::Unreachable { .. })));
    assert_eq!(admin.allocations().unwrap().len(), 1);
}

#[test]
fn a_lost_allocation_reply_is_retried_with_its_key_and_allocates_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("control.db");
    let (server, c) = start(&db, |_| {});
    c.register_brick(&brick_reg("b1", 64 * MIB, 10 * GBPS)).unwrap();
    let n = c.register_node(&node_reg("n1", 10 * GBPS)).unwrap().id;
    // The control plane commits the first allocation but its reply never arrives.
    let proxy = LossyProxy::start(&server.url(), 1);
    let through = Client::new(&[proxy.url.as_str()])
        .unwrap()
        .with_token(Some(ADMIN.to_string()));
    let req = AllocationRequest {
        node: n,
        size_bytes: 4 * MIB,
        ..Default::default()
    };
    let a = through.allocate(&req).unwrap();
    assert_eq!(proxy.lost(), 1, "the first reply was lost on the way");
    let all = c.allocations().unwrap();
    assert_eq!(all.len(), 1, "one allocation, not one per attempt: {all:?}");
    assert_eq!(all[0], a, "the retry got the committed allocation");
    let key = a.idempotency_key.clone().expect("the client sent a key");
    assert!(valid_token(&key), "{key}");

    // The same key and body again: the same allocation, 200 (the first was 201).
    let body = |size: u64, key: &str| format!(r#"{{"node":{n},"size_bytes":{size},"idempotency_key":"{key}"}}"#);
    let (status, v) = raw(
        &server.url(),
        "POST",
        "/v1/allocations",
        Some("application/json"),
        &body(4 * MIB, &key),
    );
    assert_eq!((status, v["id"].as_u64()), (200, Some(a.id)), "{v}");
    let (status, v) = raw(
        &server.url(),
        "POST",
        "/v1/allocations",
        Some("application/json"),
        &body(4 * MIB, "k-1"),
    );
    assert_eq!(status, 201, "a fresh key allocates: {v}");
    let fresh = v["id"].as_u64().unwrap();
    // The same key with another body is a client bug: 409, naming the key and the allocation.
    let (status, v) = raw(
        &server.url(),
        "POST",
        "/v1/allocations",
        Some("application/json"),
        &body(8 * MIB, &key),
    );
    assert_eq!(status, 409, "{v}");
    assert_json_error(&v, "conflict");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&key) && msg.contains(&a.id.to_string()), "{msg}");
    // Keys are bounded in length and charset.
    for bad in ["", "has space", "x/y", &"k".repeat(MAX_IDEMPOTENCY_KEY_LEN + 1)] {
        let (status, v) = raw(
            &server.url(),
            "POST",
            "/v1/allocations",
            Some("application/json"),
            &body(MIB, bad),
        );
        assert_eq!(status, 422, "key {bad:?}: {v}");
        assert_json_error(&v, "invalid");
    }
    assert_eq!(c.allocations().unwrap().len(), 2, "refused requests allocated nothing");

    // The key is stored with the allocation: a restarted control plane still knows it.
    server.stop().unwrap();
    let (server, c) = start(&db, |_| {});
    let (status, v) = raw(
        &server.url(),
        "POST",
        "/v1/allocations",
        Some("application/json"),
        &body(4 * MIB, &key),
    );
    assert_eq!((status, v["id"].as_u64()), (200, Some(a.id)), "{v}");
    // Once the allocation is released its key is free again.
    c.free(a.id).unwrap();
    let (status, v) = raw(
        &server.url(),
        "POST",
        "/v1/allocations",
        Some("application/json"),
        &body(4 * MIB, &key),
    );
    assert_eq!(status, 201, "{v}");
    let again = v["id"].as_u64().unwrap();
    assert!(again != a.id && again != fresh, "{v}");
    assert_eq!(c.allocations().unwrap().len(), 2);
}

fn a_report(pid: u32, faults: u64) -> rackmem_proto::ProcessReport {
    rackmem_proto::ProcessReport {
        pid,
        program: "/usr/bin/stream".into(),
        uptime_ms: 4_000,
        faults,
        miss_concurrency: 2.0,
        fault_latency: rackmem_proto::LatencyHistogram {
            cumulative: rackmem_proto::FAULT_LATENCY_BOUNDS_NS.iter().map(|_| faults).collect(),
            count: faults,
            sum_ns: faults * 20_000,
        },
        ..Default::default()
    }
}

#[test]
fn a_node_reports_only_its_own_processes_and_only_sane_figures() {
    let dir = tempfile::tempdir().unwrap();
    let (server, admin) = start(&dir.path().join("control.db"), |_| {});
    let web1 = client_as(&server, &token(&admin, "node", "web1"));
    let web2 = client_as(&server, &token(&admin, "node", "web2"));
    let n1 = web1.register_node(&node_reg("web1", GBPS)).unwrap().id;
    let n2 = web2.register_node(&node_reg("web2", GBPS)).unwrap().id;
    let report = |ps: Vec<rackmem_proto::ProcessReport>| ProcessReports { processes: ps };
    web1.report_processes(n1, &report(vec![a_report(10, 100), a_report(11, 0)]))
        .unwrap();
    // Another node's processes: refused, and nothing stored for it.
    assert_eq!(
        server_err(web2.report_processes(n1, &report(vec![a_report(99, 1)]))).0,
        403
    );
    // Figures that cannot be: a histogram of the wrong shape, a count below its buckets.
    let mut bad = a_report(12, 5);
    bad.fault_latency.cumulative.pop();
    assert_eq!(server_err(web1.report_processes(n1, &report(vec![bad]))).1, "invalid");
    let mut bad = a_report(12, 5);
    bad.fault_latency.count = 1;
    assert_eq!(server_err(web1.report_processes(n1, &report(vec![bad]))).1, "invalid");
    let many = (0..=MAX_REPORTED_PROCESSES as u32).map(|p| a_report(p, 0)).collect();
    assert_eq!(server_err(web1.report_processes(n1, &report(many))).1, "invalid");
    // Only admins and metrics tokens read them.
    assert_eq!(server_err(web1.processes()).0, 403);
    let scraper = client_as(&server, &token(&admin, "metrics", "top"));
    let seen = scraper.processes().unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let p = &seen[0];
    assert_eq!((p.node, p.node_name.as_str(), p.report.pid), (n1, "web1", 10));
    // 100 faults of 20 µs, two at a time: C-AMAT₂ 10 µs, stalled 1 ms of a 4 s run.
    assert!((p.bricks_camat_ns - 10_000.0).abs() < 1e-6, "{p:?}");
    assert!((p.stall_share - 0.000_25).abs() < 1e-9, "{p:?}");
    // A node's next report replaces its last; another node's stay.
    web2.report_processes(n2, &report(vec![a_report(20, 1)])).unwrap();
    web1.report_processes(n1, &report(vec![])).unwrap();
    let seen = admin.processes().unwrap();
    assert_eq!(
        seen.iter().map(|p| (p.node, p.report.pid)).collect::<Vec<_>>(),
        vec![(n2, 20)]
    );
}

/// Named segments over REST with node tokens: a node opens for itself only, another node's
/// open of the same name gets a grant of its own for the same range, a node lists what it
/// created or holds, the name and holders survive a restart, and the last close frees it.
#[test]
fn named_segments_are_shared_by_nodes_and_survive_a_restart() {
    use rackmem_control::api::{Holder, SegmentClose, SegmentOpen};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("control.db");
    let (server, admin) = start(&db, |_| {});
    admin.register_brick(&brick_reg("b", 256 * MIB, GBPS)).unwrap();
    let (t1, t2, t3) = (
        token(&admin, "node", "n1"),
        token(&admin, "node", "n2"),
        token(&admin, "node", "n3"),
    );
    let (c1, c2, c3) = (
        client_as(&server, &t1),
        client_as(&server, &t2),
        client_as(&server, &t3),
    );
    let n1 = c1.register_node(&node_reg("n1", GBPS)).unwrap().id;
    let n2 = c2.register_node(&node_reg("n2", GBPS)).unwrap().id;
    c3.register_node(&node_reg("n3", GBPS)).unwrap();
    let holder = |connection| Holder {
        agent: "agent-x".into(),
        connection,
        pid: 4000 + connection as u32,
        uid: 1000,
        start_ticks: 9,
    };
    let open = |node, size_bytes, connection| SegmentOpen {
        node,
        name: "job-7.counters".into(),
        size_bytes,
        holder: holder(connection),
    };
    // A node token opens for its own node only.
    assert_eq!(server_err(c1.open_segment(&open(n2, MIB, 1))).1, "forbidden");
    assert_eq!(server_err(c1.open_segment(&open(n1, 0, 1))).1, "not_found");
    let a = c1.open_segment(&open(n1, 2 * MIB, 1)).unwrap();
    let b = c2.open_segment(&open(n2, 0, 2)).unwrap();
    let (sa, sb) = (a.segment.clone().unwrap(), b.segment.clone().unwrap());
    assert_eq!(
        (sa.segment_id, sa.offset, sa.size_bytes),
        (sb.segment_id, sb.offset, sb.size_bytes)
    );
    let g = rackmem_proto::Grant::decode(&hex::decode(&sb.grant_hex).unwrap()).unwrap();
    g.verify(&key_of("b"), 1).unwrap();
    assert_eq!(g.node, n2, "the opener's node");
    assert_eq!(server_err(c2.open_segment(&open(n2, 4 * MIB, 2))).1, "conflict");
    let mut other = open(n2, 0, 3);
    other.holder.uid = 1001;
    assert_eq!(server_err(c2.open_segment(&other)).1, "forbidden");
    // Not an allocation anyone lists; counted to the creator.
    assert!(admin.allocations().unwrap().is_empty());
    assert_eq!(admin.node(n1).unwrap().allocated_bytes, 2 * MIB);
    assert_eq!(c2.named_segments(None).unwrap().len(), 1, "n2 holds it");
    assert!(
        c3.named_segments(None).unwrap().is_empty(),
        "n3 neither made nor holds it"
    );
    assert_eq!(server_err(c3.named_segments(Some(n1))).1, "forbidden");
    let before = admin.named_segments(None).unwrap();
    assert_eq!(before[0].holders.len(), 2);
    server.stop().unwrap();

    let (server, admin) = start(&db, |_| {});
    assert_eq!(
        admin.named_segments(None).unwrap(),
        before,
        "names and holders are stored"
    );
    let (c1, c2) = (client_as(&server, &t1), client_as(&server, &t2));
    let close = |node, connection| SegmentClose {
        node,
        holder: holder(connection),
    };
    assert_eq!(
        server_err(c2.close_segment("job-7.counters", &close(n2, 1))).1,
        "not_found"
    );
    let r = c2.close_segment("job-7.counters", &close(n2, 2)).unwrap();
    assert_eq!((r.holders, r.released), (1, false));
    let r = c1.close_segment("job-7.counters", &close(n1, 1)).unwrap();
    assert_eq!((r.holders, r.released), (0, true));
    assert!(admin.named_segments(None).unwrap().is_empty());
    assert_eq!(admin.node(n1).unwrap().allocated_bytes, 0);
}
