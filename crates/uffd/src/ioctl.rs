//! The ioctl request numbers of userfaultfd and the one way this crate issues them.

use linux_raw_sys::general as sys;
use std::os::fd::RawFd;

/// `_IOC(dir, type, nr, size)` as the kernel encodes it on x86_64 and aarch64.
const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (ty << 8) | nr
}
/// `_IOWR(type, nr, size)`.
const fn iowr(ty: u32, nr: u32, size: usize) -> u32 {
    ioc(3, ty, nr, size)
}

const UFFDIO: u32 = 0xAA;
pub(crate) const UFFDIO_API: u32 = linux_raw_sys::ioctl::UFFDIO_API;
pub(crate) const UFFDIO_REGISTER: u32 = linux_raw_sys::ioctl::UFFDIO_REGISTER;
pub(crate) const UFFDIO_UNREGISTER: u32 = linux_raw_sys::ioctl::UFFDIO_UNREGISTER;
pub(crate) const UFFDIO_WAKE: u32 = linux_raw_sys::ioctl::UFFDIO_WAKE;
pub(crate) const UFFDIO_COPY: u32 = linux_raw_sys::ioctl::UFFDIO_COPY;
pub(crate) const UFFDIO_ZEROPAGE: u32 = linux_raw_sys::ioctl::UFFDIO_ZEROPAGE;
pub(crate) const UFFDIO_WRITEPROTECT: u32 = linux_raw_sys::ioctl::UFFDIO_WRITEPROTECT;
// linux-raw-sys 0.12 has the structs but not these request numbers: built by hand.
pub(crate) const UFFDIO_MOVE: u32 = iowr(UFFDIO, 0x05, std::mem::size_of::<sys::uffdio_move>());
pub(crate) const UFFDIO_POISON: u32 = iowr(UFFDIO, 0x08, std::mem::size_of::<sys::uffdio_poison>());
/// `_IO(0xAA, 0x00)` on `/dev/userfaultfd`.
pub(crate) const USERFAULTFD_IOC_NEW: u32 = ioc(0, UFFDIO, 0x00, 0);
pub(crate) const UFFD_API: u64 = 0xAA;
// Mode bits linux-raw-sys 0.12 lacks (<linux/userfaultfd.h>).
pub(crate) const UFFDIO_WRITEPROTECT_MODE_WP: u32 = 1 << 0;
pub(crate) const UFFDIO_WRITEPROTECT_MODE_DONTWAKE: u32 = 1 << 1;
pub(crate) const UFFDIO_MOVE_MODE_DONTWAKE: u32 = 1 << 0;
pub(crate) const UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES: u32 = 1 << 1;
pub(crate) const UFFDIO_POISON_MODE_DONTWAKE: u32 = 1 << 0;

// The hand-built encoder must agree with the request numbers linux-raw-sys ships.
const _: () = assert!(iowr(UFFDIO, 0x03, std::mem::size_of::<sys::uffdio_copy>()) == UFFDIO_COPY);

/// One ioctl whose argument is a pointer to `T`.
///
/// # Safety
/// `req` must be an ioctl that reads and writes at most one `T` through its argument.
pub(crate) unsafe fn ioctl_ptr<T>(fd: RawFd, req: u32, arg: &mut T) -> libc::c_int {
    // SAFETY: per this function's contract the kernel accesses at most `size_of::<T>()` bytes
    // of `arg`, which is a valid, exclusively borrowed `T`.
    unsafe { libc::ioctl(fd, req as libc::Ioctl, arg as *mut T) }
}

/// The `uffdio_range` of `[start, start + len)`.
pub(crate) fn range(start: usize, len: usize) -> sys::uffdio_range {
    sys::uffdio_range {
        start: start as u64,
        len: len as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_numbers_match_the_uapi_headers() {
        // Values from <linux/userfaultfd.h> of Linux 6.8.
        assert_eq!(UFFDIO_MOVE, 0xc028_aa05);
        assert_eq!(UFFDIO_POISON, 0xc020_aa08);
        assert_eq!(USERFAULTFD_IOC_NEW, 0xaa00);
    }
}
