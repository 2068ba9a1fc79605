//! A real brick on a Unix socket and on TCP loopback, driven by real links and by raw sockets
//! sending garbage: data comes back intact, bounds and grants are enforced, and a bad client
//! only ever loses its own connection.

use rackmem_brick::{Brick, BrickConfig, BrickHandle, ListenAddr};
use rackmem_proto::{rights, session_key, Grant, Header, Opcode, Request, Status, HEADER_LEN, MAGIC};
use rackmem_transport::{BrickAddr, Link, LinkError};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

const KEY: &[u8] = b"brick-key";
const SECRET: &[u8] = b"shared-secret";
const T: Duration = Duration::from_secs(10);

fn unix_brick(dir: &tempfile::TempDir) -> (BrickHandle, BrickAddr) {
    let path = dir.path().join("brick.sock");
    let h = Brick::start(BrickConfig {
        listen: ListenAddr::Unix(path),
        size_bytes: 256 << 20,
        key: KEY.to_vec(),
        secret: Some(SECRET.to_vec()),
        managed: false,
        limits: Default::default(),
        tls: None,
    })
    .expect("brick starts");
    let a: BrickAddr = h.local_addr().parse().expect("address");
    (h, a)
}

fn tcp_brick() -> (BrickHandle, BrickAddr) {
    let h = Brick::start(BrickConfig {
        listen: ListenAddr::Tcp("127.0.0.1:0".into()),
        size_bytes: 256 << 20,
        key: KEY.to_vec(),
        secret: Some(SECRET.to_vec()),
        managed: false,
        limits: Default::default(),
        tls: None,
    })
    .expect("brick starts");
    let a: BrickAddr = h.local_addr().parse().expect("address");
    (h, a)
}

fn page(seed: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed * 7919) % 251) as u8)
        .collect()
}

fn write_read_round_trip(addr: &BrickAddr) {
    let l = Link::connect(addr, T).expect("connect");
    l.alloc_segment(SECRET, 8 << 20).expect("alloc");
    let ext: Vec<(u64, u32)> = (0..64).map(|i| (i * 3 * 4096, 4096)).collect();
    let data: Vec<u8> = (0..64).flat_map(page).collect();
    l.write_pages(&ext, &data).expect("write");
    let mut back = vec![0u8; data.len()];
    l.read_pages(&ext, &mut back).expect("read");
    assert_eq!(back, data);
    // Never-written pages read as zeros.
    let mut z = vec![1u8; 8192];
    l.read_pages(&[(4096, 8192)], &mut z).expect("read zeros");
    assert!(z.iter().all(|&b| b == 0));
}

#[test]
fn round_trip_over_unix_and_tcp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_u, ua) = unix_brick(&dir);
    write_read_round_trip(&ua);
    let (_t, ta) = tcp_brick();
    write_read_round_trip(&ta);
}

#[test]
fn pipelined_requests_from_several_threads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, a) = unix_brick(&dir);
    let l = Arc::new(Link::connect(&a, T).expect("connect"));
    l.alloc_segment(SECRET, 16 << 20).expect("alloc");
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let l = l.clone();
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    let off = (t * 1000 + i) * 4096;
                    let p = page(t * 1000 + i);
                    l.write_pages(&[(off, 4096)], &p).expect("write");
                    let mut b = vec![0u8; 4096];
                    l.read_pages(&[(off, 4096)], &mut b).expect("read");
                    assert_eq!(b, p, "thread {t} page {i}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
}

#[test]
fn clone_is_copy_on_write_and_isolated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, a) = unix_brick(&dir);
    let parent = Link::connect(&a, T).expect("connect");
    parent.alloc_segment(SECRET, 4 << 20).expect("alloc");
    parent.write_pages(&[(0, 4096)], &page(1)).expect("write");
    let g = parent.clone_segment().expect("clone");
    let child = Link::connect(&a, T).expect("connect");
    child.attach(&g.grant, &g.session_key).expect("attach clone");
    let mut b = vec![0u8; 4096];
    child.read_pages(&[(0, 4096)], &mut b).expect("read");
    assert_eq!(b, page(1), "the clone starts with the parent's data");
    child.write_pages(&[(0, 4096)], &page(2)).expect("child writes");
    parent.write_pages(&[(4096, 4096)], &page(3)).expect("parent writes");
    parent.read_pages(&[(0, 4096)], &mut b).expect("read");
    assert_eq!(b, page(1), "the parent must not see the child's write");
    child.read_pages(&[(4096, 4096)], &mut b).expect("read");
    assert!(
        b.iter().all(|&x| x == 0),
        "the child must not see the parent's later write"
    );
    child.discard(0, 4096).expect("discard");
    child.read_pages(&[(0, 4096)], &mut b).expect("read");
    assert!(b.iter().all(|&x| x == 0), "discarded pages read as zeros");
}

fn assert_refused(r: Result<(), LinkError>, want: Status) {
    match r {
        Err(LinkError::Refused { status, .. }) => assert_eq!(status, want),
        other => panic!("expected {want:?}, got {other:?}"),
    }
}

#[test]
fn out_of_range_and_grant_violations_close_only_that_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, a) = unix_brick(&dir);
    let good = Link::connect(&a, T).expect("connect");
    let sg = good.alloc_segment(SECRET, 2 << 20).expect("alloc");
    let g = &sg.grant;
    good.write_pages(&[(0, 4096)], &page(9)).expect("write");

    // Past the end of the segment.
    let bad = Link::connect(&a, T).expect("connect");
    bad.attach(g, &sg.session_key).expect("attach");
    let mut b = vec![0u8; 4096];
    match bad.read_pages(&[(2 << 20, 4096)], &mut b) {
        Err(LinkError::Refused {
            status: Status::OutOfRange,
            ..
        }) => {}
        other => panic!("expected OutOfRange, got {other:?}"),
    }
    assert!(
        matches!(bad.ping(), Err(LinkError::BrickLost { .. })),
        "the offending connection is closed"
    );

    // A forged grant: someone else's segment, or a bigger size, or another brick's key (more
    // of these in tests/grants.rs).
    let mut forged = g.clone();
    forged.size_bytes *= 2;
    assert_refused(
        Link::connect(&a, T).expect("connect").attach(&forged, &sg.session_key),
        Status::GrantInvalid,
    );
    let foreign = Grant::sign(
        b"another brick",
        g.segment_id,
        g.brick_offset,
        g.size_bytes,
        0,
        rights::ALL,
        0,
    );
    assert_refused(
        Link::connect(&a, T)
            .expect("connect")
            .attach(&foreign, &session_key(b"another brick", &foreign)),
        Status::GrantInvalid,
    );
    let expired = Grant::sign(KEY, g.segment_id, g.brick_offset, g.size_bytes, 0, rights::ALL, 1);
    assert_refused(
        Link::connect(&a, T)
            .expect("connect")
            .attach(&expired, &session_key(KEY, &expired)),
        Status::GrantExpired,
    );
    let read_only = Grant::sign(KEY, g.segment_id, g.brick_offset, g.size_bytes, 0, rights::READ, 0);
    let ro = Link::connect(&a, T).expect("connect");
    ro.attach(&read_only, &session_key(KEY, &read_only))
        .expect("attach read-only");
    assert_refused(ro.write_pages(&[(0, 4096)], &page(1)), Status::Forbidden);

    // Wrong secret, and data before attach.
    let l = Link::connect(&a, T).expect("connect");
    match l.alloc_segment(b"guess", 1 << 20) {
        Err(LinkError::Refused {
            status: Status::Denied, ..
        }) => {}
        other => panic!("expected Denied, got {other:?}"),
    }
    assert_refused(
        Link::connect(&a, T).expect("connect").read_pages(&[(0, 4096)], &mut b),
        Status::NotAttached,
    );

    // The well-behaved client is unaffected, and its data is intact.
    good.read_pages(&[(0, 4096)], &mut b).expect("good client still served");
    assert_eq!(b, page(9));
}

fn raw_frame(opcode: u8, payload_len: u32) -> Vec<u8> {
    let mut h = Header {
        opcode: Opcode::Ping,
        flags: 0,
        tag: 1,
        status: 0,
        offset: 0,
        length: 0,
        payload_len: 0,
    }
    .encode()
    .to_vec();
    h[5] = opcode;
    h[28..32].copy_from_slice(&payload_len.to_le_bytes());
    h
}

/// Sends bytes on a raw socket and expects the brick to close it; returns the status of the
/// last response before it did, if any.
fn expect_closed(path: &std::path::Path, bytes: &[u8]) -> Option<u32> {
    let mut s = UnixStream::connect(path).expect("raw connect");
    s.set_read_timeout(Some(T)).expect("timeout");
    s.write_all(bytes).expect("send");
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut all = Vec::new();
    s.read_to_end(&mut all)
        .expect("the brick closes the connection instead of hanging");
    let mut last = None;
    let mut at = 0;
    while all.len() >= at + HEADER_LEN {
        let f = &all[at..];
        last = Some(u32::from_le_bytes([f[12], f[13], f[14], f[15]]));
        at += HEADER_LEN + u32::from_le_bytes([f[28], f[29], f[30], f[31]]) as usize;
    }
    last
}

/// `bytes` after a HELLO and an ALLOC with the right secret: sent on an authenticated
/// connection, attached to a fresh 1 MiB segment.
fn authenticated(bytes: &[u8]) -> Vec<u8> {
    let mut v = Request::Hello.encode(1);
    v.extend(
        Request::Alloc {
            size_bytes: 1 << 20,
            secret: SECRET.to_vec(),
        }
        .encode(2),
    );
    v.extend_from_slice(bytes);
    v
}

#[test]
fn malformed_frames_are_refused_and_the_brick_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, a) = unix_brick(&dir);
    let path = dir.path().join("brick.sock");
    let good = Link::connect(&a, T).expect("connect");
    good.alloc_segment(SECRET, 1 << 20).expect("alloc");

    let mut bad_magic = raw_frame(10, 0);
    bad_magic[0..4].copy_from_slice(&(MAGIC ^ 1).to_le_bytes());
    assert_eq!(expect_closed(&path, &bad_magic), Some(Status::BadRequest as u32));
    assert_eq!(
        expect_closed(&path, &raw_frame(10, u32::MAX)),
        Some(Status::BadRequest as u32),
        "huge payload_len"
    );
    assert_eq!(
        expect_closed(&path, &raw_frame(200, 0)),
        Some(Status::BadRequest as u32),
        "unknown opcode"
    );
    let mut trunc_read = raw_frame(Opcode::Read as u8, 16);
    trunc_read.extend_from_slice(&[1, 0, 0, 0, 0, 0]);
    assert_eq!(
        expect_closed(&path, &authenticated(&trunc_read)),
        Some(Status::Ok as u32),
        "truncated frame: connection closed without an answer to it"
    );
    assert_eq!(
        expect_closed(&path, &trunc_read),
        Some(Status::NotAttached as u32),
        "READ before authentication: refused on its header"
    );
    let mut misaligned = raw_frame(Opcode::Read as u8, 16);
    misaligned.extend_from_slice(&1u32.to_le_bytes());
    misaligned.extend_from_slice(&100u64.to_le_bytes());
    misaligned.extend_from_slice(&4096u32.to_le_bytes());
    assert_eq!(
        expect_closed(&path, &authenticated(&misaligned)),
        Some(Status::BadRequest as u32),
        "misaligned extent"
    );

    good.write_pages(&[(0, 4096)], &page(4)).expect("still served");
    let mut b = vec![0u8; 4096];
    good.read_pages(&[(0, 4096)], &mut b).expect("still served");
    assert_eq!(b, page(4));
    assert!(good.stats().expect("stats").errors >= 5);
}

#[test]
fn address_in_use_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, a) = unix_brick(&dir);
    let err = Brick::start(BrickConfig {
        listen: ListenAddr::Unix(dir.path().join("brick.sock")),
        size_bytes: 64 << 20,
        key: KEY.to_vec(),
        secret: None,
        managed: false,
        limits: Default::default(),
        tls: None,
    })
    .err()
    .expect("second brick on the same socket must fail");
    assert!(err.to_string().contains("already in use"), "{err}");
    assert!(err.to_string().contains(&a.to_string()), "{err}");
    let (_t, ta) = tcp_brick();
    let BrickAddr::Tcp(hp) = ta else { panic!("tcp") };
    let err = Brick::start(BrickConfig {
        listen: ListenAddr::Tcp(hp),
        size_bytes: 64 << 20,
        key: KEY.to_vec(),
        secret: None,
        managed: false,
        limits: Default::default(),
        tls: None,
    })
    .err()
    .expect("port in use");
    assert!(err.to_string().contains("already in use"), "{err}");
}

#[test]
fn shutdown_mid_run_fails_pending_and_later_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (h, a) = unix_brick(&dir);
    let l = Link::connect(&a, T).expect("connect");
    l.alloc_segment(SECRET, 1 << 20).expect("alloc");
    h.shutdown();
    let mut b = vec![0u8; 4096];
    match l.read_pages(&[(0, 4096)], &mut b) {
        Err(LinkError::BrickLost { addr, .. }) => assert_eq!(addr, a.to_string()),
        other => panic!("expected BrickLost, got {other:?}"),
    }
    assert!(matches!(l.ping(), Err(LinkError::BrickLost { .. })));
    assert!(matches!(Link::connect(&a, T), Err(LinkError::Unreachable { .. })));
}

#[test]
fn segments_are_freed_when_their_last_link_closes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (h, a) = unix_brick(&dir);
    let before = h.stats().free_bytes;
    {
        let l = Link::connect(&a, T).expect("connect");
        l.alloc_segment(SECRET, 64 << 20).expect("alloc");
        l.write_pages(&[(0, 4096)], &page(1)).expect("write");
        assert!(h.stats().free_bytes < before);
    }
    let start = std::time::Instant::now();
    while h.stats().free_bytes != before {
        assert!(start.elapsed() < T, "segment not freed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(h.stats().resident_bytes, 0, "freed memory is released");
}
