//! Raw memory calls: reserving anonymous mappings, `madvise`, reading mapped bytes, breaking
//! copy-on-write sharing. All through system calls, not the C library (see the crate docs).

use crate::UffdError;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// The base page size userfaultfd works in here (no huge pages in the window).
pub const PAGE_SIZE: usize = 4096;

fn check(op: &'static str, addr: usize, len: usize, r: libc::c_long) -> Result<libc::c_long, UffdError> {
    if (-4095..0).contains(&r) || r == -1 {
        Err(UffdError::Os {
            op,
            addr,
            len,
            errno: io::Error::last_os_error(),
        })
    } else {
        Ok(r)
    }
}

fn sys_mmap(addr: usize, len: usize, flags: i32) -> libc::c_long {
    // SAFETY: an anonymous private mapping; with MAP_FIXED_NOREPLACE the kernel refuses to
    // replace anything already mapped, so no existing memory is affected.
    unsafe {
        libc::syscall(
            libc::SYS_mmap,
            addr,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    }
}

fn sys_munmap(addr: usize, len: usize) {
    // SAFETY: only called on ranges this module mapped and owns.
    unsafe {
        libc::syscall(libc::SYS_munmap, addr, len);
    }
}

/// An anonymous private mapping owned by this value (unmapped on drop).
#[derive(Debug)]
pub struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    /// Reserves `len` bytes (rounded up to pages) aligned to `align` (a power of two), lazily
    /// backed, with transparent huge pages off (userfaultfd resolves 4 KiB pages here).
    pub fn reserve(len: usize, align: usize) -> Result<Mapping, UffdError> {
        let len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let align = align.max(PAGE_SIZE);
        let raw = check("mmap", 0, len + align, sys_mmap(0, len + align, 0))? as usize;
        let start = raw.div_ceil(align) * align;
        if start > raw {
            sys_munmap(raw, start - raw);
        }
        let tail = raw + len + align - (start + len);
        if tail > 0 {
            sys_munmap(start + len, tail);
        }
        let m = Mapping { addr: start, len };
        m.nohugepage()?;
        Ok(m)
    }

    /// Maps `len` bytes at exactly `addr`, failing if anything is mapped there (a forked child
    /// re-creates its parent's window at the same addresses).
    pub fn reserve_at(addr: usize, len: usize) -> Result<Mapping, UffdError> {
        let r = check(
            "mmap(MAP_FIXED_NOREPLACE)",
            addr,
            len,
            sys_mmap(addr, len, libc::MAP_FIXED_NOREPLACE),
        )? as usize;
        if r != addr {
            sys_munmap(r, len);
            return Err(UffdError::Os {
                op: "mmap(MAP_FIXED_NOREPLACE)",
                addr,
                len,
                errno: io::Error::from_raw_os_error(libc::EEXIST),
            });
        }
        let m = Mapping { addr, len };
        m.nohugepage()?;
        Ok(m)
    }

    fn nohugepage(&self) -> Result<(), UffdError> {
        madvise(self.addr, self.len, libc::MADV_NOHUGEPAGE, "madvise(NOHUGEPAGE)")
    }

    /// First address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty mapping.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the mapping for the life of the process.
    pub fn leak(self) -> (usize, usize) {
        let r = (self.addr, self.len);
        std::mem::forget(self);
        r
    }

    /// Copies `out.len()` bytes at `offset` into `out`. The pages read must be present (or the
    /// mapping unregistered): reading a missing page of a userfaultfd-registered range from the
    /// thread that serves it would wait forever. Other threads may write the bytes concurrently;
    /// the copy then holds some mix of old and new bytes, which callers detect by checksum.
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset.checked_add(out.len()).is_some_and(|e| e <= self.len),
            "read outside the mapping"
        );
        // SAFETY: the source range lies inside this live mapping (checked above); it is plain
        // readable memory. Concurrent writers are other threads of the program writing raw
        // bytes; a byte-wise volatile-free copy of memory shared with C code is how every
        // userfaultfd handler reads pages, and the result is only used as bytes.
        unsafe { std::ptr::copy_nonoverlapping((self.addr + offset) as *const u8, out.as_mut_ptr(), out.len()) }
    }
}

impl Mapping {
    /// Copies `data` into the mapping at `offset` (a write access: a missing page of a
    /// registered range faults to its handler, which must be another thread).
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(
            offset.checked_add(data.len()).is_some_and(|e| e <= self.len),
            "write outside the mapping"
        );
        // SAFETY: the destination lies inside this live, writable mapping (checked above), which
        // no Rust reference aliases: its bytes are only reached through these raw copies.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (self.addr + offset) as *mut u8, data.len()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        sys_munmap(self.addr, self.len);
    }
}

fn madvise(addr: usize, len: usize, advice: i32, op: &'static str) -> Result<(), UffdError> {
    // SAFETY: madvise with advice that only drops or re-flags pages of the caller's range.
    let r = unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) };
    check(op, addr, len, r).map(|_| ())
}

/// `madvise(MADV_DONTNEED)`: drops the pages of the range (private anonymous memory then reads
/// as zeros, or faults to userfaultfd if registered).
pub fn madvise_dontneed(addr: usize, len: usize) -> Result<(), UffdError> {
    madvise(addr, len, libc::MADV_DONTNEED, "madvise(DONTNEED)")
}

/// `madvise(MADV_DONTFORK)`: a forked child does not inherit the range.
pub fn madvise_dontfork(addr: usize, len: usize) -> Result<(), UffdError> {
    madvise(addr, len, libc::MADV_DONTFORK, "madvise(DONTFORK)")
}

/// Forces a private copy of the page holding `addr` (breaking copy-on-write sharing, so that
/// `UFFDIO_MOVE` stops returning EBUSY) without changing its contents, even if other threads
/// write it at the same time: an atomic add of zero is a write access that stores what it read.
///
/// The caller promises that `addr` lies in a mapped, writable, present page of this process
/// (a resident page of the window); otherwise the access faults like any other.
pub fn break_cow(addr: usize) {
    let word = addr & !7;
    // SAFETY: per the contract above the aligned word is mapped and writable; an atomic RMW
    // of 0 leaves every value a concurrent writer stores intact.
    let a = unsafe { &*(word as *const AtomicU64) };
    a.fetch_add(0, Ordering::SeqCst);
}
