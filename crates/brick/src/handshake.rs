//! The handshake stage: one thread (the acceptor) holds every connection from accept until it
//! authenticates, on epoll (mio), with no thread of its own. A thread per connection cost about
//! 265 KiB each (stack, the receive buffer, the kernel's task), so 4,000 silent connections held
//! a gigabyte; here a connection that has not authenticated costs its descriptor and a few
//! hundred bytes.
//!
//! The stage reads exactly one frame at a time, header first (refused on its header alone, as
//! an authenticated connection's are), and answers HELLO and PING itself. An ALLOC or ATTACH
//! waits its turn if its address or network has failed too often (parked on a timer, not
//! asleep in a thread), takes a place among the authenticated connections (or is told `Busy`),
//! and is checked; a success hands the connection, its session and the answer to a thread of
//! its own ([`serve_connection`]). Bytes the client sent after that frame are still in the
//! socket (or in the TLS session), for that thread to read.
//!
//! Bounds: [`BrickLimits::max_handshakes`] connections at once, the longest waiting closed to
//! admit a new one when it is full; per address and per prefix the caps of [`BrickLimits`];
//! every one closed at its handshake deadline; an answer that does not leave at once (the
//! client does not read) closes the connection, since none is bigger than a few hundred bytes.

use crate::accept::{refuse, Accepted, Listener, SWEEP_EVERY};
use crate::config::BrickConfig;
use crate::connection::{header_refusal, serve_connection};
use crate::guard::{Admission, BrickLimits, Counts};
use crate::reply::{err, Reply};
use crate::session::{handle, Session};
use crate::state::Shared;
use crate::stream::Stream;
use crate::sync::lock;
use crate::tls::TlsStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use rackmem_proto::{encode_response, DecodeError, Header, Opcode, Request, Status, HEADER_LEN};
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LISTENER: Token = Token(0);
const BELL: Token = Token(1);
/// Readiness events taken per wake-up.
const EVENTS: usize = 1024;
/// Descriptors kept free of connections: the listener, the doorbell, epoll, the pool's files.
const RESERVED_DESCRIPTORS: u64 = 64;

/// A connection that has not authenticated yet.
struct Pending {
    stream: Box<dyn Stream>,
    fd: std::os::fd::RawFd,
    peer: Option<IpAddr>,
    session: Session,
    hdr: [u8; HEADER_LEN],
    hdr_len: usize,
    /// The frame being read: its header once whole, then its payload.
    header: Option<Header>,
    payload: Vec<u8>,
    /// Bytes of `payload` received.
    got: usize,
    deadline: Instant,
    /// An ALLOC or ATTACH read whole, waiting until then for its turn to be checked.
    parked: Option<Instant>,
}

/// What became of a pending connection.
enum Step {
    /// Still authenticating.
    Keep,
    /// Waiting for its turn until then.
    Park(Instant),
    /// Closed (what was owed it was sent, or it broke off).
    Close,
    /// Authenticated: its own thread serves it from here, answering this first.
    HandOff(Opcode, u32, Reply),
}

/// The stage's state, owned by the acceptor thread.
struct Stage {
    shared: Arc<Shared>,
    poll: Poll,
    pending: HashMap<usize, Pending>,
    /// (deadline, token): the handshake deadlines, earliest (and so longest waiting) first.
    deadlines: BTreeSet<(Instant, usize)>,
    /// (turn, token): parked ALLOC and ATTACH frames.
    parked: BTreeSet<(Instant, usize)>,
    counts: Counts,
    max_handshakes: usize,
    next_token: usize,
    next_conn: u64,
}

/// The handshake cap the open-files limit allows: every authenticated connection holds two
/// descriptors, a pending one one.
pub(crate) fn fit_handshakes(limits: &BrickLimits, open_files: Option<u64>) -> usize {
    let Some(n) = open_files else {
        return limits.max_handshakes;
    };
    let room = n.saturating_sub(2 * limits.max_connections as u64 + RESERVED_DESCRIPTORS);
    limits.max_handshakes.min(room.max(64) as usize)
}

/// Accepts connections and carries them through their handshake until the brick stops;
/// between events it frees segments nobody attached in time.
pub(crate) fn accept_loop(shared: Arc<Shared>, listener: Listener, max_handshakes: usize) {
    let poll = match Poll::new() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rackmem brick: cannot create the handshake stage's epoll: {e}");
            shared.request_stop();
            return;
        }
    };
    let listen_fd = match &listener {
        Listener::Tcp(l) => std::os::fd::AsRawFd::as_raw_fd(l),
        Listener::Unix(l) => std::os::fd::AsRawFd::as_raw_fd(l),
    };
    let _ = match &listener {
        Listener::Tcp(l) => l.set_nonblocking(true),
        Listener::Unix(l) => l.set_nonblocking(true),
    };
    let bell_fd = shared.bell.as_raw_fd();
    let registered = poll
        .registry()
        .register(&mut SourceFd(&listen_fd), LISTENER, Interest::READABLE)
        .and_then(|()| {
            poll.registry()
                .register(&mut SourceFd(&bell_fd), BELL, Interest::READABLE)
        });
    if let Err(e) = registered {
        eprintln!("rackmem brick: cannot watch the listening socket: {e}");
        shared.request_stop();
        return;
    }
    let mut stage = Stage {
        shared,
        poll,
        pending: HashMap::new(),
        deadlines: BTreeSet::new(),
        parked: BTreeSet::new(),
        counts: Counts::default(),
        max_handshakes: max_handshakes.max(1),
        next_token: 2,
        next_conn: 0,
    };
    stage.run(&listener);
    let tokens: Vec<usize> = stage.pending.keys().copied().collect();
    for t in tokens {
        stage.close(t);
    }
}

impl Stage {
    fn run(&mut self, listener: &Listener) {
        let mut events = Events::with_capacity(EVENTS);
        let mut last_sweep = Instant::now();
        // Set when accepting failed for want of descriptors: retry then, as no new readiness
        // event may come for connections already queued.
        let mut accept_again: Option<Instant> = Some(Instant::now());
        while !self.shared.stop.load(Relaxed) {
            let now = Instant::now();
            let mut wake = last_sweep + SWEEP_EVERY;
            for t in [
                self.deadlines.first().map(|d| d.0),
                self.parked.first().map(|p| p.0),
                accept_again,
            ]
            .into_iter()
            .flatten()
            {
                wake = wake.min(t);
            }
            // No shorter timer than what is due: the brick may share a CPU with a program
            // whose every wake-up here it would slow down.
            if let Err(e) = self.poll.poll(&mut events, Some(wake.saturating_duration_since(now))) {
                if e.kind() != io::ErrorKind::Interrupted {
                    std::thread::sleep(Duration::from_millis(5));
                }
                continue;
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => accept_again = Some(Instant::now()),
                    BELL => self.shared.bell.clear(),
                    Token(t) => self.drive(t),
                }
            }
            if accept_again.is_some_and(|t| t <= Instant::now()) {
                accept_again = self.accept_all(listener);
            }
            let now = Instant::now();
            while let Some(&(d, t)) = self.deadlines.first() {
                if d > now {
                    break;
                }
                self.shared.guard.counters.handshake_timeouts.fetch_add(1, Relaxed);
                self.close(t);
            }
            while let Some(&(d, t)) = self.parked.first() {
                if d > now {
                    break;
                }
                self.parked.remove(&(d, t));
                self.resume(t);
            }
            if last_sweep.elapsed() >= SWEEP_EVERY {
                last_sweep = Instant::now();
                self.shared.store.sweep(last_sweep);
            }
        }
    }

    /// Accepts every queued connection; returns when to try again if it ran out of descriptors.
    fn accept_all(&mut self, listener: &Listener) -> Option<Instant> {
        loop {
            let accepted = match listener {
                Listener::Tcp(l) => l.accept().map(|(s, peer)| (Accepted::Tcp(s), Some(peer.ip()))),
                Listener::Unix(l) => l.accept().map(|(s, _)| (Accepted::Unix(s), None)),
            };
            match accepted {
                Ok((sock, peer)) => self.admit(sock, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // EMFILE and friends: the longest-waiting handshake gives its descriptor back
                // (so a flood cannot keep the brick from accepting), then back off briefly.
                Err(_) => {
                    if let Some(&(_, t)) = self.deadlines.first() {
                        self.shared.guard.counters.handshakes_evicted.fetch_add(1, Relaxed);
                        self.close(t);
                    }
                    return Some(Instant::now() + Duration::from_millis(5));
                }
            }
        }
    }

    /// Takes a new connection into the stage, within its caps.
    fn admit(&mut self, sock: Accepted, peer: Option<IpAddr>) {
        let shared = self.shared.clone();
        let limits = &shared.guard.limits;
        if self.pending.len() >= self.max_handshakes {
            // Full: the connection that has waited longest goes (a legitimate one has long
            // authenticated), so silent connections cannot lock new clients out.
            if let Some(&(_, t)) = self.deadlines.first() {
                shared.guard.counters.handshakes_evicted.fetch_add(1, Relaxed);
                self.close(t);
            }
        }
        if let Err(why) = self
            .counts
            .admit(limits, &shared.guard.counters, self.max_handshakes, peer)
        {
            shared.counters.errors.fetch_add(1, Relaxed);
            refuse(sock, &why.to_string());
            return;
        }
        let stream = match prepare(sock, &shared.cfg) {
            Ok(s) => s,
            Err(_) => {
                // Out of memory or descriptors for TLS, most likely: dropped (closed).
                self.counts.release(limits, peer);
                shared.counters.errors.fetch_add(1, Relaxed);
                return;
            }
        };
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1).max(2);
        let fd = stream.raw_fd();
        // A TLS connection also waits for room to send its handshake messages.
        let interest = if shared.cfg.tls.is_some() {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        if self
            .poll
            .registry()
            .register(&mut SourceFd(&fd), Token(token), interest)
            .is_err()
        {
            self.counts.release(limits, peer);
            shared.counters.errors.fetch_add(1, Relaxed);
            return;
        }
        let deadline = Instant::now() + limits.handshake_timeout;
        let passes_fds = stream.passes_fds();
        self.pending.insert(
            token,
            Pending {
                stream,
                fd,
                peer,
                session: Session {
                    passes_fds,
                    peer,
                    ..Session::default()
                },
                hdr: [0; HEADER_LEN],
                hdr_len: 0,
                header: None,
                payload: Vec::new(),
                got: 0,
                deadline,
                parked: None,
            },
        );
        self.deadlines.insert((deadline, token));
        shared.counters.connections.fetch_add(1, Relaxed);
        shared.guard.counters.handshakes_open.fetch_add(1, Relaxed);
    }

    /// Reads and serves what connection `t` sent, as far as it goes without blocking.
    fn drive(&mut self, t: usize) {
        let Some(mut p) = self.pending.remove(&t) else {
            return;
        };
        let step = if p.parked.is_some() {
            // Its bytes wait in the socket until its turn.
            Step::Keep
        } else {
            read_frames(&self.shared, &mut p)
        };
        self.settle(t, p, step);
    }

    /// Checks a parked ALLOC or ATTACH now that its turn has come, then reads on.
    fn resume(&mut self, t: usize) {
        let Some(mut p) = self.pending.remove(&t) else {
            return;
        };
        p.parked = None;
        let step = match finish_frame(&self.shared, &mut p, true) {
            Step::Keep => read_frames(&self.shared, &mut p),
            other => other,
        };
        self.settle(t, p, step);
    }

    fn settle(&mut self, t: usize, mut p: Pending, step: Step) {
        match step {
            Step::Keep => {
                self.pending.insert(t, p);
            }
            Step::Park(at) => {
                p.parked = Some(at);
                self.parked.insert((at, t));
                self.pending.insert(t, p);
            }
            Step::Close => {
                // What the peer sent already is read first: closing a socket with unread bytes
                // resets it, and the peer would lose the answer that says why it is closed.
                let mut sink = [0u8; 4096];
                for _ in 0..4 {
                    if !matches!(p.stream.read(&mut sink), Ok(n) if n > 0) {
                        break;
                    }
                }
                self.pending.insert(t, p);
                self.close(t);
            }
            Step::HandOff(op, tag, reply) => self.hand_off(t, p, op, tag, reply),
        }
    }

    /// Takes connection `t` out of the stage (its place, its timers, its registration).
    fn forget(&mut self, t: usize, p: &Pending) {
        let _ = self.poll.registry().deregister(&mut SourceFd(&p.fd));
        self.deadlines.remove(&(p.deadline, t));
        if let Some(at) = p.parked {
            self.parked.remove(&(at, t));
        }
        self.counts.release(&self.shared.guard.limits, p.peer);
        self.shared.guard.counters.handshakes_open.fetch_sub(1, Relaxed);
    }

    /// Closes connection `t`.
    fn close(&mut self, t: usize) {
        if let Some(p) = self.pending.remove(&t) {
            self.forget(t, &p);
            self.shared.counters.connections.fetch_sub(1, Relaxed);
            // Not reached (a connection that attaches is handed off), but a segment's count
            // of attachments must never leak.
            if let Some(a) = &p.session.attached {
                self.shared.store.detach(a.id, &a.gate);
            }
        }
    }

    /// Gives an authenticated connection (already counted by [`crate::guard::Guard::admit`])
    /// a thread of its own, which answers its ALLOC or ATTACH first unless it was answered
    /// here.
    fn hand_off(&mut self, t: usize, mut p: Pending, op: Opcode, tag: u32, reply: Reply) {
        self.forget(t, &p);
        // On a Unix socket, the answer goes out now, before the thread is made: a forked
        // child connects twice and waited for each thread's start (of a fork's few
        // milliseconds, the largest part after the clone). The socket has sent nothing yet, so
        // a frame of a few hundred bytes fits; if it does not, the thread answers.
        let mut first = Some((op, tag, reply));
        let answer_now = first
            .as_ref()
            .filter(|(_, _, r)| r.fd.is_none() && !r.close && p.stream.passes_fds())
            .map(|(op, tag, r)| encode_response(*op, *tag, r.status, &r.payload));
        let mut broken = false;
        if let Some(frame) = answer_now {
            match p.stream.write(&frame) {
                Ok(n) if n == frame.len() => first = None,
                // Nothing went: the thread answers.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Part of the frame may be gone: the connection cannot go on.
                _ => broken = true,
            }
        }
        let shared = self.shared.clone();
        let limits = &shared.guard.limits;
        let peer = p.peer;
        let set_up = (|| {
            p.stream.set_nonblocking(false)?;
            p.stream.set_write_timeout(Some(limits.send_timeout))?;
            p.stream
                .set_read_timeout(limits.idle_timeout.filter(|t| !t.is_zero()))?;
            p.stream.shutdown_handle()
        })();
        let fail = |p: Pending| {
            if let Some(a) = &p.session.attached {
                shared.store.detach(a.id, &a.gate);
            }
            shared.guard.release(peer);
            shared.counters.connections.fetch_sub(1, Relaxed);
        };
        let ctl = match set_up {
            Ok(c) if !broken => c,
            _ => return fail(p),
        };
        self.next_conn += 1;
        let id = self.next_conn;
        lock(&shared.conns).insert(id, ctl);
        p.session.authenticated = true;
        let s = shared.clone();
        let Pending { stream, session, .. } = p;
        let spawned = std::thread::Builder::new()
            .name(format!("brick-conn-{id}"))
            .spawn(move || {
                serve_connection(&s, stream, session, first);
                lock(&s.conns).remove(&id);
                s.counters.connections.fetch_sub(1, Relaxed);
                s.guard.release(peer);
            });
        match spawned {
            Ok(th) => {
                let mut threads = lock(&shared.threads);
                threads.retain(|t| !t.is_finished());
                threads.push(th);
            }
            Err(_) => {
                // The closure (with the session) is gone; its attachment was counted.
                lock(&shared.conns).remove(&id);
                shared.guard.release(peer);
                shared.counters.connections.fetch_sub(1, Relaxed);
            }
        }
    }
}

/// A new connection's stream, non-blocking (TLS set up to handshake inside its reads).
fn prepare(sock: Accepted, cfg: &BrickConfig) -> io::Result<Box<dyn Stream>> {
    match sock {
        Accepted::Tcp(s) => {
            s.set_nonblocking(true)?;
            s.set_nodelay(true)?;
            match &cfg.tls {
                None => Ok(Box::new(s)),
                Some(config) => Ok(Box::new(TlsStream::new(s, config.clone())?)),
            }
        }
        Accepted::Unix(s) => {
            s.set_nonblocking(true)?;
            Ok(Box::new(s))
        }
    }
}

/// Reads frames, exactly one at a time, and serves each, until the socket has nothing more,
/// the connection closes, authenticates, or parks.
fn read_frames(shared: &Shared, p: &mut Pending) -> Step {
    loop {
        let got = match p.header {
            None => p.stream.read(&mut p.hdr[p.hdr_len..]),
            Some(_) if p.got == p.payload.len() => match finish_frame(shared, p, false) {
                Step::Keep => continue,
                other => return other,
            },
            Some(_) => p.stream.read(&mut p.payload[p.got..]),
        };
        match got {
            Ok(0) => return Step::Close,
            Ok(n) if p.header.is_none() => {
                p.hdr_len += n;
                if p.hdr_len == HEADER_LEN {
                    if let Some(step) = take_header(shared, p) {
                        return step;
                    }
                }
            }
            Ok(n) => p.got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Keep,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Step::Close,
        }
    }
}

/// The header is whole: refuse it on its own, or expect its payload.
fn take_header(shared: &Shared, p: &mut Pending) -> Option<Step> {
    let h = match Header::decode(&p.hdr) {
        Ok(h) => h,
        Err(e) => {
            shared.counters.errors.fetch_add(1, Relaxed);
            let (op, tag, status) = Header::refusal(&p.hdr, &e);
            send_now(
                &mut *p.stream,
                op,
                tag,
                &err(status, format!("malformed frame: {e}"), true),
            );
            return Some(Step::Close);
        }
    };
    if let Some(reply) = header_refusal(&h, false) {
        shared.counters.errors.fetch_add(1, Relaxed);
        shared.guard.counters.refused_headers.fetch_add(1, Relaxed);
        send_now(&mut *p.stream, h.opcode, h.tag, &reply);
        return Some(Step::Close);
    }
    // At most a secret or a grant with its proof (`header_refusal` saw to it).
    p.header = Some(h);
    p.payload = vec![0; h.payload_len as usize];
    p.got = 0;
    None
}

/// Serves the whole frame in `p` (`turn_taken`: an ALLOC or ATTACH whose turn has come).
fn finish_frame(shared: &Shared, p: &mut Pending, turn_taken: bool) -> Step {
    let Some(h) = p.header else {
        return Step::Keep;
    };
    if !turn_taken {
        shared.counters.requests.fetch_add(1, Relaxed);
    }
    let req = match Request::decode(&h, &p.payload) {
        Ok(r) => r,
        Err(e) => {
            shared.counters.errors.fetch_add(1, Relaxed);
            let reply = match e {
                e @ DecodeError::MissingProof => err(Status::GrantUnproven, e.to_string(), true),
                e => err(
                    Status::BadRequest,
                    format!("malformed {:?} request: {e}", h.opcode),
                    true,
                ),
            };
            send_now(&mut *p.stream, h.opcode, h.tag, &reply);
            return Step::Close;
        }
    };
    let authenticates = matches!(
        req,
        Request::Alloc { .. } | Request::Open { .. } | Request::Attach { .. } | Request::AttachPull { .. }
    );
    if authenticates && !turn_taken {
        match shared.guard.before_check(p.peer, Instant::now()) {
            Admission::Now => {}
            Admission::After(wait) => return Step::Park(Instant::now() + wait),
            Admission::Refuse(wait) => {
                shared.counters.errors.fetch_add(1, Relaxed);
                let reply = shared.throttled(p.peer, wait);
                send_now(&mut *p.stream, h.opcode, h.tag, &reply);
                return Step::Close;
            }
        }
    }
    p.header = None;
    p.hdr_len = 0;
    p.payload = Vec::new();
    p.got = 0;
    if authenticates {
        // A place among the authenticated connections first: a connection that would be
        // refused one is not worth a check.
        if let Err(why) = shared.guard.admit(p.peer) {
            shared.counters.errors.fetch_add(1, Relaxed);
            send_now(
                &mut *p.stream,
                h.opcode,
                h.tag,
                &err(Status::Busy, why.to_string(), true),
            );
            return Step::Close;
        }
        p.session.turn_taken = true;
        let reply = handle(shared, &mut p.session, req);
        if p.session.attached.is_some() {
            return Step::HandOff(h.opcode, h.tag, reply);
        }
        shared.guard.release(p.peer);
        if reply.status != Status::Ok {
            shared.counters.errors.fetch_add(1, Relaxed);
        }
        return if send_now(&mut *p.stream, h.opcode, h.tag, &reply) && !reply.close {
            Step::Keep
        } else {
            Step::Close
        };
    }
    let reply = handle(shared, &mut p.session, req);
    if reply.status != Status::Ok {
        shared.counters.errors.fetch_add(1, Relaxed);
    }
    if send_now(&mut *p.stream, h.opcode, h.tag, &reply) && !reply.close {
        Step::Keep
    } else {
        Step::Close
    }
}

/// Sends an answer without blocking; false if it did not all leave at once (the client is not
/// reading: no answer before authentication is bigger than a few hundred bytes).
fn send_now(stream: &mut dyn Stream, op: Opcode, tag: u32, r: &Reply) -> bool {
    let frame = encode_response(op, tag, r.status, &r.payload);
    let mut buf = &frame[..];
    while !buf.is_empty() {
        match stream.write(buf) {
            Ok(0) => return false,
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    let _ = stream.flush();
    true
}
