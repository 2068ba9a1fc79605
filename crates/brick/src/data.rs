//! Data requests on the connection's attached segment (READ, WRITE, DISCARD, POPULATE, COPY,
//! CLONE): each checked against the grant's rights and the segment's bounds, served under the
//! segment's gate so that a release waits for it.

use crate::config::{CLONE_GRACE, CLONE_SPACE_WAIT};
use crate::pool::{in_segment, Gate, GateState, ShareError, CHUNK};
use crate::reply::{err, ok, Reply};
use crate::state::Shared;
use rackmem_proto::{extents_bytes, rights, Request, Status, MAX_PAYLOAD, PAGE_SIZE};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// The segment a connection is bound to.
pub(crate) struct Attached {
    pub(crate) id: u64,
    pub(crate) offset: u64,
    pub(crate) size: u64,
    pub(crate) rights: u8,
    /// Held (read side) while a request touches the segment's memory.
    pub(crate) gate: Gate,
    /// The segment's rate and counters.
    pub(crate) pace: std::sync::Arc<crate::pace::SegmentPace>,
    /// The one range (offset, length) of the segment a pull grant opened, read-only; `None`
    /// for a whole-segment grant.
    pub(crate) only: Option<(u64, u64)>,
}

impl Attached {
    /// True if `[off, off + len)` is inside what the connection may touch: the segment, and
    /// the pull grant's range when it attached with one.
    pub(crate) fn allows(&self, off: u64, len: u64) -> bool {
        let Some(end) = off.checked_add(len) else {
            return false;
        };
        end <= self.size && self.only.is_none_or(|(o, l)| off >= o && end <= o + l)
    }
}

/// Holds a READ or WRITE of `bytes` back until the segment's rate and the brick's total allow
/// it (before the segment's gate is taken, so a release never waits for a paced request).
pub(crate) fn pace(shared: &Shared, attached: Option<&Attached>, bytes: u64) {
    if let Some(a) = attached {
        shared.pacer.pace(&a.pace, bytes, &shared.stop);
    }
}

/// Runs a data operation on the connection's segment: refused before ATTACH, and after the
/// control plane released the segment. The segment's gate is held across the operation, so a
/// release waits for operations in flight.
pub(crate) fn with_segment(attached: Option<&Attached>, op: impl FnOnce(&Attached, &GateState) -> Reply) -> Reply {
    let Some(a) = attached else {
        return err(Status::NotAttached, "ATTACH or ALLOC before data requests", true);
    };
    let mem = a.gate.read().unwrap_or_else(|e| e.into_inner());
    if !mem.alive {
        return err(
            Status::NoSegment,
            format!(
                "segment {} was released by the control plane; ask it for a new allocation",
                a.id
            ),
            true,
        );
    }
    if mem.motion != crate::moving::Motion::Still && a.only.is_none() {
        // A pull's reads (`only`) are how the segment moves; every other request waits.
        return crate::moving::refused(a.id, mem.motion);
    }
    op(a, &mem)
}

pub(crate) fn out_of_range(a: &Attached, o: u64, l: u64) -> Reply {
    err(
        Status::OutOfRange,
        format!("{o:#x}+{l:#x} is outside the segment of {:#x} bytes", a.size),
        true,
    )
}

/// READ into `buf` (a buffer the connection reuses, so large reads touch no fresh memory).
pub(crate) fn read_pages(
    shared: &Shared,
    a: &Attached,
    mem: &GateState,
    ext: &[rackmem_proto::Extent],
    mut buf: Vec<u8>,
) -> Reply {
    if a.rights & rights::READ == 0 {
        return err(Status::Forbidden, "grant does not allow reads", true);
    }
    let total = extents_bytes(ext);
    if total > MAX_PAYLOAD as u64 {
        return err(
            Status::BadRequest,
            format!("{total} bytes exceed the response limit"),
            true,
        );
    }
    if let Some(&(o, l)) = ext
        .iter()
        .find(|&&(o, l)| !in_segment(a.size, o, l as u64) || !a.allows(o, l as u64))
    {
        return out_of_range(a, o, l as u64);
    }
    buf.clear();
    buf.resize(total as usize, 0);
    let mut at = 0usize;
    for &(o, l) in ext {
        shared.store.read(mem, a.offset, o, &mut buf[at..at + l as usize]);
        at += l as usize;
    }
    shared.counters.bytes_read.fetch_add(total, Relaxed);
    ok(buf)
}

/// WRITE of `data` (the extents' bytes, concatenated; length checked by the decoder).
pub(crate) fn write_pages(
    shared: &Shared,
    a: &Attached,
    mem: &GateState,
    ext: &[rackmem_proto::Extent],
    data: &[u8],
) -> Reply {
    if a.rights & rights::WRITE == 0 {
        return err(Status::Forbidden, "grant does not allow writes", true);
    }
    if let Some(&(o, l)) = ext.iter().find(|&&(o, l)| !in_segment(a.size, o, l as u64)) {
        return out_of_range(a, o, l as u64);
    }
    let mut at = 0usize;
    for &(o, l) in ext {
        shared.store.write(mem, a.offset, o, &data[at..at + l as usize]);
        at += l as usize;
    }
    shared.counters.bytes_written.fetch_add(at as u64, Relaxed);
    ok(Vec::new())
}

pub(crate) fn data_op(shared: &Shared, a: &Attached, mem: &GateState, req: Request) -> Reply {
    let store = &shared.store;
    let need = |r: u8| a.rights & r == r;
    let out_of_range = |o: u64, l: u64| {
        err(
            Status::OutOfRange,
            format!("{o:#x}+{l:#x} is outside the segment of {:#x} bytes", a.size),
            true,
        )
    };
    match req {
        Request::Read(ext) => read_pages(shared, a, mem, &ext, Vec::new()),
        Request::Write { extents, data } => write_pages(shared, a, mem, &extents, &data),
        Request::Discard { offset, len } => {
            if !need(rights::WRITE) {
                return err(Status::Forbidden, "grant does not allow writes", true);
            }
            if !in_segment(a.size, offset, len) || len % PAGE_SIZE as u64 != 0 {
                return out_of_range(offset, len);
            }
            match store.discard(mem, a.offset, offset, len) {
                Ok(()) => ok(Vec::new()),
                Err(e) => err(Status::Internal, format!("discarding {offset:#x}+{len:#x}: {e}"), false),
            }
        }
        Request::Unshare { offset, len } => {
            if !need(rights::WRITE) {
                return err(Status::Forbidden, "grant does not allow writes", true);
            }
            if !in_segment(a.size, offset, len) || len % PAGE_SIZE as u64 != 0 {
                return out_of_range(offset, len);
            }
            ok(mem.clones.unshare(offset, len).to_le_bytes().to_vec())
        }
        Request::Populate { offset, len } => {
            if !need(rights::WRITE) {
                return err(Status::Forbidden, "grant does not allow writes", true);
            }
            if !in_segment(a.size, offset, len) || len % PAGE_SIZE as u64 != 0 || offset % PAGE_SIZE as u64 != 0 {
                return out_of_range(offset, len);
            }
            match store.populate(mem, offset, len) {
                Ok(()) => ok(Vec::new()),
                Err(e) => err(Status::Internal, format!("populating {offset:#x}+{len:#x}: {e}"), false),
            }
        }
        Request::Copy { src, dst, len } => {
            if !need(rights::WRITE) {
                return err(Status::Forbidden, "grant does not allow writes", true);
            }
            if !in_segment(a.size, src, len) || !in_segment(a.size, dst, len) {
                return out_of_range(src.max(dst), len);
            }
            let mut buf = vec![0u8; CHUNK as usize];
            // Copy in chunk-sized steps, in the direction that is safe for overlap.
            let steps: Vec<u64> = (0..len.div_ceil(CHUNK)).map(|i| i * CHUNK).collect();
            let order: Box<dyn Iterator<Item = &u64>> = if dst > src {
                Box::new(steps.iter().rev())
            } else {
                Box::new(steps.iter())
            };
            for &s in order {
                let n = (len - s).min(CHUNK) as usize;
                store.read(mem, a.offset, src + s, &mut buf[..n]);
                store.write(mem, a.offset, dst + s, &buf[..n]);
            }
            ok(Vec::new())
        }
        Request::Clone | Request::CloneLazy => {
            let lazy = matches!(req, Request::CloneLazy);
            if !need(rights::CLONE) {
                return err(Status::Forbidden, "grant does not allow clones", true);
            }
            let Some((id, off, _)) =
                store.carve_waiting(a.size, 0, Some(Instant::now() + CLONE_GRACE), CLONE_SPACE_WAIT)
            else {
                return err(
                    Status::NoSpace,
                    format!("no free extent of {} bytes for the clone", a.size),
                    false,
                );
            };
            match &mem.shared {
                // Shared memory has no copy-on-write chunks: the clone gets a copy now, without
                // the pages that are all zeros (holes read as zeros), in a memory file of its
                // own; in the pool if no memory file can be had (the pool reads missing pages
                // as zeros too).
                // A node that maps the segment and asked for a lazy clone: nothing is copied now
                // (see `cow.rs`); it sends UNSHARE before it overwrites a page in its mapping.
                // Released: swept before its grant was even sent; nothing to fill.
                Some(m) if lazy && mem.cow.is_none() => {
                    if let Err(ShareError::Memory(_)) = store.clone_lazy(mem, m, id, a.size) {
                        store.copy_into_pool(m, off, a.size);
                    }
                }
                Some(m) => {
                    // A clone of a lazy clone is a copy of its whole view.
                    if let Some(c) = &mem.cow {
                        c.dissolve();
                    }
                    if let Err(ShareError::Memory(_)) = store.clone_shared(m, id, a.size) {
                        store.copy_into_pool(m, off, a.size);
                    }
                }
                None => store.pool.share(a.offset, off, a.size),
            }
            ok(shared.grant(id, off, a.size).encode())
        }
        _ => err(Status::BadRequest, "unexpected request", true),
    }
}
