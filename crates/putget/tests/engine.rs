//! The engine against real bricks over TCP, a Unix socket and shared memory: random puts and
//! gets of every size class by both paths, checked against a local model of the segment;
//! non-blocking transfers completed by a quiet; atomics; bad offsets and freed handles.

use rackmem_brick::{Brick, BrickConfig, BrickHandle, ListenAddr};
use rackmem_putget::{Engine, EngineConfig, Path, Pending, PutGetError, Sharing, Threshold};
use rackmem_transport::BrickAddr;
use std::sync::Arc;
use std::time::Duration;

const SECRET: &[u8] = b"s";

fn brick(listen: ListenAddr) -> (BrickHandle, BrickAddr) {
    let h = Brick::start(BrickConfig {
        listen,
        size_bytes: 256 << 20,
        key: b"k".to_vec(),
        secret: Some(SECRET.to_vec()),
        managed: false,
        limits: Default::default(),
        tls: None,
    })
    .expect("brick starts");
    let a = h.local_addr().parse().expect("address");
    (h, a)
}

fn engine(addr: &BrickAddr, sharing: Sharing, threshold: Threshold) -> Engine {
    Engine::new(EngineConfig {
        bricks: vec![addr.clone()],
        secret: SECRET.to_vec(),
        timeout: Duration::from_secs(10),
        sharing,
        tls: None,
        threshold,
        link_spin: Duration::ZERO,
    })
}

/// A small deterministic generator (xorshift), so a failure replays.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn against_model(e: &Engine, expect_mapped: bool) {
    const SIZE: u64 = 24 << 20;
    let h = e.alloc(SIZE - 5).expect("alloc");
    let seg = e.segment(h).expect("segment");
    assert_eq!(seg.size(), SIZE, "rounded up to whole chunks");
    assert_eq!(seg.is_mapped(), expect_mapped);
    let plan = seg.plan();
    assert!(!plan.pinned && !plan.get_probes.is_empty(), "calibrated: {plan:?}");
    let mut model = vec![0u8; SIZE as usize];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let sizes = [1u64, 8, 100, 4096, 70_000, 600_000, 3 << 20, 17 << 20];
    for round in 0..40 {
        let len = sizes[round % sizes.len()] + rng.below(13);
        let len = len.min(SIZE);
        let off = rng.below(SIZE - len + 1);
        let path = if rng.below(2) == 0 { Path::Inline } else { Path::Bulk };
        let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        match round % 3 {
            0 => seg.put_with(path, off, &data).expect("put"),
            1 => seg.put(off, &data).expect("put by the plan"),
            _ => {
                let mut p = Pending::default();
                p.put(&seg, off, &data).expect("put_nbi");
                p.quiet().expect("quiet");
            }
        }
        model[off as usize..(off + len) as usize].copy_from_slice(&data);
        let (goff, glen) = {
            let a = rng.below(SIZE);
            let l = (rng.below(4 << 20) + 1).min(SIZE - a);
            (a, l)
        };
        let mut out = vec![0xa5u8; glen as usize];
        if round % 2 == 0 {
            seg.get_with(path, goff, &mut out).expect("get");
        } else {
            seg.get(goff, &mut out).expect("get by the plan");
        }
        assert!(
            out == model[goff as usize..(goff + glen) as usize],
            "round {round}: get {goff:#x}+{glen:#x} ({path:?}) differs from the model"
        );
    }
    // Non-blocking gets into distinct buffers, completed together (their contents are checked
    // by the C tests, which own their buffers; here: that they complete, in bounded steps).
    let mut p = Pending::default();
    for i in 0..600u64 {
        let b: &'static mut [u8] = Box::leak(vec![0u8; 1 + (i as usize % 7) * 4_000].into_boxed_slice());
        p.get(&seg, i * 30_000 + 3, b).expect("get_nbi");
        assert!(p.len() <= rackmem_putget::MAX_PENDING, "bounded in flight");
    }
    p.quiet().expect("quiet");
    assert!(p.is_empty());
    // Atomics.
    let w = 16u64 << 20;
    let before = u64::from_le_bytes(model[w as usize..w as usize + 8].try_into().expect("word"));
    assert_eq!(seg.fetch_add(w, 7).expect("fadd"), before);
    assert_eq!(seg.compare_swap(w, before + 7, 1).expect("cas"), before + 7);
    let mut back = [0u8; 8];
    seg.get(w, &mut back).expect("get");
    assert_eq!(u64::from_le_bytes(back), 1);
    // Bad arguments and freed handles.
    let mut one = [0u8; 1];
    assert!(matches!(seg.get(SIZE, &mut one), Err(PutGetError::OutOfRange { .. })));
    assert!(matches!(seg.put(u64::MAX, &one), Err(PutGetError::OutOfRange { .. })));
    assert!(matches!(seg.fetch_add(3, 1), Err(PutGetError::Misaligned(3))));
    assert_eq!(seg.fetch_add(SIZE, 1).map_err(|e| e.errno()), Err(libc::EINVAL));
    drop(seg);
    e.free(h).expect("free");
    assert_eq!(e.segment(h).map_err(|e| e.errno()).err(), Some(libc::EBADF));
    assert_eq!(e.free(h).map_err(|e| e.errno()).err(), Some(libc::EBADF));
}

#[test]
fn put_get_over_tcp_against_a_model() {
    let (_h, a) = brick(ListenAddr::Tcp("127.0.0.1:0".into()));
    against_model(&engine(&a, Sharing::Auto, Threshold::Calibrate), false);
}

#[test]
fn put_get_over_a_unix_socket_against_a_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, a) = brick(ListenAddr::Unix(dir.path().join("b.sock")));
    against_model(&engine(&a, Sharing::Never, Threshold::Calibrate), false);
}

#[test]
fn put_get_over_shared_memory_against_a_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, a) = brick(ListenAddr::Unix(dir.path().join("b.sock")));
    let e = engine(&a, Sharing::Always, Threshold::Calibrate);
    against_model(&e, true);
    let plans = e.plans();
    assert_eq!(plans.len(), 1);
    assert!(plans[0].1, "the plan is the mapped link's");
}

/// Named segments: engines (standing for processes) on TCP and on shared memory update one
/// counter; the total is exact.
#[test]
fn named_segment_atomics_from_mapped_and_socket_users_sum_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, a) = brick(ListenAddr::Unix(dir.path().join("b.sock")));
    let engines: Vec<Arc<Engine>> = [Sharing::Always, Sharing::Never, Sharing::Never]
        .into_iter()
        .map(|s| Arc::new(engine(&a, s, Threshold::Pinned(4096))))
        .collect();
    let first = engines[0].open(b"ctr", 1 << 20).expect("create");
    const N: u64 = 3000;
    std::thread::scope(|s| {
        for e in &engines {
            s.spawn(move || {
                let h = e.open(b"ctr", 0).expect("open");
                let seg = e.segment(h).expect("segment");
                for _ in 0..N {
                    seg.fetch_add(8, 1).expect("fadd");
                }
                e.free(h).expect("free");
            });
        }
    });
    let seg = engines[0].segment(first).expect("segment");
    assert_eq!(seg.fetch_add(8, 0).expect("read"), 3 * N);
    assert_eq!(
        engines[1].open(b"ctr", 2 << 20).map_err(|e| e.errno()).err(),
        Some(libc::EEXIST),
        "a named segment smaller than asked for"
    );
    assert_eq!(
        engines[1].open(b"none", 0).map_err(|e| e.errno()).err(),
        Some(libc::ENOENT)
    );
}

/// A process holds at most MAX_SEGMENTS segments; freeing one makes room again.
#[test]
fn segments_per_process_are_bounded() {
    let (_h, a) = brick(ListenAddr::Tcp("127.0.0.1:0".into()));
    let e = engine(&a, Sharing::Never, Threshold::Pinned(0));
    let held: Vec<u64> = (0..rackmem_putget::MAX_SEGMENTS)
        .map(|_| e.alloc(1).expect("alloc"))
        .collect();
    assert_eq!(e.alloc(1).map_err(|e| e.errno()).err(), Some(libc::EMFILE));
    e.free(held[0]).expect("free");
    e.alloc(1).expect("room again");
}

/// A brick that answers `Moving` or `Moved` for a segment this process holds under no name (no
/// granter, so nothing to re-open it by): the call fails at once with `EIO` saying so, without
/// waiting out the move, and nothing was done; once the brick serves it again, so does the call.
#[test]
fn a_moving_answer_for_a_segment_held_under_no_name_fails_at_once_saying_why() {
    use rackmem_putget::Retry;
    let (h, a) = brick(ListenAddr::Tcp("127.0.0.1:0".into()));
    let e = engine(&a, Sharing::Never, Threshold::Pinned(4096));
    let s = e.alloc(1 << 20).expect("alloc");
    let id = e.segment(s).expect("segment").grant().grant.segment_id;
    e.call(s, Retry::AtMostOnce, |g| g.fetch_add(8, 5)).expect("fetch-add");
    for (frozen, moved) in [(vec![id], vec![]), (vec![], vec![id])] {
        h.manager().apply_moves(&frozen, &moved, Vec::new());
        let t = std::time::Instant::now();
        let err = e
            .call(s, Retry::AtMostOnce, |g| g.fetch_add(8, 1))
            .expect_err("a segment that cannot follow its move");
        assert!(t.elapsed() < Duration::from_secs(1), "waited {:?}", t.elapsed());
        assert_eq!(err.errno(), libc::EIO, "{err}");
        assert!(err.to_string().contains("under no name"), "{err}");
        assert!(e.call(s, Retry::Idempotent, |g| g.put(16, &[1u8; 8])).is_err());
    }
    h.manager().apply_moves(&[], &[], Vec::new());
    assert_eq!(
        e.call(s, Retry::AtMostOnce, |g| g.fetch_add(8, 0))
            .expect("served again"),
        5,
        "the refused calls did nothing"
    );
    let mut out = [0u8; 8];
    e.segment(s).expect("segment").get(16, &mut out).expect("get");
    assert_eq!(out, [0u8; 8], "the refused put did nothing");
}
