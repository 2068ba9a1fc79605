//! One-sided operations on segments that no node maps into a window (issue 24): OPEN of a
//! named segment, PUT and GET of bytes at any offset, and the 8-byte atomics FETCH_ADD and
//! COMPARE_SWAP, executed here.
//!
//! These requests come from programs that call `rackmem_put`/`rackmem_get` themselves, so a bad
//! offset is the program's mistake, not a broken peer: it is refused (`OutOfRange`,
//! `BadRequest`) with the connection kept open, because closing it would detach, and so free,
//! the segment the program still holds.
//!
//! Atomicity: in the pool, an atomic runs under the write lock of the chunk that holds its
//! word, which every other access to that chunk (READ, WRITE, PUT, GET, another atomic) also
//! takes; a segment moved into shared memory (SHARE) is updated with the processor's atomic
//! instructions on the mapping, the same physical memory that nodes on this host update with
//! theirs, so an atomic from a TCP node and one from a node that maps the segment never lose
//! each other's update.

use crate::data::{with_segment, Attached};
use crate::pool::{GateState, Store};
use crate::reply::{err, ok, Reply};
use crate::session::Session;
use crate::state::Shared;
use crate::sync::lock;
use rackmem_proto::{constant_time_eq, rights, Status, MAX_PAYLOAD};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::Instant;

/// Most names registered at once: a brick's table of names is bounded like its other tables
/// (a named segment costs at least a chunk of the pool anyway).
pub(crate) const MAX_NAMES: usize = 4096;

/// Live named segments: name → segment id. An entry whose segment is gone (its last connection
/// detached) is replaced by the next OPEN of that name.
#[derive(Default)]
pub(crate) struct Names {
    ids: Mutex<HashMap<Vec<u8>, u64>>,
}

/// OPEN (standalone mode): checks the shared secret as ALLOC does, then attaches this
/// connection to the live segment named `name`, or carves one of `size_bytes` under that name.
pub(crate) fn open(shared: &Shared, session: &mut Session, name: &[u8], size_bytes: u64, secret: &[u8]) -> Reply {
    if shared.cfg.managed {
        return err(
            Status::Denied,
            "this brick takes its segments from its control plane: OPEN is disabled; \
             ask the control plane for an allocation",
            true,
        );
    }
    if !std::mem::take(&mut session.turn_taken) {
        if let Some(busy) = shared.wait_turn(session.peer) {
            return busy;
        }
    }
    if shared.cfg.secret.as_ref().is_some_and(|s| constant_time_eq(s, secret)) {
        shared.guard.succeeded(session.peer);
    } else {
        shared.guard.failed(session.peer, Instant::now());
        return err(
            Status::Denied,
            "wrong shared secret (or this brick takes grants from a control plane only)",
            true,
        );
    }
    if session.attached.is_some() {
        return err(Status::BadRequest, "connection already attached to a segment", false);
    }
    let shown = String::from_utf8_lossy(name).into_owned();
    // Names first, then segments: the one lock order, so two OPENs of a new name carve once.
    let mut names = lock(&shared.names.ids);
    let mut segs = shared.store.segs();
    if let Some(&id) = names.get(name) {
        if let Some(seg) = segs.live.get_mut(&id) {
            if size_bytes > seg.size {
                return err(
                    Status::Conflict,
                    format!(
                        "segment `{shown}` exists with {} bytes, fewer than the {size_bytes} asked for",
                        seg.size
                    ),
                    false,
                );
            }
            seg.attached += 1;
            seg.unattached_deadline = None;
            let (offset, size, gate) = (seg.offset, seg.size, seg.gate.clone());
            drop(segs);
            drop(names);
            return attach_named(shared, session, id, offset, size, gate);
        }
        names.remove(name);
    }
    if size_bytes == 0 {
        return err(
            Status::NoSegment,
            format!("no segment is named `{shown}` on this brick"),
            false,
        );
    }
    if size_bytes > shared.cfg.size_bytes {
        return err(
            Status::NoSpace,
            format!(
                "cannot carve {size_bytes} bytes from a pool of {}",
                shared.cfg.size_bytes
            ),
            false,
        );
    }
    if names.len() >= MAX_NAMES {
        // Entries of segments that are gone make room first.
        names.retain(|_, id| segs.live.contains_key(id));
        if names.len() >= MAX_NAMES {
            return err(
                Status::NoSpace,
                format!("{MAX_NAMES} named segments are live on this brick already"),
                false,
            );
        }
    }
    let Some((id, offset, size)) = segs.carve(size_bytes, 1, None) else {
        return err(Status::NoSpace, format!("no free extent of {size_bytes} bytes"), false);
    };
    let Some(gate) = segs.live.get(&id).map(|s| s.gate.clone()) else {
        return err(Status::Internal, "a segment carved just now is gone", false);
    };
    names.insert(name.to_vec(), id);
    drop(segs);
    drop(names);
    attach_named(shared, session, id, offset, size, gate)
}

/// Binds the session to named segment `id` with every right, and answers with its grant.
/// Named segments are carved with the shared secret (standalone bricks), which sets no rate.
fn attach_named(
    shared: &Shared,
    session: &mut Session,
    id: u64,
    offset: u64,
    size: u64,
    gate: crate::pool::Gate,
) -> Reply {
    session.attached = Some(Attached {
        id,
        offset,
        size,
        rights: rights::ALL,
        gate,
        pace: crate::pace::SegmentPace::untracked(),
        only: None,
    });
    ok(shared.grant(id, offset, size).encode())
}

/// The refusal of a byte range that is not inside the segment; the connection stays open.
fn outside(a: &Attached, offset: u64, len: u64) -> Reply {
    err(
        Status::OutOfRange,
        format!(
            "{offset:#x}+{len:#x} is outside segment {} of {:#x} bytes",
            a.id, a.size
        ),
        false,
    )
}

fn inside(a: &Attached, offset: u64, len: u64) -> bool {
    a.allows(offset, len)
}

/// PUT: stores `data` at byte `offset` of the connection's segment (straight from the receive
/// buffer).
pub(crate) fn put(shared: &Shared, attached: Option<&Attached>, offset: u64, data: &[u8]) -> Reply {
    with_segment(attached, |a, mem| {
        if a.rights & rights::WRITE == 0 {
            return err(Status::Forbidden, "grant does not allow writes", false);
        }
        if !inside(a, offset, data.len() as u64) {
            return outside(a, offset, data.len() as u64);
        }
        shared.store.write(mem, a.offset, offset, data);
        shared.counters.bytes_written.fetch_add(data.len() as u64, Relaxed);
        ok(Vec::new())
    })
}

/// GET: `len` bytes at byte `offset`, into `buf` (a buffer the connection reuses).
pub(crate) fn get(shared: &Shared, attached: Option<&Attached>, offset: u64, len: u32, mut buf: Vec<u8>) -> Reply {
    with_segment(attached, |a, mem| {
        if a.rights & rights::READ == 0 {
            return err(Status::Forbidden, "grant does not allow reads", false);
        }
        if len > MAX_PAYLOAD {
            return err(
                Status::BadRequest,
                format!("a GET of {len} bytes exceeds the response limit of {MAX_PAYLOAD}"),
                false,
            );
        }
        if !inside(a, offset, u64::from(len)) {
            return outside(a, offset, u64::from(len));
        }
        buf.clear();
        buf.resize(len as usize, 0);
        shared.store.read(mem, a.offset, offset, &mut buf);
        shared.counters.bytes_read.fetch_add(u64::from(len), Relaxed);
        ok(buf)
    })
}

/// Which atomic to run on a word.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Atomic {
    FetchAdd(u64),
    CompareSwap { expected: u64, desired: u64 },
}

impl Atomic {
    fn apply(self, old: u64) -> u64 {
        match self {
            Atomic::FetchAdd(v) => old.wrapping_add(v),
            Atomic::CompareSwap { expected, desired } if old == expected => desired,
            Atomic::CompareSwap { .. } => old,
        }
    }
}

/// FETCH_ADD or COMPARE_SWAP on the word at `offset`; answers with the word's previous value.
pub(crate) fn atomic(shared: &Shared, attached: Option<&Attached>, offset: u64, op: Atomic) -> Reply {
    with_segment(attached, |a, mem| {
        if a.rights & (rights::READ | rights::WRITE) != rights::READ | rights::WRITE {
            return err(
                Status::Forbidden,
                "atomics need a grant that allows reads and writes",
                false,
            );
        }
        if offset % 8 != 0 {
            return err(
                Status::BadRequest,
                format!("atomic word at {offset:#x} is not 8-byte aligned"),
                false,
            );
        }
        if !inside(a, offset, 8) {
            return outside(a, offset, 8);
        }
        shared.store.before_overwrite(mem, offset, 8);
        let old = run_atomic(&shared.store, mem, a.offset, offset, op);
        ok(old.to_le_bytes().to_vec())
    })
}

fn run_atomic(store: &Store, mem: &GateState, base: u64, offset: u64, op: Atomic) -> u64 {
    match (&mem.shared, op) {
        (Some(m), Atomic::FetchAdd(v)) => m.fetch_add_u64(offset as usize, v),
        (Some(m), Atomic::CompareSwap { expected, desired }) => m.compare_swap_u64(offset as usize, expected, desired),
        (None, op) => store.pool.update_u64(base + offset, |old| op.apply(old)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomics_compute_what_they_say() {
        assert_eq!(Atomic::FetchAdd(5).apply(u64::MAX), 4, "wrapping");
        let cas = Atomic::CompareSwap {
            expected: 3,
            desired: 9,
        };
        assert_eq!(cas.apply(3), 9);
        assert_eq!(cas.apply(4), 4);
    }

    #[test]
    fn pool_atomics_from_many_threads_sum_exactly() {
        let st = Store::new(4 * crate::CHUNK, 1);
        let mem = GateState {
            alive: true,
            shared: None,
            cow: None,
            clones: Default::default(),
            motion: Default::default(),
        };
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        run_atomic(&st, &mem, crate::CHUNK, 16, Atomic::FetchAdd(2));
                    }
                });
            }
        });
        assert_eq!(run_atomic(&st, &mem, crate::CHUNK, 16, Atomic::FetchAdd(0)), 80_000);
        let mut w = [0u8; 8];
        st.pool.read(crate::CHUNK + 16, &mut w);
        assert_eq!(u64::from_le_bytes(w), 80_000);
    }
}
