//! A connection's socket, whatever carries it (TCP, TLS, a Unix socket): reads polled briefly
//! before they sleep and bounded by the handshake deadline, writes bounded by a deadline however
//! the peer drains them, and descriptor passing where the socket can carry one.

use crate::state::Conn;
use crate::tls::TlsStream;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

pub(crate) trait Stream: Read + Write + Send {
    /// The socket's descriptor (to watch it for readiness).
    fn raw_fd(&self) -> RawFd;
    /// A second handle on the socket, to shut it down when the brick stops.
    fn shutdown_handle(&self) -> io::Result<Conn>;
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
    fn raw_fd(&self) -> RawFd {
        self.as_raw_fd()
    }
    fn shutdown_handle(&self) -> io::Result<Conn> {
        Ok(Conn::Tcp(self.try_clone()?))
    }
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
    fn raw_fd(&self) -> RawFd {
        self.tcp().as_raw_fd()
    }
    fn shutdown_handle(&self) -> io::Result<Conn> {
        Ok(Conn::Tcp(self.tcp().try_clone()?))
    }
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
    fn raw_fd(&self) -> RawFd {
        self.as_raw_fd()
    }
    fn shutdown_handle(&self) -> io::Result<Conn> {
        Ok(Conn::Unix(self.try_clone()?))
    }
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

/// The socket as an authenticated connection's thread reads it: polled briefly before a read
/// sleeps while the peer sends requests close together, each read bounded by the socket's own
/// read timeout (the idle timeout), or by `deadline` when one is set.
pub(crate) struct StreamIo {
    pub(crate) sock: Box<dyn Stream>,
    pub(crate) spin_us: u64,
    pub(crate) deadline: Option<Instant>,
    /// Reads in a row whose data came within `spin_us` of the read starting (see
    /// [`SPIN_AFTER_CLOSE`]).
    pub(crate) close: u32,
}

/// Reads in a row that found data within the spin time before a read polls. A forking server's
/// connections send one request and go quiet: a forked child's link asks nothing after the
/// ATTACH its handshake served, and its parent's link one CLONE_LAZY per fork. Polling 100 µs
/// after each of those burnt 0.12 s of CPU in 600 PostgreSQL connections (a quarter of the
/// brick's), on the vCPUs the backends wanted; a program that faults keeps its requests close
/// and polls after its second one.
const SPIN_AFTER_CLOSE: u32 = 2;

impl Read for StreamIo {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        let idle_since = Instant::now();
        let limit = Duration::from_micros(self.spin_us);
        if self.spin_us > 0 && self.close >= SPIN_AFTER_CLOSE && self.sock.set_nonblocking(true).is_ok() {
            // Poll briefly before sleeping: on small VMs a sleeping reader costs a cross-vCPU
            // wake-up (~30 µs) per request, more than the request itself.
            loop {
                match self.sock.read(b) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if idle_since.elapsed() > limit {
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
        let r = self.sock.read(b);
        self.close = match idle_since.elapsed() <= limit {
            true => self.close.saturating_add(1),
            false => 0,
        };
        r
    }
}

/// Writes all of `buf` by `deadline`, however the peer drains it: the socket's send timeout
/// bounds one blocked write, so after a partial write the rest gets only what is left.
/// Returns whether the socket's send timeout was shortened (to be restored).
pub(crate) fn write_all_by(sock: &mut dyn Stream, mut buf: &[u8], deadline: Instant) -> io::Result<bool> {
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
