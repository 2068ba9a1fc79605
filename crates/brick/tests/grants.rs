//! Grants with proof of possession and managed segments, on real bricks over Unix sockets and
//! TCP: every way of presenting a grant one does not rightfully hold is refused with its own
//! status, a node never reaches another node's segment, and a managed brick places, keeps and
//! releases segments as its control plane says (`docs/control-plane.md`).
//!
//! The tests play the control plane: they know the brick's key, sign grants and derive session
//! keys as it would. Raw sockets send what `rackmem-transport` never would (no proof, a proof
//! made for another connection, ATTACH before HELLO).

use rackmem_brick::{Brick, BrickConfig, BrickHandle, ListenAddr, CHUNK};
use rackmem_proto::{
    attach_proof, rights, session_key, BrickInfo, Grant, Header, Opcode, Request, SegmentGrant, Status, HEADER_LEN,
};
use rackmem_transport::{BrickAddr, Link, LinkError};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

const KEY: &[u8] = b"brick-key";
const SECRET: &[u8] = b"shared-secret";
const T: Duration = Duration::from_secs(10);
const POOL: u64 = 64 << 20;

/// A brick on a Unix socket (`unix == true`) or on TCP loopback.
fn brick(dir: &tempfile::TempDir, unix: bool, managed: bool) -> (BrickHandle, BrickAddr) {
    let listen = if unix {
        ListenAddr::Unix(
            dir.path()
                .join(if managed { "managed.sock" } else { "standalone.sock" }),
        )
    } else {
        ListenAddr::Tcp("127.0.0.1:0".into())
    };
    let h = Brick::start(BrickConfig {
        listen,
        size_bytes: POOL,
        key: KEY.to_vec(),
        // A managed brick refuses ALLOC even with the right secret.
        secret: Some(SECRET.to_vec()),
        managed,
        limits: Default::default(),
        tls: None,
    })
    .expect("brick starts");
    let a = h.local_addr().parse().expect("address");
    (h, a)
}

/// What the control plane hands a node: a grant and its session key.
fn issue(segment_id: u64, offset: u64, size: u64, node: u64, rights: u8) -> SegmentGrant {
    SegmentGrant::new(KEY, Grant::sign(KEY, segment_id, offset, size, node, rights, 0))
}

fn attach(addr: &BrickAddr, sg: &SegmentGrant) -> Link {
    let l = Link::connect(addr, T).expect("connect");
    l.attach(&sg.grant, &sg.session_key).expect("attach");
    l
}

fn refusal<T: std::fmt::Debug>(r: Result<T, LinkError>) -> (Status, String) {
    match r {
        Err(LinkError::Refused { status, message, .. }) => (status, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn page(seed: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed * 7919) % 251) as u8)
        .collect()
}

/// FNV-1a: enough to tell a page range came back exactly as written.
fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Waits (bounded) until the brick has served every connection's end.
fn wait_for_connections(h: &BrickHandle, n: u64) {
    let start = Instant::now();
    while h.stats().connections != n {
        assert!(
            start.elapsed() < T,
            "the brick still counts {} connections",
            h.stats().connections
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

trait Stream: Read + Write {}
impl<S: Read + Write> Stream for S {}

/// A connection that speaks frames without `rackmem-transport`'s manners.
struct Raw(Box<dyn Stream>);

impl Raw {
    fn connect(addr: &BrickAddr) -> Raw {
        match addr {
            BrickAddr::Unix(p) => {
                let s = UnixStream::connect(p).expect("raw connect");
                s.set_read_timeout(Some(T)).expect("timeout");
                Raw(Box::new(s))
            }
            BrickAddr::Tcp(a) => {
                let s = TcpStream::connect(a).expect("raw connect");
                s.set_read_timeout(Some(T)).expect("timeout");
                Raw(Box::new(s))
            }
            BrickAddr::Tls(_) => panic!("raw frames need a plain connection, not {addr}"),
        }
    }

    fn call(&mut self, frame: &[u8]) -> (Status, Vec<u8>) {
        self.0.write_all(frame).expect("send");
        let mut h = [0u8; HEADER_LEN];
        self.0.read_exact(&mut h).expect("a response");
        let h = Header::decode(&h).expect("response header");
        let mut p = vec![0u8; h.payload_len as usize];
        self.0.read_exact(&mut p).expect("response payload");
        (Status::from_u32(h.status), p)
    }

    fn hello(&mut self) -> BrickInfo {
        let (st, p) = self.call(&Request::Hello.encode(1));
        assert_eq!(st, Status::Ok);
        BrickInfo::decode(&p).expect("HELLO answer")
    }

    fn attach(&mut self, grant: &Grant, proof: [u8; 32]) -> (Status, String) {
        let (st, p) = self.call(
            &Request::Attach {
                grant: grant.clone(),
                proof,
            }
            .encode(2),
        );
        (st, String::from_utf8_lossy(&p).into_owned())
    }

    /// True once the brick has closed the connection.
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.0.read(&mut b) {
            Ok(n) => n == 0,
            // Not answering within the read timeout is not closing.
            Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        }
    }
}

/// Sends an ATTACH the brick must refuse on a fresh connection (after HELLO, with the proof
/// `proof_for` makes from that connection's HELLO answer); checks the brick closed the
/// connection and returns the refusal.
fn refused_attach(addr: &BrickAddr, grant: &Grant, proof_for: impl Fn(&BrickInfo) -> [u8; 32]) -> (Status, String) {
    let mut raw = Raw::connect(addr);
    let info = raw.hello();
    let r = raw.attach(grant, proof_for(&info));
    assert_ne!(r.0, Status::Ok, "{r:?}");
    assert!(raw.closed(), "a refused ATTACH closes the connection ({r:?})");
    r
}

fn attach_checks(addr: &BrickAddr) {
    let owner = Link::connect(addr, T).expect("connect");
    let sg = owner.alloc_segment(SECRET, 2 << 20).expect("alloc");
    assert_eq!(
        sg.session_key,
        session_key(KEY, &sg.grant),
        "ALLOC returns the grant's session key"
    );
    owner.write_pages(&[(0, 4096)], &page(1)).expect("write");
    let g = &sg.grant;
    let proper = |info: &BrickInfo| attach_proof(&sg.session_key, &info.nonce, g.segment_id);

    // The raw client itself is right: a proper proof on its own connection is accepted.
    let mut raw = Raw::connect(addr);
    let info = raw.hello();
    assert_eq!(raw.attach(g, proper(&info)).0, Status::Ok);

    // No proof at all: a client older than session keys learns what to do.
    let mut raw = Raw::connect(addr);
    raw.hello();
    let mut frame = Header {
        opcode: Opcode::Attach,
        flags: 0,
        tag: 3,
        status: 0,
        offset: 0,
        length: 0,
        payload_len: Grant::LEN as u32,
    }
    .encode()
    .to_vec();
    frame.extend_from_slice(&g.encode());
    let (st, msg) = raw.call(&frame);
    assert_eq!(st, Status::GrantUnproven, "missing proof");
    let msg = String::from_utf8_lossy(&msg);
    assert!(msg.contains("no proof") && msg.contains("upgrade"), "{msg}");
    assert!(raw.closed());

    // ATTACH before HELLO: there is no nonce to prove against.
    let mut raw = Raw::connect(addr);
    let (st, msg) = raw.attach(g, [0; 32]);
    assert_eq!(st, Status::BadRequest);
    assert!(msg.contains("HELLO first"), "{msg}");
    assert!(raw.closed());

    // Malformed: a payload that is neither a grant nor a grant with proof.
    let mut raw = Raw::connect(addr);
    raw.hello();
    let mut frame = Request::Attach {
        grant: g.clone(),
        proof: [0; 32],
    }
    .encode(4);
    frame.push(0);
    frame[28..32].copy_from_slice(&((Grant::LEN + 33) as u32).to_le_bytes());
    assert_eq!(raw.call(&frame).0, Status::BadRequest, "malformed ATTACH");
    assert!(raw.closed());

    // Forged: one MAC bit flipped, presented with the real session key and a proper proof.
    let mut forged = g.clone();
    forged.mac[5] ^= 0x10;
    let (st, msg) = refused_attach(addr, &forged, proper);
    assert_eq!(st, Status::GrantInvalid, "{msg}");
    assert!(msg.contains("does not verify"), "{msg}");

    // Signed with another brick's key, by someone who knows that key and so its session key.
    let other = Grant::sign(
        b"another brick",
        g.segment_id,
        g.brick_offset,
        g.size_bytes,
        0,
        rights::ALL,
        0,
    );
    let other_key = session_key(b"another brick", &other);
    let (st, _) = refused_attach(addr, &other, |i| attach_proof(&other_key, &i.nonce, other.segment_id));
    assert_eq!(st, Status::GrantInvalid);

    // Expired, properly proven; and expired *and* unproven: expiry is checked first.
    let expired = Grant::sign(KEY, g.segment_id, g.brick_offset, g.size_bytes, 0, rights::ALL, 1);
    let expired_key = session_key(KEY, &expired);
    let (st, msg) = refused_attach(addr, &expired, |i| {
        attach_proof(&expired_key, &i.nonce, expired.segment_id)
    });
    assert_eq!(st, Status::GrantExpired, "{msg}");
    assert!(msg.contains("expired"), "{msg}");
    assert_eq!(refused_attach(addr, &expired, |_| [0; 32]).0, Status::GrantExpired);

    // A foreign grant: seen on the wire, but without its session key. Guessing, or using the
    // session key of a grant one does hold, proves nothing.
    let (st, msg) = refused_attach(addr, g, |i| attach_proof(&[0; 32], &i.nonce, g.segment_id));
    assert_eq!(st, Status::GrantUnproven, "{msg}");
    assert!(msg.contains("not proven"), "{msg}");
    let mine = Link::connect(addr, T).expect("connect");
    let my_grant = mine.alloc_segment(SECRET, 1 << 20).expect("alloc");
    let (st, _) = refused_attach(addr, g, |i| attach_proof(&my_grant.session_key, &i.nonce, g.segment_id));
    assert_eq!(st, Status::GrantUnproven);
    assert_eq!(
        refusal(mine_link_attach(addr, g, &my_grant.session_key)).0,
        Status::GrantUnproven,
        "through a real link too"
    );

    // A proof made for one connection's nonce, replayed on another.
    let mut first = Raw::connect(addr);
    let first_nonce = first.hello().nonce;
    let replayed = attach_proof(&sg.session_key, &first_nonce, g.segment_id);
    let (st, _) = refused_attach(addr, g, |i| {
        assert_ne!(i.nonce, first_nonce, "every connection gets its own nonce");
        replayed
    });
    assert_eq!(st, Status::GrantUnproven);
    // The connection it was made for may still use it.
    assert_eq!(first.attach(g, replayed).0, Status::Ok);

    // The rightful holder, through a real link on a new connection, is unaffected.
    let again = attach(addr, &sg);
    let mut b = vec![0u8; 4096];
    again.read_pages(&[(0, 4096)], &mut b).expect("read");
    assert_eq!(b, page(1));
}

fn mine_link_attach(addr: &BrickAddr, g: &Grant, key: &[u8; 32]) -> Result<(), LinkError> {
    Link::connect(addr, T).expect("connect").attach(g, key)
}

#[test]
fn attach_refuses_every_grant_not_rightfully_held_over_unix_and_tcp() {
    let dir = tempfile::tempdir().expect("tempdir");
    for unix in [true, false] {
        let (_h, a) = brick(&dir, unix, false);
        attach_checks(&a);
        let (m, ma) = brick(&dir, unix, true);
        // The same checks guard a managed brick, before it would create anything.
        let sg = issue(7, 0, CHUNK, 1, rights::ALL);
        let mut raw = Raw::connect(&ma);
        raw.hello();
        assert_eq!(raw.attach(&sg.grant, [0; 32]).0, Status::GrantUnproven);
        assert_eq!(m.stats().segments, 0, "an unproven grant creates no segment");
    }
}

#[test]
fn hello_nonces_are_per_connection_and_stable_within_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, a) = brick(&dir, true, false);
    let mut raw = Raw::connect(&a);
    let n1 = raw.hello().nonce;
    assert_eq!(raw.hello().nonce, n1, "a second HELLO on a connection keeps its nonce");
    let l1 = Link::connect(&a, T).expect("connect");
    let l2 = Link::connect(&a, T).expect("connect");
    assert_ne!(l1.info().nonce, l2.info().nonce);
    assert_ne!(l1.info().nonce, n1);
}

#[test]
fn read_only_grants_cannot_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    for unix in [true, false] {
        let (_h, a) = brick(&dir, unix, true);
        let rw = attach(&a, &issue(1, 0, 4 * CHUNK, 1, rights::ALL));
        rw.write_pages(&[(0, 4096)], &page(3)).expect("write");
        let ro_grant = issue(1, 0, 4 * CHUNK, 2, rights::READ);
        let mut b = vec![0u8; 4096];
        attach(&a, &ro_grant).read_pages(&[(0, 4096)], &mut b).expect("read");
        assert_eq!(b, page(3));
        let (st, msg) = refusal(attach(&a, &ro_grant).write_pages(&[(0, 4096)], &page(4)));
        assert_eq!(st, Status::Forbidden);
        assert!(msg.contains("writes"), "{msg}");
        assert_eq!(refusal(attach(&a, &ro_grant).discard(0, 4096)).0, Status::Forbidden);
        assert_eq!(
            refusal(attach(&a, &ro_grant).copy_within(0, 4096, 4096)).0,
            Status::Forbidden
        );
        let wo = attach(&a, &issue(1, 0, 4 * CHUNK, 3, rights::WRITE));
        assert_eq!(refusal(wo.read_pages(&[(0, 4096)], &mut b)).0, Status::Forbidden);
        rw.read_pages(&[(0, 4096)], &mut b).expect("read");
        assert_eq!(b, page(3), "refused requests changed nothing");
    }
    // Standalone: a read-only grant cannot clone either.
    let (_h, a) = brick(&dir, true, false);
    let owner = Link::connect(&a, T).expect("connect");
    let sg = owner.alloc_segment(SECRET, CHUNK).expect("alloc");
    let ro = SegmentGrant::new(
        KEY,
        Grant::sign(
            KEY,
            sg.grant.segment_id,
            sg.grant.brick_offset,
            sg.grant.size_bytes,
            0,
            rights::READ,
            0,
        ),
    );
    assert_eq!(refusal(attach(&a, &ro).clone_segment()).0, Status::Forbidden);
}

#[test]
fn a_node_cannot_read_or_write_another_nodes_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    for unix in [true, false] {
        let (h, a) = brick(&dir, unix, true);
        let for_a = issue(10, 0, 4 * CHUNK, 1, rights::ALL);
        let for_b = issue(11, 4 * CHUNK, 4 * CHUNK, 2, rights::ALL);
        let node_a = attach(&a, &for_a);
        let secret_data: Vec<u8> = (0..16).flat_map(page).collect();
        node_a
            .write_pages(
                &[(4 * CHUNK - secret_data.len() as u64, secret_data.len() as u32)],
                &secret_data,
            )
            .expect("A writes");

        // B holds a valid grant and session key, for its own segment only.
        assert_eq!(
            refusal(mine_link_attach(&a, &for_a.grant, &for_b.session_key)).0,
            Status::GrantUnproven,
            "A's grant with B's session key"
        );
        let mut stretched = for_b.grant.clone();
        stretched.brick_offset = 0;
        stretched.size_bytes = 8 * CHUNK;
        assert_eq!(
            refusal(mine_link_attach(&a, &stretched, &for_b.session_key)).0,
            Status::GrantInvalid,
            "B's grant widened over A's range"
        );

        let node_b = attach(&a, &for_b);
        let mut b = vec![0u8; 4096];
        let (st, msg) = refusal(node_b.read_pages(&[(4 * CHUNK, 4096)], &mut b));
        assert_eq!(st, Status::OutOfRange, "{msg}");
        let node_b = attach(&a, &for_b);
        assert_eq!(
            refusal(node_b.write_pages(&[(4 * CHUNK, 4096)], &page(99))).0,
            Status::OutOfRange
        );
        let node_b = attach(&a, &for_b);
        assert_eq!(refusal(node_b.copy_within(0, 4 * CHUNK, 4096)).0, Status::OutOfRange);
        let node_b = attach(&a, &for_b);
        assert_eq!(refusal(node_b.discard(4 * CHUNK, 4096)).0, Status::OutOfRange);
        // Offsets are relative to B's segment: the whole of it is B's, none of it A's.
        let node_b = attach(&a, &for_b);
        let mut all = vec![1u8; 4 * CHUNK as usize];
        node_b
            .read_pages(&[(0, 4 * CHUNK as u32)], &mut all)
            .expect("B reads its own");
        assert!(
            all.iter().all(|&x| x == 0),
            "B sees only its own (never written) segment"
        );

        let mut back = vec![0u8; secret_data.len()];
        node_a
            .read_pages(&[(4 * CHUNK - back.len() as u64, back.len() as u32)], &mut back)
            .expect("A reads");
        assert_eq!(back, secret_data, "A's data is untouched");
        assert_eq!(h.stats().segments, 2);
    }
}

#[test]
fn a_managed_brick_creates_segments_from_grants_and_keeps_them_across_reconnects() {
    let dir = tempfile::tempdir().expect("tempdir");
    for unix in [true, false] {
        let (h, a) = brick(&dir, unix, true);
        assert_eq!(h.stats().segments, 0);
        let sg = issue(0x5eed, 8 * CHUNK, 4 * CHUNK, 1, rights::ALL);
        let free_before = h.stats().free_bytes;
        let ext: Vec<(u64, u32)> = (0..256).map(|i| (i * 2 * 4096, 4096)).collect();
        let data: Vec<u8> = (0..256).flat_map(page).collect();
        {
            let l = attach(&a, &sg);
            assert_eq!(h.stats().segments, 1, "the grant created its segment");
            assert_eq!(h.stats().free_bytes, free_before - 4 * CHUNK);
            l.write_pages(&ext, &data).expect("write");
            // A second link of the same node shares it (the runtime's write-back link).
            let second = attach(&a, &sg);
            let mut b = vec![0u8; 4096];
            second.read_pages(&[(0, 4096)], &mut b).expect("read");
            assert_eq!(b, page(0));
        }
        wait_for_connections(&h, 0);
        let s = h.stats();
        assert_eq!(s.segments, 1, "a managed segment outlives its connections");
        assert!(s.resident_bytes > 0, "and keeps its memory");

        let l = attach(&a, &sg);
        let mut back = vec![0u8; data.len()];
        l.read_pages(&ext, &mut back).expect("read back");
        assert_eq!(checksum(&back), checksum(&data), "data survived the reconnect");
        l.detach().expect("detach");
        assert_eq!(h.stats().segments, 1, "DETACH does not release it either");
    }
}

#[test]
fn overlapping_or_misplaced_grants_conflict() {
    let dir = tempfile::tempdir().expect("tempdir");
    for unix in [true, false] {
        let (h, a) = brick(&dir, unix, true);
        let first = attach(&a, &issue(10, 0, 4 * CHUNK, 1, rights::ALL));
        let conflict = |sg: &SegmentGrant| refusal(mine_link_attach(&a, &sg.grant, &sg.session_key));

        // A grant older than the live segment it overlaps is stale.
        let (st, msg) = conflict(&issue(8, 2 * CHUNK, 4 * CHUNK, 2, rights::ALL));
        assert_eq!(st, Status::Conflict, "{msg}");
        assert!(
            msg.contains("overlaps live segment 10"),
            "names the overlapping segment: {msg}"
        );
        let (st, msg) = conflict(&issue(13, POOL - CHUNK, 2 * CHUNK, 2, rights::ALL));
        assert_eq!(st, Status::Conflict);
        assert!(msg.contains("outside"), "{msg}");
        let (st, msg) = conflict(&issue(10, 0, 8 * CHUNK, 1, rights::ALL));
        assert_eq!(st, Status::Conflict, "the same id with another range");
        assert!(msg.contains("segment 10 lives at"), "{msg}");
        assert_eq!(conflict(&issue(14, 100, CHUNK, 2, rights::ALL)).0, Status::Conflict);
        assert_eq!(h.stats().segments, 1, "no refused grant created anything");

        // Touching is not overlapping.
        let _next = attach(&a, &issue(15, 4 * CHUNK, 4 * CHUNK, 2, rights::ALL));
        assert_eq!(h.stats().segments, 2);

        // A newer grant over segment 10's range proves 10 released (the control plane reused
        // the range before the heartbeat said so): 10 goes, its connection learns it.
        first.write_pages(&[(0, 4096)], &page(7)).expect("write to segment 10");
        let newer = attach(&a, &issue(16, 0, 2 * CHUNK, 3, rights::ALL));
        assert_eq!(h.stats().segments, 2, "segment 10 replaced by 16");
        let mut back = vec![1u8; 4096];
        newer.read_pages(&[(0, 4096)], &mut back).expect("read segment 16");
        assert!(back.iter().all(|&b| b == 0), "the new segment starts zeroed");
        assert!(
            first.read_pages(&[(0, 4096)], &mut back).is_err(),
            "segment 10's connection is refused"
        );
    }
}

#[test]
fn retain_segments_releases_the_unlisted_and_their_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    for unix in [true, false] {
        let (h, a) = brick(&dir, unix, true);
        // When the heartbeat that brings a list was sent: segments created after it are safe.
        let listed_before_they_existed = Instant::now();
        let dropped = issue(20, 0, 2 * CHUNK, 1, rights::ALL);
        let kept = issue(21, 2 * CHUNK, 2 * CHUNK, 2, rights::ALL);
        let on_dropped = attach(&a, &dropped);
        let on_kept = attach(&a, &kept);
        on_dropped.write_pages(&[(0, 4096)], &page(1)).expect("write");
        on_kept.write_pages(&[(0, 4096)], &page(2)).expect("write");
        let before = h.stats();
        assert_eq!(before.segments, 2);
        assert_eq!(before.resident_bytes, 2 * CHUNK);

        assert!(h.retain_segments_as_of(&[], listed_before_they_existed).is_empty());
        assert_eq!(h.stats().segments, 2);

        assert_eq!(h.retain_segments(&[(21, 2 * CHUNK, 2 * CHUNK)]), vec![20]);
        let after = h.stats();
        assert_eq!(after.segments, 1);
        assert_eq!(after.resident_bytes, CHUNK, "the released segment's memory is gone");
        assert_eq!(after.free_bytes, before.free_bytes + 2 * CHUNK);

        // A connection still attached to the released segment learns it is gone.
        let mut b = vec![0u8; 4096];
        let (st, msg) = refusal(on_dropped.read_pages(&[(0, 4096)], &mut b));
        assert_eq!(st, Status::NoSegment, "{msg}");
        assert!(msg.contains("released"), "{msg}");
        assert!(matches!(on_dropped.ping(), Err(LinkError::BrickLost { .. })));
        on_kept
            .read_pages(&[(0, 4096)], &mut b)
            .expect("the listed one is served");
        assert_eq!(b, page(2));

        // The range is free again, and zeroed for its next tenant.
        let next = attach(&a, &issue(22, 0, 2 * CHUNK, 3, rights::ALL));
        next.read_pages(&[(0, 4096)], &mut b).expect("read");
        assert!(b.iter().all(|&x| x == 0), "a new tenant never sees released data");
        assert_eq!(
            refusal(mine_link_attach(&a, &dropped.grant, &dropped.session_key)).0,
            Status::Conflict,
            "the old grant no longer finds its range"
        );
        assert_eq!(h.retain_segments(&[]).len(), 2, "attached or not");
        assert_eq!(h.stats().segments, 0);
        assert_eq!(h.stats().resident_bytes, 0);
        assert_eq!(h.stats().free_bytes, POOL);
    }
    // Standalone segments are not the control plane's to release.
    let (h, a) = brick(&dir, true, false);
    let l = Link::connect(&a, T).expect("connect");
    l.alloc_segment(SECRET, CHUNK).expect("alloc");
    assert!(h.retain_segments(&[]).is_empty());
    l.ping().expect("still attached");
    assert_eq!(h.stats().segments, 1);
}

#[test]
fn a_managed_brick_refuses_alloc_and_clone() {
    let dir = tempfile::tempdir().expect("tempdir");
    for unix in [true, false] {
        let (h, a) = brick(&dir, unix, true);
        let l = Link::connect(&a, T).expect("connect");
        let (st, msg) = refusal(l.alloc_segment(SECRET, CHUNK));
        assert_eq!(st, Status::Denied);
        assert!(msg.contains("control plane"), "{msg}");
        assert_eq!(h.stats().segments, 0);

        let l = attach(&a, &issue(30, 0, CHUNK, 1, rights::ALL));
        let (st, msg) = refusal(l.clone_segment());
        assert_eq!(st, Status::Denied);
        assert!(msg.contains("CLONE is disabled"), "{msg}");
        l.write_pages(&[(0, 4096)], &page(5))
            .expect("the node keeps its connection and segment");
        assert_eq!(h.stats().segments, 1);
    }
}

#[test]
fn standalone_grants_come_with_working_session_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    for unix in [true, false] {
        let (_h, a) = brick(&dir, unix, false);
        let parent = Link::connect(&a, T).expect("connect");
        let sg = parent.alloc_segment(SECRET, CHUNK).expect("alloc");
        parent.write_pages(&[(0, 4096)], &page(8)).expect("write");
        let clone = parent.clone_segment().expect("clone");
        assert_eq!(clone.session_key, session_key(KEY, &clone.grant));
        assert_ne!(clone.session_key, sg.session_key);
        let child = attach(&a, &clone);
        let mut b = vec![0u8; 4096];
        child.read_pages(&[(0, 4096)], &mut b).expect("read");
        assert_eq!(b, page(8));
        // The parent's key does not open the child's clone.
        assert_eq!(
            refusal(mine_link_attach(&a, &clone.grant, &sg.session_key)).0,
            Status::GrantUnproven
        );
    }
}
