//! Free extents of one brick's pool, and the index of bricks by their largest free extent.
//!
//! Extents are whole MiB ([`EXTENT_ALIGN`]): segments start and end on MiB boundaries so a
//! brick's pool never fragments below that. Each brick keeps its free extents twice, by start
//! (to coalesce a released extent with its neighbours) and by size (best fit in O(log n)). The
//! control plane keeps the up bricks in a [`BrickIndex`] ordered by largest free extent, so
//! picking bricks for a stripe looks at the emptiest bricks first instead of scanning them all.

use std::collections::{BTreeMap, BTreeSet};

/// Granularity of segments in a brick's pool.
pub const EXTENT_ALIGN: u64 = 1 << 20;

/// Rounds up to whole [`EXTENT_ALIGN`]; `None` when that does not fit in a u64.
pub fn align_up(bytes: u64) -> Option<u64> {
    bytes.checked_add(EXTENT_ALIGN - 1).map(|b| b & !(EXTENT_ALIGN - 1))
}

/// The free extents of one brick's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeExtents {
    usable_bytes: u64,
    by_start: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    free_bytes: u64,
}

impl FreeExtents {
    /// All of a pool of `capacity_bytes` free (the tail below one MiB is never handed out).
    pub fn new(capacity_bytes: u64) -> FreeExtents {
        let usable_bytes = capacity_bytes & !(EXTENT_ALIGN - 1);
        let mut f = FreeExtents {
            usable_bytes,
            by_start: BTreeMap::new(),
            by_size: BTreeSet::new(),
            free_bytes: 0,
        };
        if usable_bytes > 0 {
            f.insert(0, usable_bytes);
        }
        f
    }

    /// Bytes that segments may use at all.
    pub fn usable_bytes(&self) -> u64 {
        self.usable_bytes
    }

    /// Bytes in no segment.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// The largest segment that fits now.
    pub fn largest(&self) -> u64 {
        self.by_size.last().map_or(0, |&(len, _)| len)
    }

    /// The free extents, by start.
    pub fn extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_start.iter().map(|(&s, &l)| (s, l))
    }

    fn insert(&mut self, start: u64, len: u64) {
        self.by_start.insert(start, len);
        self.by_size.insert((len, start));
        self.free_bytes += len;
    }

    fn remove(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.by_size.remove(&(len, start));
        self.free_bytes -= len;
    }

    /// Carves `size_bytes` (a positive multiple of [`EXTENT_ALIGN`]) from the smallest free
    /// extent that holds it, at that extent's start; returns the offset.
    pub fn carve(&mut self, size_bytes: u64) -> Option<u64> {
        if size_bytes == 0 || !size_bytes.is_multiple_of(EXTENT_ALIGN) {
            return None;
        }
        let &(len, start) = self.by_size.range((size_bytes, 0)..).next()?;
        self.remove(start, len);
        if len > size_bytes {
            self.insert(start + size_bytes, len - size_bytes);
        }
        Some(start)
    }

    /// Carves exactly `[offset, offset + size_bytes)`, when all of it is free (used to rebuild
    /// the extents from stored segments).
    pub fn carve_at(&mut self, offset: u64, size_bytes: u64) -> bool {
        let Some(end) = offset.checked_add(size_bytes) else {
            return false;
        };
        if size_bytes == 0 || !offset.is_multiple_of(EXTENT_ALIGN) || !size_bytes.is_multiple_of(EXTENT_ALIGN) {
            return false;
        }
        let Some((&start, &len)) = self.by_start.range(..=offset).next_back() else {
            return false;
        };
        if start + len < end {
            return false;
        }
        self.remove(start, len);
        if offset > start {
            self.insert(start, offset - start);
        }
        if start + len > end {
            self.insert(end, start + len - end);
        }
        true
    }

    /// Gives `[offset, offset + size_bytes)` back, merging it with free neighbours. Returns false
    /// (and changes nothing) when any of it is already free or outside the pool.
    pub fn release(&mut self, offset: u64, size_bytes: u64) -> bool {
        let Some(end) = offset.checked_add(size_bytes) else {
            return false;
        };
        if size_bytes == 0 || end > self.usable_bytes {
            return false;
        }
        let before = self.by_start.range(..end).next_back().map(|(&s, &l)| (s, l));
        if let Some((s, l)) = before {
            if s + l > offset {
                return false;
            }
        }
        let (mut start, mut len) = (offset, size_bytes);
        if let Some((s, l)) = before {
            if s + l == offset {
                self.remove(s, l);
                start = s;
                len += l;
            }
        }
        if let Some(&after_len) = self.by_start.get(&end) {
            self.remove(end, after_len);
            len += after_len;
        }
        self.insert(start, len);
        true
    }
}

/// The up bricks ordered by their largest free extent.
#[derive(Debug, Default, Clone)]
pub struct BrickIndex {
    set: BTreeSet<(u64, u64)>,
}

impl BrickIndex {
    /// Puts (or moves) a brick at its current largest free extent.
    pub fn update(&mut self, brick: u64, old_largest: Option<u64>, largest: u64) {
        if let Some(old) = old_largest {
            self.set.remove(&(old, brick));
        }
        self.set.insert((largest, brick));
    }

    /// Takes a brick out (it went down or left).
    pub fn remove(&mut self, brick: u64, largest: u64) {
        self.set.remove(&(largest, brick));
    }

    /// Bricks whose largest free extent holds `size_bytes`, emptiest first.
    pub fn candidates(&self, size_bytes: u64) -> impl Iterator<Item = u64> + '_ {
        self.set.range((size_bytes, 0)..).rev().map(|&(_, b)| b)
    }

    /// Number of bricks in the index.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// True when no brick is up.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const M: u64 = EXTENT_ALIGN;

    #[test]
    fn carve_release_coalesce() {
        let mut f = FreeExtents::new(10 * M + 123);
        assert_eq!(f.usable_bytes(), 10 * M);
        let a = f.carve(3 * M).unwrap();
        let b = f.carve(3 * M).unwrap();
        let c = f.carve(4 * M).unwrap();
        assert_eq!((a, b, c), (0, 3 * M, 6 * M));
        assert_eq!(f.carve(M), None);
        assert!(f.release(b, 3 * M));
        assert!(!f.release(b, 3 * M), "double free refused");
        assert!(f.release(a, 3 * M));
        assert_eq!(f.largest(), 6 * M);
        assert!(f.release(c, 4 * M));
        assert_eq!(f.extents().collect::<Vec<_>>(), vec![(0, 10 * M)]);
        assert!(f.carve_at(2 * M, M));
        assert!(!f.carve_at(2 * M, M));
        assert_eq!(f.free_bytes(), 9 * M);
        assert_eq!(f.carve(0), None);
        assert_eq!(f.carve(M + 1), None);
        assert!(!f.release(20 * M, M), "outside the pool");
    }

    #[test]
    fn best_fit_takes_the_smallest_hole() {
        let mut f = FreeExtents::new(10 * M);
        let offs: Vec<u64> = (0..10).map(|_| f.carve(M).unwrap()).collect();
        f.release(offs[1], M);
        f.release(offs[4], M);
        f.release(offs[5], M);
        assert_eq!(f.carve(M), Some(M), "the 1 MiB hole, not the 2 MiB one");
        assert_eq!(f.carve(2 * M), Some(4 * M));
    }

    #[test]
    fn index_orders_by_largest_free_extent() {
        let mut i = BrickIndex::default();
        i.update(1, None, 4 * M);
        i.update(2, None, 8 * M);
        i.update(3, None, 2 * M);
        assert_eq!(i.candidates(3 * M).collect::<Vec<_>>(), vec![2, 1]);
        i.update(2, Some(8 * M), M);
        assert_eq!(i.candidates(0).collect::<Vec<_>>(), vec![1, 3, 2]);
        i.remove(1, 4 * M);
        assert_eq!(i.len(), 2);
    }

    proptest! {
        /// Random carves and releases: segments never overlap, stay inside the pool, and free
        /// plus carved bytes always equal the usable bytes.
        #[test]
        fn random_alloc_free_never_overlaps(ops in proptest::collection::vec((any::<bool>(), 1u64..6, any::<prop::sample::Index>()), 1..200)) {
            let mut f = FreeExtents::new(64 * M);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (alloc, mib, pick) in ops {
                if alloc || live.is_empty() {
                    if let Some(off) = f.carve(mib * M) {
                        live.push((off, mib * M));
                    } else {
                        prop_assert!(f.largest() < mib * M);
                    }
                } else {
                    let (off, len) = live.swap_remove(pick.index(live.len()));
                    prop_assert!(f.release(off, len));
                }
                let used: u64 = live.iter().map(|s| s.1).sum();
                prop_assert_eq!(used + f.free_bytes(), 64 * M);
                let mut sorted = live.clone();
                sorted.sort();
                for w in sorted.windows(2) {
                    prop_assert!(w[0].0 + w[0].1 <= w[1].0, "overlap {:?}", w);
                }
                for &(o, l) in &live {
                    prop_assert!(o + l <= 64 * M);
                    for (fo, fl) in f.extents() {
                        prop_assert!(o + l <= fo || fo + fl <= o, "live {:?} overlaps free {:?}", (o, l), (fo, fl));
                    }
                }
                // Free extents are coalesced: no two touch.
                let ext: Vec<_> = f.extents().collect();
                for w in ext.windows(2) {
                    prop_assert!(w[0].0 + w[0].1 < w[1].0);
                }
            }
        }
    }
}
