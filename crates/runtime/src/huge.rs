//! Huge units: the fault path's and the write-back's side of a window of 2 MiB units
//! (`docs/architecture.md`, "Huge pages"). The pager core tracks residency per unit
//! (`rackmem_pager::unit`); this module moves units between the window, the staging area and
//! the bricks.
//!
//! - **fetch**: each unit of a run is one read of its 512 pages (per segment it spans), received
//!   into a spent 2 MiB staging slot (an evicted unit's THP), or into the handler's *nursery*
//!   when no slot is spent: a mapping registered with no userfaultfd, so that writing it makes
//!   the kernel allocate a THP there (the staging area cannot be touched where it is empty: its
//!   userfaultfd would take the fault, and nobody serves it);
//! - **install**: one 2 MiB `UFFDIO_MOVE` per unit, which keeps a THP PMD-mapped; subpages the
//!   program released while the unit was away are zeroed first (`Inner::holes`);
//! - **evict**: one 2 MiB `UFFDIO_MOVE` per unit into its slot; a subpage missing from a resident
//!   unit (released by `MADV_DONTNEED`, never touched since) is filled with zeros in the slot, so
//!   that a staged unit has no hole (reading one would fault on the staging userfaultfd);
//! - **dirty check**: one [`Check`] per 4 KiB subpage taken at install, compared at eviction:
//!   only the runs of changed subpages are written back ([`changed_runs`]);
//! - **a fault on a resident unit** is a released subpage: it is mapped as zeros.

use crate::fault::{outcome, recounted, MoveOutcome};
use crate::handler::Handler;
use crate::readahead::Ahead;
use crate::{recycle, writeback, Inner, Job, Victim, PAGE, PAGE_SIZE};
use rackmem_pager::fault::{Install, Run};
use rackmem_pager::unit::{changed_runs, Check};
use rackmem_pager::{Location, Source};
use rackmem_sys::Mapping;
use rackmem_uffd::{MoveMode, UffdError};
use std::sync::atomic::Ordering;
use xxhash_rust::xxh3::xxh3_64;

/// Staging slots of 2 MiB: at most half are kept spent (`Slots::new`), so up to 16 MiB of
/// evicted THPs wait to receive the next fetches, and an eviction batch is at most 16 MiB. The
/// 4 KiB path keeps at most 2 MiB spent: the allowance beyond the budget grows by 14 MiB.
pub(crate) const HUGE_SLOTS: usize = 16;

/// Most units a fault's run installs (a sequential stream's run, doubling from 2): the
/// nursery's size.
pub(crate) const HUGE_RUN_UNITS: usize = 4;

/// Tries of a `UFFDIO_MOVE` the kernel refuses without a lasting cause (see "Swapped pages").
const MOVE_TRIES: u32 = 1000;

/// The checks of one subpage's contents.
fn check(data: &[u8]) -> Check {
    Check::of(data, xxh3_64)
}

/// A handler's nursery: `HUGE_RUN_UNITS` units, 2 MiB-aligned, `MADV_HUGEPAGE`, registered with
/// no userfaultfd.
pub(crate) fn nursery(inner: &Inner) -> Mapping {
    match Mapping::reserve_huge(HUGE_RUN_UNITS * inner.unit_bytes()) {
        Ok(m) => m,
        Err(e) => inner.internal_error(&format!("reserving the huge units' receive area: {e}")),
    }
}

/// Moves window unit `unit` whole into staging slot `slot`, filling the slot's subpages whose
/// window page was missing with zeros.
fn move_unit_out(inner: &Inner, unit: u64, slot: u32) {
    let ub = inner.unit_bytes();
    let (src, dst) = (inner.unit_addr(unit), inner.slot_addr(slot));
    let mode = MoveMode {
        dontwake: true,
        allow_src_holes: false,
    };
    let mut off = 0;
    let mut tries = 0;
    while off < ub {
        // SAFETY: a window unit being evicted (only raw addresses reach the window) into a free
        // staging slot of this eviction, which no slice points into until the move is recorded.
        let e = match unsafe { inner.stage_uffd.move_pages(dst + off, src + off, ub - off, mode) } {
            Ok(d) => {
                off += d;
                continue;
            }
            Err(e) => e,
        };
        off += e.done() / PAGE_SIZE * PAGE_SIZE;
        if off >= ub {
            break;
        }
        tries += 1;
        match e {
            UffdError::Busy { .. } if tries <= 3 => {
                rackmem_sys::break_cow(src + off);
                continue;
            }
            UffdError::Again { .. } if tries <= MOVE_TRIES => {
                std::thread::yield_now();
                continue;
            }
            _ => {}
        }
        match outcome(inner, src + off, dst + off) {
            MoveOutcome::Moved => {
                recounted(inner, src + off, dst + off);
                off += PAGE_SIZE;
            }
            MoveOutcome::NotMoved if tries <= MOVE_TRIES => std::thread::yield_now(),
            MoveOutcome::Gone => {
                // A subpage released inside the unit (or the whole unit, meanwhile): zeros are
                // what the program reads there. The staging userfaultfd has no events, so this
                // never waits for one.
                match inner.stage_uffd.zeropage(dst + off, PAGE_SIZE, true) {
                    Ok(_) | Err(UffdError::Exists { .. }) => off += PAGE_SIZE,
                    Err(z) => inner.internal_error(&format!(
                        "filling a hole of window unit {src:#x} in staging slot {slot}: {z}"
                    )),
                }
            }
            other => inner.internal_error(&format!(
                "evicting window unit {src:#x} into staging slot {slot} at +{off:#x}: {e}; page table: {other:?}"
            )),
        }
    }
}

/// Moves a unit that is not read-write into its slot (see `fault.rs`, `move_protected`: the
/// unit is opened for its move and its protection restored at once).
fn move_protected_unit(inner: &Inner, unit: u64, slot: u32, prot_byte: u8) {
    let src = inner.unit_addr(unit);
    let len = inner.unit_bytes();
    let prot = rackmem_pager::prot::decode(prot_byte);
    // SAFETY: a window unit being evicted (only raw addresses reach it); the program's own
    // mprotect of it waits until its eviction is over, and the next call restores what it asked.
    if let Err(e) = unsafe { rackmem_sys::mprotect(src, len, libc::PROT_READ | libc::PROT_WRITE) } {
        inner.internal_error(&format!("cannot open window unit {src:#x} for its eviction: {e}"));
    }
    move_unit_out(inner, unit, slot);
    // SAFETY: the same window unit, given back the protection the program asked for it.
    if let Err(e) = unsafe { rackmem_sys::mprotect(src, len, prot) } {
        inner.internal_error(&format!(
            "cannot restore the protection {prot:#x} of window unit {src:#x}: {e}"
        ));
    }
}

/// Zeroes, in `data` (unit `unit`'s contents on their way in), the subpages released while the
/// unit was away, and forgets them.
fn zero_holes(inner: &Inner, unit: u64, data: &mut [u8]) {
    let bits = {
        let mut holes = inner.holes.lock().unwrap_or_else(|e| e.into_inner());
        if holes.is_empty() {
            return;
        }
        match holes.remove(&unit) {
            Some(b) => b,
            None => return,
        }
    };
    for (i, sub) in data.chunks_exact_mut(PAGE_SIZE).enumerate() {
        if bits[i / 64] & (1 << (i % 64)) != 0 {
            sub.fill(0);
        }
    }
}

impl Handler {
    /// The bytes of the run's receive buffer: its spent slots, or the nursery.
    fn huge_buffer<'a>(&'a mut self, run: &'a mut Run<Ahead>) -> &'a mut [u8] {
        let inner = &self.inner;
        let units = run.len();
        let len = units * inner.unit_bytes();
        match run.spent.as_mut() {
            Some(slots) => recycle::bytes(inner, slots),
            None => {
                let Some(n) = self.nursery.as_ref() else {
                    inner.internal_error("a huge unit's fetch without a receive area");
                };
                if len > n.len() {
                    inner.internal_error(&format!("a run of {units} huge units past the receive area"));
                }
                // SAFETY: the nursery is this handler's own (no other thread knows it), registered
                // with no userfaultfd, and no other slice of it is alive: `&mut self` is held.
                unsafe { n.bytes_mut(0, len) }
            }
        }
    }

    /// Reads the run's units: brick units from their bricks, same-filled ones filled, the
    /// others zeroed, into spent slots or the nursery.
    pub(crate) fn huge_read(&mut self, run: &mut Run<Ahead>) {
        let inner = self.inner.clone();
        let (page, kinds) = (run.page, run.kinds.clone());
        // The nursery: private memory of this handler's, zeros once emptied.
        let fresh = run.spent.is_none();
        let buf = self.huge_buffer(run);
        fetch_units(&inner, page, &kinds, buf, fresh);
    }

    /// Records the run's subpage checks in the core (of the contents as fetched: what the
    /// brick holds).
    pub(crate) fn huge_checksums(&mut self, run: &mut Run<Ahead>) {
        let inner = self.inner.clone();
        let (page, kinds) = (run.page, run.kinds.clone());
        let ub = inner.unit_bytes();
        let upp = inner.upp() as usize;
        let mapped: Vec<bool> = (0..kinds.len())
            .map(|k| mapped_unit(&inner, page + k as u64).is_some())
            .collect();
        let buf = self.huge_buffer(run);
        let sums: Vec<(u64, Box<[Check]>)> = kinds
            .iter()
            .enumerate()
            .filter_map(|(k, &kind)| {
                let checks: Box<[Check]> = match kind {
                    Source::Held => return None,
                    // Compared with the mapping itself at eviction (`Writes::examine_unit`).
                    Source::Brick if mapped[k] => return None,
                    Source::Zeros => vec![Check::Filled(0); upp].into(),
                    Source::Fill(w) => vec![Check::Filled(w); upp].into(),
                    Source::Brick => buf[k * ub..(k + 1) * ub].chunks_exact(PAGE_SIZE).map(check).collect(),
                };
                Some((page + k as u64, checks))
            })
            .collect();
        let mut c = inner.lock();
        for (u, checks) in sums {
            c.record_sums(u, checks);
        }
    }

    /// Installs units `i..j` of the run, one 2 MiB `UFFDIO_MOVE` each, from spent slots or the
    /// nursery. `Again` when events are queued (nothing of the unit moved).
    pub(crate) fn huge_install(&mut self, run: &mut Run<Ahead>, i: usize, j: usize) -> Install {
        let inner = self.inner.clone();
        let ub = inner.unit_bytes();
        for k in i..j {
            let unit = run.page + k as u64;
            let src = {
                let buf = self.huge_buffer(run);
                let data = &mut buf[k * ub..(k + 1) * ub];
                zero_holes(&inner, unit, data);
                data.as_mut_ptr() as usize
            };
            if !self.move_unit_in(run, unit, src) {
                return Install::Again(k - i);
            }
            if let Some(m) = run.moved.get_mut(k) {
                *m = true;
                inner.stats.pages_recycled.fetch_add(inner.upp(), Ordering::Relaxed);
            }
        }
        Install::Placed(j - i)
    }

    /// Moves unit `unit`'s contents from `src` (a spent slot or the nursery, whole, no hole)
    /// into the window and wakes its waiters. False if events are queued and nothing moved.
    /// Afterwards `src` holds nothing: a subpage the kernel would not move is dropped.
    fn move_unit_in(&mut self, run: &Run<Ahead>, unit: u64, src: usize) -> bool {
        let inner = self.inner.clone();
        let ub = inner.unit_bytes();
        let dst = inner.unit_addr(unit);
        // No wake until the unit is whole: a thread woken on a part would fault on the rest.
        let mode = MoveMode {
            dontwake: true,
            allow_src_holes: true,
        };
        let mut off = 0;
        let mut leftover = false;
        while off < ub {
            // SAFETY: a spent slot this handler holds through the run, or its own nursery, into
            // missing window pages of a unit claimed by this run (only raw addresses reach them);
            // no slice of the source is alive during the call.
            let e = match unsafe { inner.uffd.move_pages(dst + off, src + off, ub - off, mode) } {
                Ok(d) => {
                    off += d;
                    continue;
                }
                Err(e) => e,
            };
            off += e.done() / PAGE_SIZE * PAGE_SIZE;
            if off >= ub {
                break;
            }
            if let UffdError::Again { .. } = e {
                if off == 0 {
                    return false;
                }
                // Part of the unit is in, and a REMOVE waits to be read, which only a reader of
                // the userfaultfd can do: this handler holds the event gate for its install.
                // Apply the events, then go on only if the unit is still this run's (a release
                // of part of it noted holes, zeroed below); if it was released whole, what
                // moved in is zapped by the release that follows the event.
                inner.gate.leave_install();
                self.apply_queued_events();
                inner.gate.enter_install();
                if !inner.lock().is_claimed_by(run.claim, unit) {
                    leftover = true;
                    break;
                }
                // SAFETY: the part of the source that has not moved, still mapped whole (moves
                // go in order), which this handler holds and no other slice points into; the
                // part that moved is not touched (an empty slot page would fault on the staging
                // userfaultfd).
                let rest = unsafe { std::slice::from_raw_parts_mut((src + off) as *mut u8, ub - off) };
                zero_holes_from(&inner, unit, rest, off / PAGE_SIZE);
                continue;
            }
            match outcome(&inner, src + off, dst + off) {
                MoveOutcome::Moved => {
                    recounted(&inner, src + off, dst + off);
                    off += PAGE_SIZE;
                }
                // Refused: part of the unit is another VMA with another protection (a thread
                // stack's guard page, a read-only range), which MOVE will not enter from a
                // read-write slot. Copied instead, the rest of the unit, as the 4 KiB path does.
                MoveOutcome::NotMoved => match copy_rest(&inner, dst, src, off) {
                    Ok(()) => {
                        leftover = true;
                        off = ub;
                    }
                    Err(at) => {
                        // Events queued: applied at the next turn (the MOVE says EAGAIN).
                        leftover = true;
                        off = at;
                    }
                },
                // The window holds a page there already: keep it, drop ours.
                MoveOutcome::Both => {
                    leftover = true;
                    off += PAGE_SIZE;
                }
                other => inner.internal_error(&format!(
                    "installing window unit {dst:#x} at +{off:#x}: {e}; page table: {other:?}"
                )),
            }
        }
        if leftover {
            // SAFETY: the run's slot or the nursery, which this handler holds; its pages that
            // did not move are dropped (no event: the staging userfaultfd has none, the nursery
            // none at all), so the slot is empty as a moved slot must be.
            if let Err(e) = unsafe { rackmem_sys::madvise_dontneed(src, ub) } {
                inner.internal_error(&format!("emptying a huge unit's source: {e}"));
            }
        }
        if let Err(e) = inner.uffd.wake(dst, ub) {
            inner.internal_error(&format!("UFFDIO_WAKE at {dst:#x}: {e}"));
        }
        true
    }

    /// A fault on a unit the core calls installed: one of its subpages was released inside it
    /// (`MADV_DONTNEED` of part of the unit) and is missing. Zeros are what it holds.
    pub(crate) fn fill_hole(&mut self) {
        let inner = &self.inner;
        let at = inner.page_addr(self.fault_page);
        match inner.uffd.zeropage(at, PAGE_SIZE, false) {
            Ok(_) => {}
            // Mapped meanwhile (the fault was queued behind the unit's install), or events
            // queued: the thread faults again if it still must.
            Err(UffdError::Exists { .. }) | Err(UffdError::Again { .. }) => {
                if let Err(e) = inner.uffd.wake(at, PAGE_SIZE) {
                    inner.internal_error(&format!("UFFDIO_WAKE at {at:#x}: {e}"));
                }
            }
            Err(e) => inner.internal_error(&format!("mapping zeros at {at:#x}: {e}")),
        }
    }

    /// Moves each victim unit into its staging slot and writes the batch back here (mapped
    /// segments holding memory for all of it) or hands it to the write-back thread, as
    /// `stage` does for pages.
    pub(crate) fn huge_stage(&mut self, id: u64, mut victims: Vec<Victim>) {
        let inner = self.inner.clone();
        victims.sort_unstable_by_key(|v| v.page);
        for v in &mut victims {
            if v.prot != 0 {
                move_protected_unit(&inner, u64::from(v.page), v.slot, v.prot);
                inner.stats.evictions_protected.fetch_add(1, Ordering::Relaxed);
            } else {
                move_unit_out(&inner, u64::from(v.page), v.slot);
            }
            v.moved = true;
        }
        inner
            .stats
            .evictions
            .fetch_add(victims.len() as u64 * inner.upp(), Ordering::Relaxed);
        self.find_backed_units(&mut victims);
        let by_copy = victims.iter().all(|v| v.backed) && inner.jobs_busy.load(Ordering::Acquire) == 0;
        if by_copy {
            writeback::evict(&inner, id, &victims, &mut self.writes);
        } else {
            writeback::submit(&inner, Job::Evict { id, victims });
        }
    }

    /// Sets `backed` on victim units in mapped segments whose memory the brick holds for
    /// every page of the unit (see `find_backed`).
    fn find_backed_units(&mut self, victims: &mut [Victim]) {
        let inner = self.inner.clone();
        let upp = inner.upp();
        for v in victims.iter_mut() {
            let first = u64::from(v.page) * upp;
            let Some((index, off, seg_end)) = inner.table.lookup_run(first) else {
                continue;
            };
            if seg_end < first + upp {
                continue;
            }
            let Some(seg) = inner.table.get(index) else {
                continue;
            };
            let Some(m) = seg.shared.get() else {
                continue;
            };
            if v.brick_valid {
                v.backed = true;
                continue;
            }
            if m.pages_backed(off as usize, inner.unit_bytes(), &mut self.mapped)
                .is_ok()
            {
                v.backed = self.mapped.iter().all(|&b| b);
            }
        }
    }
}

/// Copies the unit at `src` into the window at `dst` from byte `from` on, subpage by subpage
/// (a subpage present in the window already is kept). `Err(at)`: events are queued (EAGAIN)
/// and subpages from `at` on are not copied yet.
fn copy_rest(inner: &Inner, dst: usize, src: usize, from: usize) -> Result<(), usize> {
    let mode = rackmem_uffd::CopyMode {
        write_protect: false,
        dontwake: true,
    };
    for off in (from..inner.unit_bytes()).step_by(PAGE_SIZE) {
        // SAFETY: a subpage of the run's slot or the handler's nursery that has not moved (moves
        // go in order, so everything from `from` on is still mapped there), held by this
        // handler; only read, for the duration of the copy.
        let bytes = unsafe { std::slice::from_raw_parts((src + off) as *const u8, PAGE_SIZE) };
        match inner.uffd.copy(dst + off, bytes, mode) {
            Ok(_) | Err(UffdError::Exists { .. }) => {}
            Err(UffdError::Again { .. }) => return Err(off),
            Err(e) => inner.internal_error(&format!("copying into window unit {dst:#x} at +{off:#x}: {e}")),
        }
    }
    Ok(())
}

/// [`zero_holes`] for the part of a unit from subpage `from` on, in `data` (the rest of an
/// install after events were applied).
fn zero_holes_from(inner: &Inner, unit: u64, data: &mut [u8], from: usize) {
    let bits = {
        let mut holes = inner.holes.lock().unwrap_or_else(|e| e.into_inner());
        match holes.remove(&unit) {
            Some(b) => b,
            None => return,
        }
    };
    for (k, sub) in data.chunks_exact_mut(PAGE_SIZE).enumerate() {
        let i = from + k;
        if bits[i / 64] & (1 << (i % 64)) != 0 {
            sub.fill(0);
        }
    }
}

/// Reads the run's units into `out` (one unit per entry of `kinds`).
/// `fresh`: `out` is memory registered with no userfaultfd (the nursery), which reads zeros once
/// emptied and populated.
fn fetch_units(inner: &Inner, first: u64, kinds: &[Source], out: &mut [u8], fresh: bool) {
    let ub = inner.unit_bytes();
    let upp = inner.upp();
    let mut fetched = 0u64;
    for (k, &kind) in kinds.iter().enumerate() {
        let dst = &mut out[k * ub..(k + 1) * ub];
        let unit = first + k as u64;
        match kind {
            Source::Held => continue,
            Source::Zeros if fresh => {
                // The kernel zeroes the THP it allocates: writing zeros again would pass over
                // 2 MiB twice. Emptied first: a unit whose install was given up (released
                // meanwhile) left its contents here.
                let at = dst.as_mut_ptr() as usize;
                // SAFETY: the handler's own nursery (registered with no userfaultfd, so no event),
                // whose old contents nobody needs; the slice over it is not read before the
                // populate below refills it with zeros.
                let emptied = unsafe { rackmem_sys::madvise_dontneed(at, ub) };
                if let Err(e) = emptied.and_then(|()| rackmem_sys::madvise_populate_write(at, ub)) {
                    inner.internal_error(&format!("populating the huge units' receive area: {e}"));
                }
                continue;
            }
            Source::Zeros => {
                dst.fill(0);
                continue;
            }
            Source::Fill(w) => {
                writeback::fill_with(dst, w);
                inner.stats.refetched.insert(unit * upp);
                continue;
            }
            Source::Brick => {}
        }
        inner.stats.refetched.insert(unit * upp);
        // One read per segment the unit lies in (one, for standalone bricks' whole units).
        let (mut p, end) = (unit * upp, (unit + 1) * upp);
        while p < end {
            let Some((seg_i, off, seg_end)) = inner.table.lookup_run(p) else {
                inner.internal_error(&format!("window page {p} has no segment"));
            };
            let n = (seg_end.min(end) - p) as usize;
            let at = (p - unit * upp) as usize * PAGE_SIZE;
            let seg = inner.segment(seg_i);
            seg.limiter.acquire((n * PAGE_SIZE) as u64);
            if let Err(e) = seg.read(&[(off, (n * PAGE_SIZE) as u32)], &mut dst[at..at + n * PAGE_SIZE]) {
                inner.brick_lost(seg_i, &format!("fetching window unit {:#x}", inner.unit_addr(unit)), &e);
            }
            if seg.shared.get().is_some() {
                inner
                    .stats
                    .bytes_fetched_shared
                    .fetch_add((n * PAGE_SIZE) as u64, Ordering::Relaxed);
            }
            fetched += n as u64;
            p += n as u64;
        }
    }
    let s = &inner.stats;
    match kinds[0] {
        Source::Brick => {
            s.faults_remote.fetch_add(1, Ordering::Relaxed);
            s.bytes_fetched.fetch_add(PAGE, Ordering::Relaxed);
            s.bytes_prefetched
                .fetch_add(fetched.saturating_sub(1) * PAGE, Ordering::Relaxed);
        }
        first => {
            let counter = if matches!(first, Source::Fill(_)) {
                &s.faults_filled
            } else {
                &s.faults_zero
            };
            counter.fetch_add(1, Ordering::Relaxed);
            s.bytes_prefetched.fetch_add(fetched * PAGE, Ordering::Relaxed);
        }
    }
}

/// Writes back every resident unit's changed subpages (fork preparation, as `flush_dirty` for
/// pages; handlers parked, write-back queue drained). Subpages missing from the window (released
/// inside the unit) are read as the zeros the program would read. Returns the pages written.
pub(crate) fn flush_dirty_units(inner: &Inner) -> u64 {
    let ub = inner.unit_bytes();
    let upp = inner.upp();
    let mut data = vec![0u8; ub];
    let mut count = 0;
    for u in crate::writeback::resident_units(inner) {
        let mut c = inner.lock();
        if c.location(u) != Location::Resident {
            continue;
        }
        let base = inner.unit_addr(u);
        let b = c.unit_prot(u);
        let readable =
            b & rackmem_pager::prot::SET == 0 || i32::from(b & rackmem_pager::prot::MASK) & libc::PROT_READ != 0;
        for (i, sub) in data.chunks_exact_mut(PAGE_SIZE).enumerate() {
            let at = base + i * PAGE_SIZE;
            let present = match rackmem_sys::page_entry(at) {
                Ok(e) => e != rackmem_sys::PageEntry::None,
                Err(e) => inner.internal_error(&format!("reading the page table before fork: {e}")),
            };
            if !present {
                // Touching it would fault to the parked handler.
                sub.fill(0);
            } else if readable {
                inner.window.read((u * upp) as usize * PAGE_SIZE + i * PAGE_SIZE, sub);
            } else {
                use std::os::unix::fs::FileExt;
                let read = std::fs::File::open("/proc/self/mem").and_then(|f| f.read_exact_at(sub, at as u64));
                if let Err(e) = read {
                    inner.internal_error(&format!("reading protected window unit {u} before fork: {e}"));
                }
            }
        }
        let checks: Vec<Check> = data.chunks_exact(PAGE_SIZE).map(check).collect();
        let brick_valid = c.state(u).brick_valid();
        let runs = changed_runs(if brick_valid { c.sums_of(u) } else { None }, &checks);
        if runs.is_empty() {
            continue;
        }
        for r in runs {
            let (mut p, end) = (u * upp + u64::from(r.start), u * upp + u64::from(r.end));
            while p < end {
                let Some((brick, off, seg_end)) = inner.table.lookup_run(p) else {
                    inner.internal_error(&format!("window page {p} has no segment"));
                };
                let n = (seg_end.min(end) - p) as usize;
                let at = (p - u * upp) as usize * PAGE_SIZE;
                let seg = inner.segment(brick);
                let bytes = &data[at..at + n * PAGE_SIZE];
                if let Err(err) = seg.write(&[(off, (n * PAGE_SIZE) as u32)], bytes, !brick_valid) {
                    inner.brick_lost(brick, "writing back dirty pages before fork", &err);
                }
                inner
                    .stats
                    .bytes_written_back
                    .fetch_add((n * PAGE_SIZE) as u64, Ordering::Relaxed);
                count += n as u64;
                p += n as u64;
            }
        }
        c.mark_written(u, None);
        c.record_sums(u, checks.into_boxed_slice());
    }
    count
}

/// The mapped segment holding all of unit `unit`, and the unit's byte offset in it.
pub(crate) fn mapped_unit(inner: &Inner, unit: u64) -> Option<(std::sync::Arc<crate::segment::Segment>, usize)> {
    let first = unit * inner.upp();
    let (index, off, seg_end) = inner.table.lookup_run(first)?;
    if seg_end < first + inner.upp() {
        return None;
    }
    inner
        .table
        .get(index)
        .filter(|s| s.shared.get().is_some())
        .map(|s| (s, off as usize))
}
