//! Read-ahead: the read of a sequential stream's next run, sent when the current run is
//! installed so that the brick works while the program consumes this one (seed 000's
//! prefetcher keeps the link busy the same way), and collected at the next fault of the stream.

use crate::inner::Inner;
use crate::{recycle, PAGE, PAGE_SIZE};
use rackmem_pager::fault::{self, Run};
use rackmem_pager::Core;
use rackmem_pager::SpentRun;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

/// A read of the next run of a sequential stream, sent when the current run was installed so
/// that the brick works while the program consumes this one (seed 000's prefetcher keeps the
/// link busy the same way). Used if the next fault is at `page`, nothing was released since,
/// and the pages are still remote; else dropped.
pub(crate) struct Ahead {
    /// The prefetch stream it serves (interleaved streams each keep their own).
    pub(crate) stream: usize,
    /// A fault's early read (`send_early`): one page, for a fault queued behind the one being
    /// served; not a stream's.
    pub(crate) early: bool,
    /// Order of sending: the oldest goes first when too many are in flight.
    pub(crate) seq: u64,
    pub(crate) page: u64,
    pub(crate) n: usize,
    pub(crate) seg: usize,
    pub(crate) epoch: u64,
    pub(crate) ticket: rackmem_transport::DetachedTicket,
    /// Where the pages land: spent slots, or a buffer of its own.
    pub(crate) spent: Option<SpentRun>,
    pub(crate) own: Option<Vec<u8>>,
}

/// Read-aheads in flight at most: two, so that the next run is always on its way while the
/// handler installs the current one (with one, the read of run k+1 goes out only after run k
/// is installed, and the next fault comes sooner than the brick answers).
const AHEAD_DEPTH: usize = 2;

/// Read-aheads in flight over all streams.
const AHEAD_MAX: usize = 8;

/// The read-aheads in flight, and the buffers of those that found no spent slots. Shared by the
/// handlers (`Inner::aheads`, locked after the core): whichever handler serves a stream's next
/// fault finds the read-ahead sent at its previous one, and a claim by any handler drops the
/// read-aheads it makes stale.
#[derive(Default)]
pub(crate) struct ReadAheads {
    list: Vec<Ahead>,
    /// Sending order.
    seq: u64,
    spare_bufs: Vec<Vec<u8>>,
    /// Spent slots of read-aheads that could not be sent, given back to the core by the next
    /// caller holding it (the sender has unlocked the core, and may not lock it again under
    /// the read-aheads' lock).
    unsent: Vec<SpentRun>,
}

impl ReadAheads {
    /// The length of the read-ahead that starts at `page`, if one does.
    pub(crate) fn length_at(&self, page: u64) -> Option<usize> {
        self.list.iter().find(|a| a.page == page).map(|a| a.n)
    }

    /// Takes the read-ahead of the run just claimed, if it holds exactly that run
    /// ([`fault::ahead_serves`]). One at the run's page that does not is dropped.
    pub(crate) fn take_for(&mut self, inner: &Inner, c: &mut Core, run: &Run<Ahead>) -> Option<Ahead> {
        let i = self.list.iter().position(|a| a.page == run.page)?;
        let a = self.list.swap_remove(i);
        if fault::ahead_serves(a.page, a.n, a.epoch, run) {
            Some(a)
        } else {
            self.drop_ahead(inner, c, a);
            None
        }
    }

    /// Drops every read-ahead that holds spent slots; true if there was one (victims need the
    /// slots more).
    pub(crate) fn drop_holding_slots(&mut self, inner: &Inner, c: &mut Core) -> bool {
        if !self.list.iter().any(|a| a.spent.is_some()) {
            return false;
        }
        while let Some(a) = self.list.pop() {
            self.drop_ahead(inner, c, a);
        }
        true
    }

    /// Waits for the read-ahead `a` (of the run at `page`) into its buffer: its spent slots
    /// become `spent`, or its own buffer becomes `buf`. Takes no lock while it waits.
    pub(crate) fn collect(inner: &Inner, page: u64, mut a: Ahead, spent: &mut Option<SpentRun>, buf: &mut Vec<u8>) {
        let seg = inner.segment(a.seg);
        let r = match (a.spent.as_mut(), a.own.take()) {
            (Some(run), _) => seg.fault.wait_detached(a.ticket, recycle::bytes(inner, run)),
            (None, own) => {
                // The read-ahead's buffer becomes the install buffer; ours is kept for later.
                let old = std::mem::replace(buf, own.unwrap_or_default());
                inner.aheads.lock().unwrap_or_else(|e| e.into_inner()).keep_buf(old);
                seg.fault.wait_detached(a.ticket, buf)
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
        if a.early {
            s.reads_early_used.fetch_add(1, Ordering::Relaxed);
        } else {
            s.pages_read_ahead.fetch_add(a.n as u64, Ordering::Relaxed);
        }
    }

    /// Drops the read-aheads that can no longer be used at the fault at `page`
    /// ([`fault::ahead_stale`]).
    pub(crate) fn drop_stale(&mut self, inner: &Inner, c: &mut Core, page: u64) {
        self.give_back_unsent(inner, c);
        let mut i = 0;
        while i < self.list.len() {
            let a = &self.list[i];
            if fault::ahead_stale(a.page, a.n, a.epoch, page, c.epoch()) {
                let a = self.list.swap_remove(i);
                self.drop_ahead(inner, c, a);
            } else {
                i += 1;
            }
        }
    }

    /// Keeps a buffer for a later read-ahead (a few at most).
    fn keep_buf(&mut self, v: Vec<u8>) {
        if self.spare_bufs.len() < AHEAD_MAX {
            self.spare_bufs.push(v);
        }
    }

    /// Drops a read-ahead nobody will use: its response is discarded on arrival (nothing is
    /// written to its buffer), its spent slots are spent again.
    fn drop_ahead(&mut self, inner: &Inner, c: &mut Core, a: Ahead) {
        if let Some(v) = a.own {
            self.keep_buf(v);
        }
        if let Some(seg) = inner.table.get(a.seg) {
            seg.fault.abandon_detached(a.ticket);
        }
        if let Some(run) = a.spent {
            drop_ahead_slots(inner, c, run);
        }
    }

    /// Sends the read of the `want` pages from `page` if they are all remote on one segment (a
    /// shorter read if the remote stretch ends sooner), to be collected at a later fault.
    /// Returns whether it sent one. Called with the core locked (`c`), which it unlocks before
    /// sending (the read-aheads stay locked, so no claim can miss the new one).
    fn send_ahead(
        &mut self,
        inner: &Inner,
        mut c: MutexGuard<'_, Core>,
        stream: usize,
        page: u64,
        want: usize,
    ) -> bool {
        let region_end = c.regions().region_containing(page).map_or(page, |(s, l)| s + l);
        let budget = inner.budget_pages(&c);
        let limit = (want as u64)
            .min((budget / 4).max(1))
            .min(region_end.saturating_sub(page));
        // Same-filled pages are not read from the brick (its copy is stale): they end the run.
        let n = c.remote_run(page, limit);
        if n < 2 {
            return false;
        }
        let Some((seg, off, seg_end)) = inner.table.lookup_run(page) else {
            return false;
        };
        // A mapped segment is a memory copy away: nothing to overlap by reading ahead. (Table
        // lookups never wait, so this is fine under the core lock.)
        let Some(s) = inner.table.get(seg).filter(|s| s.shared.get().is_none()) else {
            return false;
        };
        // One segment, one extent: else the ordinary fetch does it at the fault.
        let n = n.min(seg_end - page) as usize;
        let epoch = c.epoch();
        // Read-aheads may hold a quarter of the staging slots; past that they use buffers.
        let held: usize = self
            .list
            .iter()
            .filter_map(|a| a.spent.as_ref())
            .map(|r| r.count() as usize)
            .sum();
        let spent = if held + n <= crate::STAGING_SLOTS / 4 {
            c.take_spent_slots(n)
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
                self.seq += 1;
                self.list.push(Ahead {
                    seq: self.seq,
                    early: false,
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
            Err(_) => {
                // A read the program did not ask for: its failure stops nothing. Those pages may
                // never be touched (freed, or the next allocation's in the same arena, whose
                // brick may be gone), and a fault on one reports the loss with the page the
                // program needed (exit 112 there, as always).
                inner.stats.reads_ahead_unsent.fetch_add(1, Ordering::Relaxed);
                if let Some(v) = own {
                    self.keep_buf(v);
                }
                self.unsent.extend(spent);
                false
            }
        }
    }

    /// Sends the read of the one page `page` for a fault queued behind the one being served
    /// (`rackmem_pager::fault::read_early`, which asked the core), into a buffer of its own, if
    /// its segment is reached over a link: at most `depth` such reads in flight (the oldest goes
    /// first), none where a read-ahead already covers the page. Called with the core locked
    /// (`c`), which it unlocks before sending (the read-aheads stay locked, so no claim can miss
    /// the new one).
    pub(crate) fn send_early(&mut self, inner: &Inner, mut c: MutexGuard<'_, Core>, page: u64, depth: usize) -> bool {
        self.give_back_unsent(inner, &mut c);
        if depth == 0 || self.list.iter().any(|a| fault::overlaps(a.page, a.n as u64, page, 1)) {
            return false;
        }
        let Some((seg, off, _)) = inner.table.lookup_run(page) else {
            return false;
        };
        // A mapped segment is a memory copy away: nothing to wait for, nothing to overlap.
        let Some(s) = inner.table.get(seg).filter(|s| s.shared.get().is_none()) else {
            return false;
        };
        if self.list.iter().filter(|a| a.early).count() >= depth {
            // A fault that never came to collect its read (served by another handler, or gone).
            if let Some(i) = (0..self.list.len())
                .filter(|&i| self.list[i].early)
                .min_by_key(|&i| self.list[i].seq)
            {
                let a = self.list.swap_remove(i);
                self.drop_ahead(inner, &mut c, a);
            }
        }
        let epoch = c.epoch();
        drop(c);
        let mut v = self.spare_bufs.pop().unwrap_or_default();
        v.clear();
        v.resize(PAGE_SIZE, 0);
        s.limiter.acquire(PAGE);
        match s
            .fault
            .submit_read(&[(off, PAGE_SIZE as u32)])
            .map(rackmem_transport::Ticket::detach)
        {
            Ok(ticket) => {
                self.seq += 1;
                self.list.push(Ahead {
                    seq: self.seq,
                    early: true,
                    stream: usize::MAX,
                    page,
                    n: 1,
                    seg,
                    epoch,
                    ticket,
                    spent: None,
                    own: Some(v),
                });
                inner.stats.reads_early.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(_) => {
                // Not sent: the fault, in its turn, fetches the page itself and reports the
                // brick's loss there (exit 112), with the page the program needed.
                self.keep_buf(v);
                false
            }
        }
    }

    /// Gives the spent slots of read-aheads that could not be sent back to the core.
    fn give_back_unsent(&mut self, inner: &Inner, c: &mut Core) {
        while let Some(run) = self.unsent.pop() {
            drop_ahead_slots(inner, c, run);
        }
    }

    /// Drops the read-aheads that overlap `[page, page + n)`, just claimed.
    pub(crate) fn drop_overlapping(&mut self, inner: &Inner, c: &mut Core, page: u64, n: u64) {
        let mut i = 0;
        while i < self.list.len() {
            let a = &self.list[i];
            if fault::overlaps(a.page, a.n as u64, page, n) {
                let a = self.list.swap_remove(i);
                self.drop_ahead(inner, c, a);
            } else {
                i += 1;
            }
        }
    }
}

/// Spent slots of a dropped read-ahead: spent again, or freed past the cap.
fn drop_ahead_slots(inner: &Inner, c: &mut Core, run: SpentRun) {
    if !c.give_spent_slots(run.start(), run.count()) {
        // Past the cap: free them (under the core lock; rare).
        let addr = inner.slot_addr(run.start());
        // SAFETY: the dropped run's slots of the staging area (set aside by this runtime, reached
        // only through raw addresses or `recycle`'s slices); the run is being dropped, so no
        // slice of it is alive, and the slots go to the free list only after this call.
        if let Err(e) = unsafe { rackmem_sys::madvise_dontneed(addr, run.count() as usize * inner.unit_bytes()) } {
            inner.internal_error(&format!("freeing staging slots: {e}"));
        }
        c.put_free_slots((run.start()..run.start() + run.count()).rev());
    }
}

/// Keeps the next runs of sequential stream `stream` on their way, from page `next`: up to
/// `AHEAD_DEPTH` read-aheads per stream and `AHEAD_MAX` in all, each twice the stream's run.
/// Locks the core, then the read-aheads, for each one sent.
pub(crate) fn keep_stream_ahead(inner: &Inner, stream: usize, next: u64, run: usize) {
    // Huge units are fetched a unit per request at the fault (not read ahead yet).
    if inner.huge() {
        return;
    }
    let want = (run * 2).min(inner.cfg.prefetch_pages.max(1));
    loop {
        let mut c = inner.lock();
        let mut list = inner.aheads.lock().unwrap_or_else(|e| e.into_inner());
        list.give_back_unsent(inner, &mut c);
        let mine = list.list.iter().filter(|a| !a.early && a.stream == stream);
        let (count, next) = mine.fold((0, next), |(k, e), a| (k + 1, e.max(a.page + a.n as u64)));
        if count >= AHEAD_DEPTH {
            break;
        }
        if list.list.iter().filter(|a| !a.early).count() >= AHEAD_MAX {
            // A stream that went quiet (or whose slot was reused) holds the oldest.
            if let Some(i) = (0..list.list.len())
                .filter(|&i| !list.list[i].early)
                .min_by_key(|&i| list.list[i].seq)
            {
                let a = list.list.swap_remove(i);
                list.drop_ahead(inner, &mut c, a);
            }
        }
        if !list.send_ahead(inner, c, stream, next, want) {
            break;
        }
    }
}
