//! One-sided operations (issue 24): OPEN of named segments, PUT and GET of bytes at any offset,
//! FETCH_ADD and COMPARE_SWAP executed by the brick, over TCP and Unix sockets and on segments
//! moved into shared memory. Bad offsets are refused with a typed status and the link goes on.

use rackmem_brick::{Brick, BrickConfig, BrickHandle, ListenAddr};
use rackmem_proto::Status;
use rackmem_transport::{BrickAddr, Link, LinkError};
use std::time::Duration;

const KEY: &[u8] = b"brick-key";
const SECRET: &[u8] = b"shared-secret";
const T: Duration = Duration::from_secs(10);

fn brick(listen: ListenAddr) -> (BrickHandle, BrickAddr) {
    let h = Brick::start(BrickConfig {
        listen,
        size_bytes: 64 << 20,
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

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    (0..n as u64)
        .map(|i| (i.wrapping_mul(131).wrapping_add(seed * 7907) % 251) as u8)
        .collect()
}

fn refused(r: Result<impl std::fmt::Debug, LinkError>) -> Status {
    match r {
        Err(LinkError::Refused { status, .. }) => status,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn put_get_and_bounds(a: &BrickAddr) {
    let l = Link::connect(a, T).expect("connect");
    let g = l.open_segment(SECRET, b"arr", 3 << 20).expect("open creates");
    assert_eq!(g.grant.size_bytes, 3 << 20);
    let data = bytes(100_003, 1);
    l.submit_put(4093, &data)
        .expect("put")
        .wait(&mut [])
        .expect("put answer");
    let mut back = vec![0u8; data.len() + 10];
    l.submit_get(4090, back.len())
        .expect("get")
        .wait(&mut back)
        .expect("get answer");
    assert_eq!(&back[..3], &[0, 0, 0], "bytes before the put are zeros");
    assert_eq!(&back[3..3 + data.len()], &data[..]);
    assert_eq!(&back[3 + data.len()..], &[0u8; 7]);

    // Another connection opening the name sees the same bytes.
    let other = Link::connect(a, T).expect("connect");
    let g2 = other.open_segment(SECRET, b"arr", 0).expect("open existing");
    assert_eq!(g2.grant.segment_id, g.grant.segment_id);
    let mut b = vec![0u8; 5];
    other.submit_get(4093, 5).expect("get").wait(&mut b).expect("get");
    assert_eq!(b, data[..5]);

    // Outside the segment: refused, and the link goes on.
    let end = 3u64 << 20;
    let r = l.submit_put(end - 2, &[1, 2, 3]).expect("sent").wait(&mut []);
    assert_eq!(refused(r), Status::OutOfRange);
    let mut b3 = [0u8; 3];
    assert_eq!(
        refused(l.submit_get(end - 2, 3).expect("sent").wait(&mut b3)),
        Status::OutOfRange
    );
    assert_eq!(
        refused(l.submit_get(u64::MAX - 1, 3).expect("sent").wait(&mut b3)),
        Status::OutOfRange
    );
    assert_eq!(refused(l.fetch_add(end, 1)), Status::OutOfRange);
    assert_eq!(refused(l.fetch_add(12, 1)), Status::BadRequest, "misaligned word");
    assert!(!l.is_broken());
    l.submit_put(end - 3, &[7, 8, 9])
        .expect("put")
        .wait(&mut [])
        .expect("last bytes");

    // Atomics.
    assert_eq!(l.fetch_add(8, 5).expect("fadd"), 0);
    assert_eq!(other.fetch_add(8, u64::MAX).expect("fadd"), 5, "wrapping add of -1");
    assert_eq!(l.compare_swap(8, 3, 10).expect("cas"), 4, "failed swap");
    assert_eq!(l.compare_swap(8, 4, 10).expect("cas"), 4);
    let mut w = [0u8; 8];
    other.submit_get(8, 8).expect("get").wait(&mut w).expect("get");
    assert_eq!(u64::from_le_bytes(w), 10);

    // Opening an existing name with a larger size is a conflict; an unknown name without a
    // size is no segment; a wrong secret is denied.
    let c = Link::connect(a, T).expect("connect");
    assert_eq!(refused(c.open_segment(SECRET, b"arr", 8 << 20)), Status::Conflict);
    assert_eq!(refused(c.open_segment(SECRET, b"nothing", 0)), Status::NoSegment);
    let d = Link::connect(a, T).expect("connect");
    assert_eq!(refused(d.open_segment(b"wrong", b"arr", 0)), Status::Denied);

    // The name dies with its last connection: a new OPEN gets fresh zeros.
    drop((l, other, c));
    let e = Link::connect(a, T).expect("connect");
    let deadline = std::time::Instant::now() + T;
    loop {
        let g3 = e.open_segment(SECRET, b"arr", 1 << 20);
        match g3 {
            Ok(g3) if g3.grant.segment_id != g.grant.segment_id => break,
            // The brick may not have seen the old connections close yet: then the name still
            // holds the old segment; let go of it and ask again.
            Ok(_) if std::time::Instant::now() < deadline => {
                e.detach().expect("detach");
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(_) => panic!("the segment outlived its connections"),
            Err(err) => panic!("reopening: {err}"),
        }
    }
    let mut b = vec![1u8; 16];
    e.submit_get(4093, 16).expect("get").wait(&mut b).expect("get");
    assert_eq!(b, vec![0u8; 16]);
}

#[test]
fn put_get_atomics_and_bounds_over_tcp() {
    let (_h, a) = brick(ListenAddr::Tcp("127.0.0.1:0".into()));
    put_get_and_bounds(&a);
}

#[test]
fn put_get_atomics_and_bounds_over_unix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, a) = brick(ListenAddr::Unix(dir.path().join("b.sock")));
    put_get_and_bounds(&a);
}

/// The brick's atomics from links that do not map the segment, and a node's own atomic
/// instructions on its mapping of the same segment, never lose an update.
#[test]
fn atomics_from_links_and_mappings_sum_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, addr) = brick(ListenAddr::Unix(dir.path().join("b.sock")));
    const ROUNDS: u64 = 2000;
    let mapper = Link::connect(&addr, T).expect("connect");
    mapper.open_segment(SECRET, b"counter", 1 << 20).expect("open");
    // A word written before sharing moves with the segment.
    assert_eq!(mapper.fetch_add(64, 1000).expect("fadd"), 0);
    let m = mapper.share().expect("share");
    std::thread::scope(|s| {
        for t in 0..3 {
            let addr = &addr;
            s.spawn(move || {
                let l = Link::connect(addr, T).expect("connect");
                l.open_segment(SECRET, b"counter", 0).expect("open");
                for i in 0..ROUNDS {
                    if (i + t) % 2 == 0 {
                        l.fetch_add(64, 1).expect("fadd");
                    } else {
                        // An increment by compare-and-swap, retried until it lands.
                        let mut w = [0u8; 8];
                        l.submit_get(64, 8).expect("get").wait(&mut w).expect("get");
                        let mut cur = u64::from_le_bytes(w);
                        loop {
                            let old = l.compare_swap(64, cur, cur + 1).expect("cas");
                            if old == cur {
                                break;
                            }
                            cur = old;
                        }
                    }
                }
            });
        }
        let m = &m;
        s.spawn(move || {
            for _ in 0..ROUNDS {
                m.fetch_add_u64(64, 1);
            }
        });
    });
    assert_eq!(mapper.fetch_add(64, 0).expect("fadd"), 1000 + 4 * ROUNDS);
    let mut w = [0u8; 8];
    m.read(64, &mut w);
    assert_eq!(u64::from_le_bytes(w), 1000 + 4 * ROUNDS);
}
