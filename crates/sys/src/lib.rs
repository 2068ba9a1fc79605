//! The raw system calls rackmem needs outside userfaultfd, each behind a small safe wrapper
//! whose `unsafe` blocks say why they are sound, so that the crates above need none for these
//! calls.
//!
//! What it is for:
//! - memory mappings this process owns ([`Mapping`]) and the calls on them: `madvise`
//!   ([`madvise_dontneed`], [`madvise_dontfork`], [`try_break_cow`]), [`mprotect`],
//!   [`move_mapping`], [`remap_anonymous`], and copies that stay sound while other threads or
//!   processes write the same memory;
//! - the shared memory a brick hands to nodes on its own host: a sealed `memfd` holding one
//!   segment ([`SharedMemory`]) and the calls that carry its descriptor over a Unix socket
//!   ([`send_with_fd`], [`recv_with_fds`]);
//! - waiting: a [`Doorbell`] (an `eventfd`) that lets a thread block on a descriptor without a
//!   timeout yet be woken by another ([`wait_readable`]), and [`poll_readable`];
//! - processes, threads and signals ([`process`]): leaving at once, descriptors inherited across
//!   `fork`, SIGPIPE masks, sending signals, the CPUs a thread may run on;
//! - what a server needs of its sockets and process: [`set_listen_backlog`],
//!   [`raise_open_files_limit`], and the kernel's word on who is at the other end of a Unix
//!   socket ([`peer_credentials`]).
//!
//! What it is not: it knows nothing of userfaultfd (that is `rackmem-uffd`, which builds on this
//! crate), of bricks, links, windows or segments, starts no thread and keeps no state beyond the
//! descriptors and mappings it owns. A brick and a link use this crate and never need a
//! userfaultfd.
//!
//! Errors: the memory calls return [`SysError`], naming the call and the range; the descriptor
//! and socket helpers return [`std::io::Error`], as the standard library's own socket calls do.
//!
//! # What "safe" means here
//! The memory calls that take raw addresses ([`madvise_dontneed`], [`mprotect`],
//! [`move_mapping`], [`remap_anonymous`]) never create Rust references to the memory they
//! touch, but they do change it, so they are `unsafe fn`s: the caller promises (their
//! `# Safety` sections) to use them only on ranges this process set aside (a [`Mapping`], a
//! window) that no Rust reference points into; pointing them at the heap or a stack would
//! break the aliasing guarantees of the code that owns that memory.
//!
//! Memory calls go through the raw system calls, never the C library's wrappers: this crate runs
//! inside `librackmem.so`, which interposes `mmap`, `munmap` and `madvise` itself.

mod bell;
mod error;
mod fdpass;
mod mem;
mod peer;
mod poll;
pub mod process;
mod racy;
mod shared;
mod socket;

pub use bell::Doorbell;
pub use error::SysError;
pub use fdpass::{recv_with_fds, send_with_fd};
pub use mem::{
    anon_huge_bytes, break_cow, madvise_dofork, madvise_dontfork, madvise_dontneed, madvise_hugepage,
    madvise_populate_read, madvise_populate_write, move_mapping, mprotect, page_entry, remap_anonymous, thp_mode,
    try_break_cow, Mapping, PageEntry, ThpMode, HUGE_PAGE_SIZE, PAGE_SIZE,
};
pub use peer::PrefixLen;
pub use poll::{poll_readable, wait_readable, Woken};
pub use shared::SharedMemory;
pub use socket::{
    peer_closed, peer_credentials, raise_open_files_limit, send_vectored, set_listen_backlog, NoSignal, PeerCredentials,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_of_memory_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Mapping>();
        check::<SharedMemory>();
        check::<Doorbell>();
    }

    #[test]
    fn refused_arguments_name_the_call_and_read_as_einval() {
        let e = Mapping::reserve(0, PAGE_SIZE).expect_err("an empty reservation");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        assert_eq!(e.to_string(), "mmap at 0x0+0x0: an empty reservation");
        let e = Mapping::reserve(PAGE_SIZE, 3 * PAGE_SIZE).expect_err("a bad alignment");
        assert!(matches!(e, SysError::Invalid { op: "mmap", .. }), "{e:?}");
    }
}
