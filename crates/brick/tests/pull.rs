//! Direct brick-to-brick migration between real bricks: a target brick pulls exactly what its
//! order names from a source brick, with a pull grant the segment's holder issued; and every
//! way of reading another brick's segment without such a grant, or beyond it, is refused.

use rackmem_brick::{Brick, BrickConfig, BrickHandle, ListenAddr};
use rackmem_proto::{PullGrant, PullOrder, PullPiece, SegmentGrant, Status, KEY_LEN};
use rackmem_transport::{BrickAddr, Link, LinkError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SECRET: &[u8] = b"pull-secret";
const T: Duration = Duration::from_secs(10);
const MIB: u64 = 1 << 20;

fn brick(listen: ListenAddr, key: &[u8]) -> (BrickHandle, BrickAddr) {
    let h = Brick::start(BrickConfig {
        listen,
        size_bytes: 64 << 20,
        key: key.to_vec(),
        secret: Some(SECRET.to_vec()),
        managed: false,
        limits: Default::default(),
        tls: None,
    })
    .expect("brick starts");
    let a: BrickAddr = h.local_addr().parse().expect("address");
    (h, a)
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs()
}

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 4096) as u8).wrapping_mul(13).wrapping_add(seed ^ i as u8))
        .collect()
}

/// A segment of `bytes` on `addr` holding `pattern(bytes, seed)`; the link stays attached.
fn filled(addr: &BrickAddr, bytes: u64, seed: u8) -> (Link, SegmentGrant) {
    let l = Link::connect(addr, T).expect("connect");
    let sg = l.alloc_segment(SECRET, bytes).expect("alloc");
    let data = pattern(bytes, seed);
    for (i, c) in data.chunks(MIB as usize).enumerate() {
        l.write_pages(&[(i as u64 * MIB, MIB as u32)], c).expect("write");
    }
    (l, sg)
}

fn read(l: &Link, off: u64, len: u64) -> Vec<u8> {
    let mut out = vec![0u8; len as usize];
    for (i, c) in out.chunks_mut(MIB as usize).enumerate() {
        l.read_pages(&[(off + i as u64 * MIB, c.len() as u32)], c)
            .expect("read");
    }
    out
}

fn refused(r: Result<impl std::fmt::Debug, LinkError>) -> Status {
    match r {
        Err(LinkError::Refused { status, .. }) => status,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn pulls_between(a: ListenAddr, b: ListenAddr) {
    let (_ha, a) = brick(a, b"key-a");
    let (_hb, b) = brick(b, b"key-b");
    let (_src, sg) = filled(&a, 8 * MIB, 1);
    let dst = Link::connect(&b, T).expect("connect");
    dst.alloc_segment(SECRET, 8 * MIB).expect("alloc");
    // Source pages [1, 3) MiB and [5, 6) MiB to target [0, 2) and [4, 5) MiB.
    let (pull, key) = PullGrant::issue(&sg, MIB, 5 * MIB, now() + 60);
    let order = PullOrder {
        source: a.to_string(),
        pull,
        key,
        pieces: vec![
            PullPiece {
                dst: 0,
                src: MIB,
                len: 2 * MIB,
            },
            PullPiece {
                dst: 4 * MIB,
                src: 5 * MIB,
                len: MIB,
            },
        ],
    };
    assert_eq!(dst.pull(&order).expect("pull"), 3 * MIB);
    let want = pattern(8 * MIB, 1);
    assert_eq!(read(&dst, 0, 2 * MIB), want[MIB as usize..3 * MIB as usize]);
    assert_eq!(read(&dst, 4 * MIB, MIB), want[5 * MIB as usize..6 * MIB as usize]);
    assert_eq!(
        read(&dst, 2 * MIB, 2 * MIB),
        vec![0u8; 2 * MIB as usize],
        "nothing else was written"
    );
}

#[test]
fn a_target_brick_pulls_what_its_order_names_over_unix_and_tcp() {
    let d = tempfile::tempdir().expect("tempdir");
    pulls_between(
        ListenAddr::Tcp("127.0.0.1:0".into()),
        ListenAddr::Unix(d.path().join("b.sock")),
    );
    pulls_between(
        ListenAddr::Unix(d.path().join("a.sock")),
        ListenAddr::Tcp("127.0.0.1:0".into()),
    );
}

/// What an attacker who saw a grant on the wire, or holds a pull grant for another range, can do
/// with a source brick: nothing beyond the delegated range, read-only.
#[test]
fn a_brick_serves_no_pull_without_a_grant_for_exactly_that_range() {
    let (_ha, a) = brick(ListenAddr::Tcp("127.0.0.1:0".into()), b"key-a");
    let (_src, sg) = filled(&a, 8 * MIB, 2);
    let attach = |p: &PullGrant, k: &[u8; KEY_LEN]| {
        let l = Link::connect(&a, T).expect("connect");
        l.attach_pull(p, k).map(|_| l)
    };
    // The grant alone (seen in clear at every ATTACH), with a guessed session key.
    let forged = SegmentGrant {
        grant: sg.grant.clone(),
        session_key: [0x5a; KEY_LEN],
    };
    let (forged_pull, forged_key) = PullGrant::issue(&forged, 0, 8 * MIB, now() + 60);
    assert_eq!(
        refused(attach(&forged_pull, &forged_key)),
        Status::GrantInvalid,
        "forged delegation"
    );
    // A real delegation, widened, moved or extended by its holder.
    let (good, key) = PullGrant::issue(&sg, MIB, MIB, now() + 60);
    for (what, f) in [
        ("widened", (|p: &mut PullGrant| p.len = 8 * MIB) as fn(&mut PullGrant)),
        ("moved", |p| p.offset = 0),
        ("extended", |p| p.expiry_unix_s += 100),
    ] {
        let mut p = good.clone();
        f(&mut p);
        assert_eq!(refused(attach(&p, &key)), Status::GrantInvalid, "{what}");
    }
    // The right delegation without its pull key (the session key is not it either).
    assert_eq!(refused(attach(&good, &sg.session_key)), Status::GrantUnproven);
    // Expired, or without an expiry.
    let (old, k) = PullGrant::issue(&sg, MIB, MIB, now() - 5);
    assert_eq!(refused(attach(&old, &k)), Status::GrantExpired);
    let (never, k) = PullGrant::issue(&sg, MIB, MIB, 0);
    assert_eq!(refused(attach(&never, &k)), Status::GrantExpired);
    // A delegation of another brick's segment (signed under that brick's key).
    let (_hb, b) = brick(ListenAddr::Tcp("127.0.0.1:0".into()), b"key-b");
    let (_other, sg_b) = filled(&b, 2 * MIB, 3);
    let (pb, kb) = PullGrant::issue(&sg_b, 0, MIB, now() + 60);
    assert_eq!(refused(attach(&pb, &kb)), Status::GrantInvalid, "another brick's grant");

    // The real thing: reads inside the range only, and nothing else.
    let l = attach(&good, &key).expect("a valid pull grant attaches");
    let want = pattern(8 * MIB, 2);
    assert_eq!(read(&l, MIB, MIB), want[MIB as usize..2 * MIB as usize]);
    let l = attach(&good, &key).expect("attach");
    let mut page = vec![0u8; 4096];
    assert_eq!(refused(l.read_pages(&[(0, 4096)], &mut page)), Status::OutOfRange);
    let l = attach(&good, &key).expect("attach");
    assert_eq!(refused(l.read_pages(&[(2 * MIB, 4096)], &mut page)), Status::OutOfRange);
    let l = attach(&good, &key).expect("attach");
    assert_eq!(refused(l.write_pages(&[(MIB, 4096)], &page)), Status::Forbidden);
    let l = attach(&good, &key).expect("attach");
    assert_eq!(refused(l.discard(MIB, 4096)), Status::Forbidden);
    let l = attach(&good, &key).expect("attach");
    assert_eq!(refused(l.clone_segment()), Status::Forbidden);
    let l = attach(&good, &key).expect("attach");
    assert_eq!(
        refused(l.submit_get(0, 8).and_then(|t| t.wait(&mut page[..8]))),
        Status::OutOfRange
    );
    let l = attach(&good, &key).expect("attach");
    assert_eq!(refused(l.fetch_add(MIB, 1)), Status::Forbidden);
    // The data did not change.
    let l = attach(&good, &key).expect("attach");
    assert_eq!(read(&l, MIB, MIB), want[MIB as usize..2 * MIB as usize]);

    // A PULL carrying a forged delegation: the source refuses it, the target copies nothing.
    let dst = Link::connect(&b, T).expect("connect");
    dst.alloc_segment(SECRET, 2 * MIB).expect("alloc");
    let order = PullOrder {
        source: a.to_string(),
        pull: forged_pull,
        key: forged_key,
        pieces: vec![PullPiece {
            dst: 0,
            src: 0,
            len: MIB,
        }],
    };
    assert_eq!(refused(dst.pull(&order)), Status::Forbidden);
    assert_eq!(read(&dst, 0, MIB), vec![0u8; MIB as usize], "nothing copied");
    // A PULL reaching beyond its delegation: the source refuses the read, nothing is valid.
    let order = PullOrder {
        source: a.to_string(),
        pull: good.clone(),
        key,
        pieces: vec![PullPiece {
            dst: 0,
            src: 2 * MIB,
            len: MIB,
        }],
    };
    assert_eq!(refused(dst.pull(&order)), Status::SourceLost);
    // PULL on a pull connection (read-only) is refused.
    let l = attach(&good, &key).expect("attach");
    assert_eq!(refused(l.pull(&order)), Status::Forbidden);
}

#[test]
fn a_pull_from_a_brick_that_cannot_be_reached_says_so() {
    let d = tempfile::tempdir().expect("tempdir");
    let (_hb, b) = brick(ListenAddr::Unix(d.path().join("b.sock")), b"key-b");
    let (_l, sg) = filled(&b, 2 * MIB, 4);
    let dst = Link::connect(&b, T).expect("connect");
    dst.alloc_segment(SECRET, 2 * MIB).expect("alloc");
    let (pull, key) = PullGrant::issue(&sg, 0, MIB, now() + 60);
    let gone = d.path().join("nobody.sock");
    let order = PullOrder {
        source: format!("unix:{}", gone.display()),
        pull,
        key,
        pieces: vec![PullPiece {
            dst: 0,
            src: 0,
            len: MIB,
        }],
    };
    assert_eq!(refused(dst.pull(&order)), Status::Unreachable);
    // The link to the target goes on.
    assert_eq!(read(&dst, 0, 4096), vec![0u8; 4096]);
}

/// FNV-1a over the bytes: the checksum two copies are compared by.
fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// An order for `len` bytes from `src` of the granted segment to `dst` of the target's.
fn order_for(source: &BrickAddr, sg: &SegmentGrant, src: u64, dst: u64, len: u64) -> PullOrder {
    let (pull, key) = PullGrant::issue(sg, src, len, now() + 60);
    PullOrder {
        source: source.to_string(),
        pull,
        key,
        pieces: vec![PullPiece { dst, src, len }],
    }
}

/// A target keeps its link to a source between orders (the second order opens no connection
/// to it), and when the source restarted in between, the next order connects afresh and
/// copies the right bytes.
#[test]
fn a_target_keeps_its_link_to_a_source_and_reconnects_after_the_source_restarts() {
    let d = tempfile::tempdir().expect("tempdir");
    let sock = d.path().join("a.sock");
    let (ha, a) = brick(ListenAddr::Unix(sock.clone()), b"key-a");
    let (_hb, b) = brick(ListenAddr::Tcp("127.0.0.1:0".into()), b"key-b");
    let dst = Link::connect(&b, T).expect("connect");
    dst.alloc_segment(SECRET, 8 * MIB).expect("alloc");
    let (src, sg) = filled(&a, 4 * MIB, 3);
    let want = pattern(4 * MIB, 3);
    assert_eq!(dst.pull(&order_for(&a, &sg, 0, 0, MIB)).expect("first pull"), MIB);
    // This test's link and the one the target kept.
    assert_eq!(ha.stats().connections, 2, "the target keeps its link to the source");
    assert_eq!(dst.pull(&order_for(&a, &sg, MIB, MIB, MIB)).expect("second pull"), MIB);
    assert_eq!(ha.stats().connections, 2, "the second order reuses the kept link");
    assert_eq!(
        checksum(&read(&dst, 0, 2 * MIB)),
        checksum(&want[..2 * MIB as usize]),
        "both orders copied the source's bytes"
    );
    drop(src);
    ha.shutdown();
    let (_ha2, a2) = brick(ListenAddr::Unix(sock), b"key-a");
    assert_eq!(a2, a, "the source restarts at its address");
    let (_src2, sg2) = filled(&a2, 4 * MIB, 4);
    let want2 = pattern(4 * MIB, 4);
    assert_eq!(
        dst.pull(&order_for(&a2, &sg2, MIB, 2 * MIB, 2 * MIB))
            .expect("a pull after the source restarted reconnects"),
        2 * MIB
    );
    assert_eq!(
        checksum(&read(&dst, 2 * MIB, 2 * MIB)),
        checksum(&want2[MIB as usize..3 * MIB as usize]),
        "the restarted source's bytes"
    );
    assert_eq!(
        checksum(&read(&dst, 0, 2 * MIB)),
        checksum(&want[..2 * MIB as usize]),
        "the earlier orders' bytes stay"
    );
}
