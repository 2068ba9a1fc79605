//! The write-back thread: takes staged victims from the fault handler, writes the dirty ones to
//! their bricks, then frees their staging slots and marks them remote (or empty again, for a
//! zero page nobody wrote).
//!
//! A victim is dirty if its contents no longer match the checksum taken when it was installed
//! (or last written back). The check runs on the staged copy, after the `UFFDIO_MOVE` took the
//! page out of the window, so no write of the program can slip in between check and send.
//! Write-back uses its own link per brick, so the handler's fetches never queue behind it.

use crate::segment::Segment;
use crate::{Inner, Job, Victim, PAGE, PAGE_SIZE};
use rackmem_pager::unit::{changed_runs, unit_filled, Check};
use rackmem_pager::writeback::{Examined, Writer};
use rackmem_pager::Location;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

/// Queues a job for the write-back thread (started now if it was deferred: see
/// `start::start_deferred_threads`).
pub(crate) fn submit(inner: &Arc<Inner>, job: Job) {
    crate::start::start_deferred_threads(inner);
    inner.jobs_busy.fetch_add(1, Ordering::AcqRel);
    inner.jobs.lock().unwrap_or_else(|e| e.into_inner()).push_back(job);
    inner.jobs_cv.notify_one();
}

/// Waits until every queued job is done.
pub(crate) fn drain(inner: &Inner) {
    let mut q = inner.jobs.lock().unwrap_or_else(|e| e.into_inner());
    while inner.jobs_busy.load(Ordering::Acquire) != 0 {
        q = inner
            .jobs_cv
            .wait_timeout(q, std::time::Duration::from_millis(1))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

pub(crate) fn run(inner: Arc<Inner>) {
    // Kept across jobs: a fresh buffer per job would touch fresh pages, each several times
    // dearer than a copy on virtual machines that hand freed memory back to their host.
    let mut bufs: Vec<BrickWrites> = Vec::new();
    loop {
        let job = {
            let mut q = inner.jobs.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(j) = q.pop_front() {
                    break j;
                }
                q = inner.jobs_cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        match job {
            Job::Evict { id, victims } => evict(&inner, id, &victims, &mut bufs),
            Job::Discard { seg, offset, len } => {
                // The segment may have been returned since (see `Runtime::shrink`).
                if let Some(s) = inner.table.get(seg) {
                    if let Err(e) = s.writeback().and_then(|l| l.discard(offset, len)) {
                        inner.brick_lost(seg, "releasing freed memory", &e);
                    }
                }
            }
        }
        inner.jobs_busy.fetch_sub(1, Ordering::AcqRel);
        inner.jobs_cv.notify_all();
    }
}

/// Dirty pages bound for one brick: pages it already holds memory for, and fresh ones (see
/// [`Segment::write`](crate::segment::Segment::write)).
#[derive(Default)]
pub(crate) struct BrickWrites {
    extents: Vec<(u64, u32)>,
    data: Vec<u8>,
    fresh_extents: Vec<(u64, u32)>,
    fresh_data: Vec<u8>,
}

impl BrickWrites {
    fn clear(&mut self) {
        self.extents.clear();
        self.data.clear();
        self.fresh_extents.clear();
        self.fresh_data.clear();
    }
}

/// Whether `contents`, a page at offset `off` of a segment, is what the brick already holds (or,
/// for a page the brick holds no memory for, still the zero page it was installed as).
///
/// A mapped segment (`mapped`) is compared with the mapping itself: the brick's copy is right
/// there, and a dirty page differs within its first bytes more often than not. Other segments
/// compare checksums: `hash` is the one taken when the page was installed or written back.
fn unchanged(mapped: Option<&Arc<Segment>>, off: u64, brick_valid: bool, hash: u64, contents: &[u8]) -> bool {
    match mapped.and_then(|s| s.shared.get()) {
        Some(m) if brick_valid => m.equals(off as usize, contents),
        Some(_) => contents.chunks(64).all(|c| c.iter().fold(0, |a, &b| a | b) == 0),
        None => xxh3_64(contents) == hash,
    }
}

/// The word `page` consists of, if every 8-byte word of it is the same (a page a program filled
/// with one value: zeros, a constant array). Such a page is kept in the core as its word instead
/// of being compared with or written to its brick, and its next fetch is a fill: half the memory
/// traffic of a copy each way, and no link round trip. Linux's zram does the same.
pub(crate) fn same_filled(page: &[u8]) -> Option<u64> {
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_ne_bytes(w)
    };
    let first = word(page.get(..8)?);
    // The first 64 bytes word by word (most pages that are not same-filled differ there), then
    // every other 64-byte block against the first: a vectorised compare at memory speed (twice
    // as fast as comparing word by word).
    let (head, rest) = page.split_at(64.min(page.len()));
    if !head.chunks_exact(8).all(|x| word(x) == first) {
        return None;
    }
    rest.chunks(64).all(|b| b == &head[..b.len()]).then_some(first)
}

/// Fills `out` (whole pages) with `word` repeated.
pub(crate) fn fill_with(out: &mut [u8], word: u64) {
    let w = word.to_ne_bytes();
    for c in out.chunks_exact_mut(8) {
        c.copy_from_slice(&w);
    }
}

/// Writes back eviction job `id` through the pager core's write-back sequence
/// ([`rackmem_pager::writeback::write_back`]), then wakes whoever waits for its slots or pages.
/// Run by the write-back thread, or by the handler for a job whose pages all go to mapped
/// segments.
pub(crate) fn evict(inner: &Inner, id: u64, victims: &[Victim], per_brick: &mut Vec<BrickWrites>) {
    // Per brick: extents and the data to write.
    per_brick.resize_with(inner.table.len(), BrickWrites::default);
    per_brick.iter_mut().for_each(BrickWrites::clear);
    let mut w = Writes {
        inner,
        mapped_of: vec![None; per_brick.len()],
        per_brick,
        written_mapped: 0,
        clean: 0,
        filled: 0,
    };
    rackmem_pager::writeback::write_back(&inner.core, &mut w, id, victims);
    let s = &inner.stats;
    s.bytes_written_back.fetch_add(w.written_mapped, Ordering::Relaxed);
    s.bytes_written_shared.fetch_add(w.written_mapped, Ordering::Relaxed);
    s.evictions_clean.fetch_add(w.clean, Ordering::Relaxed);
    s.evictions_same_filled.fetch_add(w.filled, Ordering::Relaxed);
    inner.core_cv.notify_all();
}

/// One eviction job's writes: dirty pages gathered per brick (or copied into mapped segments
/// at once), sent by `flush`.
struct Writes<'a> {
    inner: &'a Inner,
    /// The mapped segment of each brick that has one, looked up once per job.
    mapped_of: Vec<Option<Option<Arc<Segment>>>>,
    per_brick: &'a mut Vec<BrickWrites>,
    written_mapped: u64,
    clean: u64,
    filled: u64,
}

impl Writer for Writes<'_> {
    fn examine(&mut self, v: &Victim) -> Examined {
        let inner = self.inner;
        if inner.huge() {
            return self.examine_unit(v);
        }
        let page = crate::recycle::staged_page(inner, v.slot);
        if let Some(w) = same_filled(page) {
            // Whatever the brick holds for it is not read again (see `Core::fills`).
            self.filled += 1;
            return Examined::Filled(w);
        }
        let Some((brick, off)) = inner.table.lookup(v.page as u64) else {
            inner.internal_error(&format!("window page {} has no segment", v.page));
        };
        // Checked in place; only a page to write is copied, straight into the brick's outgoing
        // data, or into the mapped segment when the brick already holds memory for it (fresh
        // pages go over the link: see `Segment::write`).
        let mapped = self.mapped_of[brick]
            .get_or_insert_with(|| inner.table.get(brick).filter(|s| s.shared.get().is_some()))
            .as_ref();
        if unchanged(mapped, off, v.brick_valid, v.hash, page) {
            self.clean += 1;
            return Examined::Clean;
        }
        let w = &mut self.per_brick[brick];
        // While a lazy clone of the segment may share the page, it goes over the link: the
        // brick copies it into the clone first.
        let (ext, data) = match mapped.and_then(|s| s.mapped_for_overwrite().map(|m| (s, m))) {
            Some((seg, m)) if v.backed => {
                seg.limiter.acquire(PAGE);
                m.write(off as usize, page);
                self.written_mapped += PAGE;
                return Examined::Dirty;
            }
            Some(_) => (&mut w.fresh_extents, &mut w.fresh_data),
            None => (&mut w.extents, &mut w.data),
        };
        data.extend_from_slice(page);
        match ext.last_mut() {
            Some(last) if last.0 + last.1 as u64 == off => last.1 += PAGE_SIZE as u32,
            _ => ext.push((off, PAGE_SIZE as u32)),
        }
        Examined::Dirty
    }

    fn flush(&mut self) {
        let inner = self.inner;
        for (brick, w) in self.per_brick.iter().enumerate() {
            for (ext, data, fresh) in [(&w.extents, &w.data, false), (&w.fresh_extents, &w.fresh_data, true)] {
                if ext.is_empty() {
                    continue;
                }
                let seg = inner.segment(brick);
                seg.limiter.acquire(data.len() as u64);
                if let Err(e) = seg.write(ext, data, fresh) {
                    inner.brick_lost(brick, "writing back evicted pages", &e);
                }
                inner
                    .stats
                    .bytes_written_back
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            if !w.extents.is_empty() || !w.fresh_extents.is_empty() {
                inner.segment(brick).check_lazy_clones();
            }
        }
    }

    /// Frees slots past the spent cap with one madvise per run (no event: the staging uffd has
    /// none).
    fn discard_slots(&mut self, start: u32, count: u32) {
        let at = self.inner.slot_addr(start);
        // SAFETY: slots of the staging area, which this runtime set aside and reaches only
        // through raw addresses or `recycle`'s slices; these slots are past the spent cap and
        // belong to no run or job, so no slice points into them.
        if let Err(e) = unsafe { rackmem_sys::madvise_dontneed(at, count as usize * self.inner.unit_bytes()) } {
            self.inner.internal_error(&format!("freeing staging slots: {e}"));
        }
    }
}

impl Writes<'_> {
    /// A staged huge unit: same-filled whole, clean, or dirty with only its changed subpages
    /// queued, as runs (the checks taken at its install against its contents now).
    fn examine_unit(&mut self, v: &Victim) -> Examined {
        let inner = self.inner;
        let data = crate::recycle::staged_page(inner, v.slot);
        let upp = inner.upp();
        let first = u64::from(v.page) * upp;
        let old = inner.lock().take_staged_sums(u64::from(v.page));
        let runs = match crate::huge::mapped_unit(inner, u64::from(v.page)) {
            // In a mapped segment no checks were taken: the brick's copy is right there, and a
            // changed subpage differs from it within its first bytes more often than not.
            Some((seg, off)) if old.is_none() && seg.shared.get().is_some() => {
                let Some(m) = seg.shared.get() else {
                    inner.internal_error("a mapped unit's segment is not mapped");
                };
                let mut subs = data.chunks_exact(PAGE_SIZE);
                if let Some(w) = subs.next().and_then(same_filled) {
                    if subs.all(|s| same_filled(s) == Some(w)) {
                        self.filled += 1;
                        return Examined::Filled(w);
                    }
                }
                let changed: Vec<Check> = data
                    .chunks_exact(PAGE_SIZE)
                    .enumerate()
                    .map(|(i, sub)| {
                        let same = v.brick_valid && m.equals(off + i * PAGE_SIZE, sub);
                        Check::Sum(u64::from(!same))
                    })
                    .collect();
                let unchanged = vec![Check::Sum(0); changed.len()];
                changed_runs(Some(&unchanged), &changed)
            }
            _ => {
                let checks: Vec<Check> = data.chunks_exact(PAGE_SIZE).map(|d| Check::of(d, xxh3_64)).collect();
                if let Some(w) = unit_filled(&checks) {
                    self.filled += 1;
                    return Examined::Filled(w);
                }
                changed_runs(old.as_deref().filter(|_| v.brick_valid), &checks)
            }
        };
        if runs.is_empty() {
            self.clean += 1;
            return Examined::Clean;
        }
        for r in runs {
            let (mut p, end) = (first + u64::from(r.start), first + u64::from(r.end));
            while p < end {
                let Some((brick, off, seg_end)) = inner.table.lookup_run(p) else {
                    inner.internal_error(&format!("window page {p} has no segment"));
                };
                let n = seg_end.min(end) - p;
                let at = (p - first) as usize * PAGE_SIZE;
                let bytes = &data[at..at + n as usize * PAGE_SIZE];
                p += n;
                let mapped = self.mapped_of[brick]
                    .get_or_insert_with(|| inner.table.get(brick).filter(|s| s.shared.get().is_some()))
                    .as_ref();
                let w = &mut self.per_brick[brick];
                let (ext, out) = match mapped.and_then(|s| s.mapped_for_overwrite().map(|m| (s, m))) {
                    Some((seg, m)) if v.backed => {
                        seg.limiter.acquire(bytes.len() as u64);
                        m.write(off as usize, bytes);
                        self.written_mapped += bytes.len() as u64;
                        continue;
                    }
                    Some(_) => (&mut w.fresh_extents, &mut w.fresh_data),
                    None => (&mut w.extents, &mut w.data),
                };
                out.extend_from_slice(bytes);
                match ext.last_mut() {
                    Some(last) if last.0 + last.1 as u64 == off => last.1 += bytes.len() as u32,
                    _ => ext.push((off, bytes.len() as u32)),
                }
            }
        }
        Examined::Dirty
    }
}

/// The core's units resident now (pages, or 2 MiB huge units), for a walk that locks the core
/// again for each.
pub(crate) fn resident_units(inner: &Inner) -> Vec<u64> {
    let c = inner.lock();
    c.states()
        .enumerate()
        .filter(|(_, s)| s.location() == Location::Resident)
        .map(|(u, _)| u as u64)
        .collect()
}

/// Writes back every resident page whose contents changed since it was installed (fork
/// preparation: the child's clone of the segment must hold the parent's current contents). The
/// handler is parked and the write-back queue drained. Returns the pages written.
pub(crate) fn flush_dirty(inner: &Inner) -> u64 {
    if inner.huge() {
        return crate::huge::flush_dirty_units(inner);
    }
    let zero_hash = xxh3_64(&[0u8; PAGE_SIZE]);
    let mut page = vec![0u8; PAGE_SIZE];
    let mut count = 0;
    for p in resident_units(inner) {
        let mut c = inner.lock();
        if c.location(p) != Location::Resident {
            continue;
        }
        let Some((brick, off)) = inner.table.lookup(p) else {
            continue;
        };
        let seg = inner.segment(brick);
        let b = c.prot_of(p);
        if b & rackmem_pager::prot::SET != 0 && i32::from(b & rackmem_pager::prot::MASK) & libc::PROT_READ == 0 {
            // Not readable through the window (PROT_NONE kept with its contents): read it the
            // way a debugger does, never through the mapping (a fault here would kill the
            // program).
            use std::os::unix::fs::FileExt;
            let read = std::fs::File::open("/proc/self/mem")
                .and_then(|f| f.read_exact_at(&mut page, inner.page_addr(p) as u64));
            if let Err(e) = read {
                inner.internal_error(&format!("reading protected window page {p} before fork: {e}"));
            }
        } else {
            inner.window.read(p as usize * PAGE_SIZE, &mut page);
        }
        let brick_valid = c.state(p).brick_valid();
        let hash = c.hash_of(p).unwrap_or(zero_hash);
        let mapped = Some(&seg).filter(|s| s.shared.get().is_some());
        if unchanged(mapped, off, brick_valid, hash, &page) {
            continue;
        }
        if let Err(err) = seg.write(&[(off, PAGE_SIZE as u32)], &page, !brick_valid) {
            inner.brick_lost(brick, "writing back dirty pages before fork", &err);
        }
        c.mark_written(p, mapped.is_none().then(|| xxh3_64(&page)));
        count += 1;
        inner.stats.bytes_written_back.fetch_add(PAGE, Ordering::Relaxed);
    }
    count
}

#[cfg(test)]
mod tests {
    use super::{fill_with, same_filled};
    use crate::PAGE_SIZE;

    #[test]
    fn a_page_of_one_word_is_same_filled_and_fills_back_identically() {
        for w in [0u64, 1, 0x3ff0_0000_0000_0000, u64::MAX, 0x0102_0304_0506_0708] {
            let mut page = vec![0xaau8; PAGE_SIZE];
            fill_with(&mut page, w);
            assert_eq!(same_filled(&page), Some(w), "word {w:#x}");
            let mut again = vec![0u8; PAGE_SIZE];
            fill_with(&mut again, w);
            assert_eq!(page, again);
        }
    }

    #[test]
    fn one_different_byte_anywhere_makes_a_page_not_same_filled() {
        let mut page = vec![0u8; PAGE_SIZE];
        fill_with(&mut page, 0x4000_0000_0000_0000);
        for at in [0, 1, 7, 8, 63, 64, 2047, 4032, PAGE_SIZE - 1] {
            let mut p = page.clone();
            p[at] ^= 0x10;
            assert_eq!(same_filled(&p), None, "byte {at} changed");
        }
        // Equal bytes that do not repeat one 8-byte word.
        let mut p = vec![0u8; PAGE_SIZE];
        for (i, b) in p.iter_mut().enumerate() {
            *b = (i % 16) as u8;
        }
        assert_eq!(same_filled(&p), None);
    }
}
