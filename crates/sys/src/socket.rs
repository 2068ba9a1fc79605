//! Socket and process helpers a server needs: the listen backlog, the open files limit, and who
//! is at the other end of a Unix socket (`SO_PEERCRED`).

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd};

/// Writes `bufs` to a connected socket as `writev(2)` would, but with `MSG_NOSIGNAL`: a peer
/// that went away makes this return `EPIPE` instead of raising SIGPIPE. Links write from the
/// program's own threads (a put, a get), whose SIGPIPE disposition is the program's: by
/// default it kills the process, so a brick that restarts would kill its clients instead of
/// failing their calls.
pub fn send_vectored(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec on Unix (its documented guarantee); sendmsg only
    // reads the slices, which outlive the call.
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len().min(libc::UIO_MAXIOV as usize) as _;
    loop {
        // SAFETY: sendmsg on a borrowed descriptor with a header whose iovecs point at `bufs`,
        // valid for the call.
        let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A connected socket as an `io::Write` whose writes carry `MSG_NOSIGNAL` (`send_vectored`):
/// for writers that take `impl Write` (a line to the agent, a TLS handshake's records) on a
/// program's thread, so that a peer that went away is an `EPIPE` the caller reports, not a
/// SIGPIPE that kills the program, and without a signal mask around every call.
pub struct NoSignal<'a>(pub BorrowedFd<'a>);

impl io::Write for NoSignal<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        send_vectored(self.0, &[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        send_vectored(self.0, bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// True when the peer of a connected socket has closed it (or reset it) and nothing is left to
/// read: a peek that does not wait and does not consume. A request written now would be lost
/// unexecuted, which a caller that must not send a request twice wants to know beforehand.
pub fn peer_closed(fd: BorrowedFd<'_>) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: recv into a 1-byte local buffer on a borrowed descriptor; MSG_PEEK leaves the
    // stream as it was for whoever reads it.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            b.as_mut_ptr() as *mut libc::c_void,
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n == 0 {
        return true;
    }
    n < 0
        && matches!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::ECONNRESET | libc::EPIPE | libc::ENOTCONN)
        )
}

/// Sets the backlog of a listening socket (calling `listen(2)` again on it does that): how many
/// connections the kernel completes and queues for `accept` before it leaves further ones
/// half-open. The kernel caps it at `net.core.somaxconn`.
pub fn set_listen_backlog(fd: BorrowedFd<'_>, backlog: u32) -> io::Result<()> {
    let backlog = backlog.min(i32::MAX as u32) as i32;
    // SAFETY: listen(2) on a borrowed descriptor, no pointers.
    if unsafe { libc::listen(fd.as_raw_fd(), backlog) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Raises this process's soft limit on open files to its hard limit (a server with thousands
/// of connections needs more than the usual default of 1024); returns the soft limit now.
pub fn raise_open_files_limit() -> io::Result<u64> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes one rlimit into the exclusively borrowed `l`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if l.rlim_cur < l.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: l.rlim_max,
            rlim_max: l.rlim_max,
        };
        // SAFETY: setrlimit(2) reads one rlimit from a live local.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        l.rlim_cur = l.rlim_max;
    }
    Ok(l.rlim_cur)
}

/// Who is at the other end of a connected Unix socket, as the kernel recorded it when the peer
/// connected (`SO_PEERCRED`): the peer cannot forge it, unlike anything it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// The peer's process id (0 when the peer is in another pid namespace the kernel cannot map).
    pub pid: u32,
    /// Its effective user id.
    pub uid: u32,
    /// Its effective group id.
    pub gid: u32,
}

/// The credentials of the peer of the connected Unix socket `sock` (`getsockopt(SO_PEERCRED)`).
pub fn peer_credentials(sock: BorrowedFd<'_>) -> io::Result<PeerCredentials> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt(2) writes at most `len` bytes into `cred`, a live, properly aligned
    // `ucred` of exactly that size, and updates `len`; `sock` is a valid descriptor for the call.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "SO_PEERCRED returned a short struct ucred",
        ));
    }
    Ok(PeerCredentials {
        pid: u32::try_from(cred.pid).unwrap_or(0),
        uid: cred.uid,
        gid: cred.gid,
    })
}

#[cfg(test)]
mod peer_tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_socket_pair_sees_this_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let c = peer_credentials(a.as_fd()).expect("SO_PEERCRED");
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        assert_eq!((c.pid, c.uid, c.gid), (std::process::id(), uid, gid));
    }

    #[test]
    fn a_file_is_not_a_socket() {
        let f = std::fs::File::open("/proc/self/stat").expect("open");
        assert!(peer_credentials(f.as_fd()).is_err());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::net::UnixStream;

    /// SIGPIPE pending for this thread (it is blocked here, so a raised one stays pending even
    /// though the test harness ignores the signal).
    fn sigpipe_pending() -> bool {
        // SAFETY: sigset_t is plain data filled by sigpending; sigismember only reads it.
        unsafe {
            let mut pending: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut pending);
            libc::sigismember(&pending, libc::SIGPIPE) == 1
        }
    }

    #[test]
    fn a_write_to_a_closed_peer_is_epipe_without_sigpipe() {
        // SAFETY: blocks SIGPIPE on this test thread only; the old mask is restored below.
        let old = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            old
        };
        let (a, b) = UnixStream::pair().expect("socketpair");
        drop(b);
        let e = NoSignal(a.as_fd()).write_all(b"line\n").expect_err("the peer is gone");
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "{e}");
        let quiet = !sigpipe_pending();
        // The check can fail: a plain write(2) raises the signal.
        // SAFETY: write(2) of a 5-byte static buffer on a descriptor `a` owns.
        let _ = unsafe { libc::write(a.as_raw_fd(), b"line\n".as_ptr() as *const libc::c_void, 5) };
        let plain_raised = sigpipe_pending();
        // SAFETY: takes the pending SIGPIPE (if any) without waiting, then restores the mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            libc::sigtimedwait(&set, std::ptr::null_mut(), &zero);
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
        assert!(quiet, "a write with MSG_NOSIGNAL raised SIGPIPE");
        assert!(
            plain_raised,
            "a plain write to a closed peer raised no SIGPIPE: the check proves nothing"
        );
    }
}
