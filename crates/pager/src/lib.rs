//! The pager core of rackmem: what happens to a window page, with no system call.
//!
//! A program's window is split into pages; each is empty, remote, resident or evicting
//! ([`state`]). The [`Core`] keeps every page's state together with what must agree with it:
//! the local buffer's count of resident pages, the checksums that tell a dirty page from a clean
//! one, the same-filled pages kept as one word, the evictions in flight and their staging
//! [`slots`], the window's address-space [`regions`], and the [`policy`] that picks victims.
//! Each event (a fault claims a run, victims are chosen, a write-back ends, the program releases
//! memory, the process forks) is one method that changes all of them at once and checks its
//! preconditions.
//!
//! The sequences that change pages live here too: the fault path ([`fault`]: plan, make room,
//! claim, fetch, install) and the write-back ([`writeback`]: examine, write, finish). They do
//! their I/O through small traits, [`fault::Backend`] (install, move out, read) and
//! [`writeback::Writer`] (write): the runtime (`rackmem-runtime`) implements them with
//! userfaultfd and links, and its fault handler and write-back thread are shells that turn
//! userfaultfd events and link completions into calls on these sequences. Because nothing here
//! knows a kernel, a test implements the same traits with maps and drives the very same
//! sequences with random interleavings, checking every page's contents after each step
//! (`tests/simulation.rs`).
//!
//! Where each window range lives (its home segment, or pinned in the local buffer) is
//! [`placement`], which migrations between memories change.
//!
//! Adding an eviction policy means implementing [`policy::EvictionPolicy`]; prefetch lives in
//! [`prefetch`], and the sample that measures how much of what it fetches is used in [`probe`].
//!
//! What this crate is not: it knows no userfaultfd, no link, no brick and no C ABI.

pub mod core;
pub mod fault;
pub mod placement;
pub mod policy;
pub mod prefetch;
pub mod probe;
pub mod prot;
pub mod regions;
pub mod slots;
pub mod state;
pub mod unit;
pub mod writeback;

pub use crate::core::{Core, Source, Victim};
pub use slots::{Slots, SpentRun};
pub use state::{Evicted, Location, PageState, PageTable};
pub use unit::{Check, Unit};
