//! An open userfaultfd: opening it with kernel-mode faults, negotiating features, registering
//! ranges, resolving faults and reading messages.

use crate::error::{last_errno, os_error, UffdError};
use crate::event::{parse_msg, Event, MSG_SIZE};
use crate::features::Features;
use crate::ioctl::{
    ioctl_ptr, range, UFFDIO_API, UFFDIO_COPY, UFFDIO_MOVE, UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES,
    UFFDIO_MOVE_MODE_DONTWAKE, UFFDIO_POISON, UFFDIO_POISON_MODE_DONTWAKE, UFFDIO_REGISTER, UFFDIO_UNREGISTER,
    UFFDIO_WAKE, UFFDIO_WRITEPROTECT, UFFDIO_WRITEPROTECT_MODE_DONTWAKE, UFFDIO_WRITEPROTECT_MODE_WP, UFFDIO_ZEROPAGE,
    UFFD_API, USERFAULTFD_IOC_NEW,
};
use linux_raw_sys::general as sys;
use rackmem_sys::PAGE_SIZE;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// How to open a userfaultfd.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// Features to negotiate; opening fails with [`UffdError::MissingFeatures`] if the kernel
    /// lacks any.
    pub features: Features,
    /// `O_NONBLOCK`: [`Uffd::read_events`] returns `Ok(0)` instead of sleeping when nothing is
    /// queued. A faulting thread sleeps either way.
    pub nonblocking: bool,
}

/// Registration modes (`UFFDIO_REGISTER_MODE_*`); at least one must be set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegisterMode {
    /// Report faults on missing pages.
    pub missing: bool,
    /// Track writes to write-protected pages (with `WP_ASYNC` the kernel resolves them itself
    /// and only records which pages were written).
    pub wp: bool,
    /// Minor faults (shmem and hugetlbfs only).
    pub minor: bool,
}

/// Options of `UFFDIO_COPY`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyMode {
    /// Install the pages write-protected (`UFFDIO_COPY_MODE_WP`); the range must be registered
    /// with [`RegisterMode::wp`].
    pub write_protect: bool,
    /// Do not wake the threads waiting on the range (wake them later with [`Uffd::wake`]).
    pub dontwake: bool,
}

/// Options of `UFFDIO_MOVE`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoveMode {
    /// Do not wake threads waiting on the destination.
    pub dontwake: bool,
    /// Skip holes in the source instead of failing with ENOENT (holes count as moved).
    pub allow_src_holes: bool,
}
/// An open userfaultfd and the features negotiated on it.
///
/// `Send + Sync`: every method is one system call (or a retry loop of them) on the shared
/// descriptor; the kernel makes concurrent ioctls safe. Dropping it closes the descriptor, which
/// unregisters every range and wakes every waiting thread (their faults then resolve as on
/// unregistered memory).
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    features: Features,
}

/// Opens a userfaultfd with `flags` (never `UFFD_USER_MODE_ONLY`): the system call first, then
/// `/dev/userfaultfd` if the call is refused for lack of privilege.
fn open_raw(flags: libc::c_int) -> Result<OwnedFd, UffdError> {
    // SAFETY: userfaultfd(2) takes only flags and returns a new descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if raw >= 0 {
        // SAFETY: a fresh descriptor that nothing else owns.
        return Ok(unsafe { OwnedFd::from_raw_fd(raw as RawFd) });
    }
    let first = io::Error::last_os_error();
    if first.raw_os_error() != Some(libc::EPERM) {
        return Err(os_error("userfaultfd(2)", 0, 0, first));
    }
    let dev = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/userfaultfd")
    {
        Ok(dev) => dev,
        // No device or no access to it: the system call's EPERM is the real story.
        Err(_) => return Err(UffdError::Permission { cause: first }),
    };
    // SAFETY: USERFAULTFD_IOC_NEW takes the flags by value and returns a new descriptor or -1.
    let raw = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as libc::Ioctl, flags) };
    if raw < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => UffdError::Permission { cause: e },
            _ => os_error("USERFAULTFD_IOC_NEW", 0, 0, e),
        });
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `UFFDIO_API` on a fresh descriptor; returns the features the kernel reports as available.
fn api(fd: &OwnedFd, features: Features) -> Result<Features, UffdError> {
    let mut a = sys::uffdio_api {
        api: UFFD_API,
        features: features.0,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes one uffdio_api.
    if unsafe { ioctl_ptr(fd.as_raw_fd(), UFFDIO_API, &mut a) } != 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            // EVENT_FORK without CAP_SYS_PTRACE.
            Some(libc::EPERM) => UffdError::Permission { cause: e },
            _ => os_error("UFFDIO_API", 0, 0, e),
        });
    }
    Ok(Features(a.features))
}

impl Uffd {
    /// Opens a userfaultfd that also serves faults raised inside system calls (it never sets
    /// `UFFD_USER_MODE_ONLY`), close-on-exec, and negotiates `opts.features`.
    ///
    /// Tries userfaultfd(2), then `/dev/userfaultfd` if the call is refused with EPERM; fails with
    /// [`UffdError::Permission`] (saying which privilege would do) if both are refused. The
    /// kernel allows one `UFFDIO_API` per descriptor, so the available features are queried on
    /// a throwaway descriptor first, and a shortfall is reported as
    /// [`UffdError::MissingFeatures`].
    ///
    /// The kernel turns on `WP_UNPOPULATED` whenever `WP_ASYNC` is asked for;
    /// [`features`](Uffd::features) then includes it.
    pub fn open(opts: &OpenOptions) -> Result<Uffd, UffdError> {
        let available = api(&open_raw(libc::O_CLOEXEC)?, Features::empty())?;
        let missing = opts.features.difference(available);
        if !missing.is_empty() {
            return Err(UffdError::MissingFeatures {
                wanted: opts.features,
                available,
                missing,
            });
        }
        let flags = libc::O_CLOEXEC | if opts.nonblocking { libc::O_NONBLOCK } else { 0 };
        let fd = open_raw(flags)?;
        api(&fd, opts.features)?;
        let mut features = opts.features;
        if features.contains(Features::WP_ASYNC) {
            features |= Features::WP_UNPOPULATED;
        }
        Ok(Uffd { fd, features })
    }

    /// Wraps a userfaultfd received from the kernel (e.g. [`Event::Fork`]), whose features were
    /// inherited from its parent.
    pub fn from_owned_fd(fd: OwnedFd, features: Features) -> Uffd {
        Uffd { fd, features }
    }

    /// The negotiated features.
    pub fn features(&self) -> Features {
        self.features
    }

    /// The descriptor (for polling, or closing in a forked child). Still owned by `self`.
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Registers `[start, start + len)` (page-aligned, whole VMAs of private anonymous memory
    /// here); returns the mask of `_UFFDIO_*` ioctls allowed on the range.
    pub fn register(&self, start: usize, len: usize, mode: RegisterMode) -> Result<u64, UffdError> {
        let mut m = 0u64;
        if mode.missing {
            m |= u64::from(sys::UFFDIO_REGISTER_MODE_MISSING);
        }
        if mode.wp {
            m |= u64::from(sys::UFFDIO_REGISTER_MODE_WP);
        }
        if mode.minor {
            m |= u64::from(sys::UFFDIO_REGISTER_MODE_MINOR);
        }
        let mut r = sys::uffdio_register {
            range: range(start, len),
            mode: m,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes one uffdio_register.
        if unsafe { ioctl_ptr(self.as_raw_fd(), UFFDIO_REGISTER, &mut r) } != 0 {
            return Err(os_error("UFFDIO_REGISTER", start, len, io::Error::last_os_error()));
        }
        Ok(r.ioctls)
    }

    /// Unregisters `[start, start + len)` and wakes the threads waiting there.
    pub fn unregister(&self, start: usize, len: usize) -> Result<(), UffdError> {
        let mut r = range(start, len);
        // SAFETY: UFFDIO_UNREGISTER reads one uffdio_range.
        if unsafe { ioctl_ptr(self.as_raw_fd(), UFFDIO_UNREGISTER, &mut r) } != 0 {
            return Err(os_error("UFFDIO_UNREGISTER", start, len, io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Turns the result of a request that reports progress (`copy`, `zeropage`, `move`,
    /// `updated` fields: bytes done, or -errno) into bytes done or the matching error.
    fn progress(op: &'static str, addr: usize, len: usize, rc: libc::c_int, field: i64) -> Result<usize, UffdError> {
        if rc == 0 {
            return Ok(len);
        }
        let e = last_errno();
        // The field holds bytes done (> 0) or -errno; the ioctl's own errno is authoritative.
        let done = usize::try_from(field).unwrap_or(0);
        match e {
            libc::EEXIST => Err(UffdError::Exists { done }),
            libc::EAGAIN => Err(UffdError::Again { done }),
            libc::EBUSY => Err(UffdError::Busy { done }),
            _ if done > 0 => Err(UffdError::Stopped {
                op,
                addr,
                done,
                errno: io::Error::from_raw_os_error(e),
            }),
            _ => Err(os_error(op, addr, len, io::Error::from_raw_os_error(e))),
        }
    }

    /// Does a request again page by page after the kernel refused all of it: a range must lie in
    /// one VMA, and the window's VMAs split where the program changes protections and stay split
    /// where the kernel cannot merge them again (neighbours that faulted in with different
    /// `anon_vma`s, as a JVM committing its heap a page at a time leaves them), which the caller
    /// cannot see. A page never spans two VMAs. `one(offset)` handles the page at `offset`.
    fn by_page(len: usize, mut one: impl FnMut(usize) -> Result<usize, UffdError>) -> Result<usize, UffdError> {
        let mut off = 0;
        while off < len {
            match one(off) {
                Ok(n) => off += n.max(PAGE_SIZE),
                Err(e) => return Err(e.after(off)),
            }
        }
        Ok(len)
    }

    /// True if a failed request of `len` bytes should be split by [`by_page`](Self::by_page):
    /// nothing was done and the kernel gave `errno`, its answer to a range crossing VMAs.
    fn crosses_vmas(r: &Result<usize, UffdError>, len: usize, errno: i32) -> bool {
        len > PAGE_SIZE && matches!(r, Err(e @ UffdError::Os { .. }) if e.raw_os_error() == Some(errno))
    }

    /// [`copy`](Self::copy) from `len` bytes at the address `src` rather than from a slice: for a
    /// source no slice may point into, such as memory another process writes (a brick's mapped
    /// segment).
    ///
    /// # Safety
    /// `src..src + len` must stay mapped and readable in this process for the whole call. Its
    /// bytes may change meanwhile (the kernel copies whatever they are); a range that is not
    /// readable fails with `EFAULT`, it does not fault.
    pub unsafe fn copy_from(&self, dst: usize, src: usize, len: usize, mode: CopyMode) -> Result<usize, UffdError> {
        let mut m = 0u64;
        if mode.write_protect {
            m |= u64::from(sys::UFFDIO_COPY_MODE_WP);
        }
        if mode.dontwake {
            m |= u64::from(sys::UFFDIO_COPY_MODE_DONTWAKE);
        }
        let mut c = sys::uffdio_copy {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: m,
            copy: 0,
        };
        // SAFETY: UFFDIO_COPY reads and writes one uffdio_copy; the kernel only reads from `src`,
        // which the caller keeps mapped for the call, and only writes pages that are missing in a
        // range registered with this uffd.
        let rc = unsafe { ioctl_ptr(self.as_raw_fd(), UFFDIO_COPY, &mut c) };
        let r = Self::progress("UFFDIO_COPY", dst, len, rc, c.copy);
        if Self::crosses_vmas(&r, len, libc::ENOENT) {
            // SAFETY: pages of the same source range, which the caller keeps mapped.
            return Self::by_page(len, |off| unsafe {
                self.copy_from(dst + off, src + off, PAGE_SIZE.min(len - off), mode)
            });
        }
        r
    }

    /// `UFFDIO_COPY`: atomically fills the missing pages at `dst` (page-aligned, registered with
    /// this uffd) with `src` (whole pages) and, unless `mode.dontwake`, wakes the threads waiting
    /// there. Returns the bytes installed (`src.len()`).
    ///
    /// A page that is already present stops the request: with nothing done before it the error
    /// is [`UffdError::Exists`] (the waiters are not woken: call [`wake`](Uffd::wake)); after
    /// partial progress the kernel reports it as [`UffdError::Again`] with `done > 0`.
    pub fn copy(&self, dst: usize, src: &[u8], mode: CopyMode) -> Result<usize, UffdError> {
        let mut m = 0u64;
        if mode.write_protect {
            m |= u64::from(sys::UFFDIO_COPY_MODE_WP);
        }
        if mode.dontwake {
            m |= u64::from(sys::UFFDIO_COPY_MODE_DONTWAKE);
        }
        let mut c = sys::uffdio_copy {
            dst: dst as u64,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode: m,
            copy: 0,
        };
        // SAFETY: UFFDIO_COPY reads and writes one uffdio_copy; the kernel only reads from `src`,
        // which is borrowed for the duration of the call, and only writes pages that are missing
        // in a range registered with this uffd.
        let rc = unsafe { ioctl_ptr(self.as_raw_fd(), UFFDIO_COPY, &mut c) };
        let r = Self::progress("UFFDIO_COPY", dst, src.len(), rc, c.copy);
        if Self::crosses_vmas(&r, src.len(), libc::ENOENT) {
            return Self::by_page(src.len(), |off| {
                self.copy(dst + off, &src[off..(off + PAGE_SIZE).min(src.len())], mode)
            });
        }
        r
    }

    /// `UFFDIO_ZEROPAGE`: maps the shared zero page at the missing pages of `[dst, dst + len)`
    /// (a later write allocates a private page). Progress and errors as for [`copy`](Uffd::copy).
    pub fn zeropage(&self, dst: usize, len: usize, dontwake: bool) -> Result<usize, UffdError> {
        let mut z = sys::uffdio_zeropage {
            range: range(dst, len),
            mode: if dontwake {
                u64::from(sys::UFFDIO_ZEROPAGE_MODE_DONTWAKE)
            } else {
                0
            },
            zeropage: 0,
        };
        // SAFETY: UFFDIO_ZEROPAGE reads and writes one uffdio_zeropage.
        let rc = unsafe { ioctl_ptr(self.as_raw_fd(), UFFDIO_ZEROPAGE, &mut z) };
        let r = Self::progress("UFFDIO_ZEROPAGE", dst, len, rc, z.zeropage);
        if Self::crosses_vmas(&r, len, libc::ENOENT) {
            return Self::by_page(len, |off| self.zeropage(dst + off, PAGE_SIZE, dontwake));
        }
        r
    }

    /// `UFFDIO_WAKE`: wakes the threads waiting on faults in `[start, start + len)`.
    pub fn wake(&self, start: usize, len: usize) -> Result<(), UffdError> {
        let mut r = range(start, len);
        // SAFETY: UFFDIO_WAKE reads one uffdio_range.
        if unsafe { ioctl_ptr(self.as_raw_fd(), UFFDIO_WAKE, &mut r) } != 0 {
            return Err(os_error("UFFDIO_WAKE", start, len, io::Error::last_os_error()));
        }
        Ok(())
    }

    /// `UFFDIO_WRITEPROTECT`: write-protects (`protect`) or un-protects `[start, start + len)`,
    /// a range registered with [`RegisterMode::wp`]. Un-protecting wakes the threads waiting on
    /// write-protect faults there unless `dontwake` (ignored when protecting, which wakes no one;
    /// the kernel would refuse the combination with EINVAL).
    pub fn write_protect(&self, start: usize, len: usize, protect: bool, dontwake: bool) -> Result<(), UffdError> {
        let mut mode = 0u64;
        if protect {
            mode |= u64::from(UFFDIO_WRITEPROTECT_MODE_WP);
        }
        // The kernel refuses DONTWAKE with WP (EINVAL); protecting wakes nobody anyway.
        if dontwake && !protect {
            mode |= u64::from(UFFDIO_WRITEPROTECT_MODE_DONTWAKE);
        }
        let mut w = sys::uffdio_writeprotect {
            range: range(start, len),
            mode,
        };
        // SAFETY: UFFDIO_WRITEPROTECT reads one uffdio_writeprotect.
        if unsafe { ioctl_ptr(self.as_raw_fd(), UFFDIO_WRITEPROTECT, &mut w) } != 0 {
            return Err(os_error("UFFDIO_WRITEPROTECT", start, len, io::Error::last_os_error()));
        }
        Ok(())
    }

    /// `UFFDIO_MOVE` (Linux 6.8, feature `MOVE`): moves the present pages of `[src, src + len)` to
    /// the missing pages at `dst` without copying; the source pages become missing. Atomic per
    /// page with respect to other threads' accesses (they fault and wait). Returns the bytes
    /// moved.
    ///
    /// The destination must be registered with *this* uffd; both ranges private anonymous with
    /// equal protections. [`UffdError::Busy`]: a source page is shared (copy-on-write with a
    /// forked child) or pinned. A source hole fails with ENOENT unless `allow_src_holes`.
    ///
    /// # Safety
    /// Both ranges are memory this process set aside for raw-address use (a window registered
    /// here, a staging area) that no Rust reference points into while the call runs: the
    /// source's contents vanish from under any such reference and the destination's appear.
    pub unsafe fn move_pages(&self, dst: usize, src: usize, len: usize, mode: MoveMode) -> Result<usize, UffdError> {
        let mut m = 0u64;
        if mode.dontwake {
            m |= u64::from(UFFDIO_MOVE_MODE_DONTWAKE);
        }
        if mode.allow_src_holes {
            m |= u64::from(UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES);
        }
        let mut mv = sys::uffdio_move {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: m,
            move_: 0,
        };
        // SAFETY: UFFDIO_MOVE reads and writes one uffdio_move.
        let rc = unsafe { ioctl_ptr(self.as_raw_fd(), UFFDIO_MOVE, &mut mv) };
        let r = Self::progress("UFFDIO_MOVE", src, len, rc, mv.move_);
        // MOVE says EINVAL when either range crosses VMAs.
        if Self::crosses_vmas(&r, len, libc::EINVAL) {
            // SAFETY: pages of the same two ranges, which the caller promised (see # Safety).
            return Self::by_page(len, |off| unsafe {
                self.move_pages(dst + off, src + off, PAGE_SIZE, mode)
            });
        }
        r
    }

    /// `UFFDIO_POISON` (Linux 6.6, feature `POISON`): marks the missing pages of
    /// `[start, start + len)` poisoned: a later access raises SIGBUS, and a system call touching
    /// them fails with EFAULT. Present pages give [`UffdError::Exists`]. Returns bytes marked.
    pub fn poison(&self, start: usize, len: usize, dontwake: bool) -> Result<usize, UffdError> {
        let mut p = sys::uffdio_poison {
            range: range(start, len),
            mode: if dontwake {
                u64::from(UFFDIO_POISON_MODE_DONTWAKE)
            } else {
                0
            },
            updated: 0,
        };
        // SAFETY: UFFDIO_POISON reads and writes one uffdio_poison.
        let rc = unsafe { ioctl_ptr(self.as_raw_fd(), UFFDIO_POISON, &mut p) };
        let r = Self::progress("UFFDIO_POISON", start, len, rc, p.updated);
        if Self::crosses_vmas(&r, len, libc::ENOENT) {
            return Self::by_page(len, |off| self.poison(start + off, PAGE_SIZE, dontwake));
        }
        r
    }

    /// Reads up to `max` messages (at most 64 per call) with one `read(2)` and appends them to
    /// `out`; returns how many. Blocks until one is queued on a blocking descriptor; returns
    /// `Ok(0)` when none is queued on a non-blocking one, and for `max == 0`. EINTR is retried.
    ///
    /// Reading an event message lets its originator (`madvise`, `munmap`, `mremap`, `fork`)
    /// continue.
    pub fn read_events(&self, out: &mut Vec<Event>, max: usize) -> Result<usize, UffdError> {
        const MAX_PER_READ: usize = 64;
        if max == 0 {
            return Ok(0);
        }
        let want = max.min(MAX_PER_READ) * MSG_SIZE;
        let mut buf = [0u8; MAX_PER_READ * MSG_SIZE];
        let n = loop {
            // SAFETY: read(2) writes at most `want` bytes, and `buf` holds at least that many.
            let n = unsafe { libc::read(self.as_raw_fd(), buf.as_mut_ptr().cast(), want) };
            if n >= 0 {
                break n as usize;
            }
            match last_errno() {
                libc::EINTR => continue,
                libc::EAGAIN => return Ok(0),
                e => return Err(os_error("read(userfaultfd)", 0, want, io::Error::from_raw_os_error(e))),
            }
        };
        let mut count = 0;
        for msg in buf[..n.min(want)].chunks_exact(MSG_SIZE) {
            out.push(parse_msg(msg));
            count += 1;
        }
        Ok(count)
    }

    /// Waits up to `timeout_ms` (-1: forever, 0: just look) for a message; true if one is
    /// readable. An interrupted wait (EINTR) is restarted with the full timeout.
    pub fn poll_readable(&self, timeout_ms: i32) -> Result<bool, UffdError> {
        let mut p = libc::pollfd {
            fd: self.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: poll(2) on one valid, exclusively borrowed pollfd.
            let rc = unsafe { libc::poll(&mut p, 1, timeout_ms) };
            if rc >= 0 {
                return Ok(rc > 0 && p.revents & libc::POLLIN != 0);
            }
            let e = last_errno();
            if e != libc::EINTR {
                return Err(os_error("poll(userfaultfd)", 0, 0, io::Error::from_raw_os_error(e)));
            }
        }
    }
}

impl AsRawFd for Uffd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl std::os::fd::AsFd for Uffd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }
}
