//! Links from a node to memory bricks.
//!
//! A [`Link`] is one connection (TCP with `TCP_NODELAY`, TLS over such a TCP connection, or a
//! Unix stream socket). Requests
//! carry tags and may be pipelined, from several threads at once or from one thread through
//! [`Link::submit_read`] / [`Link::submit_write`] and [`Ticket::wait`].
//!
//! There is no reader thread. A caller that waits for a response becomes the link's reader if
//! nobody else is reading: it reads frames off the socket itself and parks other callers'
//! responses, waking them. A caller alone on a link (the fault handler) therefore reads its own
//! response directly, with no thread hop: on 2-vCPU guests a cross-thread wake-up costs ~30 µs,
//! more than the loopback round trip (`baselines/README.md` §3).
//!
//! Without a reader thread, two things could wedge a link, and both are handled:
//! - a sender blocked on a full socket while the brick is blocked sending responses nobody
//!   reads: sends use a short socket send timeout, and a blocked sender drains responses;
//! - an unbounded backlog: at most [`MAX_IN_FLIGHT`] requests are in flight per link, and a
//!   batched read keeps at most [`READ_WINDOW`] batches in flight.
//!
//! Every wait has a deadline (the link's timeout). A closed connection, a timeout or a malformed
//! response marks the link broken: that request and every pending and later one fail with
//! [`LinkError::BrickLost`] naming the brick and the cause. Nothing ever returns zeros in place
//! of data.
//!
//! A `tls://` link keeps this design: one TLS connection state is shared by the reader and the
//! senders under a lock never held across blocking I/O (module `tls`, and `docs/architecture.md`,
//! "TLS links").

mod tls;
pub use tls::{TlsClient, TLS_CA_ENV};

use rackmem_proto::{
    attach_proof, encode_write_head, BrickInfo, BrickStats, Extent, Grant, Header, Opcode, Request, SegmentGrant,
    Status, HEADER_LEN, KEY_LEN, MAX_EXTENTS, MAX_PAYLOAD, NONCE_LEN,
};
use rackmem_sys::SharedMemory;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Default timeout of every wait on a link.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a link may sit idle before its owner should ping it ([`Link::keep_alive`]): well
/// under a brick's default idle timeout (10 min), so the brick never closes a link of a program
/// that merely has not needed remote memory for a while.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// Most requests a link has in flight (sent, response not yet read off the socket).
pub const MAX_IN_FLIGHT: i64 = 128;
/// Most READ batches one [`Link::read_pages`] call keeps in flight (each up to [`MAX_BATCH_BYTES`]).
pub const READ_WINDOW: usize = 4;
/// Most extents in one batched request sent by this crate.
pub const MAX_BATCH_EXTENTS: usize = 1024;
/// Most page bytes in one batched request sent by this crate (leaves room for the extent list).
pub const MAX_BATCH_BYTES: u64 = MAX_PAYLOAD as u64 - (1 << 16);
const _: () = assert!(MAX_BATCH_EXTENTS as u32 <= MAX_EXTENTS);

/// Most plaintext bytes a `tls://` sender seals before writing them out.
const TLS_SEAL_BYTES: usize = 256 << 10;

/// How long one blocked send waits before the sender checks for responses to drain.
const SEND_SLICE: Duration = Duration::from_millis(2);

/// Where a brick is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BrickAddr {
    /// `tcp://HOST:PORT`.
    Tcp(String),
    /// `unix:PATH`.
    Unix(PathBuf),
    /// `tls://HOST:PORT`: TCP carrying TLS; the brick's certificate must name HOST and chain to
    /// a CA the node trusts ([`TlsClient`]).
    Tls(String),
}

impl std::str::FromStr for BrickAddr {
    type Err = LinkError;
    fn from_str(s: &str) -> Result<Self, LinkError> {
        let bad = || LinkError::BadAddress(s.to_string());
        let host_port =
            |a: &str| matches!(a.rsplit_once(':'), Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok());
        if let Some(a) = s.strip_prefix("tcp://") {
            host_port(a).then(|| BrickAddr::Tcp(a.to_string())).ok_or_else(bad)
        } else if let Some(a) = s.strip_prefix("tls://") {
            host_port(a).then(|| BrickAddr::Tls(a.to_string())).ok_or_else(bad)
        } else if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                Err(bad())
            } else {
                Ok(BrickAddr::Unix(PathBuf::from(p)))
            }
        } else {
            Err(bad())
        }
    }
}

impl fmt::Display for BrickAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrickAddr::Tcp(a) => write!(f, "tcp://{a}"),
            BrickAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            BrickAddr::Tls(a) => write!(f, "tls://{a}"),
        }
    }
}

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

enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Unix(s) => s.as_raw_fd(),
        }
    }

    fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
        })
    }
    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_nonblocking(on),
            Sock::Unix(s) => s.set_nonblocking(on),
        }
    }

    fn set_timeouts(&self, read: Duration, write: Duration) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => {
                s.set_read_timeout(Some(read))?;
                s.set_write_timeout(Some(write))
            }
            Sock::Unix(s) => {
                s.set_read_timeout(Some(read))?;
                s.set_write_timeout(Some(write))
            }
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Sock::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(b),
            Sock::Unix(s) => s.read(b),
        }
    }
}

/// The receiving side of a link: the socket, how long a read polls before it sleeps, and the
/// file descriptors that came with the bytes (a brick sends one with its SHARE answer).
struct RxSock {
    sock: Sock,
    spin: Duration,
    fds: Arc<Mutex<Vec<OwnedFd>>>,
    /// The deadline of the wait this read serves: a read that would block waits only until
    /// then, however the bytes trickle in (the socket's own timeout bounds one read only).
    deadline: Option<Instant>,
    /// A `tls://` link's connection state, shared with the senders (see the `tls` module).
    tls: Option<Arc<Mutex<rustls::ClientConnection>>>,
    /// TLS bytes read off the socket and not yet handed to rustls.
    tls_in: TlsIn,
}

/// Raw TLS bytes read off the socket: `buf[start..end]` is not yet handed to rustls. A fixed
/// buffer, so that a read does not clear memory it is about to overwrite.
#[derive(Default)]
struct TlsIn {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl RxSock {
    fn recv(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match &mut self.sock {
            Sock::Unix(s) => {
                let mut got = Vec::new();
                let r = rackmem_sys::recv_with_fds(s.as_fd(), b, &mut got);
                if !got.is_empty() {
                    lock(&self.fds).extend(got);
                }
                r
            }
            other => other.read(b),
        }
    }
}

/// Most TLS bytes the reader takes off the socket at once.
const TLS_READ_BYTES: usize = 64 << 10;

impl Read for RxSock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        let Some(conn) = self.tls.clone() else {
            return self.read_raw(b);
        };
        if b.is_empty() {
            return Ok(0);
        }
        let mut raw = std::mem::take(&mut self.tls_in);
        let r = self.read_tls(&conn, &mut raw, b);
        self.tls_in = raw;
        r
    }
}

impl RxSock {
    /// Plaintext of a TLS link: what rustls holds already, else raw bytes off the socket
    /// (read without the connection lock, so senders keep sealing meanwhile) decrypted under
    /// it. Plaintext already decrypted is returned before the socket is polled: a poll would
    /// not see it.
    fn read_tls(&mut self, conn: &Mutex<rustls::ClientConnection>, raw: &mut TlsIn, b: &mut [u8]) -> io::Result<usize> {
        if raw.buf.is_empty() {
            raw.buf = vec![0; TLS_READ_BYTES];
        }
        loop {
            {
                let mut c = lock(conn);
                loop {
                    match c.reader().read(b) {
                        // 0: the brick closed the TLS session (close_notify).
                        Ok(n) => return Ok(n),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                    if raw.start == raw.end {
                        break;
                    }
                    let used = c.read_tls(&mut &raw.buf[raw.start..raw.end])?;
                    raw.start += used;
                    // A record that fails to decrypt, or an alert: the link breaks with it. What
                    // rustls queues to send meanwhile (a key update's answer) leaves with the
                    // next request, sealed in order (`tls::seal`).
                    c.process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")))?;
                    if used == 0 {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "TLS: rustls took no bytes"));
                    }
                }
            }
            let n = self.read_raw(&mut raw.buf)?;
            (raw.start, raw.end) = (0, n);
            if n == 0 {
                return Ok(0);
            }
        }
    }

    fn read_raw(&mut self, b: &mut [u8]) -> io::Result<usize> {
        if !self.spin.is_zero() && self.sock.set_nonblocking(true).is_ok() {
            // Poll before sleeping: a sleeping reader costs a cross-CPU wake-up when the
            // answer comes, often more than the brick takes to answer. Only the reader uses the
            // socket meanwhile (its sends are its own, between reads).
            let start = Instant::now();
            let r = loop {
                match self.recv(b) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if start.elapsed() > self.spin {
                            break None;
                        }
                        std::hint::spin_loop();
                    }
                    other => break Some(other),
                }
            };
            let _ = self.sock.set_nonblocking(false);
            if let Some(r) = r {
                return r;
            }
        }
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let fd = match &self.sock {
                Sock::Tcp(s) => s.as_fd(),
                Sock::Unix(s) => s.as_fd(),
            };
            // Past the deadline this still takes what has arrived already.
            if !rackmem_sys::poll_readable(fd, left)? {
                return Err(io::ErrorKind::TimedOut.into());
            }
        }
        self.recv(b)
    }
}

/// The sending half of a link, and the buffer TLS records are sealed into.
struct Tx {
    sock: Sock,
    sealed: Vec<u8>,
}

impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(b),
            Sock::Unix(s) => s.write(b),
        }
    }
    fn write_vectored(&mut self, b: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write_vectored(b),
            Sock::Unix(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A response read off the socket.
struct Frame {
    header: Header,
    payload: Vec<u8>,
    /// The payload went straight into the waiter's buffer (`payload` is empty).
    delivered: bool,
}

/// Who reads the socket, and the responses read for others.
#[derive(Default)]
struct RxState {
    /// A thread is reading the socket (it holds `Link::rx_sock`).
    reading: bool,
    /// Threads sleeping on `Link::rx_cv`.
    sleepers: usize,
    /// Responses read by one thread for another, by tag.
    parked: HashMap<u32, Frame>,
    /// Tags of dropped tickets: their responses are discarded when they arrive.
    abandoned: HashSet<u32>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One connection to a brick. `Send + Sync`: any number of threads may issue requests at once;
/// see the crate docs for how responses reach them. A brick closes connections silent for
/// longer than its idle timeout: an owner that may leave a link idle for long calls
/// [`Link::keep_alive`] now and then (the runtime's watchdog does, every
/// [`KEEPALIVE_INTERVAL`]).
pub struct Link {
    addr: BrickAddr,
    addr_text: String,
    info: BrickInfo,
    timeout: Duration,
    /// The sending half; a frame is written whole under this lock (for TLS: sealed and written,
    /// so records reach the socket in the order they were sealed).
    tx: Mutex<Tx>,
    /// A `tls://` link's connection state; locked only to seal or open records, never across
    /// blocking I/O.
    tls: Option<Arc<Mutex<rustls::ClientConnection>>>,
    /// The receiving half; only the thread that set `RxState::reading` locks it.
    rx_sock: Mutex<BufReader<RxSock>>,
    rx: Mutex<RxState>,
    rx_cv: Condvar,
    /// Requests sent whose responses are not read yet (may dip below 0 briefly: a response can
    /// be read before its sender counts it).
    unread: AtomicI64,
    next_tag: AtomicU32,
    /// Why the link is broken, once it is.
    broken: OnceLock<String>,
    /// A handle to shut the socket down, waking a blocked reader or sender.
    control: Sock,
    /// Descriptors received with responses (see [`Link::share`]), and one SHARE at a time.
    received_fds: Arc<Mutex<Vec<OwnedFd>>>,
    share_lock: Mutex<()>,
    /// When the link was made; `last_sent_ms` counts from it.
    born: Instant,
    /// Milliseconds after `born` at which the last request was sent.
    last_sent_ms: AtomicU64,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link").field("addr", &self.addr_text).finish()
    }
}

/// A request sent with [`Link::submit_read`] or [`Link::submit_write`] whose response is still
/// to be collected with [`Ticket::wait`]. Dropping a ticket abandons the response (it is
/// discarded when it arrives); the request itself may still have been carried out.
#[must_use = "a ticket's response says whether the request succeeded"]
pub struct Ticket<'a> {
    link: &'a Link,
    tag: u32,
    op: Opcode,
    /// Bytes the response carries (the extents' total for READ, 0 for WRITE).
    len: usize,
    done: bool,
}

impl Ticket<'_> {
    /// Bytes the response carries: the buffer size [`Ticket::wait`] needs (0 for a write).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a write ticket (no data in the response).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Waits for the response; for a read, copies the pages (in extent order) into `out`, which
    /// must be exactly [`Ticket::len`] bytes (pass `&mut []` for a write).
    pub fn wait(mut self, out: &mut [u8]) -> Result<(), LinkError> {
        self.done = true;
        let link = self.link;
        if out.len() != self.len {
            // Nothing can be delivered: drop the response when it comes.
            link.abandon(self.tag);
            return Err(link.invalid(format!(
                "{} byte buffer for a response of {} bytes",
                out.len(),
                self.len
            )));
        }
        link.wait_for_into(self.tag, self.op, out)
    }
}

impl<'a> Ticket<'a> {
    /// Detaches the ticket from its borrow of the link, for a holder that cannot keep one (a
    /// read-ahead kept across faults next to the link's owner). Collect it with
    /// [`Link::wait_detached`] or drop the response with [`Link::abandon_detached`]; a detached
    /// ticket that is simply dropped leaves its response parked on the link.
    pub fn detach(mut self) -> DetachedTicket {
        self.done = true;
        DetachedTicket {
            tag: self.tag,
            op: self.op,
            len: self.len,
        }
    }
}

/// A [`Ticket`] without its borrow of the link (see [`Ticket::detach`]).
#[derive(Debug)]
#[must_use = "wait for it or abandon it on its link"]
pub struct DetachedTicket {
    tag: u32,
    op: Opcode,
    len: usize,
}

impl DetachedTicket {
    /// Bytes the response carries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a response without payload.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.link.abandon(self.tag);
        }
    }
}

impl Link {
    /// Connects, says HELLO and returns the link. `timeout` bounds the connection attempt (with
    /// its TLS handshake) and, from then on, every wait on this link (see [`DEFAULT_TIMEOUT`]).
    /// A `tls://` brick is verified against the CA file named by [`TLS_CA_ENV`]; use
    /// [`Link::connect_with`] to give the CA explicitly.
    pub fn connect(addr: &BrickAddr, timeout: Duration) -> Result<Link, LinkError> {
        let tls = match addr {
            BrickAddr::Tls(_) => match TlsClient::from_env() {
                Some(Ok(t)) => Some(t),
                Some(Err(reason)) => {
                    return Err(LinkError::TlsSetup {
                        addr: addr.to_string(),
                        reason,
                    })
                }
                None => None,
            },
            _ => None,
        };
        Self::connect_with(addr, timeout, tls.as_ref())
    }

    /// As [`Link::connect`], with the CA certificates that a `tls://` brick's certificate must
    /// chain to (ignored for other addresses). A `tls://` address without `tls` fails with
    /// [`LinkError::TlsSetup`]: a link never falls back to an unverified or plain connection.
    pub fn connect_with(addr: &BrickAddr, timeout: Duration, tls: Option<&TlsClient>) -> Result<Link, LinkError> {
        let text = addr.to_string();
        let unreachable = |cause: String| LinkError::Unreachable {
            addr: text.clone(),
            cause,
        };
        let started = Instant::now();
        let client = match (addr, tls) {
            (BrickAddr::Tls(_), None) => {
                return Err(LinkError::TlsSetup {
                    addr: text.clone(),
                    reason: format!(
                        "no CA to verify the brick's certificate with: set {TLS_CA_ENV} (or --tls-ca) to the \
                         PEM file of the CA that signed it"
                    ),
                })
            }
            (BrickAddr::Tls(_), Some(t)) => Some(t),
            _ => None,
        };
        let mut tls_conn = None;
        let sock = match addr {
            BrickAddr::Tcp(a) | BrickAddr::Tls(a) => {
                let sa = a
                    .to_socket_addrs()
                    .map_err(|e| unreachable(format!("cannot resolve: {e}")))?
                    .next()
                    .ok_or_else(|| unreachable("the name resolves to no address".into()))?;
                let s = TcpStream::connect_timeout(&sa, timeout).map_err(|e| unreachable(e.to_string()))?;
                s.set_nodelay(true).map_err(|e| unreachable(e.to_string()))?;
                if let Some(client) = client {
                    s.set_read_timeout(Some(timeout))
                        .and_then(|()| s.set_write_timeout(Some(timeout)))
                        .map_err(|e| unreachable(e.to_string()))?;
                    let conn = tls::handshake(client, a, &s, started + timeout).map_err(&unreachable)?;
                    tls_conn = Some(Arc::new(Mutex::new(conn)));
                }
                Sock::Tcp(s)
            }
            BrickAddr::Unix(p) => Sock::Unix(UnixStream::connect(p).map_err(|e| unreachable(e.to_string()))?),
        };
        // SO_RCVTIMEO and SO_SNDTIMEO belong to the socket, shared by the clones below.
        sock.set_timeouts(timeout, SEND_SLICE)
            .map_err(|e| unreachable(e.to_string()))?;
        let tx = sock.try_clone().map_err(|e| unreachable(e.to_string()))?;
        let control = sock.try_clone().map_err(|e| unreachable(e.to_string()))?;
        let received_fds = Arc::new(Mutex::new(Vec::new()));
        let mut link = Link {
            addr: addr.clone(),
            addr_text: text.clone(),
            info: BrickInfo {
                pool_bytes: 0,
                free_bytes: 0,
                page_size: rackmem_proto::PAGE_SIZE,
                max_payload: MAX_PAYLOAD,
                brick_id: 0,
                nonce: [0; NONCE_LEN],
            },
            timeout,
            tx: Mutex::new(Tx {
                sock: tx,
                sealed: Vec::new(),
            }),
            tls: tls_conn.clone(),
            rx_sock: Mutex::new(BufReader::with_capacity(
                256 << 10,
                RxSock {
                    sock,
                    spin: Duration::ZERO,
                    fds: received_fds.clone(),
                    deadline: None,
                    tls: tls_conn,
                    tls_in: TlsIn::default(),
                },
            )),
            rx: Mutex::new(RxState::default()),
            rx_cv: Condvar::new(),
            unread: AtomicI64::new(0),
            next_tag: AtomicU32::new(1),
            broken: OnceLock::new(),
            control,
            received_fds,
            share_lock: Mutex::new(()),
            born: Instant::now(),
            last_sent_ms: AtomicU64::new(0),
        };
        let r = link
            .call(&Request::Hello)
            .map_err(|e| unreachable(format!("no HELLO answer: {e}")))?;
        link.info = BrickInfo::decode(&r).map_err(|e| {
            if r.len() == BrickInfo::LEN - NONCE_LEN {
                unreachable(
                    "the brick predates per-connection nonces (grants with proof of possession): upgrade it".into(),
                )
            } else {
                unreachable(format!("bad HELLO answer: {e}"))
            }
        })?;
        Ok(link)
    }

    /// Sends a PING and waits for its answer if this link has sent nothing for `idle`; returns
    /// whether it did. A brick closes connections silent for longer than its idle timeout (10
    /// min by default), so an owner whose link may sit idle (a program whose working set fits
    /// its local buffer) calls this periodically with an `idle` well below that, such as
    /// [`KEEPALIVE_INTERVAL`]. Costs one small request per interval on an idle link, nothing on
    /// a busy one. Fails as any request does, breaking the link, when the brick is gone.
    pub fn keep_alive(&self, idle: Duration) -> Result<bool, LinkError> {
        let sent_ms = self.last_sent_ms.load(Ordering::Relaxed);
        let now_ms = self.born.elapsed().as_millis() as u64;
        if now_ms.saturating_sub(sent_ms) < idle.as_millis() as u64 {
            return Ok(false);
        }
        self.ping().map(|_| true)
    }

    /// The file descriptors of this link's socket (it holds several handles to it). A forked
    /// child inherits them; it closes them (never using the link) so that the brick sees the
    /// parent's connection end when the parent exits.
    pub fn raw_fds(&self) -> Vec<std::os::fd::RawFd> {
        vec![
            lock(&self.tx).sock.raw_fd(),
            lock(&self.rx_sock).get_ref().sock.raw_fd(),
            self.control.raw_fd(),
        ]
    }

    /// Makes reads on this link poll for up to `spin` before sleeping (0: sleep at once). For a
    /// link whose answers come within tens of microseconds and whose reader has a CPU to spare.
    pub fn set_receive_spin(&self, spin: Duration) {
        lock(&self.rx_sock).get_mut().spin = spin;
    }

    /// The brick's address.
    pub fn addr(&self) -> &BrickAddr {
        &self.addr
    }

    /// What the brick said at HELLO, including this connection's nonce (which
    /// [`Link::attach`] proofs are bound to).
    pub fn info(&self) -> &BrickInfo {
        &self.info
    }

    /// The timeout of every wait on this link.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// True once the link is broken (every request fails with [`LinkError::BrickLost`]).
    pub fn is_broken(&self) -> bool {
        self.broken.get().is_some()
    }

    /// Marks the link broken (first cause wins), wakes everyone, returns the error.
    fn lost(&self, cause: String) -> LinkError {
        if self.broken.set(cause).is_ok() {
            // Wakes a reader blocked in read() and a sender blocked in write().
            self.control.shutdown();
            let _st = lock(&self.rx);
            self.rx_cv.notify_all();
        }
        self.lost_error()
    }

    fn lost_error(&self) -> LinkError {
        LinkError::BrickLost {
            addr: self.addr_text.clone(),
            cause: self.broken.get().cloned().unwrap_or_default(),
        }
    }

    fn invalid(&self, reason: String) -> LinkError {
        LinkError::Invalid {
            addr: self.addr_text.clone(),
            reason,
        }
    }

    fn abandon(&self, tag: u32) {
        let mut st = lock(&self.rx);
        if st.parked.remove(&tag).is_none() {
            st.abandoned.insert(tag);
        }
    }

    /// Reads one response frame; called only by the thread that set `RxState::reading`. A
    /// successful response to `dest`'s tag of exactly its length is read straight into it,
    /// sparing a buffer and a copy of every page fetched.
    fn read_frame(&self, dest: Option<(u32, &mut [u8])>, deadline: Instant) -> Result<Frame, LinkError> {
        let mut sock = lock(&self.rx_sock);
        sock.get_mut().deadline = Some(deadline);
        let mut hdr = [0u8; HEADER_LEN];
        if let Err(e) = sock.read_exact(&mut hdr) {
            let cause = match e.kind() {
                _ if self.is_broken() => return Err(self.lost_error()),
                io::ErrorKind::UnexpectedEof => "connection closed by the brick".to_string(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    format!("no response within {:?}", self.timeout)
                }
                _ => format!("receive failed: {e}"),
            };
            return Err(self.lost(cause));
        }
        let header = Header::decode(&hdr).map_err(|e| self.lost(format!("malformed response: {e}")))?;
        if !header.is_response() {
            return Err(self.lost("the peer sent a request where a response was due".into()));
        }
        if header.tag == 0 && header.status != Status::Ok.code() {
            // Tag 0 is no request of ours: the brick says why it closes the connection (a
            // malformed frame, or one of its limits), and the reason is the link's cause.
            let mut why = vec![0u8; (header.payload_len as usize).min(rackmem_proto::MAX_MESSAGE)];
            let _ = sock.read_exact(&mut why);
            return Err(self.lost(format!(
                "the brick closed the connection: {}: {}",
                Status::from_u32(header.status),
                String::from_utf8_lossy(&why)
            )));
        }
        if let Some((tag, out)) = dest {
            if header.tag == tag && header.status == Status::Ok.code() && header.payload_len as usize == out.len() {
                sock.read_exact(out)
                    .map_err(|e| self.lost(format!("truncated response: {e}")))?;
                return Ok(Frame {
                    header,
                    payload: Vec::new(),
                    delivered: true,
                });
            }
        }
        let mut payload = vec![0u8; header.payload_len as usize];
        sock.read_exact(&mut payload)
            .map_err(|e| self.lost(format!("truncated response: {e}")))?;
        Ok(Frame {
            header,
            payload,
            delivered: false,
        })
    }

    /// Moves responses off the socket until `done` yields, taking the reader's role when nobody
    /// holds it and sleeping otherwise; fails when the link breaks or `deadline` passes.
    fn pump<T>(
        &self,
        deadline: Instant,
        what: impl Fn() -> String,
        mut dest: Option<(u32, &mut [u8])>,
        mut done: impl FnMut(&mut RxState) -> Option<T>,
    ) -> Result<T, LinkError> {
        let mut st = lock(&self.rx);
        loop {
            if let Some(t) = done(&mut st) {
                return Ok(t);
            }
            if self.is_broken() {
                return Err(self.lost_error());
            }
            if !st.reading {
                st.reading = true;
                drop(st);
                let r = self.read_frame(dest.as_mut().map(|(t, b)| (*t, &mut **b)), deadline);
                st = lock(&self.rx);
                st.reading = false;
                match r {
                    Ok(f) => {
                        self.unread.fetch_sub(1, Ordering::AcqRel);
                        if !st.abandoned.remove(&f.header.tag) {
                            st.parked.insert(f.header.tag, f);
                        }
                    }
                    Err(e) => {
                        self.rx_cv.notify_all();
                        return Err(e);
                    }
                }
                if st.sleepers > 0 {
                    // The frame may be theirs, and one of them must take over reading.
                    self.rx_cv.notify_all();
                }
            } else {
                let now = Instant::now();
                if now >= deadline {
                    drop(st);
                    return Err(self.lost(format!("{} within {:?}", what(), self.timeout)));
                }
                st.sleepers += 1;
                st = self
                    .rx_cv
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                st.sleepers -= 1;
            }
        }
    }

    /// After a send failed: if the brick said why it closed the connection (a tag-0 answer, as
    /// it sends for a connection over its limits), breaks the link with that reason, which is
    /// more use to the user than "broken pipe". Takes only what has arrived already.
    fn why_closed(&self) {
        let mut st = lock(&self.rx);
        if st.reading {
            return;
        }
        st.reading = true;
        drop(st);
        // Any other frame is dropped: the link breaks right after this anyway.
        let _ = self.read_frame(None, Instant::now());
        lock(&self.rx).reading = false;
    }

    /// Reads one response off the socket if responses are due and nobody else is reading. A
    /// sender whose socket is full calls this so the brick, which may be blocked sending
    /// responses, can make progress.
    fn drain_some(&self, deadline: Instant) -> Result<(), LinkError> {
        let mut st = lock(&self.rx);
        if st.reading || self.unread.load(Ordering::Acquire) <= 0 {
            return Ok(());
        }
        st.reading = true;
        drop(st);
        let r = self.read_frame(None, deadline);
        let mut st = lock(&self.rx);
        st.reading = false;
        let r = r.map(|f| {
            self.unread.fetch_sub(1, Ordering::AcqRel);
            if !st.abandoned.remove(&f.header.tag) {
                st.parked.insert(f.header.tag, f);
            }
        });
        if st.sleepers > 0 {
            self.rx_cv.notify_all();
        }
        r
    }

    /// Sends one frame (`head` then `data`) and returns its tag. `head` is built for the tag.
    fn send(&self, op: Opcode, head: impl FnOnce(u32) -> Vec<u8>, data: &[u8]) -> Result<u32, LinkError> {
        if self.is_broken() {
            return Err(self.lost_error());
        }
        let deadline = Instant::now() + self.timeout;
        if self.unread.load(Ordering::Acquire) >= MAX_IN_FLIGHT {
            self.pump(
                deadline,
                || format!("{MAX_IN_FLIGHT} requests in flight, none answered"),
                None,
                |_| (self.unread.load(Ordering::Acquire) < MAX_IN_FLIGHT).then_some(()),
            )?;
        }
        let tag = loop {
            let t = self.next_tag.fetch_add(1, Ordering::Relaxed);
            // Tag 0 is what a brick answers frames it cannot parse with.
            if t != 0 {
                break t;
            }
        };
        let head = head(tag);
        let mut guard = lock(&self.tx);
        let tx = &mut *guard;
        match &self.tls {
            None => self.write_out(
                &mut tx.sock,
                &mut [IoSlice::new(&head), IoSlice::new(data)],
                op,
                deadline,
            )?,
            Some(conn) => {
                // Sealed in pieces so that a large WRITE is not copied whole before it leaves.
                let mut pieces = data.chunks(TLS_SEAL_BYTES).peekable();
                let mut first = true;
                loop {
                    let piece = pieces.next().unwrap_or_default();
                    let with_head = [IoSlice::new(&head), IoSlice::new(piece)];
                    let bufs = if first { &with_head[..] } else { &with_head[1..] };
                    first = false;
                    if let Err(e) = tls::seal(&mut lock(conn), bufs, &mut tx.sealed) {
                        return Err(self.lost(format!("TLS: cannot seal {op:?}: {e}")));
                    }
                    let sealed = std::mem::take(&mut tx.sealed);
                    let r = self.write_out(&mut tx.sock, &mut [IoSlice::new(&sealed)], op, deadline);
                    tx.sealed = sealed;
                    r?;
                    if pieces.peek().is_none() {
                        break;
                    }
                }
            }
        }
        drop(guard);
        self.unread.fetch_add(1, Ordering::AcqRel);
        self.last_sent_ms
            .store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
        Ok(tag)
    }

    /// Writes `bufs` whole to the socket by `deadline`, draining responses while the socket is
    /// full (the brick may be blocked sending them).
    fn write_out(
        &self,
        tx: &mut Sock,
        bufs: &mut [IoSlice<'_>],
        op: Opcode,
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let mut bufs = bufs;
        IoSlice::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            match tx.write_vectored(bufs) {
                Ok(0) => return Err(self.lost("connection closed while sending".into())),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if self.is_broken() {
                        return Err(self.lost_error());
                    }
                    if Instant::now() >= deadline {
                        return Err(self.lost(format!("could not send {op:?} within {:?}", self.timeout)));
                    }
                    self.drain_some(deadline)?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if self.is_broken() => {
                    let _ = e;
                    return Err(self.lost_error());
                }
                Err(e) => {
                    self.why_closed();
                    return Err(self.lost(format!("send failed: {e}")));
                }
            }
        }
        Ok(())
    }

    fn submit(&self, req: &Request) -> Result<u32, LinkError> {
        self.send(req.opcode(), |tag| req.encode(tag), &[])
    }

    /// Waits for the response to `tag`; returns its payload or the brick's refusal.
    fn wait_for(&self, tag: u32, op: Opcode) -> Result<Vec<u8>, LinkError> {
        let f = self.wait_frame(tag, op, None)?;
        Ok(f.payload)
    }

    /// Waits for the response to `tag` and puts its payload, which must be `out.len()` bytes,
    /// in `out`: straight from the socket when this thread reads it, else from where the thread
    /// that read it parked it.
    fn wait_for_into(&self, tag: u32, op: Opcode, out: &mut [u8]) -> Result<(), LinkError> {
        let want = out.len();
        let f = self.wait_frame(tag, op, Some(&mut *out))?;
        if f.delivered {
            return Ok(());
        }
        if f.payload.len() != want {
            return Err(self.lost(format!("{op:?} answer of {} bytes, expected {want}", f.payload.len())));
        }
        out.copy_from_slice(&f.payload);
        Ok(())
    }

    fn wait_frame(&self, tag: u32, op: Opcode, out: Option<&mut [u8]>) -> Result<Frame, LinkError> {
        let deadline = Instant::now() + self.timeout;
        let f = self.pump(
            deadline,
            || format!("no response to {op:?} (tag {tag})"),
            out.map(|b| (tag, b)),
            |st| st.parked.remove(&tag),
        )?;
        let status = Status::from_u32(f.header.status);
        if status != Status::Ok {
            return Err(LinkError::Refused {
                addr: self.addr_text.clone(),
                op,
                status,
                message: String::from_utf8_lossy(&f.payload).into_owned(),
            });
        }
        if f.header.opcode != op {
            return Err(self.lost(format!(
                "response to {op:?} (tag {tag}) came back as {:?}",
                f.header.opcode
            )));
        }
        Ok(f)
    }

    fn call(&self, req: &Request) -> Result<Vec<u8>, LinkError> {
        let tag = self.submit(req)?;
        self.wait_for(tag, req.opcode())
    }

    /// Standalone mode: carves a segment of at least `size_bytes` (rounded up to the brick's
    /// chunk) with the brick's shared secret, and attaches this link to it. Returns the grant
    /// and its session key, which other links need to attach to the segment.
    pub fn alloc_segment(&self, secret: &[u8], size_bytes: u64) -> Result<SegmentGrant, LinkError> {
        let p = self.call(&Request::Alloc {
            size_bytes,
            secret: secret.to_vec(),
        })?;
        SegmentGrant::decode(&p).map_err(|e| self.lost(format!("bad grant in ALLOC answer: {e}")))
    }

    /// Binds this link to the grant's segment, proving with `session_key` (which never leaves
    /// this process) that it holds the grant, for this connection only. A forged, expired or
    /// unproven grant is refused with its own status and the brick closes the connection.
    pub fn attach(&self, grant: &Grant, session_key: &[u8; KEY_LEN]) -> Result<(), LinkError> {
        let proof = attach_proof(session_key, &self.info.nonce, grant.segment_id);
        self.call(&Request::Attach {
            grant: grant.clone(),
            proof,
        })
        .map(|_| ())
    }

    /// Maps the attached segment into this process: the brick moves it into shared memory and
    /// hands over its descriptor, after which reads and writes of the returned memory *are* reads
    /// and writes of the segment, without a request. Only a brick on this host can do that:
    /// over TCP this fails with [`LinkError::Invalid`] before sending anything.
    pub fn share(&self) -> Result<SharedMemory, LinkError> {
        if !matches!(self.addr, BrickAddr::Unix(_)) {
            return Err(self.invalid(
                "shared memory needs a Unix-socket link to a brick on this host (TCP and TLS cannot carry a \
                 descriptor)"
                    .into(),
            ));
        }
        let _one = lock(&self.share_lock);
        let p = self.call(&Request::Share)?;
        // The descriptor arrived with the response's first bytes, so it is here by now; any
        // other descriptor is not one we asked for.
        let fd = {
            let mut fds = lock(&self.received_fds);
            let fd = fds.pop();
            fds.clear();
            fd
        };
        let (Some(fd), Ok(size)) = (fd, <[u8; 8]>::try_from(p.as_slice())) else {
            return Err(self.lost("SHARE answer without a memory descriptor or size".into()));
        };
        let size = u64::from_le_bytes(size);
        let len = usize::try_from(size).map_err(|_| self.lost(format!("SHARE answer: size {size} too large")))?;
        SharedMemory::open(fd, len).map_err(|e| self.invalid(format!("cannot map the shared segment: {e}")))
    }

    /// Unbinds this link from its segment (the brick frees the segment when nobody is attached).
    pub fn detach(&self) -> Result<(), LinkError> {
        self.call(&Request::Detach).map(|_| ())
    }

    /// Copy-on-write clone of the attached segment; the grant (with its session key) is for the
    /// new segment, which the brick frees if nobody attaches to it within its grace period.
    /// Bricks managed by a control plane refuse it (`Denied`).
    pub fn clone_segment(&self) -> Result<SegmentGrant, LinkError> {
        let p = self.call(&Request::Clone)?;
        SegmentGrant::decode(&p).map_err(|e| self.lost(format!("bad grant in CLONE answer: {e}")))
    }

    /// Cuts extents longer than one batch may carry into batch-sized pieces.
    fn pieces(extents: &[Extent]) -> std::borrow::Cow<'_, [Extent]> {
        let piece = MAX_BATCH_BYTES as u32;
        if extents.iter().all(|e| e.1 <= piece) {
            return std::borrow::Cow::Borrowed(extents);
        }
        let mut v = Vec::with_capacity(extents.len() + 8);
        for &(o, l) in extents {
            let mut done = 0u32;
            while done < l {
                let n = (l - done).min(piece);
                v.push((o + done as u64, n));
                done += n;
            }
        }
        std::borrow::Cow::Owned(v)
    }

    /// Splits extents in batches within the per-request limits (after [`Link::pieces`]).
    fn batches(extents: &[Extent]) -> Vec<&[Extent]> {
        let mut out = Vec::new();
        let mut start = 0;
        let mut bytes = 0u64;
        for (i, e) in extents.iter().enumerate() {
            if i > start && (bytes + e.1 as u64 > MAX_BATCH_BYTES || i - start >= MAX_BATCH_EXTENTS) {
                out.push(&extents[start..i]);
                start = i;
                bytes = 0;
            }
            bytes += e.1 as u64;
        }
        if start < extents.len() {
            out.push(&extents[start..]);
        }
        out
    }

    /// Checks what the brick would refuse anyway, so the caller gets a clear error and the
    /// connection survives. Returns the extents' total.
    fn check_extents(&self, extents: &[Extent], buf_len: usize) -> Result<usize, LinkError> {
        let page = rackmem_proto::PAGE_SIZE;
        if let Some(&(o, l)) = extents
            .iter()
            .find(|&&(o, l)| l == 0 || l % page != 0 || o % page as u64 != 0)
        {
            return Err(self.invalid(format!("extent {o:#x}+{l:#x} is not a run of whole pages")));
        }
        let total: u64 = extents.iter().map(|e| e.1 as u64).sum();
        if total != buf_len as u64 {
            return Err(self.invalid(format!("{buf_len} byte buffer for {total} bytes of extents")));
        }
        Ok(buf_len)
    }

    /// Waits for a detached ticket's response (see [`Ticket::wait`]); it must come from this link.
    pub fn wait_detached(&self, t: DetachedTicket, out: &mut [u8]) -> Result<(), LinkError> {
        if out.len() != t.len {
            self.abandon(t.tag);
            return Err(self.invalid(format!("{} byte buffer for a response of {} bytes", out.len(), t.len)));
        }
        self.wait_for_into(t.tag, t.op, out)
    }

    /// Drops a detached ticket's response when it arrives; nothing is written to any buffer.
    pub fn abandon_detached(&self, t: DetachedTicket) {
        self.abandon(t.tag);
    }

    /// Sends one batched READ without waiting; the extents must fit one request
    /// ([`MAX_BATCH_EXTENTS`], [`MAX_BATCH_BYTES`]). Collect the pages with [`Ticket::wait`].
    pub fn submit_read(&self, extents: &[Extent]) -> Result<Ticket<'_>, LinkError> {
        let total = extents.iter().map(|e| e.1 as u64).sum::<u64>();
        if extents.is_empty() || extents.len() > MAX_BATCH_EXTENTS || total > MAX_BATCH_BYTES {
            return Err(self.invalid(format!(
                "a batch needs 1 to {MAX_BATCH_EXTENTS} extents and at most {MAX_BATCH_BYTES} bytes \
                 (got {} extents, {total} bytes); read_pages splits larger reads",
                extents.len()
            )));
        }
        let len = self.check_extents(extents, total as usize)?;
        let tag = self.submit(&Request::Read(extents.to_vec()))?;
        Ok(Ticket {
            link: self,
            tag,
            op: Opcode::Read,
            len,
            done: false,
        })
    }

    /// Sends one batched WRITE without waiting (same limits as [`Link::submit_read`]); `data`
    /// holds the extents' bytes in order. Learn the outcome with [`Ticket::wait`] (`&mut []`).
    pub fn submit_write(&self, extents: &[Extent], data: &[u8]) -> Result<Ticket<'_>, LinkError> {
        if extents.is_empty() || extents.len() > MAX_BATCH_EXTENTS || data.len() as u64 > MAX_BATCH_BYTES {
            return Err(self.invalid(format!(
                "a batch needs 1 to {MAX_BATCH_EXTENTS} extents and at most {MAX_BATCH_BYTES} bytes \
                 (got {} extents, {} bytes); write_pages splits larger writes",
                extents.len(),
                data.len()
            )));
        }
        self.check_extents(extents, data.len())?;
        let tag = self.send(Opcode::Write, |tag| encode_write_head(tag, extents, data.len()), data)?;
        Ok(Ticket {
            link: self,
            tag,
            op: Opcode::Write,
            len: 0,
            done: false,
        })
    }

    /// Reads the extents, in order, into `out` (whose length must be their total). Large reads
    /// are split in batches, [`READ_WINDOW`] of them in flight at a time.
    pub fn read_pages(&self, extents: &[Extent], out: &mut [u8]) -> Result<(), LinkError> {
        self.check_extents(extents, out.len())?;
        let mut window: VecDeque<Ticket<'_>> = VecDeque::new();
        let mut rest: &mut [u8] = out;
        let pieces = Self::pieces(extents);
        for b in Self::batches(&pieces) {
            if window.len() >= READ_WINDOW {
                if let Some(t) = window.pop_front() {
                    let (head, tail) = std::mem::take(&mut rest).split_at_mut(t.len());
                    t.wait(head)?;
                    rest = tail;
                }
            }
            window.push_back(self.submit_read(b)?);
        }
        for t in window {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(t.len());
            t.wait(head)?;
            rest = tail;
        }
        Ok(())
    }

    /// Writes `data` to the extents, in order (its length must be their total). Large writes
    /// are split in batches, all pipelined.
    pub fn write_pages(&self, extents: &[Extent], data: &[u8]) -> Result<(), LinkError> {
        self.check_extents(extents, data.len())?;
        let mut at = 0usize;
        let mut tickets = Vec::new();
        let pieces = Self::pieces(extents);
        for b in Self::batches(&pieces) {
            let n: usize = b.iter().map(|e| e.1 as usize).sum();
            tickets.push(self.submit_write(b, &data[at..at + n])?);
            at += n;
        }
        for t in tickets {
            t.wait(&mut [])?;
        }
        Ok(())
    }

    /// Zeroes a page-aligned range of the segment and releases its memory on the brick.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), LinkError> {
        self.call(&Request::Discard { offset, len }).map(|_| ())
    }

    /// Asks the brick to give `[offset, offset + len)` of the segment memory now (POPULATE;
    /// page-aligned), without waiting: the brick of a mapped segment then owns those pages
    /// before this node writes them. Learn the outcome with [`Ticket::wait`] (`&mut []`), or
    /// detach the ticket and abandon it when the answer does not matter.
    pub fn submit_populate(&self, offset: u64, len: u64) -> Result<Ticket<'_>, LinkError> {
        let page = rackmem_proto::PAGE_SIZE as u64;
        if len == 0 || len % page != 0 || offset % page != 0 {
            return Err(self.invalid(format!("populate {offset:#x}+{len:#x} is not a run of whole pages")));
        }
        let tag = self.submit(&Request::Populate { offset, len })?;
        Ok(Ticket {
            link: self,
            tag,
            op: Opcode::Populate,
            len: 0,
            done: false,
        })
    }

    /// Copies `len` bytes from `src` to `dst` within the segment, on the brick (ranges may
    /// overlap, offsets page-aligned).
    pub fn copy_within(&self, src: u64, dst: u64, len: u64) -> Result<(), LinkError> {
        self.call(&Request::Copy { src, dst, len }).map(|_| ())
    }

    /// Round trip time of a PING.
    pub fn ping(&self) -> Result<Duration, LinkError> {
        let t = Instant::now();
        self.call(&Request::Ping)?;
        Ok(t.elapsed())
    }

    /// The brick's counters.
    pub fn stats(&self) -> Result<BrickStats, LinkError> {
        let p = self.call(&Request::Stats)?;
        BrickStats::decode(&p).map_err(|e| self.lost(format!("bad STATS answer: {e}")))
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.control.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        for s in [
            "tcp://127.0.0.1:7070",
            "unix:/tmp/b.sock",
            "tcp://host:1",
            "tls://brick.example:7070",
        ] {
            let a: BrickAddr = s.parse().unwrap();
            assert_eq!(a.to_string(), s);
        }
        for s in [
            "",
            "tcp://",
            "tcp://host",
            "tcp://:80",
            "http://x:1",
            "unix:",
            "tls://",
            "tls://host",
            "tls://:1",
        ] {
            assert!(s.parse::<BrickAddr>().is_err(), "{s}");
        }
    }

    /// Both ends change keys mid-stream (TLS 1.3 KeyUpdate, which rustls also does by itself
    /// before a key's confidentiality limit): the node asks, the brick answers with its own,
    /// which the link's reader opens between responses; pages still round-trip.
    #[test]
    fn a_tls_key_update_mid_stream_keeps_the_link_working() {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
        let ca_key = KeyPair::generate().expect("key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca = ca_params.self_signed(&ca_key).expect("CA");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("certificate");
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert_file, key_file) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert_file, cert.pem()).expect("write");
        std::fs::write(&key_file, key.serialize_pem()).expect("write");
        let brick = rackmem_brick::Brick::start(rackmem_brick::BrickConfig {
            listen: rackmem_brick::ListenAddr::Tls("127.0.0.1:0".into()),
            size_bytes: 64 << 20,
            key: b"k".to_vec(),
            secret: Some(b"s".to_vec()),
            managed: false,
            limits: Default::default(),
            tls: Some(rackmem_brick::tls_server_config(&cert_file, &key_file).expect("config")),
        })
        .expect("brick");
        let addr: BrickAddr = brick.local_addr().parse().expect("address");
        let trust = TlsClient::from_ca_pem(ca.pem().as_bytes()).expect("CA");
        let link = Link::connect_with(&addr, DEFAULT_TIMEOUT, Some(&trust)).expect("link");
        link.alloc_segment(b"s", 8 << 20).expect("alloc");
        let page = |round: u8| (0..4096 * 64).map(|i| (i as u8) ^ round).collect::<Vec<u8>>();
        for round in 0..4u8 {
            let conn = link.tls.as_ref().expect("a TLS link");
            lock(conn).refresh_traffic_keys().expect("key update");
            let data = page(round);
            link.write_pages(&[(0, data.len() as u32)], &data)
                .expect("write after a key update");
            let mut back = vec![0u8; data.len()];
            link.read_pages(&[(0, back.len() as u32)], &mut back)
                .expect("read after a key update");
            assert!(back == data, "round {round}: pages differ after a key update");
        }
        assert!(!link.is_broken());
    }

    #[test]
    fn batches_respect_limits() {
        let ext: Vec<Extent> = (0..3000).map(|i| (i * 4096, 4096)).collect();
        let b = Link::batches(&ext);
        assert_eq!(b.iter().map(|x| x.len()).sum::<usize>(), 3000);
        assert!(b.iter().all(|x| x.len() <= MAX_BATCH_EXTENTS));
        let big: Vec<Extent> = (0..10).map(|i| (i << 24, 4 << 20)).collect();
        let huge = [(0u64, 40u32 << 20)];
        let p = Link::pieces(&huge);
        assert_eq!(p.iter().map(|e| e.1 as u64).sum::<u64>(), 40 << 20);
        assert!(p.iter().all(|e| e.1 as u64 <= MAX_BATCH_BYTES && e.0 % 4096 == 0));
        let b = Link::batches(&big);
        assert!(b
            .iter()
            .all(|x| x.iter().map(|e| e.1 as u64).sum::<u64>() <= MAX_BATCH_BYTES));
        assert_eq!(b.iter().map(|x| x.len()).sum::<usize>(), 10);
    }
}
