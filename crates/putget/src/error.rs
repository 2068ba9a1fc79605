//! What can go wrong with a one-sided operation, and the `errno` each case reads as in C.

use rackmem_proto::Status;
use rackmem_transport::LinkError;

/// Errors of one-sided operations.
#[derive(Debug, thiserror::Error)]
pub enum PutGetError {
    /// No brick to allocate from and no granter: neither `RACKMEM_BRICKS` nor a node agent
    /// (`RACKMEM_AGENT`) was given.
    #[error("no brick or node agent configured for one-sided segments: set RACKMEM_BRICKS or RACKMEM_AGENT (rackmem run does)")]
    NotConfigured,
    /// The granter (the node agent, or the control plane behind it) refused or could not be
    /// asked; `code` is its error code (`docs/control-plane.md`).
    #[error("node agent: {code}: {message}")]
    Granter {
        /// The agent's or control plane's error code (`unreachable` when it could not be asked).
        code: String,
        /// What happened.
        message: String,
    },
    /// The handle names no live segment of this process (never allocated, or freed).
    #[error("segment handle {0:#x} is not a live segment of this process (freed?)")]
    BadHandle(u64),
    /// The byte range is not inside the segment.
    #[error("{offset:#x}+{len:#x} is outside the segment of {size:#x} bytes")]
    OutOfRange {
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// The segment's size.
        size: u64,
    },
    /// An atomic's word is not 8-byte aligned.
    #[error("atomic word at {0:#x} is not 8-byte aligned")]
    Misaligned(u64),
    /// A size or name the caller gave cannot be used.
    #[error("{0}")]
    Invalid(String),
    /// This process holds [`MAX_SEGMENTS`](crate::MAX_SEGMENTS) segments already.
    #[error("{0} segments are open in this process already; free some first")]
    TooManySegments(usize),
    /// The segment's contents are gone: its brick restarted (a brick's memory does not survive
    /// a restart). Every call on the handle fails so until it is freed.
    #[error("{0}")]
    Lost(String),
    /// The segment's brick kept answering `Moving` (the control plane is moving it to another
    /// brick) for longer than [`MOVING_LIMIT`](crate::MOVING_LIMIT): nothing was executed, and
    /// the call may be made again.
    #[error("{0}")]
    StillMoving(String),
    /// The brick answered `Moving` or `Moved` for a segment this process holds under no name:
    /// only named segments move, and without a name there is nothing to re-open it by.
    #[error("{0}")]
    CannotFollow(String),
    /// The brick refused or the link failed.
    #[error(transparent)]
    Link(#[from] LinkError),
}

impl PutGetError {
    /// The `errno` a C caller sees: `EINVAL` for bad offsets, lengths, alignment and names,
    /// `EBADF` for a freed or unknown segment, `ENOMEM` when the brick has no space, `ENOENT`
    /// for a name no live segment has, `EEXIST` for a named segment smaller than asked,
    /// `EACCES` for a wrong secret or a name of another user, `EMFILE` for too many segments,
    /// `EAGAIN` for a segment still moving to another brick after the longest wait (nothing done),
    /// `ENODEV` when neither a brick nor a node agent is configured, `EIO` when the brick is
    /// lost or fails or the agent cannot be asked. A granter's codes read the same way
    /// (`not_found` ENOENT, `conflict` EEXIST, quotas and capacity ENOMEM).
    pub fn errno(&self) -> i32 {
        match self {
            PutGetError::NotConfigured => libc::ENODEV,
            PutGetError::Lost(_) | PutGetError::CannotFollow(_) => libc::EIO,
            PutGetError::StillMoving(_) => libc::EAGAIN,
            PutGetError::BadHandle(_) => libc::EBADF,
            PutGetError::OutOfRange { .. } | PutGetError::Misaligned(_) | PutGetError::Invalid(_) => libc::EINVAL,
            PutGetError::TooManySegments(_) => libc::EMFILE,
            PutGetError::Granter { code, .. } => match code.as_str() {
                "forbidden" | "permission_denied" => libc::EACCES,
                "not_found" => libc::ENOENT,
                "conflict" => libc::EEXIST,
                "quota_exceeded" | "insufficient_capacity" | "insufficient_bandwidth" => libc::ENOMEM,
                "invalid" | "bad_request" => libc::EINVAL,
                "too_many_connections" => libc::EAGAIN,
                _ => libc::EIO,
            },
            PutGetError::Link(LinkError::Refused { status, .. }) => match status {
                Status::OutOfRange | Status::BadRequest => libc::EINVAL,
                Status::NoSpace => libc::ENOMEM,
                Status::NoSegment => libc::ENOENT,
                Status::Conflict => libc::EEXIST,
                Status::Denied | Status::Forbidden => libc::EACCES,
                Status::NotAttached => libc::EBADF,
                Status::Busy | Status::Moving => libc::EAGAIN,
                _ => libc::EIO,
            },
            PutGetError::Link(LinkError::Invalid { .. } | LinkError::BadAddress(_)) => libc::EINVAL,
            PutGetError::Link(_) => libc::EIO,
        }
    }
}
