//! Starting and stopping a brick: stale and foreign socket files, stop from another thread.

use rackmem_brick::{Brick, BrickConfig, BrickError, ListenAddr};
use rackmem_transport::{BrickAddr, Link, LinkError};
use std::time::Duration;

fn cfg(listen: ListenAddr) -> BrickConfig {
    BrickConfig {
        listen,
        size_bytes: 8 << 20,
        key: b"k".to_vec(),
        secret: Some(b"s".to_vec()),
        managed: false,
        limits: Default::default(),
        tls: None,
    }
}

#[test]
fn a_stale_socket_file_is_replaced_but_a_regular_file_is_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("b.sock");
    // A socket file nobody listens on, as a killed brick leaves behind.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
    assert!(path.exists());
    let h = Brick::start(cfg(ListenAddr::Unix(path.clone()))).expect("stale socket replaced");
    h.shutdown();
    assert!(!path.exists(), "shutdown removes the socket file");

    let file = dir.path().join("precious.txt");
    std::fs::write(&file, "data").expect("write");
    let e = Brick::start(cfg(ListenAddr::Unix(file.clone())))
        .err()
        .expect("not a socket");
    assert!(matches!(e, BrickError::NotASocket(_)), "{e}");
    assert!(e.to_string().contains("precious.txt"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).expect("still there"), "data");
}

#[test]
fn tcp_address_in_use_names_the_address() {
    let h = Brick::start(cfg(ListenAddr::Tcp("127.0.0.1:0".into()))).expect("start");
    let taken = h.local_addr();
    let hostport = taken.trim_start_matches("tcp://").to_string();
    let e = Brick::start(cfg(ListenAddr::Tcp(hostport))).err().expect("in use");
    assert!(matches!(e, BrickError::InUse(_)), "{e}");
    assert!(e.to_string().contains(&taken), "{e}");
}

#[test]
fn a_stopper_ends_wait_and_clients_see_the_brick_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = Brick::start(cfg(ListenAddr::Unix(dir.path().join("b.sock")))).expect("start");
    let addr: BrickAddr = h.local_addr().parse().expect("address");
    let link = Link::connect(&addr, Duration::from_secs(10)).expect("connect");
    link.alloc_segment(b"s", 1 << 20).expect("alloc");
    let stopper = h.stopper();
    let waiter = std::thread::spawn(move || h.wait());
    link.ping().expect("serving while waited on");
    stopper.stop();
    waiter.join().expect("wait returns after stop");
    assert!(matches!(link.ping(), Err(LinkError::BrickLost { .. })));
    assert!(Link::connect(&addr, Duration::from_secs(1)).is_err());
}
