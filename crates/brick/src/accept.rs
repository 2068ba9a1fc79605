//! The acceptor: one thread takes connections within the brick's caps, refuses the rest with a
//! reason, sets each up (TLS, timeouts) and hands it to a thread of its own; between
//! connections it frees segments nobody attached in time.

use crate::connection::serve_connection;
use crate::state::{Conn, Shared};
use crate::stream::Stream;
use crate::sync::lock;
use crate::tls::TlsStream;
use rackmem_proto::{encode_response, Opcode, Status, MAX_MESSAGE};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

// The acceptor waits on a non-blocking listener and the stop doorbell together: a connection
// is accepted as soon as it comes, a stop is seen at once, and an idle brick wakes once a second
// (the sweep), not every few milliseconds on a CPU it may share with a program.
pub(crate) fn accept_loop(shared: Arc<Shared>, listener: Listener) {
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
pub(crate) enum Accepted {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// Tells a connection over the brick's limits why (a `Busy` answer with tag 0, which a link
/// reports as the reason its connection closed) and closes it, without ever blocking the
/// acceptor: the answer is small and the socket new, so it fits the send buffer, and what the
/// peer sent already is read first so that closing does not reset the connection before the
/// peer reads the answer.
pub(crate) fn refuse(sock: Accepted, why: &str) {
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

/// How often segments nobody attached in time are freed (see [`Store::sweep`](crate::pool::Store::sweep)).
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(1);
