//! The socket under a link, plain or TLS: the receiving half (polled briefly before it sleeps,
//! bounded by the deadline of the wait it serves, keeping descriptors that arrive with the
//! bytes, decrypting TLS records without holding the connection lock across a read) and the
//! sending half.

use crate::sync::lock;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A link's connection: TCP (plain, or carrying TLS) or a Unix stream socket.
pub(crate) enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Unix(s) => s.as_raw_fd(),
        }
    }

    pub(crate) fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
        })
    }
    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_nonblocking(on),
            Sock::Unix(s) => s.set_nonblocking(on),
        }
    }

    pub(crate) fn set_timeouts(&self, read: Duration, write: Duration) -> io::Result<()> {
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
    pub(crate) fn shutdown(&self) {
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
pub(crate) struct RxSock {
    pub(crate) sock: Sock,
    /// The longest a read polls (0: reads always sleep at once).
    pub(crate) spin: Duration,
    /// Whether polling pays on this link now (measured: see the `spin` module).
    pub(crate) spin_choice: crate::spin::SpinChoice,
    pub(crate) fds: Arc<Mutex<Vec<OwnedFd>>>,
    /// The deadline of the wait this read serves: a read that would block waits only until
    /// then, however the bytes trickle in (the socket's own timeout bounds one read only).
    pub(crate) deadline: Option<Instant>,
    /// A `tls://` link's connection state, shared with the senders (see the `tls` module).
    pub(crate) tls: Option<Arc<Mutex<rustls::ClientConnection>>>,
    /// TLS bytes read off the socket and not yet handed to rustls.
    pub(crate) tls_in: TlsIn,
}

/// Raw TLS bytes read off the socket: `buf[start..end]` is not yet handed to rustls. A fixed
/// buffer, so that a read does not clear memory it is about to overwrite.
#[derive(Default)]
pub(crate) struct TlsIn {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl RxSock {
    pub(crate) fn recv(&mut self, b: &mut [u8]) -> io::Result<usize> {
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
    pub(crate) fn read_tls(
        &mut self,
        conn: &Mutex<rustls::ClientConnection>,
        raw: &mut TlsIn,
        b: &mut [u8],
    ) -> io::Result<usize> {
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

    pub(crate) fn read_raw(&mut self, b: &mut [u8]) -> io::Result<usize> {
        if self.spin.is_zero() {
            return self.read_sleeping(b);
        }
        let start = Instant::now();
        let poll = self.spin_choice.poll_next();
        let r = if poll { self.read_polling(b, start) } else { None };
        let r = match r {
            Some(r) => r,
            None => self.read_sleeping(b),
        };
        if r.is_ok() {
            self.spin_choice.record(poll, start.elapsed());
        }
        r
    }

    /// Polls for up to `spin` from `start`; `None` if nothing came by then.
    fn read_polling(&mut self, b: &mut [u8], start: Instant) -> Option<io::Result<usize>> {
        if self.sock.set_nonblocking(true).is_err() {
            return None;
        }
        // Poll before sleeping: a sleeping reader costs a cross-CPU wake-up when the answer
        // comes, often more than the brick takes to answer. Only the reader uses the socket
        // meanwhile (its sends are its own, between reads).
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
        r
    }

    /// Sleeps until bytes come (or the wait's deadline passes).
    fn read_sleeping(&mut self, b: &mut [u8]) -> io::Result<usize> {
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
pub(crate) struct Tx {
    pub(crate) sock: Sock,
    pub(crate) sealed: Vec<u8>,
}

// Written with MSG_NOSIGNAL (`rackmem_sys::send_vectored`): a brick that went away fails the
// write with EPIPE instead of killing the program whose thread wrote (put/get run on the
// program's threads, whose SIGPIPE disposition is the program's).
impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(b)])
    }
    fn write_vectored(&mut self, b: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => rackmem_sys::send_vectored(s.as_fd(), b),
            Sock::Unix(s) => rackmem_sys::send_vectored(s.as_fd(), b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
