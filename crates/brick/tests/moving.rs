//! A named segment moving between two managed bricks as the control plane's heartbeat replies
//! say (`docs/migration.md`, "Named segments"), with the test playing the control plane: a
//! frozen segment answers every node request `Moving` without executing it (the word an atomic
//! would have changed is unchanged) while a pull still reads it; the target pulls it whole
//! (checked byte for byte); a moved segment answers `Moved`; one unfrozen is served again; a
//! pull from a source that is gone reports its failure; a segment this host maps is reported
//! unmovable and stays served.

use rackmem_brick::{Brick, BrickConfig, BrickHandle, ListenAddr, PullSpec};
use rackmem_proto::{rights, Grant, PullGrant, SegmentGrant, Status};
use rackmem_transport::{BrickAddr, Link, LinkError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const T: Duration = Duration::from_secs(10);
const MIB: u64 = 1 << 20;

fn managed(listen: ListenAddr, key: &[u8]) -> (BrickHandle, BrickAddr) {
    let h = Brick::start(BrickConfig {
        listen,
        size_bytes: 64 << 20,
        key: key.to_vec(),
        secret: None,
        managed: true,
        limits: Default::default(),
        tls: None,
    })
    .expect("brick starts");
    let a = h.local_addr().parse().expect("address");
    (h, a)
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs()
}

fn issue(key: &[u8], id: u64, offset: u64, size: u64) -> SegmentGrant {
    SegmentGrant::new(key, Grant::sign(key, id, offset, size, 1, rights::ALL, now() + 600))
}

fn attach(addr: &BrickAddr, sg: &SegmentGrant) -> Link {
    let l = Link::connect(addr, T).expect("connect");
    l.attach(&sg.grant, &sg.session_key).expect("attach");
    l
}

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 4096) as u8).wrapping_mul(13).wrapping_add(seed ^ i as u8))
        .collect()
}

fn put(l: &Link, off: u64, data: &[u8]) -> Result<(), LinkError> {
    for (i, c) in data.chunks(MIB as usize).enumerate() {
        l.submit_put(off + i as u64 * MIB, c)?.wait(&mut [])?;
    }
    Ok(())
}

fn get(l: &Link, off: u64, len: u64) -> Result<Vec<u8>, LinkError> {
    let mut out = vec![0u8; len as usize];
    for (i, c) in out.chunks_mut(MIB as usize).enumerate() {
        l.submit_get(off + i as u64 * MIB, c.len())?.wait(c)?;
    }
    Ok(out)
}

fn status<T: std::fmt::Debug>(r: Result<T, LinkError>) -> Status {
    match r {
        Err(LinkError::Refused { status, .. }) => status,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn spec(src: &SegmentGrant, source: &BrickAddr, dst_key: &[u8], dst_id: u64) -> PullSpec {
    let size = src.grant.size_bytes;
    let (pull, key) = PullGrant::issue(src, 0, size, now() + 60);
    PullSpec {
        target: Grant::sign(dst_key, dst_id, 0, size, 0, rights::ALL, now() + 600),
        source: source.to_string(),
        pull,
        key,
    }
}

/// The outcome of the pull into segment `id`, once the brick reports it.
fn outcome(h: &BrickHandle, id: u64) -> rackmem_brick::PullOutcome {
    let deadline = Instant::now() + T;
    loop {
        if let Some(o) = h.manager().move_report().pulls.into_iter().find(|o| o.segment_id == id) {
            return o;
        }
        assert!(Instant::now() < deadline, "no outcome of the pull into segment {id}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_frozen_segment_executes_nothing_is_pulled_whole_and_then_answers_moved() {
    let d = tempfile::tempdir().expect("tempdir");
    let (ha, a) = managed(ListenAddr::Unix(d.path().join("a.sock")), b"key-a");
    let (hb, b) = managed(ListenAddr::Tcp("127.0.0.1:0".into()), b"key-b");
    let size = 4 * MIB;
    let s = issue(b"key-a", 7, 8 * MIB, size);
    let holder = attach(&a, &s);
    let data = pattern(size, 3);
    put(&holder, 0, &data).expect("put");
    assert_eq!(
        holder.fetch_add(MIB, 5).expect("fetch-add"),
        u64::from_le_bytes(data[MIB as usize..MIB as usize + 8].try_into().unwrap())
    );
    let mut want = data.clone();
    let w = u64::from_le_bytes(want[MIB as usize..MIB as usize + 8].try_into().unwrap()) + 5;
    want[MIB as usize..MIB as usize + 8].copy_from_slice(&w.to_le_bytes());

    // Frozen: nothing executes, and the connection stays usable.
    ha.manager().apply_moves(&[7], &[], Vec::new());
    assert_eq!(ha.manager().move_report().frozen, vec![7]);
    assert_eq!(status(holder.fetch_add(MIB, 1)), Status::Moving);
    assert_eq!(status(holder.compare_swap(MIB, w, 0)), Status::Moving);
    assert_eq!(status(put(&holder, 0, &[9u8; 4096])), Status::Moving);
    assert_eq!(status(get(&holder, 0, 4096)), Status::Moving);

    // The target pulls it whole from the frozen source.
    hb.manager().apply_moves(&[], &[], vec![spec(&s, &a, b"key-b", 40)]);
    let o = outcome(&hb, 40);
    assert_eq!((o.error.as_deref(), o.bytes), (None, size), "{o:?}");
    let t = attach(&b, &issue(b"key-b", 40, 0, size));
    assert!(
        get(&t, 0, size).expect("get") == want,
        "the target holds the source's bytes"
    );
    // Reported until a reply no longer lists the pull; listed again, it is not run again.
    hb.manager().apply_moves(&[], &[], vec![spec(&s, &a, b"key-b", 40)]);
    assert_eq!(hb.manager().move_report().pulls.len(), 1);
    hb.manager().apply_moves(&[], &[], Vec::new());
    assert!(hb.manager().move_report().pulls.is_empty());

    // Moved: still not executed; unfrozen (a move that ended without a switch): served again.
    ha.manager().apply_moves(&[], &[7], Vec::new());
    assert_eq!(status(holder.fetch_add(MIB, 1)), Status::Moved);
    ha.manager().apply_moves(&[], &[], Vec::new());
    assert!(ha.manager().move_report().frozen.is_empty());
    assert_eq!(
        holder.fetch_add(MIB, 0).expect("served again"),
        w,
        "the refused atomics changed nothing"
    );
    assert!(get(&holder, 0, size).expect("get") == want);

    // A source that is gone: the pull fails and says so.
    drop(holder);
    drop(ha);
    hb.manager().apply_moves(&[], &[], vec![spec(&s, &a, b"key-b", 41)]);
    let o = outcome(&hb, 41);
    assert!(o.error.is_some(), "{o:?}");
    println!("a pull from a source that is gone: {}", o.error.unwrap_or_default());
}

/// A segment a process on this host maps cannot be frozen: its stores are the processor's.
#[test]
fn a_mapped_segment_is_reported_unmovable_and_stays_served() {
    let d = tempfile::tempdir().expect("tempdir");
    let (ha, a) = managed(ListenAddr::Unix(d.path().join("a.sock")), b"key-a");
    let s = issue(b"key-a", 9, 0, MIB);
    let holder = attach(&a, &s);
    let _mapping = holder.share().expect("share over a Unix socket");
    ha.manager().apply_moves(&[9], &[], Vec::new());
    let r = ha.manager().move_report();
    assert!(r.frozen.is_empty(), "{r:?}");
    assert_eq!(r.unmovable.len(), 1, "{r:?}");
    assert!(r.unmovable[0].1.contains("maps"), "{r:?}");
    assert_eq!(holder.fetch_add(0, 1).expect("served"), 0);
}
