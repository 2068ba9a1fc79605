//! The region allocator: carves the window into page-aligned regions for allocations.
//!
//! Every allocation that lands in the window (a large `malloc`, an anonymous `mmap`) is a run of
//! whole pages. Free space is a `BTreeMap<start_page, pages>` kept coalesced, so allocation is
//! first fit in O(log n + scanned), and `free` of any page-aligned sub-range (what `munmap` may
//! do) splits the live region it falls in. Addresses here are page indexes relative to the
//! window base; the runtime converts.

use std::collections::BTreeMap;

/// Page-granular first-fit allocator over `[0, total_pages)`.
#[derive(Debug, Clone)]
pub struct RegionAllocator {
    total_pages: u64,
    free: BTreeMap<u64, u64>,
    live: BTreeMap<u64, u64>,
    allocated_pages: u64,
}

impl RegionAllocator {
    /// An allocator with every page free.
    pub fn new(total_pages: u64) -> Self {
        let mut free = BTreeMap::new();
        if total_pages > 0 {
            free.insert(0, total_pages);
        }
        Self {
            total_pages,
            free,
            live: BTreeMap::new(),
            allocated_pages: 0,
        }
    }

    /// Pages currently allocated (the footprint in the window).
    pub fn allocated_pages(&self) -> u64 {
        self.allocated_pages
    }

    /// One past the last allocated page (0 when nothing is allocated).
    pub fn high_water(&self) -> u64 {
        self.live.last_key_value().map_or(0, |(&s, &l)| s + l)
    }

    /// The size of the managed range.
    pub fn total_pages(&self) -> u64 {
        self.total_pages
    }

    /// Allocates `pages` pages whose first page index is a multiple of `align_pages`.
    pub fn alloc(&mut self, pages: u64, align_pages: u64) -> Option<u64> {
        if pages == 0 {
            return None;
        }
        let align = align_pages.max(1);
        let mut found = None;
        for (&start, &len) in &self.free {
            let aligned = start.div_ceil(align) * align;
            let pad = aligned - start;
            if len >= pad + pages {
                found = Some((start, len, aligned));
                break;
            }
        }
        let (start, len, aligned) = found?;
        self.free.remove(&start);
        if aligned > start {
            self.free.insert(start, aligned - start);
        }
        let end = aligned + pages;
        if start + len > end {
            self.free.insert(end, start + len - end);
        }
        self.live.insert(aligned, pages);
        self.allocated_pages += pages;
        Some(aligned)
    }

    /// Allocates exactly `[start, start + pages)` if every page of it is free (an `mmap` hint
    /// or `MAP_FIXED` into free window space).
    pub fn alloc_at(&mut self, start: u64, pages: u64) -> bool {
        if pages == 0 {
            return false;
        }
        let Some((&fs, &fl)) = self.free.range(..=start).next_back() else {
            return false;
        };
        let end = start + pages;
        if fs + fl < end {
            return false;
        }
        self.free.remove(&fs);
        if start > fs {
            self.free.insert(fs, start - fs);
        }
        if fs + fl > end {
            self.free.insert(end, fs + fl - end);
        }
        self.live.insert(start, pages);
        self.allocated_pages += pages;
        true
    }

    /// The live region starting exactly at `start`, as its length in pages.
    pub fn region_at(&self, start: u64) -> Option<u64> {
        self.live.get(&start).copied()
    }

    /// The live region containing page `page`, as `(start, pages)`.
    pub fn region_containing(&self, page: u64) -> Option<(u64, u64)> {
        let (&s, &l) = self.live.range(..=page).next_back()?;
        (page < s + l).then_some((s, l))
    }

    /// Tries to grow or shrink the region at `start` in place to `new_pages`.
    pub fn resize_in_place(&mut self, start: u64, new_pages: u64) -> bool {
        let Some(&old) = self.live.get(&start) else {
            return false;
        };
        if new_pages == 0 {
            return false;
        }
        if new_pages <= old {
            self.free_range(start + new_pages, old - new_pages);
            return true;
        }
        let need = new_pages - old;
        let after = start + old;
        match self.free.get(&after).copied() {
            Some(len) if len >= need => {
                self.free.remove(&after);
                if len > need {
                    self.free.insert(after + need, len - need);
                }
                self.live.insert(start, new_pages);
                self.allocated_pages += need;
                true
            }
            _ => false,
        }
    }

    /// Frees the pages `[start, start + pages)` that are live; pages already free are ignored,
    /// so a partial `munmap` over several regions works. Returns the pages actually freed as
    /// ranges.
    pub fn free_range(&mut self, start: u64, pages: u64) -> Vec<(u64, u64)> {
        let end = start.saturating_add(pages);
        let mut freed = Vec::new();
        let overlapping: Vec<(u64, u64)> = self
            .live
            .range(..end)
            .rev()
            .take_while(|(&s, &l)| s + l > start)
            .map(|(&s, &l)| (s, l))
            .collect();
        for (s, l) in overlapping {
            let e = s + l;
            let fs = s.max(start);
            let fe = e.min(end);
            self.live.remove(&s);
            if fs > s {
                self.live.insert(s, fs - s);
            }
            if e > fe {
                self.live.insert(fe, e - fe);
            }
            self.allocated_pages -= fe - fs;
            self.insert_free(fs, fe - fs);
            freed.push((fs, fe - fs));
        }
        freed.reverse();
        freed
    }

    fn insert_free(&mut self, mut start: u64, mut len: u64) {
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            if ps + pl == start {
                self.free.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += nl;
        }
        self.free.insert(start, len);
    }

    /// Checks the allocator's invariants (used by tests): free and live ranges are disjoint,
    /// cover everything, free ranges are coalesced, and the count is right.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut all: Vec<(u64, u64, bool)> = self
            .free
            .iter()
            .map(|(&s, &l)| (s, l, true))
            .chain(self.live.iter().map(|(&s, &l)| (s, l, false)))
            .collect();
        all.sort();
        let mut at = 0;
        let mut prev_free = false;
        for (s, l, is_free) in all {
            if s != at {
                return Err(format!("gap or overlap at page {at} (next range starts {s})"));
            }
            if l == 0 {
                return Err(format!("empty range at {s}"));
            }
            if is_free && prev_free {
                return Err(format!("uncoalesced free range at {s}"));
            }
            prev_free = is_free;
            at = s + l;
        }
        if at != self.total_pages {
            return Err(format!("ranges end at {at}, not {}", self.total_pages));
        }
        let live: u64 = self.live.values().sum();
        if live != self.allocated_pages {
            return Err(format!("allocated count {} != {live}", self.allocated_pages));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_fit_and_coalesce() {
        let mut a = RegionAllocator::new(100);
        let x = a.alloc(10, 1).unwrap();
        let y = a.alloc(10, 1).unwrap();
        assert_eq!((x, y), (0, 10));
        assert_eq!(a.free_range(0, 10), vec![(0, 10)]);
        assert_eq!(a.alloc(5, 1), Some(0));
        assert_eq!(a.alloc(16, 16), Some(32));
        a.check_invariants().unwrap();
        assert_eq!(a.allocated_pages(), 31);
        assert!(a.resize_in_place(10, 12));
        assert!(!a.resize_in_place(10, 40));
        assert_eq!(a.alloc(1000, 1), None);
        assert!(a.alloc_at(60, 4));
        assert!(!a.alloc_at(62, 4), "overlaps a live region");
        assert_eq!(a.region_at(60), Some(4));
        a.check_invariants().unwrap();
    }

    #[test]
    fn partial_free_splits() {
        let mut a = RegionAllocator::new(64);
        assert_eq!(a.alloc(20, 1), Some(0));
        assert_eq!(a.free_range(5, 5), vec![(5, 5)]);
        assert_eq!(a.region_containing(3), Some((0, 5)));
        assert_eq!(a.region_containing(12), Some((10, 10)));
        assert_eq!(a.region_containing(7), None);
        assert!(a.check_invariants().is_ok());
    }

    proptest! {
        #[test]
        fn random_ops_keep_invariants(ops in proptest::collection::vec((0u8..3, 1u64..40, 0u64..256), 1..200)) {
            let mut a = RegionAllocator::new(256);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (op, n, at) in ops {
                match op {
                    0 => if let Some(s) = a.alloc(n, if n % 2 == 0 { 4 } else { 1 }) {
                        for &(ls, ll) in &live { prop_assert!(s + n <= ls || ls + ll <= s); }
                        live.push((s, n));
                    },
                    1 => { a.free_range(at, n); live.clear(); live.extend(a.live.iter().map(|(&s, &l)| (s, l))); }
                    _ => if let Some(&(s, _)) = live.first() { a.resize_in_place(s, n); live.clear(); live.extend(a.live.iter().map(|(&s, &l)| (s, l))); },
                }
                prop_assert!(a.check_invariants().is_ok(), "{:?}", a.check_invariants());
            }
        }
    }
}
