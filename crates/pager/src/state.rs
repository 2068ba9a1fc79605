//! A window page's state, and the only ways it changes.
//!
//! Every page of the window is in one of four places ([`Location`]); beside that, one flag says
//! whether its brick holds its contents as of its install or last write-back (*brick-valid*). The
//! state is one byte per page (a 64 GiB window has 16 M pages), kept in a [`PageTable`] whose
//! only mutators are the transitions below. Each checks its precondition with an always-on
//! assertion: a page in the wrong state is a bug that would otherwise surface, much later, as a
//! program reading stale data.
//!
//! ```text
//!            claim                    begin_eviction
//!   Empty ──────────▶ Resident ─────────────────────▶ Evicting
//!   Remote ─────────▶    │ ▲                              │
//!                        │ └─ mark_brick_valid            │ finish_eviction
//!                        │                                ▼
//!                        │                        Remote │ Empty
//!   any ── release ──▶ Empty
//! ```

/// Where a window page's contents are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// Never written, or released: the next touch installs zeros.
    Empty,
    /// Its contents live on its brick (or, for a same-filled page, as one word in the core).
    Remote,
    /// Installed in the window; counts against the local buffer.
    Resident,
    /// Moved out of the window into a staging slot; its write-back is in progress.
    Evicting,
}

const LOC_MASK: u8 = 3;
const BRICK_VALID: u8 = 4;

/// One page's state: its [`Location`] and its brick-valid flag, in one byte.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct PageState(u8);

impl PageState {
    /// A page never touched.
    pub const EMPTY: PageState = PageState(0);

    fn new(loc: Location, brick_valid: bool) -> PageState {
        let l = match loc {
            Location::Empty => 0,
            Location::Remote => 1,
            Location::Resident => 2,
            Location::Evicting => 3,
        };
        PageState(l | if brick_valid { BRICK_VALID } else { 0 })
    }

    /// Where the page is.
    pub fn location(self) -> Location {
        match self.0 & LOC_MASK {
            0 => Location::Empty,
            1 => Location::Remote,
            2 => Location::Resident,
            _ => Location::Evicting,
        }
    }

    /// The brick holds this page's contents as of its install or last write-back, so a clean
    /// eviction needs no write and a dirty one overwrites memory the brick already has.
    pub fn brick_valid(self) -> bool {
        self.0 & BRICK_VALID != 0
    }

    /// True for a page a fault may install (nothing of it is in the window or on its way out).
    pub fn installable(self) -> bool {
        matches!(self.location(), Location::Empty | Location::Remote)
    }
}

impl std::fmt::Debug for PageState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.location())?;
        if self.brick_valid() {
            f.write_str("+brick")?;
        }
        Ok(())
    }
}

/// How an eviction ended, as the write-back found the staged page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evicted {
    /// The page was not there to move out (the program released it; its REMOVE event, still
    /// queued, makes it empty): nothing was sent, and it is left as a clean eviction would.
    Gone,
    /// Its contents equal what the brick (or the zero page it was installed as) holds.
    Clean,
    /// Its contents were written to the brick.
    Written,
    /// Every 8-byte word of it is this value: kept in the core, not sent.
    Filled(u64),
}

/// One state per window page. The transitions are the only mutators.
///
/// Only the pages up to the highest one ever changed are stored (the rest are empty): the
/// window is sized for the largest program (16 GiB, 4 M pages) and a program's blocks are
/// placed first-fit from its start, so a table of the window's length would cost every process
/// and every forked child megabytes of writes for pages it never uses.
#[derive(Debug, Clone, Default)]
pub struct PageTable {
    states: Vec<PageState>,
    pages: u64,
}

impl PageTable {
    /// `pages` pages, all empty.
    pub fn new(pages: u64) -> PageTable {
        PageTable {
            states: Vec::new(),
            pages,
        }
    }

    /// Pages in the table.
    pub fn len(&self) -> u64 {
        self.pages
    }

    /// True for a table of no pages.
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }

    /// The state of `page` (pages past the end read as empty).
    pub fn get(&self, page: u64) -> PageState {
        self.states.get(page as usize).copied().unwrap_or(PageState::EMPTY)
    }

    /// Where `page` is.
    pub fn location(&self, page: u64) -> Location {
        self.get(page).location()
    }

    /// Every page's state, in page order, up to the highest page ever changed (the pages past
    /// it are empty).
    pub fn iter(&self) -> impl Iterator<Item = PageState> + '_ {
        self.states.iter().copied()
    }

    fn slot(&mut self, page: u64) -> &mut PageState {
        if page >= self.pages {
            panic!("window page {page} is outside the page table ({} pages)", self.pages);
        }
        let at = page as usize;
        if at >= self.states.len() {
            // Doubling: a program that grows page by page pays amortized O(1) per page.
            let len = (at + 1).max(self.states.len() * 2).min(self.pages as usize);
            self.states.resize(len, PageState::EMPTY);
        }
        &mut self.states[at]
    }

    /// A fault claims `page` for install: Empty or Remote → Resident. `stale_brick`: the brick's
    /// copy is not the page's contents (a same-filled page, held as a word), so the page is not
    /// brick-valid once installed. Returns the state it had.
    pub fn claim(&mut self, page: u64, stale_brick: bool) -> PageState {
        let s = self.slot(page);
        let old = *s;
        assert!(old.installable(), "claim of window page {page} in state {old:?}");
        *s = PageState::new(Location::Resident, old.brick_valid() && !stale_brick);
        old
    }

    /// The page was chosen as a victim: Resident → Evicting. Returns the state it had.
    pub fn begin_eviction(&mut self, page: u64) -> PageState {
        let s = self.slot(page);
        let old = *s;
        assert!(
            old.location() == Location::Resident,
            "eviction of window page {page} in state {old:?}"
        );
        *s = PageState::new(Location::Evicting, old.brick_valid());
        old
    }

    /// The write-back of an evicting page ended: Evicting → Remote or Empty. A page whose
    /// contents are on the brick (written now, or clean and brick-valid) is Remote; a filled page
    /// is Remote (its word is kept by the caller) unless it is zeros the brick holds nothing for;
    /// a clean page the brick holds nothing for is still the zero page it was installed as.
    pub fn finish_eviction(&mut self, page: u64, how: Evicted) -> Location {
        let s = self.slot(page);
        let old = *s;
        assert!(
            old.location() == Location::Evicting,
            "end of eviction of window page {page} in state {old:?}"
        );
        let bv = old.brick_valid();
        *s = match how {
            Evicted::Filled(0) if !bv => PageState::EMPTY,
            Evicted::Filled(_) => PageState::new(Location::Remote, bv),
            Evicted::Written => PageState::new(Location::Remote, true),
            Evicted::Clean | Evicted::Gone if bv => PageState::new(Location::Remote, true),
            Evicted::Clean | Evicted::Gone => PageState::EMPTY,
        };
        s.location()
    }

    /// A resident page was written to its brick in place (before a fork): it stays resident and
    /// becomes brick-valid.
    pub fn mark_brick_valid(&mut self, page: u64) {
        let s = self.slot(page);
        let old = *s;
        assert!(
            old.location() == Location::Resident,
            "write-back in place of window page {page} in state {old:?}"
        );
        *s = PageState::new(Location::Resident, true);
    }

    /// The brick's copy of a resident page can no longer be told equal to it (a forked child
    /// without its parent's way of comparing): the page stays resident, not brick-valid.
    pub fn distrust_brick(&mut self, page: u64) {
        let s = self.slot(page);
        if s.location() == Location::Resident {
            *s = PageState::new(Location::Resident, false);
        }
    }

    /// The program released the page (free, munmap, MADV_DONTNEED): any state → Empty. Returns
    /// the state it had.
    pub fn release(&mut self, page: u64) -> PageState {
        std::mem::take(self.slot(page))
    }

    /// The table a forked child starts from, after the parent wrote back every dirty page: what
    /// the brick holds (brick-valid pages) is remote, a resident page the brick holds nothing
    /// for is still a zero page, and the rest is as in the parent.
    /// O(pages stored): the child's table stops where the parent's does.
    pub fn forked(&self) -> PageTable {
        let states = self
            .states
            .iter()
            .map(|&s| match s.location() {
                Location::Resident | Location::Evicting if s.brick_valid() => PageState::new(Location::Remote, true),
                Location::Resident | Location::Evicting => PageState::EMPTY,
                _ => s,
            })
            .collect();
        PageTable {
            states,
            pages: self.pages,
        }
    }
}

impl PageTable {
    /// The table a forked child starts from when it inherits the parent's window (the kernel
    /// keeps the parent's resident pages mapped in the child, copy-on-write): every state as in
    /// the parent, brick-valid flags included (the child's clone of each segment holds what the
    /// parent's held at the fork). No page may be evicting (the fork drains write-back first).
    pub fn forked_keeping_resident(&self) -> PageTable {
        if let Some(p) = self.states.iter().position(|s| s.location() == Location::Evicting) {
            panic!("fork with window page {p} evicting");
        }
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_goes_round_and_keeps_its_brick_flag() {
        let mut t = PageTable::new(4);
        assert_eq!(t.claim(1, false), PageState::EMPTY);
        assert_eq!(t.location(1), Location::Resident);
        t.begin_eviction(1);
        assert_eq!(t.finish_eviction(1, Evicted::Written), Location::Remote);
        assert!(t.get(1).brick_valid());
        t.claim(1, false);
        assert!(t.get(1).brick_valid(), "a fetched page is what the brick holds");
        t.begin_eviction(1);
        assert_eq!(t.finish_eviction(1, Evicted::Clean), Location::Remote);
        t.claim(1, true);
        assert!(!t.get(1).brick_valid(), "a same-filled page's brick copy is stale");
        t.begin_eviction(1);
        assert_eq!(t.finish_eviction(1, Evicted::Filled(0)), Location::Empty);
        assert_eq!(t.release(1), PageState::EMPTY);
    }

    #[test]
    fn the_table_stores_pages_up_to_the_highest_changed_and_a_fork_copies_only_those() {
        let window = 4 << 20; // 16 GiB of pages
        let mut t = PageTable::new(window);
        assert_eq!((t.len(), t.iter().count()), (window, 0));
        t.claim(3, false);
        t.claim(1000, false);
        t.begin_eviction(1000);
        t.finish_eviction(1000, Evicted::Written);
        let stored = t.iter().count();
        assert!((1001..=2002).contains(&stored), "{stored} states stored for page 1000");
        assert_eq!(t.location(window - 1), Location::Empty);
        let f = t.forked();
        assert_eq!((f.len(), f.iter().count()), (window, stored));
        assert_eq!(f.location(3), Location::Empty, "a zero page the brick never held");
        assert_eq!(f.location(1000), Location::Remote);
        assert!(f.get(1000).brick_valid());
        let mut f = f;
        f.claim(window - 1, false);
        assert_eq!(f.location(window - 1), Location::Resident);
    }

    #[test]
    #[should_panic(expected = "outside the page table")]
    fn a_page_past_the_window_is_refused() {
        PageTable::new(8).claim(8, false);
    }

    #[test]
    fn a_clean_zero_page_the_brick_never_held_is_empty_again() {
        let mut t = PageTable::new(2);
        t.claim(0, false);
        t.begin_eviction(0);
        assert_eq!(t.finish_eviction(0, Evicted::Clean), Location::Empty);
        t.claim(0, false);
        t.begin_eviction(0);
        assert_eq!(t.finish_eviction(0, Evicted::Filled(7)), Location::Remote);
        assert!(!t.get(0).brick_valid());
    }

    #[test]
    #[should_panic(expected = "claim of window page 0 in state Resident")]
    fn claiming_a_resident_page_is_a_bug() {
        let mut t = PageTable::new(1);
        t.claim(0, false);
        t.claim(0, false);
    }

    #[test]
    #[should_panic(expected = "eviction of window page 0 in state Remote")]
    fn evicting_a_remote_page_is_a_bug() {
        let mut t = PageTable::new(1);
        t.claim(0, false);
        t.begin_eviction(0);
        t.finish_eviction(0, Evicted::Written);
        t.begin_eviction(0);
    }

    #[test]
    fn a_forked_child_sees_what_the_brick_holds() {
        let mut t = PageTable::new(4);
        t.claim(0, false); // resident, never on the brick: a zero page
        t.claim(1, false);
        t.mark_brick_valid(1); // written back before the fork
        t.claim(2, false);
        t.begin_eviction(2);
        t.finish_eviction(2, Evicted::Written);
        let c = t.forked();
        assert_eq!(c.location(0), Location::Empty);
        assert_eq!(c.get(1), PageState::new(Location::Remote, true));
        assert_eq!(c.get(2), PageState::new(Location::Remote, true));
        assert_eq!(c.location(3), Location::Empty);
    }
}
