//! SHARE: a brick on the node's own host hands the node its segment as shared memory. The data
//! written over the socket before is there, writes through the memory are what the socket reads
//! after, clones copy it, releases free it, and TCP links are refused with a clear error while
//! they keep working.

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

fn page(seed: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|i| (i.wrapping_mul(131).wrapping_add(seed * 7907) % 253) as u8)
        .collect()
}

#[test]
fn shared_memory_and_the_socket_see_the_same_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (h, a) = brick(ListenAddr::Unix(dir.path().join("b.sock")));
    let l = Link::connect(&a, T).expect("connect");
    let g = l.alloc_segment(SECRET, 4 << 20).expect("alloc");
    l.write_pages(&[(8192, 4096)], &page(1)).expect("write before sharing");
    let m = l.share().expect("share");
    assert_eq!(m.len(), 4 << 20);
    let mut b = vec![0u8; 4096];
    m.read(8192, &mut b);
    assert_eq!(b, page(1), "what the socket wrote is in the shared memory");
    m.read(0, &mut b);
    assert!(b.iter().all(|&x| x == 0), "never-written pages are zeros");

    // A second link of the same node (the write-back link) reads what the memory wrote.
    let other = Link::connect(&a, T).expect("connect");
    other.attach(&g.grant, &g.session_key).expect("attach");
    m.write(3 << 20, &page(2));
    other.read_pages(&[(3 << 20, 4096)], &mut b).expect("read");
    assert_eq!(b, page(2), "the socket reads what the shared memory wrote");
    other.write_pages(&[(4096, 4096)], &page(3)).expect("write");
    m.read(4096, &mut b);
    assert_eq!(b, page(3));
    // Sharing again hands over the same memory.
    let again = other.share().expect("share again");
    again.read(3 << 20, &mut b);
    assert_eq!(b, page(2));
    drop(again);

    // Only what was written holds memory: the pool's copy was given back.
    let resident = h.stats().resident_bytes;
    assert!(
        (3 * 4096..=4 * 4096).contains(&resident),
        "resident {resident} bytes for 4 written pages"
    );
    other.discard(0, 2 << 20).expect("discard");
    m.read(8192, &mut b);
    assert!(b.iter().all(|&x| x == 0), "a discard zeroes the shared memory too");

    // A clone of a shared segment is a copy: later writes on either side stay apart.
    let c = l.clone_segment().expect("clone");
    let child = Link::connect(&a, T).expect("connect");
    child.attach(&c.grant, &c.session_key).expect("attach clone");
    child.read_pages(&[(3 << 20, 4096)], &mut b).expect("read clone");
    assert_eq!(b, page(2), "the clone has the shared segment's data");
    m.write(3 << 20, &page(4));
    child.read_pages(&[(3 << 20, 4096)], &mut b).expect("read clone");
    assert_eq!(b, page(2), "the clone does not see the parent's later write");
    let cm = child.share().expect("share the clone");
    cm.read(3 << 20, &mut b);
    assert_eq!(b, page(2));
}

#[test]
fn a_released_segment_gives_its_memory_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (h, a) = brick(ListenAddr::Unix(dir.path().join("b.sock")));
    let before = h.stats().free_bytes;
    {
        let l = Link::connect(&a, T).expect("connect");
        l.alloc_segment(SECRET, 8 << 20).expect("alloc");
        let m = l.share().expect("share");
        for i in 0..16 {
            m.write(i * 4096, &page(i as u64));
        }
        assert!(h.stats().resident_bytes >= 16 * 4096);
        // The link closes first, the mapping goes at the end of the block.
    }
    let start = std::time::Instant::now();
    while h.stats().free_bytes != before || h.stats().resident_bytes != 0 {
        assert!(start.elapsed() < T, "segment not freed: {:?}", h.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn populate_gives_a_shared_segment_memory_without_changing_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (h, a) = brick(ListenAddr::Unix(dir.path().join("b.sock")));
    let l = Link::connect(&a, T).expect("connect");
    l.alloc_segment(SECRET, 8 << 20).expect("alloc");
    l.write_pages(&[(4096, 4096)], &page(1)).expect("write");
    let m = l.share().expect("share");
    let mut backed = Vec::new();
    m.pages_backed(0, 1 << 20, &mut backed).expect("mincore");
    assert_eq!(
        backed.iter().filter(|&&b| b).count(),
        1,
        "only the written page has memory"
    );
    let before = h.stats().resident_bytes;
    let populate = |off: u64, len: u64| l.submit_populate(off, len).and_then(|t| t.wait(&mut []));
    populate(0, 1 << 20).expect("populate");
    m.pages_backed(0, 1 << 20, &mut backed).expect("mincore");
    assert!(backed.iter().all(|&b| b), "every populated page has memory");
    assert!(h.stats().resident_bytes >= before + (1 << 20) - 4096, "{:?}", h.stats());
    let mut b = vec![0u8; 4096];
    m.read(4096, &mut b);
    assert_eq!(b, page(1), "populating keeps what was written");
    m.read(0, &mut b);
    assert!(b.iter().all(|&x| x == 0), "and the rest reads as zeros");
    // Not whole pages: refused before sending, the link goes on. Outside the segment: refused
    // by the brick (which then closes the connection, as for any request out of range).
    assert!(matches!(populate(1, 4096), Err(LinkError::Invalid { .. })));
    l.read_pages(&[(4096, 4096)], &mut b).expect("the link still works");
    assert_eq!(b, page(1));
    match populate(8 << 20, 4096) {
        Err(LinkError::Refused { status, .. }) => assert_eq!(status, Status::OutOfRange),
        other => panic!("expected OutOfRange, got {other:?}"),
    }
    // A segment in the pool allocates at its first write: populating it succeeds and changes
    // nothing.
    let pool = Link::connect(&a, T).expect("connect");
    pool.alloc_segment(SECRET, 1 << 20).expect("alloc");
    pool.submit_populate(0, 1 << 20)
        .and_then(|t| t.wait(&mut []))
        .expect("populate a pool segment");
    pool.read_pages(&[(0, 4096)], &mut b).expect("read");
    assert!(b.iter().all(|&x| x == 0));
}

#[test]
fn tcp_links_cannot_share_and_keep_working() {
    let (_h, a) = brick(ListenAddr::Tcp("127.0.0.1:0".into()));
    let l = Link::connect(&a, T).expect("connect");
    l.alloc_segment(SECRET, 1 << 20).expect("alloc");
    match l.share() {
        Err(LinkError::Invalid { reason, .. }) => assert!(reason.contains("Unix-socket"), "{reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    l.write_pages(&[(0, 4096)], &page(9)).expect("the link still works");
    let mut b = vec![0u8; 4096];
    l.read_pages(&[(0, 4096)], &mut b).expect("read");
    assert_eq!(b, page(9));
}

#[test]
fn share_before_attach_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, a) = brick(ListenAddr::Unix(dir.path().join("b.sock")));
    let l = Link::connect(&a, T).expect("connect");
    match l.share() {
        Err(LinkError::Refused { status, .. }) => assert_eq!(status, Status::NotAttached),
        other => panic!("expected NotAttached, got {other:?}"),
    }
}

#[test]
fn shared_memory_outlives_a_brick_that_stops() {
    // The node keeps its data readable when the brick process goes away: the memory belongs to
    // the file, which the node's mapping keeps alive.
    let dir = tempfile::tempdir().expect("tempdir");
    let (h, a) = brick(ListenAddr::Unix(dir.path().join("b.sock")));
    let l = Link::connect(&a, T).expect("connect");
    l.alloc_segment(SECRET, 1 << 20).expect("alloc");
    let m = l.share().expect("share");
    m.write(0, &page(5));
    h.shutdown();
    let mut b = vec![0u8; 4096];
    m.read(0, &mut b);
    assert_eq!(b, page(5));
    assert!(matches!(l.ping(), Err(LinkError::BrickLost { .. })));
}

/// CLONE_LAZY: the clone copies nothing when it is made; a page its source overwrites after
/// UNSHARE (or with a WRITE, which unshares by itself) keeps its old value in the clone; the
/// clone's own writes stay its own; a clone of the lazy clone is made of its whole view; and
/// once the source is released the clone still holds every value. Bad UNSHARE requests get a
/// status, and the link goes on.
#[test]
fn a_lazy_clone_keeps_its_view_while_its_source_changes_and_after_it_is_released() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (h, a) = brick(ListenAddr::Unix(dir.path().join("b.sock")));
    let before = h.stats().free_bytes;
    let l = Link::connect(&a, T).expect("connect");
    let g = l.alloc_segment(SECRET, 8 << 20).expect("alloc");
    let m = l.share().expect("share");
    let pages = 32u64;
    for i in 0..pages {
        m.write(i as usize * 4096, &page(i));
    }
    let resident = h.stats().resident_bytes;
    let c = l.clone_segment_lazy().expect("lazy clone");
    assert_eq!(
        h.stats().resident_bytes,
        resident,
        "a lazy clone copies nothing when it is made"
    );
    let child = Link::connect(&a, T).expect("connect");
    child.attach(&c.grant, &c.session_key).expect("attach the clone");
    let mut b = vec![0u8; 4096];
    let read = |link: &Link, i: u64, b: &mut Vec<u8>| {
        link.read_pages(&[(i * 4096, 4096)], b).expect("read");
        b.clone()
    };
    assert_eq!(
        read(&child, 5, &mut b),
        page(5),
        "a shared page is read from the source"
    );
    // A second child of the same source, which reads nothing until the source is gone.
    let c2 = l.clone_segment_lazy().expect("second lazy clone");
    let child2 = Link::connect(&a, T).expect("connect");
    child2
        .attach(&c2.grant, &c2.session_key)
        .expect("attach the second clone");

    // The source overwrites pages 0..8 in its mapping after UNSHARE, and page 8 over its link.
    assert_eq!(l.unshare(0, 8 * 4096).expect("unshare"), 2, "two lazy clones live");
    for i in 0..8 {
        m.write(i as usize * 4096, &page(100 + i));
    }
    l.write_pages(&[(8 * 4096, 4096)], &page(108)).expect("write");
    for i in 0..9 {
        assert_eq!(read(&child, i, &mut b), page(i), "page {i}: the clone keeps its value");
    }
    // The clone writes a whole page and part of another.
    child
        .write_pages(&[(10 * 4096, 4096)], &page(300))
        .expect("clone writes");
    assert_eq!(read(&child, 10, &mut b), page(300));
    assert_eq!(
        read(&l, 10, &mut b),
        page(10),
        "the source never sees the clone's write"
    );

    // A clone of the lazy clone: its whole view, copied.
    let gc = child.clone_segment_lazy().expect("clone of a lazy clone");
    let grand = Link::connect(&a, T).expect("connect");
    grand.attach(&gc.grant, &gc.session_key).expect("attach the grandclone");
    child
        .write_pages(&[(11 * 4096, 4096)], &page(311))
        .expect("clone writes again");
    for i in 0..pages {
        let want = match i {
            10 => page(300),
            _ => page(i),
        };
        assert_eq!(read(&grand, i, &mut b), want, "grandclone page {i}");
    }

    // Bad input: a range past the end, a misaligned one. The answer says so and the brick
    // closes that connection, as for a bad DISCARD; the segment and its other links go on.
    for (off, len) in [(8 << 20, 4096), (0, (8 << 20) + 4096), (4096, 100)] {
        let bad = Link::connect(&a, T).expect("connect");
        bad.attach(&g.grant, &g.session_key).expect("attach");
        match bad.unshare(off, len) {
            Err(LinkError::Refused { status, .. }) => assert_eq!(status, Status::OutOfRange, "{off:#x}+{len:#x}"),
            other => panic!("UNSHARE {off:#x}+{len:#x}: expected OutOfRange, got {other:?}"),
        }
    }
    // The first clone's link ended when it was cloned whole; the second still shares.
    assert_eq!(l.unshare(0, 0).expect("the segment's own link goes on"), 1);
    l.write_pages(&[(21 * 4096, 4096)], &page(121)).expect("write");

    // The source is released (its last link and mapping go): the clone takes what it shared.
    drop(m);
    l.detach().expect("detach");
    match l.unshare(0, 4096) {
        Err(LinkError::Refused { status, .. }) => assert_eq!(status, Status::NotAttached),
        other => panic!("UNSHARE after DETACH: expected NotAttached, got {other:?}"),
    }
    drop(l);
    for i in 0..pages {
        let want = match i {
            10 => page(300),
            11 => page(311),
            _ => page(i),
        };
        assert_eq!(
            read(&child, i, &mut b),
            want,
            "clone page {i} after its source was released"
        );
        assert_eq!(
            read(&child2, i, &mut b),
            page(i),
            "second clone page {i} after its source was released"
        );
    }
    drop((child, child2, grand));
    let start = std::time::Instant::now();
    while h.stats().free_bytes != before {
        assert!(start.elapsed() < T, "segments not freed: {:?}", h.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
}
