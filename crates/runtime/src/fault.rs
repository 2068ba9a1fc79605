//! The fault path, top to bottom: a missing-page fault in the window becomes a run of pages
//! installed from their brick, after room was made for them in the local buffer.
//!
//! [`Handler::fault`] is where it starts (the handler thread calls it for every fault the
//! userfaultfd reports, see `handler.rs`). Its steps, in the order they run:
//!
//! 1. **plan** the run: the faulting page, plus the following pages when the stream is
//!    sequential (`rackmem_pager::prefetch`), within one region and one protection;
//! 2. **make room**: if the run would overflow the local buffer, the eviction policy picks victims
//!    ([`Core::choose_victims`]), which are moved out of the window into staging slots with
//!    `UFFDIO_MOVE` and handed to the write-back thread (`writeback.rs`);
//! 3. **claim** the run in the core ([`Core::claim`]): its pages are resident before their
//!    contents arrive, so a release read meanwhile turns them back to empty;
//! 4. **fetch** the remote pages from their bricks (one batched read per brick, or a read-ahead
//!    sent at the previous fault of the stream, `readahead.rs`);
//! 5. **install** them with `UFFDIO_COPY`, or `UFFDIO_MOVE` from spent staging slots, which wakes
//!    the faulting threads;
//! 6. keep the stream's next runs on their way (read-ahead) and let mapped bricks populate
//!    memory ahead of the next write-backs (`populate.rs`).
//!
//! The handler never waits for a program thread; it may wait for the write-back thread (a free
//! staging slot, a page still being written back), which never waits for the handler.

use crate::handler::Handler;
use crate::readahead::Ahead;
use crate::recycle;
use crate::{writeback, Inner, Job, Victim, PAGE, PAGE_SIZE};
use rackmem_pager::Core;
use rackmem_pager::{Location, PageState, Source, SpentRun};
use rackmem_uffd::{CopyMode, MoveMode, UffdError};
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use xxhash_rust::xxh3::xxh3_64;

/// Pages installed without write-protection: see "Dirty pages" in docs/architecture.md.
const INSTALL: CopyMode = CopyMode {
    write_protect: false,
    dontwake: false,
};

/// Shortest run received into spent slots and moved in (shorter runs are copied).
const RECYCLE_MIN_PAGES: u64 = 4;

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

/// A run planned for a fault (step 1).
struct Planned {
    /// The faulting page.
    fault: u64,
    /// First page of the run (the fault, or below it for a descending stream).
    start: u64,
    /// Pages planned.
    n: u64,
    /// The stream's run length (what prefetch asked for).
    run: usize,
    /// The prefetch stream's slot.
    stream: usize,
    /// The stream walks down.
    down: bool,
}

/// A claimed run (step 3), on its way to install.
struct Run {
    page: u64,
    /// Where each page's contents come from.
    kinds: Vec<Source>,
    /// The core's epoch at the claim: a release since makes the install re-check.
    epoch: u64,
    /// The read-ahead that holds the run, if one does.
    ahead: Option<Ahead>,
    /// Spent staging slots to receive the run into.
    spent: Option<SpentRun>,
}

/// The remote pages of a run that one brick holds: extents, and where each starts in the run.
struct BrickReads {
    brick: usize,
    extents: Vec<(u64, u32)>,
    starts: Vec<usize>,
}

impl Handler {
    pub(crate) fn fault(&mut self, addr: usize) {
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

    /// Serves the fault at window page `fault`, step by step (see the module documentation).
    fn serve(&mut self, fault: u64, t0: u64) {
        let inner = self.inner.clone();
        loop {
            // 1. Plan the run (or find that another thread's fault already installed the page).
            let Some((c, plan)) = self.plan(&inner, fault) else {
                return;
            };
            // 2. Make room; may wait for staging slots.
            let t_plan = inner.now_ns();
            let (c, staged) = self.choose_victims(c, plan.n);
            drop(c);
            let t_choose = inner.now_ns();
            let full = staged.is_some();
            if let Some((id, victims)) = staged {
                self.stage(id, victims);
            }
            let t_stage = inner.now_ns();
            // 3. Claim what is still claimable: the write-back thread may have finished pages
            // while we staged. Nothing left (the page is being evicted again): plan anew.
            let Some(mut run) = self.claim(&inner, &plan) else {
                continue;
            };
            let t_claim = inner.now_ns();
            // 4. Fetch.
            self.fetch(&mut run);
            let t_fetch = inner.now_ns();
            // 5. Install, waking the faulting threads.
            self.install(run.page, &run.kinds, run.epoch, run.spent.take());
            let t_install = inner.now_ns();
            // 6. Ahead of the next faults: mapped bricks populate memory for the next
            // write-backs, and a sequential stream gets its next runs read.
            if full {
                if !self.filled {
                    self.filled = true;
                    self.populate_resident();
                }
                self.populate_ahead(run.page, &run.kinds);
            }
            if plan.run > 1 && !plan.down && run.kinds.iter().all(|&k| k != Source::Zeros) {
                self.ahead
                    .keep_stream_ahead(plan.stream, run.page + run.kinds.len() as u64, plan.run);
            }
            // The breakdown describes remote faults only (a first touch fetches nothing).
            if run.kinds[0] != Source::Zeros {
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

    /// Step 1: plans the run for the fault at `fault`. `None` if the page is already installed
    /// (another thread faulted it first: its waiters are woken). Waits while the page is being
    /// written back.
    fn plan<'a>(&mut self, inner: &'a Inner, fault: u64) -> Option<(MutexGuard<'a, Core>, Planned)> {
        let mut c = inner.lock();
        loop {
            match c.location(fault) {
                Location::Resident => {
                    drop(c);
                    inner.stats.faults_duplicate.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = inner.uffd.wake(inner.page_addr(fault), PAGE_SIZE) {
                        inner.internal_error(&format!("UFFDIO_WAKE: {e}"));
                    }
                    return None;
                }
                Location::Evicting => c = inner.core_cv.wait(c).unwrap_or_else(|e| e.into_inner()),
                Location::Empty | Location::Remote => break,
            }
        }
        let plan = c.streams.plan(fault, inner.cfg.prefetch_pages.max(1));
        let (region_start, region_end) = c
            .alloc
            .region_containing(fault)
            .map_or((fault, fault + 1), |(s, l)| (s, s + l));
        let budget = inner.budget_pages(&c);
        if c.resident() < budget / 2 {
            // The program released memory: pages it touches now are not bound for eviction.
            self.filled = false;
        }
        // A run passes over resident pages (installing around them), but stops at a page on its
        // way out.
        let fits = |s: PageState| s.installable() || s.location() == Location::Resident;
        let cap = (plan.run as u64).min((budget / 4).max(1));
        let mut n = 1u64;
        // An ascending run starts at the fault; a descending one ends there.
        let mut start = fault;
        if plan.down {
            while n < cap.min(fault - region_start + 1) && fits(c.state(fault - n)) {
                n += 1;
            }
            start = fault + 1 - n;
        } else {
            while n < cap.min(region_end.saturating_sub(fault).max(1)) && fits(c.state(fault + n)) {
                n += 1;
            }
        }
        // The read-ahead sent at the previous fault of this stream, if it covers this run.
        self.ahead.drop_stale(&mut c, fault);
        if !plan.down {
            if let Some(len) = self.ahead.length_at(fault) {
                n = len as u64;
            }
        }
        c.streams.advance(plan.slot, start, start + n);
        let planned = Planned {
            fault,
            start,
            n,
            run: plan.run,
            stream: plan.slot,
            down: plan.down,
        };
        Some((c, planned))
    }

    /// Step 3: claims the planned run, or what is still claimable of it from the faulting page
    /// outward. `None` if the faulting page itself no longer is.
    fn claim(&mut self, inner: &Inner, plan: &Planned) -> Option<Run> {
        let mut c = inner.lock();
        let fault = plan.fault;
        // A run stays within one protection: read-ahead must not fill a reservation
        // (PROT_NONE) next to committed memory, nor pages lent to a file mapping (no
        // longer registered with the userfaultfd).
        let fault_prot = c.prot_of(fault);
        let claimable = |c: &Core, p: u64| c.state(p).installable() && c.prot_of(p) == fault_prot;
        if !claimable(&c, fault) {
            return None;
        }
        // Outward from the fault: claimable pages, and resident ones to pass over; the run ends
        // on a claimable page.
        let held = |c: &Core, p: u64| c.location(p) == Location::Resident;
        let (page, n) = if plan.down {
            let (mut first, mut p) = (fault, fault);
            while p > plan.start && (claimable(&c, p - 1) || held(&c, p - 1)) {
                p -= 1;
                if claimable(&c, p) {
                    first = p;
                }
            }
            (first, fault + 1 - first)
        } else {
            let (mut k, mut end) = (1, 1);
            while k < plan.n && (claimable(&c, plan.start + k) || held(&c, plan.start + k)) {
                if claimable(&c, plan.start + k) {
                    end = k + 1;
                }
                k += 1;
            }
            (plan.start, end)
        };
        // Resident before the copy, so a REMOVE event read while copying (EAGAIN) turns the
        // claimed pages back to empty and the install skips them. A page of a range that is
        // not read-write stays out of the eviction policy (it cannot move to the staging area)
        // until the program makes it read-write again or frees it.
        let kinds: Vec<Source> = (page..page + n)
            .map(|p| if claimable(&c, p) { c.claim(p) } else { Source::Held })
            .collect();
        let claimed = kinds.iter().filter(|&&k| k != Source::Held).count() as u64;
        let epoch = c.epoch();
        let ahead = self.ahead.take_for(&mut c, page, &kinds, epoch);
        // A read-ahead of any page claimed now would go stale: the page may be written and
        // written back before that read-ahead's fault comes.
        self.ahead.drop_overlapping(&mut c, page, n);
        // Receive into spent staging slots when a run of them is long enough (their pages
        // then move into the window); else into our buffer, copied in. A short run is
        // copied: for single pages a move gains nothing over the fresh page a copy takes
        // (GUPS at 25% local on shared memory: 80.0 k updates/s moving, 83.1 k copying).
        let spent = match &ahead {
            Some(_) => None,
            None if n >= RECYCLE_MIN_PAGES => c.slots.take_spent(n as usize),
            None => None,
        };
        drop(c);
        inner.stats.add_resident(claimed);
        Some(Run {
            page,
            kinds,
            epoch,
            ahead,
            spent,
        })
    }

    /// Step 4: the run's contents, from its read-ahead or its bricks, into its spent slots or
    /// the install buffer.
    fn fetch(&mut self, run: &mut Run) {
        let inner = self.inner.clone();
        if let Some(a) = run.ahead.take() {
            self.ahead.collect(run.page, a, &mut run.spent, &mut self.buf);
            return;
        }
        match run.spent.as_mut() {
            Some(slots) => fetch_into(&inner, run.page, &run.kinds, recycle::bytes(&inner, slots)),
            None => {
                self.buf.clear();
                self.buf.resize(run.kinds.len() * PAGE_SIZE, 0);
                fetch_into(&inner, run.page, &run.kinds, &mut self.buf);
            }
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
        if c.resident() + need <= budget {
            return (c, None);
        }
        // Evict a little more than needed so the next faults of a stream find room.
        let slack = (budget / 16).clamp(1, 32);
        let want = ((c.resident() + need - budget + slack) as usize)
            .min(crate::STAGING_SLOTS / 2)
            .min(c.resident() as usize);
        while c.slots.free_count() < want {
            if c.slots.spent_is_empty() {
                // Read-aheads may hold the slots victims need: they go first.
                if self.ahead.drop_holding_slots(&mut c) {
                    continue;
                }
                c = inner.core_cv.wait(c).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            // Spent slots hold pages kept for recycling; victims need empty slots more.
            for (start, len) in c.slots.take_all_spent() {
                if let Err(e) = rackmem_sys::madvise_dontneed(inner.slot_addr(start), len as usize * PAGE_SIZE) {
                    inner.internal_error(&format!("freeing staging slots: {e}"));
                }
                c.slots.put_free((start..start + len).rev());
            }
        }
        let mut out = Vec::with_capacity(want);
        let id = c.choose_victims(want, budget, self.zero_hash, &mut out);
        inner.stats.sub_resident(out.len() as u64);
        (c, id.map(|id| (id, out)))
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
    fn install(&mut self, page: u64, kinds: &[Source], epoch: u64, mut spent: Option<SpentRun>) {
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
                .filter(|&i| kinds[i] == Source::Brick && !self.mapped[i])
                .map(|i| {
                    (
                        (page + i as u64) as u32,
                        xxh3_64(&src[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]),
                    )
                })
                .collect()
        };
        if !hashes.is_empty() {
            inner.lock().record_hashes(hashes);
        }
        // Which slots of `spent` gave their page to the window (the others keep theirs).
        let mut moved = vec![false; if spent.is_some() { n } else { 0 }];
        let mut i = 0usize;
        let mut cur_epoch = epoch;
        while i < n {
            if kinds[i] == Source::Held {
                // Resident before this run: not ours to install.
                i += 1;
                continue;
            }
            if cur_epoch != inner.lock().epoch() {
                // Pages were released while we copied: skip those no longer claimed.
                let c = inner.lock();
                cur_epoch = c.epoch();
                while i < n && (kinds[i] == Source::Held || c.location(page + i as u64) != Location::Resident) {
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
                while j < n && kinds[j] != Source::Held && c.location(page + j as u64) == Location::Resident {
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
                    c.slots.put_free([slot]);
                } else if !c.slots.give_spent(slot, 1) {
                    drop(c);
                    if let Err(e) = rackmem_sys::madvise_dontneed(inner.slot_addr(slot), PAGE_SIZE) {
                        inner.internal_error(&format!("freeing a staging slot: {e}"));
                    }
                    c = inner.lock();
                    c.slots.put_free([slot]);
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

/// Reads the run's pages into `out` (one page per entry of `kinds`): brick pages from their
/// bricks, same-filled pages filled with their word, the others zeroed.
fn fetch_into(inner: &Inner, page: u64, kinds: &[Source], out: &mut [u8]) {
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
    for BrickReads { brick, extents, starts } in &per_brick {
        let total: usize = extents.iter().map(|e| e.1 as usize).sum();
        let lost = |e: &dyn std::fmt::Display| {
            inner.brick_lost(*brick, &format!("fetching window page {:#x}", inner.page_addr(page)), e)
        };
        let seg = inner.segment(*brick);
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
    if kinds[0] != Source::Zeros {
        s.faults_remote.fetch_add(1, Ordering::Relaxed);
        s.bytes_fetched.fetch_add(PAGE, Ordering::Relaxed);
        s.bytes_prefetched
            .fetch_add((fetched_pages.saturating_sub(1)) * PAGE, Ordering::Relaxed);
    } else {
        s.faults_zero.fetch_add(1, Ordering::Relaxed);
        s.bytes_prefetched.fetch_add(fetched_pages * PAGE, Ordering::Relaxed);
    }
}
