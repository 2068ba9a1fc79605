//! What a brick admits, and for how long: the limits on connections (in total, per peer
//! address and per address prefix, for connections still authenticating and for authenticated
//! ones apart), the deadlines of connections (to authenticate, between requests, to take a
//! response), and the slowing down of peers, and of their networks, whose authentications keep
//! failing.
//!
//! Every table here is bounded: the connection counts hold one entry per peer and per prefix
//! with a connection open, the failure table at most [`MAX_TRACKED_PEERS`] addresses and
//! prefixes. A peer that is made to wait is parked by the handshake stage (no thread), at most
//! [`BrickLimits::auth_delay_max`]; beyond that its attempts are refused at once, unchecked.

use rackmem_sys::PrefixLen;
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
    /// Authenticated connections served at once (a thread each); an ALLOC or ATTACH beyond it
    /// is answered `Busy` and its connection closed.
    pub max_connections: usize,
    /// Connections at once from one IP address (TCP; Unix-socket peers count only towards the
    /// totals), counted apart among authenticating and authenticated connections. A node opens
    /// two links per brick per program.
    pub max_connections_per_peer: usize,
    /// As [`BrickLimits::max_connections_per_peer`], from one address prefix
    /// ([`BrickLimits::peer_prefix`]): rotating source addresses within a network an attacker
    /// holds does not lift the cap.
    pub max_connections_per_prefix: usize,
    /// How addresses are grouped into prefixes (IPv4 /24 and IPv6 /64 by default).
    pub peer_prefix: PrefixLen,
    /// Connections held at once while they authenticate (HELLO to a successful ALLOC or
    /// ATTACH), without a thread each; when it is reached, the one that has waited longest is
    /// closed to make room (a legitimate client authenticates in milliseconds).
    pub max_handshakes: usize,
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
    /// Authentication failures from one address prefix answered at once, whichever of its
    /// addresses they come from; beyond them the prefix's checks are spaced like an address's.
    pub auth_failures_free_per_prefix: u32,
    /// The wait before the first check beyond [`BrickLimits::auth_failures_free`]; it doubles
    /// with every further failure, up to [`BrickLimits::auth_delay_max`]. Checks from one
    /// address are spaced by it even when they come on many connections at once.
    pub auth_delay: Duration,
    /// The longest wait, and the furthest ahead a check may be scheduled: an attempt that would
    /// wait longer is refused at once (`Busy`) without being checked.
    pub auth_delay_max: Duration,
    /// The most bytes/s the brick serves in total (READ and WRITE together; `None`: no limit
    /// but the segments' own): what its memory can serve, measured or declared
    /// (`rackmem brick --serve-rate`). See the `pace` module.
    pub serve_bps: Option<u64>,
}

impl Default for BrickLimits {
    fn default() -> Self {
        BrickLimits {
            max_connections: 4096,
            max_connections_per_peer: 256,
            max_connections_per_prefix: 1024,
            peer_prefix: PrefixLen::default(),
            max_handshakes: 16_384,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Some(Duration::from_secs(600)),
            send_timeout: Duration::from_secs(30),
            auth_failures_free: 5,
            auth_failures_free_per_prefix: 20,
            auth_delay: Duration::from_millis(250),
            auth_delay_max: Duration::from_secs(4),
            serve_bps: None,
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
    /// Connections refused because of [`BrickLimits::max_connections_per_prefix`].
    pub refused_per_prefix: u64,
    /// Connections still authenticating, closed to make room under
    /// [`BrickLimits::max_handshakes`] (the longest waiting first).
    pub handshakes_evicted: u64,
    /// Connections authenticating now (held by the handshake stage, without a thread).
    pub handshakes_open: u64,
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
    pub refused_per_prefix: AtomicU64,
    pub handshakes_evicted: AtomicU64,
    pub handshakes_open: AtomicU64,
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
            refused_per_prefix: self.refused_per_prefix.load(Relaxed),
            handshakes_evicted: self.handshakes_evicted.load(Relaxed),
            handshakes_open: self.handshakes_open.load(Relaxed),
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
    /// [`BrickLimits::max_connections_per_prefix`] reached for this prefix (shown `A.B.C.0/24`).
    PerPrefix(String, usize),
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
            Refusal::PerPrefix(net, n) => write!(
                f,
                "the brick serves its maximum of {n} connections from the network {net} (rackmem \
                 brick --max-connections-per-prefix, --peer-prefix-v4/-v6); close some or raise the limit"
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

/// Open connections of one stage (authenticating, or authenticated): in total, per TCP peer
/// address and per prefix. Entries go when their count reaches zero.
#[derive(Default)]
pub(crate) struct Counts {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
    per_prefix: HashMap<IpAddr, usize>,
}

impl Counts {
    /// Counts a connection from `peer` within the caps (`total`: the stage's own total cap),
    /// or says which cap it would break.
    pub fn admit(
        &mut self,
        limits: &BrickLimits,
        counters: &GuardCounters,
        total: usize,
        peer: Option<IpAddr>,
    ) -> Result<(), Refusal> {
        if self.total >= total {
            counters.refused_total.fetch_add(1, Relaxed);
            return Err(Refusal::Total(total));
        }
        if let Some(ip) = peer {
            let net = limits.peer_prefix.prefix_of(ip);
            let n = self.per_peer.get(&ip).copied().unwrap_or(0);
            if n >= limits.max_connections_per_peer {
                counters.refused_per_peer.fetch_add(1, Relaxed);
                return Err(Refusal::PerPeer(ip, limits.max_connections_per_peer));
            }
            let m = self.per_prefix.get(&net).copied().unwrap_or(0);
            if m >= limits.max_connections_per_prefix {
                counters.refused_per_prefix.fetch_add(1, Relaxed);
                return Err(Refusal::PerPrefix(
                    limits.peer_prefix.show(net),
                    limits.max_connections_per_prefix,
                ));
            }
            self.per_peer.insert(ip, n + 1);
            self.per_prefix.insert(net, m + 1);
        }
        self.total += 1;
        Ok(())
    }

    /// Forgets a connection [`Counts::admit`] counted.
    pub fn release(&mut self, limits: &BrickLimits, peer: Option<IpAddr>) {
        self.total = self.total.saturating_sub(1);
        if let Some(ip) = peer {
            let net = limits.peer_prefix.prefix_of(ip);
            for (map, k) in [(&mut self.per_peer, ip), (&mut self.per_prefix, net)] {
                if let Some(n) = map.get_mut(&k) {
                    *n -= 1;
                    if *n == 0 {
                        map.remove(&k);
                    }
                }
            }
        }
    }
}

/// Whose authentication failures an entry counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum FailKey {
    /// Unix-socket peers, together.
    Local,
    /// One address.
    Addr(IpAddr),
    /// Every address of one prefix.
    Net(IpAddr),
}

/// Connection counts and authentication failures, per peer and per prefix.
pub(crate) struct Guard {
    pub limits: BrickLimits,
    pub counters: GuardCounters,
    /// Authenticated connections (the handshake stage keeps its own [`Counts`]).
    open: Mutex<Counts>,
    failures: Mutex<HashMap<FailKey, Failures>>,
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
            open: Mutex::new(Counts::default()),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a new authenticated connection from `peer` (`None`: a Unix-socket peer), or
    /// says why not.
    pub fn admit(&self, peer: Option<IpAddr>) -> Result<(), Refusal> {
        crate::sync::lock(&self.open).admit(&self.limits, &self.counters, self.limits.max_connections, peer)
    }

    /// Forgets a connection [`Guard::admit`] counted.
    pub fn release(&self, peer: Option<IpAddr>) {
        crate::sync::lock(&self.open).release(&self.limits, peer);
    }

    /// The failure entries a check from `peer` is counted in, with the failures each forgives.
    fn keys(&self, peer: Option<IpAddr>) -> Vec<(FailKey, u32)> {
        match peer {
            None => vec![(FailKey::Local, self.limits.auth_failures_free)],
            Some(ip) => vec![
                (FailKey::Addr(ip), self.limits.auth_failures_free),
                (
                    FailKey::Net(self.limits.peer_prefix.prefix_of(ip)),
                    self.limits.auth_failures_free_per_prefix,
                ),
            ],
        }
    }

    /// Before checking a secret or a grant from `peer`: at once while neither it nor its
    /// prefix has failed more than its free failures lately; else at the later of their next
    /// free slots, which this reserves (so checks from one address, or one network, are spaced
    /// however many connections and addresses it uses), unless that slot is more than
    /// [`BrickLimits::auth_delay_max`] ahead.
    pub fn before_check(&self, peer: Option<IpAddr>, now: Instant) -> Admission {
        let keys = self.keys(peer);
        let mut t = crate::sync::lock(&self.failures);
        let mut slot = now;
        let mut over = Vec::new();
        for (k, free) in &keys {
            let Some(f) = t.get(k) else { continue };
            if now.duration_since(f.last) > AUTH_FORGET {
                t.remove(k);
                continue;
            }
            if f.count >= *free {
                slot = slot.max(f.next_check);
                over.push((*k, *free));
            }
        }
        if over.is_empty() {
            return Admission::Now;
        }
        let wait = slot - now;
        if wait > self.limits.auth_delay_max {
            self.counters.auth_throttled.fetch_add(1, Relaxed);
            return Admission::Refuse(wait);
        }
        for (k, free) in over {
            if let Some(f) = t.get_mut(&k) {
                f.next_check = slot + self.delay(f.count, free);
            }
        }
        if wait.is_zero() {
            Admission::Now
        } else {
            self.counters.auth_delayed.fetch_add(1, Relaxed);
            Admission::After(wait)
        }
    }

    /// The spacing of checks after `count` failures of an entry that forgives `free`.
    fn delay(&self, count: u32, free: u32) -> Duration {
        let doublings = count.saturating_sub(free).min(20);
        self.limits
            .auth_delay
            .saturating_mul(1 << doublings)
            .min(self.limits.auth_delay_max)
    }

    /// A check from `peer` failed: counted against the address and its prefix.
    pub fn failed(&self, peer: Option<IpAddr>, now: Instant) {
        self.counters.auth_failures.fetch_add(1, Relaxed);
        let keys = self.keys(peer);
        let mut t = crate::sync::lock(&self.failures);
        for (k, free) in keys {
            if !t.contains_key(&k) && t.len() >= MAX_TRACKED_PEERS {
                // Full: forget the entry that failed longest ago. O(n) on a bounded table, and
                // only when a new address or prefix fails.
                if let Some(oldest) = t.iter().min_by_key(|(_, f)| f.last).map(|(k, _)| *k) {
                    t.remove(&oldest);
                }
            }
            let f = t.entry(k).or_insert(Failures {
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
    }

    /// A check from `peer` passed: the address's failures are forgiven. Its prefix's are not:
    /// an attacker sharing the network with a legitimate client would be forgiven with it.
    pub fn succeeded(&self, peer: Option<IpAddr>) {
        let key = match peer {
            None => FailKey::Local,
            Some(ip) => FailKey::Addr(ip),
        };
        crate::sync::lock(&self.failures).remove(&key);
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
    fn addresses_of_one_prefix_share_its_cap() {
        let g = Guard::new(BrickLimits {
            max_connections: 10,
            max_connections_per_peer: 2,
            max_connections_per_prefix: 3,
            ..BrickLimits::default()
        });
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(g.admit(Some(ip("10.0.0.1"))), Ok(()));
        assert_eq!(g.admit(Some(ip("10.0.0.2"))), Ok(()));
        assert_eq!(g.admit(Some(ip("10.0.0.3"))), Ok(()));
        assert_eq!(
            g.admit(Some(ip("10.0.0.4"))),
            Err(Refusal::PerPrefix("10.0.0.0/24".into(), 3))
        );
        assert_eq!(g.admit(Some(ip("10.0.1.4"))), Ok(()));
        g.release(Some(ip("10.0.0.2")));
        assert_eq!(g.admit(Some(ip("10.0.0.4"))), Ok(()));
        assert_eq!(g.counters.snapshot().refused_per_prefix, 1);
    }

    #[test]
    fn failures_from_many_addresses_of_one_prefix_are_slowed_together() {
        let g = Guard::new(BrickLimits {
            auth_failures_free: 2,
            auth_failures_free_per_prefix: 4,
            auth_delay: Duration::from_secs(1),
            auth_delay_max: Duration::from_secs(4),
            ..BrickLimits::default()
        });
        let t0 = Instant::now();
        // Each address fails once only (under its own free count), rotating through the /24.
        for i in 1..=4u8 {
            let p = Some(IpAddr::from([10, 0, 0, i]));
            assert_eq!(g.before_check(p, t0), Admission::Now);
            g.failed(p, t0);
        }
        let fresh = Some(IpAddr::from([10, 0, 0, 99]));
        assert_eq!(g.before_check(fresh, t0), Admission::After(Duration::from_secs(1)));
        // Another network is not affected.
        assert_eq!(g.before_check(Some(IpAddr::from([10, 0, 1, 1])), t0), Admission::Now);
        // A success forgives the address, not its network.
        g.succeeded(fresh);
        assert!(matches!(g.before_check(fresh, t0), Admission::After(_)));
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
