//! A link's state: its socket halves, who reads responses and what was read for whom, whether it
//! is broken and why. The request path is spread over `sender` (frames out), `reader` (responses
//! in), `requests` and `pages` (what a caller asks for); connecting is `connect`.

use crate::addr::BrickAddr;
use crate::error::LinkError;
use crate::socket::{RxSock, Sock, Tx};
use crate::sync::lock;
use rackmem_proto::{BrickInfo, Header};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::BufReader;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A response read off the socket.
pub(crate) struct Frame {
    pub(crate) header: Header,
    pub(crate) payload: Vec<u8>,
    /// The payload went straight into the waiter's buffer (`payload` is empty).
    pub(crate) delivered: bool,
    /// On an emulated link, when the waiter may have it.
    pub(crate) deliver_at: Option<Instant>,
}

/// Who reads the socket, and the responses read for others.
#[derive(Default)]
pub(crate) struct RxState {
    /// A thread is reading the socket (it holds `Link::rx_sock`).
    pub(crate) reading: bool,
    /// Threads sleeping on `Link::rx_cv`.
    pub(crate) sleepers: usize,
    /// Responses read by one thread for another, by tag.
    pub(crate) parked: HashMap<u32, Frame>,
    /// Tags of dropped tickets: their responses are discarded when they arrive.
    pub(crate) abandoned: HashSet<u32>,
}

/// One connection to a brick. `Send + Sync`: any number of threads may issue requests at once;
/// see the crate docs for how responses reach them. A brick closes connections silent for
/// longer than its idle timeout: an owner that may leave a link idle for long calls
/// [`Link::keep_alive`] now and then (the runtime's watchdog does, every
/// [`KEEPALIVE_INTERVAL`](crate::KEEPALIVE_INTERVAL)).
pub struct Link {
    pub(crate) addr: BrickAddr,
    pub(crate) addr_text: String,
    pub(crate) info: BrickInfo,
    pub(crate) timeout: Duration,
    /// The sending half; a frame is written whole under this lock (for TLS: sealed and written,
    /// so records reach the socket in the order they were sealed).
    pub(crate) tx: Mutex<Tx>,
    /// A `tls://` link's connection state; locked only to seal or open records, never across
    /// blocking I/O.
    pub(crate) tls: Option<Arc<Mutex<rustls::ClientConnection>>>,
    /// The receiving half; only the thread that set `RxState::reading` locks it.
    pub(crate) rx_sock: Mutex<BufReader<RxSock>>,
    pub(crate) rx: Mutex<RxState>,
    pub(crate) rx_cv: Condvar,
    /// Requests sent whose responses are not read yet (may dip below 0 briefly: a response can
    /// be read before its sender counts it).
    pub(crate) unread: AtomicI64,
    pub(crate) next_tag: AtomicU32,
    /// Why the link is broken, once it is.
    pub(crate) broken: OnceLock<String>,
    /// A handle to shut the socket down, waking a blocked reader or sender.
    pub(crate) control: Sock,
    /// Descriptors received with responses (see [`Link::share`]), and one SHARE at a time.
    pub(crate) received_fds: Arc<Mutex<Vec<OwnedFd>>>,
    pub(crate) share_lock: Mutex<()>,
    /// When the link was made; `last_sent_ms` counts from it.
    pub(crate) born: Instant,
    /// Milliseconds after `born` at which the last request was sent.
    pub(crate) last_sent_ms: AtomicU64,
    /// The network this link pretends to cross, if any.
    pub(crate) emulator: Option<crate::emulate::Emulator>,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link").field("addr", &self.addr_text).finish()
    }
}

impl Link {
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

    /// Lets reads on this link poll for up to `spin` before sleeping (0: sleep at once). Whether
    /// a read polls is measured on the link as it runs (module `spin`): polling is kept only
    /// while polled reads wait less than sleeping ones, so a busy machine turns it off.
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

    /// True if this link's responses are delayed as an emulated network would (see
    /// [`EMULATE_ENV`](crate::EMULATE_ENV)).
    pub fn is_emulated(&self) -> bool {
        self.emulator.is_some()
    }

    /// The timeout of every wait on this link.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// True once the link is broken (every request fails with [`LinkError::BrickLost`]).
    pub fn is_broken(&self) -> bool {
        self.broken.get().is_some()
    }

    /// True when the link is broken or the brick has closed the connection (a brick closes
    /// links idle past its idle timeout), seen without sending or waiting: a request sent now
    /// would not be executed. Costs one system call.
    pub fn peer_closed(&self) -> bool {
        use std::os::fd::AsFd;
        self.is_broken()
            || match &self.control {
                crate::socket::Sock::Tcp(s) => rackmem_sys::peer_closed(s.as_fd()),
                crate::socket::Sock::Unix(s) => rackmem_sys::peer_closed(s.as_fd()),
            }
    }

    /// Marks the link broken (first cause wins), wakes everyone, returns the error.
    pub(crate) fn lost(&self, cause: String) -> LinkError {
        if self.broken.set(cause).is_ok() {
            // Wakes a reader blocked in read() and a sender blocked in write().
            self.control.shutdown();
            let _st = lock(&self.rx);
            self.rx_cv.notify_all();
        }
        self.lost_error()
    }

    pub(crate) fn lost_error(&self) -> LinkError {
        LinkError::BrickLost {
            addr: self.addr_text.clone(),
            cause: self.broken.get().cloned().unwrap_or_default(),
        }
    }

    pub(crate) fn invalid(&self, reason: String) -> LinkError {
        LinkError::Invalid {
            addr: self.addr_text.clone(),
            reason,
        }
    }

    pub(crate) fn abandon(&self, tag: u32) {
        let mut st = lock(&self.rx);
        if st.parked.remove(&tag).is_none() {
            st.abandoned.insert(tag);
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.control.shutdown();
    }
}
