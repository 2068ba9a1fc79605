//! Two `rackmem control` processes on one real etcd (started by the test on free ports, killed at
//! the end): allocate through the leader, SIGKILL it, and check the other takes over with every
//! earlier allocation intact, keeps allocating without overlapping old extents, and that
//! `rackmem ctl` given both URLs follows it. Without an `etcd` binary the test says so and
//! returns.
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use rackmem_control::api::*;
use rackmem_control::client::Client;
use rackmem_control::etcd_server::{self, EtcdServer};
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// Generous: a fail-over takes a lease TTL (3 s) and a campaign period on a busy machine.
const DEADLINE: Duration = Duration::from_secs(60);

/// Starts `rackmem control --store etcd:...`; returns the guard and its URL.
fn start_replica(store: &str) -> (Guard, String) {
    start_control_with(&["--listen", "127.0.0.1:0", "--brick-timeout", "1h", "--store", store])
}

fn leader_info(url: &str) -> Option<LeaderInfo> {
    Client::with_timeout(&[url], Duration::from_secs(2))
        .ok()?
        .with_token(Some(admin_token()))
        .leader()
        .ok()
}

/// Polls until one of `urls` serves as leader; returns its index.
fn wait_for_leader(urls: &[&str]) -> usize {
    let deadline = Instant::now() + DEADLINE;
    loop {
        for (i, u) in urls.iter().enumerate() {
            if leader_info(u).is_some_and(|l| l.serving) {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no replica of {urls:?} became leader");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn same(a: &Allocation, b: &Allocation) {
    assert_eq!(
        (a.id, a.node, a.size_bytes, a.stripe),
        (b.id, b.node, b.size_bytes, b.stripe)
    );
    assert_eq!(a.segments.len(), b.segments.len());
    for (s, t) in a.segments.iter().zip(&b.segments) {
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
            ),
            "allocation {} changed across the fail-over",
            a.id
        );
    }
}

fn disjoint(a: &Segment, b: &Segment) -> bool {
    a.brick_id != b.brick_id || a.offset + a.size_bytes <= b.offset || b.offset + b.size_bytes <= a.offset
}

#[test]
fn a_replica_takes_over_when_the_leader_is_killed() {
    assert!(
        etcd_server::binary().is_some(),
        "this test needs etcd on PATH (Debian: apt-get install etcd-server; scripts/setup.sh does)"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let etcd = EtcdServer::start(&dir.path().join("etcd")).unwrap();
    let (g1, u1) = start_replica(&etcd.store_url());
    let (g2, u2) = start_replica(&etcd.store_url());
    let mut guards = [Some(g1), Some(g2)];
    let urls = [u1.as_str(), u2.as_str()];
    let leader = wait_for_leader(&urls);
    let follower = 1 - leader;
    // The follower learns who leads at its next look at the leader key (every 250 ms).
    let deadline = Instant::now() + DEADLINE;
    while leader_info(urls[follower]).and_then(|l| l.leader).as_deref() != Some(urls[leader]) {
        assert!(Instant::now() < deadline, "the follower never learned the leader");
        std::thread::sleep(Duration::from_millis(50));
    }

    // The follower refuses a write and names the leader.
    let direct = Client::new(&[urls[follower]]).unwrap().with_token(Some(admin_token()));
    match direct.register_node(&NodeRegistration {
        name: "x".into(),
        ports: vec![],
    }) {
        Err(rackmem_control::client::ClientError::Server {
            status, code, message, ..
        }) => {
            assert_eq!((status, code.as_str()), (503, "not_leader"));
            assert!(message.contains(urls[leader]), "{message}");
        }
        other => panic!("the follower accepted a write: {other:?}"),
    }

    // Allocate through both URLs (the client finds the leader).
    let client = Client::new(&urls).unwrap().with_token(Some(admin_token()));
    let port = |name: &str| PortSpec {
        name: name.into(),
        bandwidth_bps: 10_000_000_000,
        switch: None,
    };
    for i in 0..4 {
        client
            .register_brick(&BrickRegistration {
                name: format!("mem{i}"),
                address: format!("tcp://127.0.0.1:{}", 7000 + i),
                capacity_bytes: 256 * MIB,
                ports: vec![port("p0")],
                key_hex: hex::encode(format!("key-of-mem{i}-0123456789abcdef")),
                serve_bps: None,
            })
            .unwrap();
    }
    let node = client
        .register_node(&NodeRegistration {
            name: "web1".into(),
            ports: vec![port("eth0")],
        })
        .unwrap()
        .id;
    let before: Vec<Allocation> = (0..12u64)
        .map(|i| {
            client
                .allocate(&AllocationRequest {
                    node,
                    size_bytes: (1 + i % 3) * 8 * MIB,
                    stripe: Some(1 + (i % 2) as u32),
                    ..Default::default()
                })
                .unwrap()
        })
        .collect();

    // SIGKILL the leader: no goodbye, its lease must expire.
    guards[leader].take().unwrap().kill_group();
    let new_leader = wait_for_leader(&[urls[follower]]);
    assert_eq!(new_leader, 0);
    let info = leader_info(urls[follower]).unwrap();
    assert_eq!(
        (info.role.as_str(), info.leader.as_deref()),
        ("leader", Some(urls[follower]))
    );

    // Every earlier allocation is intact on the new leader, reached through the same client.
    for a in &before {
        same(a, &client.allocation(a.id).unwrap());
    }
    let after: Vec<Allocation> = (0..6)
        .map(|_| {
            client
                .allocate(&AllocationRequest {
                    node,
                    size_bytes: 16 * MIB,
                    ..Default::default()
                })
                .unwrap()
        })
        .collect();
    let old_max = before.iter().map(|a| a.id).max().unwrap();
    let old_segments: Vec<&Segment> = before.iter().flat_map(|a| &a.segments).collect();
    for a in &after {
        assert!(a.id > old_max, "allocation ids are never reused");
        for s in &a.segments {
            for o in &old_segments {
                assert!(s.segment_id > o.segment_id, "segment ids are never reused");
                assert!(disjoint(s, o), "new segment {s:?} overlaps old {o:?}");
            }
        }
    }
    assert_eq!(client.allocations().unwrap().len(), before.len() + after.len());

    // `rackmem ctl` given both URLs, the dead one first, follows the new leader.
    let mut c = Command::new(rackmem());
    c.args([
        "ctl",
        "--control",
        &format!("{},{}", urls[leader], urls[follower]),
        "--json",
        "allocations",
    ]);
    let o = run_with_deadline(c, Duration::from_secs(60));
    assert!(o.status.success(), "{}", show(&o));
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(before.len() + after.len()));
    drop(guards);
}
