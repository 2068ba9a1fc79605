//! Placement: which memory holds each range of the window, and how a range splits by memory.
//!
//! rackmem's memories are the local buffer and each brick segment. Seed 001 (section IV) keeps
//! one interval tree per memory of the virtual ranges it holds, merged where contiguous, and
//! splits a migration request into one migration per source memory; this is that structure in
//! our vocabulary. A window page has one *home*, the segment (and page within it) that holds its
//! brick copy; the local buffer may in addition hold a range *pinned* (fetched and kept
//! resident until unpinned or released, `rackmem_migrate(..., "local")`).
//!
//! The homes are one [`RangeMap`] from window pages to (segment, distance between the window
//! page and its page in the segment), so two ranges merge exactly when they are contiguous both
//! in the window and in one segment; [`Placement::home`] is O(log ranges). Each segment's own
//! tree of the ranges it holds (seed 001's tree per memory, a [`RangeMap`] per segment) is
//! derived from that map when asked for after a change and kept until the next: updating it
//! at every move cost three more interval-map updates per move, most of a single page's move
//! on a cold cache (docs/migration.md), while only a drain or a test reads it. The pinned
//! ranges are a [`RangeSet`]. No I/O: the runtime reads it on its fetch and write-back paths,
//! the simulation to know where a page's brick copy is.
//!
//! Why `rangemap` rather than a hand-written `BTreeMap`: its maps coalesce neighbours with
//! equal values and split ranges on insert and remove, which is exactly the merging and
//! splitting this needs and the part a hand-written map gets wrong; it is maintained, has no
//! dependency and no `unsafe`.

use rangemap::{RangeMap, RangeSet};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Range;

/// A memory that holds window pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Memory {
    /// The process's local buffer (pinned ranges).
    Local,
    /// Segment `n` of the process's segment table (or of the caller's own numbering).
    Segment(u32),
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Memory::Local => f.write_str("the local buffer"),
            Memory::Segment(s) => write!(f, "segment {s}"),
        }
    }
}

/// One piece of a range, held by one memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Window pages of the piece.
    pub pages: Range<u64>,
    /// Who holds them (`None`: no memory does, the range is outside the placed window).
    pub memory: Option<Memory>,
    /// For a segment, the segment page of `pages.start` (0 otherwise).
    pub offset_page: u64,
}

/// Where each window range lives; see the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// Window page → (segment, distance to its segment page): every home, one index.
    homes: RangeMap<u64, (u32, u64)>,
    /// Per segment, the window ranges it holds (value: the distance, as in `homes`), derived
    /// from `homes` at the first reading after a change (`None`: stale).
    segments: RefCell<Option<BTreeMap<u32, RangeMap<u64, u64>>>>,
    /// Ranges the local buffer holds pinned.
    local: RangeSet<u64>,
}

/// The distance from window page `page` to segment page `seg_page` (wrapping: only equality and
/// adding it back matter).
fn delta(page: u64, seg_page: u64) -> u64 {
    seg_page.wrapping_sub(page)
}

impl Placement {
    /// Nothing placed.
    pub fn new() -> Placement {
        Placement::default()
    }

    /// Window pages `pages` now live in `segment`, from its page `offset_page` on (replacing
    /// whatever home they had).
    pub fn assign(&mut self, pages: Range<u64>, segment: u32, offset_page: u64) {
        if pages.is_empty() {
            return;
        }
        // Insert replaces what the range held, splitting neighbours as needed.
        self.homes
            .insert(pages.clone(), (segment, delta(pages.start, offset_page)));
        *self.segments.get_mut() = None;
    }

    /// Window pages `pages` have no home any more.
    pub fn unassign(&mut self, pages: Range<u64>) {
        if pages.is_empty() {
            return;
        }
        self.homes.remove(pages);
        *self.segments.get_mut() = None;
    }

    /// The home of window page `page`: its segment, its page in that segment, and the end
    /// (exclusive) of the window range around it that lies contiguously in that segment.
    pub fn home(&self, page: u64) -> Option<(u32, u64, u64)> {
        let (r, &(s, d)) = self.homes.get_key_value(&page)?;
        Some((s, page.wrapping_add(d), r.end))
    }

    /// Runs `f` on the per-segment trees, deriving them from the index first if a change made
    /// them stale. O(ranges) then, O(1) until the next change.
    fn with_segments<T>(&self, f: impl FnOnce(&BTreeMap<u32, RangeMap<u64, u64>>) -> T) -> T {
        let mut cache = self.segments.borrow_mut();
        let m = cache.get_or_insert_with(|| {
            let mut m: BTreeMap<u32, RangeMap<u64, u64>> = BTreeMap::new();
            for (r, &(s, d)) in self.homes.iter() {
                m.entry(s).or_default().insert(r.clone(), d);
            }
            m
        });
        f(m)
    }

    /// Pins `pages` in the local buffer.
    pub fn pin(&mut self, pages: Range<u64>) {
        if !pages.is_empty() {
            self.local.insert(pages);
        }
    }

    /// Unpins `pages`.
    pub fn unpin(&mut self, pages: Range<u64>) {
        if !pages.is_empty() {
            self.local.remove(pages);
        }
    }

    /// True if `page` is pinned in the local buffer.
    pub fn pinned(&self, page: u64) -> bool {
        !self.local.is_empty() && self.local.contains(&page)
    }

    /// True if any page is pinned.
    pub fn any_pinned(&self) -> bool {
        !self.local.is_empty()
    }

    /// The ranges `memory` holds, merged where contiguous, in window order.
    pub fn held_by(&self, memory: Memory) -> Vec<Range<u64>> {
        match memory {
            Memory::Local => self.local.iter().cloned().collect(),
            Memory::Segment(s) => self.with_segments(|m| {
                m.get(&s)
                    .map(|r| r.iter().map(|(r, _)| r.clone()).collect())
                    .unwrap_or_default()
            }),
        }
    }

    /// Splits `pages` into pieces by the memory a migration would take them from: the local
    /// buffer where pinned, else their home segment (one piece per contiguous stretch of a
    /// segment), else no memory. In window order, covering `pages` exactly.
    pub fn pieces(&self, pages: Range<u64>) -> Vec<Piece> {
        let mut out: Vec<Piece> = Vec::new();
        let mut at = pages.start;
        while at < pages.end {
            let (memory, end, offset_page) = if self.pinned(at) {
                let r = self.local.get(&at).map_or(at + 1, |r| r.end);
                (Some(Memory::Local), r, 0)
            } else {
                // Up to the next pinned page, so pins split home pieces.
                let next_pin = self
                    .local
                    .overlapping(at..pages.end)
                    .next()
                    .map_or(pages.end, |r| r.start.max(at));
                match self.home(at) {
                    Some((s, seg_page, end)) => (Some(Memory::Segment(s)), end.min(next_pin), seg_page),
                    None => {
                        let next_home = self
                            .homes
                            .overlapping(at..pages.end)
                            .next()
                            .map_or(pages.end, |(r, _)| r.start.max(at));
                        (None, next_home.min(next_pin), 0)
                    }
                }
            };
            let end = end.min(pages.end);
            out.push(Piece {
                pages: at..end,
                memory,
                offset_page,
            });
            at = end;
        }
        out
    }

    /// Checks the index: no empty range, ranges in order without overlap, and neighbours that
    /// could merge (contiguous, one segment, one distance) merged. O(ranges): for tests.
    pub fn check(&self) -> Result<(), String> {
        let mut last: Option<(Range<u64>, (u32, u64))> = None;
        for (r, &v) in self.homes.iter() {
            if r.is_empty() {
                return Err(format!("the index holds an empty range at {}", r.start));
            }
            if let Some((lr, lv)) = &last {
                if lr.end > r.start {
                    return Err(format!("ranges {lr:?} and {r:?} overlap"));
                }
                if lr.end == r.start && *lv == v {
                    return Err(format!("ranges {lr:?} and {r:?} of segment {} are not merged", v.0));
                }
            }
            last = Some((r.clone(), v));
        }
        // Every segment's tree covers exactly its pages of the index, with the same distances.
        self.with_segments(|m| {
            let mut pages = 0u64;
            for (&s, t) in m {
                if t.is_empty() {
                    return Err(format!("segment {s} holds an empty tree"));
                }
                for (r, &d) in t.iter() {
                    pages += r.end - r.start;
                    for (ir, &(is, id)) in self.homes.overlapping(r) {
                        if is != s || id != d {
                            return Err(format!("{r:?} of segment {s}: the index says {ir:?} → {is}"));
                        }
                    }
                }
            }
            let indexed: u64 = self.homes.iter().map(|(r, _)| r.end - r.start).sum();
            if pages != indexed {
                return Err(format!("the segments' trees hold {pages} pages, the index {indexed}"));
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn contiguous_ranges_merge_and_a_move_splits_them() {
        let mut p = Placement::new();
        p.assign(0..8, 0, 0);
        p.assign(8..16, 0, 8);
        assert_eq!(
            p.held_by(Memory::Segment(0)),
            vec![Range { start: 0, end: 16 }],
            "contiguous in both: one range"
        );
        p.assign(16..20, 0, 100);
        assert_eq!(
            p.held_by(Memory::Segment(0)),
            [0..16, 16..20],
            "not contiguous in the segment"
        );
        // Move 4..6 to segment 1.
        p.assign(4..6, 1, 32);
        assert_eq!(p.held_by(Memory::Segment(0)), [0..4, 6..16, 16..20]);
        assert_eq!(p.held_by(Memory::Segment(1)), vec![Range { start: 4, end: 6 }]);
        assert_eq!(p.home(5), Some((1, 33, 6)));
        assert_eq!(p.home(6), Some((0, 6, 16)));
        assert_eq!(p.home(17), Some((0, 101, 20)));
        assert_eq!(p.home(20), None);
        // And back: merged again.
        p.assign(4..6, 0, 4);
        assert_eq!(p.held_by(Memory::Segment(0)), [0..16, 16..20]);
        assert!(p.held_by(Memory::Segment(1)).is_empty());
        p.check().expect("consistent");
    }

    #[test]
    fn a_range_splits_into_one_piece_per_source() {
        let mut p = Placement::new();
        p.assign(0..10, 0, 0);
        p.assign(10..20, 1, 0);
        p.assign(3..5, 2, 7);
        p.pin(8..12);
        let got: Vec<(Range<u64>, Option<Memory>, u64)> = p
            .pieces(2..24)
            .into_iter()
            .map(|x| (x.pages, x.memory, x.offset_page))
            .collect();
        assert_eq!(
            got,
            [
                (2..3, Some(Memory::Segment(0)), 2),
                (3..5, Some(Memory::Segment(2)), 7),
                (5..8, Some(Memory::Segment(0)), 5),
                (8..12, Some(Memory::Local), 0),
                (12..20, Some(Memory::Segment(1)), 2),
                (20..24, None, 0),
            ]
        );
        p.unpin(8..12);
        assert!(!p.pinned(9));
        assert_eq!(p.pieces(8..12).len(), 2);
    }

    proptest! {
        /// Whatever sequence of moves, pins and unassignments, the pieces of any range cover it
        /// exactly, each page's piece agrees with a page-by-page model, and the per-segment maps
        /// agree with the index.
        #[test]
        fn pieces_agree_with_a_page_model(ops in proptest::collection::vec((0u8..4, 0u64..64, 1u64..16, 0u32..3, 0u64..256), 1..40),
                                          q in (0u64..64, 1u64..64)) {
            let mut p = Placement::new();
            let mut model: Vec<(Option<(u32, u64)>, bool)> = vec![(None, false); 80];
            for (op, start, len, seg, off) in ops {
                let r = start..(start + len).min(80);
                match op {
                    0 => {
                        p.assign(r.clone(), seg, off);
                        for (i, pg) in r.clone().enumerate() {
                            model[pg as usize].0 = Some((seg, off + i as u64));
                        }
                    }
                    1 => {
                        p.unassign(r.clone());
                        for pg in r.clone() { model[pg as usize].0 = None; }
                    }
                    2 => { p.pin(r.clone()); for pg in r.clone() { model[pg as usize].1 = true; } }
                    _ => { p.unpin(r.clone()); for pg in r.clone() { model[pg as usize].1 = false; } }
                }
                prop_assert!(p.check().is_ok(), "{:?}", p.check());
            }
            let range = q.0..(q.0 + q.1).min(80);
            let pieces = p.pieces(range.clone());
            let mut at = range.start;
            for piece in &pieces {
                prop_assert_eq!(piece.pages.start, at);
                prop_assert!(piece.pages.end > piece.pages.start);
                for (i, pg) in piece.pages.clone().enumerate() {
                    let (home, pinned) = model[pg as usize];
                    match piece.memory {
                        Some(Memory::Local) => prop_assert!(pinned),
                        Some(Memory::Segment(s)) => {
                            prop_assert!(!pinned);
                            prop_assert_eq!(home, Some((s, piece.offset_page + i as u64)));
                        }
                        None => prop_assert!(!pinned && home.is_none()),
                    }
                }
                at = piece.pages.end;
            }
            prop_assert_eq!(at, range.end);
        }
    }
}
