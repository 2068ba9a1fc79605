//! Populating mapped bricks' memory ahead of write-backs: a page the brick holds no memory for
//! is written back over the link; one it already holds is a memory copy away.

use crate::handler::Handler;
use crate::{Inner, PAGE, PAGE_SIZE};
use rackmem_pager::{Location, Source};

impl Handler {
    /// Asks the bricks of mapped segments to give memory to the first-touched pages of the run
    /// just installed, without waiting. The local buffer is full, so these pages will be
    /// evicted; their first write-back can then be a memory copy into pages the brick already
    /// owns (see `Segment::write`) instead of a request over the link, and the brick allocates
    /// them on its own CPU, while the program runs.
    pub(crate) fn populate_ahead(&mut self, unit: u64, kinds: &[Source]) {
        let inner = &self.inner;
        // `kinds` are the core's units (pages, or huge units of `upp` pages).
        let upp = inner.upp();
        let page = unit * upp;
        let mut i = 0;
        while i < kinds.len() {
            if kinds[i] != Source::Zeros {
                i += 1;
                continue;
            }
            let Some((index, off, seg_end)) = inner.table.lookup_run(page + i as u64 * upp) else {
                return;
            };
            let mut j = i + 1;
            while j < kinds.len() && kinds[j] == Source::Zeros && page + (j as u64 + 1) * upp <= seg_end {
                j += 1;
            }
            populate(inner, index, off, (j - i) as u64 * upp * PAGE_SIZE as u64);
            i = j;
        }
    }

    /// The local buffer has just filled: the pages touched first while it was filling were
    /// installed without POPULATE, and they are now the next victims. Asks the bricks of mapped
    /// segments to populate the resident pages they hold no data for, in runs (gaps of a few
    /// pages are populated too: one request instead of many).
    pub(crate) fn populate_resident(&mut self) {
        const GAP: u64 = 16;
        let inner = &self.inner;
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let upp = inner.upp();
        {
            let c = inner.lock();
            for (u, s) in c.states().enumerate() {
                if s.location() != Location::Resident || s.brick_valid() {
                    continue;
                }
                let (p, end) = (u as u64 * upp, (u as u64 + 1) * upp);
                match runs.last_mut() {
                    Some(r) if p <= r.1 + GAP => r.1 = end,
                    _ => runs.push((p, end)),
                }
            }
        }
        for (mut p, end) in runs {
            // Along segment boundaries.
            while p < end {
                let Some((index, off, seg_end)) = inner.table.lookup_run(p) else {
                    break;
                };
                let seg_end = seg_end.min(end);
                populate(inner, index, off, (seg_end - p) * PAGE);
                p = seg_end;
            }
        }
    }
}

/// Asks the brick of segment `index`, if it is mapped, to populate `len` bytes at `off`,
/// without waiting. Advisory: if it fails, those pages' first write-back goes over the link.
fn populate(inner: &Inner, index: usize, off: u64, len: u64) {
    let Some(seg) = inner.table.get(index).filter(|s| s.shared.get().is_some()) else {
        return;
    };
    let sent = seg.fault.submit_populate(off, len).map(|t| t.detach());
    match sent {
        Ok(t) => seg.fault.abandon_detached(t),
        Err(e) if inner.cfg.verbose => eprintln!("rackmem: populating brick memory ahead: {e}"),
        Err(_) => {}
    }
}
