//! Units: what the core tracks residency in. A window's unit is fixed when it starts: one 4 KiB
//! page, or a huge unit of 512 pages (2 MiB, one transparent huge page).
//!
//! A core of huge units indexes units where a core of pages indexes pages: one state, one
//! `Location`, one eviction-policy entry per unit, and a resident unit charges the local buffer
//! its whole 2 MiB. What a huge unit adds is the dirty check per 4 KiB subpage: fetching,
//! installing and evicting 2 MiB at a time is what pays (`docs/architecture.md`, "Huge pages"),
//! but a program that writes 8 bytes of a unit must not send 2 MiB back. So at install the
//! runtime takes one [`Check`] per subpage (a checksum, or the word of a same-filled subpage),
//! and at eviction [`changed_runs`] says which subpages differ from what their brick holds.

use std::ops::Range;

/// Bytes in a page.
pub const PAGE_BYTES: u64 = 4096;

/// Pages in a huge unit (a 2 MiB transparent huge page on x86-64 and arm64 with 4 KiB pages).
pub const HUGE_PAGES: u64 = 512;

/// A window's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unit {
    /// One 4 KiB page.
    #[default]
    Page,
    /// [`HUGE_PAGES`] pages, moved, fetched and evicted as one.
    Huge,
}

impl Unit {
    /// Pages in one unit.
    pub fn pages(self) -> u64 {
        match self {
            Unit::Page => 1,
            Unit::Huge => HUGE_PAGES,
        }
    }

    /// Bytes in one unit: what a resident unit charges the local buffer.
    pub fn bytes(self) -> u64 {
        self.pages() * PAGE_BYTES
    }

    /// The unit holding window page `page`.
    pub fn of_page(self, page: u64) -> u64 {
        page / self.pages()
    }

    /// The window pages of unit `unit`.
    pub fn page_range(self, unit: u64) -> Range<u64> {
        unit * self.pages()..(unit + 1) * self.pages()
    }

    /// Whole units a local buffer of `bytes` holds (at least one: a fault needs room for its
    /// own unit).
    pub fn budget_units(self, bytes: u64) -> u64 {
        (bytes / self.bytes()).max(1)
    }

    /// Units covering `pages` pages (the last one partly).
    pub fn units_for(self, pages: u64) -> u64 {
        pages.div_ceil(self.pages())
    }
}

/// What a subpage held when it was installed (or last written to its brick).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Every 8-byte word of it is this value (0: a zero page). Kept as the word itself: a
    /// subpage filled the same again compares equal without a checksum.
    Filled(u64),
    /// A checksum of its contents.
    Sum(u64),
}

impl Check {
    /// The check of `data` (one subpage), with `hash` the checksum taken of subpages that are
    /// not same-filled.
    pub fn of(data: &[u8], hash: impl Fn(&[u8]) -> u64) -> Check {
        match same_filled(data) {
            Some(w) => Check::Filled(w),
            None => Check::Sum(hash(data)),
        }
    }
}

/// The word every 8-byte word of `data` equals, if there is one (an empty or ragged slice has
/// none). The first 64 bytes are compared first: most subpages that are not same-filled differ
/// there.
pub fn same_filled(data: &[u8]) -> Option<u64> {
    if data.is_empty() || data.len() % 8 != 0 {
        return None;
    }
    let word = |c: &[u8]| {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        u64::from_ne_bytes(b)
    };
    let first = word(&data[..8]);
    let head = data.len().min(64);
    if !data[..head].chunks_exact(8).all(|c| word(c) == first) {
        return None;
    }
    data[head..].chunks_exact(8).all(|c| word(c) == first).then_some(first)
}

/// The runs of subpages whose check differs between `old` (what the brick holds; `None`: the
/// brick holds nothing valid, every subpage is sent) and `new` (the staged contents), in order,
/// as subpage ranges. Adjacent changed subpages form one run: one request each.
pub fn changed_runs(old: Option<&[Check]>, new: &[Check]) -> Vec<Range<u32>> {
    let mut runs: Vec<Range<u32>> = Vec::new();
    for (i, n) in new.iter().enumerate() {
        let changed = match old {
            Some(o) => o.get(i) != Some(n),
            None => true,
        };
        if !changed {
            continue;
        }
        let i = i as u32;
        match runs.last_mut() {
            Some(r) if r.end == i => r.end = i + 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

/// The word a whole unit is filled with, if every subpage is filled with the same one: such a
/// unit is kept in the core as a fill, as a same-filled 4 KiB page is.
pub fn unit_filled(checks: &[Check]) -> Option<u64> {
    let Some(Check::Filled(w)) = checks.first() else {
        return None;
    };
    checks.iter().all(|c| *c == Check::Filled(*w)).then_some(*w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(d: &[u8]) -> u64 {
        d.iter().fold(0xcbf2_9ce4_8422_2325u64, |a, &b| {
            (a ^ b as u64).wrapping_mul(0x100_0000_01b3)
        })
    }

    #[test]
    fn unit_arithmetic() {
        assert_eq!(Unit::Huge.bytes(), 2 << 20);
        assert_eq!(Unit::Page.bytes(), 4096);
        assert_eq!(Unit::Huge.of_page(1023), 1);
        assert_eq!(Unit::Huge.page_range(2), 1024..1536);
        // A unit charges its 2 MiB: a 5 MiB buffer holds two.
        assert_eq!(Unit::Huge.budget_units(5 << 20), 2);
        assert_eq!(Unit::Huge.budget_units(1), 1);
        assert_eq!(Unit::Page.budget_units(5 << 20), 1280);
        assert_eq!(Unit::Huge.units_for(513), 2);
    }

    #[test]
    fn checks_see_fills_and_content() {
        let zeros = vec![0u8; 4096];
        assert_eq!(Check::of(&zeros, h), Check::Filled(0));
        let ones: Vec<u8> = std::iter::repeat_n(7u64.to_ne_bytes(), 512).flatten().collect();
        assert_eq!(Check::of(&ones, h), Check::Filled(7));
        let mut late = zeros.clone();
        late[4000] = 1;
        assert_eq!(Check::of(&late, h), Check::Sum(h(&late)));
        assert_eq!(same_filled(&late[..4]), None);
    }

    #[test]
    fn only_changed_subpages_form_runs() {
        let old: Vec<Check> = (0..512).map(Check::Sum).collect();
        let mut new = old.clone();
        assert!(changed_runs(Some(&old), &new).is_empty());
        new[3] = Check::Filled(0);
        new[4] = Check::Sum(99);
        new[511] = Check::Sum(1);
        assert_eq!(changed_runs(Some(&old), &new), vec![3..5, 511..512]);
        assert_eq!(changed_runs(None, &new), vec![0..512]);
    }

    #[test]
    fn whole_unit_fill() {
        assert_eq!(unit_filled(&[Check::Filled(0); 512]), Some(0));
        let mut c = [Check::Filled(3); 512];
        assert_eq!(unit_filled(&c), Some(3));
        c[9] = Check::Filled(4);
        assert_eq!(unit_filled(&c), None);
        assert_eq!(unit_filled(&[Check::Sum(3)]), None);
    }
}
