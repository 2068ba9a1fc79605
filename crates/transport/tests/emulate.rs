//! An emulated link (RACKMEM_LINK_EMULATE) against a real brick: the data is the same, and no
//! response reaches its waiter before the emulated network could have carried it (a lower
//! bound the emulator guarantees by construction, not a measurement of speed). This file holds
//! one test because the variable is process-wide.

use rackmem_brick::{Brick, BrickConfig, ListenAddr};
use rackmem_transport::{BrickAddr, Link, LinkError, EMULATE_ENV};
use std::time::{Duration, Instant};

#[test]
fn an_emulated_link_carries_the_same_pages_no_sooner_than_its_network() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = Brick::start(BrickConfig {
        listen: ListenAddr::Unix(dir.path().join("b.sock")),
        size_bytes: 64 << 20,
        key: b"k".to_vec(),
        secret: Some(b"s".to_vec()),
        managed: false,
        limits: Default::default(),
        tls: None,
    })
    .expect("brick starts");
    let addr: BrickAddr = h.local_addr().parse().expect("address");

    std::env::set_var(EMULATE_ENV, "latency=bogus,bandwidth=1Gbit");
    match Link::connect(&addr, Duration::from_secs(20)) {
        Err(LinkError::Emulation { reason, .. }) => assert!(reason.contains(EMULATE_ENV), "{reason}"),
        other => panic!("a bad specification must be refused, got {other:?}"),
    }

    // 2 ms each way and 80 Mbit/s (10 MB/s): a 64 KiB read's response alone is 6.9 ms of wire.
    std::env::set_var(EMULATE_ENV, "latency=2ms,bandwidth=80Mbit");
    let link = Link::connect(&addr, Duration::from_secs(20)).expect("emulated link");
    std::env::remove_var(EMULATE_ENV);
    assert!(link.is_emulated());
    link.alloc_segment(b"s", 8 << 20).expect("alloc");
    let data: Vec<u8> = (0..65536u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    link.write_pages(&[(0, data.len() as u32)], &data).expect("write");
    let t = Instant::now();
    let mut back = vec![0u8; data.len()];
    link.read_pages(&[(0, back.len() as u32)], &mut back).expect("read");
    let took = t.elapsed();
    assert!(back == data, "an emulated link changed the pages");
    assert!(
        took >= Duration::from_micros(4000 + 6500),
        "a 64 KiB read took only {took:?}"
    );

    let plain = Link::connect(&addr, Duration::from_secs(20)).expect("plain link");
    assert!(!plain.is_emulated());
}
