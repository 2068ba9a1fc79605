//! The segment table: which brick, link and remote offset back each page of the window.
//!
//! REMAP (seed 000, section III) keeps a Segment Table from local ranges to remote offsets and
//! link ids; this is its software form. The window is the concatenation of segments, one per
//! brick in the order given; a lookup is a binary search over a handful of entries.

use rackmem_proto::Grant;

/// One segment: a window range backed by a range of one brick's pool.
#[derive(Debug, Clone)]
pub struct SegmentEntry {
    /// First window page backed by this segment.
    pub first_page: u64,
    /// Pages in the segment.
    pub pages: u64,
    /// Index of the brick (and of its links) in the runtime's brick list.
    pub brick: usize,
    /// The grant the brick issued for the segment (offsets in requests are relative to it).
    pub grant: Grant,
}

/// Window page → (brick, offset inside the segment).
#[derive(Debug, Clone, Default)]
pub struct SegmentTable {
    entries: Vec<SegmentEntry>,
}

impl SegmentTable {
    /// Appends a segment right after the last one; returns its first window page.
    pub fn push(&mut self, brick: usize, pages: u64, grant: Grant) -> u64 {
        let first_page = self.total_pages();
        self.entries.push(SegmentEntry {
            first_page,
            pages,
            brick,
            grant,
        });
        first_page
    }

    /// Pages covered by all segments.
    pub fn total_pages(&self) -> u64 {
        self.entries.last().map_or(0, |e| e.first_page + e.pages)
    }

    /// The segments in window order.
    pub fn entries(&self) -> &[SegmentEntry] {
        &self.entries
    }

    /// Replaces the grants (after a fork, the child's segments are clones with new grants).
    pub fn set_grant(&mut self, index: usize, grant: Grant) {
        if let Some(e) = self.entries.get_mut(index) {
            e.grant = grant;
        }
    }

    /// The brick and byte offset within its segment that back window page `page`.
    pub fn lookup(&self, page: u64) -> Option<(usize, u64)> {
        let i = self.entries.partition_point(|e| e.first_page + e.pages <= page);
        let e = self.entries.get(i)?;
        (page >= e.first_page).then(|| (e.brick, (page - e.first_page) * crate::PAGE_SIZE as u64))
    }
}
