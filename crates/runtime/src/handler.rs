//! The fault handler thread: one per process, reading the window's userfaultfd and acting on
//! its messages in the order the kernel reports them. A page fault goes down the fault path
//! (`fault.rs`, [`Handler::fault`]); REMOVE, UNMAP and REMAP release pages in the core, so that
//! released memory reads as zeros afterwards, as it would without rackmem. The thread also
//! places itself beside the faulting thread (`placement.rs`) and parks for a fork.

use crate::config::HandlerMode;
use crate::placement::{self, Decision, Placement, Waiting};
use crate::readahead::ReadAheads;
use crate::{writeback, Inner, PAGE_SIZE};
use rackmem_uffd::Event;
use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use xxhash_rust::xxh3::xxh3_64;

/// Messages read per `read(2)` on the uffd.
const READ_BATCH: usize = 64;

/// The handler thread's state: its userfaultfd reading, and the fault path's buffers and
/// read-aheads.
pub(crate) struct Handler {
    pub(crate) inner: Arc<Inner>,
    pub(crate) pending: VecDeque<Event>,
    pub(crate) events: Vec<Event>,
    pub(crate) buf: Vec<u8>,
    pub(crate) ahead: ReadAheads,
    pub(crate) zero_hash: u64,
    /// Scratch: which pages of the run being installed lie in mapped segments.
    pub(crate) mapped: Vec<bool>,
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
}

pub(crate) fn run(inner: Arc<Inner>) {
    let zero_hash = xxh3_64(&[0u8; PAGE_SIZE]);
    let mut h = Handler {
        ahead: ReadAheads::new(inner.clone()),
        inner,
        pending: VecDeque::new(),
        events: Vec::with_capacity(READ_BATCH),
        buf: Vec::new(),
        zero_hash,
        mapped: Vec::new(),
        writes: Vec::new(),
        filled: false,
        placement: None,
        marks: [0; 7],
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

/// Lets a parked handler go on. `paused` stays set until the handler itself leaves `park`: a
/// second fork's `pause` that came before the handler woke up must find it parked (clearing it
/// here left that `pause` waiting for a park the handler, still inside `park`, never announced
/// again: PostgreSQL's postmaster, forking its children back to back, hung there).
pub(crate) fn resume(inner: &Inner) {
    inner.pause.store(false, Ordering::Release);
    let _parked = inner.paused.lock().unwrap_or_else(|e| e.into_inner());
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
    pub(crate) fn apply_queued_events(&mut self) {
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
        self.inner.release_pages(&mut c, first, last - first);
        drop(c);
        self.inner.core_cv.notify_all();
    }
}
