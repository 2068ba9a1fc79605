//! What the brick's threads share: its configuration, its store of segments, its counters, the
//! stop flag and doorbell, the open connections and their threads, and the guard.

use crate::config::BrickConfig;
use crate::guard::{Admission, Guard, AUTH_FORGET};
use crate::pace::Pacer;
use crate::pool::Store;
use crate::reply::{err, Reply};
use crate::sync::lock;
use rackmem_proto::{rights, BrickStats, Grant, SegmentGrant, Status};
use std::collections::HashMap;
use std::net::{IpAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What STATS reports of the brick's traffic.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) bytes_read: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) connections: AtomicU64,
    pub(crate) errors: AtomicU64,
}

/// The state every thread of a brick holds.
pub(crate) struct Shared {
    pub(crate) cfg: BrickConfig,
    pub(crate) store: Store,
    pub(crate) counters: Counters,
    /// Latency and outcomes per opcode, for `--metrics`.
    pub(crate) requests: crate::metrics::RequestMetrics,
    /// Set once to stop; `stopped_cv` wakes [`BrickHandle::wait`](crate::BrickHandle::wait), `bell` the acceptor.
    pub(crate) stop: AtomicBool,
    pub(crate) bell: rackmem_sys::Doorbell,
    pub(crate) stop_lock: Mutex<()>,
    pub(crate) stopped_cv: Condvar,
    /// Open connections (to shut them down at stop) and their threads (to join them).
    pub(crate) conns: Mutex<HashMap<u64, Conn>>,
    pub(crate) threads: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) brick_id: u64,
    /// How long a connection thread polls for the next request before sleeping.
    pub(crate) spin_us: u64,
    /// Connection caps, deadlines, authentication failures.
    pub(crate) guard: Guard,
    /// Named segments (OPEN).
    pub(crate) names: crate::onesided::Names,
    /// The rates the brick enforces.
    pub(crate) pacer: Pacer,
    /// Links to source bricks kept between pull orders (direct migration).
    pub(crate) pull_links: crate::pull::PullLinks,
    /// Named segments the control plane is moving (frozen here, or pulled here).
    pub(crate) moves: crate::moving::Moves,
}

/// A handle on an open connection, to shut it down when the brick stops.
pub(crate) enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Conn::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Conn::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Shared {
    pub(crate) fn request_stop(&self) {
        let _g = lock(&self.stop_lock);
        self.stop.store(true, Relaxed);
        self.bell.ring();
        self.stopped_cv.notify_all();
    }

    pub(crate) fn stats(&self) -> BrickStats {
        let c = &self.counters;
        let (segments, free_bytes) = {
            let segs = self.store.segs();
            (segs.live.len() as u64, segs.free_bytes())
        };
        BrickStats {
            bytes_read: c.bytes_read.load(Relaxed),
            bytes_written: c.bytes_written.load(Relaxed),
            requests: c.requests.load(Relaxed),
            connections: c.connections.load(Relaxed),
            errors: c.errors.load(Relaxed),
            resident_bytes: self.store.resident_bytes(),
            segments,
            free_bytes,
        }
    }

    /// Waits for this peer's turn to have a secret or grant checked, if its recent failures
    /// call for it (see [`Guard::before_check`]); returns the `Busy` answer when its turn is too
    /// far ahead to wait for. A stop cuts the wait short.
    pub(crate) fn wait_turn(&self, peer: Option<IpAddr>) -> Option<Reply> {
        match self.guard.before_check(peer, Instant::now()) {
            Admission::Now => None,
            Admission::After(wait) => {
                let until = Instant::now() + wait;
                while !self.stop.load(Relaxed) {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    std::thread::sleep(left.min(Duration::from_millis(50)));
                }
                None
            }
            Admission::Refuse(wait) => Some(self.throttled(peer, wait)),
        }
    }

    /// The `Busy` answer to a check refused unchecked: the next could run in `wait`.
    pub(crate) fn throttled(&self, peer: Option<IpAddr>, wait: Duration) -> Reply {
        let who = peer.map_or_else(
            || "local peers".to_string(),
            |ip| {
                format!(
                    "{ip} (or its network {})",
                    self.guard
                        .limits
                        .peer_prefix
                        .show(self.guard.limits.peer_prefix.prefix_of(ip))
                )
            },
        );
        err(
            Status::Busy,
            format!(
                "too many failed authentications from {who}: not checked; the next check \
                 can run in {:.1} s (failures are forgotten {} s after the last one)",
                wait.as_secs_f64(),
                AUTH_FORGET.as_secs()
            ),
            true,
        )
    }

    /// A standalone grant (ALLOC, CLONE) and its session key, for the connection that asked.
    pub(crate) fn grant(&self, id: u64, offset: u64, size: u64) -> SegmentGrant {
        SegmentGrant::new(
            &self.cfg.key,
            Grant::sign(&self.cfg.key, id, offset, size, 0, rights::ALL, 0),
        )
    }
}
