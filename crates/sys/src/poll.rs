//! Waiting for a descriptor to become readable: alone, with a timeout ([`poll_readable`]), or
//! together with a [`Doorbell`] that another thread rings ([`wait_readable`]), so that a waiter
//! can block without a timeout and still be woken on purpose.

use crate::bell::Doorbell;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

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
/// returns whether it is. A signal handled meanwhile (EINTR) does not end the wait: the poll
/// goes on for the time left. Callers take `false` for "no answer in time", and the program's
/// signals arrive at any thread that does not block them (PostgreSQL's backends are signalled
/// all the time): taking EINTR for a timeout made a link report its brick lost.
pub fn poll_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        // Rounded up, so a wait of less than a millisecond still waits.
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: poll(2) on one exclusively borrowed pollfd, its count passed.
        let rc = unsafe { libc::poll(&mut p, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        return Ok(p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0);
    }
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

    extern "C" fn ignore(_: libc::c_int) {}

    #[test]
    fn a_signal_does_not_end_a_wait_for_an_answer() {
        use std::io::Write;
        use std::sync::atomic::{AtomicBool, Ordering};
        // SAFETY: a handler that does nothing, for a signal the test harness does not use;
        // without SA_RESTART, so that the poll below sees EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = ignore as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGURG, &sa, std::ptr::null_mut()), 0);
        }
        let (a, mut b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            let (a, done) = (&a, &done);
            let waiter = s.spawn(move || {
                // SAFETY: pthread_self has no preconditions.
                tx.send(unsafe { libc::pthread_self() }).expect("send");
                let r = poll_readable(a.as_fd(), Duration::from_secs(30));
                done.store(true, Ordering::Release);
                r
            });
            let thread = rx.recv().expect("waiter");
            // Signals while nothing has arrived yet, then the answer.
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(5));
                if !done.load(Ordering::Acquire) {
                    // SAFETY: the waiter thread is alive until it is joined below, and SIGURG's
                    // handler (above) does nothing.
                    unsafe { libc::pthread_kill(thread, libc::SIGURG) };
                }
            }
            assert!(!done.load(Ordering::Acquire), "a signal ended the wait");
            b.write_all(b"x").expect("write");
            assert!(waiter.join().expect("waiter").expect("poll"), "readable");
        });
    }
}
