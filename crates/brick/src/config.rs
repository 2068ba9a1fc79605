//! How to run a brick: where it listens, its pool, its keys, its mode and its limits.

use crate::error::BrickError;
use crate::guard::BrickLimits;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long a connection thread polls for the next request before it sleeps
/// (`RACKMEM_BRICK_SPIN_US` overrides). Measured on 2-vCPU guests: 100 µs took the remote fault
/// median from 46–70 µs to 30–42 µs and GUPS from 16–25 k/s to 25–27 k/s, scans unchanged within
/// noise (`docs/benchmarks.md`).
pub const DEFAULT_SPIN_US: u64 = 100;

/// Grace period for a cloned segment to be attached by its new owner.
pub const CLONE_GRACE: Duration = Duration::from_secs(60);

/// Longest a CLONE waits for a range of the pool that a segment being freed gives back, when
/// none is free (a forking server's exited children still hold theirs for a moment). Well
/// under a node's link timeout (10 s), which the parent's fork waits on.
pub const CLONE_SPACE_WAIT: Duration = Duration::from_secs(2);

/// Where a brick listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// `tcp://HOST:PORT` (port 0 picks one).
    Tcp(String),
    /// `unix:PATH`.
    Unix(PathBuf),
    /// `tls://HOST:PORT`: TCP carrying TLS, with the certificate of [`BrickConfig::tls`].
    Tls(String),
}

impl std::str::FromStr for ListenAddr {
    type Err = BrickError;
    fn from_str(s: &str) -> Result<Self, BrickError> {
        let host_port = |a: &str| {
            a.rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
        };
        if let Some(a) = s.strip_prefix("tcp://") {
            if !host_port(a) {
                return Err(BrickError::BadAddress(s.to_string()));
            }
            Ok(ListenAddr::Tcp(a.to_string()))
        } else if let Some(a) = s.strip_prefix("tls://") {
            if !host_port(a) {
                return Err(BrickError::BadAddress(s.to_string()));
            }
            Ok(ListenAddr::Tls(a.to_string()))
        } else if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(BrickError::BadAddress(s.to_string()));
            }
            Ok(ListenAddr::Unix(PathBuf::from(p)))
        } else {
            Err(BrickError::BadAddress(s.to_string()))
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "tcp://{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tls(a) => write!(f, "tls://{a}"),
        }
    }
}

/// How to run a brick.
#[derive(Debug, Clone)]
pub struct BrickConfig {
    /// Listen address.
    pub listen: ListenAddr,
    /// Pool size; rounded down to whole [`CHUNK`](crate::CHUNK)s for segments.
    pub size_bytes: u64,
    /// Key grants are signed with.
    pub key: Vec<u8>,
    /// Shared secret that allows ALLOC (standalone mode); `None` disables ALLOC.
    pub secret: Option<Vec<u8>>,
    /// Managed by a control plane (`docs/control-plane.md`, "Managed segments"): ALLOC and CLONE
    /// are refused whatever the secret, a valid proven grant for a segment id the brick has not
    /// seen creates that segment at the grant's range, and segments outlive their connections
    /// until [`BrickHandle::retain_segments`](crate::BrickHandle::retain_segments) no longer lists them. When false (standalone), a
    /// segment is freed when its last connection detaches.
    pub managed: bool,
    /// Limits on connections and authentication attempts ([`BrickLimits::default`] suits a
    /// rack).
    pub limits: BrickLimits,
    /// The certificate a `tls://` listen address serves (see [`crate::tls_server_config`]);
    /// required with one, refused with any other.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}
