//! The error of userfaultfd calls, with the partial progress a caller must act on.

use crate::features::Features;
use std::io;

/// Errors of userfaultfd calls.
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
    /// been woken: call [`Uffd::wake`](crate::Uffd::wake).
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
    /// child) or pinned; `done` bytes were moved before it. [`rackmem_sys::break_cow`] on the page, then retry.
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
    pub(crate) fn after(self, before: usize) -> UffdError {
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

/// The errno the last failed call set (`EIO` if it set none).
pub(crate) fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_progress() {
        assert_eq!(UffdError::Again { done: 8192 }.done(), 8192);
        assert_eq!(UffdError::Busy { done: 0 }.raw_os_error(), Some(libc::EBUSY));
    }
}
