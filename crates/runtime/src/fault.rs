//! The fault path's userfaultfd and link side: [`Handler`] implements the pager core's
//! [`Backend`], and [`Handler::fault`] hands every fault the userfaultfd reports to
//! [`rackmem_pager::fault::serve`], which runs the fault path top to bottom (plan, make room,
//! claim, fetch, install; read its module documentation first).
//!
//! What the backend does for each step:
//!
//! - **make room**: victims leave the window with `UFFDIO_MOVE` into their staging slots (runs
//!   of neighbouring pages in one call) and are written back right here when their brick is a
//!   memory copy away, else handed to the write-back thread (`writeback.rs`);
//! - **fetch**: one batched read per brick into the install buffer or the run's spent slots, or
//!   the read-ahead sent at the previous fault of the stream (`readahead.rs`);
//! - **install**: `UFFDIO_COPY`, or `UFFDIO_MOVE` from spent slots (`recycle.rs`), which wakes
//!   the faulting threads; EAGAIN reads and applies the queued events (`handler.rs`);
//! - after the install: mapped bricks populate memory ahead of the next write-backs
//!   (`populate.rs`) and a sequential stream gets its next runs read.
//!
//! The handler never waits for a program thread; it may wait for the write-back thread (a free
//! staging slot, a page still being written back), which never waits for the handler.

use crate::handler::Handler;
use crate::readahead::{self, Ahead, ReadAheads};
use crate::recycle;
use crate::{writeback, Inner, Job, Victim, PAGE, PAGE_SIZE};
use rackmem_pager::fault::{Backend, Install, Plan, Run, Step};
use rackmem_pager::{Core, Source};
use rackmem_uffd::{CopyMode, MoveMode, UffdError};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use xxhash_rust::xxh3::xxh3_64;

/// Pages installed without write-protection: see "Dirty pages" in docs/architecture.md.
const INSTALL: CopyMode = CopyMode {
    write_protect: false,
    dontwake: false,
};

/// Where a page ended up after `UFFDIO_MOVE` from `src` to `dst` refused it (see "Swapped pages"
/// in docs/architecture.md): the kernel (6.18 here) can move a page it found swapped out and
/// still report it not moved (the count stops before it, or the call fails with `ENOENT` or
/// `EEXIST`). Only the page table says what happened.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum MoveOutcome {
    /// At `dst`, and `src` is empty: moved after all.
    Moved,
    /// Still at `src`, `dst` empty: not moved; try again.
    NotMoved,
    /// Neither: the page was released under us.
    Gone,
    /// Both hold a page.
    Both,
}

pub(crate) fn outcome(inner: &Inner, src: usize, dst: usize) -> MoveOutcome {
    let entry = |a: usize| match rackmem_sys::page_entry(a) {
        Ok(e) => e != rackmem_sys::PageEntry::None,
        Err(e) => inner.internal_error(&format!("cannot read where a moved page went: {e}")),
    };
    match (entry(src), entry(dst)) {
        (false, true) => MoveOutcome::Moved,
        (true, false) => MoveOutcome::NotMoved,
        (false, false) => MoveOutcome::Gone,
        (true, true) => MoveOutcome::Both,
    }
}

/// True if staging slot `slot` has a page (in memory or swapped), as a spent slot must.
fn slot_holds_page(inner: &Inner, slot: u32) -> bool {
    match rackmem_sys::page_entry(inner.slot_addr(slot)) {
        Ok(e) => e != rackmem_sys::PageEntry::None,
        Err(e) => inner.internal_error(&format!("cannot read whether staging slot {slot} holds a page: {e}")),
    }
}

/// Counts a move the kernel did without reporting it, and says so once.
pub(crate) fn recounted(inner: &Inner, src: usize, dst: usize) {
    if inner.stats.moves_recounted.fetch_add(1, Ordering::Relaxed) == 0 && inner.cfg.verbose {
        eprintln!(
            "rackmem: UFFDIO_MOVE {src:#x} -> {dst:#x} moved a page it reported as not moved (a swapped-out \
             page); found in the page table (counted as moves_recounted in --stats)"
        );
    }
}

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
        // SAFETY: a window page (only raw addresses reach the window) into a free staging slot
        // of this eviction, which no slice points into until the move is recorded.
        let e = match unsafe { inner.stage_uffd.move_pages(dst, src, PAGE_SIZE, mode) } {
            Ok(_) => return true,
            Err(e) => e,
        };
        tries += 1;
        match e {
            UffdError::Busy { .. } if tries <= 3 => {
                // Shared with another process (a lazy fork's parent or child, copy-on-write):
                // made private (the kernel copies it, or takes it back whole once the other side
                // has its own copy), then moved.
                rackmem_sys::break_cow(src);
                inner.stats.evictions_shared.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            UffdError::Again { .. } if tries <= 1000 => {
                std::thread::yield_now();
                continue;
            }
            _ => {}
        }
        match outcome(inner, src, dst) {
            MoveOutcome::Moved => {
                recounted(inner, src, dst);
                return true;
            }
            MoveOutcome::NotMoved if tries <= 1000 => std::thread::yield_now(),
            MoveOutcome::Gone => {
                if inner.cfg.verbose {
                    eprintln!("rackmem: UFFDIO_MOVE of window page {src:#x}: {e}; released meanwhile");
                }
                return false;
            }
            // A free slot holding a page while its victim is still in the window: the slot
            // bookkeeping (checked by the pager's simulation) says this cannot happen.
            other => inner.internal_error(&format!(
                "evicting window page {src:#x} into staging slot {slot}: {e}; page table: {other:?}"
            )),
        }
    }
}

/// Moves a window page that is not read-write into its staging slot. `UFFDIO_MOVE` moves only
/// between writable mappings with equal protections (`validate_move_areas` in the kernel's
/// `mm/userfaultfd.c`), and removing the page any other way (`MADV_DONTNEED`) would raise a
/// REMOVE event this handler itself must read. So the page is made read-write for the move and
/// its protection restored at once: the window page is then missing, and any access the
/// protection forbids faults as before. For those few microseconds an access the protection
/// forbids would succeed; the program's own `mprotect` of the page waits for its eviction.
/// False if the page was not there (released meanwhile).
fn move_protected(inner: &Inner, page: u32, slot: u32, prot_byte: u8) -> bool {
    let src = inner.page_addr(page as u64);
    let prot = rackmem_pager::prot::decode(prot_byte);
    // SAFETY: a window page being evicted (only raw addresses reach it); the program's own
    // mprotect of it waits until its eviction is over, and the next call restores what it asked.
    if let Err(e) = unsafe { rackmem_sys::mprotect(src, PAGE_SIZE, libc::PROT_READ | libc::PROT_WRITE) } {
        inner.internal_error(&format!("cannot open window page {src:#x} for its eviction: {e}"));
    }
    let moved = move_one(inner, page, slot);
    // SAFETY: the same window page, given back the protection the program asked for it.
    if let Err(e) = unsafe { rackmem_sys::mprotect(src, PAGE_SIZE, prot) } {
        inner.internal_error(&format!(
            "cannot restore the protection {prot:#x} of window page {src:#x}: {e}"
        ));
    }
    moved
}

/// Begins the faulting page's access to the brick that holds it (the bricks' level of C-AMAT),
/// when a brick serves it: its read-ahead's brick, or the segment the table gives its page.
fn brick_access(inner: &Inner, run: &Run<Ahead>) -> Option<crate::stats::BrickAccess> {
    if run.kinds.first() != Some(&Source::Brick) {
        return None;
    }
    let seg = match &run.ahead {
        Some(a) => a.seg,
        None => inner.table.lookup(run.page)?.0,
    };
    Some(inner.stats.bricks.begin(&inner.segment(seg).addr, inner.now_ns()))
}

/// The remote pages of a run that one brick holds: extents, and where each starts in the run.
struct BrickReads {
    brick: usize,
    extents: Vec<(u64, u32)>,
    starts: Vec<usize>,
}

impl Handler {
    /// A fault the userfaultfd reported at `addr`: served by the pager core's fault path, timed.
    pub(crate) fn fault(&mut self, addr: usize) {
        let inner = self.inner.clone();
        let t0 = inner.now_ns();
        let me = self.index;
        inner.fault_started_ns[me].store(t0.max(1), Ordering::Release);
        inner.fault_addr[me].store(addr as u64, Ordering::Relaxed);
        inner.stats.faults.fetch_add(1, Ordering::Relaxed);
        let base = inner.window.addr();
        if addr < base || addr >= base + inner.window.len() {
            eprintln!("rackmem: fault at {addr:#x} outside the window; the range was moved by a raw mremap and its remote pages are not reachable");
            if let Err(e) = inner.uffd.poison(addr & !(PAGE_SIZE - 1), PAGE_SIZE, false) {
                inner.internal_error(&format!("cannot poison {addr:#x}: {e}"));
            }
            inner.fault_started_ns[me].store(0, Ordering::Release);
            return;
        }
        let page = ((addr - base) / PAGE_SIZE) as u64;
        self.marks = [t0; 7];
        self.fault_page = page;
        rackmem_pager::fault::serve(&inner.core, self, page / inner.upp());
        let t1 = inner.now_ns();
        self.end_brick_access(t1);
        inner.stats.fault_latency.record(t1 - t0);
        inner.fault_started_ns[me].store(0, Ordering::Release);
    }

    /// Ends the access to a brick left open for the install, if any.
    fn end_brick_access(&mut self, at_ns: u64) {
        if let Some(a) = self.brick_access.take() {
            self.inner.stats.bricks.end(a, at_ns);
        }
    }

    /// Moves each victim out of the window into its staging slot and hands the batch to the
    /// write-back thread, which tells dirty pages from clean ones by checksum.
    pub(crate) fn stage(&mut self, id: u64, mut victims: Vec<Victim>) {
        if self.inner.huge() {
            return self.huge_stage(id, victims);
        }
        let inner = self.inner.clone();
        victims.sort_unstable_by_key(|v| v.page);
        // Move runs of neighbouring pages into neighbouring slots with one ioctl each; fall back
        // to single pages when a run stops part-way.
        let mut i = 0;
        while i < victims.len() {
            if victims[i].prot != 0 {
                let v = &mut victims[i];
                v.moved = move_protected(&inner, v.page, v.slot, v.prot);
                if v.moved {
                    inner.stats.evictions_protected.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < victims.len()
                && victims[j].page == victims[j - 1].page + 1
                && victims[j].slot == victims[j - 1].slot + 1
                && victims[j].prot == 0
            {
                j += 1;
            }
            let n = j - i;
            if n > 1 {
                let mode = MoveMode {
                    dontwake: true,
                    allow_src_holes: false,
                };
                let mut from = i;
                // The page a break of sharing was tried on: a second EBUSY there leaves it to
                // `move_one` below.
                let mut broken = usize::MAX;
                loop {
                    let src = inner.page_addr(victims[from].page as u64);
                    let dst = inner.slot_addr(victims[from].slot);
                    // Whatever the error, the pages before `done` are in their slots.
                    // SAFETY: window pages (only raw addresses reach the window) into free
                    // staging slots of this eviction, which no slice points into until the moves
                    // are recorded.
                    let r = unsafe { inner.stage_uffd.move_pages(dst, src, (j - from) * PAGE_SIZE, mode) };
                    let done = r.as_ref().map_or_else(UffdError::done, |d| *d) / PAGE_SIZE;
                    for v in &mut victims[from..from + done] {
                        v.moved = true;
                    }
                    from += done;
                    match r {
                        // A page still shared with a forked child or parent (copy-on-write):
                        // made private where the move stopped, and the run goes on from it
                        // (cheaper than moving the rest one by one).
                        Err(UffdError::Busy { .. }) if from < j && from != broken => {
                            broken = from;
                            rackmem_sys::break_cow(inner.page_addr(victims[from].page as u64));
                            inner.stats.evictions_shared.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => break,
                    }
                }
                i = from;
                if i == j {
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
            let Some((index, first_off, seg_end)) = inner.table.lookup_run(victims[i].page as u64) else {
                i += 1;
                continue;
            };
            // The segment page of window page `first` (the range may have moved there).
            let first = (victims[i].page as u64).wrapping_sub(first_off / PAGE);
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
            let Some(m) = seg.shared.get() else {
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
                let off = (in_seg[k].page as u64).wrapping_sub(first) as usize * PAGE_SIZE;
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

    /// What an install ioctl at `dst` got done; other errors are the runtime's own bugs.
    fn installed_pages(&mut self, dst: usize, r: Result<usize, UffdError>) -> Install {
        match r {
            Ok(done) => Install::Placed(done / PAGE_SIZE),
            Err(UffdError::Exists { done }) => Install::Exists(done / PAGE_SIZE),
            Err(UffdError::Again { done }) => Install::Again(done / PAGE_SIZE),
            Err(e) => self.inner.internal_error(&format!("installing at {dst:#x}: {e}")),
        }
    }
}

impl Backend for Handler {
    type Ahead = Ahead;

    fn budget(&mut self, c: &Core) -> u64 {
        self.inner.budget_units(c)
    }

    fn prefetch_pages(&self) -> usize {
        if self.inner.huge() {
            return crate::huge::HUGE_RUN_UNITS;
        }
        self.inner.cfg.prefetch_pages
    }

    fn read_around_pages(&self) -> usize {
        // A unit is already 2 MiB.
        if self.inner.huge() {
            return 0;
        }
        self.inner.cfg.read_around_pages
    }

    fn zero_hash(&self) -> u64 {
        self.zero_hash
    }

    fn wait<'a>(&mut self, _lock: &'a Mutex<Core>, c: MutexGuard<'a, Core>) -> MutexGuard<'a, Core> {
        self.inner.core_cv.wait(c).unwrap_or_else(|e| e.into_inner())
    }

    fn mark(&mut self, step: Step) {
        self.marks[step as usize + 1] = self.inner.now_ns();
    }

    fn notify(&mut self) {
        self.inner.core_cv.notify_all();
    }

    fn wake(&mut self, page: u64) {
        let at = self.inner.unit_addr(page);
        if let Err(e) = self.inner.uffd.wake(at, self.inner.unit_bytes()) {
            self.inner.internal_error(&format!("UFFDIO_WAKE at {at:#x}: {e}"));
        }
    }

    fn already_installed(&mut self, page: u64) {
        self.inner.stats.faults_duplicate.fetch_add(1, Ordering::Relaxed);
        if self.inner.huge() {
            return self.fill_hole();
        }
        self.wake(page);
    }

    fn claimed_elsewhere(&mut self, _page: u64) {
        self.inner.stats.faults_duplicate.fetch_add(1, Ordering::Relaxed);
    }

    fn install_gate(&mut self, enter: bool) {
        if enter {
            self.inner.gate.enter_install();
        } else {
            self.inner.gate.leave_install();
        }
    }

    fn move_out(&mut self, _lock: &Mutex<Core>, id: u64, victims: Vec<Victim>) {
        // The core's count, not a difference: with several handlers, claims by others land
        // between this batch's choice and here.
        let resident = self.inner.lock().resident();
        self.inner.stats.set_resident(resident * self.inner.upp());
        self.stage(id, victims);
    }

    /// Copies the stretch from the install buffer, or moves it from the run's spent slots
    /// (copying the rest if a move is refused part-way).
    fn install(&mut self, run: &mut Run<Ahead>, i: usize, j: usize) -> Install {
        if self.inner.huge() {
            return self.huge_install(run, i, j);
        }
        let inner = self.inner.clone();
        let dst = inner.page_addr(run.page + i as u64);
        let Some(spent) = run.spent.as_mut() else {
            let r = match &self.direct {
                Some((seg, off)) => {
                    let Some(m) = seg.shared.get() else {
                        inner.internal_error("a direct install from a segment that is not mapped");
                    };
                    let len = (j - i) * PAGE_SIZE;
                    let src = m.addr_of(off + i * PAGE_SIZE, len);
                    // SAFETY: `src` lies in the mapped segment (checked by `addr_of`), which
                    // `self.direct` keeps mapped until the install is over.
                    unsafe { inner.uffd.copy_from(dst, src, len, INSTALL) }
                }
                None => inner.uffd.copy(dst, &self.buf[i * PAGE_SIZE..j * PAGE_SIZE], INSTALL),
            };
            return self.installed_pages(dst, r);
        };
        let mode = MoveMode {
            dontwake: false,
            allow_src_holes: false,
        };
        let src = inner.slot_addr(spent.start() + i as u32);
        // SAFETY: the run's spent slots (this handler holds the run; no `recycle` slice of them
        // is alive here) into missing window pages, which only raw addresses reach.
        let r = unsafe { inner.uffd.move_pages(dst, src, (j - i) * PAGE_SIZE, mode) };
        let mut done = r.as_ref().map_or_else(UffdError::done, |d| *d) / PAGE_SIZE;
        if r.is_err() && i + done < j {
            // The page the kernel stopped at may have moved all the same (see `outcome`); its
            // waiters are then woken here, as the ioctl wakes only what it reports.
            let (at, from) = (dst + done * PAGE_SIZE, src + done * PAGE_SIZE);
            if outcome(&inner, from, at) == MoveOutcome::Moved {
                recounted(&inner, from, at);
                if let Err(e) = inner.uffd.wake(at, PAGE_SIZE) {
                    inner.internal_error(&format!("UFFDIO_WAKE at {at:#x}: {e}"));
                }
                done += 1;
            }
        }
        run.moved[i..i + done].fill(true);
        inner.stats.pages_recycled.fetch_add(done as u64, Ordering::Relaxed);
        match r {
            Err(e) if !matches!(e, UffdError::Again { .. }) => {
                // MOVE refused the rest of the stretch (a page table entry that is not empty
                // for MOVE but is for COPY, such as a marker a kernel feature left on a hole).
                // Copy the rest from the slots; a page really mapped there makes COPY fail the
                // same way, and its waiters are woken.
                if i + done >= j {
                    return Install::Placed(done);
                }
                if inner.cfg.verbose && !matches!(e, UffdError::Exists { .. }) {
                    eprintln!("rackmem: UFFDIO_MOVE into the window at {dst:#x}: {e}; copying instead");
                }
                let at = inner.page_addr(run.page + (i + done) as u64);
                // Every slot copied from must still hold its page: the copy reads it in the
                // kernel, and a hole there is an error of the staging userfaultfd (EFAULT), not
                // data. Say which slot lost its page and how, rather than just "EFAULT".
                if let Some(k) = (i + done..j).find(|&k| !slot_holds_page(&inner, spent.start() + k as u32)) {
                    inner.internal_error(&format!(
                        "installing pages {i}..{j} of the run at window page {} from staging slots {}..{}: \
                         UFFDIO_MOVE stopped after {done} with {e}, and slot {} (page {k} of the run) holds no \
                         page (window page there: {:?})",
                        run.page,
                        spent.start(),
                        spent.start() + spent.count(),
                        spent.start() + k as u32,
                        rackmem_sys::page_entry(inner.page_addr(run.page + k as u64)),
                    ));
                }
                let src = &recycle::bytes(&inner, spent)[(i + done) * PAGE_SIZE..j * PAGE_SIZE];
                let copied = inner.uffd.copy(at, src, INSTALL);
                match self.installed_pages(at, copied) {
                    Install::Placed(k) => Install::Placed(done + k),
                    Install::Exists(k) => Install::Exists(done + k),
                    Install::Again(k) => Install::Again(done + k),
                }
            }
            Ok(d) => Install::Placed(d / PAGE_SIZE),
            // EAGAIN: queued events first; `done` counts a page found moved above.
            Err(_) => Install::Again(done),
        }
    }

    fn pump_events(&mut self) {
        self.apply_queued_events();
    }

    fn discard_slots(&mut self, start: u32, count: u32) {
        let at = self.inner.slot_addr(start);
        // SAFETY: slots of the staging area, which this runtime set aside and reaches only
        // through raw addresses or `recycle`'s slices; these slots are past the spent cap and
        // belong to no run or job, so no slice points into them.
        if let Err(e) = unsafe { rackmem_sys::madvise_dontneed(at, count as usize * self.inner.unit_bytes()) } {
            self.inner.internal_error(&format!("freeing staging slots: {e}"));
        }
    }

    fn read(&mut self, run: &mut Run<Ahead>) {
        let inner = self.inner.clone();
        self.direct = None;
        self.end_brick_access(inner.now_ns());
        if inner.huge() {
            return self.huge_read(run);
        }
        let access = brick_access(&inner, run);
        if let Some(a) = run.ahead.take() {
            // Read-aheads travel over links only: this waits on one.
            self.pipeline();
            ReadAheads::collect(&inner, run.page, a, &mut run.spent, &mut self.buf);
        } else {
            // Over a link, the reads of the faults queued behind this one go out while this
            // one's read is on its way (sent first, so its answer comes first).
            let on_link = waits_on_link(&inner, run);
            match run.spent.as_mut() {
                Some(slots) => {
                    let out = recycle::bytes(&inner, slots);
                    fetch_into(&inner, run.page, &run.kinds, out, &mut || {
                        if on_link {
                            self.pipeline()
                        }
                    })
                }
                None => {
                    if let Some(d) = direct_source(&inner, run.page, &run.kinds) {
                        // The brick's memory is read by the install's copy: the access ends there.
                        self.direct = Some(d);
                        self.brick_access = access;
                        return;
                    }
                    // Not cleared: `fetch_into` writes every page the install reads, and a strided
                    // run's span (up to 8 MiB) is mostly pages passed over, never read.
                    let mut buf = std::mem::take(&mut self.buf);
                    buf.resize(run.kinds.len() * PAGE_SIZE, 0);
                    fetch_into(&inner, run.page, &run.kinds, &mut buf, &mut || {
                        if on_link {
                            self.pipeline()
                        }
                    });
                    self.buf = buf;
                }
            }
        }
        if let Some(a) = access {
            inner.stats.bricks.end(a, inner.now_ns());
        }
    }

    /// Checksums of the remote pages, for the write-back to tell dirty from clean; not of pages
    /// in mapped segments (compared with the mapping itself) nor of first touches and
    /// same-filled pages (compared with zeros).
    fn checksums(&mut self, run: &mut Run<Ahead>, out: &mut Vec<(u32, u64)>) {
        if self.inner.huge() {
            return self.huge_checksums(run);
        }
        let inner = self.inner.clone();
        let n = run.len();
        inner.table.mapped_pages(run.page, n, &mut self.mapped);
        let src: &[u8] = match run.spent.as_mut() {
            Some(slots) => recycle::bytes(&inner, slots),
            None => &self.buf,
        };
        out.extend(
            (0..n)
                .filter(|&i| run.kinds[i] == Source::Brick && !self.mapped[i])
                .map(|i| {
                    (
                        (run.page + i as u64) as u32,
                        xxh3_64(&src[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]),
                    )
                }),
        );
    }

    fn planning(&mut self, c: &mut Core, fault: u64, budget: u64) -> Option<usize> {
        if c.resident() < budget / 2 {
            // The program released memory: pages it touches now are not bound for eviction.
            self.filled = false;
        }
        let inner = &self.inner;
        let mut aheads = inner.aheads.lock().unwrap_or_else(|e| e.into_inner());
        aheads.drop_stale(inner, c, fault);
        aheads.length_at(fault)
    }

    fn release_slots_held(&mut self, c: &mut Core) -> bool {
        let inner = &self.inner;
        let mut aheads = inner.aheads.lock().unwrap_or_else(|e| e.into_inner());
        aheads.drop_holding_slots(inner, c)
    }

    fn claimed(&mut self, c: &mut Core, run: &mut Run<Ahead>) {
        self.inner.stats.set_resident(c.resident() * self.inner.upp());
        let inner = &self.inner;
        let mut aheads = inner.aheads.lock().unwrap_or_else(|e| e.into_inner());
        run.ahead = aheads.take_for(inner, c, run);
        // A read-ahead of any page claimed now would go stale: the page may be written and
        // written back before that read-ahead's fault comes.
        aheads.drop_overlapping(inner, c, run.page, run.len() as u64);
    }

    fn read_ahead(&mut self, _lock: &Mutex<Core>, stream: usize, next: u64, run: usize) {
        readahead::keep_stream_ahead(&self.inner, stream, next, run);
    }

    fn send_early(&mut self, c: MutexGuard<'_, Core>, page: u64) -> bool {
        let inner = &self.inner;
        let mut aheads = inner.aheads.lock().unwrap_or_else(|e| e.into_inner());
        aheads.send_early(inner, c, page, inner.cfg.pipeline)
    }

    /// Mapped bricks populate memory for the next write-backs, and the fault's steps are timed.
    fn installed(&mut self, _plan: &Plan, run: &Run<Ahead>, full: bool) {
        self.direct = None;
        crate::fork_hot::report_fetched(&self.inner, run.page, &run.kinds);
        self.end_brick_access(self.inner.now_ns());
        if full {
            if !self.filled {
                self.filled = true;
                self.populate_resident();
            }
            self.populate_ahead(run.page, &run.kinds);
        }
        // The breakdown describes remote faults only (a first touch fetches nothing).
        if run.kinds[0] != Source::Zeros {
            let m = &self.marks;
            let at = |s: Step| m[s as usize + 1];
            let b = &self.inner.stats.breakdown;
            b.make_room.record(at(Step::Chosen) - at(Step::Planned));
            b.stage.record(at(Step::Staged) - at(Step::Chosen));
            b.fetch.record(at(Step::Fetched) - at(Step::Claimed));
            b.install.record(at(Step::Installed) - at(Step::Fetched));
            b.total.record(at(Step::Installed) - m[0]);
        }
    }
}

/// True if fetching the run waits on a brick's link: its first brick page lies in a segment
/// reached over one (not mapped).
fn waits_on_link(inner: &Inner, run: &Run<Ahead>) -> bool {
    let Some(i) = run.kinds.iter().position(|&k| k == Source::Brick) else {
        return false;
    };
    inner
        .table
        .lookup(run.page + i as u64)
        .and_then(|(seg, _)| inner.table.get(seg))
        .is_some_and(|s| s.shared.get().is_none())
}

/// The segment and byte offset to install the run straight from, when every page of it is read
/// from one mapped segment: `UFFDIO_COPY` from the mapping then does the one copy that a copy
/// into the install buffer followed by `UFFDIO_COPY` from it did in two (a random fault on
/// shared memory spent 0.5 of its 8 µs in that first copy: `docs/benchmarks.md`). Not for runs
/// received into spent slots, which move in without a copy. Pages passed over (a strided run's
/// gaps, resident pages) are not read. Counts the fetch as `fetch_into` does.
fn direct_source(
    inner: &Inner,
    page: u64,
    kinds: &[Source],
) -> Option<(std::sync::Arc<crate::segment::Segment>, usize)> {
    if kinds.first() != Some(&Source::Brick) || kinds.iter().any(|&k| !matches!(k, Source::Brick | Source::Held)) {
        return None;
    }
    let n = kinds.len() as u64;
    let brick_pages = kinds.iter().filter(|&&k| k == Source::Brick).count() as u64;
    let (index, off, seg_end) = inner.table.lookup_run(page)?;
    let seg = inner
        .table
        .get(index)
        .filter(|s| s.shared.get().is_some() && page + n <= seg_end)?;
    let total = brick_pages * PAGE;
    seg.limiter.acquire(total);
    let s = &inner.stats;
    for (p, _) in (page..page + n).zip(kinds).filter(|(_, &k)| k == Source::Brick) {
        s.refetched.insert(p);
    }
    s.faults_remote.fetch_add(1, Ordering::Relaxed);
    s.bytes_fetched.fetch_add(PAGE, Ordering::Relaxed);
    s.bytes_prefetched
        .fetch_add((brick_pages - 1) * PAGE, Ordering::Relaxed);
    s.bytes_fetched_shared.fetch_add(total, Ordering::Relaxed);
    Some((seg, off as usize))
}

/// Reads the run's pages into `out` (one page per entry of `kinds`): brick pages from their
/// bricks, same-filled pages filled with their word, the others zeroed. `in_flight` runs once,
/// while the read is on its way where it is one request over a link (the common case),
/// else before the reads.
fn fetch_into(inner: &Inner, page: u64, kinds: &[Source], out: &mut [u8], in_flight: &mut dyn FnMut()) {
    for (i, &k) in kinds.iter().enumerate() {
        let dst = &mut out[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
        match k {
            Source::Zeros => dst.fill(0),
            Source::Fill(w) => writeback::fill_with(dst, w),
            Source::Brick | Source::Held => {}
        }
        // Every remote page is a re-fetch of a page evicted earlier (same-filled ones too).
        if matches!(k, Source::Brick | Source::Fill(_)) {
            inner.stats.refetched.insert(page + i as u64);
        }
    }
    // Group brick pages per brick into extents, merging neighbours.
    let mut per_brick: Vec<BrickReads> = Vec::new();
    for (i, &k) in kinds.iter().enumerate() {
        if k != Source::Brick {
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
    let mut in_flight = Some(in_flight);
    for BrickReads { brick, extents, starts } in &per_brick {
        let total: usize = extents.iter().map(|e| e.1 as usize).sum();
        let lost = |e: &dyn std::fmt::Display| -> ! {
            inner.brick_lost(*brick, &format!("fetching window page {:#x}", inner.page_addr(page)), e)
        };
        let seg = inner.segment(*brick);
        seg.limiter.acquire(total as u64);
        let one_request = seg.shared.get().is_none() && total as u64 <= rackmem_transport::MAX_BATCH_BYTES;
        if let ([ext], [start], true) = (extents.as_slice(), starts.as_slice(), one_request) {
            // The common case over a link, one run on one brick: sent, then `in_flight` while
            // it travels, then received straight into place.
            let at = start * PAGE_SIZE;
            let sent = match seg.fault.submit_read(&[*ext]) {
                Ok(t) => t.detach(),
                Err(e) => lost(&e),
            };
            if let Some(f) = in_flight.take() {
                f();
            }
            if let Err(e) = seg.fault.wait_detached(sent, &mut out[at..at + total]) {
                lost(&e);
            }
        } else if let ([ext], [start]) = (extents.as_slice(), starts.as_slice()) {
            // One run in a mapped segment: a copy.
            let at = start * PAGE_SIZE;
            if let Err(e) = seg.read(&[*ext], &mut out[at..at + total]) {
                lost(&e);
            }
        } else {
            if let Some(f) = in_flight.take() {
                f();
            }
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
        if seg.shared.get().is_some() {
            inner
                .stats
                .bytes_fetched_shared
                .fetch_add(total as u64, Ordering::Relaxed);
        } else {
            seg.fetched_over_link((total / PAGE_SIZE) as u64);
        }
    }
    let s = &inner.stats;
    match kinds[0] {
        Source::Brick => {
            s.faults_remote.fetch_add(1, Ordering::Relaxed);
            s.bytes_fetched.fetch_add(PAGE, Ordering::Relaxed);
            s.bytes_prefetched
                .fetch_add((fetched_pages.saturating_sub(1)) * PAGE, Ordering::Relaxed);
        }
        // A same-filled page is filled here, with no brick asked: not a remote fault (the
        // bricks' level of C-AMAT counts only what a brick served).
        first => {
            let counter = if matches!(first, Source::Fill(_)) {
                &s.faults_filled
            } else {
                &s.faults_zero
            };
            counter.fetch_add(1, Ordering::Relaxed);
            s.bytes_prefetched.fetch_add(fetched_pages * PAGE, Ordering::Relaxed);
        }
    }
}
