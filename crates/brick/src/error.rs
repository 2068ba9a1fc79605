//! Why a brick could not start.

use std::io;

/// Errors starting a brick.
#[derive(Debug, thiserror::Error)]
pub enum BrickError {
    /// The address is malformed.
    #[error("`{0}` is not a listen address: use tcp://HOST:PORT, tls://HOST:PORT or unix:PATH")]
    BadAddress(String),
    /// TLS is misconfigured: unreadable certificate or key, or a `tls://` address without them.
    #[error("TLS: {0}")]
    Tls(String),
    /// The address is taken.
    #[error("{0} is already in use (another brick running?)")]
    InUse(String),
    /// The Unix socket path exists and is not a socket: the brick will not delete it.
    #[error("{0} exists and is not a socket; remove it or pick another path")]
    NotASocket(String),
    /// Binding failed otherwise.
    #[error("cannot listen on {addr}: {err}")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        err: io::Error,
    },
    /// Bad size.
    #[error("pool size {0} is too small (at least 1 MiB)")]
    Size(u64),
    /// Starting a thread failed.
    #[error("cannot start the brick's threads: {0}")]
    Thread(io::Error),
}
