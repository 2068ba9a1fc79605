//! The rackmem runtime: remote memory inside an unmodified process.
//!
//! A program started with `librackmem.so` preloaded gets a *window*: a reserved range of virtual
//! addresses registered with userfaultfd. Large allocations are carved from it. Pages appear on
//! first touch: a page never written is installed as zeros locally; a page whose contents live on
//! a memory brick is fetched over a link. Only a *local buffer* of pages (a byte budget or a
//! percentage of the footprint) stays resident; beyond it, pages are evicted: moved out of the
//! window atomically with `UFFDIO_MOVE`, written back to their brick if dirty, and released.
//!
//! Data flow of a fault: kernel → `handler.rs` (reads the uffd) → `fault.rs` (plans a run of
//! pages with sequential prefetch, makes room by choosing victims with a
//! [`policy::EvictionPolicy`] and moving them to a staging area, fetches, installs with
//! `UFFDIO_COPY` or `UFFDIO_MOVE`). Page states and their accounting are the kernel-free
//! `rackmem-pager` core's. Staged victims go to the write-back thread (`writeback.rs`), which writes back the dirty ones and frees
//! the staging slots. No write is ever lost: a page leaves the window atomically, and a victim
//! is dirty exactly when its contents differ from the checksum taken when it was installed.
//!
//! What this crate is not: it knows no C ABI (that is `rackmem-preload`), no REST, no policy of
//! which brick to use beyond the list it is given.

pub mod agent;
pub mod calibrate;
pub mod config;
mod error;
mod evacuate;
mod fault;
mod fork;
mod fork_hot;
mod grow;
mod handler;
mod huge;
mod inner;
mod load;
pub mod migrate;
mod outrun;
mod placement;
mod populate;
mod process;
mod ratelimit;
mod readahead;
mod recycle;
mod report;
pub mod run_budget;
pub mod segment;
pub mod size;
mod start;
pub mod stats;
pub mod sys;
mod watchdog;
mod window;
mod writeback;

pub use error::RuntimeError;
pub use fork::{fork_child, fork_parent, fork_prepare};
pub(crate) use inner::{Inner, Job, Victim};
pub use placement::program_mask;
pub use process::{
    global, in_window, is_runtime_thread, note_shared_local, set_global, shared_local_bytes, spawning_runtime_thread,
    window_start, CallGuard,
};
pub use rackmem_pager::{policy, prefetch, regions};
pub use window::Runtime;

/// The page size the runtime works in (userfaultfd on anonymous memory, no huge pages).
pub const PAGE_SIZE: usize = 4096;
const PAGE: u64 = PAGE_SIZE as u64;
/// The local buffer never shrinks below this many pages, whatever the percentage says.
const MIN_BUDGET_PAGES: u64 = 32;
/// Staging slots bound the pages in flight to the write-back thread: enough for several
/// eviction batches, small next to any budget worth having.
const STAGING_SLOTS: usize = 1024;
/// Default window with an agent: address space only; memory is attached as it is used.
const DEFAULT_AGENT_WINDOW: u64 = 64 << 30;
/// Largest default window per brick.
const DEFAULT_SEGMENT_CAP: u64 = 16 << 30;
/// Default window per brick as a fraction of its pool, leaving room for other processes and
/// for the copy-on-write clones forked children get.
const DEFAULT_SEGMENT_DIVISOR: u64 = 4;
