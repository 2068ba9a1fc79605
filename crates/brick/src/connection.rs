//! Serving one authenticated connection on its own thread (the handshake stage hands it over
//! with its session and the answer to its ALLOC or ATTACH): read a frame, validate it (header first, so a
//! hostile `payload_len` is refused before any allocation), serve it against the connection's
//! session and queue the response. A response is held back only while a whole further request
//! is already buffered: a pipelined burst is answered with few system calls, a lone request at
//! once, and the brick never sits on a response while it waits for more bytes from the client.

use crate::data::{pace, read_pages, with_segment, write_pages};
use crate::onesided;
use crate::reply::{err, Reply};
use crate::session::{handle, Session};
use crate::state::Shared;
use crate::stream::{write_all_by, Stream, StreamIo};
use rackmem_proto::{encode_response, DecodeError, Header, Opcode, Request, Status, FLAG_RESPONSE, HEADER_LEN};
use std::io::{self, BufReader, Read};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Responses queued beyond this many bytes are sent even while requests are still buffered.
pub(crate) const FLUSH_BYTES: usize = 1 << 20;

/// Payloads at least this large are sent straight from their buffer, not copied into the queue.
pub(crate) const DIRECT_BYTES: usize = 64 << 10;

/// Why a frame's header alone is enough to refuse it: an opcode not allowed before
/// authentication, or a payload longer than its opcode ever needs. Checked before a byte of the
/// payload is read or allocated.
pub(crate) fn header_refusal(h: &Header, authenticated: bool) -> Option<Reply> {
    if !authenticated && !h.opcode.allowed_before_auth() {
        return Some(err(
            Status::NotAttached,
            format!(
                "{:?} before authentication: a connection says HELLO, then ALLOC (with the shared \
                 secret) or ATTACH (with a grant), before anything else",
                h.opcode
            ),
            true,
        ));
    }
    let max = h.opcode.max_request_payload();
    if h.payload_len > max {
        return Some(err(
            Status::BadRequest,
            format!(
                "malformed {:?} request: a payload of {} bytes exceeds its limit of {max}",
                h.opcode, h.payload_len
            ),
            true,
        ));
    }
    None
}

/// Reads a `len`-byte payload into `buf`, growing it as the bytes arrive: a header that claims
/// more than its sender sends costs what was sent, not what was claimed.
pub(crate) fn read_payload(io: &mut impl Read, buf: &mut Vec<u8>, len: usize) -> io::Result<()> {
    buf.clear();
    while buf.len() < len {
        let have = buf.len();
        let step = (len - have).min(have.max(64 << 10));
        buf.resize(have + step, 0);
        io.read_exact(&mut buf[have..])?;
    }
    Ok(())
}

/// Counts a connection that ended on a read deadline (the idle timeout, for an authenticated one).
pub(crate) fn note_read_end(shared: &Shared, session: &Session, e: &io::Error) {
    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
        let c = &shared.guard.counters;
        if session.authenticated {
            c.idle_timeouts.fetch_add(1, Relaxed);
        } else {
            c.handshake_timeouts.fetch_add(1, Relaxed);
        }
    }
}

/// Reads requests off `stream`, serves them in order, queues and flushes responses; `first` is
/// the answer owed to the request the handshake stage served last (the ALLOC or ATTACH that
/// authenticated the connection).
pub(crate) fn serve_connection(
    shared: &Shared,
    stream: Box<dyn Stream>,
    mut session: Session,
    first: Option<(Opcode, u32, Reply)>,
) {
    let limits = &shared.guard.limits;
    let mut conn = Connection {
        io: BufReader::with_capacity(
            256 << 10,
            StreamIo {
                sock: stream,
                spin_us: shared.spin_us,
                deadline: None,
                close: 0,
            },
        ),
        queued: Vec::with_capacity(64 << 10),
        send_timeout: limits.send_timeout,
    };
    if let Some((op, tag, reply)) = first {
        let sent = conn.send(op, tag, &reply, true);
        if sent.is_err() || reply.close {
            if let Some(a) = session.attached {
                shared.store.detach(a.id, &a.gate);
            }
            return;
        }
    }
    let mut hdr = [0u8; HEADER_LEN];
    let mut payload = Vec::new();
    let mut scratch = Vec::new();
    loop {
        if let Err(e) = conn.io.read_exact(&mut hdr) {
            note_read_end(shared, &session, &e);
            break;
        }
        let h = match Header::decode(&hdr) {
            Ok(h) => h,
            Err(e) => {
                // Answer with the tag and opcode the frame claims, if any, so a client that
                // merely speaks another version learns why; then close.
                shared.counters.errors.fetch_add(1, Relaxed);
                let (op, tag, status) = Header::refusal(&hdr, &e);
                let _ = conn.send(op, tag, &err(status, format!("malformed frame: {e}"), true), true);
                break;
            }
        };
        if let Some(reply) = header_refusal(&h, session.authenticated) {
            shared.counters.errors.fetch_add(1, Relaxed);
            shared.guard.counters.refused_headers.fetch_add(1, Relaxed);
            let _ = conn.send(h.opcode, h.tag, &reply, true);
            break;
        }
        if let Err(e) = read_payload(&mut conn.io, &mut payload, h.payload_len as usize) {
            // A frame cut short: the peer died, is misbehaving, or ran out of time.
            note_read_end(shared, &session, &e);
            shared.counters.errors.fetch_add(1, Relaxed);
            break;
        }
        shared.counters.requests.fetch_add(1, Relaxed);
        let started = Instant::now();
        // Page traffic skips the owned `Request`: WRITE stores straight from the receive
        // buffer and READ fills a buffer the connection keeps, so no request allocates or
        // copies its pages an extra time.
        let decoded = match h.opcode {
            Opcode::Write => rackmem_proto::decode_write(&payload).map(|(ext, data)| {
                pace(shared, session.attached.as_ref(), data.len() as u64);
                with_segment(session.attached.as_ref(), |a, m| write_pages(shared, a, m, &ext, data))
            }),
            // PUT stores from the receive buffer and GET fills the reused buffer, as above.
            Opcode::Put => Ok(onesided::put(shared, session.attached.as_ref(), h.offset, &payload)),
            Opcode::Get => Request::decode(&h, &payload).map(|r| match r {
                Request::Get { offset, len } => onesided::get(
                    shared,
                    session.attached.as_ref(),
                    offset,
                    len,
                    std::mem::take(&mut scratch),
                ),
                r => handle(shared, &mut session, r),
            }),
            Opcode::Read => Request::decode(&h, &payload).map(|r| match r {
                Request::Read(ext) => {
                    pace(shared, session.attached.as_ref(), rackmem_proto::extents_bytes(&ext));
                    with_segment(session.attached.as_ref(), |a, m| {
                        read_pages(shared, a, m, &ext, std::mem::take(&mut scratch))
                    })
                }
                r => handle(shared, &mut session, r),
            }),
            _ => Request::decode(&h, &payload).map(|r| handle(shared, &mut session, r)),
        };
        let reply = match decoded {
            Ok(r) => r,
            Err(e @ DecodeError::MissingProof) => err(Status::GrantUnproven, e.to_string(), true),
            Err(e) => err(
                Status::BadRequest,
                format!("malformed {:?} request: {e}", h.opcode),
                true,
            ),
        };
        if reply.status != Status::Ok {
            shared.counters.errors.fetch_add(1, Relaxed);
        }
        shared
            .requests
            .observe(h.opcode, started.elapsed(), reply.status == Status::Ok);
        let close = reply.close;
        // Hold the response back only if the next request can be served without reading the
        // socket: a client may be waiting for this response before it sends the rest of the
        // next frame (a link draining responses while its send is blocked does exactly that).
        let flush = close || !whole_frame_buffered(conn.io.buffer());
        if let Err(e) = conn.send(h.opcode, h.tag, &reply, flush) {
            if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                shared.guard.counters.send_timeouts.fetch_add(1, Relaxed);
            }
            break;
        }
        if close {
            break;
        }
        if reply.payload.capacity() >= DIRECT_BYTES {
            scratch = reply.payload;
        }
    }
    if let Some(a) = session.attached {
        shared.store.detach(a.id, &a.gate);
    }
}

/// True if `buf` starts with a complete frame (header and payload).
pub(crate) fn whole_frame_buffered(buf: &[u8]) -> bool {
    Header::claimed_payload_len(buf).is_some_and(|n| HEADER_LEN as u64 + u64::from(n) <= buf.len() as u64)
}

/// One connection's buffered input and queued output (the same socket: requests are served
/// in order, so reading and writing take turns on one thread).
pub(crate) struct Connection {
    io: BufReader<StreamIo>,
    queued: Vec<u8>,
    /// How long one response may take to leave (the socket's send timeout too).
    send_timeout: Duration,
}

impl Connection {
    /// Queues a response, and sends what is queued when `flush` says so or the queue is long;
    /// what is sent must leave within the send timeout, or the connection fails.
    fn send(&mut self, op: Opcode, tag: u32, r: &Reply, flush: bool) -> io::Result<()> {
        let deadline = Instant::now() + self.send_timeout;
        let sent = self.send_by(op, tag, r, flush, deadline);
        if matches!(sent, Ok(true)) {
            self.io.get_mut().sock.set_write_timeout(Some(self.send_timeout))?;
        }
        sent.map(|_| ())
    }

    /// [`Connection::send`] by `deadline`; returns whether the socket's send timeout changed.
    fn send_by(&mut self, op: Opcode, tag: u32, r: &Reply, flush: bool, deadline: Instant) -> io::Result<bool> {
        let sock = &mut *self.io.get_mut().sock;
        if let Some(m) = &r.fd {
            // The descriptor rides on the response's first bytes; whatever is queued goes first.
            let a = write_all_by(sock, &self.queued, deadline)?;
            self.queued.clear();
            let frame = encode_response(op, tag, r.status, &r.payload);
            let sent = sock.send_with_fd(&frame, m.fd())?;
            return Ok(write_all_by(sock, &frame[sent..], deadline)? || a);
        }
        if r.payload.len() >= DIRECT_BYTES {
            // Large payloads go out from their own buffer rather than through the queue.
            let h = Header {
                opcode: op,
                flags: FLAG_RESPONSE,
                tag,
                status: r.status.code(),
                offset: 0,
                length: 0,
                payload_len: r.payload.len() as u32,
            };
            self.queued.extend_from_slice(&h.encode());
            let a = write_all_by(sock, &self.queued, deadline)?;
            self.queued.clear();
            return Ok(write_all_by(sock, &r.payload, deadline)? || a);
        }
        self.queued
            .extend_from_slice(&encode_response(op, tag, r.status, &r.payload));
        if flush || self.queued.len() >= FLUSH_BYTES {
            let a = write_all_by(sock, &self.queued, deadline)?;
            self.queued.clear();
            return Ok(a);
        }
        Ok(false)
    }
}
