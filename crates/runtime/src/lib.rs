//! The rackmem runtime: remote memory inside an unmodified process.
//!
//! A program started with `librackmem.so` preloaded gets a *window*: a reserved range of virtual
//! addresses registered with userfaultfd. Large allocations are carved from it. Pages appear on
//! first touch: a page never written is installed as zeros locally; a page whose contents live on
//! a memory brick is fetched over a link. Only a *local buffer* of pages (a byte budget or a
//! percentage of the footprint) stays resident; beyond it, pages are evicted: moved out of the
//! window atomically with `UFFDIO_MOVE`, written back to their brick if dirty, and released.
//!
//! Data flow of a fault: kernel → [`handler`] (reads the uffd, plans a run of pages with
//! sequential prefetch, makes room by choosing victims with an [`policy::EvictionPolicy`] and
//! moving them to a staging area) → link read → checksum → `UFFDIO_COPY` (or `UFFDIO_MOVE`).
//! Staged victims go to the [`writeback`] thread, which writes back the dirty ones and frees
//! the staging slots. No write is ever lost: a page leaves the window atomically, and a victim
//! is dirty exactly when its contents differ from the checksum taken when it was installed.
//!
//! What this crate is not: it knows no C ABI (that is `rackmem-preload`), no REST, no policy of
//! which brick to use beyond the list it is given.

pub mod agent;
pub mod config;
mod handler;
mod outrun;
mod placement;
pub mod policy;
pub mod prefetch;
mod ratelimit;
mod recycle;
pub mod regions;
pub mod segment;
pub mod size;
pub mod stats;
pub mod sys;
mod writeback;

use config::Config;
use policy::{EvictionPolicy, Fifo};
use rackmem_sys::{Mapping, SysError};
use rackmem_transport::{BrickAddr, Link, LinkError};
use rackmem_uffd::{Features, OpenOptions, RegisterMode, Uffd, UffdError};
use regions::RegionAllocator;
use segment::{Segment, SegmentTable};
use stats::{Stats, StatsSnapshot};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

/// The page size the runtime works in (userfaultfd on anonymous memory, no huge pages).
pub const PAGE_SIZE: usize = 4096;
const PAGE: u64 = PAGE_SIZE as u64;
/// The local buffer never shrinks below this many pages, whatever the percentage says.
const MIN_BUDGET_PAGES: u64 = 32;
/// Staging slots bound the pages in flight to the write-back thread: enough for several
/// eviction batches, small next to any budget worth having.
const STAGING_SLOTS: usize = 1024;
/// Default window with an agent: address space only; memory is attached as it is used.
const DEFAULT_AGENT_WINDOW: u64 = 64 << 30;
/// Largest default window per brick.
const DEFAULT_SEGMENT_CAP: u64 = 16 << 30;
/// Default window per brick as a fraction of its pool, leaving room for other processes and
/// for the copy-on-write clones forked children get.
const DEFAULT_SEGMENT_DIVISOR: u64 = 4;

/// Where a page of the window is. The low two bits of a page's state byte.
/// A window page's protection when it is not the window's read-write (`Core::prot`).
pub(crate) mod prot {
    /// Set for every page whose protection differs from read-write.
    pub const SET: u8 = 0x80;
    /// The page is lent to a file or shared mapping the program made with `MAP_FIXED`: not
    /// the window's until the program unmaps it.
    pub const FOREIGN: u8 = 0x40;
    /// Low bits: the `PROT_*` value.
    pub const MASK: u8 = 7;
    /// The state byte for `prot` (0 for read-write).
    pub fn encode(p: i32) -> u8 {
        if p == libc::PROT_READ | libc::PROT_WRITE {
            0
        } else {
            SET | (p as u8 & MASK)
        }
    }
    /// True if the page is neither readable nor writable, or lent: it holds no committed memory.
    pub fn uncommitted(b: u8) -> bool {
        b & FOREIGN != 0 || (b & SET != 0 && b & MASK == 0)
    }
}

pub(crate) mod loc {
    /// Never written to a brick (or released): the next touch installs zeros.
    pub const EMPTY: u8 = 0;
    /// Contents live on the brick only.
    pub const REMOTE: u8 = 1;
    /// Installed in the window.
    pub const RESIDENT: u8 = 2;
    /// Moved to the staging area; write-back in progress.
    pub const EVICTING: u8 = 3;
    /// Mask of the location bits.
    pub const MASK: u8 = 3;
    /// The brick holds this page's contents as of its install or last write-back.
    pub const BRICK_VALID: u8 = 4;
}

/// Errors starting or running the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// A userfaultfd call failed.
    #[error(transparent)]
    Uffd(#[from] UffdError),
    /// A memory-mapping call failed.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// A brick could not be reached or refused.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The bricks gave no memory.
    #[error("no brick could give a segment of at least 16 MiB: {0}")]
    NoSegment(String),
    /// The node agent could not be reached or refused.
    #[error(transparent)]
    Agent(#[from] agent::AgentError),
    /// The eventfd that wakes the fault handler could not be created (out of descriptors?).
    #[error("cannot create the fault handler's doorbell (eventfd): {0}")]
    Doorbell(std::io::Error),
}

/// One staged victim on its way to the write-back thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Victim {
    pub page: u32,
    pub slot: u32,
    /// Brick-valid flag the page had (decides EMPTY vs REMOTE after a clean eviction).
    pub brick_valid: bool,
    /// The page is in a mapped segment whose file already holds memory for it (brick-valid, or
    /// populated by the brick ahead of this write-back): written by memory copy.
    pub backed: bool,
    /// Checksum of the contents the brick (or the zero page) had at install or write-back.
    pub hash: u64,
    /// The page was really moved into its slot (false: it was not present; nothing to send).
    pub moved: bool,
}

/// Work for the write-back thread.
pub(crate) enum Job {
    /// Write back the dirty victims, then release their staging slots.
    Evict { id: u64, victims: Vec<Victim> },
    /// Release brick memory behind a range the program freed (hygiene, not correctness).
    Discard { seg: usize, offset: u64, len: u64 },
}

/// Mutable state shared by the fault handler, the write-back thread and allocating threads.
pub(crate) struct Core {
    /// One state byte per window page (`loc`).
    pub pages: Vec<u8>,
    /// Checksum of each resident page's clean contents.
    pub hashes: HashMap<u32, u64>,
    /// Remote pages whose contents are one 8-byte word repeated, as the word (see
    /// `writeback::same_filled`): their brick copy is stale, their next fetch is a fill. Only
    /// REMOTE pages have an entry.
    pub fills: HashMap<u32, u64>,
    pub policy: Box<dyn EvictionPolicy>,
    pub resident: u64,
    pub alloc: RegionAllocator,
    pub free_slots: Vec<u32>,
    /// Pages in `EVICTING`, with the id of the eviction job that owns them.
    pub evicting: HashMap<u32, u64>,
    pub next_job: u64,
    /// Bumped whenever pages are released behind the handler's back (REMOVE/UNMAP events).
    pub epoch: u64,
    /// Sequential streams, for prefetch.
    pub streams: prefetch::Streams,
    /// Runs of spent staging slots, first slot → slots (see [`recycle`]).
    pub spent: std::collections::BTreeMap<u32, u32>,
    /// Slots in `spent`.
    pub spent_pages: u32,
    /// First pages of the regions handed out as malloc-family blocks (see
    /// [`Runtime::alloc_block`]); other regions are mappings, inside which the program's own
    /// allocator may place its blocks.
    pub blocks: std::collections::BTreeSet<u64>,
    /// Protection of each window page that is not read-write, as `prot::` bits (0: read-write,
    /// the window's own). Kept apart from `pages`, whose state the data path rewrites.
    pub prot: Vec<u8>,
    /// Allocated pages that are not committed: `PROT_NONE` or lent to a file mapping. The
    /// local buffer's percentage is of the committed footprint.
    pub uncommitted: u64,
}

impl Core {
    /// A core with the given page states and regions, and nothing resident.
    fn new(pages: Vec<u8>, alloc: RegionAllocator) -> Core {
        Core {
            pages,
            hashes: HashMap::new(),
            fills: HashMap::new(),
            policy: Box::new(Fifo::default()),
            resident: 0,
            alloc,
            free_slots: (0..STAGING_SLOTS as u32).rev().collect(),
            evicting: HashMap::new(),
            next_job: 1,
            epoch: 0,
            streams: prefetch::Streams::default(),
            spent: std::collections::BTreeMap::new(),
            spent_pages: 0,
            blocks: std::collections::BTreeSet::new(),
            prot: Vec::new(),
            uncommitted: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn for_tests(window_pages: u64) -> Core {
        Core::new(
            vec![loc::EMPTY; window_pages as usize],
            RegionAllocator::new(window_pages),
        )
    }

    /// Allocated pages holding committed memory (not `PROT_NONE`, not lent to a file mapping).
    pub fn committed_pages(&self) -> u64 {
        self.alloc.allocated_pages().saturating_sub(self.uncommitted)
    }

    /// The protection byte of `page` (0: read-write).
    pub fn prot_of(&self, page: u64) -> u8 {
        self.prot.get(page as usize).copied().unwrap_or(0)
    }

    /// True if a resident page may be chosen as a victim: `UFFDIO_MOVE` only moves between
    /// areas of the same protection, and the staging area is read-write.
    pub fn movable(&self, page: u64) -> bool {
        self.prot_of(page) == 0
    }

    /// Records `b` as the protection of `[first, first+count)`: keeps the uncommitted count,
    /// and takes resident pages that cannot move out of the eviction policy (or puts them back).
    /// Lent pages keep their state unless `force` (the program's mprotect on a file mapping is
    /// the kernel's business).
    pub fn set_prot(&mut self, first: u64, count: u64, b: u8, force: bool) {
        if self.prot.is_empty() && b == 0 {
            return;
        }
        if self.prot.len() < self.pages.len() {
            self.prot.resize(self.pages.len(), 0);
        }
        let end = (first + count).min(self.pages.len() as u64);
        for p in first..end {
            let old = self.prot[p as usize];
            if old == b || (old & prot::FOREIGN != 0 && !force) {
                continue;
            }
            self.prot[p as usize] = b;
            match (prot::uncommitted(old), prot::uncommitted(b)) {
                (false, true) => self.uncommitted += 1,
                (true, false) => self.uncommitted -= 1,
                _ => {}
            }
            if self.loc(p) == loc::RESIDENT {
                if b == 0 {
                    self.policy.inserted(p as u32);
                } else if old == 0 {
                    self.policy.removed(p as u32);
                }
            }
        }
    }

    /// True if any page of `[first, first+count)` is being evicted (moved out, written back).
    pub fn any_evicting(&self, first: u64, count: u64) -> bool {
        let end = (first + count).min(self.pages.len() as u64);
        !self.evicting.is_empty() && (first..end).any(|p| self.loc(p) == loc::EVICTING)
    }

    pub fn loc(&self, page: u64) -> u8 {
        self.pages.get(page as usize).map_or(loc::EMPTY, |s| s & loc::MASK)
    }

    /// Marks `[first, first+count)` released: any contents are gone, the next touch reads zeros.
    pub fn release(&mut self, first: u64, count: u64, stats: &Stats) -> u64 {
        let mut dropped = 0;
        let end = (first + count).min(self.pages.len() as u64);
        for p in first..end {
            let s = self.pages[p as usize];
            if s & loc::MASK == loc::RESIDENT {
                self.policy.removed(p as u32);
                self.hashes.remove(&(p as u32));
                self.resident -= 1;
                dropped += 1;
            }
            if s & loc::MASK == loc::EVICTING {
                self.evicting.remove(&(p as u32));
            }
            if s & loc::MASK == loc::REMOTE {
                self.fills.remove(&(p as u32));
            }
            self.pages[p as usize] = loc::EMPTY;
        }
        stats.sub_resident(dropped);
        self.epoch += 1;
        dropped
    }
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

    pub fn budget_pages(&self, core: &Core) -> u64 {
        let b = self
            .cfg
            .budget
            .pages(core.committed_pages() * PAGE, PAGE, MIN_BUDGET_PAGES);
        self.stats.budget_pages.fetch_max(b, Ordering::Relaxed);
        b
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

/// A running runtime: a window, its handler and write-back threads, links to bricks.
///
/// Thread-safe: allocation calls may come from any thread of the program. Only one exists per
/// process (see [`global`]); after `fork` the child builds its own from the parent's state.
pub struct Runtime {
    inner: Arc<Inner>,
}

static GLOBAL: RwLock<Option<Arc<Runtime>>> = RwLock::new(None);
static WINDOW_START: AtomicU64 = AtomicU64::new(0);
static WINDOW_END: AtomicU64 = AtomicU64::new(0);
/// Threads currently inside an allocation call; `fork` waits for zero (see `fork_prepare`).
static ACTIVE_CALLS: AtomicUsize = AtomicUsize::new(0);
static FORKING: AtomicBool = AtomicBool::new(false);
static FORK_STATE: Mutex<Option<ForkState>> = Mutex::new(None);

thread_local! {
    static RUNTIME_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runtime threads created but not yet marked as such (see [`spawning_runtime_thread`]).
static SPAWNING: AtomicUsize = AtomicUsize::new(0);

/// True while a runtime thread is being started: the C library and Rust's thread set-up allocate
/// on the new thread before it can mark itself (`is_runtime_thread`), so an interposer that must
/// keep runtime threads off the program's allocator treats every allocation in that short
/// window as the runtime's.
pub fn spawning_runtime_thread() -> bool {
    SPAWNING.load(Ordering::Acquire) != 0
}

/// True on the runtime's own threads (handler, write-back, watchdog): their allocations must
/// stay local, or a thread could fault on memory only it can serve.
pub fn is_runtime_thread() -> bool {
    RUNTIME_THREAD.with(|f| f.get())
}

/// The process's runtime, if one was started.
pub fn global() -> Option<Arc<Runtime>> {
    GLOBAL.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Installs `rt` as the process's runtime.
pub fn set_global(rt: Arc<Runtime>) {
    let (s, e) = (
        rt.inner.window.addr() as u64,
        (rt.inner.window.addr() + rt.inner.window.len()) as u64,
    );
    WINDOW_START.store(s, Ordering::Release);
    WINDOW_END.store(e, Ordering::Release);
    *GLOBAL.write().unwrap_or_else(|e| e.into_inner()) = Some(rt);
}

/// Leaves the process without a runtime, keeping the window's bounds known so that `free` of a
/// window pointer is still recognised (and ignored). Used in a forked child that cannot have
/// its parent's remote memory; the caller keeps the old runtime alive (its destructors would
/// act on the parent's connections).
fn clear_global() {
    *GLOBAL.write().unwrap_or_else(|e| e.into_inner()) = None;
}

/// True if `addr` lies in the window (a lock-free check for `free` of any pointer).
pub fn in_window(addr: usize) -> bool {
    let a = addr as u64;
    a >= WINDOW_START.load(Ordering::Acquire) && a < WINDOW_END.load(Ordering::Acquire)
}

/// Marks a call into the runtime from a program thread, so `fork` can wait until no thread holds
/// a runtime lock (the child would inherit it locked).
pub struct CallGuard(());

impl CallGuard {
    /// Enters; waits while a fork is being prepared.
    pub fn enter() -> CallGuard {
        loop {
            while FORKING.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            ACTIVE_CALLS.fetch_add(1, Ordering::AcqRel);
            if !FORKING.load(Ordering::Acquire) {
                return CallGuard(());
            }
            ACTIVE_CALLS.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        ACTIVE_CALLS.fetch_sub(1, Ordering::AcqRel);
    }
}

fn connect_links(cfg: &Config) -> Result<Vec<(BrickAddr, Link)>, RuntimeError> {
    cfg.bricks
        .iter()
        .map(|a| Ok((a.clone(), Link::connect_with(a, cfg.timeout, cfg.tls.as_ref())?)))
        .collect()
}

impl Runtime {
    /// Starts the runtime: connects to every brick, carves one segment from each, reserves and
    /// registers the window and starts the handler, write-back and watchdog threads.
    pub fn start(cfg: Config) -> Result<Arc<Runtime>, RuntimeError> {
        // Runs on a program thread: a brick dying during start-up must be an error, not SIGPIPE.
        sys::without_sigpipe(|| Self::start_inner(cfg))
    }

    fn start_inner(cfg: Config) -> Result<Arc<Runtime>, RuntimeError> {
        if let Some(path) = cfg.agent.clone() {
            // Memory comes from the control plane as allocations grow: reserve address space
            // only; `ensure_backed` attaches segments.
            let agent = agent::Agent::connect(&path, cfg.timeout)?;
            let bytes = cfg.window_bytes.unwrap_or(DEFAULT_AGENT_WINDOW) / (2 << 20) * (2 << 20);
            let window = Mapping::reserve(bytes.max(2 << 20) as usize, 2 << 20)?;
            return Self::assemble(cfg, window, SegmentTable::default(), Some(agent), None);
        }
        let links = connect_links(&cfg)?;
        let table = SegmentTable::default();
        let per_brick = cfg.window_bytes.map(|w| w / links.len().max(1) as u64);
        for (addr, fault) in links {
            let pool = fault.info().pool_bytes;
            let mut want = per_brick.unwrap_or((pool / DEFAULT_SEGMENT_DIVISOR).min(DEFAULT_SEGMENT_CAP));
            want = want / (2 << 20) * (2 << 20);
            let seg = loop {
                match fault.alloc_segment(&cfg.secret, want) {
                    Ok(g) => break g,
                    Err(e) if per_brick.is_none() && want > 32 << 20 && e.is_no_space() => want /= 2,
                    Err(e) => return Err(e.into()),
                }
            };
            let writeback = Link::connect_with(&addr, cfg.timeout, cfg.tls.as_ref())?;
            writeback.attach(&seg.grant, &seg.session_key)?;
            fault.set_receive_spin(cfg.link_spin);
            let shared = segment::share_if(cfg.shared_memory, &fault)?;
            let pages = seg.grant.size_bytes / PAGE;
            table.push(pages, |first_page| Segment {
                first_page,
                pages,
                addr,
                grant: seg.grant,
                fault,
                writeback,
                allocation: None,
                limiter: ratelimit::RateLimiter::new(0),
                shared,
            });
        }
        let window_pages = table.total_pages();
        if window_pages == 0 {
            return Err(RuntimeError::NoSegment("no bricks configured".into()));
        }
        let window = Mapping::reserve(window_pages as usize * PAGE_SIZE, 2 << 20)?;
        Self::assemble(cfg, window, table, None, None)
    }

    /// Builds the runtime over an already reserved window (also used by a forked child).
    fn assemble(
        cfg: Config,
        window: Mapping,
        table: SegmentTable,
        agent: Option<agent::Agent>,
        inherited: Option<Core>,
    ) -> Result<Arc<Runtime>, RuntimeError> {
        let window_pages = (window.len() / PAGE_SIZE) as u64;
        rackmem_sys::madvise_dontfork(window.addr(), window.len())?;
        let uffd = Uffd::open(&OpenOptions {
            // THREAD_ID: the handler places itself by who faults (`placement`).
            features: Features::EVENT_REMOVE | Features::EVENT_UNMAP | Features::EVENT_REMAP | Features::THREAD_ID,
            nonblocking: true,
        })?;
        uffd.register(
            window.addr(),
            window.len(),
            RegisterMode {
                missing: true,
                wp: false,
                minor: false,
            },
        )?;
        let slots = STAGING_SLOTS;
        let staging = Mapping::reserve(slots * PAGE_SIZE, PAGE_SIZE)?;
        rackmem_sys::madvise_dontfork(staging.addr(), staging.len())?;
        let stage_uffd = Uffd::open(&OpenOptions {
            features: Features::MOVE,
            nonblocking: true,
        })?;
        stage_uffd.register(
            staging.addr(),
            staging.len(),
            RegisterMode {
                missing: true,
                wp: false,
                minor: false,
            },
        )?;
        // A forked child's core comes from the parent with nothing staged: the staging area is
        // not inherited (MADV_DONTFORK), so every slot is free.
        let core = inherited.unwrap_or_else(|| {
            Core::new(
                vec![loc::EMPTY; window_pages as usize],
                RegionAllocator::new(window_pages),
            )
        });
        let stats = Stats::default();
        stats
            .window_bytes_allocated
            .store(core.alloc.allocated_pages() * PAGE, Ordering::Relaxed);
        let inner = Arc::new(Inner {
            cfg,
            window,
            staging,
            uffd,
            stage_uffd,
            table,
            agent,
            core: Mutex::new(core),
            core_cv: Condvar::new(),
            jobs: Mutex::new(VecDeque::new()),
            jobs_cv: Condvar::new(),
            jobs_busy: AtomicUsize::new(0),
            stats,
            pause: AtomicBool::new(false),
            bell: rackmem_sys::Doorbell::new().map_err(RuntimeError::Doorbell)?,
            paused: Mutex::new(false),
            paused_cv: Condvar::new(),
            fault_started_ns: AtomicU64::new(0),
            fault_addr: AtomicU64::new(0),
            clock: Instant::now(),
        });
        {
            let c = inner.lock();
            inner.budget_pages(&c);
        }
        let spawn = |name: &str, f: fn(Arc<Inner>)| {
            let i = inner.clone();
            SPAWNING.fetch_add(1, Ordering::AcqRel);
            let started = std::thread::Builder::new()
                .name(name.into())
                .stack_size(256 << 10)
                .spawn(move || {
                    RUNTIME_THREAD.with(|t| t.set(true));
                    SPAWNING.fetch_sub(1, Ordering::AcqRel);
                    sys::block_sigpipe();
                    // A runtime thread that dies would leave the program waiting on a fault
                    // forever: stop the program instead, saying why.
                    let thread = std::thread::current().name().unwrap_or("rackmem").to_string();
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))).is_err() {
                        eprintln!("rackmem: internal error: the {thread} thread panicked; stopping the program");
                        sys::exit_immediately(sys::EXIT_BRICK_LOST);
                    }
                });
            if started.is_err() {
                SPAWNING.fetch_sub(1, Ordering::AcqRel);
            }
            started
        };
        spawn("rackmem-fault", handler::run).map_err(|e| RuntimeError::NoSegment(e.to_string()))?;
        spawn("rackmem-wb", writeback::run).map_err(|e| RuntimeError::NoSegment(e.to_string()))?;
        spawn("rackmem-watchdog", watchdog).map_err(|e| RuntimeError::NoSegment(e.to_string()))?;
        if inner.cfg.verbose {
            eprintln!(
                "rackmem[{}]: window {:#x}+{} on {} segment(s){}, local buffer {}, handler {:?}",
                std::process::id(),
                inner.window.addr(),
                size::format_size(inner.window.len() as u64),
                inner.table.len(),
                if inner.agent.is_some() {
                    " (more from the node agent as needed)"
                } else {
                    ""
                },
                inner.cfg.budget,
                inner.cfg.handler
            );
        }
        Ok(Arc::new(Runtime { inner }))
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Allocates `size` bytes aligned to `align` (a power of two) in the window; `None` if the
    /// window is full (the caller falls back to local memory). The memory reads as zeros.
    pub fn alloc(&self, size: usize, align: usize) -> Option<usize> {
        let pages = (size.max(1) as u64).div_ceil(PAGE);
        let align_pages = (align as u64).div_ceil(PAGE).max(1);
        let mut c = self.inner.lock();
        let Some(first) = c.alloc.alloc(pages, align_pages) else {
            let (allocated, total) = (c.alloc.allocated_pages() * PAGE, c.alloc.total_pages() * PAGE);
            drop(c);
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "rackmem: warning: the window is full ({} of {} allocated); an allocation of {} stays in local memory. \
                     Use a larger --window or more bricks.",
                    size::format_size(allocated),
                    size::format_size(total),
                    size::format_size(size as u64)
                );
            }
            return None;
        };
        let allocated = c.alloc.allocated_pages() * PAGE;
        drop(c);
        if !self.ensure_backed(first + pages) {
            let mut c = self.inner.lock();
            c.alloc.free_range(first, pages);
            return None;
        }
        let s = &self.inner.stats;
        s.window_bytes_allocated.store(allocated, Ordering::Relaxed);
        s.peak_window_bytes.fetch_max(allocated, Ordering::Relaxed);
        s.window_allocations.fetch_add(1, Ordering::Relaxed);
        Some(self.inner.page_addr(first))
    }

    /// Makes sure segments back the window up to page `end`, asking the node agent for more
    /// memory if needed (in steps of at least `RACKMEM_GROW`, and at least half of what is
    /// attached, so a growing program attaches few segments). False if that memory cannot be
    /// had: the caller keeps the allocation local.
    fn ensure_backed(&self, end: u64) -> bool {
        let inner = &self.inner;
        if end <= inner.table.total_pages() {
            return true;
        }
        let Some(agent) = inner.agent.as_ref() else {
            return false;
        };
        let _change = inner.table.change_lock();
        let window_pages = (inner.window.len() / PAGE_SIZE) as u64;
        while inner.table.total_pages() < end {
            let backed = inner.table.total_pages() * PAGE;
            let room = window_pages * PAGE - backed;
            let want = (end * PAGE - backed)
                .max(inner.cfg.grow_bytes)
                .max(backed / 2)
                .next_multiple_of(1 << 20)
                .min(room);
            if let Err(e) = sys::without_sigpipe(|| self.attach_allocation(agent, want)) {
                static WARNED: AtomicBool = AtomicBool::new(false);
                if !WARNED.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "rackmem: warning: no more remote memory ({e}); allocations beyond {} stay in local memory",
                        size::format_size(backed)
                    );
                }
                return false;
            }
        }
        true
    }

    /// Asks the agent for `bytes` and attaches every segment of the allocation at the end of
    /// the window, or none of them (the allocation is returned if any fails).
    fn attach_allocation(&self, agent: &agent::Agent, bytes: u64) -> Result<(), RuntimeError> {
        let inner = &self.inner;
        let a = agent.grow(bytes)?;
        // Pages, address, grant, fault and write-back links, rate, mapping: a segment ready to
        // publish.
        type Ready = (
            u64,
            BrickAddr,
            rackmem_proto::Grant,
            Link,
            Link,
            u64,
            Option<rackmem_sys::SharedMemory>,
        );
        let attach = || -> Result<Vec<Ready>, RuntimeError> {
            let mut out = Vec::new();
            let window_pages = (inner.window.len() / PAGE_SIZE) as u64;
            let mut end = inner.table.total_pages();
            for s in &a.segments {
                let bad = |why: String| agent::AgentError::Malformed { op: "grow", why };
                let (grant, key) = s.credentials().map_err(bad)?;
                let addr: BrickAddr = s.brick_address.parse().map_err(|e: LinkError| bad(e.to_string()))?;
                let pages = grant.size_bytes / PAGE;
                end += pages;
                if pages == 0 || end > window_pages || inner.table.len() + out.len() >= segment::MAX_SEGMENTS {
                    return Err(RuntimeError::NoSegment(format!(
                        "the agent's allocation does not fit the window of {}",
                        size::format_size(inner.window.len() as u64)
                    )));
                }
                let fault = Link::connect_with(&addr, inner.cfg.timeout, inner.cfg.tls.as_ref())?;
                fault.attach(&grant, &key)?;
                fault.set_receive_spin(inner.cfg.link_spin);
                let writeback = Link::connect_with(&addr, inner.cfg.timeout, inner.cfg.tls.as_ref())?;
                writeback.attach(&grant, &key)?;
                let shared = segment::share_if(inner.cfg.shared_memory, &fault)?;
                out.push((pages, addr, grant, fault, writeback, s.rate_limit_bps, shared));
            }
            Ok(out)
        };
        match attach() {
            Ok(segs) => {
                for (pages, addr, grant, fault, writeback, rate, shared) in segs {
                    inner.table.push(pages, |first_page| Segment {
                        first_page,
                        pages,
                        addr,
                        grant,
                        fault,
                        writeback,
                        allocation: Some(a.allocation),
                        limiter: ratelimit::RateLimiter::new(rate),
                        shared,
                    });
                }
                if inner.cfg.verbose {
                    eprintln!(
                        "rackmem[{}]: attached allocation {} ({} segment(s)); window backed up to {}",
                        std::process::id(),
                        a.allocation,
                        a.segments.len(),
                        size::format_size(inner.table.total_pages() * PAGE)
                    );
                }
                Ok(())
            }
            Err(e) => {
                let _ = agent.release(a.allocation);
                Err(e)
            }
        }
    }

    /// Returns trailing allocations the program's allocations no longer reach (keeping one
    /// growth step of slack, so a program that frees and allocates again does not ask each
    /// time). Write-back is drained first: no queued job may refer to a segment being detached.
    fn shrink(&self) {
        let inner = &self.inner;
        let Some(agent) = inner.agent.as_ref() else {
            return;
        };
        let slack = inner.cfg.grow_bytes / PAGE;
        let high = inner.lock().alloc.high_water();
        let Some(last) = inner.table.get(inner.table.len().wrapping_sub(1)) else {
            return;
        };
        if last.first_page < high + slack {
            return;
        }
        let _change = inner.table.change_lock();
        writeback::drain(inner);
        loop {
            let n = inner.table.len();
            let Some(last) = inner.table.get(n.wrapping_sub(1)) else {
                return;
            };
            let Some(id) = last.allocation else {
                return;
            };
            // The allocation's segments are neighbours at the end of the window.
            let mut k = n - 1;
            while k > 0 && inner.table.get(k - 1).is_some_and(|s| s.allocation == Some(id)) {
                k -= 1;
            }
            let first = inner.table.bounds(k).map_or(0, |b| b.0);
            let high = inner.lock().alloc.high_water();
            if first < high + slack {
                return;
            }
            for _ in k..n {
                drop(inner.table.pop());
            }
            if let Err(e) = sys::without_sigpipe(|| agent.release(id)) {
                eprintln!("rackmem: warning: returning allocation {id} to the node agent: {e}");
            }
            if inner.cfg.verbose {
                eprintln!(
                    "rackmem[{}]: returned allocation {id}; window backed up to {}",
                    std::process::id(),
                    size::format_size(inner.table.total_pages() * PAGE)
                );
            }
        }
    }

    /// A private anonymous mapping of `len` bytes with protection `prot` (any of `PROT_NONE`,
    /// read-only, read-write, with or without exec): at `hint` if the whole range is free window
    /// space there, anywhere in the window otherwise (a hint is only a hint, as in mmap(2)).
    pub fn map(&self, hint: usize, len: usize, prot: i32) -> Option<usize> {
        let pages = (len.max(1) as u64).div_ceil(PAGE);
        let at = self
            .page_of(hint)
            .filter(|&h| hint % PAGE_SIZE == 0 && h + pages <= self.window_pages());
        let addr = match at.filter(|&h| self.inner.lock().alloc.alloc_at(h, pages)) {
            Some(h) => {
                if !self.ensure_backed(h + pages) {
                    self.inner.lock().alloc.free_range(h, pages);
                    return None;
                }
                self.account_allocation();
                self.inner.page_addr(h)
            }
            None => self.alloc(len, PAGE_SIZE)?,
        };
        if prot != libc::PROT_READ | libc::PROT_WRITE && self.protect(addr, len, prot).is_err() {
            self.release(addr, len);
            return None;
        }
        Some(addr)
    }

    fn window_pages(&self) -> u64 {
        (self.inner.window.len() / PAGE_SIZE) as u64
    }

    fn account_allocation(&self) {
        let allocated = self.inner.lock().alloc.allocated_pages() * PAGE;
        let s = &self.inner.stats;
        s.window_bytes_allocated.store(allocated, Ordering::Relaxed);
        s.peak_window_bytes.fetch_max(allocated, Ordering::Relaxed);
        s.window_allocations.fetch_add(1, Ordering::Relaxed);
    }

    /// `mprotect(2)` on window pages: applies `prot` and records it. Pages that are not
    /// read-write leave the eviction policy (they cannot be moved to the read-write staging
    /// area) and `PROT_NONE` pages stop counting as committed. Pages being evicted are waited
    /// for first, so no move is refused half-way. Err(errno): ENOMEM if part of the range is
    /// not allocated (as mmap(2) says of unmapped pages).
    pub fn protect(&self, addr: usize, len: usize, prot: i32) -> Result<(), i32> {
        let first = self.page_of(addr).ok_or(libc::ENOMEM)?;
        let pages = (len as u64).div_ceil(PAGE);
        let end = first + pages;
        if addr % PAGE_SIZE != 0 || end > self.window_pages() {
            return Err(libc::EINVAL);
        }
        let b = prot::encode(prot);
        let mut c = self.inner.lock();
        let mut p = first;
        while p < end {
            match c.alloc.region_containing(p) {
                Some((s, l)) => p = s + l,
                None => return Err(libc::ENOMEM),
            }
        }
        while c.any_evicting(first, pages) {
            c = self
                .inner
                .core_cv
                .wait_timeout(c, Duration::from_millis(5))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let syscall = || {
            rackmem_sys::mprotect(addr, (pages * PAGE) as usize, prot)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))
        };
        if b != 0 {
            // Out of the policy before the protection changes: the handler never picks them.
            c.set_prot(first, pages, b, false);
            drop(c);
            syscall()?;
        } else {
            drop(c);
            syscall()?;
            self.inner.lock().set_prot(first, pages, 0, false);
        }
        self.inner.budget_pages(&self.inner.lock());
        Ok(())
    }

    /// `mmap(MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS)` over window pages: as on Linux, the
    /// range becomes fresh zero pages with protection `prot`; free window space in it is
    /// allocated exactly there. `noreplace`: MAP_FIXED_NOREPLACE (EEXIST over allocated pages).
    pub fn map_fixed(&self, addr: usize, len: usize, prot: i32, noreplace: bool) -> Result<usize, i32> {
        let first = self.page_of(addr).ok_or(libc::EINVAL)?;
        let pages = (len as u64).div_ceil(PAGE);
        let end = first + pages;
        if addr % PAGE_SIZE != 0 || len == 0 || end > self.window_pages() {
            return Err(libc::EINVAL);
        }
        {
            let mut c = self.inner.lock();
            let mut p = first;
            let mut holes = Vec::new();
            while p < end {
                match c.alloc.region_containing(p) {
                    Some((s, l)) if noreplace => {
                        let _ = (s, l);
                        return Err(libc::EEXIST);
                    }
                    Some((s, l)) => p = (s + l).min(end),
                    None => {
                        let mut q = p + 1;
                        while q < end && c.alloc.region_containing(q).is_none() {
                            q += 1;
                        }
                        holes.push((p, q - p));
                        p = q;
                    }
                }
            }
            for (s, n) in holes {
                if !c.alloc.alloc_at(s, n) {
                    return Err(libc::ENOMEM);
                }
            }
        }
        if !self.ensure_backed(end) {
            return Err(libc::ENOMEM);
        }
        self.account_allocation();
        self.give_back_lent(first, pages);
        self.discard_contents(first, pages);
        self.protect(addr, len, prot)?;
        Ok(addr)
    }

    /// Lends window pages to a file or shared mapping the program puts there with `MAP_FIXED`
    /// (a JVM maps its class-data archive into its reserved heap range): their contents are
    /// released and they count as uncommitted; free pages in the range are allocated so they
    /// are never handed out. The caller then makes the real mapping, which takes the range out
    /// of the userfaultfd. [`Runtime::release`] gives them back to the window.
    pub fn lend(&self, addr: usize, len: usize) -> Result<(), i32> {
        let first = self.page_of(addr).ok_or(libc::EINVAL)?;
        let pages = (len as u64).div_ceil(PAGE);
        let end = first + pages;
        if addr % PAGE_SIZE != 0 || end > self.window_pages() {
            return Err(libc::EINVAL);
        }
        {
            let mut c = self.inner.lock();
            for p in first..end {
                if c.alloc.region_containing(p).is_none() && !c.alloc.alloc_at(p, 1) {
                    return Err(libc::ENOMEM);
                }
            }
        }
        // Read-write again first, so the discard below and any eviction see plain pages.
        self.protect(addr, len, libc::PROT_READ | libc::PROT_WRITE)?;
        self.discard_contents(first, pages);
        let mut c = self.inner.lock();
        c.set_prot(first, pages, prot::FOREIGN, true);
        Ok(())
    }

    /// True if `addr` is a window page lent to a file or shared mapping.
    pub fn is_lent(&self, addr: usize) -> bool {
        self.page_of(addr)
            .is_some_and(|p| self.inner.lock().prot_of(p) & prot::FOREIGN != 0)
    }

    /// Gives lent pages of `[first, first+pages)` back to the window: fresh anonymous memory
    /// replaces the program's mapping there and is registered with the userfaultfd again.
    fn give_back_lent(&self, first: u64, pages: u64) {
        let runs = self.prot_runs(first, pages, |b| b & prot::FOREIGN != 0);
        for (s, n) in runs {
            let (addr, len) = (self.inner.page_addr(s), (n * PAGE) as usize);
            let back = rackmem_sys::remap_anonymous(addr, len)
                .and_then(|_| rackmem_sys::madvise_dontfork(addr, len))
                .map_err(RuntimeError::from)
                .and_then(|_| {
                    self.inner
                        .uffd
                        .register(
                            addr,
                            len,
                            RegisterMode {
                                missing: true,
                                wp: false,
                                minor: false,
                            },
                        )
                        .map(|_| ())
                        .map_err(RuntimeError::from)
                });
            if let Err(e) = back {
                self.inner.internal_error(&format!(
                    "giving window pages {addr:#x}+{len} back from a file mapping: {e}"
                ));
            }
            self.inner.lock().set_prot(s, n, 0, true);
        }
    }

    /// Runs of pages in `[first, first+pages)` whose protection byte satisfies `f`.
    fn prot_runs(&self, first: u64, pages: u64, f: impl Fn(u8) -> bool) -> Vec<(u64, u64)> {
        let c = self.inner.lock();
        if c.prot.is_empty() {
            return Vec::new();
        }
        let mut out: Vec<(u64, u64)> = Vec::new();
        for p in first..(first + pages).min(c.prot.len() as u64) {
            if f(c.prot[p as usize]) {
                match out.last_mut() {
                    Some((s, n)) if *s + *n == p => *n += 1,
                    _ => out.push((p, 1)),
                }
            }
        }
        out
    }

    /// Makes `[first, first+pages)` plain read-write window memory again (before it is freed):
    /// lent pages come back, other protections are lifted.
    fn restore_window(&self, first: u64, pages: u64) {
        self.give_back_lent(first, pages);
        for (s, n) in self.prot_runs(first, pages, |b| b != 0) {
            let (addr, len) = (self.inner.page_addr(s), (n * PAGE) as usize);
            if let Err(e) = rackmem_sys::mprotect(addr, len, libc::PROT_READ | libc::PROT_WRITE) {
                self.inner.internal_error(&format!(
                    "making freed window pages {addr:#x}+{len} read-write again: {e}"
                ));
            }
            self.inner.lock().set_prot(s, n, 0, true);
        }
    }

    /// Like [`Runtime::alloc`], for a malloc-family block: `free`, `realloc` and
    /// `malloc_usable_size` recognise it by [`Runtime::is_block`].
    pub fn alloc_block(&self, size: usize, align: usize) -> Option<usize> {
        let a = self.alloc(size, align)?;
        let page = self.page_of(a)?;
        self.inner.lock().blocks.insert(page);
        Some(a)
    }

    /// True if `addr` is the start of a live block from [`Runtime::alloc_block`]. Other window
    /// addresses belong to mappings (the program's allocator may carve its own blocks there).
    pub fn is_block(&self, addr: usize) -> bool {
        if addr % PAGE_SIZE != 0 {
            return false;
        }
        let Some(page) = self.page_of(addr) else {
            return false;
        };
        self.inner.lock().blocks.contains(&page)
    }

    /// The usable size of the window allocation starting at `addr`, if it is one.
    pub fn usable_size(&self, addr: usize) -> Option<usize> {
        let page = self.page_of(addr)?;
        let c = self.inner.lock();
        let (start, pages) = c.alloc.region_containing(page)?;
        let region_end = self.inner.page_addr(start + pages);
        Some(region_end - addr)
    }

    /// The region `(start_addr, len)` that contains `addr`.
    pub fn region_of(&self, addr: usize) -> Option<(usize, usize)> {
        let page = self.page_of(addr)?;
        let c = self.inner.lock();
        let (start, pages) = c.alloc.region_containing(page)?;
        Some((self.inner.page_addr(start), pages as usize * PAGE_SIZE))
    }

    /// Tries to resize the allocation at `addr` in place (for `realloc` and `mremap`).
    pub fn resize_in_place(&self, addr: usize, new_size: usize) -> bool {
        let Some(page) = self.page_of(addr) else {
            return false;
        };
        let new_pages = (new_size.max(1) as u64).div_ceil(PAGE);
        let old = {
            let c = self.inner.lock();
            match c.alloc.region_at(page) {
                Some(p) => p,
                None => return false,
            }
        };
        if new_pages < old {
            // Shrinking releases the tail like munmap does.
            self.release(
                self.inner.page_addr(page + new_pages),
                ((old - new_pages) * PAGE) as usize,
            );
            return true;
        }
        let mut c = self.inner.lock();
        let mut ok = c.alloc.resize_in_place(page, new_pages);
        drop(c);
        if ok && !self.ensure_backed(page + new_pages) {
            // No memory behind the grown part: undo the growth; the caller moves the data.
            let mut c = self.inner.lock();
            c.alloc.resize_in_place(page, old);
            ok = false;
        }
        let allocated = self.inner.lock().alloc.allocated_pages() * PAGE;
        self.inner
            .stats
            .window_bytes_allocated
            .store(allocated, Ordering::Relaxed);
        self.inner
            .stats
            .peak_window_bytes
            .fetch_max(allocated, Ordering::Relaxed);
        ok
    }

    fn page_of(&self, addr: usize) -> Option<u64> {
        let base = self.inner.window.addr();
        (addr >= base && addr < base + self.inner.window.len()).then(|| ((addr - base) / PAGE_SIZE) as u64)
    }

    /// Releases `[addr, addr+len)` (page-rounded outward at the start, inward... see below): the
    /// pages are dropped from the local buffer and from the allocator, and their brick memory is
    /// discarded. Used by `free`, `munmap`, and the tail of a shrinking `realloc`.
    pub fn release(&self, addr: usize, len: usize) {
        let Some(first) = self.page_of(addr) else {
            return;
        };
        let pages = (len as u64).div_ceil(PAGE);
        self.restore_window(first, pages);
        self.discard_contents(first, pages);
        let mut c = self.inner.lock();
        let gone: Vec<u64> = c.blocks.range(first..first + pages).copied().collect();
        for b in gone {
            c.blocks.remove(&b);
        }
        let freed = c.alloc.free_range(first, pages);
        let allocated = c.alloc.allocated_pages() * PAGE;
        drop(c);
        self.inner
            .stats
            .window_bytes_allocated
            .store(allocated, Ordering::Relaxed);
        for (s, n) in freed {
            self.queue_discard(s, n);
        }
        self.shrink();
    }

    /// `madvise(MADV_DONTNEED)` semantics on window pages: afterwards they read as zeros.
    pub fn dontneed(&self, addr: usize, len: usize) {
        if let Some(first) = self.page_of(addr) {
            let pages = (len as u64).div_ceil(PAGE);
            self.discard_contents(first, pages);
        }
    }

    fn discard_contents(&self, first: u64, pages: u64) {
        // The kernel zaps present pages (and tells the handler with a REMOVE event before it
        // does); the state change here covers pages that are remote or staged.
        let addr = self.inner.page_addr(first);
        let len = (pages * PAGE) as usize;
        if let Err(e) = rackmem_sys::madvise_dontneed(addr, len) {
            eprintln!("rackmem: madvise(DONTNEED) on window {addr:#x}+{len}: {e}");
        }
        let mut c = self.inner.lock();
        c.release(first, pages, &self.inner.stats);
    }

    fn queue_discard(&self, first: u64, pages: u64) {
        // Split along segments; small releases are not worth a message.
        if pages < 256 {
            return;
        }
        let mut p = first;
        let end = first + pages;
        while p < end {
            let Some((seg, off)) = self.inner.table.lookup(p) else {
                return;
            };
            let seg_end = self.inner.table.bounds(seg).map_or(end, |b| b.1).min(end);
            writeback::submit(
                &self.inner,
                Job::Discard {
                    seg,
                    offset: off,
                    len: (seg_end - p) * PAGE,
                },
            );
            p = seg_end;
        }
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> StatsSnapshot {
        let c = self.inner.lock();
        self.inner.budget_pages(&c);
        drop(c);
        self.inner.stats.snapshot(PAGE)
    }

    /// Appends this process's statistics as one JSON line to the configured stats file.
    pub fn write_stats(&self) {
        let Some(path) = &self.inner.cfg.stats_file else {
            return;
        };
        let snap = self.stats();
        let Ok(mut line) = serde_json::to_string(&snap) else {
            return;
        };
        line.push('\n');
        use std::io::Write;
        match std::fs::OpenOptions::new().create(true).append(true).open(path) {
            Ok(mut f) => {
                if let Err(e) = f.write_all(line.as_bytes()) {
                    eprintln!("rackmem: cannot write statistics to {path}: {e}");
                }
            }
            Err(e) => eprintln!("rackmem: cannot open statistics file {path}: {e}"),
        }
    }
}

fn watchdog(inner: Arc<Inner>) {
    let limit = inner.cfg.watchdog.as_nanos() as u64;
    let mut reported = 0u64;
    let mut last_rates = Instant::now();
    let mut outrun = outrun::Monitor::default();
    let mut last_keepalive = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(250));
        placement::watch(inner.stats.faults.load(Ordering::Relaxed));
        outrun.tick(&inner);
        if !inner.cfg.keepalive.is_zero()
            && last_keepalive.elapsed() >= (inner.cfg.keepalive / 2).min(Duration::from_secs(1))
        {
            last_keepalive = Instant::now();
            // A link idle for the keep-alive interval gets a PING, so its brick's idle timeout
            // never cuts a program that merely has not faulted for a while. A failed ping
            // breaks the link, as the next fault would have found anyway.
            for s in inner.table.all().iter() {
                let _ = s.fault.keep_alive(inner.cfg.keepalive);
                let _ = s.writeback.keep_alive(inner.cfg.keepalive);
            }
        }
        if let Some(agent) = inner.agent.as_ref() {
            // Rate limits change as other allocations come and go: follow them.
            if last_rates.elapsed() >= Duration::from_secs(1) && !inner.table.is_empty() {
                last_rates = Instant::now();
                if let Ok(rates) = agent.rates() {
                    for s in inner.table.all() {
                        if let Some(r) = rates.iter().find(|r| r.segment_id == s.grant.segment_id) {
                            s.limiter.set_rate(r.rate_limit_bps);
                        }
                    }
                }
            }
        }
        let started = inner.fault_started_ns.load(Ordering::Acquire);
        if started == 0 {
            continue;
        }
        let waited = inner.now_ns().saturating_sub(started);
        if waited > limit && started != reported {
            reported = started;
            inner.stats.watchdog_reports.fetch_add(1, Ordering::Relaxed);
            let mut bricks: Vec<String> = inner.table.all().iter().map(|b| b.addr.to_string()).collect();
            bricks.dedup();
            eprintln!(
                "rackmem: watchdog: the fault at {:#x} has waited {:.1} s (limit {:.1} s); bricks: {}",
                inner.fault_addr.load(Ordering::Relaxed),
                waited as f64 / 1e9,
                limit as f64 / 1e9,
                bricks.join(", ")
            );
        }
    }
}

/// What the parent prepared for the child of a `fork`.
struct ForkState {
    grants: Vec<rackmem_proto::SegmentGrant>,
    failure: Option<String>,
}

/// `pthread_atfork` prepare hook. Quiesces the runtime (no program thread inside it, handler
/// parked, write-back drained), writes back every dirty resident page, and takes a
/// copy-on-write clone of each segment on its brick: the child's frozen view of the parent's
/// remote pages. The window is `MADV_DONTFORK`, so the child gets no copy of the resident pages:
/// it starts with every page remote, from the clone.
pub fn fork_prepare() {
    let Some(rt) = global() else {
        return;
    };
    FORKING.store(true, Ordering::Release);
    while ACTIVE_CALLS.load(Ordering::Acquire) != 0 {
        std::thread::yield_now();
    }
    let inner = &rt.inner;
    handler::pause(inner);
    writeback::drain(inner);
    let flushed = sys::without_sigpipe(|| writeback::flush_dirty(inner));
    let mut grants = Vec::new();
    let mut failure = None;
    for b in inner.table.all() {
        match sys::without_sigpipe(|| b.fault.clone_segment()) {
            Ok(g) => grants.push(g),
            Err(e) => {
                // The parent goes on; the child will stop with this message.
                failure = Some(format!(
                    "brick {} cannot clone the parent's segment for the child: {e}",
                    b.addr
                ));
                break;
            }
        }
    }
    if inner.cfg.verbose {
        eprintln!(
            "rackmem[{}]: fork: flushed {flushed} dirty pages, cloned {} segment(s)",
            std::process::id(),
            grants.len()
        );
    }
    *FORK_STATE.lock().unwrap_or_else(|e| e.into_inner()) = Some(ForkState { grants, failure });
}

/// `pthread_atfork` parent hook: resume.
pub fn fork_parent() {
    let Some(rt) = global() else {
        return;
    };
    FORK_STATE.lock().unwrap_or_else(|e| e.into_inner()).take();
    handler::resume(&rt.inner);
    FORKING.store(false, Ordering::Release);
}

/// Closes, in a forked child, the descriptors of the parent's runtime (its links, uffds and
/// agent connection), so that bricks and agent see the parent's connections end when it exits.
fn close_parent_fds(parent: &Inner) {
    for b in parent.table.all() {
        for fd in b.fault.raw_fds().into_iter().chain(b.writeback.raw_fds()) {
            sys::close_inherited(fd);
        }
    }
    if let Some(a) = &parent.agent {
        sys::close_inherited(a.raw_fd());
    }
    sys::close_inherited(parent.uffd.as_raw_fd());
    sys::close_inherited(parent.stage_uffd.as_raw_fd());
    sys::close_inherited(parent.bell.as_raw_fd());
}

/// `pthread_atfork` child hook: build the child's own runtime over the same window addresses,
/// with its own userfaultfd, links and threads, on the cloned segments.
pub fn fork_child() {
    let Some(rt) = global() else {
        return;
    };
    let state = FORK_STATE.lock().unwrap_or_else(|e| e.into_inner()).take();
    let parent = &rt.inner;
    let Some(state) = state else {
        eprintln!("rackmem: fork child without prepared state");
        sys::exit_immediately(sys::EXIT_RUNTIME_FAILED);
    };
    if let (Some(why), Some(_)) = (&state.failure, &parent.agent) {
        // Segments from a control plane cannot be cloned (yet): the child goes on without its
        // parent's remote memory. It may exec (what most forking programs do); touching the
        // window, which the child does not have, stops it with SIGSEGV, never with zeros.
        if parent.cfg.verbose {
            eprintln!(
                "rackmem: the forked child (pid {}) has no access to its parent's remote memory: {why}",
                std::process::id()
            );
        }
        close_parent_fds(parent);
        std::mem::forget(rt);
        clear_global();
        FORKING.store(false, Ordering::Release);
        return;
    }
    if let Some(why) = state.failure {
        eprintln!(
            "rackmem: the forked child (pid {}) cannot have its own copy of remote memory: {why}",
            std::process::id()
        );
        sys::exit_immediately(sys::EXIT_RUNTIME_FAILED);
    }
    let result = sys::without_sigpipe(|| -> Result<Arc<Runtime>, RuntimeError> {
        // The window's addresses are free in the child (the window is MADV_DONTFORK): take
        // them back before anything else maps memory, or a buffer could land there. Pages the
        // parent lent to file or shared mappings hold those mappings here too (they are not
        // MADV_DONTFORK): they move aside while the window is mapped, and back once the
        // child's userfaultfd serves the rest (their UNMAP events release the pages again).
        let (base, len) = (parent.window.addr(), parent.window.len());
        let lent: Vec<(usize, usize)> = {
            let c = parent.lock();
            let mut out: Vec<(usize, usize)> = Vec::new();
            for (p, &b) in c.prot.iter().enumerate() {
                if b & prot::FOREIGN == 0 {
                    continue;
                }
                let addr = base + p * PAGE_SIZE;
                match out.last_mut() {
                    Some((a, l)) if *a + *l == addr => *l += PAGE_SIZE,
                    _ => out.push((addr, PAGE_SIZE)),
                }
            }
            out
        };
        let mut aside: Vec<(usize, usize, usize)> = Vec::new();
        if !lent.is_empty() {
            // The window's free parts first, so the placeholders below cannot land there.
            let mut gaps = Vec::new();
            let mut at = base;
            for &(a, l) in lent.iter().chain(std::iter::once(&(base + len, 0))) {
                if a > at {
                    gaps.push(Mapping::reserve_at(at, a - at)?);
                }
                at = a + l;
            }
            for &(a, l) in &lent {
                let (placeholder, _) = Mapping::reserve(l, PAGE_SIZE)?.leak();
                rackmem_sys::move_mapping(a, l, placeholder)?;
                aside.push((placeholder, a, l));
            }
            drop(gaps);
        }
        let window = Mapping::reserve_at(base, len)?;
        let table = SegmentTable::default();
        for (i, b) in parent.table.all().iter().enumerate() {
            let seg = state.grants[i].clone();
            let fault = Link::connect_with(&b.addr, parent.cfg.timeout, parent.cfg.tls.as_ref())?;
            fault.attach(&seg.grant, &seg.session_key)?;
            fault.set_receive_spin(parent.cfg.link_spin);
            let writeback = Link::connect_with(&b.addr, parent.cfg.timeout, parent.cfg.tls.as_ref())?;
            writeback.attach(&seg.grant, &seg.session_key)?;
            let shared = segment::share_if(parent.cfg.shared_memory, &fault)?;
            table.push(b.pages, |first_page| Segment {
                first_page,
                pages: b.pages,
                addr: b.addr.clone(),
                grant: seg.grant,
                fault,
                writeback,
                allocation: None,
                limiter: ratelimit::RateLimiter::new(0),
                shared,
            });
        }
        let c = parent.lock();
        let mut pages = c.pages.clone();
        for s in pages.iter_mut() {
            // After the flush every resident page is clean; the brick holds it unless it was a
            // zero page never written (then it is still zeros).
            *s = match *s & loc::MASK {
                loc::RESIDENT | loc::EVICTING if *s & loc::BRICK_VALID != 0 => loc::REMOTE | loc::BRICK_VALID,
                loc::RESIDENT | loc::EVICTING => loc::EMPTY,
                other => other | (*s & loc::BRICK_VALID),
            };
        }
        let mut core = Core::new(pages, c.alloc.clone());
        // Same-filled pages live in the parent's core only, not on the brick: the child's
        // remote pages must read as the parent's did.
        core.fills = c.fills.clone();
        core.blocks = c.blocks.clone();
        // Protections are the program's: the child's fresh window gets them back below.
        core.prot = c.prot.clone();
        core.uncommitted = c.uncommitted;
        drop(c);
        let prot_runs: Vec<(u64, u64, u8)> = {
            let mut out: Vec<(u64, u64, u8)> = Vec::new();
            for (p, &b) in core.prot.iter().enumerate() {
                if b & prot::SET == 0 {
                    continue;
                }
                match out.last_mut() {
                    Some((s, n, ob)) if *ob == b && *s + *n == p as u64 => *n += 1,
                    _ => out.push((p as u64, 1, b)),
                }
            }
            out
        };
        let child = Runtime::assemble(parent.cfg.clone(), window, table, None, Some(core))?;
        for (placeholder, addr, len) in aside {
            rackmem_sys::move_mapping(placeholder, len, addr)?;
        }
        for (s, n, b) in prot_runs {
            let addr = child.inner.page_addr(s);
            rackmem_sys::mprotect(addr, (n * PAGE) as usize, i32::from(b & prot::MASK))?;
        }
        Ok(child)
    });
    match result {
        Ok(child) => {
            // The parent's runtime object stays allocated and unused in the child: its threads
            // do not exist here, and dropping it would run destructors against the parent's
            // brick connections (shared sockets). Its descriptors are closed, so the brick sees
            // the parent's connections end when the parent exits.
            close_parent_fds(parent);
            std::mem::forget(rt);
            set_global(child);
            FORKING.store(false, Ordering::Release);
        }
        Err(e) => {
            eprintln!("rackmem: the forked child cannot reach its remote memory: {e}");
            if matches!(&e, RuntimeError::Sys(m) if m.raw_os_error() == Some(libc::EEXIST)) {
                // Name what occupies the window's addresses: that is what to fix.
                let (lo, hi) = (parent.window.addr(), parent.window.addr() + parent.window.len());
                for line in std::fs::read_to_string("/proc/self/maps").unwrap_or_default().lines() {
                    let range = line.split_whitespace().next().unwrap_or("");
                    let mut ends = range.split('-').map(|x| usize::from_str_radix(x, 16).unwrap_or(0));
                    if let (Some(a), Some(b)) = (ends.next(), ends.next()) {
                        if a < hi && b > lo {
                            eprintln!("rackmem:   in the way: {line}");
                        }
                    }
                }
            }
            sys::exit_immediately(sys::EXIT_RUNTIME_FAILED);
        }
    }
}
