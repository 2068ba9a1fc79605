//! The etcd store and leader election against a real etcd (Debian's `etcd-server`) started by
//! each test on free loopback ports with a temporary data directory, killed at the end. Without
//! an `etcd` binary the tests say so and return.
#![cfg(feature = "etcd")]
// The helpers below are test code too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use rackmem_control::api::*;
use rackmem_control::client::{Client, ClientError};
use rackmem_control::etcd_server::{self, EtcdServer};
use rackmem_control::server::{spawn, ServerConfig, ServerHandle};
use rackmem_control::store::etcd::EtcdStore;
use rackmem_control::store::{
    self, AllocationRecord, Counters, Key, Leadership, NodeRecord, Op, Record, Role, SegmentRecord, Store, StoreError,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The admin token of every control plane these tests start.
const ADMIN: &str = "rmk_0_7e57ad3170ce5e1f00d1dea5c0ffee0123456789abcdef0123456789abcdef";
const MIB: u64 = 1 << 20;
/// Generous: elections take a lease TTL (3 s) plus a campaign period; machines are busy.
const DEADLINE: Duration = Duration::from_secs(60);

/// Starts etcd; fails the test with what it needs when there is none (it never skips).
fn etcd(dir: &std::path::Path) -> Option<EtcdServer> {
    assert!(
        etcd_server::binary().is_some(),
        "this test needs etcd on PATH (Debian: apt-get install etcd-server; scripts/setup.sh does)"
    );
    Some(EtcdServer::start(&dir.join("etcd")).unwrap())
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn node(id: u64) -> Record {
    Record::Node(NodeRecord {
        id,
        name: format!("n{id}"),
        ports: vec![],
        quota_bytes: None,
    })
}

fn allocation(id: u64, node: u64) -> Record {
    Record::Allocation(AllocationRecord {
        id,
        node,
        size_bytes: MIB,
        stripe: 1,
        bandwidth_bps: 0,
        links: None,
        segments: vec![SegmentRecord {
            brick_id: 1,
            segment_id: id,
            offset: id * MIB,
            size_bytes: MIB,
            bandwidth_bps: 0,
            links: vec!["brick:1:p0".into()],
            grant_hex: "00".repeat(73),
            session_key_hex: "11".repeat(32),
        }],
        created_unix_ms: 1,
        idempotency_key: None,
        request_sha256: None,
        holder: None,
        // Circuits round-trip like the rest of the record.
        circuit: id % 2 == 1,
        named: None,
    })
}

#[test]
fn store_round_trip_and_atomic_commit() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = etcd(dir.path()) else { return };
    let url = etcd.store_url();
    {
        let mut s = store::open(&url).unwrap();
        assert_eq!(s.describe(), url);
        assert_eq!(s.load().unwrap(), store::Snapshot::default());
        s.commit(&[
            Op::Put(node(1)),
            Op::Put(node(2)),
            Op::Put(allocation(7, 1)),
            Op::Put(Record::Counters(Counters {
                next_node: 3,
                next_allocation: 8,
                ..Counters::default()
            })),
        ])
        .unwrap();
        s.commit(&[Op::Delete(Key::Node(2)), Op::Delete(Key::Node(99))])
            .unwrap();
    }
    // A new connection sees exactly what was committed.
    let mut s = store::open(&url).unwrap();
    let snap = s.load().unwrap();
    assert_eq!(snap.nodes.len(), 1);
    assert_eq!(snap.nodes[0].id, 1);
    assert_eq!(snap.allocations.len(), 1);
    assert_eq!(Record::Allocation(snap.allocations[0].clone()), allocation(7, 1));
    assert_eq!(snap.counters.next_allocation, 8);

    // More records than a page of the load.
    let many: Vec<Op> = (100..220).map(|i| Op::Put(node(i))).collect();
    s.commit(&many).unwrap();
    let many: Vec<Op> = (220..1320).map(|i| Op::Put(node(i))).collect();
    for chunk in many.chunks(100) {
        s.commit(chunk).unwrap();
    }
    assert_eq!(s.load().unwrap().nodes.len(), 1 + 1220);

    // All or nothing: etcd refuses a transaction over its operation limit (128) whole.
    let too_many: Vec<Op> = (5000..5200)
        .map(|i| Op::Put(node(i)))
        .chain([Op::Delete(Key::Node(1))])
        .collect();
    let e = s.commit(&too_many).unwrap_err();
    assert!(matches!(e, StoreError::Backend { .. }), "{e}");
    assert!(e.to_string().contains(&etcd.url()), "the error names the endpoint: {e}");
    let snap = s.load().unwrap();
    assert_eq!(snap.nodes.len(), 1 + 1220, "nothing of the refused batch was applied");
    assert!(snap.nodes.iter().any(|n| n.id == 1));

    // A batch naming a key twice: the last change wins.
    s.commit(&[Op::Put(node(3)), Op::Delete(Key::Node(3))]).unwrap();
    assert!(!s.load().unwrap().nodes.iter().any(|n| n.id == 3));
}

#[test]
fn an_unreachable_etcd_is_a_typed_error_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("etcd:http://127.0.0.1:{port}");
    let mut s = store::open(&url).unwrap();
    let e = s.load().unwrap_err();
    assert!(matches!(e, StoreError::Backend { .. }), "{e}");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    assert!(matches!(store::open("etcd:localhost:2379"), Err(StoreError::BadUrl(_))));
}

#[test]
fn a_deposed_leader_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = etcd(dir.path()) else { return };
    let url = etcd.store_url();
    let mut a = store::open(&url).unwrap();
    let la = a.start_election("http://a.example:7080").unwrap().unwrap();
    let term_a = wait_for("a to lead", || {
        let s = la.status();
        (s.role == Role::Leader).then_some(s.term)
    });
    // Before the state is loaded, even the leader does not write.
    assert!(matches!(
        a.commit(&[Op::Put(node(1))]),
        Err(StoreError::NotLeader { .. })
    ));
    la.synced(term_a);
    a.commit(&[Op::Put(node(1))]).unwrap();

    let mut b = store::open(&url).unwrap();
    let lb = b.start_election("http://b.example:7080").unwrap().unwrap();
    wait_for("b to see a as the leader", || {
        (lb.leader().as_deref() == Some("http://a.example:7080")).then_some(())
    });
    assert_eq!(lb.status().role, Role::Follower);
    assert!(matches!(
        b.commit(&[Op::Put(node(2))]),
        Err(StoreError::NotLeader { leader: Some(l), .. }) if l == "http://a.example:7080"
    ));

    // a leaves (its lease is revoked): b takes over with a later term.
    drop(a);
    let term_b = wait_for("b to lead", || {
        let s = lb.status();
        (s.role == Role::Leader).then_some(s.term)
    });
    assert!(term_b > term_a);
    lb.synced(term_b);
    b.commit(&[Op::Put(node(2))]).unwrap();

    // A replica that still believes in term_a (paused through the hand-over): etcd refuses its
    // batch, and it steps down.
    let stale = Arc::new(Leadership::follower());
    stale.won(term_a, "http://a.example:7080");
    stale.synced(term_a);
    let mut zombie = EtcdStore::open(&url).unwrap();
    zombie.fence_with(stale.clone());
    let e = zombie
        .commit(&[Op::Put(node(3)), Op::Delete(Key::Node(2))])
        .unwrap_err();
    assert!(matches!(e, StoreError::NotLeader { .. }), "{e}");
    assert_eq!(stale.status().role, Role::Follower);
    let snap = b.load().unwrap();
    let ids: Vec<u64> = snap.nodes.iter().map(|n| n.id).collect();
    assert_eq!(ids, vec![1, 2], "the deposed leader's batch left no trace");
}

// ---------------------------------------------------------------------------------------------
// Replicated control planes, in process

fn start(url: &str) -> ServerHandle {
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap(), store::open(url).unwrap()).with_admin_token(ADMIN);
    cfg.brick_timeout = Duration::from_secs(3600);
    spawn(cfg).unwrap()
}

fn serving(s: &ServerHandle) -> bool {
    s.leadership().serving()
}

fn brick_reg(name: &str, capacity: u64) -> BrickRegistration {
    BrickRegistration {
        name: name.into(),
        address: format!("tcp://{name}.example:7070"),
        capacity_bytes: capacity,
        ports: vec![PortSpec {
            name: "p0".into(),
            bandwidth_bps: 10_000_000_000,
            switch: None,
        }],
        key_hex: hex::encode(format!("key-of-{name}-0123456789abcdef")),
        serve_bps: None,
    }
}

fn node_reg(name: &str) -> NodeRegistration {
    NodeRegistration {
        name: name.into(),
        ports: vec![PortSpec {
            name: "eth0".into(),
            bandwidth_bps: 10_000_000_000,
            switch: None,
        }],
    }
}

fn raw(url: &str, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let full = format!("{url}{path}");
    let r = match method {
        "POST" => agent
            .post(&full)
            .header("Authorization", format!("Bearer {ADMIN}"))
            .content_type("application/json")
            .send(body),
        _ => agent
            .get(&full)
            .header("Authorization", format!("Bearer {ADMIN}"))
            .call(),
    };
    let mut r = r.unwrap();
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

fn metric(url: &str, name: &str) -> Option<String> {
    let (_, v) = raw(url, "GET", "/metrics", "");
    let text = v.as_str().unwrap_or_default().to_string();
    text.lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .map(|l| l.split_whitespace().nth(1).unwrap_or_default().to_string())
}

#[test]
fn a_follower_refuses_the_api_and_takes_over_with_the_whole_state() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = etcd(dir.path()) else { return };
    let url = etcd.store_url();
    let a = start(&url);
    wait_for("a to serve", || serving(&a).then_some(()));
    let b = start(&url);
    wait_for("b to know the leader", || {
        (b.leadership().leader().as_deref() == Some(a.url().as_str())).then_some(())
    });

    // b refuses writes and reads with 503 not_leader naming a; meta routes answer.
    let (status, body) = raw(&b.url(), "POST", "/v1/nodes", r#"{"name":"n1","ports":[]}"#);
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "not_leader");
    assert_eq!(body["error"]["leader"], a.url());
    assert!(body["error"]["message"].as_str().unwrap().contains(&a.url()), "{body}");
    let (status, body) = raw(&b.url(), "GET", "/v1/bricks", "");
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("not_leader")));
    let (status, body) = raw(&b.url(), "GET", "/v1/leader", "");
    assert_eq!(status, 200);
    assert_eq!(body["role"], "follower");
    assert_eq!(body["leader"], a.url());
    let health = Client::new(&[b.url()])
        .unwrap()
        .with_token(Some(ADMIN.to_string()))
        .health()
        .unwrap();
    assert_eq!(
        (health.role.as_str(), health.leader.as_deref()),
        ("follower", Some(a.url().as_str()))
    );
    assert_eq!(metric(&b.url(), "rackmem_control_leader").as_deref(), Some("0"));
    assert_eq!(metric(&a.url(), "rackmem_control_leader").as_deref(), Some("1"));

    // A client given the follower first moves on to the leader.
    let client = Client::new(&[b.url(), a.url()])
        .unwrap()
        .with_token(Some(ADMIN.to_string()));
    let brick = client.register_brick(&brick_reg("mem1", 256 * MIB)).unwrap().id;
    let n = client.register_node(&node_reg("web1")).unwrap().id;
    let before: Vec<Allocation> = (0..4)
        .map(|_| {
            client
                .allocate(&AllocationRequest {
                    node: n,
                    size_bytes: 16 * MIB,
                    ..Default::default()
                })
                .unwrap()
        })
        .collect();
    // Only followers in the list: the client reports their answer.
    let only_b = Client::new(&[b.url()]).unwrap().with_token(Some(ADMIN.to_string()));
    match only_b.bricks() {
        Err(ClientError::Server { status: 503, code, .. }) => assert_eq!(code, "not_leader"),
        other => panic!("expected not_leader, got {other:?}"),
    }

    // a stops (its lease is revoked on the way out): b reloads everything and serves.
    a.stop().unwrap();
    wait_for("b to serve", || serving(&b).then_some(()));
    assert_eq!(b.leadership().leader().as_deref(), Some(b.advertise()));
    let after = client.allocations().unwrap();
    assert_eq!(after.len(), before.len());
    for (x, y) in before.iter().zip(&after) {
        assert_eq!((x.id, x.node, x.size_bytes), (y.id, y.node, y.size_bytes));
        for (s, t) in x.segments.iter().zip(&y.segments) {
            assert_eq!(
                (
                    s.brick_id,
                    s.segment_id,
                    s.offset,
                    s.size_bytes,
                    &s.grant_hex,
                    &s.session_key_hex
                ),
                (
                    t.brick_id,
                    t.segment_id,
                    t.offset,
                    t.size_bytes,
                    &t.grant_hex,
                    &t.session_key_hex
                )
            );
        }
    }
    let next = client
        .allocate(&AllocationRequest {
            node: n,
            size_bytes: 16 * MIB,
            ..Default::default()
        })
        .unwrap();
    assert!(next.id > before.iter().map(|a| a.id).max().unwrap());
    let s = &next.segments[0];
    for old in before.iter().flat_map(|a| &a.segments) {
        assert!(s.segment_id > old.segment_id);
        assert!(s.offset + s.size_bytes <= old.offset || old.offset + old.size_bytes <= s.offset);
    }
    assert_eq!(client.brick(brick).unwrap().free_bytes, 256 * MIB - 5 * 16 * MIB);
    assert_eq!(metric(&b.url(), "rackmem_control_leader").as_deref(), Some("1"));
    assert_eq!(metric(&b.url(), "rackmem_control_allocations").as_deref(), Some("5"));
}

#[test]
fn a_failed_commit_answers_503_and_leaves_nothing_reserved() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut etcd) = etcd(dir.path()) else { return };
    let a = start(&etcd.store_url());
    wait_for("a to serve", || serving(&a).then_some(()));
    let client = Client::new(&[a.url()]).unwrap().with_token(Some(ADMIN.to_string()));
    let brick = client.register_brick(&brick_reg("mem1", 64 * MIB)).unwrap().id;
    let n = client.register_node(&node_reg("web1")).unwrap().id;
    let req = AllocationRequest {
        node: n,
        size_bytes: 16 * MIB,
        ..Default::default()
    };
    let first = client.allocate(&req).unwrap();

    etcd.kill();
    let body = format!(r#"{{"node":{n},"size_bytes":{}}}"#, 16 * MIB);
    let (status, err) = raw(&a.url(), "POST", "/v1/allocations", &body);
    assert_eq!(status, 503, "{err}");
    assert_eq!(err["error"]["code"], "store", "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains(&etcd.url()), "{err}");

    etcd.restart().unwrap();
    // The leader reloads (the failed batch's outcome was unknown to it) and serves again.
    let second = wait_for("a to allocate again", || client.allocate(&req).ok());
    let all = client.allocations().unwrap();
    assert_eq!(
        all.iter().map(|a| a.id).collect::<Vec<_>>(),
        vec![first.id, second.id],
        "the failed request left no allocation"
    );
    assert_eq!(client.brick(brick).unwrap().free_bytes, 64 * MIB - 2 * 16 * MIB);
    let (s, t) = (&first.segments[0], &second.segments[0]);
    assert!(s.offset + s.size_bytes <= t.offset || t.offset + t.size_bytes <= s.offset);
}

#[test]
fn a_token_made_on_the_leader_works_on_the_next_leader_and_a_follower_sends_it_on() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = etcd(dir.path()) else { return };
    let url = etcd.store_url();
    let a = start(&url);
    wait_for("a to serve", || serving(&a).then_some(()));
    let b = start(&url);
    let admin = Client::new(&[a.url()]).unwrap().with_token(Some(ADMIN.to_string()));
    let t = admin
        .create_token(&TokenRequest {
            role: rackmem_control::auth::Role::Node,
            name: "web1".into(),
        })
        .unwrap()
        .token;
    // b loaded its state before the token existed: it must send the client on, not refuse it.
    let web1 = Client::new(&[b.url(), a.url()]).unwrap().with_token(Some(t.clone()));
    web1.register_node(&node_reg("web1")).unwrap();
    // The leader goes; b takes over with the token in its state.
    drop(a);
    let only_b = Client::new(&[b.url()]).unwrap().with_token(Some(t));
    wait_for("b to serve", || serving(&b).then_some(()));
    let deadline = Instant::now() + DEADLINE;
    loop {
        match only_b.register_node(&node_reg("web1")) {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "b refused the token made on a: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
