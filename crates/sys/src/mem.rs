//! Raw memory calls on this process's address space: owning anonymous mappings, `madvise`,
//! `mprotect`, moving and replacing mappings, breaking copy-on-write sharing. All through system
//! calls, not the C library (see the crate docs).

use crate::error::{invalid, os_error, SysError};
use crate::racy::{atomic_load_bytes, atomic_store_bytes};
use std::io;

/// The base page size rackmem works in (no huge pages in a [`Mapping`]; userfaultfd resolves
/// 4 KiB pages).
pub const PAGE_SIZE: usize = 4096;

/// Returns the result of a raw system call, or the errno it set (`libc::syscall` returns -1).
fn check(op: &'static str, addr: usize, len: usize, r: libc::c_long) -> Result<usize, SysError> {
    if r < 0 {
        Err(os_error(op, addr, len, io::Error::last_os_error()))
    } else {
        Ok(r as usize)
    }
}

fn sys_mmap(addr: usize, len: usize, flags: libc::c_int) -> libc::c_long {
    // SAFETY: a new anonymous private mapping. Without MAP_FIXED the kernel picks an unused
    // range; with MAP_FIXED_NOREPLACE it refuses to replace anything already mapped. Either way
    // no existing memory is affected.
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

/// Unmaps a range this module mapped and owns (a [`Mapping`] or the trimmed parts of one).
fn sys_munmap(addr: usize, len: usize) {
    // SAFETY: only called on ranges this module mapped and that nothing else references: the
    // surplus of an over-sized reservation, or a Mapping being dropped.
    // munmap of an owned, page-aligned range cannot fail in a way that leaves memory unsound;
    // a failure only leaks address space.
    unsafe {
        libc::syscall(libc::SYS_munmap, addr, len);
    }
}

/// An anonymous private mapping (read/write, lazily backed, no transparent huge pages), owned by
/// this value and unmapped on drop.
///
/// Its bytes are never reached through Rust references, only through raw system calls and the
/// word-atomic copies of [`read`](Mapping::read) and [`write`](Mapping::write); so other threads
/// (C code of the program, userfaultfd ioctls) may use the memory concurrently without making
/// this crate's accesses undefined behaviour. `Send + Sync`.
#[derive(Debug)]
pub struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    /// Reserves `len` bytes (rounded up to pages) aligned to `align` (a power of two; less than a
    /// page means a page): over-maps by `align`, trims both ends, then `MADV_NOHUGEPAGE`
    /// (userfaultfd here resolves 4 KiB pages).
    pub fn reserve(len: usize, align: usize) -> Result<Mapping, SysError> {
        let refuse = |why| invalid("mmap", 0, len, why);
        if len == 0 {
            return Err(refuse("an empty reservation"));
        }
        if !align.is_power_of_two() && align != 0 {
            return Err(refuse("the alignment is not a power of two"));
        }
        let align = align.max(PAGE_SIZE);
        let len = len
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or_else(|| refuse("the length overflows"))?;
        let total = len.checked_add(align).ok_or_else(|| refuse("the length overflows"))?;
        let raw = check("mmap", 0, total, sys_mmap(0, total, 0))?;
        let start = raw.next_multiple_of(align);
        if start > raw {
            sys_munmap(raw, start - raw);
        }
        let tail = raw + total - (start + len);
        if tail > 0 {
            sys_munmap(start + len, tail);
        }
        let m = Mapping { addr: start, len };
        m.nohugepage()?;
        Ok(m)
    }

    /// Maps `len` bytes (rounded up to pages) at exactly `addr` (page-aligned), failing with
    /// EEXIST if anything is mapped there (a forked child re-creates its parent's window at the
    /// same addresses).
    pub fn reserve_at(addr: usize, len: usize) -> Result<Mapping, SysError> {
        let op = "mmap(MAP_FIXED_NOREPLACE)";
        let len = len
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or_else(|| invalid(op, addr, len, "the length overflows"))?;
        let r = check(op, addr, len, sys_mmap(addr, len, libc::MAP_FIXED_NOREPLACE))?;
        if r != addr {
            // Kernels before 4.17 ignore the flag and map elsewhere.
            sys_munmap(r, len);
            return Err(os_error(op, addr, len, io::Error::from_raw_os_error(libc::EEXIST)));
        }
        let m = Mapping { addr, len };
        m.nohugepage()?;
        Ok(m)
    }

    /// Takes ownership of `[addr, addr + len)`, mapped already: the window a forked child
    /// inherits from its parent (whose own `Mapping` of it is never dropped in the child), so
    /// that the child keeps the parent's resident pages copy-on-write instead of mapping fresh
    /// memory there.
    ///
    /// # Safety
    /// The range is mapped, page-aligned, owned by no other `Mapping` that will be dropped in
    /// this process, and reached only through raw addresses (as every `Mapping`'s memory is).
    pub unsafe fn adopt(addr: usize, len: usize) -> Mapping {
        Mapping { addr, len }
    }

    /// Reserves `len` bytes (rounded up to 2 MiB) aligned to 2 MiB and advised
    /// `MADV_HUGEPAGE`, for a window or staging area of huge units: each 2 MiB unit can then be
    /// one transparent huge page, moved whole by one `UFFDIO_MOVE`. Whether the kernel gives
    /// huge pages at all is [`thp_mode`]'s to say.
    pub fn reserve_huge(len: usize) -> Result<Mapping, SysError> {
        let len = len
            .checked_next_multiple_of(HUGE_PAGE_SIZE)
            .ok_or_else(|| invalid("mmap", 0, len, "the length overflows"))?;
        let m = Mapping::reserve(len, HUGE_PAGE_SIZE)?;
        madvise(m.addr, m.len, libc::MADV_HUGEPAGE, "madvise(HUGEPAGE)")?;
        Ok(m)
    }

    fn nohugepage(&self) -> Result<(), SysError> {
        madvise(self.addr, self.len, libc::MADV_NOHUGEPAGE, "madvise(NOHUGEPAGE)")
    }

    /// First address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Length in bytes (a multiple of [`PAGE_SIZE`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty mapping (never, for one made by [`reserve`](Mapping::reserve)).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True if `[addr, addr + len)` lies inside the mapping.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|e| e <= self.addr + self.len)
    }

    /// Keeps the mapping for the life of the process; returns `(addr, len)`.
    pub fn leak(self) -> (usize, usize) {
        let r = (self.addr, self.len);
        std::mem::forget(self);
        r
    }

    fn check_range(&self, offset: usize, len: usize, what: &str) {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.len),
            "{what} of {len} bytes at offset {offset:#x} outside a mapping of {:#x} bytes",
            self.len
        );
    }

    /// Copies `out.len()` bytes at `offset` into `out`.
    ///
    /// Sound with concurrent writers (other threads of the program, `UFFDIO_*` ioctls): the copy
    /// is made of relaxed atomic loads (plain moves on x86_64), so a concurrent write yields some
    /// mix of old and new bytes, never undefined behaviour. Callers that need a consistent page
    /// write-protect or `MOVE` it first, or detect tearing by checksum.
    ///
    /// Blocking: reading a missing page of a range registered for missing faults waits for its
    /// handler (forever, if the caller *is* the handler); a poisoned page raises SIGBUS.
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        self.check_range(offset, out.len(), "read");
        // SAFETY: the range lies inside this live mapping (checked above), which stays mapped
        // while `&self` lives (only Drop unmaps it) and is only accessed atomically here.
        unsafe { atomic_load_bytes(self.addr + offset, out) }
    }

    /// Copies `data` into the mapping at `offset` with relaxed atomic stores (see
    /// [`read`](Mapping::read) for concurrency and blocking). A write to a write-protected page
    /// of a `WP_ASYNC` range is recorded as written.
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.check_range(offset, data.len(), "write");
        // SAFETY: the range lies inside this live, writable mapping (checked above); nothing
        // references its bytes, which are only accessed atomically here.
        unsafe { atomic_store_bytes(self.addr + offset, data) }
    }

    /// The bytes `[offset, offset + len)` as a slice, for reading pages in place (hashing a
    /// staged page without copying it out first).
    ///
    /// # Safety
    /// For the lifetime of the slice nothing may write the range (no thread, no ioctl moving or
    /// zapping its pages), and every page of it must be present (or not registered for missing
    /// faults).
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    pub unsafe fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        self.check_range(offset, len, "bytes");
        // SAFETY: the range lies inside this live mapping (checked above) that stays mapped while
        // `&self` lives; that nothing writes it meanwhile is the caller's promise.
        unsafe { std::slice::from_raw_parts((self.addr + offset) as *const u8, len) }
    }

    /// The bytes `[offset, offset + len)` as a mutable slice, for receiving data straight into
    /// the mapping (a socket read into pages that are then moved elsewhere with `UFFDIO_MOVE`).
    ///
    /// # Safety
    /// For the lifetime of the slice nothing else may access the range: no other slice, no
    /// [`read`](Mapping::read)/[`write`](Mapping::write), no ioctl moving or zapping its pages,
    /// and no other thread. Every page of the range must be present (or not registered for
    /// missing faults), or touching it waits for a handler that may be the caller.
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        self.check_range(offset, len, "bytes_mut");
        // SAFETY: the range lies inside this live, writable mapping (checked above) that stays
        // mapped while `&self` lives; exclusive access for the slice's lifetime is the caller's
        // promise (see # Safety).
        unsafe { std::slice::from_raw_parts_mut((self.addr + offset) as *mut u8, len) }
    }

    /// `madvise(MADV_DONTNEED)` of `[offset, offset + len)` (see [`madvise_dontneed`]).
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    pub fn dontneed(&self, offset: usize, len: usize) -> Result<(), SysError> {
        self.check_range(offset, len, "madvise(DONTNEED)");
        // SAFETY: the range lies inside this mapping (checked above), which this module set
        // aside; Rust references into it exist only as the slices of `bytes`/`bytes_mut`, whose
        // callers promise no ioctl or call zaps the range meanwhile.
        unsafe { madvise_dontneed(self.addr + offset, len) }
    }

    /// Breaks copy-on-write sharing of the page at `offset` (see [`try_break_cow`]).
    ///
    /// # Panics
    /// If the offset is outside the mapping (a caller bug, not an input error).
    pub fn break_cow(&self, offset: usize) -> Result<(), SysError> {
        self.check_range(offset, 1, "break_cow");
        try_break_cow(self.addr + offset)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        sys_munmap(self.addr, self.len);
    }
}

fn madvise(addr: usize, len: usize, advice: libc::c_int, op: &'static str) -> Result<(), SysError> {
    // SAFETY: madvise(2) with the advice values this module uses (NOHUGEPAGE, HUGEPAGE, DONTNEED,
    // DONTFORK, POPULATE_WRITE) touches no memory through a pointer; the kernel validates the
    // range and returns an error for unmapped addresses. What DONTNEED does to the contents is
    // the caller's business (see `madvise_dontneed`).
    let r = unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) };
    check(op, addr, len, r).map(|_| ())
}

/// `madvise(MADV_DONTNEED)`: drops the pages of `[addr, addr + len)` (page-aligned). Private
/// anonymous memory then reads as zeros, or faults to its userfaultfd if registered for missing
/// faults.
///
/// With a userfaultfd that negotiated `EVENT_REMOVE` registered on the range, this call blocks
/// until some thread reads the `REMOVE` event message, and while it is pending `COPY`/`MOVE` on
/// that userfaultfd fail with `EAGAIN`: never call it from the only thread that reads it.
///
/// # Safety
/// `[addr, addr + len)` is a range this process set aside for memory reached only through raw
/// addresses (a [`Mapping`], a window, a staging area; see the crate docs), and no Rust
/// reference points into it while the call runs or afterwards: the call replaces its contents
/// (zeros, or a missing-page fault) under any such reference.
pub unsafe fn madvise_dontneed(addr: usize, len: usize) -> Result<(), SysError> {
    madvise(addr, len, libc::MADV_DONTNEED, "madvise(DONTNEED)")
}

/// `madvise(MADV_POPULATE_WRITE)` over `[addr, addr + len)`: allocates and maps every page as a
/// write would, without changing any byte.
/// `madvise(MADV_POPULATE_WRITE)`: faults in `[addr, addr + len)` writable, as writes would (a
/// fresh private anonymous range reads zeros after it: a THP where the range may have one).
pub fn madvise_populate_write(addr: usize, len: usize) -> Result<(), SysError> {
    madvise(addr, len, libc::MADV_POPULATE_WRITE, "madvise(POPULATE_WRITE)")
}

/// `madvise(MADV_POPULATE_READ)`: faults in `[addr, addr + len)` as reads would, without
/// changing any byte (a missing page of a userfaultfd range is served by its handler).
pub fn madvise_populate_read(addr: usize, len: usize) -> Result<(), SysError> {
    madvise(addr, len, libc::MADV_POPULATE_READ, "madvise(POPULATE_READ)")
}

/// `madvise(MADV_HUGEPAGE)`: `[addr, addr + len)` may be backed by transparent huge pages
/// (under THP's "madvise" setting, only such ranges are).
pub fn madvise_hugepage(addr: usize, len: usize) -> Result<(), SysError> {
    madvise(addr, len, libc::MADV_HUGEPAGE, "madvise(HUGEPAGE)")
}

/// `madvise(MADV_DONTFORK)`: a forked child does not inherit `[addr, addr + len)`.
pub fn madvise_dontfork(addr: usize, len: usize) -> Result<(), SysError> {
    madvise(addr, len, libc::MADV_DONTFORK, "madvise(DONTFORK)")
}

/// `madvise(MADV_DOFORK)`: undoes [`madvise_dontfork`], so a forked child inherits the range.
pub fn madvise_dofork(addr: usize, len: usize) -> Result<(), SysError> {
    madvise(addr, len, libc::MADV_DOFORK, "madvise(DOFORK)")
}

/// Forces a private copy of the page holding `addr` (breaking copy-on-write sharing with a
/// forked child, so that `UFFDIO_MOVE` stops failing with `EBUSY`) without changing
/// its contents, even if other threads write it at the same time.
///
/// It is `madvise(MADV_POPULATE_WRITE)` of that page (Linux 5.14): the kernel takes the write
/// fault a store would take, without storing anything. This is sound for any address (no
/// memory is accessed from Rust: an unmapped or read-only address is an error, not a crash),
/// which a store such as an atomic `fetch_add(0)` would not be. As with a real write: a missing
/// page of a range registered for missing faults waits for its handler (forever, if the caller
/// is that handler), and a `WP_ASYNC` write-protected page is recorded as written.
pub fn try_break_cow(addr: usize) -> Result<(), SysError> {
    let page = addr & !(PAGE_SIZE - 1);
    madvise(page, PAGE_SIZE, libc::MADV_POPULATE_WRITE, "madvise(POPULATE_WRITE)")
}

/// [`try_break_cow`], ignoring failure: the caller retries the `UFFDIO_MOVE` that failed with
/// `EBUSY` and sees `EBUSY` again if the page could not be made private.
pub fn break_cow(addr: usize) {
    // Ignored by design (see above): the retry of MOVE is the check.
    let _ = try_break_cow(addr);
}

/// `mprotect(2)` on `[addr, addr + len)` of the window: the program asked for this protection
/// (a reserve-then-commit allocator); the VMA split keeps its userfaultfd registration.
///
/// # Safety
/// `[addr, addr + len)` is a range this process set aside (a window) that no Rust reference
/// points into, and `prot` is the protection the program that uses the range asked for it:
/// accesses made afterwards are then only the program's, which it allowed.
pub unsafe fn mprotect(addr: usize, len: usize, prot: libc::c_int) -> Result<(), SysError> {
    // SAFETY: mprotect touches no memory through a pointer; which range and protection is the
    // caller's promise (see # Safety).
    let r = unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) };
    check("mprotect", addr, len, r).map(|_| ())
}

/// Moves the mapping at `[from, from + len)` (whatever it is: a file, shared memory) to `to`,
/// replacing what was mapped there, with `mremap(MREMAP_MAYMOVE | MREMAP_FIXED)`. A forked
/// child moves the file mappings its parent lent window pages to out of the way while it maps
/// its own window, then back.
///
/// # Safety
/// `[from, from + len)` is a mapping of the program's (not memory Rust code references), `to`
/// is a placeholder of `len` bytes the caller owns and nothing references, and the mapping is
/// back at `from` before any code that uses it runs again (a forked child's atfork hook,
/// single-threaded).
pub unsafe fn move_mapping(from: usize, len: usize, to: usize) -> Result<(), SysError> {
    // SAFETY: mremap touches no memory through a pointer; that both ranges are free of Rust
    // references and the move is undone in time is the caller's promise (see # Safety).
    let r = unsafe {
        libc::syscall(
            libc::SYS_mremap,
            from,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            to,
        )
    };
    check("mremap(MREMAP_FIXED)", from, len, r).map(|_| ())
}

/// Puts fresh private anonymous read-write memory at `[addr, addr + len)`, replacing whatever
/// mapping the program had put there (MAP_FIXED): a range of the window that a file mapping
/// borrowed comes back to the window (the caller registers it with its userfaultfd again).
///
/// # Safety
/// `[addr, addr + len)` is part of a range this process set aside (a window) that no Rust
/// reference points into: the mapping there, and its contents, are replaced.
pub unsafe fn remap_anonymous(addr: usize, len: usize) -> Result<(), SysError> {
    check("mmap(MAP_FIXED)", addr, len, sys_mmap(addr, len, libc::MAP_FIXED)).map(|_| ())
}

/// What this process's page table holds for one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageEntry {
    /// Nothing: touching it would be a missing-page fault.
    None,
    /// A page in memory.
    Present,
    /// A page the kernel swapped out (the entry holds its place in swap).
    Swapped,
}

/// What the page table holds at `addr` in this process, from `/proc/self/pagemap` (bits 63,
/// present, and 62, swapped: readable without privileges). For the rare moments the runtime
/// must learn where a page really is because `UFFDIO_MOVE` reported less than it did (see
/// "Swapped pages" in docs/architecture.md); opened per call, so a forked child reads its own.
pub fn page_entry(addr: usize) -> Result<PageEntry, SysError> {
    use std::os::unix::fs::FileExt;
    let page = addr / PAGE_SIZE;
    let err = |errno: std::io::Error| SysError::Os {
        op: "read /proc/self/pagemap",
        addr,
        len: PAGE_SIZE,
        errno,
    };
    let f = std::fs::File::open("/proc/self/pagemap").map_err(err)?;
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, page as u64 * 8).map_err(err)?;
    let e = u64::from_ne_bytes(b);
    Ok(if e & (1 << 63) != 0 {
        PageEntry::Present
    } else if e & (1 << 62) != 0 {
        PageEntry::Swapped
    } else {
        PageEntry::None
    })
}

/// Bytes in a transparent huge page (a PMD mapping with 4 KiB pages on x86-64 and arm64).
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// The kernel's transparent huge page setting (`/sys/kernel/mm/transparent_hugepage/enabled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThpMode {
    /// Every anonymous mapping large enough gets huge pages.
    Always,
    /// Mappings advised `MADV_HUGEPAGE` get huge pages (what rackmem's huge units need).
    Madvise,
    /// No huge pages, whatever the advice.
    Never,
}

impl ThpMode {
    /// True if a mapping advised `MADV_HUGEPAGE` gets huge pages.
    pub fn advised_gets_huge(self) -> bool {
        self != ThpMode::Never
    }

    /// Parses the file's text (`always [madvise] never`: the bracketed word is the setting).
    pub fn parse(text: &str) -> Option<ThpMode> {
        let start = text.find('[')?;
        let end = start + text[start..].find(']')?;
        match &text[start + 1..end] {
            "always" => Some(ThpMode::Always),
            "madvise" => Some(ThpMode::Madvise),
            "never" => Some(ThpMode::Never),
            _ => None,
        }
    }
}

/// The kernel's transparent huge page setting; `Never` if the file is missing (a kernel built
/// without THP) or says something else.
pub fn thp_mode() -> ThpMode {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|t| ThpMode::parse(&t))
        .unwrap_or(ThpMode::Never)
}

/// Bytes of `[addr, addr + len)`'s mapping that are mapped as transparent huge pages (its
/// `AnonHugePages` in `/proc/self/smaps`), summed over the mappings that start inside the range
/// or contain its start.
pub fn anon_huge_bytes(addr: usize, len: usize) -> io::Result<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut inside = false;
    let mut total = 0u64;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = head.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a < addr + len && b > addr;
                continue;
            }
        }
        if inside {
            if let Some(rest) = line.strip_prefix("AnonHugePages:") {
                let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
                total += kb * 1024;
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod thp_tests {
    use super::ThpMode;

    #[test]
    fn the_bracketed_word_is_the_setting() {
        assert_eq!(ThpMode::parse("always [madvise] never\n"), Some(ThpMode::Madvise));
        assert_eq!(ThpMode::parse("[always] madvise never"), Some(ThpMode::Always));
        assert_eq!(ThpMode::parse("always madvise [never]"), Some(ThpMode::Never));
        assert_eq!(ThpMode::parse("always madvise never"), None);
        assert!(!ThpMode::Never.advised_gets_huge());
        assert!(ThpMode::Madvise.advised_gets_huge());
    }
}
