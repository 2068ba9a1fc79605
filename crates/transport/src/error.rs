//! What can go wrong on a link, naming the brick and the cause.

use rackmem_proto::{Opcode, Status};

/// Errors of links.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LinkError {
    /// Malformed address.
    #[error("`{0}` is not a brick address: use tcp://HOST:PORT, tls://HOST:PORT or unix:PATH")]
    BadAddress(String),
    /// A `tls://` link cannot be set up: no CA to verify the brick with, or an unusable one.
    #[error("cannot set up TLS to brick {addr}: {reason}")]
    TlsSetup {
        /// Brick.
        addr: String,
        /// What is missing or wrong, and what to do.
        reason: String,
    },
    /// The link emulation asked for (`RACKMEM_LINK_EMULATE`) does not parse.
    #[error("cannot emulate the link to brick {addr}: {reason}")]
    Emulation {
        /// Brick.
        addr: String,
        /// What is wrong, and the form expected.
        reason: String,
    },
    /// Connecting failed.
    #[error("cannot reach brick {addr}: {cause}")]
    Unreachable {
        /// Brick.
        addr: String,
        /// Cause.
        cause: String,
    },
    /// The brick answered with an error status.
    #[error("brick {addr} refused {op:?}: {status:?}: {message}")]
    Refused {
        /// Brick.
        addr: String,
        /// Operation.
        op: Opcode,
        /// Status.
        status: Status,
        /// The brick's message.
        message: String,
    },
    /// The connection is gone (closed, timed out, or spoke garbage).
    #[error("brick {addr} lost: {cause}")]
    BrickLost {
        /// Brick.
        addr: String,
        /// Cause.
        cause: String,
    },
    /// A request the caller built wrongly (buffer size, limits, alignment); nothing was sent.
    #[error("invalid request to brick {addr}: {reason}")]
    Invalid {
        /// Brick.
        addr: String,
        /// What is wrong.
        reason: String,
    },
}

impl LinkError {
    /// True if the brick refused for lack of space.
    pub fn is_no_space(&self) -> bool {
        matches!(
            self,
            LinkError::Refused {
                status: Status::NoSpace,
                ..
            }
        )
    }
}
