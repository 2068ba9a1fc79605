//! A lazily forked child tells its parent which of the parent's remote pages it had to fetch, and
//! the parent takes them back into its local buffer, so that its next children inherit them
//! resident instead of each fetching them again.
//!
//! Why: a child's reads of pages it inherited resident are invisible to the parent (the kernel
//! serves them from the copy-on-write mapping), so a parent that forks a lot and does little
//! else (PostgreSQL's postmaster, a backend per connection) makes no faults, weighs nothing in
//! the run's budget (`run_budget.rs`: a process weighs the faults it made), and once a busy
//! neighbour needed the room, it holds almost nothing. Each of its children then fetches the
//! same pages from its lazy clone over its link: at `--local 25%`, pgbench's backends took 41
//! faults each, 9 of them remote (with 22 pages read around them), where at 100% they inherited
//! those pages and took 20. Natively the postmaster's pages are shared by all its children and
//! stay in memory while children use them (the kernel's LRU sees their accesses through every
//! mapping of the page); this is that, for the window.
//!
//! The data flow: at its first lazy fork the parent makes a [`Ring`] (one page of a memory file,
//! shared with every child it forks). A child that has evicted nothing yet (so every remote page
//! of its core is one it inherited remote) records the window pages it fetched from its brick, at
//! most [`REPORTED_PER_CHILD`]. The parent's watchdog reads what is new at each tick and faults
//! those pages in with `MADV_POPULATE_READ` (its own fault path: the handler installs them as any
//! fault), only pages that are remote in the parent and only into free room of its local buffer:
//! taking them back never evicts a page. What it takes back is demand like any fault (the run's
//! budget weighs it), and it is given back like any page when others need the room.
//!
//! The ring holds hints, not state: a slot read while a child writes it, or overwritten before
//! the parent read it, costs at most a page taken back for nothing or a page not taken back.

use crate::inner::Inner;
use crate::PAGE_SIZE;
use rackmem_pager::{Location, Source, Unit};
use rackmem_sys::SharedMemory;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Pages one child reports at most: a child that fetches more is busy with its own data (the
/// `pgbench -i` backend fetches 150 000 pages), not with what it inherited.
pub(crate) const REPORTED_PER_CHILD: u64 = 512;
/// The ring: one page, a count of pages recorded so far, then the slots.
const RING_BYTES: usize = PAGE_SIZE;
const SLOTS: u64 = (RING_BYTES / 8 - 1) as u64;
/// Pages the parent takes back at most per watchdog tick (a bound on the tick's work).
const TAKEN_PER_TICK: usize = 256;

/// The pages a parent's children fetched, in a memory file they all map (see the module
/// documentation). Word 0 counts the pages ever recorded; slot `i % SLOTS` (words 1..) holds
/// the `i`th as its window page plus one (0: empty).
pub(crate) struct Ring {
    mem: SharedMemory,
    /// The parent's reading position (its own; a child's copy of it is never used).
    seen: AtomicU64,
}

impl Ring {
    pub fn create() -> Result<Ring, rackmem_sys::SysError> {
        Ok(Ring {
            mem: SharedMemory::create("rackmem-fork-hot", RING_BYTES)?,
            seen: AtomicU64::new(0),
        })
    }

    /// The same ring mapped again, in a forked child: shared memory is `MADV_DONTFORK`, so the
    /// parent's mapping is not inherited, but its descriptor is.
    fn reopen(&self) -> Result<Ring, rackmem_sys::SysError> {
        let fd = self
            .mem
            .fd()
            .try_clone_to_owned()
            .map_err(|errno| rackmem_sys::SysError::Os {
                op: "dup(fork ring)",
                addr: 0,
                len: RING_BYTES,
                errno,
            })?;
        Ok(Ring {
            mem: SharedMemory::open(fd, RING_BYTES)?,
            seen: AtomicU64::new(0),
        })
    }

    /// The parent's descriptor of the ring (closed in a child once it mapped its own).
    pub fn raw_fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.mem.fd().as_raw_fd()
    }

    /// A child records `page`.
    fn record(&self, page: u64) {
        let i = self.mem.fetch_add_u64(0, 1);
        self.mem.store_u64(8 + (i % SLOTS) as usize * 8, page + 1);
    }

    /// The parent: the pages recorded since its last call (the latest [`SLOTS`] at most),
    /// sorted, without repeats.
    fn take_new(&self) -> Vec<u64> {
        let count = self.mem.load_u64(0);
        let seen = self.seen.swap(count, Ordering::AcqRel);
        let from = seen.max(count.saturating_sub(SLOTS));
        let mut pages: Vec<u64> = (from..count)
            .map(|i| self.mem.load_u64(8 + (i % SLOTS) as usize * 8))
            .filter(|&v| v != 0)
            .map(|v| v - 1)
            .collect();
        pages.sort_unstable();
        pages.dedup();
        pages
    }
}

/// A child's tie to its parent's ring.
pub(crate) struct ParentRing {
    ring: Ring,
    reported: AtomicU64,
}

impl ParentRing {
    /// The descriptor of this process's mapping of its parent's ring (closed in its own
    /// children, which do not report to their grandparent).
    pub fn raw_fd(&self) -> i32 {
        self.ring.raw_fd()
    }

    /// In a forked child: the parent's `ring` (whose mapping the child does not have), mapped
    /// again. `None` if it cannot be: the child then reports nothing.
    pub fn adopt(ring: &Ring) -> Option<ParentRing> {
        Some(ParentRing {
            ring: ring.reopen().ok()?,
            reported: AtomicU64::new(0),
        })
    }
}

/// The parent's ring, made at its first lazy fork (`None` if the memory file cannot be made: its
/// children then report nothing, and everything else goes on).
pub(crate) fn ring_for_fork(inner: &Inner) {
    if inner.fork_hot.get().is_none() {
        if let Ok(r) = Ring::create() {
            let _ = inner.fork_hot.set(Arc::new(r));
        }
    }
}

/// A child installed a run starting at window unit `first`: reports its pages fetched from the
/// brick or filled, while every remote page it has is one it inherited (it has evicted
/// nothing), and its first touches: a child's allocations after the fork are the same in each
/// child (each starts from its parent's allocator as of the fork), so the parent touching
/// those pages once spares every later child a fault for each.
pub(crate) fn report_fetched(inner: &Inner, first: u64, kinds: &[Source]) {
    let Some(p) = inner.parent_hot.get() else {
        return;
    };
    if inner.stats.evictions.load(Ordering::Relaxed) != 0 {
        return;
    }
    for (i, _) in kinds.iter().enumerate().filter(|(_, &k)| k != Source::Held) {
        if p.reported.fetch_add(1, Ordering::Relaxed) >= REPORTED_PER_CHILD {
            return;
        }
        p.ring.record(first + i as u64);
        inner.stats.fork_pages_reported.fetch_add(1, Ordering::Relaxed);
    }
}

/// The parent (from its watchdog): faults in the pages its children reported that are remote
/// here, or empty in a region it has allocated (a first touch fills them with zeros, which is
/// what they hold), into free room only.
pub(crate) fn take_back(inner: &Inner) {
    let Some(ring) = inner.fork_hot.get() else {
        return;
    };
    // (Not while a fork is being prepared: the watchdog calls this as a call into the runtime,
    // `CallGuard::try_enter`, so that the child never inherits the core's lock held.)
    if inner.unit != Unit::Page {
        return;
    }
    let pages = ring.take_new();
    if pages.is_empty() {
        return;
    }
    let todo: Vec<u64> = {
        let c = inner.lock();
        let budget = inner.budget_pages(&c);
        let room = budget.saturating_sub(c.resident() + c.reserved()) as usize;
        let prot = c.prot_bytes();
        pages
            .into_iter()
            .filter(|&p| {
                let away = match c.location(p) {
                    Location::Remote => true,
                    Location::Empty => c.regions().region_containing(p).is_some(),
                    _ => false,
                };
                away && prot.get(p as usize).copied().unwrap_or(0) == 0
            })
            .take(room.min(TAKEN_PER_TICK))
            .collect()
    };
    for p in todo {
        // A page released or made inaccessible since fails here, which is as good as done.
        if rackmem_sys::madvise_populate_read(inner.page_addr(p), PAGE_SIZE).is_ok() {
            inner.stats.fork_pages_taken_back.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_reads_each_new_page_once_and_only_the_latest_slots() {
        let r = Ring::create().expect("memfd");
        for p in [7, 3, 7, 9] {
            r.record(p);
        }
        assert_eq!(r.take_new(), vec![3, 7, 9]);
        assert!(r.take_new().is_empty(), "nothing new");
        for p in 0..SLOTS + 10 {
            r.record(1000 + p);
        }
        let got = r.take_new();
        assert_eq!(got.len() as u64, SLOTS, "the oldest were overwritten");
        assert_eq!(got.first(), Some(&1010));
        assert_eq!(got.last(), Some(&(1000 + SLOTS + 9)));
    }

    #[test]
    fn a_child_records_through_its_own_mapping_of_the_ring() {
        let r = Ring::create().expect("memfd");
        let child = ParentRing::adopt(&r).expect("mapped again");
        child.ring.record(42);
        assert_eq!(r.take_new(), vec![42]);
    }
}
