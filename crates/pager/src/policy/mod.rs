//! Eviction policies for the local buffer: which resident pages leave when it is full.
//!
//! What a policy is told, and by whom: the core ([`crate::Core`]) calls [`EvictionPolicy::inserted`]
//! for every page a fault claims, [`EvictionPolicy::victims`] when it must make room (after
//! [`EvictionPolicy::set_capacity`] with the budget in force), and the runtime calls
//! [`EvictionPolicy::removed`] for a resident page that stops being a candidate (released, or
//! made read-only, which `UFFDIO_MOVE` cannot move) and [`EvictionPolicy::released`] for every
//! range the program frees or `madvise`s away, so that a policy forgets what it remembered of
//! those pages. All calls come under the runtime's core lock, one at a time.
//!
//! What a policy is not told: userfaultfd reports misses only. Nothing reports accesses to
//! resident pages (no accessed bit reaches user space without page-idle tracking, which needs
//! PFNs and root), so a policy sees installs and evictions, never hits. Whatever it learns about
//! which pages are hot, it learns from pages that come back after being evicted.
//!
//! The policies:
//! - [`Fifo`] evicts in the order pages came in. For sequential streams (STREAM, scans) it
//!   evicts what LRU would, and for uniform random access (GUPS) every policy is as good as
//!   random; but it evicts hot pages as readily as cold ones.
//! - [`Refault`] (the default) is a FIFO whose pages earn protection by coming back: it
//!   remembers recently evicted pages, and one that faults again soon after its eviction joins
//!   a protected part that ordinary eviction does not touch. A stream that never comes back is
//!   evicted exactly as FIFO would.
//!
//! A researcher adds a policy by implementing [`EvictionPolicy`] in a file of its own and a
//! name in [`Eviction`]; nothing in the fault handler changes.

mod fifo;
mod refault;

pub use fifo::Fifo;
pub use refault::Refault;

/// Chooses which resident pages leave the local buffer.
///
/// Pages are window page numbers. The runtime's contract: `inserted` is called only for a page
/// the policy does not hold, `removed` only for one it holds; `victims` hands pages back, after
/// which the policy no longer holds them. Memory must stay bounded by the budget (what
/// [`EvictionPolicy::set_capacity`] says), whatever the program's footprint.
pub trait EvictionPolicy: Send {
    /// `page` became resident (faulted in), or resident again as a candidate (made read-write).
    fn inserted(&mut self, page: u32);
    /// `page` is still resident but no longer a candidate, or gone without being a victim
    /// (released: [`EvictionPolicy::released`] follows).
    fn removed(&mut self, page: u32);
    /// Takes up to `n` victims out of the policy and appends them to `out`.
    fn victims(&mut self, n: usize, out: &mut Vec<u32>);
    /// Pages the policy holds.
    fn len(&self) -> usize;
    /// True when no page is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The program released `[first, first + count)` (freed, unmapped, `MADV_DONTNEED`): their
    /// contents are gone and a later fault there is a new page, not a page coming back. Called
    /// for resident and evicted pages alike, after `removed` for the resident ones.
    fn released(&mut self, _first: u32, _count: u32) {}
    /// The local buffer's budget in pages, told before each call to `victims` (it follows the
    /// program's footprint when the budget is a percentage).
    fn set_capacity(&mut self, _pages: usize) {}
    /// The program's load changed: the runtime's load control now favours another thread, so
    /// the pages proven hot so far belong in part to threads that are not being served. A policy
    /// that protects pages lets them compete again, to leave first; the pages held stay the same.
    fn demote_all(&mut self) {}
}

/// The eviction policy to use, by name (`RACKMEM_EVICTION`, `rackmem run --eviction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Eviction {
    /// [`Fifo`].
    Fifo,
    /// [`Refault`].
    #[default]
    Refault,
}

impl Eviction {
    /// Every policy, by the name that selects it.
    pub const ALL: [(&'static str, Eviction); 2] = [("fifo", Eviction::Fifo), ("refault", Eviction::Refault)];

    /// A new, empty policy of this kind.
    pub fn build(self) -> Box<dyn EvictionPolicy> {
        match self {
            Eviction::Fifo => Box::new(Fifo::default()),
            Eviction::Refault => Box::new(Refault::default()),
        }
    }

    /// The name that selects this policy.
    pub fn name(self) -> &'static str {
        Eviction::ALL.iter().find(|(_, e)| *e == self).map_or("?", |(n, _)| n)
    }
}

impl std::fmt::Display for Eviction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that selects no eviction policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction policy {0:?} (known: fifo, refault)")]
pub struct UnknownEviction(pub String);

impl std::str::FromStr for Eviction {
    type Err = UnknownEviction;
    fn from_str(s: &str) -> Result<Self, UnknownEviction> {
        let s = s.trim();
        Eviction::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(s))
            .map(|(_, e)| *e)
            .ok_or_else(|| UnknownEviction(s.to_string()))
    }
}

/// A value per window page, in an array grown to the highest page set. Policies look a page up
/// at every install and eviction; with a hash map (even one multiplication as the hash) that
/// was 5% of a scan's samples at 25% local, for FIFO alone. The array costs a word or two per
/// window page up to the highest one used: a fraction of a percent of the memory it describes.
pub(crate) struct PageMap<V> {
    slots: Vec<Option<V>>,
    len: usize,
}

impl<V> Default for PageMap<V> {
    fn default() -> Self {
        PageMap {
            slots: Vec::new(),
            len: 0,
        }
    }
}

impl<V> PageMap<V> {
    /// The value of `page`.
    pub(crate) fn get(&self, page: &u32) -> Option<&V> {
        self.slots.get(*page as usize).and_then(Option::as_ref)
    }

    /// Sets the value of `page`; returns the one it had.
    pub(crate) fn insert(&mut self, page: u32, v: V) -> Option<V> {
        let p = page as usize;
        if p >= self.slots.len() {
            self.slots.resize_with(p + 1, || None);
        }
        let old = self.slots[p].replace(v);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Takes the value of `page`.
    pub(crate) fn remove(&mut self, page: &u32) -> Option<V> {
        let old = self.slots.get_mut(*page as usize).and_then(Option::take);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Pages with a value.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests;
