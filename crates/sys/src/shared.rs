//! Shared memory between a brick and the nodes on its own host: a sealed `memfd` holding one
//! segment, mapped `MAP_SHARED` by the brick and by each node it is handed to, and the calls that
//! hand its descriptor over a Unix socket (`SCM_RIGHTS`).
//!
//! A node that maps a segment reads and writes it with a memory copy instead of a request and a
//! response on a socket: no round trip, no wake-up of the brick. The brick keeps owning the
//! memory (it creates, sizes and seals the file); the node can neither grow nor shrink it, so no
//! side ever touches a page past the end of the file (which would raise SIGBUS).
//!
//! Mappings go through the raw system calls, like [`Mapping`](crate::Mapping): this runs inside
//! `librackmem.so`, which interposes the C library's `mmap`. Handing the descriptor over is the
//! job of [`send_with_fd`](crate::send_with_fd) and [`recv_with_fds`](crate::recv_with_fds).

use crate::error::{invalid, os_error, SysError};
use crate::mem::{madvise_dontfork, madvise_populate_write, PAGE_SIZE};
use crate::racy::{atomic_load_bytes, atomic_store_bytes};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A `memfd` of fixed size, mapped shared and read/write; unmapped on drop (the file lives on as
/// long as some process maps it or holds its descriptor).
///
/// Its bytes are only reached with word-atomic copies (like [`Mapping`](crate::Mapping)), so the
/// other process writing the same pages at the same time is not undefined behaviour here.
/// `Send + Sync`.
#[derive(Debug)]
pub struct SharedMemory {
    fd: OwnedFd,
    addr: usize,
    len: usize,
}

impl SharedMemory {
    /// Creates a zero-filled, lazily backed memory file of `len` bytes (a whole number of pages),
    /// sealed against resizing, and maps it. `name` shows in `/proc/PID/maps` of every process
    /// that maps it.
    pub fn create(name: &str, len: usize) -> Result<SharedMemory, SysError> {
        if len == 0 || len % PAGE_SIZE != 0 {
            return Err(invalid(
                "memfd_create",
                0,
                len,
                "the length is not a whole number of pages",
            ));
        }
        let cname = std::ffi::CString::new(name.replace('\0', "?"))
            .map_err(|_| invalid("memfd_create", 0, len, "the name holds a NUL byte"))?;
        // SAFETY: memfd_create(2) reads the NUL-terminated name and returns a new descriptor
        // (or -1); no memory of ours is written.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(os_error("memfd_create", 0, len, io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a descriptor memfd_create just returned and nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate(2) on a descriptor we own; no memory is touched.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(os_error("ftruncate(memfd)", 0, len, io::Error::last_os_error()));
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl(2) F_ADD_SEALS on a descriptor we own; no memory is touched.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(os_error("fcntl(F_ADD_SEALS)", 0, len, io::Error::last_os_error()));
        }
        Self::map(fd, len)
    }

    /// Maps a memory file received from a brick, after checking that it is at least `len` bytes
    /// and sealed against shrinking (else the brick could cut pages out from under the mapping).
    pub fn open(fd: OwnedFd, len: usize) -> Result<SharedMemory, SysError> {
        let bad = |why| invalid("mmap(shared)", 0, len, why);
        if len == 0 || len % PAGE_SIZE != 0 {
            return Err(bad("the length is not a whole number of pages"));
        }
        // SAFETY: fcntl(2) F_GET_SEALS on a descriptor we own; no memory is touched.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(bad("the file is not sealed against shrinking"));
        }
        let size = fstat(fd.as_fd())
            .map_err(|e| os_error("fstat(memfd)", 0, len, e))?
            .st_size;
        if size < len as libc::off_t {
            return Err(bad("the file is shorter than the segment"));
        }
        Self::map(fd, len)
    }

    /// Maps the first `len` bytes of an ordinary file shared between the processes of one run
    /// (a regular file cannot be sealed: whoever creates it must keep it at least `len` bytes,
    /// which is checked here once).
    pub fn open_file(path: &std::path::Path, len: usize) -> Result<SharedMemory, SysError> {
        let bad = |why| invalid("mmap(shared file)", 0, len, why);
        if len == 0 || len % PAGE_SIZE != 0 {
            return Err(bad("the length is not a whole number of pages"));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| os_error("open(shared file)", 0, len, e))?;
        let fd = OwnedFd::from(file);
        let size = fstat(fd.as_fd())
            .map_err(|e| os_error("fstat(shared file)", 0, len, e))?
            .st_size;
        if size < len as libc::off_t {
            return Err(bad("the file is shorter than asked"));
        }
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> Result<SharedMemory, SysError> {
        // SAFETY: a new shared mapping of a file we hold, at an address the kernel picks (no
        // MAP_FIXED): no existing memory is affected.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                0usize,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0usize,
            )
        };
        if r < 0 {
            return Err(os_error("mmap(shared)", 0, len, io::Error::last_os_error()));
        }
        let m = SharedMemory {
            fd,
            addr: r as usize,
            len,
        };
        // A forked child must not inherit a way to write its parent's segment.
        madvise_dontfork(m.addr, m.len)?;
        Ok(m)
    }

    /// The file's descriptor (to hand to a node with [`send_with_fd`](crate::send_with_fd)).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if nothing is mapped (never: an empty file is refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check_range(&self, offset: usize, len: usize, what: &str) {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.len),
            "{what} of {len} bytes at offset {offset:#x} outside shared memory of {:#x} bytes",
            self.len
        );
    }

    /// Copies `out.len()` bytes at `offset` into `out` (word-atomic loads: a concurrent writer
    /// in another process yields a mix of old and new bytes, never undefined behaviour).
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        self.check_range(offset, out.len(), "read");
        // SAFETY: the range lies inside this live mapping (checked above), which stays mapped
        // while `&self` lives; its bytes are only accessed atomically from this process, and the
        // file cannot shrink (sealed), so no page of it can vanish.
        unsafe { atomic_load_bytes(self.addr + offset, out) }
    }

    /// Copies `data` to `offset` (word-atomic stores).
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.check_range(offset, data.len(), "write");
        // SAFETY: as in `read`; the mapping is writable.
        unsafe { atomic_store_bytes(self.addr + offset, data) }
    }

    /// The address of `offset` in this process's mapping, for a system call that reads `len`
    /// bytes there (`UFFDIO_COPY` straight from the segment). The address is valid while `self`
    /// lives.
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    pub fn addr_of(&self, offset: usize, len: usize) -> usize {
        self.check_range(offset, len, "addr_of");
        self.addr + offset
    }

    /// The 8-byte word at `offset`, which must be a multiple of 8 inside the mapping, as an
    /// atomic: every process that maps the file and uses atomic instructions on the word (the
    /// brick serving FETCH_ADD for a TCP node, a node on this host doing it in its own mapping)
    /// sees one order of updates, because they are the same physical memory.
    ///
    /// # Panics
    /// If the word is misaligned or outside the mapping (a caller bug, not an input error).
    fn word(&self, offset: usize) -> &std::sync::atomic::AtomicU64 {
        self.check_range(offset, 8, "atomic");
        assert!(offset % 8 == 0, "atomic word at {offset:#x} is not 8-byte aligned");
        // SAFETY: the word lies inside this live mapping (checked above) and is 8-byte aligned
        // (the mapping is page aligned, the offset a multiple of 8), so it is a valid
        // AtomicU64 for as long as `&self` lives (the file is sealed against shrinking). Its
        // bytes are only ever reached from this process through atomic operations or the
        // word-atomic copies of `read`/`write`, never through a non-atomic Rust reference.
        unsafe { std::sync::atomic::AtomicU64::from_ptr((self.addr + offset) as *mut u64) }
    }

    /// The word at `offset` (a multiple of 8), read atomically.
    ///
    /// # Panics
    /// If the word is misaligned or outside the mapping (a caller bug, not an input error).
    pub fn load_u64(&self, offset: usize) -> u64 {
        self.word(offset).load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stores `value` in the word at `offset` (a multiple of 8) atomically.
    ///
    /// # Panics
    /// If the word is misaligned or outside the mapping (a caller bug, not an input error).
    pub fn store_u64(&self, offset: usize, value: u64) {
        self.word(offset).store(value, std::sync::atomic::Ordering::SeqCst)
    }

    /// Raises the word at `offset` (a multiple of 8) to `value` if it is lower; returns its
    /// previous value.
    ///
    /// # Panics
    /// If the word is misaligned or outside the mapping (a caller bug, not an input error).
    pub fn fetch_max_u64(&self, offset: usize, value: u64) -> u64 {
        self.word(offset).fetch_max(value, std::sync::atomic::Ordering::SeqCst)
    }

    /// Atomically adds `value` (wrapping) to the little-endian word at `offset` (a multiple of
    /// 8) and returns its previous value; sequentially consistent.
    ///
    /// # Panics
    /// If the word is misaligned or outside the mapping (a caller bug, not an input error).
    pub fn fetch_add_u64(&self, offset: usize, value: u64) -> u64 {
        self.word(offset).fetch_add(value, std::sync::atomic::Ordering::SeqCst)
    }

    /// Atomically replaces the word at `offset` (a multiple of 8) by `desired` if it holds
    /// `expected`; returns its previous value (equal to `expected` iff it was replaced).
    ///
    /// # Panics
    /// If the word is misaligned or outside the mapping (a caller bug, not an input error).
    pub fn compare_swap_u64(&self, offset: usize, expected: u64, desired: u64) -> u64 {
        use std::sync::atomic::Ordering::SeqCst;
        match self.word(offset).compare_exchange(expected, desired, SeqCst, SeqCst) {
            Ok(v) | Err(v) => v,
        }
    }

    /// Whether the bytes at `offset` equal `data`, read as [`read`](Self::read) does, a chunk
    /// at a time: it stops at the first chunk that differs.
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    pub fn equals(&self, offset: usize, data: &[u8]) -> bool {
        const CHUNK: usize = 256;
        self.check_range(offset, data.len(), "compare");
        let mut chunk = [0u8; CHUNK];
        data.chunks(CHUNK).enumerate().all(|(i, want)| {
            let got = &mut chunk[..want.len()];
            // SAFETY: as in `read`: the chunk lies inside the checked range.
            unsafe { atomic_load_bytes(self.addr + offset + i * CHUNK, got) };
            got == want
        })
    }

    /// Copies `out.len()` bytes at `offset` into `out` through the file rather than the mapping
    /// (`pread`): holes read as zeros without allocating memory for them, which reading a hole
    /// through the mapping would.
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    pub fn read_file(&self, offset: usize, out: &mut [u8]) {
        self.check_range(offset, out.len(), "read_file");
        let mut done = 0;
        while done < out.len() {
            let rest = &mut out[done..];
            // SAFETY: pread(2) writes at most `rest.len()` bytes into `rest`, which is ours.
            let r = unsafe {
                libc::pread(
                    self.fd.as_raw_fd(),
                    rest.as_mut_ptr() as *mut libc::c_void,
                    rest.len(),
                    (offset + done) as libc::off_t,
                )
            };
            if r > 0 {
                done += r as usize;
            } else if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            } else {
                // Cannot happen inside a sealed file of this size; fall back to the mapping.
                self.read(offset + done, &mut out[done..]);
                return;
            }
        }
    }

    /// Copies `data` to `offset` through the file (`pwrite`) rather than the mapping: filling
    /// a fresh file this way takes no page fault per page in this process, which copying a
    /// whole segment through the mapping did (a clone at fork).
    ///
    /// # Panics
    /// If the range is outside the mapping (a caller bug, not an input error).
    pub fn write_file(&self, offset: usize, data: &[u8]) -> Result<(), SysError> {
        self.check_range(offset, data.len(), "write_file");
        let mut done = 0;
        while done < data.len() {
            let rest = &data[done..];
            // SAFETY: pwrite(2) reads at most `rest.len()` bytes from `rest`, which is ours.
            let r = unsafe {
                libc::pwrite(
                    self.fd.as_raw_fd(),
                    rest.as_ptr() as *const libc::c_void,
                    rest.len(),
                    (offset + done) as libc::off_t,
                )
            };
            if r > 0 {
                done += r as usize;
            } else if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            } else {
                let e = if r < 0 {
                    io::Error::last_os_error()
                } else {
                    io::Error::new(io::ErrorKind::WriteZero, "pwrite wrote nothing")
                };
                return Err(os_error("pwrite(memfd)", offset + done, rest.len(), e));
            }
        }
        Ok(())
    }

    /// The ranges `[start, end)` of the file that hold data (`lseek(SEEK_DATA/SEEK_HOLE)`):
    /// everything else is a hole, zeros that take no memory. Copying a sparse segment visits only
    /// these.
    pub fn data_ranges(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut at: libc::off_t = 0;
        let end = self.len as libc::off_t;
        while at < end {
            // SAFETY: lseek(2) on our descriptor only moves its file offset.
            let data = unsafe { libc::lseek(self.fd.as_raw_fd(), at, libc::SEEK_DATA) };
            if data < 0 {
                // ENXIO: no data past `at`. Anything else: claim the rest holds data, which is
                // only slower, never wrong.
                if io::Error::last_os_error().raw_os_error() != Some(libc::ENXIO) {
                    out.push((at as usize, self.len));
                }
                break;
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(self.fd.as_raw_fd(), data, libc::SEEK_HOLE) };
            let hole = if hole < 0 { end } else { hole.min(end) };
            if hole <= data {
                break;
            }
            out.push((data as usize, hole as usize));
            at = hole;
        }
        out
    }

    /// Zeroes `[offset, offset + len)` (page-aligned) and gives its memory back to the system
    /// (`fallocate(PUNCH_HOLE)`), for every process that maps the file.
    pub fn discard(&self, offset: usize, len: usize) -> Result<(), SysError> {
        self.check_range(offset, len, "discard");
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate(2) on our descriptor; the kernel zaps the range from every mapping,
        // which later accesses see as zeros (the file keeps its size), never as a fault.
        let r = unsafe { libc::fallocate(self.fd.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t) };
        if r != 0 {
            return Err(os_error(
                "fallocate(PUNCH_HOLE)",
                offset,
                len,
                io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// Gives `[offset, offset + len)` (page-aligned) memory now, zero-filled where it had none,
    /// without changing a byte (`MADV_POPULATE_WRITE` on this mapping; `fallocate` would leave
    /// the pages unwritten, which `mincore` reports as absent). Linux charges a page of shared
    /// memory to the memory cgroup of the process that allocates it: a brick populates the
    /// pages a node is about to write, so that they count against the brick, not the node.
    pub fn populate(&self, offset: usize, len: usize) -> Result<(), SysError> {
        self.check_range(offset, len, "populate");
        madvise_populate_write(self.addr + offset, len)
    }

    /// For each page of `[offset, offset + len)` (page-aligned), whether the file holds memory
    /// for it (`mincore`: written, or populated, and not discarded since). Replaces `out`.
    pub fn pages_backed(&self, offset: usize, len: usize, out: &mut Vec<bool>) -> Result<(), SysError> {
        self.check_range(offset, len, "pages_backed");
        let pages = len / PAGE_SIZE;
        let mut vec = vec![0u8; pages];
        // SAFETY: mincore(2) reads no memory of ours and writes one byte per page of the range
        // into `vec`, which has exactly that many; the range lies inside this live mapping.
        let r = unsafe { libc::mincore((self.addr + offset) as *mut libc::c_void, len, vec.as_mut_ptr()) };
        if r != 0 {
            return Err(os_error("mincore", offset, len, io::Error::last_os_error()));
        }
        out.clear();
        out.extend(vec.iter().map(|&b| b & 1 != 0));
        Ok(())
    }

    /// Bytes of memory the file holds (pages written and not discarded since).
    pub fn resident_bytes(&self) -> u64 {
        fstat(self.fd.as_fd()).map_or(0, |st| st.st_blocks as u64 * 512)
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps the range this value mapped; nothing references its bytes (only atomic
        // copies through `&self`, which cannot outlive it).
        unsafe {
            libc::syscall(libc::SYS_munmap, self.addr, self.len);
        }
    }
}

fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is valid plain data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat(2) only fills `st`, a valid, writable stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fdpass::{recv_with_fds, send_with_fd};
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn atomics_on_two_mappings_of_one_file_never_lose_an_update() {
        let brick = SharedMemory::create("rackmem-test-atomics", PAGE_SIZE).expect("memfd");
        let (a, b) = UnixStream::pair().expect("socketpair");
        send_with_fd(a.as_fd(), b"x", brick.fd()).expect("send");
        let mut buf = [0u8; 8];
        let mut fds = Vec::new();
        recv_with_fds(b.as_fd(), &mut buf, &mut fds).expect("recv");
        let node = SharedMemory::open(fds.remove(0), PAGE_SIZE).expect("map");
        std::thread::scope(|s| {
            for m in [&brick, &node] {
                s.spawn(move || {
                    for _ in 0..100_000 {
                        m.fetch_add_u64(8, 3);
                    }
                });
            }
        });
        assert_eq!(brick.fetch_add_u64(8, 0), 600_000);
        assert_eq!(
            node.compare_swap_u64(8, 1, 2),
            600_000,
            "a failed swap returns the value"
        );
        assert_eq!(node.compare_swap_u64(8, 600_000, 7), 600_000);
        let mut w = [0u8; 8];
        brick.read(8, &mut w);
        assert_eq!(u64::from_le_bytes(w), 7);
    }

    #[test]
    fn a_segment_handed_over_a_socket_is_the_same_memory() {
        let brick = SharedMemory::create("rackmem-test", 4 * PAGE_SIZE).expect("memfd");
        brick.write(4096, b"hello");
        let (a, b) = UnixStream::pair().expect("socketpair");
        assert_eq!(send_with_fd(a.as_fd(), b"x", brick.fd()).expect("send"), 1);
        let mut buf = [0u8; 8];
        let mut fds = Vec::new();
        assert_eq!(recv_with_fds(b.as_fd(), &mut buf, &mut fds).expect("recv"), 1);
        assert_eq!(fds.len(), 1);
        let node = SharedMemory::open(fds.remove(0), 4 * PAGE_SIZE).expect("map");
        let mut got = [0u8; 5];
        node.read(4096, &mut got);
        assert_eq!(&got, b"hello");
        node.write(0, &[9u8; 4096]);
        let mut page = vec![0u8; 4096];
        brick.read(0, &mut page);
        assert!(page.iter().all(|&x| x == 9));
        assert!(brick.resident_bytes() >= 2 * 4096);
        assert_eq!(brick.data_ranges(), vec![(0, 2 * 4096)]);
        node.discard(0, 4096).expect("punch");
        brick.read(0, &mut page);
        assert!(
            page.iter().all(|&x| x == 0),
            "a discarded page reads as zeros everywhere"
        );
        // Plain data on the same socket carries no descriptor.
        (&a).write_all(b"yz").expect("write");
        assert_eq!(recv_with_fds(b.as_fd(), &mut buf, &mut fds).expect("recv"), 2);
        assert!(fds.is_empty());
    }

    #[test]
    fn equals_finds_a_difference_in_any_byte() {
        let m = SharedMemory::create("rackmem-test", 2 * PAGE_SIZE).expect("memfd");
        let page: Vec<u8> = (0..4096).map(|i| (i * 7 % 251) as u8).collect();
        m.write(4096, &page);
        assert!(m.equals(4096, &page));
        assert!(m.equals(0, &[0u8; 4096]), "an untouched page equals zeros");
        assert!(!m.equals(0, &page));
        for at in [0, 255, 256, 1000, 4095] {
            let mut other = page.clone();
            other[at] ^= 1;
            assert!(!m.equals(4096, &other), "byte {at} differs");
        }
        // Lengths that are not whole chunks.
        assert!(m.equals(4096 + 3, &page[3..1003]));
        assert!(!m.equals(4096 + 3, &page[4..1004]));
    }

    #[test]
    fn populated_pages_are_backed_and_read_as_zeros() {
        let page = PAGE_SIZE;
        let m = SharedMemory::create("rackmem-test", 8 * page).expect("memfd");
        let mut backed = Vec::new();
        m.pages_backed(0, 8 * page, &mut backed).expect("mincore");
        assert_eq!(backed, vec![false; 8], "a new file holds no memory");
        m.write(page, &[5u8; 16]);
        m.populate(4 * page, 2 * page).expect("populate");
        m.pages_backed(0, 8 * page, &mut backed).expect("mincore");
        assert_eq!(backed, [false, true, false, false, true, true, false, false]);
        assert!(
            m.equals(4 * page, &vec![0u8; 2 * page]),
            "populated pages read as zeros"
        );
        assert!(m.resident_bytes() >= 3 * page as u64);
        m.discard(4 * page, page).expect("punch");
        m.pages_backed(4 * page, 2 * page, &mut backed).expect("mincore");
        assert_eq!(backed, [false, true]);
    }

    #[test]
    fn a_node_cannot_resize_the_file_or_map_more_than_it_holds() {
        let brick = SharedMemory::create("rackmem-test", 2 * PAGE_SIZE).expect("memfd");
        // SAFETY: ftruncate on a descriptor we hold; the seal must refuse it.
        let r = unsafe { libc::ftruncate(brick.fd().as_raw_fd(), 4096) };
        assert_ne!(r, 0, "a sealed segment cannot shrink");
        let dup = brick.fd().try_clone_to_owned().expect("dup");
        assert!(SharedMemory::open(dup, 4 * PAGE_SIZE).is_err());
        // An unsealed file is refused: its owner could shrink it under the mapping.
        // SAFETY: memfd_create with a static NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"plain".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a descriptor just returned, owned by nobody else.
        let plain = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on a descriptor we own.
        assert_eq!(unsafe { libc::ftruncate(plain.as_raw_fd(), 8192) }, 0);
        assert!(SharedMemory::open(plain, 8192).is_err());
        assert!(SharedMemory::create("rackmem-test", 100).is_err());
    }
}
