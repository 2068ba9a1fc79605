//! Links against a real brick (Unix socket and TCP loopback): large transfers that exceed the
//! socket buffers in both directions at once, many requests in flight from one thread through
//! tickets, concurrent callers, client-side validation, and a brick that goes away while
//! requests are pending. No timing assertions: every wait is bounded by the link's timeout.

use rackmem_brick::{Brick, BrickConfig, BrickHandle, ListenAddr};
use rackmem_proto::Status;
use rackmem_transport::{BrickAddr, Link, LinkError, MAX_BATCH_EXTENTS, MAX_IN_FLIGHT};
use std::sync::Arc;
use std::time::Duration;

const SECRET: &[u8] = b"s3cret";
const T: Duration = Duration::from_secs(20);

fn brick(listen: ListenAddr, size_bytes: u64) -> (BrickHandle, BrickAddr) {
    let h = Brick::start(BrickConfig {
        listen,
        size_bytes,
        key: b"k".to_vec(),
        secret: Some(SECRET.to_vec()),
        managed: false,
        limits: Default::default(),
        tls: None,
    })
    .expect("brick starts");
    let a = h.local_addr().parse().expect("brick address parses");
    (h, a)
}

fn both(dir: &tempfile::TempDir, size_bytes: u64) -> Vec<(BrickHandle, BrickAddr)> {
    vec![
        brick(ListenAddr::Unix(dir.path().join("b.sock")), size_bytes),
        brick(ListenAddr::Tcp("127.0.0.1:0".into()), size_bytes),
    ]
}

/// Deterministic page contents for page `n` written in round `round`.
fn fill(buf: &mut [u8], n: u64, round: u64) {
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

fn pages(first: u64, count: u64, round: u64) -> Vec<u8> {
    let mut v = vec![0u8; (count * 4096) as usize];
    for (i, p) in v.chunks_mut(4096).enumerate() {
        fill(p, first + i as u64, round);
    }
    v
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn large_transfers_in_both_directions_at_once_do_not_wedge_the_link() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (_h, addr) in both(&dir, 160 << 20) {
        let link = Arc::new(Link::connect(&addr, T).expect("connect"));
        link.alloc_segment(SECRET, 128 << 20).expect("alloc");
        // 48 MiB as 12288 single-page extents: many batches, far beyond any socket buffer.
        let n = 12288u64;
        let ext: Vec<(u64, u32)> = (0..n).map(|i| (i * 4096, 4096)).collect();
        let data = pages(0, n, 1);
        link.write_pages(&ext, &data).expect("write");
        let hi: Vec<(u64, u32)> = (0..n).map(|i| ((64 << 20) + i * 4096, 4096)).collect();
        let hi_data = pages(1 << 20, n, 2);
        // One thread streams writes into the upper half while this one reads the lower half:
        // requests and responses both exceed the socket buffers.
        let writer = {
            let link = link.clone();
            let hi = hi.clone();
            let hi_data = hi_data.clone();
            std::thread::spawn(move || link.write_pages(&hi, &hi_data))
        };
        let mut back = vec![0u8; data.len()];
        link.read_pages(&ext, &mut back).expect("read");
        writer.join().expect("writer thread").expect("concurrent write");
        assert_eq!(checksum(&back), checksum(&data));
        assert!(back == data, "{addr}: lower half differs");
        let mut back = vec![0u8; hi_data.len()];
        link.read_pages(&hi, &mut back).expect("read upper half");
        assert!(back == hi_data, "{addr}: upper half differs");
        // And one contiguous 32 MiB extent (split by size, not by count).
        let mut big = vec![0u8; 32 << 20];
        link.read_pages(&[(0, 32 << 20)], &mut big)
            .expect("read one big extent");
        assert!(big[..] == data[..32 << 20]);
    }
}

#[test]
fn tickets_pipeline_beyond_the_in_flight_limit_from_one_thread() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (_h, addr) in both(&dir, 64 << 20) {
        let link = Link::connect(&addr, T).expect("connect");
        link.alloc_segment(SECRET, 32 << 20).expect("alloc");
        let n = (MAX_IN_FLIGHT as u64) * 3;
        let writes: Vec<_> = (0..n)
            .map(|i| {
                link.submit_write(&[(i * 4096, 4096)], &pages(i, 1, 7))
                    .expect("submit write")
            })
            .collect();
        for t in writes {
            assert!(t.is_empty());
            t.wait(&mut []).expect("write done");
        }
        // Reads of 2 pages each, waited in reverse order of submission: responses get parked.
        let reads: Vec<_> = (0..n / 2)
            .map(|i| {
                link.submit_read(&[(2 * i * 4096, 4096), ((2 * i + 1) * 4096, 4096)])
                    .expect("submit read")
            })
            .collect();
        for (i, t) in reads.into_iter().enumerate().rev() {
            let mut out = vec![0u8; t.len()];
            t.wait(&mut out).expect("read done");
            assert!(out == pages(2 * i as u64, 2, 7), "{addr}: pages {} differ", 2 * i);
        }
        // Dropped tickets are forgotten, and the link keeps working.
        for i in 0..10 {
            drop(link.submit_read(&[(i * 4096, 4096)]).expect("submit"));
        }
        let mut one = vec![0u8; 4096];
        link.read_pages(&[(5 * 4096, 4096)], &mut one)
            .expect("read after drops");
        assert!(one == pages(5, 1, 7));
        link.ping().expect("ping");
    }
}

#[test]
fn many_threads_share_one_link_and_see_their_own_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (_h, addr) in both(&dir, 64 << 20) {
        let link = Arc::new(Link::connect(&addr, T).expect("connect"));
        link.alloc_segment(SECRET, 32 << 20).expect("alloc");
        let threads: Vec<_> = (0..6u64)
            .map(|t| {
                let link = link.clone();
                std::thread::spawn(move || {
                    for round in 0..40u64 {
                        // Each thread owns pages t, t+6, t+12, ...; batches of 1 to 8 pages.
                        let count = round % 8 + 1;
                        let ext: Vec<(u64, u32)> =
                            (0..count).map(|k| (((round * 8 + k) * 6 + t) * 4096, 4096)).collect();
                        let mut data = vec![0u8; ext.len() * 4096];
                        for (k, p) in data.chunks_mut(4096).enumerate() {
                            fill(p, ext[k].0 / 4096, round);
                        }
                        link.write_pages(&ext, &data)?;
                        let mut back = vec![0u8; data.len()];
                        link.read_pages(&ext, &mut back)?;
                        assert!(back == data, "thread {t} round {round}");
                    }
                    Ok::<_, LinkError>(())
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread").expect("requests");
        }
    }
}

#[test]
fn client_side_mistakes_are_refused_without_breaking_the_link() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, addr) = brick(ListenAddr::Unix(dir.path().join("b.sock")), 16 << 20);
    let link = Link::connect(&addr, T).expect("connect");
    link.alloc_segment(SECRET, 4 << 20).expect("alloc");
    let invalid = |r: Result<(), LinkError>| matches!(r, Err(LinkError::Invalid { .. }));
    let mut small = vec![0u8; 100];
    assert!(invalid(link.read_pages(&[(0, 4096)], &mut small)));
    assert!(invalid(link.read_pages(&[(100, 4096)], &mut vec![0u8; 4096])));
    assert!(invalid(link.write_pages(&[(0, 4000)], &[0u8; 4000])));
    let too_many: Vec<(u64, u32)> = (0..=MAX_BATCH_EXTENTS as u64).map(|i| (i * 4096, 4096)).collect();
    assert!(link.submit_read(&too_many).is_err());
    let t = link.submit_read(&[(0, 4096)]).expect("submit");
    assert!(invalid(t.wait(&mut [0u8; 10])));
    assert!(!link.is_broken());
    link.ping().expect("the link still works");
    // A refusal by the brick names the brick and the status.
    let e = link.alloc_segment(SECRET, 1 << 20).expect_err("already attached");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
}

#[test]
fn discard_zeroes_and_copy_handles_overlap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_h, addr) = brick(ListenAddr::Unix(dir.path().join("b.sock")), 16 << 20);
    let link = Link::connect(&addr, T).expect("connect");
    link.alloc_segment(SECRET, 4 << 20).expect("alloc");
    let n = 512u64; // 2 MiB: crosses a chunk boundary
    let data = pages(0, n, 3);
    let ext: Vec<(u64, u32)> = vec![(0, (n * 4096) as u32)];
    link.write_pages(&ext, &data).expect("write");
    // Overlapping copy forward by 3 pages: like memmove.
    link.copy_within(0, 3 * 4096, (n - 3) * 4096).expect("copy");
    let mut back = vec![0u8; data.len()];
    link.read_pages(&ext, &mut back).expect("read");
    assert!(back[3 * 4096..] == data[..((n - 3) * 4096) as usize], "memmove forward");
    // And backward.
    link.write_pages(&ext, &data).expect("rewrite");
    link.copy_within(3 * 4096, 0, (n - 3) * 4096).expect("copy back");
    link.read_pages(&ext, &mut back).expect("read");
    assert!(
        back[..((n - 3) * 4096) as usize] == data[3 * 4096..],
        "memmove backward"
    );
    // Discard a range straddling the chunk boundary: zeros there, data kept around it.
    link.write_pages(&ext, &data).expect("rewrite");
    let before = link.stats().expect("stats").resident_bytes;
    link.discard(64 * 4096, 384 * 4096).expect("discard");
    link.read_pages(&ext, &mut back).expect("read");
    assert!(back[64 * 4096..448 * 4096].iter().all(|&b| b == 0));
    assert!(back[..64 * 4096] == data[..64 * 4096]);
    assert!(back[448 * 4096..] == data[448 * 4096..]);
    link.discard(0, 4 << 20).expect("discard all");
    let after = link.stats().expect("stats").resident_bytes;
    assert!(after < before, "discard releases memory ({before} -> {after})");
    // Misaligned or out-of-segment discards are refused.
    let r = link.discard(4 << 20, 4096);
    assert!(
        matches!(
            r,
            Err(LinkError::Refused {
                status: Status::OutOfRange,
                ..
            })
        ),
        "{r:?}"
    );
}

#[test]
fn a_brick_that_stops_fails_pending_tickets_and_later_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (h, addr) in both(&dir, 16 << 20) {
        let link = Link::connect(&addr, T).expect("connect");
        link.alloc_segment(SECRET, 4 << 20).expect("alloc");
        link.write_pages(&[(0, 4096)], &pages(0, 1, 1)).expect("write");
        let tickets: Vec<_> = (0..4)
            .map(|_| link.submit_read(&[(0, 1 << 20)]).expect("submit"))
            .collect();
        h.shutdown();
        // Each pending ticket either got its (correct) answer before the stop, or BrickLost.
        let mut lost = false;
        for t in tickets {
            let mut out = vec![0u8; t.len()];
            match t.wait(&mut out) {
                Ok(()) => assert!(out[..4096] == pages(0, 1, 1)[..], "never zeros in place of data"),
                Err(LinkError::BrickLost { addr: a, .. }) => {
                    assert_eq!(a, addr.to_string());
                    lost = true;
                }
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        let _ = lost;
        let e = link.read_pages(&[(0, 4096)], &mut [0u8; 4096]).expect_err("brick gone");
        assert!(matches!(e, LinkError::BrickLost { .. }), "{e}");
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
        assert!(link.is_broken());
        assert!(matches!(link.ping(), Err(LinkError::BrickLost { .. })));
    }
}

#[test]
fn connecting_to_nothing_names_the_address() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr: BrickAddr = format!("unix:{}", dir.path().join("none.sock").display())
        .parse()
        .expect("address");
    let e = Link::connect(&addr, Duration::from_secs(1)).expect_err("nothing listens");
    let text = e.to_string();
    assert!(text.starts_with(&format!("cannot reach brick {addr}")), "{text}");
}

/// The runtime's pattern: one link carves the segment, a second (its write-back link) attaches
/// with the grant and session key; a link without the key cannot, and a broken attach names the
/// status the brick gave.
#[test]
fn links_attach_with_the_session_key_from_alloc_and_clone() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (_h, addr) in both(&dir, 32 << 20) {
        let fault = Link::connect(&addr, T).expect("connect");
        let seg = fault.alloc_segment(SECRET, 4 << 20).expect("alloc");
        let writeback = Link::connect(&addr, T).expect("connect");
        assert_ne!(fault.info().nonce, writeback.info().nonce, "per-connection nonces");
        writeback
            .attach(&seg.grant, &seg.session_key)
            .expect("attach with the session key");
        let data = pages(0, 4, 1);
        writeback.write_pages(&[(0, 4 * 4096)], &data).expect("write");
        let mut back = vec![0u8; data.len()];
        fault.read_pages(&[(0, 4 * 4096)], &mut back).expect("read");
        assert_eq!(checksum(&back), checksum(&data));

        let clone = fault.clone_segment().expect("clone");
        let child = Link::connect(&addr, T).expect("connect");
        child
            .attach(&clone.grant, &clone.session_key)
            .expect("attach the clone");
        child.read_pages(&[(0, 4 * 4096)], &mut back).expect("read the clone");
        assert_eq!(checksum(&back), checksum(&data));

        let thief = Link::connect(&addr, T).expect("connect");
        match thief.attach(&seg.grant, &clone.session_key) {
            Err(
                e @ LinkError::Refused {
                    status: Status::GrantUnproven,
                    ..
                },
            ) => assert!(e.to_string().contains(&addr.to_string()), "{e}"),
            other => panic!("expected GrantUnproven, got {other:?}"),
        }
    }
}

/// What a misbehaving peer does after answering HELLO.
#[derive(Clone, Copy)]
enum Peer {
    /// Never reads another byte.
    StopsReading,
    /// Reads requests but answers each a byte at a time, a byte every 100 ms.
    Trickles,
}

/// A fake brick on TCP loopback that answers HELLO properly, then misbehaves as `how` until
/// the returned sender is dropped.
fn fake_brick(how: Peer) -> (BrickAddr, std::sync::mpsc::Sender<()>) {
    use rackmem_proto::{encode_response, BrickInfo, Header, Opcode, HEADER_LEN, MAX_PAYLOAD};
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = format!("tcp://{}", l.local_addr().expect("addr"))
        .parse()
        .expect("address");
    let (done, wait) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        let mut h = [0u8; HEADER_LEN];
        if s.read_exact(&mut h).is_err() {
            return;
        }
        let info = BrickInfo {
            pool_bytes: 1 << 30,
            free_bytes: 1 << 30,
            page_size: 4096,
            max_payload: MAX_PAYLOAD,
            brick_id: 1,
            nonce: [7; 16],
        };
        let tag = Header::decode(&h).map_or(0, |h| h.tag);
        let _ = s.write_all(&encode_response(Opcode::Hello, tag, Status::Ok, &info.encode()));
        match how {
            Peer::StopsReading => {}
            Peer::Trickles => {
                if s.read_exact(&mut h).is_ok() {
                    let req = Header::decode(&h).expect("a request header");
                    let answer = encode_response(req.opcode, req.tag, Status::Ok, &[0u8; 4096]);
                    for b in answer {
                        if s.write_all(&[b]).is_err() || wait.recv_timeout(Duration::from_millis(100)).is_ok() {
                            return;
                        }
                    }
                }
            }
        }
        // Hold the connection open, silent, until the test ends.
        let _ = wait.recv();
    });
    (addr, done)
}

/// The link's timeout holds for a peer that stops reading (sends block) and for one that
/// answers a byte at a time (each read returns something, so only a deadline over the whole
/// wait ends it): the link breaks with a cause, within a bound far below what a per-call timeout
/// would allow (the trickled answer alone would take 7 minutes).
#[test]
fn a_peer_that_stops_reading_or_trickles_is_cut_at_the_link_timeout() {
    let timeout = Duration::from_secs(1);
    let bound = Duration::from_secs(10);

    let (addr, _done) = fake_brick(Peer::StopsReading);
    let link = Link::connect(&addr, timeout).expect("connect");
    let data = vec![5u8; 32 << 20];
    let t0 = std::time::Instant::now();
    match link.write_pages(&[(0, 32 << 20)], &data) {
        Err(LinkError::BrickLost { cause, .. }) => assert!(cause.contains("could not send"), "{cause}"),
        other => panic!("expected the link to break, got {other:?}"),
    }
    assert!(t0.elapsed() < bound, "cut after {:?}", t0.elapsed());
    assert!(link.is_broken());

    let (addr, _done) = fake_brick(Peer::Trickles);
    let link = Link::connect(&addr, timeout).expect("connect");
    let mut out = vec![0u8; 4096];
    let t0 = std::time::Instant::now();
    match link.read_pages(&[(0, 4096)], &mut out) {
        Err(LinkError::BrickLost { cause, .. }) => assert!(cause.contains("within"), "{cause}"),
        other => panic!("expected the link to break, got {other:?}"),
    }
    assert!(t0.elapsed() < bound, "cut after {:?}", t0.elapsed());
}
