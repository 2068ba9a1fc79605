//! A small safe wrapper over Linux userfaultfd, `PAGEMAP_SCAN` and the few raw memory calls the
//! rackmem runtime needs. All of the data path's `unsafe` lives here.
//!
//! What it is for: opening a userfaultfd *without* `UFFD_USER_MODE_ONLY` (so that system calls
//! such as `read(2)` into missing pages are served, not failed with EFAULT), negotiating features
//! (`WP_ASYNC`, `MOVE`, events), registering ranges, resolving faults (`COPY` with and without
//! write-protect, `ZEROPAGE`, `WAKE`, `WRITEPROTECT`, `MOVE`, `POISON`), reading fault and event
//! messages, and finding written pages with `PAGEMAP_SCAN` on `/proc/self/pagemap`.
//!
//! What it is not: it knows nothing of bricks, windows or policies. The ioctls are thread-safe in
//! the kernel, so [`Uffd`] is `Send + Sync`; callers decide who reads messages.
//!
//! Memory calls go through the raw system calls, never the C library's wrappers: this crate runs
//! inside `librackmem.so`, which interposes `mmap`, `munmap` and `madvise` itself.

mod mem;
mod pagemap;

pub use mem::{break_cow, madvise_dontfork, madvise_dontneed, Mapping, PAGE_SIZE};
pub use pagemap::{PageRegion, Pagemap, ScanRequest};

use linux_raw_sys::general as sys;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `_IOWR(type, nr, size)`.
const fn iowr(ty: u32, nr: u32, size: usize) -> u32 {
    (3 << 30) | ((size as u32) << 16) | (ty << 8) | nr
}
const UFFDIO_API: u32 = iowr(0xAA, 0x3F, std::mem::size_of::<sys::uffdio_api>());
const UFFDIO_REGISTER: u32 = iowr(0xAA, 0x00, std::mem::size_of::<sys::uffdio_register>());
const UFFDIO_UNREGISTER: u32 = (2 << 30) | (16 << 16) | (0xAA << 8) | 0x01;
const UFFDIO_WAKE: u32 = (2 << 30) | (16 << 16) | (0xAA << 8) | 0x02;
const UFFDIO_COPY: u32 = iowr(0xAA, 0x03, std::mem::size_of::<sys::uffdio_copy>());
const UFFDIO_ZEROPAGE: u32 = iowr(0xAA, 0x04, std::mem::size_of::<sys::uffdio_zeropage>());
const UFFDIO_MOVE: u32 = iowr(0xAA, 0x05, std::mem::size_of::<sys::uffdio_move>());
const UFFDIO_WRITEPROTECT: u32 = iowr(0xAA, 0x06, std::mem::size_of::<sys::uffdio_writeprotect>());
const UFFDIO_POISON: u32 = iowr(0xAA, 0x08, std::mem::size_of::<sys::uffdio_poison>());
/// `_IO(0xAA, 0x00)` on `/dev/userfaultfd`.
const USERFAULTFD_IOC_NEW: u32 = 0xAA << 8;
const UFFD_API: u64 = 0xAA;

/// A set of userfaultfd features (`UFFD_FEATURE_*`).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Features(pub u64);

macro_rules! features {
    ($($name:ident = $val:expr),* $(,)?) => {
        impl Features {
            $(
                #[doc = concat!("`UFFD_FEATURE_", stringify!($name), "`.")]
                pub const $name: Features = Features($val as u64);
            )*
            const NAMES: &'static [(&'static str, u64)] = &[$((stringify!($name), $val as u64)),*];
        }
    };
}

features! {
    PAGEFAULT_FLAG_WP = sys::UFFD_FEATURE_PAGEFAULT_FLAG_WP,
    EVENT_FORK = sys::UFFD_FEATURE_EVENT_FORK,
    EVENT_REMAP = sys::UFFD_FEATURE_EVENT_REMAP,
    EVENT_REMOVE = sys::UFFD_FEATURE_EVENT_REMOVE,
    MISSING_HUGETLBFS = sys::UFFD_FEATURE_MISSING_HUGETLBFS,
    MISSING_SHMEM = sys::UFFD_FEATURE_MISSING_SHMEM,
    EVENT_UNMAP = sys::UFFD_FEATURE_EVENT_UNMAP,
    SIGBUS = sys::UFFD_FEATURE_SIGBUS,
    THREAD_ID = sys::UFFD_FEATURE_THREAD_ID,
    MINOR_HUGETLBFS = sys::UFFD_FEATURE_MINOR_HUGETLBFS,
    MINOR_SHMEM = sys::UFFD_FEATURE_MINOR_SHMEM,
    EXACT_ADDRESS = sys::UFFD_FEATURE_EXACT_ADDRESS,
    WP_HUGETLBFS_SHMEM = sys::UFFD_FEATURE_WP_HUGETLBFS_SHMEM,
    WP_UNPOPULATED = sys::UFFD_FEATURE_WP_UNPOPULATED,
    POISON = sys::UFFD_FEATURE_POISON,
    WP_ASYNC = sys::UFFD_FEATURE_WP_ASYNC,
    MOVE = sys::UFFD_FEATURE_MOVE,
}

impl Features {
    /// True if every feature of `other` is in `self`.
    pub fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Features {
    type Output = Features;
    fn bitor(self, rhs: Features) -> Features {
        Features(self.0 | rhs.0)
    }
}

impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Self::NAMES
            .iter()
            .filter(|(_, v)| self.0 & v != 0)
            .map(|(n, _)| *n)
            .collect();
        if names.is_empty() {
            f.write_str("(none)")
        } else {
            f.write_str(&names.join("|"))
        }
    }
}

impl fmt::Debug for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Features({self})")
    }
}

/// Errors of userfaultfd and memory calls. The partial-progress cases are distinct because the
/// caller must act on them (wake after `Exists`, read events then retry after `Again`).
#[derive(Debug, thiserror::Error)]
pub enum UffdError {
    /// No userfaultfd could be opened for lack of privilege.
    #[error(
        "cannot open a userfaultfd with kernel-mode faults ({cause}): run as root, grant CAP_SYS_PTRACE, \
         give this user read/write access to /dev/userfaultfd, or set the sysctl vm.unprivileged_userfaultfd=1"
    )]
    Permission {
        /// What the kernel said.
        cause: io::Error,
    },
    /// The kernel lacks features the caller needs.
    #[error("this kernel's userfaultfd lacks {missing} (wanted {wanted}, available {available}); rackmem needs Linux 6.8 or newer")]
    MissingFeatures {
        /// What was asked for.
        wanted: Features,
        /// What the kernel offers.
        available: Features,
        /// The difference.
        missing: Features,
    },
    /// `EEXIST`: a page in the range is already mapped; `done` bytes were handled before it.
    #[error("page already present after {done} bytes")]
    Exists {
        /// Bytes handled before the present page.
        done: usize,
    },
    /// `EAGAIN`: an event (REMOVE, UNMAP, ...) is pending; read events, then retry from `done`.
    #[error("userfaultfd event pending after {done} bytes")]
    Again {
        /// Bytes handled before the interruption.
        done: usize,
    },
    /// `EBUSY` from `UFFDIO_MOVE`: the page is shared (e.g. with a forked child) or pinned;
    /// `done` bytes were moved before it.
    #[error("page is shared or pinned and cannot be moved (after {done} bytes)")]
    Busy {
        /// Bytes handled before the busy page.
        done: usize,
    },
    /// A multi-page operation failed part-way for another reason; `done` bytes were handled.
    #[error("{op} at {addr:#x} stopped after {done} bytes: {errno}")]
    Stopped {
        /// The operation.
        op: &'static str,
        /// The address of the request.
        addr: usize,
        /// Bytes handled before the failure.
        done: usize,
        /// The error.
        errno: io::Error,
    },
    /// Any other failure of a system call.
    #[error("{op} at {addr:#x}+{len:#x}: {errno}")]
    Os {
        /// The operation.
        op: &'static str,
        /// The address involved.
        addr: usize,
        /// The length involved.
        len: usize,
        /// The error.
        errno: io::Error,
    },
}

impl UffdError {
    /// Bytes a multi-page operation handled before it failed (0 for other errors).
    pub fn done(&self) -> usize {
        match self {
            UffdError::Exists { done } | UffdError::Again { done } | UffdError::Busy { done } => *done,
            UffdError::Stopped { done, .. } => *done,
            _ => 0,
        }
    }
}

fn os(op: &'static str, addr: usize, len: usize) -> UffdError {
    UffdError::Os {
        op,
        addr,
        len,
        errno: io::Error::last_os_error(),
    }
}

/// How to open a userfaultfd.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// Features to negotiate; opening fails if the kernel lacks any.
    pub features: Features,
    /// `O_NONBLOCK`: reads return nothing instead of sleeping.
    pub nonblocking: bool,
}

/// Registration modes.
#[derive(Debug, Clone, Copy, Default)]
pub struct RegisterMode {
    /// Report faults on missing pages.
    pub missing: bool,
    /// Track writes to write-protected pages (with `WP_ASYNC`, resolved in the kernel).
    pub wp: bool,
    /// Minor faults (shmem/hugetlbfs only).
    pub minor: bool,
}

/// Options of `UFFDIO_COPY`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CopyMode {
    /// Install the pages write-protected (`UFFDIO_COPY_MODE_WP`).
    pub write_protect: bool,
    /// Do not wake the faulting threads.
    pub dontwake: bool,
}

/// Options of `UFFDIO_MOVE`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MoveMode {
    /// Do not wake threads waiting on the destination.
    pub dontwake: bool,
    /// Skip holes in the source instead of failing with ENOENT.
    pub allow_src_holes: bool,
}

/// A message read from a userfaultfd.
#[derive(Debug)]
pub enum Event {
    /// A thread faulted on a registered page.
    Pagefault {
        /// Page-aligned faulting address.
        addr: usize,
        /// The access was a write.
        write: bool,
        /// A write-protect fault.
        wp: bool,
        /// A minor fault.
        minor: bool,
        /// The faulting thread (with `THREAD_ID`), else 0.
        thread_id: u32,
    },
    /// A fork created a child userfaultfd (with `EVENT_FORK`).
    Fork {
        /// The child's userfaultfd.
        child: OwnedFd,
    },
    /// `mremap` moved a registered range.
    Remap {
        /// Old start.
        from: usize,
        /// New start.
        to: usize,
        /// Length.
        len: usize,
    },
    /// `madvise(MADV_DONTNEED/REMOVE)` is about to drop `[start, end)`.
    Remove {
        /// Start.
        start: usize,
        /// End.
        end: usize,
    },
    /// `munmap` of `[start, end)`.
    Unmap {
        /// Start.
        start: usize,
        /// End.
        end: usize,
    },
    /// An event this wrapper does not know.
    Unknown {
        /// The event code.
        event: u8,
    },
}

/// An open userfaultfd. Thread-safe: every operation is one ioctl or read.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    features: Features,
}

fn ioctl<T>(fd: RawFd, req: u32, arg: &mut T) -> libc::c_int {
    // SAFETY: `arg` is a valid, exclusively borrowed struct of the type `req` expects (each
    // caller pairs the request number with its uapi struct).
    unsafe { libc::ioctl(fd, req as libc::c_ulong, arg as *mut T) }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl Uffd {
    /// Opens a userfaultfd that also handles faults raised inside system calls, and negotiates
    /// `opts.features`.
    pub fn open(opts: &OpenOptions) -> Result<Uffd, UffdError> {
        let flags = libc::O_CLOEXEC | if opts.nonblocking { libc::O_NONBLOCK } else { 0 };
        // SAFETY: the userfaultfd system call takes flags only and returns a new fd or -1.
        let raw = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as RawFd;
        let fd = if raw >= 0 {
            // SAFETY: `raw` is a fresh fd that nothing else owns.
            unsafe { OwnedFd::from_raw_fd(raw) }
        } else {
            let first = io::Error::last_os_error();
            Self::open_dev(flags).map_err(|_| UffdError::Permission { cause: first })?
        };
        let mut api = sys::uffdio_api {
            api: UFFD_API,
            features: 0,
            ioctls: 0,
        };
        // Query what the kernel offers with a throwaway fd: UFFDIO_API may be called once per fd.
        let available = {
            // SAFETY: as above.
            let probe = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) } as RawFd;
            let probe = if probe >= 0 {
                // SAFETY: fresh fd.
                unsafe { OwnedFd::from_raw_fd(probe) }
            } else {
                Self::open_dev(libc::O_CLOEXEC).map_err(|e| UffdError::Permission { cause: e })?
            };
            let mut q = sys::uffdio_api {
                api: UFFD_API,
                features: 0,
                ioctls: 0,
            };
            if ioctl(probe.as_raw_fd(), UFFDIO_API, &mut q) != 0 {
                return Err(os("UFFDIO_API", 0, 0));
            }
            Features(q.features)
        };
        if !available.contains(opts.features) {
            return Err(UffdError::MissingFeatures {
                wanted: opts.features,
                available,
                missing: Features(opts.features.0 & !available.0),
            });
        }
        api.features = opts.features.0;
        if ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) != 0 {
            return Err(os("UFFDIO_API", 0, 0));
        }
        Ok(Uffd {
            fd,
            features: opts.features,
        })
    }

    fn open_dev(flags: i32) -> Result<OwnedFd, io::Error> {
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/userfaultfd")?;
        // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its argument value.
        let raw = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as libc::c_ulong, flags) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd returned by the kernel.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    }

    /// Wraps a userfaultfd received from the kernel (e.g. in a fork event).
    pub fn from_owned_fd(fd: OwnedFd, features: Features) -> Uffd {
        Uffd { fd, features }
    }

    /// The negotiated features.
    pub fn features(&self) -> Features {
        self.features
    }

    /// The file descriptor (for polling).
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Registers `[start, start+len)`; returns the ioctls allowed on it.
    pub fn register(&self, start: usize, len: usize, mode: RegisterMode) -> Result<u64, UffdError> {
        let mut m = 0u64;
        if mode.missing {
            m |= sys::UFFDIO_REGISTER_MODE_MISSING as u64;
        }
        if mode.wp {
            m |= sys::UFFDIO_REGISTER_MODE_WP as u64;
        }
        if mode.minor {
            m |= sys::UFFDIO_REGISTER_MODE_MINOR as u64;
        }
        let mut r = sys::uffdio_register {
            range: sys::uffdio_range {
                start: start as u64,
                len: len as u64,
            },
            mode: m,
            ioctls: 0,
        };
        if ioctl(self.as_raw_fd(), UFFDIO_REGISTER, &mut r) != 0 {
            return Err(os("UFFDIO_REGISTER", start, len));
        }
        Ok(r.ioctls)
    }

    /// Unregisters a range.
    pub fn unregister(&self, start: usize, len: usize) -> Result<(), UffdError> {
        let mut r = sys::uffdio_range {
            start: start as u64,
            len: len as u64,
        };
        if ioctl(self.as_raw_fd(), UFFDIO_UNREGISTER, &mut r) != 0 {
            return Err(os("UFFDIO_UNREGISTER", start, len));
        }
        Ok(())
    }

    /// Turns a partial-progress ioctl result into bytes done or the matching error.
    fn progress(op: &'static str, addr: usize, len: usize, rc: libc::c_int, field: i64) -> Result<usize, UffdError> {
        if rc == 0 {
            return Ok(len);
        }
        let e = errno();
        let done = if field > 0 { field as usize } else { 0 };
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
            _ => Err(UffdError::Os {
                op,
                addr,
                len,
                errno: io::Error::from_raw_os_error(e),
            }),
        }
    }

    /// `UFFDIO_COPY`: atomically installs `src` at `dst` (page-aligned, whole pages) and, unless
    /// `dontwake`, wakes threads waiting there. Safe: the kernel only fills missing pages of a
    /// range registered with this uffd, so no memory the caller can see changes underneath it.
    pub fn copy(&self, dst: usize, src: &[u8], mode: CopyMode) -> Result<usize, UffdError> {
        let mut m = 0u64;
        if mode.write_protect {
            m |= sys::UFFDIO_COPY_MODE_WP as u64;
        }
        if mode.dontwake {
            m |= sys::UFFDIO_COPY_MODE_DONTWAKE as u64;
        }
        let mut c = sys::uffdio_copy {
            dst: dst as u64,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode: m,
            copy: 0,
        };
        let rc = ioctl(self.as_raw_fd(), UFFDIO_COPY, &mut c);
        Self::progress("UFFDIO_COPY", dst, src.len(), rc, c.copy)
    }

    /// `UFFDIO_ZEROPAGE`: maps the shared zero page (read-only until written).
    pub fn zeropage(&self, dst: usize, len: usize, dontwake: bool) -> Result<usize, UffdError> {
        let mut z = sys::uffdio_zeropage {
            range: sys::uffdio_range {
                start: dst as u64,
                len: len as u64,
            },
            mode: if dontwake {
                sys::UFFDIO_ZEROPAGE_MODE_DONTWAKE as u64
            } else {
                0
            },
            zeropage: 0,
        };
        let rc = ioctl(self.as_raw_fd(), UFFDIO_ZEROPAGE, &mut z);
        Self::progress("UFFDIO_ZEROPAGE", dst, len, rc, z.zeropage)
    }

    /// `UFFDIO_WAKE`: wakes threads waiting on faults in the range.
    pub fn wake(&self, start: usize, len: usize) -> Result<(), UffdError> {
        let mut r = sys::uffdio_range {
            start: start as u64,
            len: len as u64,
        };
        if ioctl(self.as_raw_fd(), UFFDIO_WAKE, &mut r) != 0 {
            return Err(os("UFFDIO_WAKE", start, len));
        }
        Ok(())
    }

    /// `UFFDIO_WRITEPROTECT`: protects or un-protects a range.
    pub fn write_protect(&self, start: usize, len: usize, protect: bool, dontwake: bool) -> Result<(), UffdError> {
        let mut w = sys::uffdio_writeprotect {
            range: sys::uffdio_range {
                start: start as u64,
                len: len as u64,
            },
            mode: u64::from(protect) | if dontwake { 2 } else { 0 },
        };
        if ioctl(self.as_raw_fd(), UFFDIO_WRITEPROTECT, &mut w) != 0 {
            return Err(os("UFFDIO_WRITEPROTECT", start, len));
        }
        Ok(())
    }

    /// `UFFDIO_MOVE`: moves present pages from `src` to `dst` (registered with this uffd) without
    /// copying; atomic per page with respect to other threads' accesses.
    pub fn move_pages(&self, dst: usize, src: usize, len: usize, mode: MoveMode) -> Result<usize, UffdError> {
        let mut m = sys::uffdio_move {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: u64::from(mode.dontwake) | if mode.allow_src_holes { 2 } else { 0 },
            move_: 0,
        };
        let rc = ioctl(self.as_raw_fd(), UFFDIO_MOVE, &mut m);
        Self::progress("UFFDIO_MOVE", src, len, rc, m.move_)
    }

    /// `UFFDIO_POISON`: later accesses to the range raise SIGBUS (system calls get EFAULT).
    pub fn poison(&self, start: usize, len: usize, dontwake: bool) -> Result<usize, UffdError> {
        let mut p = sys::uffdio_poison {
            range: sys::uffdio_range {
                start: start as u64,
                len: len as u64,
            },
            mode: u64::from(dontwake),
            updated: 0,
        };
        let rc = ioctl(self.as_raw_fd(), UFFDIO_POISON, &mut p);
        Self::progress("UFFDIO_POISON", start, len, rc, p.updated)
    }

    /// Reads up to `max` messages into `out`. On a non-blocking fd, returns `Ok(0)` when none is
    /// queued.
    pub fn read_events(&self, out: &mut Vec<Event>, max: usize) -> Result<usize, UffdError> {
        const MSG: usize = 32;
        let mut buf = [0u8; MSG * 64];
        let want = max.clamp(1, 64) * MSG;
        let n = loop {
            // SAFETY: reading into a local buffer of at least `want` bytes.
            let n = unsafe { libc::read(self.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, want) };
            if n >= 0 {
                break n as usize;
            }
            match errno() {
                libc::EINTR => continue,
                libc::EAGAIN => return Ok(0),
                _ => return Err(os("read(userfaultfd)", 0, want)),
            }
        };
        let u64_at = |m: &[u8], o: usize| u64::from_ne_bytes(m[o..o + 8].try_into().unwrap_or([0; 8]));
        let mut count = 0;
        for m in buf[..n].chunks_exact(MSG) {
            let ev = match m[0] as u32 {
                sys::UFFD_EVENT_PAGEFAULT => {
                    let flags = u64_at(m, 8);
                    Event::Pagefault {
                        addr: (u64_at(m, 16) as usize) & !(PAGE_SIZE - 1),
                        write: flags & sys::UFFD_PAGEFAULT_FLAG_WRITE as u64 != 0,
                        wp: flags & sys::UFFD_PAGEFAULT_FLAG_WP as u64 != 0,
                        minor: flags & sys::UFFD_PAGEFAULT_FLAG_MINOR as u64 != 0,
                        thread_id: u32::from_ne_bytes(m[24..28].try_into().unwrap_or([0; 4])),
                    }
                }
                sys::UFFD_EVENT_FORK => {
                    let ufd = u32::from_ne_bytes(m[8..12].try_into().unwrap_or([0; 4])) as RawFd;
                    // SAFETY: the kernel installed this fd for us with the fork event; we own it.
                    let child = unsafe { OwnedFd::from_raw_fd(ufd) };
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
                other => Event::Unknown { event: other as u8 },
            };
            out.push(ev);
            count += 1;
        }
        Ok(count)
    }

    /// Waits up to `timeout_ms` (-1: forever) for a message; true if one is readable.
    pub fn poll_readable(&self, timeout_ms: i32) -> Result<bool, UffdError> {
        let mut p = libc::pollfd {
            fd: self.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&mut p, 1, timeout_ms) };
            if rc >= 0 {
                return Ok(rc > 0);
            }
            if errno() != libc::EINTR {
                return Err(os("poll(userfaultfd)", 0, 0));
            }
        }
    }
}
