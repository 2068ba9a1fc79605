//! What a brick admits, and for how long: the limits on connections (in total and per peer
//! address), the deadlines of connections (to authenticate, between requests, to take a
//! response), and the slowing down of peers whose authentications keep failing.
//!
//! Every table here is bounded: the per-peer connection counts hold one entry per peer with a
//! connection open (at most [`BrickLimits::max_connections`] of them), the failure table at most
//! [`MAX_TRACKED_PEERS`] addresses. A peer that is made to wait waits in its own connection's
//! thread, at most [`BrickLimits::auth_delay_max`], and only as many times at once as it has
//! connections; beyond that its attempts are refused at once, unchecked.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Addresses whose authentication failures are remembered at most; beyond it the one that
/// failed longest ago is forgotten.
pub const MAX_TRACKED_PEERS: usize = 4096;
/// A peer's failures are forgotten this long after its last one.
pub const AUTH_FORGET: Duration = Duration::from_secs(600);

/// The limits a brick enforces on its connections. [`BrickLimits::default`] is sized for a
/// rack: hundreds of nodes with several links each to every brick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrickLimits {
    /// Connections served at once; a connection beyond it is answered `Busy` and closed.
    pub max_connections: usize,
    /// Connections served at once from one IP address (TCP; Unix-socket peers count only
    /// towards the total). A node opens two links per brick per program.
    pub max_connections_per_peer: usize,
    /// How long a new connection may take to authenticate (a successful ALLOC or ATTACH)
    /// before it is closed: bounds what silent or slow connections hold.
    pub handshake_timeout: Duration,
    /// How long an authenticated connection may stay silent before it is closed (`None`:
    /// forever). Links send a PING when idle (`rackmem_transport::KEEPALIVE_INTERVAL`, 60 s), so
    /// only a dead or hung peer reaches it; keep it well above the clients' keep-alive interval.
    pub idle_timeout: Option<Duration>,
    /// How long one response may take to leave: a client that stops reading is disconnected
    /// after this.
    pub send_timeout: Duration,
    /// Authentication failures from one address answered at once; each further one waits
    /// (see [`BrickLimits::auth_delay`]).
    pub auth_failures_free: u32,
    /// The wait before the first check beyond [`BrickLimits::auth_failures_free`]; it doubles
    /// with every further failure, up to [`BrickLimits::auth_delay_max`]. Checks from one
    /// address are spaced by it even when they come on many connections at once.
    pub auth_delay: Duration,
    /// The longest wait, and the furthest ahead a check may be scheduled: an attempt that would
    /// wait longer is refused at once (`Busy`) without being checked.
    pub auth_delay_max: Duration,
}

impl Default for BrickLimits {
    fn default() -> Self {
        BrickLimits {
            max_connections: 4096,
            max_connections_per_peer: 256,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Some(Duration::from_secs(600)),
            send_timeout: Duration::from_secs(30),
            auth_failures_free: 5,
            auth_delay: Duration::from_millis(250),
            auth_delay_max: Duration::from_secs(4),
        }
    }
}

/// What a brick refused or cut, since it started ([`crate::BrickHandle::guard_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuardStats {
    /// Connections refused because of [`BrickLimits::max_connections`].
    pub refused_total: u64,
    /// Connections refused because of [`BrickLimits::max_connections_per_peer`].
    pub refused_per_peer: u64,
    /// Connections closed for not authenticating within [`BrickLimits::handshake_timeout`].
    pub handshake_timeouts: u64,
    /// Authenticated connections closed after [`BrickLimits::idle_timeout`] of silence.
    pub idle_timeouts: u64,
    /// Connections closed because a response did not leave within
    /// [`BrickLimits::send_timeout`] (the client stopped reading).
    pub send_timeouts: u64,
    /// Frames refused on their header (opcode not allowed in the connection's state, or a
    /// payload longer than the opcode's limit), before any of the payload was read.
    pub refused_headers: u64,
    /// Wrong shared secrets and grants that did not verify or were not proven.
    pub auth_failures: u64,
    /// Authentication attempts checked only after a wait.
    pub auth_delayed: u64,
    /// Authentication attempts refused unchecked (`Busy`): the peer's next check was too far
    /// ahead.
    pub auth_throttled: u64,
}

#[derive(Default)]
pub(crate) struct GuardCounters {
    pub refused_total: AtomicU64,
    pub refused_per_peer: AtomicU64,
    pub handshake_timeouts: AtomicU64,
    pub idle_timeouts: AtomicU64,
    pub send_timeouts: AtomicU64,
    pub refused_headers: AtomicU64,
    pub auth_failures: AtomicU64,
    pub auth_delayed: AtomicU64,
    pub auth_throttled: AtomicU64,
}

impl GuardCounters {
    pub fn snapshot(&self) -> GuardStats {
        GuardStats {
            refused_total: self.refused_total.load(Relaxed),
            refused_per_peer: self.refused_per_peer.load(Relaxed),
            handshake_timeouts: self.handshake_timeouts.load(Relaxed),
            idle_timeouts: self.idle_timeouts.load(Relaxed),
            send_timeouts: self.send_timeouts.load(Relaxed),
            refused_headers: self.refused_headers.load(Relaxed),
            auth_failures: self.auth_failures.load(Relaxed),
            auth_delayed: self.auth_delayed.load(Relaxed),
            auth_throttled: self.auth_throttled.load(Relaxed),
        }
    }
}

/// Why a connection is not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// [`BrickLimits::max_connections`] reached.
    Total(usize),
    /// [`BrickLimits::max_connections_per_peer`] reached for this address.
    PerPeer(IpAddr, usize),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Total(n) => write!(
                f,
                "the brick serves its maximum of {n} connections (rackmem brick \
                 --max-connections); retry later or raise the limit"
            ),
            Refusal::PerPeer(ip, n) => write!(
                f,
                "the brick serves its maximum of {n} connections from {ip} (rackmem brick \
                 --max-connections-per-peer); close some or raise the limit"
            ),
        }
    }
}

/// One address's recent authentication failures.
struct Failures {
    count: u32,
    last: Instant,
    /// The earliest time the next check from this address may run.
    next_check: Instant,
}

/// Connection counts and authentication failures, per peer.
pub(crate) struct Guard {
    pub limits: BrickLimits,
    pub counters: GuardCounters,
    /// Open connections: in total, and per TCP peer address.
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
    failures: Mutex<HashMap<Option<IpAddr>, Failures>>,
}

/// What to do before checking a peer's credentials.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Check now.
    Now,
    /// Wait this long, then check.
    After(Duration),
    /// Do not check: refuse with `Busy`; the next check could run in this long.
    Refuse(Duration),
}

impl Guard {
    pub fn new(limits: BrickLimits) -> Guard {
        Guard {
            limits,
            counters: GuardCounters::default(),
            open: Mutex::new((0, HashMap::new())),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a new connection from `peer` (`None`: a Unix-socket peer), or says why not.
    pub fn admit(&self, peer: Option<IpAddr>) -> Result<(), Refusal> {
        let mut open = crate::sync::lock(&self.open);
        if open.0 >= self.limits.max_connections {
            self.counters.refused_total.fetch_add(1, Relaxed);
            return Err(Refusal::Total(self.limits.max_connections));
        }
        if let Some(ip) = peer {
            let n = open.1.entry(ip).or_insert(0);
            if *n >= self.limits.max_connections_per_peer {
                self.counters.refused_per_peer.fetch_add(1, Relaxed);
                return Err(Refusal::PerPeer(ip, self.limits.max_connections_per_peer));
            }
            *n += 1;
        }
        open.0 += 1;
        Ok(())
    }

    /// Forgets a connection [`Guard::admit`] counted.
    pub fn release(&self, peer: Option<IpAddr>) {
        let mut open = crate::sync::lock(&self.open);
        open.0 = open.0.saturating_sub(1);
        if let Some(ip) = peer {
            if let Some(n) = open.1.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    open.1.remove(&ip);
                }
            }
        }
    }

    /// Before checking a secret or a grant from `peer`: at once while it has failed at most
    /// [`BrickLimits::auth_failures_free`] times lately; else at its next free slot, which this
    /// reserves (so checks from one address are spaced however many connections it opens),
    /// unless that slot is more than [`BrickLimits::auth_delay_max`] ahead.
    pub fn before_check(&self, peer: Option<IpAddr>, now: Instant) -> Admission {
        let mut t = crate::sync::lock(&self.failures);
        let Some(f) = t.get_mut(&peer) else {
            return Admission::Now;
        };
        if now.duration_since(f.last) > AUTH_FORGET {
            t.remove(&peer);
            return Admission::Now;
        }
        if f.count < self.limits.auth_failures_free {
            return Admission::Now;
        }
        let slot = f.next_check.max(now);
        let wait = slot - now;
        if wait > self.limits.auth_delay_max {
            self.counters.auth_throttled.fetch_add(1, Relaxed);
            return Admission::Refuse(wait);
        }
        f.next_check = slot + self.delay(f.count);
        if wait.is_zero() {
            Admission::Now
        } else {
            self.counters.auth_delayed.fetch_add(1, Relaxed);
            Admission::After(wait)
        }
    }

    /// The spacing of checks after `count` failures.
    fn delay(&self, count: u32) -> Duration {
        let doublings = count.saturating_sub(self.limits.auth_failures_free).min(20);
        self.limits
            .auth_delay
            .saturating_mul(1 << doublings)
            .min(self.limits.auth_delay_max)
    }

    /// A check from `peer` failed.
    pub fn failed(&self, peer: Option<IpAddr>, now: Instant) {
        self.counters.auth_failures.fetch_add(1, Relaxed);
        let mut t = crate::sync::lock(&self.failures);
        if !t.contains_key(&peer) && t.len() >= MAX_TRACKED_PEERS {
            // Full: forget the address that failed longest ago. O(n) on a bounded table, and
            // only when a new address fails.
            if let Some(oldest) = t.iter().min_by_key(|(_, f)| f.last).map(|(k, _)| *k) {
                t.remove(&oldest);
            }
        }
        let free = self.limits.auth_failures_free;
        let f = t.entry(peer).or_insert(Failures {
            count: 0,
            last: now,
            next_check: now,
        });
        f.count = f.count.saturating_add(1);
        f.last = now;
        if f.count == free {
            // The first failure beyond the free ones waits for the first delay.
            f.next_check = f.next_check.max(now + self.limits.auth_delay);
        }
    }

    /// A check from `peer` passed: its failures are forgiven.
    pub fn succeeded(&self, peer: Option<IpAddr>) {
        crate::sync::lock(&self.failures).remove(&peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> Guard {
        Guard::new(BrickLimits {
            max_connections: 3,
            max_connections_per_peer: 2,
            auth_failures_free: 2,
            auth_delay: Duration::from_secs(1),
            auth_delay_max: Duration::from_secs(4),
            ..BrickLimits::default()
        })
    }

    #[test]
    fn connections_are_capped_in_total_and_per_peer() {
        let g = guard();
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        assert_eq!(g.admit(Some(a)), Ok(()));
        assert_eq!(g.admit(Some(a)), Ok(()));
        assert_eq!(g.admit(Some(a)), Err(Refusal::PerPeer(a, 2)));
        assert_eq!(g.admit(Some(b)), Ok(()));
        assert_eq!(g.admit(None), Err(Refusal::Total(3)));
        g.release(Some(a));
        assert_eq!(g.admit(None), Ok(()));
        let s = g.counters.snapshot();
        assert_eq!((s.refused_total, s.refused_per_peer), (1, 1));
    }

    #[test]
    fn failures_space_checks_and_refuse_beyond_the_horizon() {
        let g = guard();
        let p = Some("10.0.0.1".parse().expect("ip"));
        let t0 = Instant::now();
        assert_eq!(g.before_check(p, t0), Admission::Now);
        g.failed(p, t0);
        assert_eq!(g.before_check(p, t0), Admission::Now);
        g.failed(p, t0);
        // Two failures: the next check waits 1 s, the ones after it are spaced 1 s apart,
        // and none is scheduled more than 4 s ahead.
        assert_eq!(g.before_check(p, t0), Admission::After(Duration::from_secs(1)));
        assert_eq!(g.before_check(p, t0), Admission::After(Duration::from_secs(2)));
        assert_eq!(g.before_check(p, t0), Admission::After(Duration::from_secs(3)));
        assert_eq!(g.before_check(p, t0), Admission::After(Duration::from_secs(4)));
        assert_eq!(g.before_check(p, t0), Admission::Refuse(Duration::from_secs(5)));
        // Another address is not affected; a success forgives.
        assert_eq!(g.before_check(None, t0), Admission::Now);
        g.succeeded(p);
        assert_eq!(g.before_check(p, t0), Admission::Now);
        let s = g.counters.snapshot();
        assert_eq!((s.auth_failures, s.auth_delayed, s.auth_throttled), (2, 4, 1));
    }

    #[test]
    fn the_failure_table_is_bounded() {
        let g = guard();
        let t0 = Instant::now();
        for i in 0..(MAX_TRACKED_PEERS as u32 + 10) {
            g.failed(
                Some(IpAddr::from(i.to_be_bytes())),
                t0 + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(crate::sync::lock(&g.failures).len(), MAX_TRACKED_PEERS);
    }
}
