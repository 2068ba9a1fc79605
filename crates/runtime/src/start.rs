//! Starting the runtime: links to the bricks (or the node agent), the window and staging area
//! registered with their userfaultfds, and the handler, write-back and watchdog threads.

use crate::config::Config;
use crate::error::RuntimeError;
use crate::inner::{EventGate, Inner};
use crate::process::{RUNTIME_THREAD, SPAWNING};
use crate::readahead::ReadAheads;
use crate::segment::{self, SegmentTable};
use crate::stats::Stats;
use crate::{
    agent, handler, size, sys, watchdog, writeback, Runtime, DEFAULT_AGENT_WINDOW, DEFAULT_SEGMENT_CAP,
    DEFAULT_SEGMENT_DIVISOR, PAGE, PAGE_SIZE, STAGING_SLOTS,
};
use rackmem_pager::{Core, Unit};
use rackmem_sys::Mapping;
use rackmem_transport::{BrickAddr, Link};
use rackmem_uffd::{Features, OpenOptions, RegisterMode, Uffd};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Longest a runtime start waits for a new runtime thread to mark itself.
const SPAWN_MARK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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
            return Self::assemble(cfg, window, SegmentTable::default(), Some(agent), None, false);
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
            let (pages, build) = segment::standalone(addr, seg, fault, &cfg)?;
            table.push(pages, build);
        }
        let window_pages = table.total_pages();
        if window_pages == 0 {
            return Err(RuntimeError::NoSegment("no bricks configured".into()));
        }
        let window = Mapping::reserve(window_pages as usize * PAGE_SIZE, 2 << 20)?;
        Self::assemble(cfg, window, table, None, None, false)
    }

    /// Builds the runtime over an already reserved window (also used by a forked child, with
    /// the core it inherits). `kept`: the window is the parent's, inherited by a lazy fork with
    /// the parent's resident pages still mapped (see `fork.rs`).
    pub(crate) fn assemble(
        cfg: Config,
        window: Mapping,
        table: SegmentTable,
        agent: Option<agent::Agent>,
        inherited: Option<Core>,
        kept: bool,
    ) -> Result<Arc<Runtime>, RuntimeError> {
        let window_pages = (window.len() / PAGE_SIZE) as u64;
        let unit = match &inherited {
            Some(c) => c.unit(),
            None => choose_unit(&cfg, &table, agent.is_some(), window.len()),
        };
        if unit == Unit::Huge {
            // Without MADV_HUGEPAGE a THP moved into the window is mapped by its 512 pages
            // (AnonHugePages stayed 0 through a scan, 1.7x slower). With it, a write fault on
            // a missing unit costs the kernel a THP allocated and zeroed before it finds the
            // userfaultfd and frees it (`__do_huge_pmd_anonymous_page`, kernel 6.18: 4% of a
            // scan's samples).
            rackmem_sys::madvise_hugepage(window.addr(), window.len())?;
        }
        let uffd = Uffd::open(&OpenOptions {
            // THREAD_ID: the handler places itself by who faults (`placement`).
            features: Features::EVENT_REMOVE | Features::EVENT_UNMAP | Features::EVENT_REMAP | Features::THREAD_ID,
            nonblocking: true,
        })?;
        // An inherited window holds the file mappings the parent lent window pages to (a
        // registration for missing faults covers anonymous memory only): register around them.
        let lent: Vec<(u64, u64)> = match (&inherited, kept) {
            (Some(c), true) => lent_runs(c.prot_bytes()),
            _ => Vec::new(),
        };
        // The window is `MADV_DONTFORK` outside a fork: only a fork through the C library's hooks,
        // whose child registers the window again, may inherit it (`fork::fork_prepare` lifts it
        // for that one fork). A child made any other way (a raw `clone`, `_Fork`) gets no window
        // and stops on a touch of it, rather than reading zeros where pages are remote. Not over
        // the program's file mappings (inherited as the program made them).
        let mut at = 0u64;
        for (s, n) in lent.into_iter().chain(std::iter::once((window_pages, 0))) {
            if s > at {
                rackmem_sys::madvise_dontfork(window.addr() + at as usize * PAGE_SIZE, (s - at) as usize * PAGE_SIZE)?;
                uffd.register(
                    window.addr() + at as usize * PAGE_SIZE,
                    (s - at) as usize * PAGE_SIZE,
                    RegisterMode {
                        missing: true,
                        wp: false,
                        minor: false,
                    },
                )?;
            }
            at = s + n;
        }
        let slots = match unit {
            Unit::Page => STAGING_SLOTS,
            Unit::Huge => crate::huge::HUGE_SLOTS,
        };
        let staging = match unit {
            Unit::Page => Mapping::reserve(slots * PAGE_SIZE, PAGE_SIZE)?,
            Unit::Huge => Mapping::reserve_huge(slots * unit.bytes() as usize)?,
        };
        rackmem_sys::madvise_dontfork(staging.addr(), staging.len())?;
        // SIGBUS: nothing reads this userfaultfd, so a touch of an empty slot would wait for
        // ever (a handler whose UFFDIO_COPY read from an emptied slot hung so, spinning in the
        // kernel once a debugger stopped it). With SIGBUS the kernel's own reads of a hole fail
        // with EFAULT, which the caller reports, and a user-space touch is a crash with a core,
        // never a silent wait.
        let stage_uffd = Uffd::open(&OpenOptions {
            features: Features::MOVE | Features::SIGBUS,
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
        let forked = inherited.is_some();
        let core = inherited.unwrap_or_else(|| {
            let mut c = Core::with_unit(window_pages, unit, slots as u32, cfg.eviction.build());
            c.set_recycle_min_pages(cfg.recycle_min_pages);
            // Read-ahead probes are a 4 KiB path's measure (huge units read no stream ahead).
            if unit == Unit::Page {
                c.set_probe_rate(cfg.readahead_sample);
            }
            // Each segment's window range is its home (segments attached later, from the node
            // agent, are not placed here: migrations to bricks need standalone bricks).
            for (i, _) in table.all().iter().enumerate() {
                if let Some((first, end)) = table.bounds(i) {
                    c.placement_mut().assign(first..end.min(window_pages), i as u32, 0);
                }
            }
            c
        });
        let stats = Stats::default();
        stats
            .window_bytes_allocated
            .store(core.regions().allocated_pages() * PAGE, Ordering::Relaxed);
        // A forked child's peak footprint starts at what it inherits, and a lazy fork's child
        // holds its parent's resident pages.
        stats
            .peak_committed_pages
            .store(core.committed_pages(), Ordering::Relaxed);
        stats.set_resident(core.resident() * unit.pages());
        let handlers = cfg.handlers.max(1);
        // Every runtime of a run (a forked child's too, built here again) takes a slot of the
        // run's budget; without one the process keeps a budget of its own and says why.
        let run = cfg.run_budget.as_deref().and_then(|path| {
            // A forked child's inherited window is not counted in the run's footprint: natively
            // it is the parent's pages shared copy-on-write, which a cgroup charges once.
            let inherited_pages = if forked { core.committed_pages() } else { 0 };
            crate::run_budget::RunBudget::attach(std::path::Path::new(path), inherited_pages)
                .map_err(|e| {
                    eprintln!(
                        "rackmem: this process (pid {}) has a local buffer of its own, not a share of the run's: {e}",
                        std::process::id()
                    )
                })
                .ok()
        });
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
            paused: Mutex::new(0),
            paused_cv: Condvar::new(),
            fault_started_ns: (0..handlers).map(|_| AtomicU64::new(0)).collect(),
            fault_addr: (0..handlers).map(|_| AtomicU64::new(0)).collect(),
            aheads: Mutex::new(ReadAheads::default()),
            gate: EventGate::default(),
            // Helpers serve from the start unless the first handler places itself: under
            // `Auto` they wait until it sees several threads fault.
            helpers_on: Mutex::new(false),
            helpers_cv: Condvar::new(),
            helpers_active: AtomicBool::new(false),
            idle_helpers: AtomicU32::new(0),
            helper_calls: AtomicU32::new(0),
            clock: Instant::now(),
            migrations: Default::default(),
            retired: Default::default(),
            run,
            give_back: AtomicBool::new(false),
            unit,
            holes: Mutex::new(Default::default()),
            fork_hot: Default::default(),
            parent_hot: Default::default(),
            // A lazily forked child starts its handlers only (see `start_deferred_threads`).
            threads_deferred: AtomicBool::new(kept),
            deferred_start: Mutex::new(()),
        });
        {
            let c = inner.lock();
            inner.budget_pages(&c);
        }
        // Waits until every thread started below has marked itself. Once, after all are
        // started, not after each: three waits in turn are three wake-ups in turn on a busy
        // machine, paid at every fork.
        let mut marks: Vec<Mark> = Vec::new();
        let started = |marks: &mut Vec<Mark>, r: std::io::Result<Mark>| match r {
            Ok(m) => {
                marks.push(m);
                Ok(())
            }
            Err(e) => {
                wait_marks(std::mem::take(marks));
                Err(RuntimeError::NoSegment(e.to_string()))
            }
        };
        handler::init_helpers(&inner);
        for index in 0..handlers {
            let name = if index == 0 {
                "rackmem-fault".to_string()
            } else {
                format!("rackmem-fault{index}")
            };
            started(
                &mut marks,
                spawn_thread(&inner, &name, Box::new(move |i| handler::run(i, index))),
            )?;
        }
        if !inner.threads_deferred.load(Ordering::Acquire) {
            started(&mut marks, spawn_thread(&inner, "rackmem-wb", Box::new(writeback::run)))?;
            started(
                &mut marks,
                spawn_thread(&inner, "rackmem-watchdog", Box::new(watchdog::run)),
            )?;
        }
        if inner.agent.as_ref().is_some_and(|a| a.orders().is_some()) {
            started(
                &mut marks,
                spawn_thread(&inner, "rackmem-orders", Box::new(crate::migrate::serve_orders)),
            )?;
        }
        wait_marks(marks);
        if inner.cfg.verbose {
            eprintln!(
                "rackmem[{}]: window {:#x}+{} in {} units on {} segment(s){}, local buffer {}, handler {:?}",
                std::process::id(),
                inner.window.addr(),
                size::format_size(inner.window.len() as u64),
                size::format_size(inner.unit.bytes()),
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
}

/// A runtime thread's mark, set once it has marked itself as the runtime's (see `spawn_thread`).
type Mark = Arc<(Mutex<bool>, Condvar)>;

/// What a runtime thread runs.
type ThreadMain = Box<dyn FnOnce(Arc<Inner>) + Send>;

/// Starts the runtime thread `name` running `f`. While SPAWNING is up, every thread's C
/// allocations go to the runtime's own table (see `spawning_runtime_thread`), the program's too:
/// the caller waits with [`wait_marks`] until the new thread has marked itself, so the window
/// lasts as long as a thread start, not as long as the scheduler leaves the new thread waiting
/// while the caller goes on allocating. (Under load in CI, Redis filled the table in 80 ms that
/// way and saw ENOMEM.)
fn spawn_thread(inner: &Arc<Inner>, name: &str, f: ThreadMain) -> std::io::Result<Mark> {
    let i = inner.clone();
    let marked: Mark = Arc::new((Mutex::new(false), Condvar::new()));
    let tell = marked.clone();
    SPAWNING.fetch_add(1, Ordering::AcqRel);
    // Started with the program's signals blocked (it inherits this mask): see
    // `with_async_signals_blocked`.
    let started = sys::with_async_signals_blocked(|| {
        std::thread::Builder::new()
            .name(name.into())
            .stack_size(256 << 10)
            .spawn(move || {
                RUNTIME_THREAD.with(|t| t.set(true));
                SPAWNING.fetch_sub(1, Ordering::AcqRel);
                let (done, cv) = &*tell;
                *done.lock().unwrap_or_else(|e| e.into_inner()) = true;
                cv.notify_all();
                drop(tell);
                sys::block_sigpipe();
                // A runtime thread that dies would leave the program waiting on a fault
                // forever: stop the program instead, saying why.
                let thread = std::thread::current().name().unwrap_or("rackmem").to_string();
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))).is_err() {
                    eprintln!("rackmem: internal error: the {thread} thread panicked; stopping the program");
                    sys::exit_immediately(sys::EXIT_BRICK_LOST);
                }
            })
    });
    match started {
        Ok(_) => Ok(marked),
        Err(e) => {
            SPAWNING.fetch_sub(1, Ordering::AcqRel);
            Err(e)
        }
    }
}

/// Waits until every thread of `marks` has marked itself. Bounded: a thread that has not run in
/// 10 s leaves the window open behind it (it closes when the thread runs), but does not hold
/// the caller here.
fn wait_marks(marks: Vec<Mark>) {
    for marked in marks {
        let (done, cv) = &*marked;
        let guard = done.lock().unwrap_or_else(|e| e.into_inner());
        drop(
            cv.wait_timeout_while(guard, SPAWN_MARK_WAIT, |d| !*d)
                .unwrap_or_else(|e| e.into_inner()),
        );
    }
}

/// How long a lazily forked child runs without its watchdog: one watchdog tick, before which
/// the watchdog would not have looked at anything.
pub(crate) const DEFERRED_WATCHDOG_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

/// Starts the write-back and watchdog threads of a lazily forked child, which starts with its
/// fault handlers only: at its first write-back job (`writeback::submit`), or once it has lived
/// [`DEFERRED_WATCHDOG_AFTER`] (its first handler's idle wait). Most children of a forking server
/// exit before either: PostgreSQL's backends of one connection live a few milliseconds, and the
/// two threads' start, stacks and exit were part of what each one cost beyond its native fork
/// (`docs/benchmarks.md`, "A backend's life"). Returns at once when they are running.
pub(crate) fn start_deferred_threads(inner: &Arc<Inner>) {
    if !inner.threads_deferred.load(Ordering::Acquire) {
        return;
    }
    let _one = inner.deferred_start.lock().unwrap_or_else(|e| e.into_inner());
    if !inner.threads_deferred.load(Ordering::Acquire) {
        return;
    }
    let mut marks = Vec::new();
    let wb: ThreadMain = Box::new(writeback::run);
    let watchdog: ThreadMain = Box::new(watchdog::run);
    for (name, f) in [("rackmem-wb", wb), ("rackmem-watchdog", watchdog)] {
        match spawn_thread(inner, name, f) {
            Ok(m) => marks.push(m),
            // Without its write-back thread a job would wait for ever: stop, saying why.
            Err(e) => inner.internal_error(&format!("cannot start the {name} thread: {e}")),
        }
    }
    wait_marks(marks);
    inner.threads_deferred.store(false, Ordering::Release);
}

/// Runs `(first page, pages)` of pages lent to file or shared mappings, in page order.
pub(crate) fn lent_runs(prot_bytes: &[u8]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (p, &b) in prot_bytes.iter().enumerate() {
        if b & rackmem_pager::prot::FOREIGN == 0 {
            continue;
        }
        match out.last_mut() {
            Some((s, n)) if *s + *n == p as u64 => *n += 1,
            _ => out.push((p as u64, 1)),
        }
    }
    out
}

/// The window's unit for a new runtime: huge units when asked for and possible, else 4 KiB
/// pages, saying why when huge units were asked for (never silently).
fn choose_unit(cfg: &Config, table: &SegmentTable, agent: bool, window_bytes: usize) -> Unit {
    if cfg.huge_pages != crate::config::HugePages::On {
        return Unit::Page;
    }
    let why_not = if agent {
        Some("segments from the node agent are not placed in whole 2 MiB units yet".to_string())
    } else if !rackmem_sys::thp_mode().advised_gets_huge() {
        Some(
            "transparent huge pages are off on this machine (/sys/kernel/mm/transparent_hugepage/enabled is \
             \"never\")"
                .to_string(),
        )
    } else if window_bytes % Unit::Huge.bytes() as usize != 0
        || (0..table.len()).any(|i| {
            table
                .bounds(i)
                .is_some_and(|(a, b)| a % Unit::Huge.pages() != 0 || b % Unit::Huge.pages() != 0)
        })
    {
        Some("the window's segments are not whole 2 MiB units".to_string())
    } else {
        None
    };
    match why_not {
        Some(why) => {
            eprintln!("rackmem: huge pages asked for, but {why}: using 4 KiB pages");
            Unit::Page
        }
        None => Unit::Huge,
    }
}
