//! Eviction policies for the local buffer.
//!
//! userfaultfd tells the runtime about misses only: nothing reports accesses to resident pages
//! (no accessed bit reaches user space without page-idle tracking, which needs PFNs and root).
//! A policy therefore sees installs and removals. FIFO is the policy that this information supports exactly: for the
//! sequential streams that dominate the seeds' workloads (STREAM, scans) it evicts what LRU
//! would, and for uniform random access (GUPS) every policy is equivalent to random. A
//! researcher adds a policy by implementing [`EvictionPolicy`].

mod fifo;

pub use fifo::Fifo;

/// Chooses which resident pages leave the local buffer.
pub trait EvictionPolicy: Send {
    /// `page` became resident.
    fn inserted(&mut self, page: u32);
    /// `page` is no longer resident (evicted, or released by `madvise`/`free`).
    fn removed(&mut self, page: u32);
    /// Takes up to `n` victims out of the policy and appends them to `out`.
    fn victims(&mut self, n: usize, out: &mut Vec<u32>);
    /// The program released `page` (freed or `MADV_DONTNEED`): whatever the policy remembers of
    /// its history is about other data now. Called for every released page, resident or not,
    /// after `removed` for resident ones.
    fn forgotten(&mut self, _page: u32) {}
    /// Pages the policy tracks (resident pages it may choose).
    fn len(&self) -> usize;
    /// A short name, for statistics and messages.
    fn name(&self) -> &'static str;
    /// True when no page is tracked.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
