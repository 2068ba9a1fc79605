//! The lazily backed, copy-on-write chunked pool and its segment allocator.
//!
//! Segments come from two places: standalone ALLOC and CLONE carve them from the free list
//! ([`Segments::carve`]); a managed brick places them where its control plane's grants say
//! ([`Segments::claim`]). Every segment has a [`Gate`] that its attached connections hold while
//! they touch its memory, so releasing a segment waits for requests in flight and no request can
//! reach memory that a later segment reuses.

use crate::cow::{Clones, CowLink};
use rackmem_proto::PAGE_SIZE;
use rackmem_sys::SharedMemory;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// Allocation granule of the pool and of segments: 1 MiB.
pub const CHUNK: u64 = 1 << 20;

type Chunk = Option<Arc<Vec<u8>>>;

/// Chunks per leaf of the pool's chunk table: a leaf covers 1 GiB and is made when the first
/// chunk in it is written, so an idle pool costs 16 bytes per GiB, not per MiB (an embedded
/// brick of 4 TiB, room for 255 forked children's clones of a 16 GiB window, would otherwise
/// hold 100 MiB of empty slots).
const LEAF: usize = 1024;

/// The pool's bytes: a two-level table of chunks.
pub(crate) struct Pool {
    leaves: Vec<std::sync::OnceLock<Box<[RwLock<Chunk>]>>>,
}

fn lock_r<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}
fn lock_w<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    pub fn new(size: u64) -> Pool {
        let n = size.div_ceil(CHUNK) as usize;
        Pool {
            leaves: (0..n.div_ceil(LEAF)).map(|_| std::sync::OnceLock::new()).collect(),
        }
    }

    /// Chunk `ci`'s slot, if its leaf was ever made (a slot of a leaf never made holds no
    /// chunk: its bytes read as zeros).
    fn slot(&self, ci: usize) -> Option<&RwLock<Chunk>> {
        self.leaves[ci / LEAF].get().map(|l| &l[ci % LEAF])
    }

    /// Chunk `ci`'s slot, its leaf made if needed (for a write).
    fn slot_mut(&self, ci: usize) -> &RwLock<Chunk> {
        &self.leaves[ci / LEAF].get_or_init(|| (0..LEAF).map(|_| RwLock::new(None)).collect())[ci % LEAF]
    }

    /// Calls `f(chunk index, offset in chunk, range in the caller's buffer)` for each chunk piece.
    fn pieces(off: u64, len: usize, mut f: impl FnMut(usize, usize, std::ops::Range<usize>)) {
        let mut done = 0usize;
        while done < len {
            let at = off + done as u64;
            let ci = (at / CHUNK) as usize;
            let co = (at % CHUNK) as usize;
            let n = (CHUNK as usize - co).min(len - done);
            f(ci, co, done..done + n);
            done += n;
        }
    }

    /// Copies `out.len()` bytes at pool offset `off` (bounds checked by the caller).
    pub fn read(&self, off: u64, out: &mut [u8]) {
        Self::pieces(off, out.len(), |ci, co, r| {
            // The copy is made under the chunk's read lock (a clone of the chunk would make a
            // concurrent write copy all of it).
            let g = self.slot(ci).map(lock_r);
            match g.as_deref().and_then(Option::as_ref) {
                Some(c) => out[r.clone()].copy_from_slice(&c[co..co + r.len()]),
                None => out[r].fill(0),
            }
        });
    }

    /// Stores `data` at pool offset `off` (bounds checked by the caller).
    pub fn write(&self, off: u64, data: &[u8]) {
        Self::pieces(off, data.len(), |ci, co, r| {
            let mut g = lock_w(self.slot_mut(ci));
            let c = g.get_or_insert_with(|| Arc::new(vec![0u8; CHUNK as usize]));
            Arc::make_mut(c)[co..co + r.len()].copy_from_slice(&data[r]);
        });
    }

    /// Replaces the little-endian 8-byte word at pool offset `off` (a multiple of 8, bounds
    /// checked by the caller) by `f(old)` and returns `old`, under the write lock of its chunk,
    /// which every other access to the chunk takes too: atomic with respect to all of them.
    pub fn update_u64(&self, off: u64, f: impl FnOnce(u64) -> u64) -> u64 {
        let (ci, co) = ((off / CHUNK) as usize, (off % CHUNK) as usize);
        let mut g = lock_w(self.slot_mut(ci));
        let c = Arc::make_mut(g.get_or_insert_with(|| Arc::new(vec![0u8; CHUNK as usize])));
        let mut w = [0u8; 8];
        w.copy_from_slice(&c[co..co + 8]);
        let old = u64::from_le_bytes(w);
        c[co..co + 8].copy_from_slice(&f(old).to_le_bytes());
        old
    }

    /// Zeroes `[off, off+len)`, dropping whole chunks.
    pub fn discard(&self, off: u64, len: u64) {
        let mut at = off;
        let end = off + len;
        while at < end {
            let ci = (at / CHUNK) as usize;
            let co = at % CHUNK;
            let n = (CHUNK - co).min(end - at);
            if self.leaves[ci / LEAF].get().is_none() {
                // A leaf never made holds no chunk: skip to the next leaf. Releasing a forked
                // child's clone (the window's 16 GiB, never written in the pool when it is a
                // memory file's) looked up 16 384 empty slots one by one: 27 µs a child.
                let next = ((ci / LEAF + 1) * LEAF) as u64 * CHUNK;
                at = next.min(end);
                continue;
            }
            if let Some(slot) = self.slot(ci) {
                let mut g = lock_w(slot);
                if n == CHUNK {
                    *g = None;
                } else if let Some(c) = g.as_mut() {
                    Arc::make_mut(c)[co as usize..(co + n) as usize].fill(0);
                }
            }
            at += n;
        }
    }

    /// Calls `f(position in the range, bytes)` for each piece of `[off, off + len)` that lies in
    /// an allocated chunk (unallocated chunks read as zeros and are skipped).
    pub fn export(&self, off: u64, len: u64, mut f: impl FnMut(usize, &[u8])) {
        Self::pieces(off, len as usize, |ci, co, r| {
            let g = self.slot(ci).map(lock_r);
            if let Some(c) = g.as_deref().and_then(Option::as_ref) {
                f(r.start, &c[co..co + r.len()]);
            }
        });
    }

    /// Makes chunks `[dst, dst+len)` share the chunks of `[src, src+len)` (chunk aligned).
    pub fn share(&self, src: u64, dst: u64, len: u64) {
        for i in 0..(len / CHUNK) as usize {
            let s = self.slot((src / CHUNK) as usize + i).and_then(|s| lock_r(s).clone());
            let d = (dst / CHUNK) as usize + i;
            match (s, self.slot(d)) {
                // Nothing to share into a leaf that holds nothing.
                (None, None) => {}
                (s, _) => *lock_w(self.slot_mut(d)) = s,
            }
        }
    }

    /// Bytes of chunk memory allocated; a chunk shared by clones counts once.
    pub fn resident_bytes(&self) -> u64 {
        let mut seen = std::collections::HashSet::new();
        for leaf in self.leaves.iter().filter_map(std::sync::OnceLock::get) {
            for c in leaf.iter() {
                if let Some(a) = &*lock_r(c) {
                    seen.insert(Arc::as_ptr(a) as usize);
                }
            }
        }
        seen.len() as u64 * CHUNK
    }
}

/// Whether a segment is alive and where its bytes are, shared by the segment and the connections
/// attached to it. Data requests hold the read side for their whole duration; releasing the
/// segment takes the write side, so it waits for them, and marks it dead, which later requests
/// see. Moving the segment into shared memory (SHARE) also takes the write side.
pub(crate) type Gate = Arc<RwLock<GateState>>;

/// What a [`Gate`] guards.
#[derive(Debug)]
pub(crate) struct GateState {
    pub alive: bool,
    /// Set once a node on this host asked to map the segment: from then on its bytes live in
    /// this memory file, not in the pool.
    pub shared: Option<Arc<SharedMemory>>,
    /// Set for a lazy clone (CLONE_LAZY): the pages it still shares with its source.
    pub cow: Option<Arc<CowLink>>,
    /// The lazy clones of this segment, which take its pages before they change.
    pub clones: Clones,
    /// Whether the control plane is moving the segment to another brick (`moving.rs`): while
    /// it is not `Still`, node requests are refused unexecuted.
    pub motion: crate::moving::Motion,
}

impl GateState {
    fn new() -> GateState {
        GateState {
            alive: true,
            shared: None,
            cow: None,
            clones: Clones::default(),
            motion: crate::moving::Motion::Still,
        }
    }
}

/// Who decides when a segment ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lifetime {
    /// Standalone (ALLOC, CLONE): freed when its last connection detaches.
    Connections,
    /// Managed: lives until the control plane stops listing it ([`Store::retain`]), so a node
    /// may reconnect after a network blip and find its data.
    ControlPlane,
}

/// A live segment.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub offset: u64,
    pub size: u64,
    pub attached: u32,
    /// Freed if still unattached at this time (CLONE results waiting for their child).
    pub unattached_deadline: Option<Instant>,
    pub lifetime: Lifetime,
    pub gate: Gate,
    pub created: Instant,
}

impl Segment {
    fn new(offset: u64, size: u64, attached: u32, deadline: Option<Instant>, lifetime: Lifetime) -> Segment {
        Segment {
            offset,
            size,
            attached,
            unattached_deadline: deadline,
            lifetime,
            gate: Arc::new(RwLock::new(GateState::new())),
            created: Instant::now(),
        }
    }
}

/// Why a grant's range cannot become a segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClaimError {
    #[error("segment {id} [{offset:#x}, +{size:#x}) is not a non-empty run of whole pages")]
    Misaligned { id: u64, offset: u64, size: u64 },
    #[error("segment {id} [{offset:#x}, +{size:#x}) lies outside this brick's pool of {usable:#x} bytes")]
    OutsidePool {
        id: u64,
        offset: u64,
        size: u64,
        usable: u64,
    },
    #[error(
        "segment {id} [{offset:#x}, +{size:#x}) overlaps live segment {other} [{other_offset:#x}, +{other_size:#x})"
    )]
    Overlaps {
        id: u64,
        offset: u64,
        size: u64,
        other: u64,
        other_offset: u64,
        other_size: u64,
    },
    #[error("segment {id} [{offset:#x}, +{size:#x}) overlaps a range still being released; retry shortly")]
    Releasing { id: u64, offset: u64, size: u64 },
}

/// Free extents and live segments.
#[derive(Default)]
pub(crate) struct Segments {
    pub free: BTreeMap<u64, u64>,
    pub live: HashMap<u64, Segment>,
    pub next_id: u64,
    /// Bytes of the pool that segments may use (whole chunks).
    pub usable: u64,
}

impl Segments {
    /// Segments of a pool of `size` bytes; ids count up from `first_id` (random per start, so a
    /// grant from an earlier run of a brick with the same key names no segment of this one).
    pub fn new(size: u64, first_id: u64) -> Segments {
        let mut free = BTreeMap::new();
        let usable = size / CHUNK * CHUNK;
        if usable > 0 {
            free.insert(0, usable);
        }
        Segments {
            free,
            live: HashMap::new(),
            next_id: first_id.max(1),
            usable,
        }
    }

    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    /// First fit of `size` rounded up to whole chunks; returns (id, offset, size).
    pub fn carve(&mut self, size: u64, attached: u32, deadline: Option<Instant>) -> Option<(u64, u64, u64)> {
        let size = size.checked_next_multiple_of(CHUNK)?.max(CHUNK);
        let (&start, &len) = self.free.iter().find(|(_, &l)| l >= size)?;
        self.free.remove(&start);
        if len > size {
            self.free.insert(start + size, len - size);
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.live
            .insert(id, Segment::new(start, size, attached, deadline, Lifetime::Connections));
        Some((id, start, size))
    }

    /// Makes `[offset, offset + size)` the managed segment `id` (not yet attached), if that range
    /// is inside the pool and free. The caller has checked that `id` is not live.
    pub fn claim(&mut self, id: u64, offset: u64, size: u64) -> Result<&mut Segment, ClaimError> {
        let page = PAGE_SIZE as u64;
        if size == 0 || offset % page != 0 || size % page != 0 {
            return Err(ClaimError::Misaligned { id, offset, size });
        }
        let end = match offset.checked_add(size) {
            Some(e) if e <= self.usable => e,
            _ => {
                return Err(ClaimError::OutsidePool {
                    id,
                    offset,
                    size,
                    usable: self.usable,
                })
            }
        };
        // The free extent that starts at or before `offset` is the only one that can hold it.
        let holder = self
            .free
            .range(..=offset)
            .next_back()
            .map(|(&s, &l)| (s, l))
            .filter(|&(s, l)| s + l >= end);
        let Some((start, len)) = holder else {
            let other = self
                .live
                .iter()
                .filter(|(_, s)| s.offset < end && offset < s.offset + s.size)
                .min_by_key(|(_, s)| s.offset);
            return Err(match other {
                Some((&other, s)) => ClaimError::Overlaps {
                    id,
                    offset,
                    size,
                    other,
                    other_offset: s.offset,
                    other_size: s.size,
                },
                None => ClaimError::Releasing { id, offset, size },
            });
        };
        self.free.remove(&start);
        if offset > start {
            self.free.insert(start, offset - start);
        }
        if start + len > end {
            self.free.insert(end, start + len - end);
        }
        Ok(self
            .live
            .entry(id)
            .or_insert_with(|| Segment::new(offset, size, 0, None, Lifetime::ControlPlane)))
    }

    /// Returns a range to the free list, coalescing with its neighbours.
    pub fn give_back(&mut self, offset: u64, size: u64) {
        let (mut start, mut len) = (offset, size);
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            if ps + pl == start {
                self.free.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(nl) = self.free.remove(&(start + len)) {
            len += nl;
        }
        self.free.insert(start, len);
    }
}

/// Pool plus segments, shared by all connections.
pub(crate) struct Store {
    pub pool: Pool,
    pub segments: Mutex<Segments>,
    /// Signalled when a segment's range goes back to the free list ([`Store::carve_waiting`]).
    freed: std::sync::Condvar,
}

impl Store {
    pub fn new(size: u64, first_id: u64) -> Store {
        Store {
            pool: Pool::new(size),
            segments: Mutex::new(Segments::new(size, first_id)),
            freed: std::sync::Condvar::new(),
        }
    }

    /// [`Segments::carve`], waiting up to `wait` for a range freed meanwhile when none is free.
    /// A forking server's children that exit give their clones' ranges back only once the
    /// brick has seen both of their connections close; a fork right behind them (PostgreSQL
    /// forks a backend per connection, `pgbench -C`) found the embedded brick's sixteen
    /// window-sized ranges all taken and the child stopped (exit 111).
    pub fn carve_waiting(
        &self,
        size: u64,
        attached: u32,
        deadline: Option<Instant>,
        wait: std::time::Duration,
    ) -> Option<(u64, u64, u64)> {
        let until = Instant::now() + wait;
        let mut segs = self.segs();
        loop {
            if let Some(r) = segs.carve(size, attached, deadline) {
                return Some(r);
            }
            let left = until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
            segs = match self.freed.wait_timeout(segs, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }

    pub fn segs(&self) -> std::sync::MutexGuard<'_, Segments> {
        self.segments.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Frees a segment already removed from `live`: closes its gate (waiting for requests in
    /// flight on it; later ones see it gone), zeroes its memory (so a later tenant never sees
    /// it) and only then returns its range to the free list, so no new segment can be placed
    /// over memory still being cleared.
    pub fn free_removed(&self, seg: Segment) {
        {
            let mut g = lock_w(&seg.gate);
            g.alive = false;
            // Lazy clones of this segment take what they still share; a lazy clone's source
            // stops copying into it.
            g.clones.dissolve_all();
            if let Some(c) = g.cow.take() {
                c.clone_released();
            }
            // Our mapping goes now; the memory goes when the last node that mapped it lets go.
            g.shared = None;
        }
        self.pool.discard(seg.offset, seg.size);
        self.segs().give_back(seg.offset, seg.size);
        self.freed.notify_all();
    }

    /// Drops one attachment of segment `id` (the attachment that holds `gate`: a connection of a
    /// released segment must not count against a later one with the same id); frees a standalone
    /// segment when it was the last one. Managed segments stay.
    pub fn detach(&self, id: u64, gate: &Gate) {
        let removed = {
            let mut segs = self.segs();
            match segs.live.get_mut(&id) {
                Some(s) if Arc::ptr_eq(&s.gate, gate) => {
                    s.attached = s.attached.saturating_sub(1);
                    if s.attached == 0 && s.lifetime == Lifetime::Connections {
                        segs.live.remove(&id)
                    } else {
                        None
                    }
                }
                _ => None,
            }
        };
        if let Some(seg) = removed {
            self.free_removed(seg);
        }
    }

    /// Releases every managed segment created before `listed_at` that `keep` does not list
    /// exactly (id, offset, size), attached or not; returns their ids. Segments created since
    /// `listed_at` may be missing from a list drawn up before they existed, so they are judged
    /// by a later list.
    pub fn retain(&self, keep: &[(u64, u64, u64)], listed_at: Instant) -> Vec<u64> {
        let keep: HashSet<&(u64, u64, u64)> = keep.iter().collect();
        let removed: Vec<(u64, Segment)> = {
            let mut segs = self.segs();
            let ids: Vec<u64> = segs
                .live
                .iter()
                .filter(|(&id, s)| {
                    s.lifetime == Lifetime::ControlPlane
                        && s.created < listed_at
                        && !keep.contains(&(id, s.offset, s.size))
                })
                .map(|(&id, _)| id)
                .collect();
            ids.into_iter()
                .filter_map(|id| segs.live.remove(&id).map(|s| (id, s)))
                .collect()
        };
        removed
            .into_iter()
            .map(|(id, seg)| {
                self.free_removed(seg);
                id
            })
            .collect()
    }

    /// Releases the control-plane segments that overlap `[offset, offset + size)` and are older
    /// than segment `id` (ids from a control plane only grow). A control plane hands a range out
    /// again only after it released the old segment there, so a valid grant for a newer segment
    /// proves the overlapping older ones dead, even if the heartbeat that says so has not come
    /// yet. Newer overlapping segments are left alone (the grant is the stale one). Returns the
    /// released ids.
    pub fn supersede(&self, id: u64, offset: u64, size: u64) -> Vec<u64> {
        let end = offset.saturating_add(size);
        let removed: Vec<(u64, Segment)> = {
            let mut segs = self.segs();
            let page = PAGE_SIZE as u64;
            if size == 0 || offset % page != 0 || size % page != 0 || end > segs.usable {
                // A grant that cannot be placed anyway releases nothing.
                return Vec::new();
            }
            let ids: Vec<u64> = segs
                .live
                .iter()
                .filter(|(&other, s)| {
                    s.lifetime == Lifetime::ControlPlane && other < id && s.offset < end && offset < s.offset + s.size
                })
                .map(|(&other, _)| other)
                .collect();
            ids.into_iter()
                .filter_map(|other| segs.live.remove(&other).map(|s| (other, s)))
                .collect()
        };
        removed
            .into_iter()
            .map(|(other, seg)| {
                self.free_removed(seg);
                other
            })
            .collect()
    }

    /// Frees segments nobody attached before their deadline (clones whose child never came).
    pub fn sweep(&self, now: Instant) {
        let removed: Vec<Segment> = {
            let mut segs = self.segs();
            let ids: Vec<u64> = segs
                .live
                .iter()
                .filter(|(_, s)| s.attached == 0 && s.unattached_deadline.is_some_and(|d| d < now))
                .map(|(&id, _)| id)
                .collect();
            ids.iter().filter_map(|id| segs.live.remove(id)).collect()
        };
        for seg in removed {
            self.free_removed(seg);
        }
    }
}

impl Store {
    /// Reads `out.len()` bytes at `off` of the segment at pool offset `base` (bounds checked by
    /// the caller), from wherever its bytes are.
    pub fn read(&self, mem: &GateState, base: u64, off: u64, out: &mut [u8]) {
        match &mem.shared {
            Some(m) => match &mem.cow {
                Some(c) => c.read(m, off, out),
                None => m.read(off as usize, out),
            },
            None => self.pool.read(base + off, out),
        }
    }

    /// Writes `data` at `off` of the segment at pool offset `base` (bounds checked by the caller).
    pub fn write(&self, mem: &GateState, base: u64, off: u64, data: &[u8]) {
        match &mem.shared {
            Some(m) => {
                mem.clones.unshare(off, data.len() as u64);
                match &mem.cow {
                    Some(c) => c.write(m, off, data),
                    None => m.write(off as usize, data),
                }
            }
            None => self.pool.write(base + off, data),
        }
    }

    /// Zeroes `[off, off + len)` of the segment at pool offset `base` and frees its memory
    /// (page-aligned, bounds checked by the caller).
    pub fn discard(&self, mem: &GateState, base: u64, off: u64, len: u64) -> Result<(), rackmem_sys::SysError> {
        match &mem.shared {
            Some(m) => {
                mem.clones.unshare(off, len);
                match &mem.cow {
                    Some(c) => c.discard(m, off, len),
                    None => m.discard(off as usize, len as usize),
                }
            }
            None => {
                self.pool.discard(base + off, len);
                Ok(())
            }
        }
    }

    /// Makes `[off, off + len)` of a segment in shared memory its own and no lazy clone's
    /// before it changes in place (an atomic on the mapping): lazy clones take what they
    /// share of it, and a lazy clone takes it from its source.
    pub fn before_overwrite(&self, mem: &GateState, off: u64, len: u64) {
        if mem.shared.is_some() {
            mem.clones.unshare(off, len);
            if let Some(c) = &mem.cow {
                c.take_range(off, len);
            }
        }
    }

    /// Gives `[off, off + len)` of a segment memory now (page-aligned, bounds checked by the
    /// caller): a segment in shared memory allocates the pages here, so they are the brick's;
    /// a pool segment has nothing to do (the pool allocates at the first write).
    pub fn populate(&self, mem: &GateState, off: u64, len: u64) -> Result<(), rackmem_sys::SysError> {
        match &mem.shared {
            Some(m) => m.populate(off as usize, len as usize),
            None => Ok(()),
        }
    }

    /// Bytes of memory the pool and the segments moved into shared memory hold.
    pub fn resident_bytes(&self) -> u64 {
        let gates: Vec<Gate> = self.segs().live.values().map(|s| s.gate.clone()).collect();
        let shared: u64 = gates
            .iter()
            .filter_map(|g| lock_r(g).shared.as_ref().map(|m| m.resident_bytes()))
            .sum();
        self.pool.resident_bytes() + shared
    }

    /// Moves segment `id` (`[offset, offset + size)` of the pool, guarded by `gate`) into a
    /// memory file, once, and returns it. Only what the pool holds is copied; the pool's range
    /// is then freed.
    pub fn share(&self, id: u64, gate: &Gate, offset: u64, size: u64) -> Result<Arc<SharedMemory>, ShareError> {
        let mut g = lock_w(gate);
        if !g.alive {
            return Err(ShareError::Released);
        }
        if g.motion != crate::moving::Motion::Still {
            // A mapping would write where the freeze cannot refuse it.
            return Err(ShareError::Moving);
        }
        if let Some(m) = &g.shared {
            // A node maps a lazy clone whole: it reads its own memory from then on.
            if let Some(c) = &g.cow {
                c.dissolve();
            }
            return Ok(m.clone());
        }
        let m = SharedMemory::create(&format!("rackmem-segment-{id}"), size as usize).map_err(ShareError::Memory)?;
        // Pages of zeros stay holes: a chunk is allocated whole, a page of it is written.
        self.pool.export(offset, size, |at, bytes| {
            for (i, p) in nonzero_pages(bytes) {
                m.write(at + i, p);
            }
        });
        self.pool.discard(offset, size);
        let m = Arc::new(m);
        g.shared = Some(m.clone());
        Ok(m)
    }
}

impl Store {
    /// Copies a shared segment of `size` bytes into the pool at `off` (a CLONE of it: shared
    /// memory has no copy-on-write chunks). Only the file's data ranges are read, and only pages
    /// that are not all zeros are written (the pool reads missing pages as zeros).
    pub fn copy_into_pool(&self, m: &SharedMemory, off: u64, size: u64) {
        let mut buf = vec![0u8; CHUNK as usize];
        for (start, end) in m.data_ranges() {
            let end = end.min(size as usize);
            let mut at = start;
            while at < end {
                let n = (end - at).min(CHUNK as usize);
                m.read_file(at, &mut buf[..n]);
                for (i, p) in nonzero_pages(&buf[..n]) {
                    self.pool.write(off + (at + i) as u64, p);
                }
                at += n;
            }
        }
    }
}

impl Store {
    /// Makes the clone `id` (just carved, `size` bytes) of a segment that lives in memory file
    /// `m` a memory file of its own holding a copy of `m`'s data: a node that maps the clone
    /// (SHARE, what a forked child on this host does first) then gets it as it is. Copying into
    /// the pool instead, as [`Store::copy_into_pool`] does, cost a second copy at the child's
    /// SHARE (the pool's pages moved into a memory file): two thirds of a fork's time in the
    /// brick for a 16 MiB segment. Only the file's data ranges are read and only pages that are
    /// not all zeros are written, through the file (no page fault per page here).
    pub fn clone_shared(&self, m: &SharedMemory, id: u64, size: u64) -> Result<(), ShareError> {
        let clone =
            SharedMemory::create(&format!("rackmem-segment-{id}"), size as usize).map_err(ShareError::Memory)?;
        let page = PAGE_SIZE as usize;
        let mut buf = vec![0u8; CHUNK as usize];
        for (start, end) in m.data_ranges() {
            let end = end.min(size as usize);
            let mut at = start;
            while at < end {
                let n = (end - at).min(CHUNK as usize);
                m.read_file(at, &mut buf[..n]);
                // Runs of pages that are not all zeros, each written with one call.
                let mut run: Option<usize> = None;
                for (i, p) in buf[..n].chunks(page).enumerate() {
                    let zero = p.iter().all(|&b| b == 0);
                    match (run, zero) {
                        (None, false) => run = Some(i * page),
                        (Some(r), true) => {
                            clone
                                .write_file(at + r, &buf[r..i * page])
                                .map_err(ShareError::Memory)?;
                            run = None;
                        }
                        _ => {}
                    }
                }
                if let Some(r) = run {
                    clone.write_file(at + r, &buf[r..n]).map_err(ShareError::Memory)?;
                }
                at += n;
            }
        }
        self.with_live_gate(id, |g| g.shared = Some(Arc::new(clone)))
    }

    /// Runs `f` on the gate of live segment `id` under its write lock; `Released` if the
    /// segment went (or is going) away meanwhile.
    fn with_live_gate<R>(&self, id: u64, f: impl FnOnce(&mut GateState) -> R) -> Result<R, ShareError> {
        let gate = match self.segs().live.get(&id) {
            Some(s) => s.gate.clone(),
            None => return Err(ShareError::Released),
        };
        let mut g = lock_w(&gate);
        if !g.alive {
            return Err(ShareError::Released);
        }
        Ok(f(&mut g))
    }
}

impl Store {
    /// Makes the clone `id` (just carved, `size` bytes) of the segment guarded by `source`,
    /// which lives in memory file `m`, a lazy clone: an empty memory file of its own and a
    /// link to its source (see `cow.rs`). Nothing is copied now.
    pub fn clone_lazy(&self, source: &GateState, m: &Arc<SharedMemory>, id: u64, size: u64) -> Result<(), ShareError> {
        let clone = Arc::new(
            SharedMemory::create(&format!("rackmem-segment-{id}"), size as usize).map_err(ShareError::Memory)?,
        );
        self.with_live_gate(id, |g| {
            let link = CowLink::new(m.clone(), clone.clone(), size);
            source.clones.push(link.clone());
            g.shared = Some(clone);
            g.cow = Some(link);
        })
    }
}

/// The pages of `bytes` that are not all zeros, with their byte offsets in `bytes`.
fn nonzero_pages(bytes: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let page = PAGE_SIZE as usize;
    bytes
        .chunks(page)
        .enumerate()
        .filter(|(_, p)| p.iter().any(|&b| b != 0))
        .map(move |(i, p)| (i * page, p))
}

/// Why a segment could not be moved into shared memory.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ShareError {
    #[error("the segment was released")]
    Released,
    #[error("the segment is moving to another brick")]
    Moving,
    #[error("cannot create shared memory for the segment: {0}")]
    Memory(rackmem_sys::SysError),
}

/// Page-aligned extent check against a segment of `size` bytes.
pub(crate) fn in_segment(size: u64, off: u64, len: u64) -> bool {
    off % PAGE_SIZE as u64 == 0 && off.checked_add(len).is_some_and(|e| e <= size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazily_backed_and_cow() {
        let p = Pool::new(8 * CHUNK);
        let mut b = vec![1u8; 4096];
        p.read(0, &mut b);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(p.resident_bytes(), 0);
        p.write(CHUNK - 2048, &[7u8; 4096]);
        assert_eq!(p.resident_bytes(), 2 * CHUNK);
        p.share(0, 4 * CHUNK, 2 * CHUNK);
        assert_eq!(p.resident_bytes(), 2 * CHUNK, "a clone shares its chunks");
        p.write(4 * CHUNK + CHUNK - 2048, &[9u8; 16]);
        let mut a = vec![0u8; 16];
        p.read(CHUNK - 2048, &mut a);
        assert_eq!(a, vec![7u8; 16], "the original must not see the clone's write");
        p.read(4 * CHUNK + CHUNK - 2048, &mut a);
        assert_eq!(a, vec![9u8; 16]);
        p.discard(0, 2 * CHUNK);
        p.read(CHUNK - 2048, &mut a);
        assert_eq!(a, vec![0u8; 16]);
    }

    /// A discard over leaves never made skips them and still zeroes what lies in made ones on
    /// either side, partial chunks included, leaving the bytes just outside the range alone.
    #[test]
    fn a_discard_across_unmade_leaves_zeroes_its_range_only() {
        let leaf = LEAF as u64 * CHUNK;
        let p = Pool::new(4 * leaf);
        let (lo, hi) = (leaf - 4096, 3 * leaf + 4096);
        p.write(lo - 8, &[5u8; 16]);
        p.write(hi - 8, &[6u8; 16]);
        p.write(3 * leaf + CHUNK, &[7u8; 8]);
        p.discard(lo, hi - lo);
        let mut b = [0u8; 16];
        p.read(lo - 8, &mut b);
        assert_eq!(b, [5, 5, 5, 5, 5, 5, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0]);
        p.read(hi - 8, &mut b);
        assert_eq!(b, [0, 0, 0, 0, 0, 0, 0, 0, 6, 6, 6, 6, 6, 6, 6, 6]);
        let mut c = [1u8; 8];
        p.read(3 * leaf + CHUNK, &mut c);
        assert_eq!(c, [7u8; 8], "a chunk past the range keeps its bytes");
        assert!(p.leaves[1].get().is_none() && p.leaves[2].get().is_none());
    }

    #[test]
    fn carve_and_coalesce() {
        let mut s = Segments::new(10 * CHUNK, 1);
        let (a, ao, asz) = s.carve(3 * CHUNK, 1, None).unwrap();
        let (b, bo, bsz) = s.carve(CHUNK + 1, 1, None).unwrap();
        assert_eq!((ao, asz, bo, bsz), (0, 3 * CHUNK, 3 * CHUNK, 2 * CHUNK));
        assert!(s.carve(6 * CHUNK, 1, None).is_none());
        assert!(s.carve(u64::MAX, 1, None).is_none());
        for id in [a, b] {
            let seg = s.live.remove(&id).unwrap();
            s.give_back(seg.offset, seg.size);
        }
        assert_eq!(s.free.len(), 1);
        assert_eq!(s.free_bytes(), 10 * CHUNK);
    }

    #[test]
    fn freed_segments_read_as_zeros_and_unattached_clones_expire() {
        let st = Store::new(4 * CHUNK, 7);
        let (id, off, _) = st.segs().carve(CHUNK, 1, None).unwrap();
        assert_eq!(id, 7);
        st.pool.write(off, &[5u8; 4096]);
        let gate = st.segs().live[&id].gate.clone();
        st.detach(id, &gate);
        assert!(!lock_r(&gate).alive, "a freed segment's gate is closed");
        assert_eq!(st.pool.resident_bytes(), 0);
        assert_eq!(st.segs().free_bytes(), 4 * CHUNK);
        let now = Instant::now();
        let (c, _, _) = st.segs().carve(CHUNK, 0, Some(now)).unwrap();
        st.sweep(now);
        assert!(st.segs().live.contains_key(&c), "not expired yet");
        st.sweep(now + std::time::Duration::from_millis(1));
        assert!(!st.segs().live.contains_key(&c));
        assert_eq!(st.segs().free_bytes(), 4 * CHUNK);
    }

    #[test]
    fn a_clone_waits_for_a_range_being_freed_and_gives_up_when_none_is() {
        let st = Store::new(2 * CHUNK, 1);
        let (a, _, _) = st.segs().carve(CHUNK, 1, None).unwrap();
        let (_, bo, _) = st.segs().carve(CHUNK, 1, None).unwrap();
        let short = std::time::Duration::from_millis(20);
        assert!(st.carve_waiting(CHUNK, 0, None, short).is_none(), "nothing is freed");
        let gate = st.segs().live[&a].gate.clone();
        let got = std::thread::scope(|sc| {
            let waiter = sc.spawn(|| st.carve_waiting(CHUNK, 0, None, std::time::Duration::from_secs(60)));
            std::thread::sleep(short);
            st.detach(a, &gate);
            waiter.join().unwrap()
        });
        let (_, off, size) = got.expect("the range freed meanwhile");
        assert_eq!(size, CHUNK);
        assert_ne!(off, bo, "not the range still in use");
    }

    #[test]
    fn claims_place_segments_exactly_and_refuse_overlaps() {
        let mut s = Segments::new(10 * CHUNK + 4096, 1);
        assert_eq!(s.usable, 10 * CHUNK);
        s.claim(100, 2 * CHUNK, 3 * CHUNK).unwrap();
        assert_eq!(
            s.free.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>(),
            vec![(0, 2 * CHUNK), (5 * CHUNK, 5 * CHUNK)]
        );
        match s.claim(101, 4 * CHUNK, 2 * CHUNK) {
            Err(ClaimError::Overlaps { other: 100, .. }) => {}
            other => panic!("expected an overlap with 100, got {other:?}"),
        }
        assert!(matches!(
            s.claim(102, 0, 3 * CHUNK),
            Err(ClaimError::Overlaps { other: 100, .. })
        ));
        assert!(matches!(
            s.claim(103, 9 * CHUNK, 2 * CHUNK),
            Err(ClaimError::OutsidePool { .. })
        ));
        assert!(matches!(
            s.claim(104, u64::MAX - 4095, 8192),
            Err(ClaimError::OutsidePool { .. })
        ));
        assert!(matches!(s.claim(105, 100, 4096), Err(ClaimError::Misaligned { .. })));
        assert!(matches!(s.claim(106, 0, 0), Err(ClaimError::Misaligned { .. })));
        // Exactly filling the gaps works: edges touch, nothing overlaps.
        s.claim(107, 0, 2 * CHUNK).unwrap();
        s.claim(108, 5 * CHUNK, 5 * CHUNK).unwrap();
        assert_eq!(s.free_bytes(), 0);
        assert_eq!(s.live[&108].lifetime, Lifetime::ControlPlane);
    }

    #[test]
    fn managed_segments_outlive_detach_until_not_retained() {
        let st = Store::new(8 * CHUNK, 1);
        let gate = {
            let mut segs = st.segs();
            let seg = segs.claim(5, CHUNK, CHUNK).unwrap();
            seg.attached += 1;
            seg.gate.clone()
        };
        st.pool.write(CHUNK, &[3u8; 4096]);
        st.detach(5, &gate);
        assert!(
            st.segs().live.contains_key(&5),
            "a managed segment outlives its connections"
        );
        assert!(lock_r(&gate).alive);
        let later = Instant::now() + std::time::Duration::from_secs(1);
        assert!(st.retain(&[(5, CHUNK, CHUNK)], later).is_empty(), "listed: kept");
        let created = st.segs().live[&5].created;
        assert!(st.retain(&[], created).is_empty(), "newer than the list: kept");
        assert_eq!(
            st.retain(&[(5, CHUNK, 2 * CHUNK)], later),
            vec![5],
            "listed otherwise: dropped"
        );
        assert!(!lock_r(&gate).alive, "connections of a released segment see it gone");
        assert_eq!(st.pool.resident_bytes(), 0);
        assert_eq!(st.segs().free_bytes(), 8 * CHUNK);
        assert_eq!(st.segs().free.len(), 1, "the range coalesces back");
    }
}
