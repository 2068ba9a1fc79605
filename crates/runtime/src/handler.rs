//! The fault handler: one thread per process that reads the window's userfaultfd and resolves
//! every missing-page fault, in the order the kernel reports them.
//!
//! For a fault it plans a *run* (the page, plus the following pages when the stream is
//! sequential), makes room in the local buffer by staging victims, reads the run's remote pages
//! from their bricks in one batched request per brick, checksums them, and installs the run with
//! one `UFFDIO_COPY` or `UFFDIO_MOVE`. Non-fault events (REMOVE, UNMAP, REMAP) change page states
//! so that released memory reads as zeros afterwards, as it would without rackmem.
//!
//! The handler never waits for a program thread; it may wait for the write-back thread (a free
//! staging slot, a page still being written back), which never waits for the handler.

use crate::config::HandlerMode;
use crate::placement::{self, Decision, Placement, Waiting};
use crate::recycle::{self, SpentRun};
use crate::{loc, writeback, Core, Inner, Job, Victim, PAGE, PAGE_SIZE};
use rackmem_uffd::{CopyMode, Event, MoveMode, UffdError};
use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};
use xxhash_rust::xxh3::xxh3_64;

/// Messages read per `read(2)` on the uffd.
const READ_BATCH: usize = 64;
/// Pages installed without write-protection: see "Dirty pages" in docs/architecture.md.
const INSTALL: CopyMode = CopyMode {
    write_protect: false,
    dontwake: false,
};

/// Moves one window page into its staging slot; false if it was not there to move.
fn move_one(inner: &Inner, page: u32, slot: u32) -> bool {
    let src = inner.page_addr(page as u64);
    let dst = inner.slot_addr(slot);
    let mode = MoveMode {
        dontwake: true,
        allow_src_holes: false,
    };
    let mut tries = 0;
    loop {
        match inner.stage_uffd.move_pages(dst, src, PAGE_SIZE, mode) {
            Ok(_) => return true,
            Err(UffdError::Busy { .. }) if tries < 3 => {
                // Shared with another process (should not happen: the window is not inherited
                // by fork); break the sharing and retry.
                rackmem_sys::break_cow(src);
                tries += 1;
            }
            Err(UffdError::Again { .. }) if tries < 1000 => {
                std::thread::yield_now();
                tries += 1;
            }
            Err(e) => {
                if inner.cfg.verbose {
                    eprintln!("rackmem: UFFDIO_MOVE of window page {src:#x}: {e}");
                }
                // Not present: it was released under us; nothing to write back.
                return false;
            }
        }
    }
}

/// The remote pages of a run that one brick holds: extents, and where each starts in the run.
struct BrickReads {
    brick: usize,
    extents: Vec<(u64, u32)>,
    starts: Vec<usize>,
}

/// A read of the next run of a sequential stream, sent when the current run was installed so
/// that the brick works while the program consumes this one (seed 000's prefetcher keeps the
/// link busy the same way). Used if the next fault is at `page`, nothing was released since,
/// and the pages are still remote; else dropped.
struct Ahead {
    /// The prefetch stream it serves (interleaved streams each keep their own).
    stream: usize,
    /// Order of sending: the oldest goes first when too many are in flight.
    seq: u64,
    page: u64,
    n: usize,
    seg: usize,
    epoch: u64,
    ticket: rackmem_transport::DetachedTicket,
    /// Where the pages land: spent slots, or a buffer of its own.
    spent: Option<SpentRun>,
    own: Option<Vec<u8>>,
}

/// Read-aheads in flight at most: two, so that the next run is always on its way while the
/// handler installs the current one (with one, the read of run k+1 goes out only after run k
/// is installed, and the next fault comes sooner than the brick answers).
const AHEAD_DEPTH: usize = 2;
/// Shortest run received into spent slots and moved in (shorter runs are copied).
const RECYCLE_MIN_PAGES: u64 = 4;
/// Read-aheads in flight over all streams.
const AHEAD_MAX: usize = 8;

struct Handler {
    inner: Arc<Inner>,
    pending: VecDeque<Event>,
    events: Vec<Event>,
    buf: Vec<u8>,
    ahead: Vec<Ahead>,
    ahead_seq: u64,
    /// Buffers for read-aheads that found no spent slots.
    spare_bufs: Vec<Vec<u8>>,
    zero_hash: u64,
    victims: Vec<u32>,
    /// Scratch: which pages of the run being installed lie in mapped segments.
    mapped: Vec<bool>,
    /// Scratch: the same-filled pages of the run being installed, as (index in the run, word),
    /// in index order.
    fills: Vec<(usize, u64)>,
    /// Buffers for the evictions done here (see `stage`).
    writes: Vec<writeback::BrickWrites>,
    /// The local buffer has filled since it was last less than half full (see
    /// `populate_resident`).
    filled: bool,
    /// Where this thread runs and how it waits, under `HandlerMode::Auto` on several CPUs.
    placement: Option<Placement>,
}

pub(crate) fn run(inner: Arc<Inner>) {
    let zero_hash = xxh3_64(&[0u8; PAGE_SIZE]);
    let mut h = Handler {
        inner,
        pending: VecDeque::new(),
        events: Vec::with_capacity(READ_BATCH),
        buf: Vec::new(),
        ahead: Vec::new(),
        ahead_seq: 0,
        spare_bufs: Vec::new(),
        zero_hash,
        victims: Vec::new(),
        mapped: Vec::new(),
        fills: Vec::new(),
        writes: Vec::new(),
        filled: false,
        placement: None,
    };
    let mode = h.inner.cfg.handler;
    if let HandlerMode::Auto { spin_us } = mode {
        h.placement = Placement::new(crate::sys::thread_cpus(0), spin_us);
    }
    let mut last_activity = Instant::now();
    loop {
        if h.inner.pause.load(Ordering::Acquire) {
            // A fork is coming: the child must not inherit a mask confined by the placement.
            placement::unfollow();
            park(&h.inner);
        }
        if h.pending.is_empty() {
            let n = h.read_some();
            if n == 0 {
                let idle = match mode {
                    HandlerMode::BusyPoll => false,
                    HandlerMode::Blocking => true,
                    HandlerMode::Hybrid { spin_us } => last_activity.elapsed() > Duration::from_micros(spin_us),
                    // One CPU (no placement) or beside the faulting thread: sleep at once.
                    HandlerMode::Auto { .. } => match h.placement.as_ref().map(Placement::waiting) {
                        None | Some(Waiting::Block) => true,
                        Some(Waiting::Spin { spin_us }) => last_activity.elapsed() > Duration::from_micros(spin_us),
                    },
                };
                if idle {
                    // Block until a fault comes or a fork's pause request rings: no timer, so an
                    // idle handler costs its CPU nothing.
                    match rackmem_sys::wait_readable(h.inner.uffd.as_fd(), &h.inner.bell, None) {
                        Ok(w) if w.rung => h.inner.bell.clear(),
                        Ok(_) => {}
                        Err(e) => h.inner.internal_error(&format!("poll on the userfaultfd failed: {e}")),
                    }
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            last_activity = Instant::now();
        }
        while let Some(ev) = h.pending.pop_front() {
            h.handle(ev);
        }
    }
}

/// Asks the handler to park between faults and waits until it has.
pub(crate) fn pause(inner: &Inner) {
    inner.pause.store(true, Ordering::Release);
    inner.bell.ring();
    let mut parked = inner.paused.lock().unwrap_or_else(|e| e.into_inner());
    while !*parked {
        parked = inner.paused_cv.wait(parked).unwrap_or_else(|e| e.into_inner());
    }
}

/// Lets a parked handler go on.
pub(crate) fn resume(inner: &Inner) {
    inner.pause.store(false, Ordering::Release);
    let mut parked = inner.paused.lock().unwrap_or_else(|e| e.into_inner());
    *parked = false;
    inner.paused_cv.notify_all();
}

fn park(inner: &Inner) {
    let mut parked = inner.paused.lock().unwrap_or_else(|e| e.into_inner());
    *parked = true;
    inner.paused_cv.notify_all();
    while inner.pause.load(Ordering::Acquire) {
        parked = inner.paused_cv.wait(parked).unwrap_or_else(|e| e.into_inner());
    }
    *parked = false;
}

impl Handler {
    fn read_some(&mut self) -> usize {
        self.events.clear();
        match self.inner.uffd.read_events(&mut self.events, READ_BATCH) {
            Ok(n) => {
                self.pending.extend(self.events.drain(..));
                n
            }
            Err(e) => self
                .inner
                .internal_error(&format!("reading the userfaultfd failed: {e}")),
        }
    }

    /// Reads whatever is queued and applies non-fault events at once (they are what makes a
    /// COPY return EAGAIN); faults are kept for later, in order.
    fn pump_events(&mut self) {
        self.events.clear();
        if let Err(e) = self.inner.uffd.read_events(&mut self.events, READ_BATCH) {
            self.inner
                .internal_error(&format!("reading the userfaultfd failed: {e}"));
        }
        let evs: Vec<Event> = self.events.drain(..).collect();
        for ev in evs {
            match ev {
                Event::Pagefault { .. } => self.pending.push_back(ev),
                other => self.handle(other),
            }
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Pagefault { addr, thread_id, .. } => {
                self.place(thread_id);
                self.fault(addr)
            }
            Event::Remove { start, end } | Event::Unmap { start, end } => {
                self.inner.stats.events.fetch_add(1, Ordering::Relaxed);
                self.released(start, end);
            }
            Event::Remap { from, to, len } => {
                self.inner.stats.events.fetch_add(1, Ordering::Relaxed);
                // The kernel moved part of the window elsewhere (an mremap that bypassed the
                // C library). The old range is gone; the new one is outside the window and its
                // missing pages cannot be served, so say so now rather than at the fault.
                eprintln!(
                    "rackmem: warning: window range {from:#x}+{len:#x} was moved to {to:#x} by mremap outside the C library; \
                     only its resident pages moved with it"
                );
                self.released(from, from + len);
            }
            Event::Fork { .. } | Event::Unknown { .. } => {}
        }
    }

    /// Counts a fault of `thread_id` for the handler's placement, following the thread that
    /// does the faulting or floating again (rarely: once per sampling window at most).
    fn place(&mut self, thread_id: u32) {
        let Some(p) = self.placement.as_mut() else {
            return;
        };
        let inner = &self.inner;
        let moved = match p.fault(thread_id, inner.now_ns()) {
            None => return,
            Some(Decision::Follow(tid)) if placement::followed() == Some(tid) => return,
            Some(Decision::Follow(tid)) => placement::follow(tid, p.allowed()).map(|cpu| (tid, cpu)),
            Some(Decision::Float) => {
                if !placement::unfollow() {
                    return;
                }
                None
            }
        };
        inner.stats.handler_moves.fetch_add(1, Ordering::Relaxed);
        if inner.cfg.verbose {
            match moved {
                Some((tid, cpu)) => eprintln!(
                    "rackmem[{}]: thread {tid} does the faulting: it and the fault handler now run on CPU {cpu}, the handler blocking",
                    std::process::id()
                ),
                None => eprintln!(
                    "rackmem[{}]: several threads fault: the fault handler floats over the program's CPUs, spinning",
                    std::process::id()
                ),
            }
        }
    }

    fn released(&mut self, start: usize, end: usize) {
        let base = self.inner.window.addr();
        let wend = base + self.inner.window.len();
        let (s, e) = (start.max(base), end.min(wend));
        if s >= e {
            return;
        }
        let first = ((s - base) / PAGE_SIZE) as u64;
        let last = (e - base).div_ceil(PAGE_SIZE) as u64;
        let mut c = self.inner.lock();
        c.release(first, last - first, &self.inner.stats);
        drop(c);
        self.inner.core_cv.notify_all();
    }

    fn fault(&mut self, addr: usize) {
        let inner = self.inner.clone();
        let t0 = inner.now_ns();
        inner.fault_started_ns.store(t0.max(1), Ordering::Release);
        inner.fault_addr.store(addr as u64, Ordering::Relaxed);
        inner.stats.faults.fetch_add(1, Ordering::Relaxed);
        let base = inner.window.addr();
        if addr < base || addr >= base + inner.window.len() {
            eprintln!("rackmem: fault at {addr:#x} outside the window; the range was moved by a raw mremap and its remote pages are not reachable");
            if let Err(e) = inner.uffd.poison(addr & !(PAGE_SIZE - 1), PAGE_SIZE, false) {
                inner.internal_error(&format!("cannot poison {addr:#x}: {e}"));
            }
            inner.fault_started_ns.store(0, Ordering::Release);
            return;
        }
        let page = ((addr - base) / PAGE_SIZE) as u64;
        self.serve(page, t0);
        let t1 = inner.now_ns();
        inner.stats.fault_latency.record(t1 - t0);
        inner.fault_started_ns.store(0, Ordering::Release);
    }

    fn serve(&mut self, page: u64, t0: u64) {
        let inner = self.inner.clone();
        loop {
            let mut c = inner.lock();
            match c.loc(page) {
                loc::RESIDENT => {
                    drop(c);
                    // Another thread faulted the same page first; its fault installed it.
                    inner.stats.faults_duplicate.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = inner.uffd.wake(inner.page_addr(page), PAGE_SIZE) {
                        inner.internal_error(&format!("UFFDIO_WAKE: {e}"));
                    }
                    return;
                }
                loc::EVICTING => {
                    // Being written back: wait for the write-back thread, then fetch.
                    while c.loc(page) == loc::EVICTING {
                        c = inner.core_cv.wait(c).unwrap_or_else(|e| e.into_inner());
                    }
                    continue;
                }
                _ => {}
            }
            // Plan the run.
            let fault = page;
            let plan = c.streams.plan(fault, inner.cfg.prefetch_pages.max(1));
            let (run, stream, down) = (plan.run, plan.slot, plan.down);
            let (region_start, region_end) = c
                .alloc
                .region_containing(fault)
                .map_or((fault, fault + 1), |(s, l)| (s, s + l));
            let budget = inner.budget_pages(&c);
            if c.resident < budget / 2 {
                // The program released memory: pages it touches now are not bound for eviction.
                self.filled = false;
            }
            let fits = |l: u8| l == loc::EMPTY || l == loc::REMOTE;
            let cap = (run as u64).min((budget / 4).max(1));
            let mut n = 1u64;
            // An ascending run starts at the fault; a descending one ends there.
            let mut start = fault;
            if down {
                while n < cap.min(fault - region_start + 1) && fits(c.loc(fault - n)) {
                    n += 1;
                }
                start = fault + 1 - n;
            } else {
                while n < cap.min(region_end.saturating_sub(fault).max(1)) && fits(c.loc(fault + n)) {
                    n += 1;
                }
            }
            // The read-ahead sent at the previous fault of this stream, if it covers this run.
            self.drop_stale_ahead(&mut c, fault);
            if !down {
                if let Some(a) = self.ahead.iter().find(|a| a.page == fault) {
                    n = a.n as u64;
                }
            }
            c.streams.advance(stream, start, start + n);
            // Make room; may wait for staging slots.
            let t_plan = inner.now_ns();
            let (c, staged) = self.choose_victims(c, n);
            drop(c);
            let t_choose = inner.now_ns();
            let full = staged.is_some();
            if let Some((id, victims)) = staged {
                self.stage(id, victims);
            }
            let t_stage = inner.now_ns();
            // Re-check: the state may have changed while we staged (events were not read, but
            // the write-back thread may have finished pages).
            let mut c = inner.lock();
            let mut kinds = Vec::with_capacity(n as usize);
            // A run stays within one protection: read-ahead must not fill a reservation
            // (PROT_NONE) next to committed memory, nor pages lent to a file mapping (no
            // longer registered with the userfaultfd).
            let fault_prot = c.prot_of(fault);
            // From the faulting page outward: the run must still contain it.
            let page = if down {
                let mut p = fault;
                while p >= start && fits(c.pages[p as usize] & loc::MASK) && c.prot_of(p) == fault_prot {
                    kinds.push(c.pages[p as usize]);
                    if p == start {
                        break;
                    }
                    p -= 1;
                }
                kinds.reverse();
                fault + 1 - kinds.len() as u64
            } else {
                for p in start..start + n {
                    let s = c.pages[p as usize];
                    if c.prot_of(p) != fault_prot {
                        break;
                    }
                    match s & loc::MASK {
                        loc::EMPTY | loc::REMOTE => kinds.push(s),
                        _ => break,
                    }
                }
                start
            };
            if kinds.is_empty() {
                continue;
            }
            let n = kinds.len() as u64;
            // Claim the run: RESIDENT before the copy, so a REMOVE event read while copying
            // (EAGAIN) turns the claimed pages back to EMPTY and we skip them.
            self.fills.clear();
            for (i, &s) in kinds.iter().enumerate() {
                let p = page + i as u64;
                let fill = if s & loc::MASK == loc::REMOTE && !c.fills.is_empty() {
                    c.fills.remove(&(p as u32))
                } else {
                    None
                };
                c.pages[p as usize] = match fill {
                    // The brick's copy is stale: at eviction, the page is compared with zeros
                    // (as a first touch is), so a page left as filled is never taken as clean.
                    Some(w) => {
                        self.fills.push((i, w));
                        loc::RESIDENT
                    }
                    None => loc::RESIDENT | (s & loc::BRICK_VALID),
                };
                // A page of a range that is not read-write cannot move to the staging area: it
                // stays resident until the program makes it read-write again or frees it.
                if c.movable(p) {
                    c.policy.inserted(p as u32);
                }
            }
            c.resident += n;
            let epoch = c.epoch;
            // The read-ahead holds exactly this run if nothing changed while we staged.
            let ahead = match self.ahead.iter().position(|a| a.page == page) {
                Some(i) => {
                    let a = self.ahead.swap_remove(i);
                    let remote = kinds.iter().all(|&k| k & loc::MASK == loc::REMOTE);
                    if a.n == kinds.len() && a.epoch == epoch && remote && self.fills.is_empty() {
                        Some(a)
                    } else {
                        self.drop_ahead(&mut c, a);
                        None
                    }
                }
                None => None,
            };
            // A read-ahead of any page claimed now would go stale: the page may be written and
            // written back before that read-ahead's fault comes.
            let mut i = 0;
            while i < self.ahead.len() {
                let a = &self.ahead[i];
                if a.page < page + n && page < a.page + a.n as u64 {
                    let a = self.ahead.swap_remove(i);
                    self.drop_ahead(&mut c, a);
                } else {
                    i += 1;
                }
            }
            // Receive into spent staging slots when a run of them is long enough (their pages
            // then move into the window); else into our buffer, copied in. A short run is
            // copied: for single pages a move gains nothing over the fresh page a copy takes
            // (GUPS at 25% local on shared memory: 80.0 k updates/s moving, 83.1 k copying).
            let mut spent = match &ahead {
                Some(_) => None,
                None if n >= RECYCLE_MIN_PAGES => recycle::take(&mut c, n as usize),
                None => None,
            };
            drop(c);
            inner.stats.add_resident(n);
            let t_claim = inner.now_ns();
            if let Some(a) = ahead {
                self.collect_ahead(page, a, &mut spent);
            } else {
                match spent.as_mut() {
                    Some(run) => fetch_into(&inner, page, &kinds, &self.fills, recycle::bytes(&inner, run)),
                    None => {
                        self.buf.clear();
                        self.buf.resize(n as usize * PAGE_SIZE, 0);
                        fetch_into(&inner, page, &kinds, &self.fills, &mut self.buf);
                    }
                }
            }
            let t_fetch = inner.now_ns();
            self.install(page, &kinds, epoch, spent);
            let t_install = inner.now_ns();
            if full {
                if !self.filled {
                    self.filled = true;
                    self.populate_resident();
                }
                self.populate_ahead(page, &kinds);
            }
            if run > 1 && !down && kinds.iter().all(|&k| k & loc::MASK == loc::REMOTE) {
                // Keep the stream's next runs on their way.
                let want = (run * 2).min(inner.cfg.prefetch_pages.max(1));
                loop {
                    let mine = self.ahead.iter().filter(|a| a.stream == stream);
                    let (count, next) = mine.fold((0, page + n), |(k, e), a| (k + 1, e.max(a.page + a.n as u64)));
                    if count >= AHEAD_DEPTH {
                        break;
                    }
                    if self.ahead.len() >= AHEAD_MAX {
                        // A stream that went quiet (or whose slot was reused) holds the oldest.
                        if let Some(i) = (0..self.ahead.len()).min_by_key(|&i| self.ahead[i].seq) {
                            let a = self.ahead.swap_remove(i);
                            let mut c = inner.lock();
                            self.drop_ahead(&mut c, a);
                        }
                    }
                    if !self.send_ahead(stream, next, want) {
                        break;
                    }
                }
            }
            // The breakdown describes remote faults only (a first touch fetches nothing).
            if kinds[0] & loc::MASK == loc::REMOTE {
                let b = &inner.stats.breakdown;
                b.make_room.record(t_choose - t_plan);
                b.stage.record(t_stage - t_choose);
                b.fetch.record(t_fetch - t_claim);
                b.install.record(t_install - t_fetch);
                b.total.record(t_install - t0);
            }
            return;
        }
    }

    /// Asks the bricks of mapped segments to give memory to the first-touched pages of the run
    /// just installed, without waiting. The local buffer is full, so these pages will be
    /// evicted; their first write-back can then be a memory copy into pages the brick already
    /// owns (see `Segment::write`) instead of a request over the link, and the brick allocates
    /// them on its own CPU, while the program runs.
    fn populate_ahead(&mut self, page: u64, kinds: &[u8]) {
        let inner = &self.inner;
        let mut i = 0;
        while i < kinds.len() {
            if kinds[i] & loc::MASK != loc::EMPTY {
                i += 1;
                continue;
            }
            let Some((index, off)) = inner.table.lookup(page + i as u64) else {
                return;
            };
            let seg_end = inner.table.bounds(index).map_or(0, |b| b.1);
            let mut j = i + 1;
            while j < kinds.len() && kinds[j] & loc::MASK == loc::EMPTY && page + (j as u64) < seg_end {
                j += 1;
            }
            populate(inner, index, off, ((j - i) * PAGE_SIZE) as u64);
            i = j;
        }
    }

    /// The local buffer has just filled: the pages touched first while it was filling were
    /// installed without POPULATE, and they are now the next victims. Asks the bricks of mapped
    /// segments to populate the resident pages they hold no data for, in runs (gaps of a few
    /// pages are populated too: one request instead of many).
    fn populate_resident(&mut self) {
        const GAP: u64 = 16;
        let inner = &self.inner;
        let mut runs: Vec<(u64, u64)> = Vec::new();
        {
            let c = inner.lock();
            for (p, &s) in c.pages.iter().enumerate() {
                if s & loc::MASK != loc::RESIDENT || s & loc::BRICK_VALID != 0 {
                    continue;
                }
                let p = p as u64;
                match runs.last_mut() {
                    Some(r) if p <= r.1 + GAP => r.1 = p + 1,
                    _ => runs.push((p, p + 1)),
                }
            }
        }
        for (mut p, end) in runs {
            // Along segment boundaries.
            while p < end {
                let Some((index, off)) = inner.table.lookup(p) else {
                    break;
                };
                let seg_end = inner.table.bounds(index).map_or(end, |b| b.1).min(end);
                populate(inner, index, off, (seg_end - p) * PAGE);
                p = seg_end;
            }
        }
    }

    /// Waits for the read-ahead `a` (of the run at `page`) into its buffer: its spent slots
    /// become `spent`, or its own buffer becomes `self.buf`.
    fn collect_ahead(&mut self, page: u64, mut a: Ahead, spent: &mut Option<SpentRun>) {
        let inner = self.inner.clone();
        let seg = segment_or_die(&inner, a.seg);
        let r = match (a.spent.as_mut(), a.own.take()) {
            (Some(run), _) => seg.fault.wait_detached(a.ticket, recycle::bytes(&inner, run)),
            (None, own) => {
                // The read-ahead's buffer becomes the install buffer; ours is kept for later.
                let old = std::mem::replace(&mut self.buf, own.unwrap_or_default());
                self.spare_bufs.push(old);
                seg.fault.wait_detached(a.ticket, &mut self.buf)
            }
        };
        if let Err(e) = r {
            inner.brick_lost(a.seg, &format!("fetching window page {:#x}", inner.page_addr(page)), &e);
        }
        *spent = a.spent;
        let s = &inner.stats;
        for p in page..page + a.n as u64 {
            s.refetched.insert(p);
        }
        s.faults_remote.fetch_add(1, Ordering::Relaxed);
        s.bytes_fetched.fetch_add(PAGE, Ordering::Relaxed);
        s.bytes_prefetched.fetch_add((a.n as u64 - 1) * PAGE, Ordering::Relaxed);
        s.pages_read_ahead.fetch_add(a.n as u64, Ordering::Relaxed);
    }

    /// Drops the read-aheads that can no longer be used: pages were released since they were
    /// sent, or the fault at `page` falls inside one rather than at its start (the stream
    /// jumped; its pages will be fetched the ordinary way).
    fn drop_stale_ahead(&mut self, c: &mut Core, page: u64) {
        let mut i = 0;
        while i < self.ahead.len() {
            let a = &self.ahead[i];
            let inside = page > a.page && page < a.page + a.n as u64;
            if a.epoch != c.epoch || inside {
                let a = self.ahead.swap_remove(i);
                self.drop_ahead(c, a);
            } else {
                i += 1;
            }
        }
    }

    /// Drops a read-ahead nobody will use: its response is discarded on arrival (nothing is
    /// written to its buffer), its spent slots are spent again.
    fn drop_ahead(&mut self, c: &mut Core, a: Ahead) {
        if let Some(v) = a.own {
            self.spare_bufs.push(v);
        }
        if let Some(seg) = self.inner.table.get(a.seg) {
            seg.fault.abandon_detached(a.ticket);
        }
        if let Some(run) = a.spent {
            self.drop_ahead_slots(c, run);
        }
    }

    /// Spent slots of a dropped read-ahead: spent again, or freed past the cap.
    fn drop_ahead_slots(&mut self, c: &mut Core, run: SpentRun) {
        if !recycle::give(c, run.start(), run.count()) {
            // Past the cap: free them (under the core lock; rare).
            let addr = self.inner.slot_addr(run.start());
            if let Err(e) = rackmem_sys::madvise_dontneed(addr, run.count() as usize * PAGE_SIZE) {
                self.inner.internal_error(&format!("freeing staging slots: {e}"));
            }
            c.free_slots.extend((run.start()..run.start() + run.count()).rev());
        }
    }

    /// Sends the read of the `want` pages from `page` if they are all remote on one segment (a
    /// shorter read if the remote stretch ends sooner), to be collected at a later fault.
    /// Returns whether it sent one.
    fn send_ahead(&mut self, stream: usize, page: u64, want: usize) -> bool {
        let inner = self.inner.clone();
        let mut c = inner.lock();
        let region_end = c.alloc.region_containing(page).map_or(page, |(s, l)| s + l);
        let budget = inner.budget_pages(&c);
        let limit = (want as u64)
            .min((budget / 4).max(1))
            .min(region_end.saturating_sub(page));
        let mut n = 0u64;
        // Same-filled pages are not read from the brick (its copy is stale): they end the run.
        while n < limit && c.loc(page + n) == loc::REMOTE && !c.fills.contains_key(&((page + n) as u32)) {
            n += 1;
        }
        if n < 2 {
            return false;
        }
        let Some((seg, off)) = inner.table.lookup(page) else {
            return false;
        };
        // A mapped segment is a memory copy away: nothing to overlap by reading ahead. (Table
        // lookups never wait, so this is fine under the core lock.)
        let Some(s) = inner.table.get(seg).filter(|s| s.shared.is_none()) else {
            return false;
        };
        // One segment, one extent: else the ordinary fetch does it at the fault.
        let Some((_, seg_end)) = inner.table.bounds(seg) else {
            return false;
        };
        let n = n.min(seg_end - page) as usize;
        let epoch = c.epoch;
        // Read-aheads may hold a quarter of the staging slots; past that they use buffers.
        let held: usize = self
            .ahead
            .iter()
            .filter_map(|a| a.spent.as_ref())
            .map(|r| r.count() as usize)
            .sum();
        let spent = if held + n <= crate::STAGING_SLOTS / 4 {
            recycle::take(&mut c, n)
        } else {
            None
        };
        drop(c);
        let own = match spent {
            Some(_) => None,
            None => {
                let mut v = self.spare_bufs.pop().unwrap_or_default();
                v.clear();
                v.resize(n * PAGE_SIZE, 0);
                Some(v)
            }
        };
        s.limiter.acquire((n * PAGE_SIZE) as u64);
        let sent = s
            .fault
            .submit_read(&[(off, (n * PAGE_SIZE) as u32)])
            .map(rackmem_transport::Ticket::detach);
        match sent {
            Ok(ticket) => {
                self.ahead_seq += 1;
                self.ahead.push(Ahead {
                    seq: self.ahead_seq,
                    stream,
                    page,
                    n,
                    seg,
                    epoch,
                    ticket,
                    spent,
                    own,
                });
                true
            }
            Err(e) => inner.brick_lost(
                seg,
                &format!("reading ahead at window page {:#x}", inner.page_addr(page)),
                &e,
            ),
        }
    }

    /// Picks victims so that `need` more pages fit in the budget, marks them EVICTING and gives
    /// each a staging slot. Returns the guard (it may have waited for slots).
    fn choose_victims<'a>(
        &mut self,
        mut c: MutexGuard<'a, Core>,
        need: u64,
    ) -> (MutexGuard<'a, Core>, Option<(u64, Vec<Victim>)>) {
        let inner = self.inner.clone();
        let budget = inner.budget_pages(&c);
        if c.resident + need <= budget {
            return (c, None);
        }
        // Evict a little more than needed so the next faults of a stream find room.
        let slack = (budget / 16).clamp(1, 32);
        let want = ((c.resident + need - budget + slack) as usize)
            .min(crate::STAGING_SLOTS / 2)
            .min(c.resident as usize);
        while c.free_slots.len() < want {
            if c.spent.is_empty() {
                if self.ahead.iter().any(|a| a.spent.is_some()) {
                    // Read-aheads hold the slots victims need: they go first.
                    while let Some(a) = self.ahead.pop() {
                        self.drop_ahead(&mut c, a);
                    }
                    continue;
                }
                c = inner.core_cv.wait(c).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            // Spent slots hold pages kept for recycling; victims need empty slots more.
            for (start, len) in recycle::take_all(&mut c) {
                if let Err(e) = rackmem_sys::madvise_dontneed(inner.slot_addr(start), len as usize * PAGE_SIZE) {
                    inner.internal_error(&format!("freeing staging slots: {e}"));
                }
                c.free_slots.extend((start..start + len).rev());
            }
        }
        self.victims.clear();
        c.policy.victims(want, &mut self.victims);
        // In page order, so that runs of pages get runs of slots (one MOVE, one madvise each).
        self.victims.sort_unstable();
        if self.victims.is_empty() {
            return (c, None);
        }
        let id = c.next_job;
        c.next_job += 1;
        let mut out = Vec::with_capacity(self.victims.len());
        for &p in &self.victims {
            let Some(slot) = c.free_slots.pop() else {
                break;
            };
            let s = c.pages[p as usize];
            c.pages[p as usize] = loc::EVICTING | (s & loc::BRICK_VALID);
            c.evicting.insert(p, id);
            let hash = c.hashes.remove(&p).unwrap_or(self.zero_hash);
            out.push(Victim {
                page: p,
                slot,
                brick_valid: s & loc::BRICK_VALID != 0,
                backed: false,
                hash,
                moved: false,
            });
        }
        c.resident -= out.len() as u64;
        inner.stats.sub_resident(out.len() as u64);
        (c, Some((id, out)))
    }

    /// Moves each victim out of the window into its staging slot and hands the batch to the
    /// write-back thread, which tells dirty pages from clean ones by checksum.
    fn stage(&mut self, id: u64, mut victims: Vec<Victim>) {
        let inner = self.inner.clone();
        victims.sort_unstable_by_key(|v| v.page);
        // Move runs of neighbouring pages into neighbouring slots with one ioctl each; fall back
        // to single pages when a run stops part-way.
        let mut i = 0;
        while i < victims.len() {
            let mut j = i + 1;
            while j < victims.len()
                && victims[j].page == victims[j - 1].page + 1
                && victims[j].slot == victims[j - 1].slot + 1
            {
                j += 1;
            }
            let n = j - i;
            if n > 1 {
                let src = inner.page_addr(victims[i].page as u64);
                let dst = inner.slot_addr(victims[i].slot);
                let mode = MoveMode {
                    dontwake: true,
                    allow_src_holes: false,
                };
                // Whatever the error, the pages before `done` are in their slots.
                let done = match inner.stage_uffd.move_pages(dst, src, n * PAGE_SIZE, mode) {
                    Ok(_) => n,
                    Err(e) => e.done() / PAGE_SIZE,
                };
                for v in &mut victims[i..i + done] {
                    v.moved = true;
                }
                i += done;
                if done == n {
                    continue;
                }
            }
            let v = &mut victims[i];
            v.moved = move_one(&inner, v.page, v.slot);
            i += 1;
        }
        inner.stats.evictions.fetch_add(victims.len() as u64, Ordering::Relaxed);
        self.find_backed(&mut victims);
        // Victims whose brick is a memory copy away are written back right here: handing them
        // to the write-back thread costs a wake-up and, on one CPU, two context switches, and
        // their slots become spent at once, ready to receive this fault's fetch. Pages that
        // need the link (ones the brick holds no memory for, other bricks) go to the thread,
        // off the fault's path.
        // Not while jobs are queued: a queued discard of memory the program freed would land
        // after this copy and wipe it, when the victims are pages of a new allocation at the
        // same place (their memory looks backed until the discard runs). Behind the queue, the
        // copy comes after the discard.
        let by_copy = victims.iter().all(|v| !v.moved || v.backed) && inner.jobs_busy.load(Ordering::Acquire) == 0;
        if by_copy {
            writeback::evict(&inner, id, &victims, &mut self.writes);
        } else {
            writeback::submit(&inner, Job::Evict { id, victims });
        }
    }

    /// Sets `backed` on the victims in mapped segments whose file holds memory for them: all
    /// brick-valid ones, and the others that `mincore` finds (populated by `populate_ahead`).
    fn find_backed(&mut self, victims: &mut [Victim]) {
        let inner = &self.inner;
        // Victims are in page order: one segment lookup per segment, not per victim.
        let mut i = 0;
        while i < victims.len() {
            let Some((index, _)) = inner.table.lookup(victims[i].page as u64) else {
                i += 1;
                continue;
            };
            let (first, seg_end) = inner.table.bounds(index).unwrap_or((0, 0));
            let n = victims[i..]
                .iter()
                .take_while(|v| (v.page as u64) < seg_end)
                .count()
                .max(1);
            let in_seg = &mut victims[i..i + n];
            i += n;
            let Some(seg) = inner.table.get(index) else {
                continue;
            };
            let Some(m) = seg.shared.as_ref() else {
                continue;
            };
            let mut k = 0;
            while k < in_seg.len() {
                if in_seg[k].brick_valid {
                    in_seg[k].backed = true;
                    k += 1;
                    continue;
                }
                // The run of neighbouring victims that the brick holds no data for.
                let mut j = k + 1;
                while j < in_seg.len() && !in_seg[j].brick_valid && in_seg[j].page == in_seg[j - 1].page + 1 {
                    j += 1;
                }
                let off = (in_seg[k].page as u64 - first) as usize * PAGE_SIZE;
                match m.pages_backed(off, (j - k) * PAGE_SIZE, &mut self.mapped) {
                    Ok(()) => {
                        for (v, &b) in in_seg[k..j].iter_mut().zip(&self.mapped) {
                            v.backed = b;
                        }
                    }
                    Err(e) if inner.cfg.verbose => eprintln!("rackmem: {e}"),
                    Err(_) => {}
                }
                k = j;
            }
        }
    }

    /// Installs the claimed run, writable (the checksums taken here tell a dirty page at
    /// eviction), retrying after EAGAIN and skipping pages released meanwhile. The run's bytes are in the
    /// spent slots `spent` (their pages are moved into the window) or in `self.buf` (copied).
    fn install(&mut self, page: u64, kinds: &[u8], epoch: u64, mut spent: Option<SpentRun>) {
        let inner = self.inner.clone();
        let n = kinds.len();
        // Checksums of the remote pages, for the write-back to tell dirty from clean; not of
        // pages in mapped segments (compared with the mapping itself) nor of first touches and
        // same-filled pages (compared with zeros).
        inner.table.mapped_pages(page, n, &mut self.mapped);
        let hashes: Vec<(u32, u64)> = {
            let src: &[u8] = match spent.as_mut() {
                Some(run) => recycle::bytes(&inner, run),
                None => &self.buf,
            };
            (0..n)
                .filter(|&i| kinds[i] & loc::MASK == loc::REMOTE && !self.mapped[i])
                .filter(|&i| !is_filled(&self.fills, i))
                .map(|i| {
                    (
                        (page + i as u64) as u32,
                        xxh3_64(&src[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]),
                    )
                })
                .collect()
        };
        if !hashes.is_empty() {
            inner.lock().hashes.extend(hashes);
        }
        // Which slots of `spent` gave their page to the window (the others keep theirs).
        let mut moved = vec![false; if spent.is_some() { n } else { 0 }];
        let mut i = 0usize;
        let mut cur_epoch = epoch;
        while i < n {
            if cur_epoch != inner.lock().epoch {
                // Pages were released while we copied: skip those no longer claimed.
                let c = inner.lock();
                cur_epoch = c.epoch;
                while i < n && c.loc(page + i as u64) != loc::RESIDENT {
                    i += 1;
                }
                if i >= n {
                    break;
                }
            }
            // Install the longest claimed stretch from i.
            let mut j = i + 1;
            {
                let c = inner.lock();
                while j < n && c.loc(page + j as u64) == loc::RESIDENT {
                    j += 1;
                }
            }
            let dst = inner.page_addr(page + i as u64);
            let r = match spent.as_ref() {
                Some(run) => {
                    let src = inner.slot_addr(run.start() + i as u32);
                    let r = self.move_in(dst, src, (j - i) * PAGE_SIZE);
                    let done = r.as_ref().map_or_else(UffdError::done, |d| *d);
                    moved[i..i + done / PAGE_SIZE].fill(true);
                    r
                }
                None => inner.uffd.copy(dst, &self.buf[i * PAGE_SIZE..j * PAGE_SIZE], INSTALL),
            };
            match r {
                Err(e) if spent.is_some() && !matches!(e, UffdError::Again { .. }) => {
                    // MOVE refused the rest of the stretch (a page table entry that is not
                    // empty for MOVE but is for COPY, such as a marker a kernel feature left on
                    // a hole). Copy the rest from the slots; a page really mapped there makes
                    // COPY fail the same way, and `installed_pages` wakes its waiters.
                    i += e.done() / PAGE_SIZE;
                    let Some(run) = spent.as_mut().filter(|_| i < j) else {
                        continue;
                    };
                    if inner.cfg.verbose && !matches!(e, UffdError::Exists { .. }) {
                        eprintln!("rackmem: UFFDIO_MOVE into the window at {dst:#x}: {e}; copying instead");
                    }
                    let at = inner.page_addr(page + i as u64);
                    let src = &recycle::bytes(&inner, run)[i * PAGE_SIZE..j * PAGE_SIZE];
                    let copied = inner.uffd.copy(at, src, INSTALL);
                    i += self.installed_pages(at, copied);
                }
                other => i += self.installed_pages(dst, other),
            }
        }
        if let Some(run) = spent {
            // Slots whose page moved are empty again: free for victims. The others still hold
            // a page: spent again (or freed, past the cap).
            let recycled = moved.iter().filter(|&&m| m).count() as u64;
            inner.stats.pages_recycled.fetch_add(recycled, Ordering::Relaxed);
            let mut c = inner.lock();
            for k in (0..n).rev() {
                let slot = run.start() + k as u32;
                if moved[k] {
                    c.free_slots.push(slot);
                } else if !recycle::give(&mut c, slot, 1) {
                    drop(c);
                    if let Err(e) = rackmem_sys::madvise_dontneed(inner.slot_addr(slot), PAGE_SIZE) {
                        inner.internal_error(&format!("freeing a staging slot: {e}"));
                    }
                    c = inner.lock();
                    c.free_slots.push(slot);
                }
            }
            drop(c);
            inner.core_cv.notify_all();
        }
    }

    /// How many pages an install ioctl at `dst` got past: what it placed, plus a page already
    /// mapped (its waiters are woken); after EAGAIN the pending events are applied first.
    fn installed_pages(&mut self, dst: usize, r: Result<usize, UffdError>) -> usize {
        match r {
            Ok(done) => done / PAGE_SIZE,
            Err(UffdError::Exists { done }) => {
                let at = dst + done;
                if let Err(e) = self.inner.uffd.wake(at, PAGE_SIZE) {
                    self.inner.internal_error(&format!("UFFDIO_WAKE at {at:#x}: {e}"));
                }
                done / PAGE_SIZE + 1
            }
            Err(UffdError::Again { done }) => {
                self.pump_events();
                done / PAGE_SIZE
            }
            Err(e) => self.inner.internal_error(&format!("installing at {dst:#x}: {e}")),
        }
    }

    /// Moves fetched pages from staging slots into the window and wakes the waiters. Returns
    /// the bytes moved.
    fn move_in(&mut self, dst: usize, src: usize, len: usize) -> Result<usize, UffdError> {
        let mode = MoveMode {
            dontwake: false,
            allow_src_holes: false,
        };
        self.inner.uffd.move_pages(dst, src, len, mode)
    }
}

/// Whether page `i` of a run is among its same-filled pages (`fills`, in index order).
fn is_filled(fills: &[(usize, u64)], i: usize) -> bool {
    fills.binary_search_by_key(&i, |&(k, _)| k).is_ok()
}

/// Reads the run's remote pages into `out` (one page per entry of `kinds`), fills the
/// same-filled ones (`fills`: index in the run and word, in index order) and zeroes the others.
fn fetch_into(inner: &Inner, page: u64, kinds: &[u8], fills: &[(usize, u64)], out: &mut [u8]) {
    for (i, &s) in kinds.iter().enumerate() {
        if s & loc::MASK != loc::REMOTE {
            out[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].fill(0);
        }
    }
    for &(i, w) in fills {
        writeback::fill_with(&mut out[i * PAGE_SIZE..(i + 1) * PAGE_SIZE], w);
    }
    // Every remote page is a re-fetch of a page evicted earlier (same-filled ones too).
    for (i, &s) in kinds.iter().enumerate() {
        if s & loc::MASK == loc::REMOTE {
            inner.stats.refetched.insert(page + i as u64);
        }
    }
    // Group remote pages per brick into extents, merging neighbours.
    let mut per_brick: Vec<BrickReads> = Vec::new();
    for (i, &s) in kinds.iter().enumerate() {
        if s & loc::MASK != loc::REMOTE || is_filled(fills, i) {
            continue;
        }
        let Some((brick, off)) = inner.table.lookup(page + i as u64) else {
            inner.internal_error(&format!("window page {} has no segment", page + i as u64));
        };
        let k = match per_brick.iter().position(|e| e.brick == brick) {
            Some(k) => k,
            None => {
                per_brick.push(BrickReads {
                    brick,
                    extents: Vec::new(),
                    starts: Vec::new(),
                });
                per_brick.len() - 1
            }
        };
        let e = &mut per_brick[k];
        let contiguous = match (e.extents.last(), e.starts.last()) {
            (Some(&(o, l)), Some(&st)) => o + l as u64 == off && st + l as usize / PAGE_SIZE == i,
            _ => false,
        };
        match e.extents.last_mut() {
            Some(last) if contiguous => last.1 += PAGE_SIZE as u32,
            _ => {
                e.extents.push((off, PAGE_SIZE as u32));
                e.starts.push(i);
            }
        }
    }
    let mut fetched_pages = 0u64;
    for BrickReads { brick, extents, starts } in &per_brick {
        let total: usize = extents.iter().map(|e| e.1 as usize).sum();
        let lost = |e: &dyn std::fmt::Display| {
            inner.brick_lost(*brick, &format!("fetching window page {:#x}", inner.page_addr(page)), e)
        };
        let seg = segment_or_die(inner, *brick);
        seg.limiter.acquire(total as u64);
        if let ([ext], [start]) = (extents.as_slice(), starts.as_slice()) {
            // The common case, one run on one brick: read straight into place.
            let at = start * PAGE_SIZE;
            if let Err(e) = seg.read(&[*ext], &mut out[at..at + total]) {
                lost(&e);
            }
        } else {
            let mut tmp = vec![0u8; total];
            if let Err(e) = seg.read(extents, &mut tmp) {
                lost(&e);
            }
            let mut at = 0;
            for (ext, &start) in extents.iter().zip(starts) {
                let len = ext.1 as usize;
                out[start * PAGE_SIZE..start * PAGE_SIZE + len].copy_from_slice(&tmp[at..at + len]);
                at += len;
            }
        }
        fetched_pages += (total / PAGE_SIZE) as u64;
        if seg.shared.is_some() {
            inner
                .stats
                .bytes_fetched_shared
                .fetch_add(total as u64, Ordering::Relaxed);
        }
    }
    let s = &inner.stats;
    if kinds[0] & loc::MASK == loc::REMOTE {
        s.faults_remote.fetch_add(1, Ordering::Relaxed);
        s.bytes_fetched.fetch_add(PAGE, Ordering::Relaxed);
        s.bytes_prefetched
            .fetch_add((fetched_pages.saturating_sub(1)) * PAGE, Ordering::Relaxed);
    } else {
        s.faults_zero.fetch_add(1, Ordering::Relaxed);
        s.bytes_prefetched.fetch_add(fetched_pages * PAGE, Ordering::Relaxed);
    }
}

/// Asks the brick of segment `index`, if it is mapped, to populate `len` bytes at `off`,
/// without waiting. Advisory: if it fails, those pages' first write-back goes over the link.
fn populate(inner: &Inner, index: usize, off: u64, len: u64) {
    let Some(seg) = inner.table.get(index).filter(|s| s.shared.is_some()) else {
        return;
    };
    let sent = seg.fault.submit_populate(off, len).map(|t| t.detach());
    match sent {
        Ok(t) => seg.fault.abandon_detached(t),
        Err(e) if inner.cfg.verbose => eprintln!("rackmem: populating brick memory ahead: {e}"),
        Err(_) => {}
    }
}

/// The segment at `index`; its absence is a bug (pages of the window always have one).
pub(crate) fn segment_or_die(inner: &Inner, index: usize) -> std::sync::Arc<crate::segment::Segment> {
    match inner.table.get(index) {
        Some(s) => s,
        None => inner.internal_error(&format!("segment {index} is not attached")),
    }
}
