//! The scale: 1,000 bricks and 10,000 live allocations on SQLite. Prints the allocation
//! latency percentiles (tests never assert timings) and checks the state stays consistent.

#![allow(clippy::unwrap_used)]

use rackmem_control::api::*;
use rackmem_control::plane::ControlPlane;
use rackmem_control::store;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

#[test]
fn thousand_bricks_ten_thousand_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("scale.db").display());
    let mut p = ControlPlane::open(
        store::open(&url).unwrap(),
        None,
        Duration::from_secs(3600),
        Duration::from_secs(1),
    )
    .unwrap();
    let port = |name: &str| PortSpec {
        name: name.into(),
        bandwidth_bps: 100_000_000_000,
        switch: None,
    };
    for i in 0..1000 {
        p.register_brick(BrickRegistration {
            name: format!("b{i}"),
            address: format!("tcp://10.0.{}.{}:7070", i / 250, i % 250),
            capacity_bytes: 64 << 30,
            ports: vec![port("p0")],
            key_hex: hex::encode([i as u8; 32]),
            serve_bps: None,
        })
        .unwrap();
    }
    let nodes: Vec<u64> = (0..100)
        .map(|i| {
            p.register_node(NodeRegistration {
                name: format!("n{i}"),
                ports: vec![port("eth0")],
            })
            .unwrap()
            .id
        })
        .collect();
    let mut lat = Vec::with_capacity(10_000);
    let mut ids = Vec::new();
    for i in 0..10_000u64 {
        let req = AllocationRequest {
            node: nodes[(i % 100) as usize],
            size_bytes: (1 + i % 64) * MIB,
            stripe: Some(1 + (i % 4) as u32),
            bandwidth_bps: (i % 10 == 0).then_some(1_000_000),
            ..Default::default()
        };
        let t = Instant::now();
        let a = p.allocate(req).unwrap();
        lat.push(t.elapsed());
        ids.push(a.id);
    }
    // Churn at full size: free one, allocate one.
    let mut churn = Vec::new();
    for (k, id) in ids.iter().step_by(10).enumerate() {
        p.free(*id).unwrap();
        let t = Instant::now();
        p.allocate(AllocationRequest {
            node: nodes[k % 100],
            size_bytes: 3 * MIB,
            stripe: Some(2),
            ..Default::default()
        })
        .unwrap();
        churn.push(t.elapsed());
    }
    for (what, mut v) in [("fill", lat), ("churn", churn)] {
        v.sort();
        let pct = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
        println!(
            "{what}: {} allocations, p50 {:?}, p99 {:?}, max {:?}",
            v.len(),
            pct(0.5),
            pct(0.99),
            v[v.len() - 1]
        );
    }
    let allocs = p.allocations(None);
    assert_eq!(allocs.len(), 10_000);
    let used: u64 = allocs
        .iter()
        .flat_map(|a| a.segments.iter())
        .map(|s| s.size_bytes)
        .sum();
    let free: u64 = p.bricks().iter().map(|b| b.free_bytes).sum();
    assert_eq!(used + free, 1000 * (64 << 30));
}
