//! A doorbell: an `eventfd` one thread rings to wake another that waits on a descriptor, so the
//! waiter can block without a timeout instead of waking now and then to look at a flag. An idle
//! program under rackmem then costs no CPU at all: no timer fires on its CPU while it computes.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An `eventfd` (non-blocking, close-on-exec). Ringing it makes it readable until cleared.
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A new, silent doorbell.
    pub fn new() -> io::Result<Doorbell> {
        // SAFETY: eventfd(2) takes no pointers; a non-negative return is a new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Doorbell { fd })
    }

    /// Rings: whoever waits on it wakes (now, or at once when it next waits).
    pub fn ring(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd. The only failure possible is
        // EAGAIN on a counter at its maximum, which is readable anyway.
        unsafe {
            libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    /// The eventfd (to close an inherited copy in a forked child).
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Silences it again (call after waking, before looking at what the ringer changed).
    pub fn clear(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our eventfd; EAGAIN (not rung) is fine.
        unsafe {
            libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
        }
    }
}

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        Doorbell::as_raw_fd(self)
    }
}
