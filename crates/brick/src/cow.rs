//! Lazy clones of a segment in shared memory (CLONE_LAZY).
//!
//! A memory file cannot be cloned copy-on-write, and a CLONE that copied it cost a forked child
//! the copy of its parent's whole remote memory. A lazy clone starts as an empty memory file of
//! its own plus a [`CowLink`] to its source: a page the clone has not made its own is read from
//! the source. A page becomes the clone's own when either side first overwrites it:
//!
//! - the clone's WRITE, DISCARD or atomic takes it (copying the source's page first when the
//!   write covers only part of it);
//! - the source's WRITE, DISCARD, atomic or UNSHARE copies it into the clone before it changes.
//!   A node that maps the source writes it without the brick; it promised, with CLONE_LAZY, to
//!   send UNSHARE (or WRITE over its link) first.
//!
//! Every step is made under the link's lock, so a reader of a shared page never sees the
//! source half overwritten. Releasing the source copies what its live clones still share and
//! ends their links ([`CowLink::dissolve`]); so does a CLONE or SHARE of a lazy clone (the
//! clone of a lazy clone is made of its whole view, eagerly). Pages of the source that are
//! holes read as zeros, as the clone's own holes do, so they are never copied.

use rackmem_sys::SharedMemory;
use std::sync::{Arc, Mutex, MutexGuard};

const PAGE: usize = rackmem_proto::PAGE_SIZE as usize;
const PAGE_SIZE: u64 = PAGE as u64;

/// The tie between a lazy clone and its source.
#[derive(Debug)]
pub(crate) struct CowLink {
    state: Mutex<CowState>,
}

#[derive(Debug)]
struct CowState {
    /// The source's memory file; `None` once the link ended (every page the clone's own or a
    /// zero page in both).
    source: Option<Arc<SharedMemory>>,
    /// The clone's memory file; `None` once the clone was released (nothing to copy into).
    clone: Option<Arc<SharedMemory>>,
    /// One bit per page: set when the page is the clone's own. Zeroed memory (all shared) is
    /// what `vec!` gets from the allocator, untouched until a page is taken.
    own: Vec<u64>,
    pages: usize,
}

impl CowState {
    fn is_own(&self, p: usize) -> bool {
        self.own[p / 64] & (1 << (p % 64)) != 0
    }

    fn set_own(&mut self, p: usize) {
        self.own[p / 64] |= 1 << (p % 64);
    }

    /// Copies page `p` of the source into the clone if both live and the clone does not own
    /// it yet, and makes it the clone's own.
    fn take(&mut self, p: usize, buf: &mut [u8; PAGE]) {
        if p >= self.pages || self.is_own(p) {
            return;
        }
        if let (Some(src), Some(dst)) = (&self.source, &self.clone) {
            src.read(p * PAGE, buf);
            // A page of zeros stays a hole in the clone: it reads as zeros there too.
            if buf.iter().any(|&b| b != 0) {
                dst.write(p * PAGE, buf);
            }
        }
        self.set_own(p);
    }

    /// The pages `[off, off + len)` touches.
    fn page_range(off: u64, len: u64) -> std::ops::Range<usize> {
        let first = (off / PAGE_SIZE) as usize;
        let end = off.saturating_add(len).div_ceil(PAGE_SIZE) as usize;
        first..end.max(first)
    }
}

impl CowLink {
    /// A link from a clone (memory file `clone`, `size` bytes) to the memory file of its source.
    pub fn new(source: Arc<SharedMemory>, clone: Arc<SharedMemory>, size: u64) -> Arc<CowLink> {
        let pages = (size / PAGE_SIZE) as usize;
        Arc::new(CowLink {
            state: Mutex::new(CowState {
                source: Some(source),
                clone: Some(clone),
                own: vec![0u64; pages.div_ceil(64)],
                pages,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, CowState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True while the clone lives and still shares pages with its source.
    #[cfg(test)]
    pub fn live(&self) -> bool {
        let s = self.lock();
        s.source.is_some() && s.clone.is_some()
    }

    /// The clone's read of `out.len()` bytes at `off` (bounds checked by the caller): each page
    /// from the clone if it owns it, else from the source.
    pub fn read(&self, clone: &SharedMemory, off: u64, out: &mut [u8]) {
        let s = self.lock();
        let mut at = 0usize;
        while at < out.len() {
            let o = off + at as u64;
            let p = (o / PAGE_SIZE) as usize;
            let n = (PAGE - (o % PAGE_SIZE) as usize).min(out.len() - at);
            match &s.source {
                Some(src) if !s.is_own(p) => src.read(o as usize, &mut out[at..at + n]),
                _ => clone.read(o as usize, &mut out[at..at + n]),
            }
            at += n;
        }
    }

    /// Makes the clone's pages `[off, off + len)` its own before the clone overwrites them:
    /// `whole` pages (covered entirely by the write to come) are taken without a copy.
    /// Returns the guard, so the write that follows is made under it.
    fn take_for_write(&self, off: u64, len: u64) -> MutexGuard<'_, CowState> {
        let mut s = self.lock();
        let mut buf = [0u8; PAGE];
        for p in CowState::page_range(off, len) {
            let start = p as u64 * PAGE_SIZE;
            let whole = start >= off && start + PAGE_SIZE <= off + len;
            if whole {
                if p < s.pages {
                    s.set_own(p);
                }
            } else {
                s.take(p, &mut buf);
            }
        }
        s
    }

    /// The clone's write of `data` at `off` (bounds checked by the caller).
    pub fn write(&self, clone: &SharedMemory, off: u64, data: &[u8]) {
        let _s = self.take_for_write(off, data.len() as u64);
        clone.write(off as usize, data);
    }

    /// The clone's discard of `[off, off + len)` (page-aligned, bounds checked by the caller).
    pub fn discard(&self, clone: &SharedMemory, off: u64, len: u64) -> Result<(), rackmem_sys::SysError> {
        let _s = self.take_for_write(off, len);
        clone.discard(off as usize, len as usize)
    }

    /// Makes `[off, off + len)` the clone's own, copying what it shares (before an atomic on
    /// the clone's mapping).
    pub fn take_range(&self, off: u64, len: u64) {
        let mut s = self.lock();
        let mut buf = [0u8; PAGE];
        for p in CowState::page_range(off, len) {
            s.take(p, &mut buf);
        }
    }

    /// The source is about to change `[off, off + len)`: the clone takes what it still shares
    /// there. Returns whether the link still lives.
    pub fn unshare(&self, off: u64, len: u64) -> bool {
        let mut s = self.lock();
        if s.source.is_none() || s.clone.is_none() {
            return false;
        }
        let mut buf = [0u8; PAGE];
        for p in CowState::page_range(off, len) {
            s.take(p, &mut buf);
        }
        true
    }

    /// Ends the link: the clone takes every page of the source's data it still shares (the
    /// source's holes read as zeros in the clone too) and reads only its own memory from then
    /// on. For the release of the source, and before the clone is cloned or mapped whole.
    pub fn dissolve(&self) {
        let mut s = self.lock();
        let Some(src) = s.source.clone() else {
            return;
        };
        if s.clone.is_some() {
            let mut buf = [0u8; PAGE];
            for (start, end) in src.data_ranges() {
                for p in start / PAGE..end.div_ceil(PAGE) {
                    s.take(p, &mut buf);
                }
            }
        }
        s.source = None;
    }

    /// The clone was released: its source stops copying into it.
    pub fn clone_released(&self) {
        let mut s = self.lock();
        s.clone = None;
        s.source = None;
    }
}

/// The lazy clones of one source segment.
#[derive(Debug, Default)]
pub(crate) struct Clones(Mutex<Vec<Arc<CowLink>>>);

impl Clones {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<CowLink>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn push(&self, link: Arc<CowLink>) {
        self.lock().push(link);
    }

    /// Each live clone takes what it still shares of `[off, off + len)`; ended links are
    /// dropped. Returns the clones still live.
    pub fn unshare(&self, off: u64, len: u64) -> u64 {
        let mut v = self.lock();
        if v.is_empty() {
            return 0;
        }
        v.retain(|c| c.unshare(off, len));
        v.len() as u64
    }

    /// Ends every link (the source is released).
    pub fn dissolve_all(&self) {
        for c in std::mem::take(&mut *self.lock()) {
            c.dissolve();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(pages: usize) -> Arc<SharedMemory> {
        Arc::new(SharedMemory::create("rackmem-cow-test", pages * PAGE).expect("memfd"))
    }

    fn page_of(m: &SharedMemory, link: Option<&CowLink>, p: usize) -> Vec<u8> {
        let mut out = vec![0u8; PAGE];
        match link {
            Some(l) => l.read(m, (p * PAGE) as u64, &mut out),
            None => m.read(p * PAGE, &mut out),
        }
        out
    }

    #[test]
    fn each_side_keeps_its_fork_time_values() {
        let src = file(8);
        for p in 0..6 {
            src.write(p * PAGE, &[p as u8 + 1; PAGE]);
        }
        let clone = file(8);
        let link = CowLink::new(src.clone(), clone.clone(), (8 * PAGE) as u64);
        let clones = Clones::default();
        clones.push(link.clone());
        assert_eq!(
            page_of(&clone, Some(&link), 2),
            vec![3u8; PAGE],
            "shared page read from the source"
        );
        // The source overwrites pages 1 and 2 after an UNSHARE.
        assert_eq!(clones.unshare(PAGE as u64, 2 * PAGE as u64), 1);
        src.write(PAGE, &[0xaa; 2 * PAGE]);
        assert_eq!(page_of(&clone, Some(&link), 1), vec![2u8; PAGE]);
        assert_eq!(page_of(&clone, Some(&link), 2), vec![3u8; PAGE]);
        // The clone writes half of page 3 and all of page 4.
        link.write(&clone, (3 * PAGE) as u64, &[0xcc; PAGE / 2]);
        link.write(&clone, (4 * PAGE) as u64, &[0xdd; PAGE]);
        let p3 = page_of(&clone, Some(&link), 3);
        assert_eq!(&p3[..PAGE / 2], &[0xcc; PAGE / 2][..]);
        assert_eq!(
            &p3[PAGE / 2..],
            &[4u8; PAGE / 2][..],
            "the rest of the page is the source's"
        );
        assert_eq!(
            page_of(&src, None, 3),
            vec![4u8; PAGE],
            "the source never sees the clone's write"
        );
        assert_eq!(page_of(&src, None, 4), vec![5u8; PAGE]);
        // The source is released: the clone keeps every value.
        clones.dissolve_all();
        assert!(!link.live());
        src.write(0, &[0xee; 6 * PAGE]);
        let want: [u8; 6] = [1, 2, 3, 0, 0xdd, 6];
        for (p, &w) in want.iter().enumerate().filter(|&(p, _)| p != 3) {
            assert_eq!(page_of(&clone, Some(&link), p), vec![w; PAGE], "page {p}");
        }
        assert_eq!(page_of(&clone, Some(&link), 7), vec![0u8; PAGE], "a hole stays zeros");
    }

    #[test]
    fn a_released_clone_is_dropped_and_ranges_past_the_end_are_ignored() {
        let src = file(2);
        let clone = file(2);
        let link = CowLink::new(src.clone(), clone.clone(), (2 * PAGE) as u64);
        let clones = Clones::default();
        clones.push(link.clone());
        assert_eq!(clones.unshare(0, 64 * PAGE as u64), 1, "pages past the end are skipped");
        link.clone_released();
        assert_eq!(clones.unshare(0, PAGE as u64), 0);
    }
}
