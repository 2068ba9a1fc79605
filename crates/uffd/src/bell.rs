//! A doorbell: an `eventfd` one thread rings to wake another that waits on a descriptor, so the
//! waiter can block without a timeout instead of waking now and then to look at a flag. An idle
//! program under rackmem then costs no CPU at all: no timer fires on its CPU while it computes.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// An `eventfd` (non-blocking, close-on-exec). Ringing it makes it readable until cleared.
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A new, silent doorbell.
    pub fn new() -> io::Result<Doorbell> {
        // SAFETY: eventfd(2) takes no pointers; a non-negative return is a new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Doorbell { fd })
    }

    /// Rings: whoever waits on it wakes (now, or at once when it next waits).
    pub fn ring(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd. The only failure possible is
        // EAGAIN on a counter at its maximum, which is readable anyway.
        unsafe {
            libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    /// The eventfd (to close an inherited copy in a forked child).
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Silences it again (call after waking, before looking at what the ringer changed).
    pub fn clear(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our eventfd; EAGAIN (not rung) is fine.
        unsafe {
            libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
        }
    }
}

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        Doorbell::as_raw_fd(self)
    }
}

/// What woke [`wait_readable`] up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Woken {
    /// The descriptor has something to read (or hung up, or failed: reading will tell).
    pub readable: bool,
    /// The doorbell rang.
    pub rung: bool,
}

/// Waits until `fd` is readable, `bell` rings or `timeout` (`None`: forever) passes. An
/// interrupted wait (EINTR) returns with nothing woken, like a timeout: callers loop anyway.
pub fn wait_readable(fd: BorrowedFd<'_>, bell: &Doorbell, timeout: Option<Duration>) -> io::Result<Woken> {
    let mut p = [
        libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: bell.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: poll(2) on an exclusively borrowed array of two pollfds, its length passed.
    let rc = unsafe { libc::poll(p.as_mut_ptr(), 2, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok(Woken {
                readable: false,
                rung: false,
            });
        }
        return Err(e);
    }
    let ready = |p: &libc::pollfd| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
    Ok(Woken {
        readable: ready(&p[0]),
        rung: ready(&p[1]),
    })
}

/// Waits until `fd` is readable (or hung up, or failed: reading will tell) or `timeout` passes;
/// returns whether it is. An interrupted wait (EINTR) returns false, like a timeout.
pub fn poll_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // Rounded up, so a wait of less than a millisecond still waits.
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: poll(2) on one exclusively borrowed pollfd, its count passed.
    let rc = unsafe { libc::poll(&mut p, 1, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::EINTR) {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_ring_wakes_a_waiter_and_clear_silences_it() {
        let bell = Doorbell::new().expect("eventfd");
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        // Silent, nothing to read: the timeout ends the wait.
        let w = wait_readable(a.as_fd(), &bell, Some(Duration::from_millis(10))).expect("poll");
        assert_eq!(
            w,
            Woken {
                readable: false,
                rung: false
            }
        );
        // Rung from another thread while waiting forever.
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                bell.ring();
            });
            let w = wait_readable(a.as_fd(), &bell, None).expect("poll");
            assert!(w.rung && !w.readable, "{w:?}");
        });
        // Still rung until cleared; twice rung, once cleared.
        bell.ring();
        assert!(
            wait_readable(a.as_fd(), &bell, Some(Duration::ZERO))
                .expect("poll")
                .rung
        );
        bell.clear();
        assert!(
            !wait_readable(a.as_fd(), &bell, Some(Duration::ZERO))
                .expect("poll")
                .rung
        );
    }

    #[test]
    fn a_readable_descriptor_wakes_a_waiter() {
        use std::io::Write;
        let bell = Doorbell::new().expect("eventfd");
        let (a, mut b) = std::os::unix::net::UnixStream::pair().expect("pair");
        b.write_all(b"x").expect("write");
        let w = wait_readable(a.as_fd(), &bell, None).expect("poll");
        assert_eq!(
            w,
            Woken {
                readable: true,
                rung: false
            }
        );
        drop(b);
        let mut buf = [0u8; 1];
        std::io::Read::read(&mut &a, &mut buf).expect("read");
        // A hung-up peer counts as readable (the read reports it).
        assert!(wait_readable(a.as_fd(), &bell, None).expect("poll").readable);
    }
}
