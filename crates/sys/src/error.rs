//! The error of the memory calls: which call, on which range, and what the kernel (or the
//! argument check before it) said.

use std::io;

/// Errors of the memory calls ([`Mapping`](crate::Mapping), the `madvise`/`mprotect`/`mremap`
/// wrappers, [`SharedMemory`](crate::SharedMemory)). Each names the call and the range, so the
/// caller can say what failed where.
///
/// The descriptor and socket helpers return plain [`io::Error`]s: they have no range to name.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    /// A system call failed.
    #[error("{op} at {addr:#x}+{len:#x}: {errno}")]
    Os {
        /// The call.
        op: &'static str,
        /// The address involved (0 if none).
        addr: usize,
        /// The length involved (0 if none).
        len: usize,
        /// What the kernel said.
        errno: io::Error,
    },
    /// Arguments no call would accept (an empty or overflowing length, a bad alignment, a file
    /// that is not what it must be); nothing was changed.
    #[error("{op} at {addr:#x}+{len:#x}: {why}")]
    Invalid {
        /// The call that was not made.
        op: &'static str,
        /// The address involved (0 if none).
        addr: usize,
        /// The length involved.
        len: usize,
        /// What is wrong.
        why: &'static str,
    },
}

impl SysError {
    /// The errno behind the error: the kernel's, or `EINVAL` for arguments refused before the
    /// call (what the kernel would have said).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            SysError::Os { errno, .. } => errno.raw_os_error(),
            SysError::Invalid { .. } => Some(libc::EINVAL),
        }
    }
}

/// A failed call, with the errno it set.
pub(crate) fn os_error(op: &'static str, addr: usize, len: usize, errno: io::Error) -> SysError {
    SysError::Os { op, addr, len, errno }
}

/// Arguments refused before any call.
pub(crate) fn invalid(op: &'static str, addr: usize, len: usize, why: &'static str) -> SysError {
    SysError::Invalid { op, addr, len, why }
}
