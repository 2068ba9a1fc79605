//! The segment table: which segment, brick and links back each page of the window.
//!
//! REMAP (seed 000, section III) keeps a Segment Table from local ranges to remote offsets and
//! link ids; this is its software form. The window is the concatenation of segments in the order
//! they were attached. Standalone, that is one segment per brick, carved at start. With an agent,
//! the table grows while the program runs (seed 000, section IV: memory attached on demand) and
//! its trailing segments are returned when the program's allocations no longer reach them.
//!
//! Lookups run on every fetch and write-back while a program thread may be attaching a segment,
//! so the table is a fixed array of slots published with an atomic count: a lookup is a binary
//! search over atomics and never waits for an attach in progress.
//!
//! A migration (`migrate.rs`) moves a window range to a segment that is not the one the
//! concatenation gives it: such *moved* ranges are kept in a map consulted before the binary
//! search, only once a migration has happened (a flag read first, so programs that never
//! migrate pay one atomic load per lookup). Segments attached for migrations are pushed after
//! the window's own, so the concatenation places them past the window's end, where no window
//! page reaches them except through the moved map.

use crate::config::ShareChoice;
use crate::ratelimit::RateLimiter;
use rackmem_proto::{Extent, Grant};
use rackmem_sys::SharedMemory;
use rackmem_transport::{BrickAddr, Link, LinkError};
use rangemap::RangeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

/// Most segments one process can attach.
pub const MAX_SEGMENTS: usize = 1024;

/// One attached segment: a window range backed by a range of one brick's pool, with the links
/// that reach it (one for faults, one for write-back, so a long write never delays a fault).
pub struct Segment {
    /// First window page backed by this segment.
    pub first_page: u64,
    /// Pages in the segment.
    pub pages: u64,
    /// The brick's address.
    pub addr: BrickAddr,
    /// The grant for the segment (offsets in requests are relative to it).
    pub grant: Grant,
    /// The grant's session key: a direct migration delegates a read of part of the segment
    /// with it ([`PullGrant`](rackmem_proto::PullGrant)); it never leaves this process.
    pub session_key: [u8; rackmem_proto::KEY_LEN],
    /// Link for faults.
    pub fault: Link,
    /// Link for write-back, made when first used in a forked child ([`Segment::writeback`]).
    pub writeback: WritebackLink,
    /// The agent's allocation this segment belongs to (none when standalone).
    pub allocation: Option<u64>,
    /// The link's rate limit (unlimited when standalone).
    pub limiter: RateLimiter,
    /// The segment mapped into this process, for a brick on this host (`RACKMEM_SHARED_MEMORY`):
    /// reads and writes are memory copies, and the links only carry discards and clones. Set
    /// once: at the attach, or for a forked child's lazy clone once it fetched enough pages
    /// over its link ([`Segment::fetched_over_link`]).
    pub shared: OnceLock<SharedMemory>,
    /// Pages a forked child's lazy clone (reached over the link, since mapping it makes the
    /// brick copy everything it still shares) may fetch before it is mapped after all; 0: never.
    pub share_after: AtomicU64,
    /// Set once a forked child's lazy clone of this mapped segment was made (CLONE_LAZY) and
    /// until the brick says none lives: the brick must copy a page a clone still shares before
    /// this process overwrites it, so writes go over the write-back link, where the brick does
    /// that, instead of into the mapping.
    pub lazy_clones: AtomicBool,
}

/// A segment's write-back link, or what it takes to make it. A forked child makes its link at
/// its first write-back, discard or pull, not at its start: most children of a forking server
/// never write back (a PostgreSQL backend serving one connection evicted nothing in 600 of
/// 601), and a link costs every fork a connection, a HELLO and an ATTACH, and the brick a
/// connection thread (a fifth of a fork's CPU time with `fork_many`). The clone stays attached
/// meanwhile by the fault link, which the child makes at once.
pub struct WritebackLink {
    link: OnceLock<Link>,
    /// The brick's timeout and TLS trust, for a link made later.
    timeout: std::time::Duration,
    tls: Option<rackmem_transport::TlsClient>,
    /// Held while the link is being made, so that two threads make one.
    making: Mutex<()>,
}

impl WritebackLink {
    /// A link made already (a segment attached at start, grown or migrated to).
    pub fn ready(link: Link, cfg: &crate::config::Config) -> WritebackLink {
        let w = WritebackLink::later(cfg);
        let _ = w.link.set(link);
        w
    }

    /// A link made at its first use (a forked child's).
    pub fn later(cfg: &crate::config::Config) -> WritebackLink {
        WritebackLink {
            link: OnceLock::new(),
            timeout: cfg.timeout,
            tls: cfg.tls.clone(),
            making: Mutex::new(()),
        }
    }

    /// The link, if it was made.
    pub fn made(&self) -> Option<&Link> {
        self.link.get()
    }

    /// The descriptors of the link, if it was made.
    pub fn raw_fds(&self) -> Vec<std::os::fd::RawFd> {
        self.link.get().map(Link::raw_fds).unwrap_or_default()
    }
}

impl Segment {
    /// The write-back link, connected to the brick and attached to this segment at its first
    /// use (see [`WritebackLink`]).
    pub fn writeback(&self) -> Result<&Link, LinkError> {
        if let Some(l) = self.writeback.link.get() {
            return Ok(l);
        }
        let _making = self.writeback.making.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = self.writeback.link.get() {
            return Ok(l);
        }
        let link = Link::connect_with(&self.addr, self.writeback.timeout, self.writeback.tls.as_ref())?;
        link.attach(&self.grant, &self.session_key)?;
        Ok(self.writeback.link.get_or_init(|| link))
    }

    /// The mapping, if this process may overwrite pages through it now (no lazy clone of the
    /// segment may still share them).
    pub fn mapped_for_overwrite(&self) -> Option<&SharedMemory> {
        self.shared.get().filter(|_| !self.lazy_clones.load(Ordering::Acquire))
    }

    /// `pages` were fetched over the link. A lazy clone that has fetched [`SHARE_AFTER_PAGES`]
    /// is mapped (SHARE; the brick first copies what it still shares with its source): a child
    /// that keeps faulting then reads by memory copy, as its parent does, while one that exits
    /// soon (a fork and exec, a short connection) never pays the copy. If the brick cannot share
    /// it, the link goes on.
    pub fn fetched_over_link(&self, pages: u64) {
        let crossed = self
            .share_after
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| {
                (l > 0).then_some(l.saturating_sub(pages))
            })
            .is_ok_and(|prev| prev <= pages);
        if crossed && self.shared.get().is_none() {
            if let Ok(m) = self.fault.share() {
                let _ = self.shared.set(m);
            }
        }
    }

    /// After writes that went over the link because of lazy clones: asks the brick whether any
    /// still lives, and writes into the mapping again once none does.
    pub fn check_lazy_clones(&self) {
        if self.lazy_clones.load(Ordering::Acquire) && matches!(self.writeback().and_then(|l| l.unshare(0, 0)), Ok(0)) {
            self.lazy_clones.store(false, Ordering::Release);
        }
    }

    /// Reads `extents` (offsets within the segment) into `out`, their bytes concatenated.
    pub fn read(&self, extents: &[Extent], out: &mut [u8]) -> Result<(), LinkError> {
        let Some(m) = self.shared.get() else {
            return self.fault.read_pages(extents, out);
        };
        let mut at = 0;
        for &(off, len) in extents {
            let len = len as usize;
            m.read(off as usize, &mut out[at..at + len]);
            at += len;
        }
        Ok(())
    }

    /// Writes `data` (the extents' bytes, concatenated) to `extents`, on the write-back link or
    /// into the mapped segment.
    ///
    /// `fresh`: the brick holds no memory for these pages yet (never written back, or discarded
    /// since). They go over the link even when the segment is mapped, so that the brick, not
    /// this process, first touches their memory: Linux charges a page of shared memory to the
    /// memory cgroup of whoever touches it first, and a program confined to its local budget by
    /// a cgroup must not be charged for the brick's memory.
    pub fn write(&self, extents: &[Extent], data: &[u8], fresh: bool) -> Result<(), LinkError> {
        let Some(m) = self.mapped_for_overwrite().filter(|_| !fresh) else {
            return self.writeback()?.write_pages(extents, data);
        };
        let mut at = 0;
        for &(off, len) in extents {
            let len = len as usize;
            m.write(off as usize, &data[at..at + len]);
            at += len;
        }
        Ok(())
    }
}

/// A standalone segment `seg` that `fault` carved on `addr`: opens and attaches its write-back
/// link, maps it where `cfg` allows, and returns its size in pages and the segment for
/// [`SegmentTable::push`] to place at its first window page. One place for start-up and
/// migration targets.
pub(crate) fn standalone(
    addr: BrickAddr,
    seg: rackmem_proto::SegmentGrant,
    fault: Link,
    cfg: &crate::config::Config,
) -> Result<(u64, impl FnOnce(u64) -> Segment), LinkError> {
    let writeback = Link::connect_with(&addr, cfg.timeout, cfg.tls.as_ref())?;
    writeback.attach(&seg.grant, &seg.session_key)?;
    let writeback = WritebackLink::ready(writeback, cfg);
    fault.set_receive_spin(cfg.link_spin);
    let shared = share_if(cfg.shared_memory, &fault)?;
    let pages = seg.grant.size_bytes / crate::PAGE;
    Ok((pages, move |first_page| Segment {
        first_page,
        pages,
        addr,
        grant: seg.grant,
        session_key: seg.session_key,
        fault,
        writeback,
        allocation: None,
        limiter: RateLimiter::new(0),
        shared: mapped(shared),
        share_after: AtomicU64::new(0),
        lazy_clones: AtomicBool::new(false),
    }))
}

/// Pages a forked child fetches from its lazy clone over the link before it maps the clone
/// (see [`Segment::fetched_over_link`]): 2 MiB, a few milliseconds over the link, about what
/// mapping costs in copying for a parent of a few MiB remote, and more than a short-lived child
/// fetches (a PostgreSQL backend of one connection took a median of 43 faults).
pub const SHARE_AFTER_PAGES: u64 = 512;

/// A segment's mapping slot, set when `m` is.
pub fn mapped(m: Option<SharedMemory>) -> OnceLock<SharedMemory> {
    let slot = OnceLock::new();
    if let Some(m) = m {
        let _ = slot.set(m);
    }
    slot
}

/// Maps the segment `fault` is attached to, if `choice` allows and the brick is on this host.
/// Under [`ShareChoice::Auto`] a brick that cannot share (refuses, or its memory cannot be
/// mapped) keeps its link: the default must never stop a program that would run without it.
pub fn share_if(choice: ShareChoice, fault: &Link) -> Result<Option<SharedMemory>, LinkError> {
    match fault.addr() {
        BrickAddr::Unix(_) if choice == ShareChoice::Always => fault.share().map(Some),
        BrickAddr::Unix(_) if choice == ShareChoice::Auto => match fault.share() {
            Ok(m) => Ok(Some(m)),
            // A link that failed for good fails again at the first fault, with the brick named.
            Err(e @ LinkError::BrickLost { .. }) => Err(e),
            Err(_) => Ok(None),
        },
        _ => Ok(None),
    }
}

/// Window page → segment; see the module documentation.
pub struct SegmentTable {
    slots: Box<[RwLock<Option<Arc<Segment>>>]>,
    /// End page (exclusive) of each published slot.
    ends: Box<[AtomicU64]>,
    count: AtomicUsize,
    /// Serialises attaching and detaching (lookups never take it).
    change: Mutex<()>,
    /// Set once any range has moved (then lookups read `moved`).
    any_moved: AtomicBool,
    /// Window pages moved off their concatenation place → (segment index, distance from the
    /// window page to its page in that segment, wrapping).
    moved: RwLock<RangeMap<u64, (usize, u64)>>,
}

impl Default for SegmentTable {
    fn default() -> Self {
        SegmentTable {
            slots: (0..MAX_SEGMENTS).map(|_| RwLock::new(None)).collect(),
            ends: (0..MAX_SEGMENTS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicUsize::new(0),
            change: Mutex::new(()),
            any_moved: AtomicBool::new(false),
            moved: RwLock::new(RangeMap::new()),
        }
    }
}

impl SegmentTable {
    /// Held while attaching or detaching segments, so that two threads growing the window do
    /// not both ask for memory.
    pub fn change_lock(&self) -> MutexGuard<'_, ()> {
        self.change.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Segments attached.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// True when no segment is attached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pages covered by all segments.
    pub fn total_pages(&self) -> u64 {
        match self.len() {
            0 => 0,
            n => self.ends[n - 1].load(Ordering::Acquire),
        }
    }

    /// Appends a segment of `pages` pages right after the last one; `make` builds it given its
    /// first window page. Returns the new segment's index, or `None` if the table is full.
    pub fn push(&self, pages: u64, make: impl FnOnce(u64) -> Segment) -> Option<usize> {
        let n = self.len();
        if n >= MAX_SEGMENTS {
            return None;
        }
        let first = self.total_pages();
        let seg = make(first);
        debug_assert_eq!((seg.first_page, seg.pages), (first, pages));
        *self.slots[n].write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(seg));
        self.ends[n].store(first + pages, Ordering::Release);
        self.count.store(n + 1, Ordering::Release);
        Some(n)
    }

    /// Appends a segment of `pages` pages that takes no window pages in the concatenation: a
    /// migration target on memory that grows (the node agent's), where a segment pushed into
    /// the concatenation would back the window pages the next allocation takes. Only moved
    /// ranges ([`SegmentTable::set_home`]) reach it. Returns its index, or `None` if full.
    pub fn push_aside(&self, pages: u64, make: impl FnOnce(u64) -> Segment) -> Option<usize> {
        let n = self.len();
        if n >= MAX_SEGMENTS {
            return None;
        }
        let first = self.total_pages();
        let seg = make(first);
        debug_assert_eq!((seg.first_page, seg.pages), (first, pages));
        *self.slots[n].write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(seg));
        self.ends[n].store(first, Ordering::Release);
        self.count.store(n + 1, Ordering::Release);
        Some(n)
    }

    /// Whether segment `index` was pushed aside ([`SegmentTable::push_aside`]).
    pub fn is_aside(&self, index: usize) -> bool {
        self.bounds(index).is_some_and(|(first, end)| first == end)
    }

    /// Takes segment `index` out of the table, wherever it is, and returns it: a segment a
    /// drain emptied (no window page has its home there any more: see
    /// [`SegmentTable::homes_on`]). Its slot stays, empty, with its place in the concatenation,
    /// so the indices of the others do not change: lookups never reach it (its window pages are
    /// all moved ranges) and `get` answers `None`. Empty slots at the end are popped as any.
    pub fn retire(&self, index: usize) -> Option<Arc<Segment>> {
        if index >= self.len() {
            return None;
        }
        self.slots[index].write().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Whether slot `index` was emptied by [`SegmentTable::retire`].
    pub fn is_retired(&self, index: usize) -> bool {
        index < self.len() && self.slots[index].read().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// The index of the attached segment whose grant names control-plane segment `id`.
    pub fn index_of(&self, id: u64) -> Option<usize> {
        (0..self.len()).find(|&i| self.get(i).is_some_and(|s| s.grant.segment_id == id))
    }

    /// The window ranges whose home is segment `index` now, each with the segment page its
    /// first page lies at: the pages the concatenation gives it that have not moved away, and
    /// the moved ranges that point at it. A drain moves exactly these.
    pub fn homes_on(&self, index: usize) -> Vec<(Range<u64>, u64)> {
        let mut out = Vec::new();
        let Some((first, end)) = self.bounds(index) else {
            return out;
        };
        let m = self.moved.read().unwrap_or_else(|e| e.into_inner());
        let mut at = first;
        for (r, _) in m.overlapping(first..end) {
            if r.start > at {
                out.push((at..r.start, at - first));
            }
            at = at.max(r.end);
        }
        if at < end {
            out.push((at..end, at - first));
        }
        for (r, &(i, d)) in m.iter() {
            if i == index {
                out.push((r.clone(), r.start.wrapping_add(d)));
            }
        }
        out
    }

    /// Detaches the last segment and returns it.
    pub fn pop(&self) -> Option<Arc<Segment>> {
        let n = self.len();
        if n == 0 {
            return None;
        }
        self.count.store(n - 1, Ordering::Release);
        self.slots[n - 1].write().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The segment at `index`.
    pub fn get(&self, index: usize) -> Option<Arc<Segment>> {
        if index >= self.len() {
            return None;
        }
        self.slots[index].read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every attached segment, in window order.
    pub fn all(&self) -> Vec<Arc<Segment>> {
        (0..self.len()).filter_map(|i| self.get(i)).collect()
    }

    /// Window pages `pages` now live in segment `index` from its page `seg_page` on (a
    /// migration's Finalize step; the caller holds the core's lock, so no fault plans around
    /// it).
    pub fn set_home(&self, pages: Range<u64>, index: usize, seg_page: u64) {
        if pages.is_empty() {
            return;
        }
        let mut m = self.moved.write().unwrap_or_else(|e| e.into_inner());
        match self.concatenated(pages.start) {
            // Back where the concatenation puts it: no longer moved.
            Some((i, off)) if i == index && off / crate::PAGE_SIZE as u64 == seg_page => m.remove(pages),
            _ => m.insert(pages.clone(), (index, seg_page.wrapping_sub(pages.start))),
        }
        self.any_moved.store(true, Ordering::Release);
    }

    /// The moved range holding `page`, if any: its end, segment and distance.
    fn moved_at(&self, page: u64) -> Option<(u64, usize, u64)> {
        if !self.any_moved.load(Ordering::Acquire) {
            return None;
        }
        let m = self.moved.read().unwrap_or_else(|e| e.into_inner());
        m.get_key_value(&page).map(|(r, &(i, d))| (r.end, i, d))
    }

    /// The first moved page in `[page, end)`, or `end`.
    fn next_moved(&self, page: u64, end: u64) -> u64 {
        if !self.any_moved.load(Ordering::Acquire) || page >= end {
            return end;
        }
        let m = self.moved.read().unwrap_or_else(|e| e.into_inner());
        m.overlapping(page..end).next().map_or(end, |(r, _)| r.start.max(page))
    }

    /// The segment index and byte offset within it that back window page `page`, and the end
    /// (exclusive) of the window range from `page` that lies contiguously in that segment.
    pub fn lookup_run(&self, page: u64) -> Option<(usize, u64, u64)> {
        if let Some((end, index, d)) = self.moved_at(page) {
            return Some((index, page.wrapping_add(d) * crate::PAGE_SIZE as u64, end));
        }
        let (index, off) = self.concatenated(page)?;
        let (_, seg_end) = self.bounds(index)?;
        Some((index, off, self.next_moved(page, seg_end)))
    }

    /// The segment index and byte offset within it that back window page `page`.
    pub fn lookup(&self, page: u64) -> Option<(usize, u64)> {
        if let Some((_, index, d)) = self.moved_at(page) {
            return Some((index, page.wrapping_add(d) * crate::PAGE_SIZE as u64));
        }
        self.concatenated(page)
    }

    /// Copies the moved ranges of `parent` (a forked child's table, whose segments are clones
    /// of the parent's in the same order).
    pub fn copy_moved_from(&self, parent: &SegmentTable) {
        if !parent.any_moved.load(Ordering::Acquire) {
            return;
        }
        let m = parent.moved.read().unwrap_or_else(|e| e.into_inner()).clone();
        *self.moved.write().unwrap_or_else(|e| e.into_inner()) = m;
        self.any_moved.store(true, Ordering::Release);
    }

    /// Where the concatenation of segments places window page `page`.
    pub fn concatenated(&self, page: u64) -> Option<(usize, u64)> {
        let n = self.len();
        let (mut lo, mut hi) = (0usize, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.ends[mid].load(Ordering::Acquire) <= page {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo >= n {
            return None;
        }
        let first = if lo == 0 {
            0
        } else {
            self.ends[lo - 1].load(Ordering::Acquire)
        };
        Some((lo, (page - first) * crate::PAGE_SIZE as u64))
    }

    /// For each page of `[page, page + n)`, whether its segment is mapped into this process
    /// (pages without a segment count as not mapped).
    pub fn mapped_pages(&self, page: u64, n: usize, out: &mut Vec<bool>) {
        out.clear();
        let end = page + n as u64;
        let mut p = page;
        while p < end {
            let Some((index, _, seg_end)) = self.lookup_run(p) else {
                out.resize(n, false);
                return;
            };
            let seg_end = seg_end.min(end);
            let mapped = self.get(index).is_some_and(|s| s.shared.get().is_some());
            out.resize(out.len() + (seg_end - p) as usize, mapped);
            p = seg_end;
        }
    }

    /// The window pages `[first, end)` the concatenation gives segment `index` (moved ranges
    /// aside: use [`SegmentTable::lookup_run`] for where a range really lies).
    pub fn bounds(&self, index: usize) -> Option<(u64, u64)> {
        if index >= self.len() {
            return None;
        }
        let first = if index == 0 {
            0
        } else {
            self.ends[index - 1].load(Ordering::Acquire)
        };
        Some((first, self.ends[index].load(Ordering::Acquire)))
    }
}
