//! What the runtime's threads share: the window, the staging area, the userfaultfds, the
//! segment table, the core under its lock, the write-back queue and the statistics.

use crate::config::Config;
use crate::segment::{self, SegmentTable};
use crate::stats::Stats;
use crate::{agent, sys, MIN_BUDGET_PAGES, PAGE, PAGE_SIZE};
use rackmem_pager::Core;
use rackmem_sys::Mapping;
use rackmem_uffd::Uffd;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

pub(crate) use rackmem_pager::Victim;

/// Work for the write-back thread.
pub(crate) enum Job {
    /// Write back the dirty victims, then release their staging slots.
    Evict { id: u64, victims: Vec<Victim> },
    /// Release brick memory behind a range the program freed (hygiene, not correctness).
    Discard { seg: usize, offset: u64, len: u64 },
}

/// Everything the runtime threads share.
pub(crate) struct Inner {
    pub cfg: Config,
    pub window: Mapping,
    pub staging: Mapping,
    pub uffd: Uffd,
    /// A second userfaultfd, without events, owning the staging area: `UFFDIO_MOVE` needs its
    /// destination registered with the uffd it is issued on, and freeing a staging slot with
    /// `madvise` must not raise a REMOVE event that only the (possibly waiting) handler reads.
    pub stage_uffd: Uffd,
    pub table: SegmentTable,
    /// The node agent, when memory comes from the control plane.
    pub agent: Option<agent::Agent>,
    pub core: Mutex<Core>,
    pub core_cv: Condvar,
    pub jobs: Mutex<VecDeque<Job>>,
    pub jobs_cv: Condvar,
    /// Jobs queued or running.
    pub jobs_busy: AtomicUsize,
    pub stats: Stats,
    /// Fork protocol: the handler parks when asked (and is woken by `bell` to notice).
    pub pause: AtomicBool,
    /// Rung to wake a handler blocked on an idle userfaultfd.
    pub bell: rackmem_sys::Doorbell,
    pub paused: Mutex<bool>,
    pub paused_cv: Condvar,
    /// When the handler started serving its current fault (ns since `epoch`), 0 when idle.
    pub fault_started_ns: AtomicU64,
    pub fault_addr: AtomicU64,
    pub clock: Instant,
}

impl Inner {
    pub fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn page_addr(&self, page: u64) -> usize {
        self.window.addr() + (page as usize) * PAGE_SIZE
    }

    pub fn slot_addr(&self, slot: u32) -> usize {
        self.staging.addr() + slot as usize * PAGE_SIZE
    }

    /// The local buffer's budget now, in pages: a byte budget as it is, a percentage of the
    /// peak committed footprint so far (never of the footprint now: a program that frees memory
    /// keeps its local buffer, as it keeps a memory cgroup's limit).
    pub fn budget_pages(&self, core: &Core) -> u64 {
        let peak = self.note_footprint(core);
        let b = self.cfg.budget.pages(peak * PAGE, PAGE, MIN_BUDGET_PAGES);
        self.stats.budget_pages.fetch_max(b, Ordering::Relaxed);
        b
    }

    /// Records the window's footprint as `core` has it now (bytes allocated, their peak, the
    /// peak of committed pages); returns that peak, in pages.
    pub fn note_footprint(&self, core: &Core) -> u64 {
        let allocated = core.alloc.allocated_pages() * PAGE;
        let s = &self.stats;
        s.window_bytes_allocated.store(allocated, Ordering::Relaxed);
        s.peak_window_bytes.fetch_max(allocated, Ordering::Relaxed);
        let committed = core.committed_pages();
        s.peak_committed_pages
            .fetch_max(committed, Ordering::Relaxed)
            .max(committed)
    }

    /// Releases `[first, first+count)` in the core (see [`Core::release`]) and counts the
    /// resident pages dropped.
    pub fn release_pages(&self, c: &mut Core, first: u64, count: u64) {
        let dropped = c.release(first, count);
        self.stats.sub_resident(dropped);
    }

    /// The segment at `index`; its absence is a bug (pages of the window always have one).
    pub fn segment(&self, index: usize) -> Arc<segment::Segment> {
        match self.table.get(index) {
            Some(s) => s,
            None => self.internal_error(&format!("segment {index} is not attached")),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }

    /// The remote memory is gone: say which brick and why, then stop the process.
    pub fn brick_lost(&self, seg: usize, what: &str, err: &dyn std::fmt::Display) -> ! {
        let addr = self.table.get(seg).map(|s| s.addr.to_string()).unwrap_or_default();
        eprintln!(
            "rackmem: lost memory brick {addr} while {what}: {err}\n\
             rackmem: pages of this program live on that brick and cannot be recovered; stopping \
             (exit status {}) rather than continuing with missing data",
            sys::EXIT_BRICK_LOST
        );
        sys::exit_immediately(sys::EXIT_BRICK_LOST)
    }

    pub fn internal_error(&self, what: &str) -> ! {
        eprintln!(
            "rackmem: internal error: {what}; stopping (exit status {})",
            sys::EXIT_BRICK_LOST
        );
        sys::exit_immediately(sys::EXIT_BRICK_LOST)
    }
}
