//! What the acceptor (the handshake stage, `handshake`) takes connections from, and how it
//! turns away one over the brick's caps.

use rackmem_proto::{encode_response, Opcode, Status, MAX_MESSAGE};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
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
