//! Accepting connections and serving requests.
//!
//! One acceptor thread hands each connection to a thread of its own, which reads a frame,
//! validates it (header first, so a hostile `payload_len` is refused before any allocation),
//! serves it against the connection's attached segment and queues the response. A response is
//! held back only while a whole further request is already buffered: a pipelined burst is
//! answered with few system calls, a lone request at once, and the brick never sits on a
//! response while it waits for more bytes from the client.
//!
//! ATTACH is where a connection earns access: the grant must verify under the brick's key, be
//! unexpired, and come with a proof that the connection holds the grant's session key, bound to
//! the nonce this connection got at HELLO (`docs/control-plane.md`, "Grants and proof of
//! possession"). Each failure has its own status, and the connection is closed.

use crate::guard::{Admission, BrickLimits, Guard, GuardStats};
use crate::pool::{in_segment, Gate, GateState, ShareError, Store, CHUNK};
use crate::tls::TlsStream;
use rackmem_proto::{
    constant_time_eq, encode_response, extents_bytes, rights, session_key, verify_attach_proof, BrickInfo, BrickStats,
    DecodeError, Grant, GrantError, Header, Opcode, Request, SegmentGrant, Status, FLAG_RESPONSE, HEADER_LEN,
    MAX_MESSAGE, MAX_PAYLOAD, NONCE_LEN, PAGE_SIZE,
};
use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::net::IpAddr;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a connection thread polls for the next request before it sleeps
/// (`RACKMEM_BRICK_SPIN_US` overrides). Measured on 2-vCPU guests: 100 µs took the remote fault
/// median from 46–70 µs to 30–42 µs and GUPS from 16–25 k/s to 25–27 k/s, scans unchanged within
/// noise (`docs/benchmarks.md`).
pub const DEFAULT_SPIN_US: u64 = 100;

/// Grace period for a cloned segment to be attached by its new owner.
pub const CLONE_GRACE: Duration = Duration::from_secs(60);
/// Responses queued beyond this many bytes are sent even while requests are still buffered.
const FLUSH_BYTES: usize = 1 << 20;
/// Payloads at least this large are sent straight from their buffer, not copied into the queue.
const DIRECT_BYTES: usize = 64 << 10;

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

/// How to run a brick.
#[derive(Debug, Clone)]
pub struct BrickConfig {
    /// Listen address.
    pub listen: ListenAddr,
    /// Pool size; rounded down to whole [`CHUNK`]s for segments.
    pub size_bytes: u64,
    /// Key grants are signed with.
    pub key: Vec<u8>,
    /// Shared secret that allows ALLOC (standalone mode); `None` disables ALLOC.
    pub secret: Option<Vec<u8>>,
    /// Managed by a control plane (`docs/control-plane.md`, "Managed segments"): ALLOC and CLONE
    /// are refused whatever the secret, a valid proven grant for a segment id the brick has not
    /// seen creates that segment at the grant's range, and segments outlive their connections
    /// until [`BrickHandle::retain_segments`] no longer lists them. When false (standalone), a
    /// segment is freed when its last connection detaches.
    pub managed: bool,
    /// Limits on connections and authentication attempts ([`BrickLimits::default`] suits a
    /// rack).
    pub limits: BrickLimits,
    /// The certificate a `tls://` listen address serves (see [`crate::tls_server_config`]);
    /// required with one, refused with any other.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

#[derive(Default)]
struct Counters {
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    requests: AtomicU64,
    connections: AtomicU64,
    errors: AtomicU64,
}

struct Shared {
    cfg: BrickConfig,
    store: Store,
    counters: Counters,
    /// Set once to stop; `stopped_cv` wakes [`BrickHandle::wait`], `bell` the acceptor.
    stop: AtomicBool,
    bell: rackmem_sys::Doorbell,
    stop_lock: Mutex<()>,
    stopped_cv: Condvar,
    /// Open connections (to shut them down at stop) and their threads (to join them).
    conns: Mutex<HashMap<u64, Conn>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    brick_id: u64,
    /// How long a connection thread polls for the next request before sleeping.
    spin_us: u64,
    /// Connection caps, deadlines, authentication failures.
    guard: Guard,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn shutdown(&self) {
        let _ = match self {
            Conn::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Conn::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

/// What a heartbeat thread needs of a running brick: its statistics, and the segment list the
/// control plane sends back (see [`BrickHandle::retain_segments_as_of`]).
#[derive(Clone)]
pub struct BrickManager(Arc<Shared>);

impl BrickManager {
    /// Statistics so far.
    pub fn stats(&self) -> BrickStats {
        self.0.stats()
    }

    /// See [`BrickHandle::retain_segments_as_of`].
    pub fn retain_segments_as_of(&self, keep: &[(u64, u64, u64)], listed_at: Instant) -> Vec<u64> {
        self.0.store.retain(keep, listed_at)
    }
}

/// A running brick. Dropping it stops the brick, as [`BrickHandle::shutdown`] does.
pub struct BrickHandle {
    shared: Arc<Shared>,
    addr: String,
    acceptor: Option<JoinHandle<()>>,
    unix_path: Option<PathBuf>,
}

/// Stops a brick from another thread (a signal handler's thread, a test): cheap to clone.
#[derive(Clone)]
pub struct BrickStopper(Arc<Shared>);

impl BrickStopper {
    /// Asks the brick to stop; [`BrickHandle::wait`] then returns.
    pub fn stop(&self) {
        self.0.request_stop();
    }
}

/// Starts bricks.
pub struct Brick;

impl Brick {
    /// Binds the listen address, spawns the acceptor and returns. A Unix socket file left by a
    /// brick that died is replaced; one that still answers is [`BrickError::InUse`].
    pub fn start(cfg: BrickConfig) -> Result<BrickHandle, BrickError> {
        if cfg.size_bytes < CHUNK {
            return Err(BrickError::Size(cfg.size_bytes));
        }
        let mut rnd = [0u8; 16];
        // Without OS randomness ids merely become predictable, which grants do not rely on.
        let _ = getrandom::fill(&mut rnd);
        let brick_id = u64::from_le_bytes([rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]]);
        let first_segment = u64::from(u32::from_le_bytes([rnd[8], rnd[9], rnd[10], rnd[11]])) << 32 | 1;
        let shown = cfg.listen.to_string();
        let bind_err = |e: io::Error| match e.kind() {
            io::ErrorKind::AddrInUse => BrickError::InUse(shown.clone()),
            _ => BrickError::Bind {
                addr: shown.clone(),
                err: e,
            },
        };
        match (&cfg.listen, &cfg.tls) {
            (ListenAddr::Tls(_), None) => {
                return Err(BrickError::Tls(format!(
                    "{shown} needs a certificate and its key (--tls-cert, --tls-key)"
                )))
            }
            (ListenAddr::Tcp(_) | ListenAddr::Unix(_), Some(_)) => {
                return Err(BrickError::Tls(format!(
                    "a certificate was given, but {shown} is not a tls:// address"
                )))
            }
            _ => {}
        }
        let (listener, addr, unix_path) = match &cfg.listen {
            ListenAddr::Tls(a) => {
                let l = TcpListener::bind(a).map_err(bind_err)?;
                let local = l.local_addr().map_err(bind_err)?;
                (Listener::Tcp(l), format!("tls://{local}"), None)
            }
            ListenAddr::Tcp(a) => {
                let l = TcpListener::bind(a).map_err(bind_err)?;
                let local = l.local_addr().map_err(bind_err)?;
                (Listener::Tcp(l), format!("tcp://{local}"), None)
            }
            ListenAddr::Unix(p) => {
                if let Ok(meta) = std::fs::symlink_metadata(p) {
                    if !meta.file_type().is_socket() {
                        return Err(BrickError::NotASocket(shown));
                    }
                    // A socket file nobody answers on is stale (a brick that was killed).
                    if UnixStream::connect(p).is_ok() {
                        return Err(BrickError::InUse(shown));
                    }
                    let _ = std::fs::remove_file(p);
                }
                let l = UnixListener::bind(p).map_err(bind_err)?;
                (Listener::Unix(l), shown.clone(), Some(p.clone()))
            }
        };
        // The standard library listens with a backlog of 128: a burst of connections beyond it
        // (nodes reconnecting after a restart, or a flood) would be left half-open by the
        // kernel, never reaching the acceptor. Queue as many as the brick may serve.
        let fd = match &listener {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l) => l.as_fd(),
        };
        let _ = rackmem_sys::set_listen_backlog(fd, cfg.limits.max_connections.min(65_535) as u32);
        let spin_us = std::env::var("RACKMEM_BRICK_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_SPIN_US);
        // Each connection holds two descriptors (its stream and the handle that shuts it down
        // at stop): allow what the limits need, as far as the hard limit goes.
        let _ = rackmem_sys::raise_open_files_limit();
        let shared = Arc::new(Shared {
            spin_us,
            guard: Guard::new(cfg.limits.clone()),
            store: Store::new(cfg.size_bytes, first_segment),
            cfg,
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            bell: rackmem_sys::Doorbell::new().map_err(BrickError::Thread)?,
            stop_lock: Mutex::new(()),
            stopped_cv: Condvar::new(),
            conns: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            brick_id,
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("brick-accept".into())
            .spawn(move || accept_loop(s, listener))
            .map_err(BrickError::Thread)?;
        Ok(BrickHandle {
            shared,
            addr,
            acceptor: Some(acceptor),
            unix_path,
        })
    }
}

impl BrickHandle {
    /// The address clients use (`tcp://127.0.0.1:PORT` or `unix:PATH`), in the form
    /// `rackmem_transport::BrickAddr` parses.
    pub fn local_addr(&self) -> String {
        self.addr.clone()
    }

    /// Counters now.
    pub fn stats(&self) -> BrickStats {
        self.shared.stats()
    }

    /// What the brick refused or cut so far (connections over its limits, timeouts, refused
    /// headers, authentication failures and how they were slowed down).
    pub fn guard_stats(&self) -> GuardStats {
        self.shared.guard.counters.snapshot()
    }

    /// A handle that stops this brick from another thread.
    pub fn stopper(&self) -> BrickStopper {
        BrickStopper(self.shared.clone())
    }

    /// Managed mode: releases every managed segment that `keep` does not list as exactly
    /// `(segment_id, brick_offset, size_bytes)` (the control plane's heartbeat answer), and
    /// returns the ids released. A released segment's memory is discarded and its range returned
    /// to the free list once requests in flight on it finish; connections still attached to it
    /// stay open, but their data requests fail with `NoSegment` (and close the connection). Its
    /// grant, while unexpired, would create an empty segment again if its range is still free,
    /// which the next list releases in turn: control planes should give grants an expiry.
    ///
    /// Segments created from grants after the list was drawn up are released too; a heartbeat
    /// should call [`BrickHandle::retain_segments_as_of`] with the time it sent its request.
    /// Standalone segments are never touched.
    pub fn retain_segments(&self, keep: &[(u64, u64, u64)]) -> Vec<u64> {
        self.retain_segments_as_of(keep, Instant::now())
    }

    /// A handle for another thread (a heartbeat) to manage segments and read statistics.
    pub fn manager(&self) -> BrickManager {
        BrickManager(self.shared.clone())
    }

    /// As [`BrickHandle::retain_segments`], but only for segments created before `listed_at`
    /// (when the heartbeat that brought `keep` was sent): a grant the control plane issued after
    /// drawing up the list may already have created its segment here, and must not lose it.
    pub fn retain_segments_as_of(&self, keep: &[(u64, u64, u64)], listed_at: Instant) -> Vec<u64> {
        self.shared.store.retain(keep, listed_at)
    }

    /// Stops accepting, closes every connection (their clients see the brick lost), joins the
    /// brick's threads and removes the Unix socket file.
    pub fn shutdown(mut self) {
        self.stop();
    }

    /// Blocks until a [`BrickStopper`] asks the brick to stop, then shuts it down.
    pub fn wait(mut self) {
        {
            let mut g = lock(&self.shared.stop_lock);
            while !self.shared.stop.load(Relaxed) {
                g = self.shared.stopped_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        }
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.request_stop();
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        // The acceptor is gone: no connection is added from here on.
        for c in lock(&self.shared.conns).values() {
            c.shutdown();
        }
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for t in threads {
            let _ = t.join();
        }
        if let Some(p) = self.unix_path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for BrickHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves until SIGTERM or SIGINT, then shuts the brick down; returns the signal number.
pub fn run_until_signal(handle: BrickHandle) -> io::Result<i32> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])?;
    let sig = signals.forever().next().unwrap_or(signal_hook::consts::SIGTERM);
    signals.handle().close();
    handle.shutdown();
    Ok(sig)
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

// The acceptor waits on a non-blocking listener and the stop doorbell together: a connection
// is accepted as soon as it comes, a stop is seen at once, and an idle brick wakes once a second
// (the sweep), not every few milliseconds on a CPU it may share with a program.
fn accept_loop(shared: Arc<Shared>, listener: Listener) {
    let _ = match &listener {
        Listener::Tcp(l) => l.set_nonblocking(true),
        Listener::Unix(l) => l.set_nonblocking(true),
    };
    let mut next_conn = 0u64;
    let mut last_sweep = Instant::now();
    while !shared.stop.load(Relaxed) {
        let send_timeout = Some(shared.guard.limits.send_timeout);
        let accepted = match &listener {
            Listener::Tcp(l) => l.accept().map(|(s, peer)| (Accepted::Tcp(s), Some(peer.ip()))),
            Listener::Unix(l) => l.accept().map(|(s, _)| (Accepted::Unix(s), None)),
        };
        match accepted {
            Ok((sock, peer)) => {
                let accepted_at = Instant::now();
                if let Err(why) = shared.guard.admit(peer) {
                    shared.counters.errors.fetch_add(1, Relaxed);
                    refuse(sock, &why.to_string());
                    continue;
                }
                let prepared = match sock {
                    Accepted::Tcp(s) => (|| {
                        s.set_nonblocking(false)?;
                        s.set_nodelay(true)?;
                        s.set_write_timeout(send_timeout)?;
                        let ctl = Conn::Tcp(s.try_clone()?);
                        match &shared.cfg.tls {
                            None => Ok((ctl, Box::new(s) as Box<dyn Stream>)),
                            Some(config) => {
                                let t = TlsStream::new(s, config.clone())?;
                                t.set_write_timeout(send_timeout)?;
                                Ok((ctl, Box::new(t) as Box<dyn Stream>))
                            }
                        }
                    })(),
                    Accepted::Unix(s) => (|| {
                        s.set_nonblocking(false)?;
                        s.set_write_timeout(send_timeout)?;
                        Ok((Conn::Unix(s.try_clone()?), Box::new(s) as Box<dyn Stream>))
                    })(),
                };
                let (ctl, stream) = match prepared {
                    Ok(p) => p,
                    Err::<_, io::Error>(_) => {
                        // Out of descriptors, most likely: this connection is dropped (closed).
                        shared.guard.release(peer);
                        shared.counters.errors.fetch_add(1, Relaxed);
                        continue;
                    }
                };
                next_conn += 1;
                let id = next_conn;
                lock(&shared.conns).insert(id, ctl);
                shared.counters.connections.fetch_add(1, Relaxed);
                let s = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("brick-conn-{id}"))
                    .spawn(move || {
                        serve_connection(&s, stream, peer, accepted_at);
                        lock(&s.conns).remove(&id);
                        s.counters.connections.fetch_sub(1, Relaxed);
                        s.guard.release(peer);
                    });
                match spawned {
                    Ok(t) => {
                        let mut threads = lock(&shared.threads);
                        threads.retain(|t| !t.is_finished());
                        threads.push(t);
                    }
                    Err(_) => {
                        lock(&shared.conns).remove(&id);
                        shared.counters.connections.fetch_sub(1, Relaxed);
                        shared.guard.release(peer);
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Nothing to accept: block until a client connects, the brick stops or the next
                // sweep is due. No shorter timer: the brick may share a CPU with a program
                // whose every wake-up here it would slow down.
                let next_sweep = SWEEP_EVERY.saturating_sub(last_sweep.elapsed());
                let fd = match &listener {
                    Listener::Tcp(l) => l.as_fd(),
                    Listener::Unix(l) => l.as_fd(),
                };
                if rackmem_sys::wait_readable(fd, &shared.bell, Some(next_sweep)).is_err() {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            // EMFILE and friends: back off rather than spin.
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
        if last_sweep.elapsed() >= SWEEP_EVERY {
            last_sweep = Instant::now();
            shared.store.sweep(last_sweep);
        }
    }
}

/// A connection as accepted, before it is set up.
enum Accepted {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// Tells a connection over the brick's limits why (a `Busy` answer with tag 0, which a link
/// reports as the reason its connection closed) and closes it, without ever blocking the
/// acceptor: the answer is small and the socket new, so it fits the send buffer, and what the
/// peer sent already is read first so that closing does not reset the connection before the
/// peer reads the answer.
fn refuse(sock: Accepted, why: &str) {
    let frame = encode_response(
        Opcode::Hello,
        0,
        Status::Busy,
        &why.as_bytes()[..why.len().min(MAX_MESSAGE)],
    );
    let mut sink = [0u8; 4096];
    let mut drain = |r: &mut dyn Read| {
        for _ in 0..4 {
            if !matches!(r.read(&mut sink), Ok(n) if n > 0) {
                break;
            }
        }
    };
    match sock {
        Accepted::Tcp(mut s) => {
            let _ = s.set_nonblocking(true);
            drain(&mut s);
            let _ = s.write(&frame);
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
        Accepted::Unix(mut s) => {
            let _ = s.set_nonblocking(true);
            drain(&mut s);
            let _ = s.write(&frame);
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
    }
}

/// How often segments nobody attached in time are freed (see [`Store::sweep`]).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

trait Stream: Read + Write + Send {
    fn set_nonblocking(&self, on: bool) -> io::Result<()>;
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    /// Whether [`send_with_fd`](Stream::send_with_fd) works.
    fn passes_fds(&self) -> bool {
        false
    }
    /// Sends `data` with `fd` attached; returns the bytes sent.
    fn send_with_fd(&mut self, _data: &[u8], _fd: std::os::fd::BorrowedFd<'_>) -> io::Result<usize> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "file descriptors travel only over Unix sockets",
        ))
    }
}
impl Stream for TcpStream {
    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        TcpStream::set_nonblocking(self, on)
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, t)
    }
}
impl Stream for TlsStream {
    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.tcp().set_nonblocking(on)
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        TlsStream::set_read_timeout(self, t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        TlsStream::set_write_timeout(self, t)
    }
}
impl Stream for UnixStream {
    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        UnixStream::set_nonblocking(self, on)
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        UnixStream::set_write_timeout(self, t)
    }
    fn passes_fds(&self) -> bool {
        true
    }
    fn send_with_fd(&mut self, data: &[u8], fd: std::os::fd::BorrowedFd<'_>) -> io::Result<usize> {
        use std::os::fd::AsFd;
        rackmem_sys::send_with_fd(self.as_fd(), data, fd)
    }
}

impl Shared {
    fn request_stop(&self) {
        let _g = lock(&self.stop_lock);
        self.stop.store(true, Relaxed);
        self.bell.ring();
        self.stopped_cv.notify_all();
    }

    fn stats(&self) -> BrickStats {
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
    fn wait_turn(&self, peer: Option<IpAddr>) -> Option<Reply> {
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
            Admission::Refuse(wait) => {
                let who = peer.map_or_else(|| "local peers".to_string(), |ip| ip.to_string());
                Some(err(
                    Status::Busy,
                    format!(
                        "too many failed authentications from {who}: not checked; the next check \
                         can run in {:.1} s (failures are forgotten {} s after the last one)",
                        wait.as_secs_f64(),
                        crate::guard::AUTH_FORGET.as_secs()
                    ),
                    true,
                ))
            }
        }
    }

    /// A standalone grant (ALLOC, CLONE) and its session key, for the connection that asked.
    fn grant(&self, id: u64, offset: u64, size: u64) -> SegmentGrant {
        SegmentGrant::new(
            &self.cfg.key,
            Grant::sign(&self.cfg.key, id, offset, size, 0, rights::ALL, 0),
        )
    }
}

/// The segment a connection is bound to.
struct Attached {
    id: u64,
    offset: u64,
    size: u64,
    rights: u8,
    /// Held (read side) while a request touches the segment's memory.
    gate: Gate,
}

/// What a brick knows about one connection.
#[derive(Default)]
struct Session {
    /// Returned at HELLO; ATTACH proofs on this connection are bound to it.
    nonce: Option<[u8; NONCE_LEN]>,
    attached: Option<Attached>,
    /// The connection can carry file descriptors (a Unix socket): SHARE is possible.
    passes_fds: bool,
    /// The peer's address (TCP), for the authentication failure table.
    peer: Option<IpAddr>,
    /// An ALLOC or ATTACH succeeded on this connection once: every opcode is allowed, and the
    /// idle timeout replaces the handshake deadline.
    authenticated: bool,
}

struct Reply {
    status: Status,
    payload: Vec<u8>,
    close: bool,
    /// Shared memory whose descriptor goes with the response (SHARE).
    fd: Option<Arc<rackmem_sys::SharedMemory>>,
}

fn ok(payload: Vec<u8>) -> Reply {
    Reply {
        status: Status::Ok,
        payload,
        close: false,
        fd: None,
    }
}

fn err(status: Status, msg: impl Into<String>, close: bool) -> Reply {
    let mut m = msg.into().into_bytes();
    m.truncate(MAX_MESSAGE);
    Reply {
        status,
        payload: m,
        close,
        fd: None,
    }
}

/// Why a frame's header alone is enough to refuse it: an opcode not allowed before
/// authentication, or a payload longer than its opcode ever needs. Checked before a byte of the
/// payload is read or allocated.
fn header_refusal(h: &Header, authenticated: bool) -> Option<Reply> {
    if !authenticated && !h.opcode.allowed_before_auth() {
        return Some(err(
            Status::NotAttached,
            format!(
                "{:?} before authentication: a connection says HELLO, then ALLOC (with the shared \
                 secret) or ATTACH (with a grant), before anything else",
                h.opcode
            ),
            true,
        ));
    }
    let max = h.opcode.max_request_payload();
    if h.payload_len > max {
        return Some(err(
            Status::BadRequest,
            format!(
                "malformed {:?} request: a payload of {} bytes exceeds its limit of {max}",
                h.opcode, h.payload_len
            ),
            true,
        ));
    }
    None
}

/// Reads a `len`-byte payload into `buf`, growing it as the bytes arrive: a header that claims
/// more than its sender sends costs what was sent, not what was claimed.
fn read_payload(io: &mut impl Read, buf: &mut Vec<u8>, len: usize) -> io::Result<()> {
    buf.clear();
    while buf.len() < len {
        let have = buf.len();
        let step = (len - have).min(have.max(64 << 10));
        buf.resize(have + step, 0);
        io.read_exact(&mut buf[have..])?;
    }
    Ok(())
}

/// Counts a connection that ended on a read deadline.
fn note_read_end(shared: &Shared, session: &Session, e: &io::Error) {
    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
        let c = &shared.guard.counters;
        if session.authenticated {
            c.idle_timeouts.fetch_add(1, Relaxed);
        } else {
            c.handshake_timeouts.fetch_add(1, Relaxed);
        }
    }
}

/// Reads requests off `stream`, serves them in order, queues and flushes responses.
fn serve_connection(shared: &Shared, stream: Box<dyn Stream>, peer: Option<IpAddr>, accepted_at: Instant) {
    let limits = &shared.guard.limits;
    let mut conn = Connection {
        io: BufReader::with_capacity(
            256 << 10,
            StreamIo {
                sock: stream,
                spin_us: shared.spin_us,
                deadline: Some(accepted_at + limits.handshake_timeout),
            },
        ),
        queued: Vec::with_capacity(64 << 10),
        send_timeout: limits.send_timeout,
    };
    let mut session = Session {
        passes_fds: conn.io.get_ref().sock.passes_fds(),
        peer,
        ..Session::default()
    };
    let mut hdr = [0u8; HEADER_LEN];
    let mut payload = Vec::new();
    let mut scratch = Vec::new();
    loop {
        if let Err(e) = conn.io.read_exact(&mut hdr) {
            note_read_end(shared, &session, &e);
            break;
        }
        let h = match Header::decode(&hdr) {
            Ok(h) => h,
            Err(e) => {
                // Answer with the tag and opcode the frame claims, if any, so a client that
                // merely speaks another version learns why; then close.
                shared.counters.errors.fetch_add(1, Relaxed);
                let tag = u32::from_le_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]);
                let op = Opcode::from_u8(hdr[5]).unwrap_or(Opcode::Ping);
                let status = match e {
                    rackmem_proto::DecodeError::BadVersion(_) => Status::BadVersion,
                    _ => Status::BadRequest,
                };
                let _ = conn.send(op, tag, &err(status, format!("malformed frame: {e}"), true), true);
                break;
            }
        };
        if let Some(reply) = header_refusal(&h, session.authenticated) {
            shared.counters.errors.fetch_add(1, Relaxed);
            shared.guard.counters.refused_headers.fetch_add(1, Relaxed);
            let _ = conn.send(h.opcode, h.tag, &reply, true);
            break;
        }
        if let Err(e) = read_payload(&mut conn.io, &mut payload, h.payload_len as usize) {
            // A frame cut short: the peer died, is misbehaving, or ran out of time.
            note_read_end(shared, &session, &e);
            shared.counters.errors.fetch_add(1, Relaxed);
            break;
        }
        shared.counters.requests.fetch_add(1, Relaxed);
        // Page traffic skips the owned `Request`: WRITE stores straight from the receive
        // buffer and READ fills a buffer the connection keeps, so no request allocates or
        // copies its pages an extra time.
        let decoded = match h.opcode {
            Opcode::Write => rackmem_proto::decode_write(&payload).map(|(ext, data)| {
                with_segment(session.attached.as_ref(), |a, m| write_pages(shared, a, m, &ext, data))
            }),
            Opcode::Read => Request::decode(&h, &payload).map(|r| match r {
                Request::Read(ext) => with_segment(session.attached.as_ref(), |a, m| {
                    read_pages(shared, a, m, &ext, std::mem::take(&mut scratch))
                }),
                r => handle(shared, &mut session, r),
            }),
            _ => Request::decode(&h, &payload).map(|r| handle(shared, &mut session, r)),
        };
        let reply = match decoded {
            Ok(r) => r,
            Err(e @ DecodeError::MissingProof) => err(Status::GrantUnproven, e.to_string(), true),
            Err(e) => err(
                Status::BadRequest,
                format!("malformed {:?} request: {e}", h.opcode),
                true,
            ),
        };
        if reply.status != Status::Ok {
            shared.counters.errors.fetch_add(1, Relaxed);
        }
        if !session.authenticated && session.attached.is_some() {
            // Authenticated: from now on the connection may be silent for the idle timeout
            // (its link pings when idle), no longer bound by the handshake deadline.
            session.authenticated = true;
            let io = conn.io.get_mut();
            io.deadline = None;
            if io
                .sock
                .set_read_timeout(limits.idle_timeout.filter(|t| !t.is_zero()))
                .is_err()
            {
                break;
            }
        }
        let close = reply.close;
        // Hold the response back only if the next request can be served without reading the
        // socket: a client may be waiting for this response before it sends the rest of the
        // next frame (a link draining responses while its send is blocked does exactly that).
        let flush = close || !whole_frame_buffered(conn.io.buffer());
        if let Err(e) = conn.send(h.opcode, h.tag, &reply, flush) {
            if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                shared.guard.counters.send_timeouts.fetch_add(1, Relaxed);
            }
            break;
        }
        if close {
            break;
        }
        if reply.payload.capacity() >= DIRECT_BYTES {
            scratch = reply.payload;
        }
    }
    if let Some(a) = session.attached {
        shared.store.detach(a.id, &a.gate);
    }
}

/// True if `buf` starts with a complete frame (header and payload).
fn whole_frame_buffered(buf: &[u8]) -> bool {
    buf.len() >= HEADER_LEN
        && HEADER_LEN as u64 + u64::from(u32::from_le_bytes([buf[28], buf[29], buf[30], buf[31]])) <= buf.len() as u64
}

/// The socket as the connection reads it: polled briefly before a read sleeps, and, until the
/// connection authenticates, every read bounded by the handshake deadline (so a peer that
/// trickles bytes cannot stretch it). After that the socket's own read timeout (the idle
/// timeout) bounds each read.
struct StreamIo {
    sock: Box<dyn Stream>,
    spin_us: u64,
    deadline: Option<Instant>,
}

impl Read for StreamIo {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        if self.spin_us > 0 && self.sock.set_nonblocking(true).is_ok() {
            // Poll briefly before sleeping: on small VMs a sleeping reader costs a cross-vCPU
            // wake-up (~30 µs) per request, more than the request itself.
            let start = std::time::Instant::now();
            let limit = Duration::from_micros(self.spin_us);
            loop {
                match self.sock.read(b) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if start.elapsed() > limit {
                            break;
                        }
                        std::hint::spin_loop();
                    }
                    other => {
                        let _ = self.sock.set_nonblocking(false);
                        return other;
                    }
                }
            }
            let _ = self.sock.set_nonblocking(false);
        }
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the connection did not authenticate in time",
                ));
            }
            self.sock.set_read_timeout(Some(left))?;
        }
        self.sock.read(b)
    }
}

/// Writes all of `buf` by `deadline`, however the peer drains it: the socket's send timeout
/// bounds one blocked write, so after a partial write the rest gets only what is left.
/// Returns whether the socket's send timeout was shortened (to be restored).
fn write_all_by(sock: &mut dyn Stream, mut buf: &[u8], deadline: Instant) -> io::Result<bool> {
    let mut shortened = false;
    let mut first = true;
    while !buf.is_empty() {
        if !first {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client did not take the response in time",
                ));
            }
            sock.set_write_timeout(Some(left))?;
            shortened = true;
        }
        first = false;
        match sock.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(shortened)
}

/// One connection's buffered input and queued output (the same socket: requests are served
/// in order, so reading and writing take turns on one thread).
struct Connection {
    io: BufReader<StreamIo>,
    queued: Vec<u8>,
    /// How long one response may take to leave (the socket's send timeout too).
    send_timeout: Duration,
}

impl Connection {
    /// Queues a response, and sends what is queued when `flush` says so or the queue is long;
    /// what is sent must leave within the send timeout, or the connection fails.
    fn send(&mut self, op: Opcode, tag: u32, r: &Reply, flush: bool) -> io::Result<()> {
        let deadline = Instant::now() + self.send_timeout;
        let sent = self.send_by(op, tag, r, flush, deadline);
        if matches!(sent, Ok(true)) {
            self.io.get_mut().sock.set_write_timeout(Some(self.send_timeout))?;
        }
        sent.map(|_| ())
    }

    /// [`Connection::send`] by `deadline`; returns whether the socket's send timeout changed.
    fn send_by(&mut self, op: Opcode, tag: u32, r: &Reply, flush: bool, deadline: Instant) -> io::Result<bool> {
        let sock = &mut *self.io.get_mut().sock;
        if let Some(m) = &r.fd {
            // The descriptor rides on the response's first bytes; whatever is queued goes first.
            let a = write_all_by(sock, &self.queued, deadline)?;
            self.queued.clear();
            let frame = encode_response(op, tag, r.status, &r.payload);
            let sent = sock.send_with_fd(&frame, m.fd())?;
            return Ok(write_all_by(sock, &frame[sent..], deadline)? || a);
        }
        if r.payload.len() >= DIRECT_BYTES {
            // Large payloads go out from their own buffer rather than through the queue.
            let h = Header {
                opcode: op,
                flags: FLAG_RESPONSE,
                tag,
                status: r.status.code(),
                offset: 0,
                length: 0,
                payload_len: r.payload.len() as u32,
            };
            self.queued.extend_from_slice(&h.encode());
            let a = write_all_by(sock, &self.queued, deadline)?;
            self.queued.clear();
            return Ok(write_all_by(sock, &r.payload, deadline)? || a);
        }
        self.queued
            .extend_from_slice(&encode_response(op, tag, r.status, &r.payload));
        if flush || self.queued.len() >= FLUSH_BYTES {
            let a = write_all_by(sock, &self.queued, deadline)?;
            self.queued.clear();
            return Ok(a);
        }
        Ok(false)
    }
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn handle(shared: &Shared, session: &mut Session, req: Request) -> Reply {
    let store = &shared.store;
    let attached = &mut session.attached;
    match req {
        Request::Hello => {
            if session.nonce.is_none() {
                let mut nonce = [0u8; NONCE_LEN];
                // A predictable nonce would let a proof seen on the wire be replayed: no
                // randomness, no HELLO.
                if let Err(e) = getrandom::fill(&mut nonce) {
                    return err(
                        Status::Internal,
                        format!("no randomness for the HELLO nonce: {e}"),
                        true,
                    );
                }
                session.nonce = Some(nonce);
            }
            ok(BrickInfo {
                pool_bytes: shared.cfg.size_bytes,
                free_bytes: store.segs().free_bytes(),
                page_size: PAGE_SIZE,
                max_payload: MAX_PAYLOAD,
                brick_id: shared.brick_id,
                nonce: session.nonce.unwrap_or_default(),
            }
            .encode())
        }
        Request::Ping => ok(Vec::new()),
        Request::Stats => ok(shared.stats().encode()),
        Request::Alloc { size_bytes, secret } => {
            if shared.cfg.managed {
                return err(
                    Status::Denied,
                    "this brick takes its segments from its control plane: ALLOC is disabled; \
                     ask the control plane for an allocation",
                    true,
                );
            }
            if let Some(busy) = shared.wait_turn(session.peer) {
                return busy;
            }
            let allowed = shared.cfg.secret.as_ref().is_some_and(|s| constant_time_eq(s, &secret));
            if allowed {
                shared.guard.succeeded(session.peer);
            } else {
                shared.guard.failed(session.peer, Instant::now());
                return err(
                    Status::Denied,
                    "wrong shared secret (or this brick takes grants from a control plane only)",
                    true,
                );
            }
            if attached.is_some() {
                return err(Status::BadRequest, "connection already attached to a segment", false);
            }
            if size_bytes == 0 || size_bytes > shared.cfg.size_bytes {
                return err(
                    Status::NoSpace,
                    format!(
                        "cannot carve {size_bytes} bytes from a pool of {}",
                        shared.cfg.size_bytes
                    ),
                    false,
                );
            }
            // ALLOC attaches the requesting connection at once: no grace period needed.
            let carved = {
                let mut segs = store.segs();
                segs.carve(size_bytes, 1, None)
                    .and_then(|(id, off, size)| Some((id, off, size, segs.live.get(&id)?.gate.clone())))
            };
            let Some((id, off, size, gate)) = carved else {
                return err(Status::NoSpace, format!("no free extent of {size_bytes} bytes"), false);
            };
            *attached = Some(Attached {
                id,
                offset: off,
                size,
                rights: rights::ALL,
                gate,
            });
            ok(shared.grant(id, off, size).encode())
        }
        Request::Attach { grant: g, proof } => {
            let Some(nonce) = session.nonce else {
                return err(
                    Status::BadRequest,
                    "ATTACH before HELLO: the attach proof is bound to the nonce HELLO returns; say HELLO first",
                    true,
                );
            };
            if let Some(busy) = shared.wait_turn(session.peer) {
                return busy;
            }
            let now = now_unix();
            match g.verify(&shared.cfg.key, now) {
                Ok(()) => {}
                Err(GrantError::Expired) => {
                    return err(
                        Status::GrantExpired,
                        format!(
                            "grant for segment {} expired at {} (now {now}); ask its issuer for a new one",
                            g.segment_id, g.expiry_unix_s
                        ),
                        true,
                    )
                }
                Err(GrantError::BadSignature) => {
                    shared.guard.failed(session.peer, Instant::now());
                    return err(
                        Status::GrantInvalid,
                        format!(
                            "grant for segment {} does not verify under this brick's key \
                             (forged, altered, or signed for another brick)",
                            g.segment_id
                        ),
                        true,
                    );
                }
            }
            let key = session_key(&shared.cfg.key, &g);
            if !verify_attach_proof(&key, &nonce, g.segment_id, &proof) {
                shared.guard.failed(session.peer, Instant::now());
                return err(
                    Status::GrantUnproven,
                    format!(
                        "grant for segment {} is not proven: the proof does not match the grant's \
                         session key and this connection's HELLO nonce (a grant is usable only by \
                         whoever holds its session key, on the connection the proof was made for)",
                        g.segment_id
                    ),
                    true,
                );
            }
            shared.guard.succeeded(session.peer);
            if attached.is_some() {
                return err(Status::BadRequest, "connection already attached to a segment", false);
            }
            let gate = match bind(shared, &g) {
                Ok(gate) => gate,
                Err(reply) => return reply,
            };
            *attached = Some(Attached {
                id: g.segment_id,
                offset: g.brick_offset,
                size: g.size_bytes,
                rights: g.rights,
                gate,
            });
            ok(Vec::new())
        }
        Request::Share => share(shared, attached.as_ref(), session.passes_fds),
        Request::Detach => match attached.take() {
            Some(a) => {
                shared.store.detach(a.id, &a.gate);
                ok(Vec::new())
            }
            None => err(Status::NotAttached, "not attached", false),
        },
        other => {
            let Some(a) = attached.as_ref() else {
                return err(Status::NotAttached, "ATTACH or ALLOC before data requests", true);
            };
            if matches!(other, Request::Clone) && shared.cfg.managed {
                // The control plane places every segment of a managed brick and accounts for its
                // space; a clone it never heard of would be overwritten by its next placement.
                // Kept open: the node may go on using its segment.
                return err(
                    Status::Denied,
                    "this brick takes its segments from its control plane: CLONE is disabled; \
                     ask the control plane for a new allocation",
                    false,
                );
            }
            with_segment(Some(a), |a, m| data_op(shared, a, m, other))
        }
    }
}

/// Runs a data operation on the connection's segment: refused before ATTACH, and after the
/// control plane released the segment. The segment's gate is held across the operation, so a
/// release waits for operations in flight.
fn with_segment(attached: Option<&Attached>, op: impl FnOnce(&Attached, &GateState) -> Reply) -> Reply {
    let Some(a) = attached else {
        return err(Status::NotAttached, "ATTACH or ALLOC before data requests", true);
    };
    let mem = a.gate.read().unwrap_or_else(|e| e.into_inner());
    if !mem.alive {
        return err(
            Status::NoSegment,
            format!(
                "segment {} was released by the control plane; ask it for a new allocation",
                a.id
            ),
            true,
        );
    }
    op(a, &mem)
}

/// SHARE: moves the attached segment into shared memory (once) and answers with its descriptor.
fn share(shared: &Shared, attached: Option<&Attached>, passes_fds: bool) -> Reply {
    let Some(a) = attached else {
        return err(Status::NotAttached, "ATTACH or ALLOC before SHARE", true);
    };
    if !passes_fds {
        // Kept open: the node goes on over this link.
        return err(
            Status::Forbidden,
            "SHARE maps a segment into a node on this brick's own host and needs a Unix-socket \
             link to carry the memory's descriptor; this link is TCP: go on with READ and WRITE",
            false,
        );
    }
    if a.rights & (rights::READ | rights::WRITE) != rights::READ | rights::WRITE {
        return err(
            Status::Forbidden,
            "SHARE needs a grant that allows reads and writes",
            false,
        );
    }
    match shared.store.share(a.id, &a.gate, a.offset, a.size) {
        Ok(m) => Reply {
            fd: Some(m),
            ..ok(a.size.to_le_bytes().to_vec())
        },
        Err(ShareError::Released) => err(
            Status::NoSegment,
            format!(
                "segment {} was released by the control plane; ask it for a new allocation",
                a.id
            ),
            true,
        ),
        Err(e @ ShareError::Memory(_)) => err(Status::Internal, e.to_string(), false),
    }
}

/// Counts one more attachment of the grant's segment, creating it first on a managed brick that
/// has not seen it; returns the segment's gate.
fn bind(shared: &Shared, g: &Grant) -> Result<Gate, Reply> {
    if shared.cfg.managed && !shared.store.segs().live.contains_key(&g.segment_id) {
        // The control plane may reuse a released range before our heartbeat learns of the
        // release: the newer grant settles it.
        shared.store.supersede(g.segment_id, g.brick_offset, g.size_bytes);
    }
    let mut segs = shared.store.segs();
    let seg = match segs.live.get_mut(&g.segment_id) {
        Some(s) if s.offset == g.brick_offset && s.size == g.size_bytes => s,
        Some(s) if shared.cfg.managed => {
            return Err(err(
                Status::Conflict,
                format!(
                    "segment {} lives at [{:#x}, +{:#x}) on this brick, but the grant says [{:#x}, +{:#x})",
                    g.segment_id, s.offset, s.size, g.brick_offset, g.size_bytes
                ),
                true,
            ))
        }
        None if shared.cfg.managed => match segs.claim(g.segment_id, g.brick_offset, g.size_bytes) {
            Ok(s) => s,
            Err(e) => {
                return Err(err(
                    Status::Conflict,
                    format!("cannot place the grant's segment: {e}"),
                    true,
                ))
            }
        },
        _ => {
            return Err(err(
                Status::NoSegment,
                format!("segment {} does not exist on this brick", g.segment_id),
                true,
            ))
        }
    };
    seg.attached += 1;
    seg.unattached_deadline = None;
    Ok(seg.gate.clone())
}

fn out_of_range(a: &Attached, o: u64, l: u64) -> Reply {
    err(
        Status::OutOfRange,
        format!("{o:#x}+{l:#x} is outside the segment of {:#x} bytes", a.size),
        true,
    )
}

/// READ into `buf` (a buffer the connection reuses, so large reads touch no fresh memory).
fn read_pages(
    shared: &Shared,
    a: &Attached,
    mem: &GateState,
    ext: &[rackmem_proto::Extent],
    mut buf: Vec<u8>,
) -> Reply {
    if a.rights & rights::READ == 0 {
        return err(Status::Forbidden, "grant does not allow reads", true);
    }
    let total = extents_bytes(ext);
    if total > MAX_PAYLOAD as u64 {
        return err(
            Status::BadRequest,
            format!("{total} bytes exceed the response limit"),
            true,
        );
    }
    if let Some(&(o, l)) = ext.iter().find(|&&(o, l)| !in_segment(a.size, o, l as u64)) {
        return out_of_range(a, o, l as u64);
    }
    buf.clear();
    buf.resize(total as usize, 0);
    let mut at = 0usize;
    for &(o, l) in ext {
        shared.store.read(mem, a.offset, o, &mut buf[at..at + l as usize]);
        at += l as usize;
    }
    shared.counters.bytes_read.fetch_add(total, Relaxed);
    ok(buf)
}

/// WRITE of `data` (the extents' bytes, concatenated; length checked by the decoder).
fn write_pages(shared: &Shared, a: &Attached, mem: &GateState, ext: &[rackmem_proto::Extent], data: &[u8]) -> Reply {
    if a.rights & rights::WRITE == 0 {
        return err(Status::Forbidden, "grant does not allow writes", true);
    }
    if let Some(&(o, l)) = ext.iter().find(|&&(o, l)| !in_segment(a.size, o, l as u64)) {
        return out_of_range(a, o, l as u64);
    }
    let mut at = 0usize;
    for &(o, l) in ext {
        shared.store.write(mem, a.offset, o, &data[at..at + l as usize]);
        at += l as usize;
    }
    shared.counters.bytes_written.fetch_add(at as u64, Relaxed);
    ok(Vec::new())
}

fn data_op(shared: &Shared, a: &Attached, mem: &GateState, req: Request) -> Reply {
    let store = &shared.store;
    let need = |r: u8| a.rights & r == r;
    let out_of_range = |o: u64, l: u64| {
        err(
            Status::OutOfRange,
            format!("{o:#x}+{l:#x} is outside the segment of {:#x} bytes", a.size),
            true,
        )
    };
    match req {
        Request::Read(ext) => read_pages(shared, a, mem, &ext, Vec::new()),
        Request::Write { extents, data } => write_pages(shared, a, mem, &extents, &data),
        Request::Discard { offset, len } => {
            if !need(rights::WRITE) {
                return err(Status::Forbidden, "grant does not allow writes", true);
            }
            if !in_segment(a.size, offset, len) || len % PAGE_SIZE as u64 != 0 {
                return out_of_range(offset, len);
            }
            match store.discard(mem, a.offset, offset, len) {
                Ok(()) => ok(Vec::new()),
                Err(e) => err(Status::Internal, format!("discarding {offset:#x}+{len:#x}: {e}"), false),
            }
        }
        Request::Populate { offset, len } => {
            if !need(rights::WRITE) {
                return err(Status::Forbidden, "grant does not allow writes", true);
            }
            if !in_segment(a.size, offset, len) || len % PAGE_SIZE as u64 != 0 || offset % PAGE_SIZE as u64 != 0 {
                return out_of_range(offset, len);
            }
            match store.populate(mem, offset, len) {
                Ok(()) => ok(Vec::new()),
                Err(e) => err(Status::Internal, format!("populating {offset:#x}+{len:#x}: {e}"), false),
            }
        }
        Request::Copy { src, dst, len } => {
            if !need(rights::WRITE) {
                return err(Status::Forbidden, "grant does not allow writes", true);
            }
            if !in_segment(a.size, src, len) || !in_segment(a.size, dst, len) {
                return out_of_range(src.max(dst), len);
            }
            let mut buf = vec![0u8; CHUNK as usize];
            // Copy in chunk-sized steps, in the direction that is safe for overlap.
            let steps: Vec<u64> = (0..len.div_ceil(CHUNK)).map(|i| i * CHUNK).collect();
            let order: Box<dyn Iterator<Item = &u64>> = if dst > src {
                Box::new(steps.iter().rev())
            } else {
                Box::new(steps.iter())
            };
            for &s in order {
                let n = (len - s).min(CHUNK) as usize;
                store.read(mem, a.offset, src + s, &mut buf[..n]);
                store.write(mem, a.offset, dst + s, &buf[..n]);
            }
            ok(Vec::new())
        }
        Request::Clone => {
            if !need(rights::CLONE) {
                return err(Status::Forbidden, "grant does not allow clones", true);
            }
            let Some((id, off, _)) = store.segs().carve(a.size, 0, Some(Instant::now() + CLONE_GRACE)) else {
                return err(
                    Status::NoSpace,
                    format!("no free extent of {} bytes for the clone", a.size),
                    false,
                );
            };
            match &mem.shared {
                // Shared memory has no copy-on-write chunks: the clone gets a copy now, without
                // the pages that are all zeros (the pool reads those as zeros anyway).
                Some(m) => store.copy_into_pool(m, off, a.size),
                None => store.pool.share(a.offset, off, a.size),
            }
            ok(shared.grant(id, off, a.size).encode())
        }
        _ => err(Status::BadRequest, "unexpected request", true),
    }
}
