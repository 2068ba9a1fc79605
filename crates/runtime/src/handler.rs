//! The fault handler threads: up to one per CPU (`RACKMEM_HANDLERS`), all reading the window's
//! userfaultfd, so that faults of different pages are in flight at once (while one handler waits
//! on its brick or copies, another fetches, installs and wakes). A page fault goes down the
//! fault path (`fault.rs`, [`Handler::fault`]); REMOVE, UNMAP and REMAP release pages in the
//! core, so that released memory reads as zeros afterwards, as it would without rackmem. Events
//! are applied by whichever handler reads them, before it releases the event gate
//! ([`crate::inner::EventGate`]): no install slips between their reading and their effect.
//!
//! The first handler places itself beside the faulting thread (`placement.rs`) when one thread
//! does all the faulting; the others (helpers) then sleep, since one faulting thread has one
//! fault at a time, and wake when several threads fault. Every handler parks for a fork.
//!
//! The first handler also runs load control (`load.rs`): when several threads thrash the local
//! buffer together it serves one thread's faults and holds the others' for a bounded slice.

use crate::config::HandlerMode;
use crate::load::{self, LoadControl, Release, Verdict};
use crate::placement::{self, Decision, Placement, Waiting};
use crate::{start, writeback, Inner, PAGE_SIZE};
use rackmem_uffd::Event;
use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use xxhash_rust::xxh3::xxh3_64;

/// Messages read per `read(2)` on the uffd.
const READ_BATCH: usize = 64;

/// A handler thread's state: its userfaultfd reading and the fault path's buffers (the
/// read-aheads are shared: `Inner::aheads`).
pub(crate) struct Handler {
    pub(crate) inner: Arc<Inner>,
    /// This handler's number (0: the one that places itself).
    pub(crate) index: usize,
    pub(crate) pending: VecDeque<Event>,
    /// How many of the first `pending` faults were offered an early read (`pipeline`).
    pub(crate) early_seen: usize,
    /// Polls of the userfaultfd by `pipeline`, and how many in a row found nothing queued.
    pub(crate) early_polls: u32,
    pub(crate) early_empty: u32,
    pub(crate) events: Vec<Event>,
    pub(crate) buf: Vec<u8>,
    pub(crate) zero_hash: u64,
    /// Scratch: which pages of the run being installed lie in mapped segments.
    pub(crate) mapped: Vec<bool>,
    /// The run being installed lies in one mapped segment, at this byte offset: installed
    /// straight from it (see `fault.rs`, `direct_source`). Holding the segment keeps its
    /// mapping alive until the install is done.
    pub(crate) direct: Option<(Arc<crate::segment::Segment>, usize)>,
    /// The faulting page's access to its brick when it ends at the install (a direct one),
    /// for the bricks' level of C-AMAT (`stats::BrickLevels`).
    pub(crate) brick_access: Option<crate::stats::BrickAccess>,
    /// Buffers for the evictions done here (see `stage`).
    pub(crate) writes: Vec<writeback::BrickWrites>,
    /// The local buffer has filled since it was last less than half full (see
    /// `populate_resident`).
    pub(crate) filled: bool,
    /// Where this thread runs and how it waits, under `HandlerMode::Auto` on several CPUs.
    pub(crate) placement: Option<Placement>,
    /// When the fault being served started, then when it reached each
    /// [`Step`](rackmem_pager::fault::Step) (ns since the runtime's clock started).
    pub(crate) marks: [u64; 7],
    /// The window page of the fault being served (a huge unit's fault names its subpage).
    pub(crate) fault_page: u64,
    /// Huge units: where fetched units are received when no staging slot is spent
    /// (`huge.rs`).
    pub(crate) nursery: Option<rackmem_sys::Mapping>,
    /// Load control (the first handler, unless `RACKMEM_LOAD_CONTROL=0`), and a buffer for the
    /// faults it releases.
    load: Option<LoadControl>,
    released: Vec<load::Held>,
}

pub(crate) fn run(inner: Arc<Inner>, index: usize) {
    let zero_hash = xxh3_64(&[0u8; PAGE_SIZE]);
    let mut h = Handler {
        inner,
        index,
        pending: VecDeque::new(),
        early_seen: 0,
        early_polls: 0,
        early_empty: 0,
        events: Vec::with_capacity(READ_BATCH),
        buf: Vec::new(),
        zero_hash,
        mapped: Vec::new(),
        direct: None,
        brick_access: None,
        writes: Vec::new(),
        filled: false,
        placement: None,
        marks: [0; 7],
        fault_page: 0,
        nursery: None,
        load: None,
        released: Vec::new(),
    };
    if index == 0 && h.inner.cfg.load_control {
        h.load = Some(LoadControl::default());
    }
    if h.inner.huge() {
        h.nursery = Some(crate::huge::nursery(&h.inner));
    }
    let mode = h.inner.cfg.handler;
    if let (HandlerMode::Auto { spin_us }, 0) = (mode, index) {
        h.placement = Placement::new(crate::sys::thread_cpus(0), spin_us);
    }
    let mut last_activity = Instant::now();
    // When the handler last finished serving faults, and whether the faults it serves come
    // close enough together for a spin to catch the next one: the default handler spins after
    // a fault only if the one before came within the spin time of the handler going idle. A
    // spin before the first fault, or after sparse ones, is a CPU taken from the program for
    // nothing: a PostgreSQL backend of one connection takes 6 faults in its life, milliseconds
    // apart, and its young handler spun 200 us at its start and after each (on 2 vCPUs shared
    // by 4 clients' backends).
    let mut last_done = Instant::now();
    let mut faults_close = false;
    loop {
        if h.inner.pause.load(Ordering::Acquire) {
            // Held threads are served before parking: a fork's wait must not add to a hold.
            h.release_held(true);
            // A fork is coming: the child must not inherit a mask confined by the placement.
            if index == 0 {
                placement::unfollow();
            }
            park(&h.inner);
        }
        if index > 0 && h.pending.is_empty() && !helpers_wanted(&h.inner) {
            continue;
        }
        if index == 0 && h.pending.is_empty() && h.inner.give_back.swap(false, Ordering::AcqRel) {
            h.give_back();
        }
        if h.pending.is_empty() {
            let n = h.read_some();
            if n == 0 {
                // Nothing queued: load control may release held faults now (its slice ended,
                // or the favoured thread waits for something).
                if h.release_held(true) {
                    last_activity = Instant::now();
                    continue;
                }
                // A lazily forked child that lives a watchdog tick gets its watchdog (and
                // write-back thread) then: see `start::start_deferred_threads`.
                if index == 0
                    && h.inner.threads_deferred.load(Ordering::Acquire)
                    && h.inner.clock.elapsed() >= start::DEFERRED_WATCHDOG_AFTER
                {
                    start::start_deferred_threads(&h.inner);
                }
                let idle = match mode {
                    HandlerMode::BusyPoll => false,
                    HandlerMode::Blocking => true,
                    HandlerMode::Hybrid { spin_us } => last_activity.elapsed() > Duration::from_micros(spin_us),
                    // A helper runs only while several threads fault, as the first handler
                    // floats: it waits the same way.
                    HandlerMode::Auto { spin_us } if index > 0 => {
                        last_activity.elapsed() > Duration::from_micros(spin_us)
                    }
                    // One CPU (no placement) or beside the faulting thread: sleep at once.
                    HandlerMode::Auto { .. } => match h.placement.as_ref().map(Placement::waiting) {
                        None | Some(Waiting::Block) => true,
                        Some(Waiting::Spin { spin_us }) => {
                            !faults_close || last_activity.elapsed() > Duration::from_micros(spin_us)
                        }
                    },
                };
                if idle && index > 0 && matches!(mode, HandlerMode::Auto { .. }) {
                    // A helper sleeps until a handler finds faults queued behind the one it
                    // serves, rather than on the userfaultfd, which wakes every sleeper at every
                    // fault.
                    wait_for_call(&h.inner);
                    last_activity = Instant::now();
                } else if idle {
                    // Block until a fault comes or a fork's pause request rings: no timer, so an
                    // idle handler costs its CPU nothing; while load control holds faults, it
                    // wakes each millisecond to watch the favoured thread (holds are bounded).
                    let mut timeout = h
                        .load
                        .as_ref()
                        .filter(|l| l.held() > 0)
                        .map(|_| Duration::from_millis(1));
                    if index == 0 && h.inner.threads_deferred.load(Ordering::Acquire) {
                        // Wake for the deferred threads' start (above).
                        let left = start::DEFERRED_WATCHDOG_AFTER.saturating_sub(h.inner.clock.elapsed());
                        timeout = Some(timeout.map_or(left, |t| t.min(left)));
                    }
                    match rackmem_sys::wait_readable(h.inner.uffd.as_fd(), &h.inner.bell, timeout) {
                        // The bell rings for a fork: every handler must see it, so it stays rung
                        // until `resume`.
                        Ok(w) if w.rung && !h.inner.pause.load(Ordering::Acquire) => h.inner.bell.clear(),
                        Ok(_) => {}
                        Err(e) => h.inner.internal_error(&format!("poll on the userfaultfd failed: {e}")),
                    }
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            last_activity = Instant::now();
            if let HandlerMode::Auto { spin_us } = mode {
                faults_close = last_activity.duration_since(last_done) <= Duration::from_micros(spin_us);
            }
        }
        while let Some(ev) = h.pending.pop_front() {
            h.early_seen = h.early_seen.saturating_sub(1);
            h.handle(ev);
        }
        // A slice may end while faults keep coming.
        h.release_held(false);
        last_done = Instant::now();
    }
}

/// Asks every handler to park between faults and waits until all have (no fault in flight).
pub(crate) fn pause(inner: &Inner) {
    inner.pause.store(true, Ordering::Release);
    inner.bell.ring();
    // Helpers asleep while one thread faults wake to park.
    drop(inner.helpers_on.lock().unwrap_or_else(|e| e.into_inner()));
    inner.helpers_cv.notify_all();
    let mut parked = inner.paused.lock().unwrap_or_else(|e| e.into_inner());
    while *parked < inner.handlers() {
        parked = inner.paused_cv.wait(parked).unwrap_or_else(|e| e.into_inner());
    }
    assert_eq!(lock_core_in_flight(inner), 0, "handlers parked with faults in flight");
}

fn lock_core_in_flight(inner: &Inner) -> usize {
    inner.lock().in_flight_pages()
}

/// Lets the parked handlers go on. The parked count is the handlers' own to lower, as they leave
/// `park`: a second fork's `pause` that came before they woke must find them parked (clearing it
/// here left that `pause` waiting for a park a handler, still inside `park`, never announced
/// again: PostgreSQL's postmaster, forking its children back to back, hung there).
pub(crate) fn resume(inner: &Inner) {
    inner.bell.clear();
    inner.pause.store(false, Ordering::Release);
    let _parked = inner.paused.lock().unwrap_or_else(|e| e.into_inner());
    inner.paused_cv.notify_all();
}

fn park(inner: &Inner) {
    let mut parked = inner.paused.lock().unwrap_or_else(|e| e.into_inner());
    *parked += 1;
    inner.paused_cv.notify_all();
    while inner.pause.load(Ordering::Acquire) {
        parked = inner.paused_cv.wait(parked).unwrap_or_else(|e| e.into_inner());
    }
    *parked -= 1;
}

/// For a helper handler: true if helpers serve faults now; else sleeps until they do (or a
/// fork asks every handler to park) and returns false.
fn helpers_wanted(inner: &Inner) -> bool {
    let mut on = inner.helpers_on.lock().unwrap_or_else(|e| e.into_inner());
    if *on {
        return true;
    }
    while !*on && !inner.pause.load(Ordering::Acquire) {
        on = inner.helpers_cv.wait(on).unwrap_or_else(|e| e.into_inner());
    }
    false
}

/// For a helper under `HandlerMode::Auto`: sleeps until a handler calls it (faults are queued
/// behind the ones being served) or a fork asks every handler to park.
fn wait_for_call(inner: &Inner) {
    let mut on = inner.helpers_on.lock().unwrap_or_else(|e| e.into_inner());
    inner.idle_helpers.fetch_add(1, Ordering::SeqCst);
    loop {
        if inner.pause.load(Ordering::Acquire) {
            break;
        }
        if *on
            && inner
                .helper_calls
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1))
                .is_ok()
        {
            break;
        }
        on = inner.helpers_cv.wait(on).unwrap_or_else(|e| e.into_inner());
    }
    inner.idle_helpers.fetch_sub(1, Ordering::SeqCst);
}

/// Calls a sleeping helper if faults are queued on the userfaultfd behind the one just read
/// (several threads fault at once): a poll per fault read, a wake-up only when one is useful.
fn call_helper_if_queued(inner: &Inner) {
    if inner.idle_helpers.load(Ordering::SeqCst) == 0 || inner.helper_calls.load(Ordering::SeqCst) > 0 {
        return;
    }
    match rackmem_sys::wait_readable(inner.uffd.as_fd(), &inner.bell, Some(Duration::ZERO)) {
        Ok(w) if w.readable => {}
        _ => return,
    }
    let _on = inner.helpers_on.lock().unwrap_or_else(|e| e.into_inner());
    inner.helper_calls.fetch_add(1, Ordering::SeqCst);
    inner.helpers_cv.notify_one();
}

/// True if helper handlers may serve: `RACKMEM_HANDLERS` was set, or some segment is reached
/// over a link. A fault from a mapped segment is a memory copy with no wait in it, so on this
/// 2-vCPU machine a second handler only added wake-ups, gate waits and TLB shootdowns (two
/// threads at 25% local: 2.51 s with two handlers against 1.92 s with one, medians of
/// interleaved rounds, `docs/benchmarks.md`); over a link a handler waits on its brick, and
/// another can serve meanwhile.
fn helpers_useful(inner: &Inner) -> bool {
    inner.handlers() > 1 && (inner.cfg.handlers_explicit || inner.table.all().iter().any(|s| s.shared.get().is_none()))
}

/// At start: helpers serve from the start in the explicit handler modes (no placement), where
/// they are useful.
pub(crate) fn init_helpers(inner: &Inner) {
    if !matches!(inner.cfg.handler, HandlerMode::Auto { .. }) {
        set_helpers(inner, true);
    }
}

/// Turns the helper handlers on or off (the first handler's placement decided).
fn set_helpers(inner: &Inner, want: bool) {
    let want = want && helpers_useful(inner);
    let mut on = inner.helpers_on.lock().unwrap_or_else(|e| e.into_inner());
    if *on != want {
        *on = want;
        inner.helpers_active.store(want, Ordering::Relaxed);
        inner.helpers_cv.notify_all();
    }
}

/// Pages given back per turn between faults: 4 MiB, about a millisecond of moves and copies on
/// a mapped segment, so that faults queued meanwhile wait at most that long; a turn that gave
/// back that much asks for the next at once.
const GIVE_BACK_MOST: u64 = 1024;

/// The watchdog's check, at each of its ticks: when the local buffer holds more than the run's
/// budget now leaves this process (the run's other processes grew while this one was idle),
/// asks the first handler to give the room back and rings it awake. A process faulting gives
/// room back at its faults anyway; one that is idle would never.
pub(crate) fn ask_give_back_if_over(inner: &Inner) {
    if inner.run.is_none() {
        // Alone, the budget is a share of this process's own peak: it never shrinks.
        return;
    }
    let over = {
        let c = inner.lock();
        // In the core's units, as it counts what is resident (pages, or 2 MiB huge units).
        let budget = inner.budget_units(&c);
        // A little over is what a batch of victims in flight leaves: not worth a wake-up.
        let slack = (budget / 32).max(16 / inner.upp()).max(1);
        c.resident() > budget + slack
    };
    if over && !inner.give_back.swap(true, Ordering::AcqRel) {
        inner.bell.ring();
    }
}

impl Handler {
    /// Gives back what the local buffer holds over the budget (see [`ask_give_back_if_over`]),
    /// at most [`GIVE_BACK_MOST`] pages at a time.
    fn give_back(&mut self) {
        let inner = self.inner.clone();
        let moved = rackmem_pager::fault::give_back(&inner.core, self, GIVE_BACK_MOST);
        inner.stats.evictions_given_back.fetch_add(moved, Ordering::Relaxed);
        if moved >= GIVE_BACK_MOST {
            // Perhaps more over: another turn after the faults queued meanwhile.
            inner.give_back.store(true, Ordering::Release);
            inner.bell.ring();
        }
        if inner.cfg.verbose && moved > 0 {
            eprintln!(
                "rackmem: gave back {} KiB of local memory to the run's other processes",
                moved * PAGE_SIZE as u64 / 1024
            );
        }
    }

    /// Reads what is queued on the userfaultfd: one message when several handlers share it
    /// (each takes the next fault, so faults spread over handlers), a batch otherwise. Events
    /// are applied before the event gate opens; faults are kept for later, in order.
    fn read_some(&mut self) -> usize {
        if !self.inner.helpers_active.load(Ordering::Relaxed) {
            // One handler serves (the others sleep, or there are none): as before them.
            return self.read_and_apply(READ_BATCH);
        }
        // A spinning handler reads an empty queue again and again: a poll that finds nothing
        // keeps it from holding the event gate (and holding off other handlers' installs) each
        // time, which perf showed as the second handler's largest cost.
        match rackmem_sys::wait_readable(self.inner.uffd.as_fd(), &self.inner.bell, Some(Duration::ZERO)) {
            Ok(w) if !w.readable => 0,
            _ => self.read_and_apply(1),
        }
    }

    /// Pipelining (`RACKMEM_PIPELINE`): called just before this handler waits on a brick's
    /// link for the fault it serves. Reads the faults queued on the userfaultfd now (no wait; at
    /// most the pipeline's depth pending) and sends the brick read of each one the pager core
    /// allows (`rackmem_pager::fault::read_early`), so the brick answers them while this
    /// handler waits, and each is collected, in its turn, as a read-ahead of one page. Not while
    /// a fork waits for the handlers to park (pending faults would keep it waiting).
    pub(crate) fn pipeline(&mut self) {
        let inner = self.inner.clone();
        let depth = inner.cfg.pipeline;
        if depth == 0 || inner.huge() || inner.pause.load(Ordering::Acquire) {
            return;
        }
        // One faulting thread leaves nothing queued behind its fault: after 8 polls in a row
        // found nothing, poll at one fault in 16 (a poll cost a one-thread fault over a Unix link
        // 2%, 23.9 against 23.4 µs, `docs/benchmarks.md`).
        self.early_polls = self.early_polls.wrapping_add(1);
        let poll = self.early_empty < 8 || self.early_polls % 16 == 0;
        if poll && self.pending.len() < depth {
            let queued = rackmem_sys::wait_readable(inner.uffd.as_fd(), &inner.bell, Some(Duration::ZERO))
                .is_ok_and(|w| w.readable);
            if queued {
                self.early_empty = 0;
                self.read_and_apply(depth - self.pending.len());
            } else {
                self.early_empty = self.early_empty.saturating_add(1);
            }
        }
        let base = inner.window.addr();
        let end = base + inner.window.len();
        let faults: Vec<u64> = self
            .pending
            .iter()
            .skip(self.early_seen)
            .filter_map(|ev| match *ev {
                Event::Pagefault { addr, .. } if addr >= base && addr < end => Some(((addr - base) / PAGE_SIZE) as u64),
                _ => None,
            })
            .collect();
        self.early_seen = self.pending.len();
        for page in faults {
            rackmem_pager::fault::read_early(&inner.core, self, page);
        }
    }

    /// Reads whatever is queued and applies non-fault events at once (they are what makes a
    /// COPY return EAGAIN); faults are kept for later, in order.
    pub(crate) fn apply_queued_events(&mut self) {
        self.read_and_apply(READ_BATCH);
    }

    fn read_and_apply(&mut self, batch: usize) -> usize {
        let inner = self.inner.clone();
        inner.gate.enter_read();
        self.events.clear();
        let n = match inner.uffd.read_events(&mut self.events, batch) {
            Ok(n) => n,
            Err(e) => inner.internal_error(&format!("reading the userfaultfd failed: {e}")),
        };
        let evs: Vec<Event> = self.events.drain(..).collect();
        for ev in evs {
            match ev {
                Event::Pagefault { .. } => {
                    inner.stats.in_flight.begin(inner.now_ns());
                    self.pending.push_back(ev);
                    if batch == 1 && matches!(inner.cfg.handler, HandlerMode::Auto { .. }) && inner.handlers() > 1 {
                        call_helper_if_queued(&inner);
                    }
                }
                other => self.handle(other),
            }
        }
        inner.gate.leave_read();
        n
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Pagefault { addr, thread_id, .. } => {
                if !self.held_back(addr, thread_id) {
                    self.serve_fault(addr, thread_id);
                }
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

    /// Serves a fault of `thread_id` at `addr`, read from the userfaultfd or released by load
    /// control.
    fn serve_fault(&mut self, addr: usize, thread_id: u32) {
        self.place(thread_id);
        self.fault(addr);
        let inner = &self.inner;
        inner.stats.in_flight.end(inner.now_ns());
    }

    /// Load control: true if the fault is held (its thread stays blocked until
    /// [`Handler::release_held`] serves it). Only while this handler is the one serving: with
    /// helpers on, faults spread over handlers and none sees every thread's faults.
    fn held_back(&mut self, addr: usize, thread_id: u32) -> bool {
        // Borrowed field by field: this runs at every fault, and a clone of the `Arc` would
        // touch its shared count each time.
        let inner = &self.inner;
        let Some(lc) = self.load.as_mut() else {
            return false;
        };
        if inner.helpers_active.load(Ordering::Relaxed) {
            return false;
        }
        let now = inner.now_ns();
        let before = lc.favoured();
        let page = (addr.wrapping_sub(inner.window.addr()) / PAGE_SIZE) as u64;
        let verdict = lc.fault(thread_id, page, now, inner.stats.faults_remote.load(Ordering::Relaxed));
        if let (None, Some(tid)) = (before, lc.favoured()) {
            // The pages protected so far are both threads' hot pages: the favoured thread's
            // working set must be able to take the room of the others'.
            inner.lock().demote_hot();
            if inner.cfg.verbose {
                let (again, own) = lc.last_own();
                eprintln!(
                    "rackmem[{}]: several threads refault on the local buffer together, each mostly its own memory \
                     ({own} of {again} faults in places faulted before were the same thread's): load control favours thread {tid}",
                    std::process::id()
                );
            }
        }
        if verdict == Verdict::Hold {
            lc.hold(thread_id, now, addr);
            inner.stats.load_holds.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Serves the faults load control releases now (all of them when a fork is coming or
    /// helpers are on); `queue_empty`: nothing is queued on the userfaultfd. True if it served
    /// any.
    fn release_held(&mut self, queue_empty: bool) -> bool {
        // Runs after every batch of faults: with nothing favoured and nothing held there is
        // nothing to release (`LoadControl::due` would say so too).
        if self
            .load
            .as_ref()
            .is_none_or(|l| l.favoured().is_none() && l.held() == 0)
        {
            return false;
        }
        let inner = self.inner.clone();
        let Some(lc) = self.load.as_mut() else {
            return false;
        };
        let mut out = std::mem::take(&mut self.released);
        let stop = inner.pause.load(Ordering::Acquire) || inner.helpers_active.load(Ordering::Relaxed);
        let why = if stop {
            if lc.favoured().is_none() && lc.held() == 0 {
                None
            } else {
                lc.stop(&mut out);
                Some(Release::Off)
            }
        } else {
            let remote = inner.stats.faults_remote.load(Ordering::Relaxed);
            lc.due(inner.now_ns(), remote, queue_empty, load::thread_running, &mut out)
        };
        match why {
            Some(Release::Rotated) => inner.stats.load_rotations.fetch_add(1, Ordering::Relaxed),
            Some(Release::Stalled) => inner.stats.load_stalls.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        if matches!(why, Some(Release::Rotated | Release::Stalled)) && lc.favoured().is_some() {
            // Another thread's turn: what was protected is the previous one's working set.
            inner.lock().demote_hot();
        }
        if inner.cfg.verbose {
            if let Some(why) = why {
                let next = lc.favoured().map_or_else(|| "none".to_string(), |t| t.to_string());
                let (first, second) = lc.last_halves();
                eprintln!(
                    "rackmem[{}]: load control: {why:?}, {} held faults served, favoured thread now {next} \
                     (refaults in the last slice's halves: {first}, {second})",
                    std::process::id(),
                    out.len()
                );
            }
        }
        let served = !out.is_empty();
        let now = inner.now_ns();
        let longest = out.iter().map(|h| now.saturating_sub(h.since_ns)).max().unwrap_or(0);
        inner.stats.load_hold_max_ns.fetch_max(longest, Ordering::Relaxed);
        for h in out.drain(..) {
            self.serve_fault(h.addr, h.tid);
        }
        self.released = out;
        served
    }

    /// Counts a fault of `thread_id` for the handler's placement, following the thread that
    /// does the faulting or floating again (rarely: once per sampling window at most).
    fn place(&mut self, thread_id: u32) {
        let Some(p) = self.placement.as_mut() else {
            return;
        };
        let inner = &self.inner;
        let decision = p.fault(thread_id, inner.now_ns());
        if let Some(d) = decision {
            // One faulting thread has one fault at a time: the helpers would only take turns
            // with the handler that follows it.
            set_helpers(inner, d == Decision::Float);
        }
        let moved = match decision {
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
        self.inner.release_pages(&mut c, first, last - first);
        drop(c);
        self.inner.core_cv.notify_all();
    }
}
