//! A small safe wrapper over Linux userfaultfd, `PAGEMAP_SCAN` and the few raw memory calls the
//! rackmem runtime needs. All of the data path's `unsafe` lives here (the LD_PRELOAD shim aside).
//!
//! What it is for: opening a userfaultfd *without* `UFFD_USER_MODE_ONLY` (so that system calls
//! such as `read(2)` into missing pages are served, not failed with EFAULT), negotiating features
//! (`WP_ASYNC`, `MOVE`, `POISON`, events), registering ranges, resolving faults (`COPY` with and
//! without write-protect, `ZEROPAGE`, `WAKE`, `WRITEPROTECT`, `MOVE`, `POISON`), reading fault
//! and event messages ([`Event`]), finding written or present pages with `PAGEMAP_SCAN` on
//! `/proc/self/pagemap` ([`Pagemap`]), and owning the anonymous mappings they work on
//! ([`Mapping`]), and the shared memory a brick hands to nodes on its own host
//! ([`SharedMemory`], [`send_with_fd`], [`recv_with_fds`]), and a [`Doorbell`] that lets a
//! thread block on a descriptor without a timeout yet be woken by another ([`wait_readable`]).
//!
//! What it is not: it knows nothing of bricks, windows, segments or policies, starts no thread
//! and keeps no state beyond the file descriptors. Who reads messages, and when, is the caller's
//! choice.
//!
//! # Concurrency
//! [`Uffd`] and [`Pagemap`] are `Send + Sync`: every method is one system call (or a loop of
//! them) on a shared descriptor, and the kernel serializes what must be serialized. Several
//! threads may resolve faults on one [`Uffd`] at once; two threads reading messages each get
//! different messages.
//!
//! # What "safe" means here
//! The fault-resolving calls take raw addresses. They never create Rust references to the memory
//! they touch, but they do change it (`MOVE` takes pages away, `madvise_dontneed` drops them,
//! `POISON` makes them fatal to touch). Use them only on ranges that this process set aside for
//! userfaultfd (a [`Mapping`]) and that no Rust reference points into; pointing them at the heap
//! or a stack would break the aliasing guarantees of the code that owns that memory.
//!
//! Memory calls go through the raw system calls, never the C library's wrappers: this crate runs
//! inside `librackmem.so`, which interposes `mmap`, `munmap` and `madvise` itself.

mod bell;
mod mem;
mod pagemap;
mod shared;

pub use bell::{poll_readable, raise_open_files_limit, set_listen_backlog, wait_readable, Doorbell, Woken};
pub use mem::{
    break_cow, madvise_dontfork, madvise_dontneed, move_mapping, mprotect, remap_anonymous, try_break_cow, Mapping,
    PAGE_SIZE,
};
pub use pagemap::{page_is, pm_scan, PageRegion, Pagemap, ScanRequest};
pub use shared::{peer_credentials, recv_with_fds, send_with_fd, PeerCredentials, SharedMemory};

use linux_raw_sys::general as sys;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// `_IOC(dir, type, nr, size)` as the kernel encodes it on x86_64 and aarch64.
const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (ty << 8) | nr
}
/// `_IOWR(type, nr, size)`.
pub(crate) const fn iowr(ty: u32, nr: u32, size: usize) -> u32 {
    ioc(3, ty, nr, size)
}

const UFFDIO: u32 = 0xAA;
const UFFDIO_API: u32 = linux_raw_sys::ioctl::UFFDIO_API;
const UFFDIO_REGISTER: u32 = linux_raw_sys::ioctl::UFFDIO_REGISTER;
const UFFDIO_UNREGISTER: u32 = linux_raw_sys::ioctl::UFFDIO_UNREGISTER;
const UFFDIO_WAKE: u32 = linux_raw_sys::ioctl::UFFDIO_WAKE;
const UFFDIO_COPY: u32 = linux_raw_sys::ioctl::UFFDIO_COPY;
const UFFDIO_ZEROPAGE: u32 = linux_raw_sys::ioctl::UFFDIO_ZEROPAGE;
const UFFDIO_WRITEPROTECT: u32 = linux_raw_sys::ioctl::UFFDIO_WRITEPROTECT;
// linux-raw-sys 0.12 has the structs but not these request numbers: built by hand.
const UFFDIO_MOVE: u32 = iowr(UFFDIO, 0x05, std::mem::size_of::<sys::uffdio_move>());
const UFFDIO_POISON: u32 = iowr(UFFDIO, 0x08, std::mem::size_of::<sys::uffdio_poison>());
/// `_IO(0xAA, 0x00)` on `/dev/userfaultfd`.
const USERFAULTFD_IOC_NEW: u32 = ioc(0, UFFDIO, 0x00, 0);
const UFFD_API: u64 = 0xAA;
// Mode bits linux-raw-sys 0.12 lacks (<linux/userfaultfd.h>).
const UFFDIO_WRITEPROTECT_MODE_WP: u32 = 1 << 0;
const UFFDIO_WRITEPROTECT_MODE_DONTWAKE: u32 = 1 << 1;
const UFFDIO_MOVE_MODE_DONTWAKE: u32 = 1 << 0;
const UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES: u32 = 1 << 1;
const UFFDIO_POISON_MODE_DONTWAKE: u32 = 1 << 0;

// The hand-built encoder must agree with the request numbers linux-raw-sys ships.
const _: () = assert!(iowr(UFFDIO, 0x03, std::mem::size_of::<sys::uffdio_copy>()) == UFFDIO_COPY);
const _: () = assert!(iowr(UFFDIO, 0x3F, std::mem::size_of::<sys::uffdio_api>()) == UFFDIO_API);
const _: () = assert!(ioc(2, UFFDIO, 0x01, std::mem::size_of::<sys::uffdio_range>()) == UFFDIO_UNREGISTER);
const _: () = assert!(std::mem::size_of::<sys::uffdio_move>() == 40);
const _: () = assert!(std::mem::size_of::<sys::uffdio_poison>() == 32);
const _: () = assert!(std::mem::size_of::<sys::uffd_msg>() == MSG_SIZE);

/// A set of userfaultfd features (`UFFD_FEATURE_*`), combined with `|`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
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
    /// No feature.
    pub const fn empty() -> Features {
        Features(0)
    }

    /// The raw `UFFD_FEATURE_*` bits.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// True if every feature of `other` is in `self`.
    pub const fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }

    /// True if no feature is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The features of `self` that are not in `other`.
    pub const fn difference(self, other: Features) -> Features {
        Features(self.0 & !other.0)
    }
}

impl std::ops::BitOr for Features {
    type Output = Features;
    fn bitor(self, rhs: Features) -> Features {
        Features(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for Features {
    fn bitor_assign(&mut self, rhs: Features) {
        self.0 |= rhs.0;
    }
}

impl std::ops::BitAnd for Features {
    type Output = Features;
    fn bitand(self, rhs: Features) -> Features {
        Features(self.0 & rhs.0)
    }
}

/// Names the features, `|`-separated (`WP_ASYNC|MOVE`); bits this crate does not know are shown
/// in hex; the empty set is `(none)`.
impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("(none)");
        }
        let mut known = 0u64;
        let mut first = true;
        for (name, bit) in Self::NAMES {
            if self.0 & bit != 0 {
                known |= bit;
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        let unknown = self.0 & !known;
        if unknown != 0 {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{unknown:#x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Features({self})")
    }
}

/// Errors of userfaultfd, pagemap and memory calls.
///
/// The partial-progress cases are distinct variants because the caller must act on them: wake
/// after [`Exists`](UffdError::Exists), read events and retry after [`Again`](UffdError::Again),
/// break copy-on-write sharing after [`Busy`](UffdError::Busy). Their `done` is the number of
/// bytes the kernel handled, from the start of the request, before it stopped.
#[derive(Debug, thiserror::Error)]
pub enum UffdError {
    /// No userfaultfd with kernel-mode faults could be opened (or a feature such as `EVENT_FORK`
    /// was refused) for lack of privilege.
    #[error(
        "cannot open a userfaultfd that also serves faults inside system calls ({cause}): run as root, \
         or grant CAP_SYS_PTRACE, or give this user read/write access to /dev/userfaultfd, \
         or set the sysctl vm.unprivileged_userfaultfd=1"
    )]
    Permission {
        /// What the kernel said.
        cause: io::Error,
    },
    /// The kernel lacks features the caller asked for.
    #[error("this kernel's userfaultfd lacks {missing} (wanted {wanted}, available {available}); MOVE needs Linux 6.8, WP_ASYNC 6.7, POISON 6.6")]
    MissingFeatures {
        /// What was asked for.
        wanted: Features,
        /// What the kernel offers.
        available: Features,
        /// `wanted` minus `available`.
        missing: Features,
    },
    /// `EEXIST`: the page at `addr + done` is already mapped. Threads waiting on it have *not*
    /// been woken: call [`Uffd::wake`].
    #[error("page already present after {done} bytes")]
    Exists {
        /// Bytes handled before the present page.
        done: usize,
    },
    /// `EAGAIN`: the request stopped after `done` bytes. Either the address space is changing
    /// (a `REMOVE`, `UNMAP` or `REMAP` event is queued, or was just read and its originator has
    /// not resumed yet; read events, then retry) or the kernel made partial progress and hit
    /// something else at `addr + done` (e.g. a present page: a retry from there reports it).
    /// Bytes up to `done` were installed and, unless `dontwake`, their waiters woken.
    #[error("userfaultfd request interrupted after {done} bytes (event pending or partial progress)")]
    Again {
        /// Bytes handled before the interruption.
        done: usize,
    },
    /// `EBUSY` from `UFFDIO_MOVE`: the source page is shared (e.g. copy-on-write with a forked
    /// child) or pinned; `done` bytes were moved before it. [`break_cow`] on the page, then retry.
    #[error("page is shared or pinned and cannot be moved (after {done} bytes)")]
    Busy {
        /// Bytes handled before the busy page.
        done: usize,
    },
    /// A multi-page request failed part-way for another reason; `done` bytes were handled.
    #[error("{op} at {addr:#x} stopped after {done} bytes: {errno}")]
    Stopped {
        /// The operation.
        op: &'static str,
        /// The start address of the request.
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
        /// The address involved (0 if none).
        addr: usize,
        /// The length involved (0 if none).
        len: usize,
        /// The error.
        errno: io::Error,
    },
}

impl UffdError {
    /// The same error for a request that had already handled `before` bytes when the part
    /// that failed began.
    fn after(self, before: usize) -> UffdError {
        match self {
            UffdError::Exists { done } => UffdError::Exists { done: before + done },
            UffdError::Again { done } => UffdError::Again { done: before + done },
            UffdError::Busy { done } => UffdError::Busy { done: before + done },
            UffdError::Stopped { op, addr, done, errno } => UffdError::Stopped {
                op,
                addr: addr - before,
                done: before + done,
                errno,
            },
            UffdError::Os { op, addr, errno, .. } if before > 0 => UffdError::Stopped {
                op,
                addr: addr - before,
                done: before,
                errno,
            },
            e => e,
        }
    }

    /// Bytes a multi-page request handled before it failed (0 for other errors).
    pub fn done(&self) -> usize {
        match self {
            UffdError::Exists { done } | UffdError::Again { done } | UffdError::Busy { done } => *done,
            UffdError::Stopped { done, .. } => *done,
            _ => 0,
        }
    }

    /// The errno behind the error, if it came from a system call.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            UffdError::Permission { cause } => cause.raw_os_error(),
            UffdError::MissingFeatures { .. } => None,
            UffdError::Exists { .. } => Some(libc::EEXIST),
            UffdError::Again { .. } => Some(libc::EAGAIN),
            UffdError::Busy { .. } => Some(libc::EBUSY),
            UffdError::Stopped { errno, .. } | UffdError::Os { errno, .. } => errno.raw_os_error(),
        }
    }
}

pub(crate) fn os_error(op: &'static str, addr: usize, len: usize, errno: io::Error) -> UffdError {
    UffdError::Os { op, addr, len, errno }
}

fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

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
    /// Track writes to write-protected pages (with `WP_ASYNC`, resolved in the kernel and found
    /// later with [`Pagemap::scan_written`]).
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

/// One ioctl whose argument is a pointer to `T`.
///
/// # Safety
/// `req` must be an ioctl that reads and writes at most one `T` through its argument.
unsafe fn ioctl_ptr<T>(fd: RawFd, req: u32, arg: &mut T) -> libc::c_int {
    // SAFETY: per this function's contract the kernel accesses at most `size_of::<T>()` bytes
    // of `arg`, which is a valid, exclusively borrowed `T`.
    unsafe { libc::ioctl(fd, req as libc::Ioctl, arg as *mut T) }
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
    pub fn move_pages(&self, dst: usize, src: usize, len: usize, mode: MoveMode) -> Result<usize, UffdError> {
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
            return Self::by_page(len, |off| self.move_pages(dst + off, src + off, PAGE_SIZE, mode));
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

fn range(start: usize, len: usize) -> sys::uffdio_range {
    sys::uffdio_range {
        start: start as u64,
        len: len as u64,
    }
}

/// `sizeof(struct uffd_msg)`: an 8-byte header (event code first), then a 24-byte union.
const MSG_SIZE: usize = 32;

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
fn parse_msg(m: &[u8]) -> Event {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_numbers_match_the_uapi_headers() {
        // Values from <linux/userfaultfd.h> and <linux/fs.h> of Linux 6.8.
        assert_eq!(UFFDIO_MOVE, 0xc028_aa05);
        assert_eq!(UFFDIO_POISON, 0xc020_aa08);
        assert_eq!(USERFAULTFD_IOC_NEW, 0xaa00);
        assert_eq!(pagemap::PAGEMAP_SCAN, 0xc060_6610);
    }

    #[test]
    fn features_display_names_and_unknown_bits() {
        assert_eq!(Features::empty().to_string(), "(none)");
        assert_eq!((Features::MOVE | Features::WP_ASYNC).to_string(), "WP_ASYNC|MOVE");
        assert_eq!(
            (Features::POISON | Features(1 << 40)).to_string(),
            "POISON|0x10000000000"
        );
        assert!((Features::MOVE | Features::POISON).contains(Features::MOVE));
        assert!(!Features::MOVE.contains(Features::MOVE | Features::POISON));
    }

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

    #[test]
    fn errors_keep_progress() {
        assert_eq!(UffdError::Again { done: 8192 }.done(), 8192);
        assert_eq!(UffdError::Busy { done: 0 }.raw_os_error(), Some(libc::EBUSY));
    }

    #[test]
    fn uffd_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Uffd>();
        check::<pagemap::Pagemap>();
        check::<Mapping>();
    }
}
