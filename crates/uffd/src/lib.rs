//! A small safe wrapper over Linux userfaultfd, for the rackmem runtime's fault handler.
//!
//! What it is for: opening a userfaultfd *without* `UFFD_USER_MODE_ONLY` (so that system calls
//! such as `read(2)` into missing pages are served, not failed with EFAULT), negotiating features
//! ([`Features`]: `MOVE`, `POISON`, events), registering ranges ([`RegisterMode`]), resolving
//! faults (`COPY` with and without write-protect, `ZEROPAGE`, `WAKE`, `WRITEPROTECT`, `MOVE`,
//! `POISON`), and reading fault and event messages ([`Event`]). Its errors ([`UffdError`]) keep
//! the partial progress of multi-page requests, which the caller must act on.
//!
//! What it is not: the memory a userfaultfd works on, and every other system call, are
//! `rackmem-sys` ([`rackmem_sys::Mapping`], `madvise`, shared memory, doorbells); this crate
//! builds on it. It knows nothing of bricks, windows, segments or policies, starts no thread and
//! keeps no state beyond the file descriptor. Who reads messages, and when, is the caller's
//! choice. Only a process that serves page faults needs it: a brick or a link never does.
//!
//! # Concurrency
//! [`Uffd`] is `Send + Sync`: every method is one system call (or a loop of them) on a shared
//! descriptor, and the kernel serializes what must be serialized. Several threads may resolve
//! faults on one [`Uffd`] at once; two threads reading messages each get different messages.
//!
//! # What "safe" means here
//! The fault-resolving calls take raw addresses. They never create Rust references to the memory
//! they touch, but they do change it (`MOVE` takes pages away, `POISON` makes them fatal to
//! touch). Use them only on ranges that this process set aside for userfaultfd (a
//! [`rackmem_sys::Mapping`]) and that no Rust reference points into; pointing them at the heap
//! or a stack would break the aliasing guarantees of the code that owns that memory.

mod error;
mod event;
mod features;
mod ioctl;
mod uffd;

pub use error::UffdError;
pub use event::Event;
pub use features::Features;
pub use uffd::{CopyMode, MoveMode, OpenOptions, RegisterMode, Uffd};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uffd_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Uffd>();
    }
}
