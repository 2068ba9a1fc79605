//! Waiting for a descriptor to become readable: alone, with a timeout ([`poll_readable`]), or
//! together with a [`Doorbell`] that another thread rings ([`wait_readable`]), so that a waiter
//! can block without a timeout and still be woken on purpose.

use crate::bell::Doorbell;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

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
