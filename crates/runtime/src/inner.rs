//! What the runtime's threads share: the window, the staging area, the userfaultfds, the
//! segment table, the core under its lock, the write-back queue and the statistics.

use crate::config::Config;
use crate::readahead::ReadAheads;
use crate::segment::{self, SegmentTable};
use crate::stats::Stats;
use crate::{agent, sys, MIN_BUDGET_PAGES, PAGE, PAGE_SIZE};
use rackmem_pager::{Core, Location, Unit};
use rackmem_sys::Mapping;
use rackmem_uffd::Uffd;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Longest [`Inner::lock_soon`] tries the core's lock before it sleeps on it: a few times what
/// the write-back thread holds it for, and less than one wake-up.
const LOCK_SPIN: Duration = Duration::from_micros(20);

pub(crate) use rackmem_pager::Victim;

/// The local buffer never holds fewer huge units than this (8 MiB), whatever it is set to.
const MIN_BUDGET_UNITS: u64 = 4;

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
    /// Fork protocol: the handlers park when asked (and are woken by `bell` to notice).
    pub pause: AtomicBool,
    /// Rung to wake handlers blocked on an idle userfaultfd.
    pub bell: rackmem_sys::Doorbell,
    /// Handlers parked for a fork.
    pub paused: Mutex<usize>,
    pub paused_cv: Condvar,
    /// Per handler: when it started serving its current fault (ns since `clock`), 0 when idle,
    /// and that fault's address (for the watchdog).
    pub fault_started_ns: Box<[AtomicU64]>,
    pub fault_addr: Box<[AtomicU64]>,
    /// The read-aheads in flight, shared by the handlers (any handler may serve a stream's
    /// next fault). Lock order: the core, then this.
    pub aheads: Mutex<ReadAheads>,
    /// Orders installs against the reading of userfaultfd events (see [`EventGate`]).
    pub gate: EventGate,
    /// Handlers beyond the first serve faults (`HandlerMode::Auto` turns them off while one
    /// thread does all the faulting: the first handler follows it, see `placement`).
    pub helpers_on: Mutex<bool>,
    pub helpers_cv: Condvar,
    /// Mirrors `helpers_on` (with more than one handler) for the reading path, which then takes
    /// one message at a time and peeks before taking the event gate.
    pub helpers_active: AtomicBool,
    /// Helpers asleep until called, and calls not yet taken (`HandlerMode::Auto`).
    pub idle_helpers: AtomicU32,
    pub helper_calls: AtomicU32,
    pub clock: Instant,
    /// Segments carved for migrations (`migrate.rs`).
    pub migrations: crate::migrate::Migrations,
    /// Segments drains emptied whose allocations are not returned yet (`evacuate.rs`).
    pub(crate) retired: crate::evacuate::Retired,
    /// The run's shared budget, when the launcher made one (`run_budget.rs`).
    pub run: Option<crate::run_budget::RunBudget>,
    /// Set by the watchdog when the local buffer holds more than the run's budget now leaves
    /// this process: the first handler gives the room back between faults (`handler.rs`).
    pub give_back: AtomicBool,
    /// What the core tracks residency in: 4 KiB pages, or 2 MiB huge units (`huge.rs`).
    pub unit: Unit,
    /// Huge units: subpages the program released (`MADV_DONTNEED`, `munmap` of part of a
    /// unit) while their unit was not installed in the window (remote, evicting, or claimed by
    /// a fault in flight), as a bitmap per unit. The brick (or the fetch in flight) still holds
    /// their old contents: the unit's next install zeroes them (`huge.rs`, `zero_holes`).
    pub holes: Mutex<HashMap<u64, [u64; 8]>>,
    /// The pages this process's lazily forked children fetched from its memory, which it takes
    /// back (`fork_hot.rs`); made at its first lazy fork.
    pub fork_hot: std::sync::OnceLock<Arc<crate::fork_hot::Ring>>,
    /// A lazily forked child: its parent's ring, where it reports what it fetched.
    pub parent_hot: std::sync::OnceLock<crate::fork_hot::ParentRing>,
    /// The write-back and watchdog threads are not started yet (a lazily forked child's, until
    /// `start::start_deferred_threads`).
    pub threads_deferred: AtomicBool,
    /// Held while the deferred threads start (once).
    pub deferred_start: Mutex<()>,
}

/// Installs against the reading of userfaultfd events, for several handlers on one
/// userfaultfd.
///
/// A handler checks that the pages it installs are still claimed, then installs them with an
/// ioctl. A program's `MADV_DONTNEED` queues a REMOVE event and zaps the pages once the event is
/// read; until then an install in the range fails with EAGAIN. With one handler, the reader of
/// the event applied it before its next check. With several, another handler could read the
/// event (so the zap goes ahead) between one handler's check and its install, which would then
/// map old contents over a page the program released. So an install (check and ioctl) holds the
/// gate shared, and reading the userfaultfd and applying what was read holds it exclusive.
/// Readers go first (an install waits while one waits), so a stream of installs cannot keep
/// events unread.
/// Hold times are a read syscall or an install ioctl (microseconds): waiters spin, yielding the
/// CPU after this many turns (the holder may have been preempted). A gate that slept on a
/// condition variable cost two context switches per wait: perf showed them as the largest
/// cost of two handlers on two CPUs.
const GATE_SPINS: u32 = 64;

#[derive(Default)]
pub struct EventGate {
    /// Installs in progress.
    installing: AtomicU32,
    /// A handler reads (and applies) the userfaultfd's messages.
    reading: AtomicBool,
    /// Handlers waiting to read: new installs wait for them.
    readers_waiting: AtomicU32,
}

fn gate_pause(turn: &mut u32) {
    *turn += 1;
    if *turn % GATE_SPINS == 0 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

impl EventGate {
    /// An install begins (its check of the claim and its ioctl).
    pub fn enter_install(&self) {
        let mut turn = 0;
        loop {
            while self.reading.load(Ordering::SeqCst) || self.readers_waiting.load(Ordering::SeqCst) > 0 {
                gate_pause(&mut turn);
            }
            self.installing.fetch_add(1, Ordering::SeqCst);
            // A reader that set `reading` before our increment did not see it: back off.
            if !self.reading.load(Ordering::SeqCst) {
                return;
            }
            self.installing.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The install ended.
    pub fn leave_install(&self) {
        let before = self.installing.fetch_sub(1, Ordering::SeqCst);
        assert!(before > 0, "an install left the event gate it had not entered");
    }

    /// A handler is about to read the userfaultfd (and apply the events it reads).
    pub fn enter_read(&self) {
        self.readers_waiting.fetch_add(1, Ordering::SeqCst);
        let mut turn = 0;
        loop {
            while self.installing.load(Ordering::SeqCst) > 0 || self.reading.load(Ordering::SeqCst) {
                gate_pause(&mut turn);
            }
            if self
                .reading
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                continue;
            }
            // An install that incremented before our flag was set is still in progress.
            if self.installing.load(Ordering::SeqCst) == 0 {
                break;
            }
            self.reading.store(false, Ordering::SeqCst);
        }
        self.readers_waiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// What was read is applied (faults may still be served later).
    pub fn leave_read(&self) {
        let was = self.reading.swap(false, Ordering::SeqCst);
        assert!(was, "a reader left the event gate it had not entered");
    }
}

impl Inner {
    /// Handler threads.
    pub fn handlers(&self) -> usize {
        self.fault_started_ns.len()
    }

    pub fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The core's lock for a short step of a path timed in microseconds (a single page's
    /// migration): tried for up to [`LOCK_SPIN`] before sleeping on it. The write-back thread
    /// and the handlers take it often, for well under a microsecond each, and a thread that
    /// sleeps on a contended lock pays a wake-up (~30 µs on these machines) for a holder gone
    /// long before.
    pub fn lock_soon(&self) -> MutexGuard<'_, Core> {
        let until = Instant::now() + LOCK_SPIN;
        loop {
            match self.core.try_lock() {
                Ok(g) => return g,
                Err(std::sync::TryLockError::Poisoned(e)) => return e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < until => std::hint::spin_loop(),
                Err(std::sync::TryLockError::WouldBlock) => return self.lock(),
            }
        }
    }

    /// The address of window page `page`; `page` may be the window's page count (the end of a
    /// range that reaches the window's end).
    pub fn page_addr(&self, page: u64) -> usize {
        // The address goes to raw memory calls and ioctls, which would act on whatever lies
        // past the window.
        assert!(
            (page as usize) <= self.window.len() / PAGE_SIZE,
            "window page {page} past the window's {} pages",
            self.window.len() / PAGE_SIZE
        );
        self.window.addr() + (page as usize) * PAGE_SIZE
    }

    /// The address of staging slot `slot` (one unit: a page, or a 2 MiB huge unit).
    pub fn slot_addr(&self, slot: u32) -> usize {
        let ub = self.unit_bytes();
        assert!(
            (slot as usize) < self.staging.len() / ub,
            "staging slot {slot} past the staging area's {} slots",
            self.staging.len() / ub
        );
        self.staging.addr() + slot as usize * ub
    }

    /// True if the core's units are 2 MiB huge units.
    pub fn huge(&self) -> bool {
        self.unit == Unit::Huge
    }

    /// True if a forked child inherits the window with the resident pages (see `fork.rs`).
    pub fn keeps_window(&self) -> bool {
        crate::fork::keeps_window(&self.cfg, self.unit, self.agent.is_some())
    }

    /// Pages in a unit (1, or 512 for huge units).
    pub fn upp(&self) -> u64 {
        self.unit.pages()
    }

    /// Bytes in a unit, and in a staging slot.
    pub fn unit_bytes(&self) -> usize {
        self.unit.bytes() as usize
    }

    /// The address of the core's unit `u` (a page, or a huge unit's first page).
    pub fn unit_addr(&self, u: u64) -> usize {
        self.page_addr(u * self.upp())
    }

    /// The local buffer's budget now in the core's units (at least one: a fault needs room for
    /// its own).
    pub fn budget_units(&self, core: &Core) -> u64 {
        (self.budget_pages(core) / self.upp()).max(1)
    }

    /// The resident pages this process is charged for in the run's budget: not the pages a
    /// lazily forked child still shares with its parent (the kernel maps them copy-on-write in
    /// both; the parent is charged, as a memory cgroup charges a shared page once). Estimated as
    /// the pages it inherited resident less those it has evicted while still shared, at most
    /// what is resident: a page it wrote (copied by the kernel) or one its parent evicted
    /// since is not counted, a bounded error (the inherited pages) on the side of the run's
    /// other processes. Counting each child's inherited pages as its own made a forking
    /// parent's children (pgbench's backends) push it, and each other, to evict the very pages
    /// they shared (`docs/benchmarks.md`, "pgbench at 25%, process by process").
    fn resident_charged(&self, core: &Core) -> u64 {
        let resident = core.resident() * self.upp();
        let inherited = self.stats.inherited_resident_bytes.load(Ordering::Relaxed) / PAGE;
        let shared = inherited.saturating_sub(self.stats.evictions_shared.load(Ordering::Relaxed));
        resident - shared.min(resident)
    }

    /// The local buffer's budget now, in pages: with a run's shared budget, what the run leaves
    /// this process (`run_budget.rs`); else a byte budget as it is, a percentage of the
    /// peak committed footprint so far (never of the footprint now: a program that frees memory
    /// keeps its local buffer, as it keeps a memory cgroup's limit).
    pub fn budget_pages(&self, core: &Core) -> u64 {
        // Called at every fault: only the peak is kept here (allocation sites record the rest
        // in `note_footprint`).
        let committed = core.committed_pages();
        let peak = self
            .stats
            .peak_committed_pages
            .fetch_max(committed, Ordering::Relaxed)
            .max(committed);
        let b = match &self.run {
            Some(run) => run.budget_pages(
                &self.cfg.budget,
                committed,
                self.resident_charged(core),
                // In pages, as the footprint it is weighed against (a huge unit's fault brings
                // a unit).
                self.stats.faults.load(Ordering::Relaxed) * self.upp(),
                MIN_BUDGET_PAGES,
                self.cfg.local_floor_bytes,
            ),
            None => self
                .cfg
                .budget
                .pages_with_floor(peak * PAGE, PAGE, MIN_BUDGET_PAGES, self.cfg.local_floor_bytes),
        };
        // Huge units: whole units, and at least MIN_BUDGET_UNITS of them (one instruction may
        // touch a few units: with one, a copy from one unit into another evicts each in turn
        // for the other, forever).
        let b = match self.unit {
            Unit::Page => b,
            Unit::Huge => (b / self.upp()).max(MIN_BUDGET_UNITS) * self.upp(),
        };
        self.stats.budget_pages.fetch_max(b, Ordering::Relaxed);
        b
    }

    /// Records the window's footprint as `core` has it now (bytes allocated, their peak, the
    /// peak of committed pages); returns that peak, in pages.
    pub fn note_footprint(&self, core: &Core) -> u64 {
        let allocated = core.regions().allocated_pages() * PAGE;
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
        if self.huge() {
            self.note_holes(c, first, count);
        }
        let dropped = c.release(first, count);
        self.stats.sub_resident(dropped * self.upp());
    }

    /// Huge units: records the subpages of `[first, first+count)` released inside units the
    /// release does not cover whole (the core keeps those units as they are), where the old
    /// contents would come back: units remote, evicting, or claimed by a fault in flight. A
    /// unit installed in the window needs nothing: its released subpages are missing there,
    /// and a fault on one maps zeros (`huge.rs`, `fill_hole`). Units released whole lose
    /// their holes (they read zeros whole).
    fn note_holes(&self, c: &Core, first: u64, count: u64) {
        let end = (first + count).min(c.window_pages());
        let mut holes = self.holes.lock().unwrap_or_else(|e| e.into_inner());
        for u in c.units_touching(first, end) {
            let r = c.pages_of(u);
            if first <= r.start && end >= r.end {
                holes.remove(&u);
                continue;
            }
            let stale = match c.location(u) {
                Location::Empty => false,
                Location::Resident => c.is_in_flight(u),
                Location::Remote | Location::Evicting => true,
            };
            if !stale {
                continue;
            }
            let bits = holes.entry(u).or_insert([0; 8]);
            for p in first.max(r.start)..end.min(r.end) {
                let i = (p - r.start) as usize;
                bits[i / 64] |= 1 << (i % 64);
            }
        }
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
