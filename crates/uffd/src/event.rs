//! The messages a userfaultfd delivers (faults and address-space events) and their decoding.

use linux_raw_sys::general as sys;
use rackmem_sys::PAGE_SIZE;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A message read from a userfaultfd.
#[derive(Debug)]
pub enum Event {
    /// A thread faulted on a registered page and sleeps until it is resolved and woken.
    Pagefault {
        /// Page-aligned faulting address (aligned here even with `EXACT_ADDRESS`).
        addr: usize,
        /// The access was a write.
        write: bool,
        /// A write-protect fault (never raised with `WP_ASYNC`).
        wp: bool,
        /// A minor fault.
        minor: bool,
        /// The faulting thread's id (with `THREAD_ID`), else 0.
        thread_id: u32,
    },
    /// A fork created a child userfaultfd (with `EVENT_FORK`); the child's registered ranges
    /// fault to it. The fork waits until this message is read.
    Fork {
        /// The child's userfaultfd, owned by the reader (closing it unregisters the child).
        child: OwnedFd,
    },
    /// `mremap` moved a registered range (with `EVENT_REMAP`).
    Remap {
        /// Old start.
        from: usize,
        /// New start.
        to: usize,
        /// Length.
        len: usize,
    },
    /// `madvise(MADV_DONTNEED/REMOVE)` is about to drop `[start, end)` (with `EVENT_REMOVE`);
    /// the caller of madvise waits until this message is read.
    Remove {
        /// Start.
        start: usize,
        /// End (exclusive).
        end: usize,
    },
    /// `munmap` of `[start, end)` (with `EVENT_UNMAP`).
    Unmap {
        /// Start.
        start: usize,
        /// End (exclusive).
        end: usize,
    },
    /// A message this wrapper does not know.
    Unknown {
        /// The `UFFD_EVENT_*` code.
        event: u8,
    },
}

/// `sizeof(struct uffd_msg)`: an 8-byte header (event code first), then a 24-byte union.
pub(crate) const MSG_SIZE: usize = 32;

fn u64_at(m: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&m[at..at + 8]);
    u64::from_ne_bytes(b)
}

fn u32_at(m: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&m[at..at + 4]);
    u32::from_ne_bytes(b)
}

/// Decodes one `struct uffd_msg` (exactly [`MSG_SIZE`] bytes).
pub(crate) fn parse_msg(m: &[u8]) -> Event {
    match u32::from(m[0]) {
        sys::UFFD_EVENT_PAGEFAULT => {
            let flags = u64_at(m, 8);
            Event::Pagefault {
                addr: (u64_at(m, 16) as usize) & !(PAGE_SIZE - 1),
                write: flags & u64::from(sys::UFFD_PAGEFAULT_FLAG_WRITE) != 0,
                wp: flags & u64::from(sys::UFFD_PAGEFAULT_FLAG_WP) != 0,
                minor: flags & u64::from(sys::UFFD_PAGEFAULT_FLAG_MINOR) != 0,
                thread_id: u32_at(m, 24),
            }
        }
        sys::UFFD_EVENT_FORK => {
            // SAFETY: the kernel installed this descriptor in our table when the message was
            // read, and it is ours alone: no other message names it.
            let child = unsafe { OwnedFd::from_raw_fd(u32_at(m, 8) as RawFd) };
            Event::Fork { child }
        }
        sys::UFFD_EVENT_REMAP => Event::Remap {
            from: u64_at(m, 8) as usize,
            to: u64_at(m, 16) as usize,
            len: u64_at(m, 24) as usize,
        },
        sys::UFFD_EVENT_REMOVE => Event::Remove {
            start: u64_at(m, 8) as usize,
            end: u64_at(m, 16) as usize,
        },
        sys::UFFD_EVENT_UNMAP => Event::Unmap {
            start: u64_at(m, 8) as usize,
            end: u64_at(m, 16) as usize,
        },
        _ => Event::Unknown { event: m[0] },
    }
}

const _: () = assert!(std::mem::size_of::<sys::uffd_msg>() == MSG_SIZE);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_decode() {
        let mut m = [0u8; MSG_SIZE];
        m[0] = sys::UFFD_EVENT_PAGEFAULT as u8;
        m[8..16].copy_from_slice(&u64::from(sys::UFFD_PAGEFAULT_FLAG_WRITE).to_ne_bytes());
        m[16..24].copy_from_slice(&0x7000_1234u64.to_ne_bytes());
        m[24..28].copy_from_slice(&77u32.to_ne_bytes());
        match parse_msg(&m) {
            Event::Pagefault {
                addr,
                write,
                wp,
                minor,
                thread_id,
            } => assert_eq!(
                (addr, write, wp, minor, thread_id),
                (0x7000_1000, true, false, false, 77)
            ),
            e => panic!("{e:?}"),
        }
        m[0] = sys::UFFD_EVENT_REMAP as u8;
        assert!(matches!(
            parse_msg(&m),
            Event::Remap {
                from: 0x1,
                to: 0x7000_1234,
                len: 77
            }
        ));
        m[0] = 0x99;
        assert!(matches!(parse_msg(&m), Event::Unknown { event: 0x99 }));
    }
}
