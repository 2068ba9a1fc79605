//! Accepting connections and serving requests.

use crate::pool::{in_segment, Store, CHUNK};
use rackmem_proto::{
    encode_response, extents_bytes, rights, BrickInfo, BrickStats, Grant, GrantError, Header, Opcode, Request, Status,
    HEADER_LEN, MAX_MESSAGE, MAX_PAYLOAD, PAGE_SIZE,
};
use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where a brick listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// `tcp://HOST:PORT` (port 0 picks one).
    Tcp(String),
    /// `unix:PATH`.
    Unix(PathBuf),
}

impl std::str::FromStr for ListenAddr {
    type Err = BrickError;
    fn from_str(s: &str) -> Result<Self, BrickError> {
        if let Some(a) = s.strip_prefix("tcp://") {
            if a.rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
            {
                return Err(BrickError::BadAddress(s.to_string()));
            }
            Ok(ListenAddr::Tcp(a.to_string()))
        } else if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(BrickError::BadAddress(s.to_string()));
            }
            Ok(ListenAddr::Unix(PathBuf::from(p)))
        } else {
            Err(BrickError::BadAddress(s.to_string()))
        }
    }
}

/// Errors starting a brick.
#[derive(Debug, thiserror::Error)]
pub enum BrickError {
    /// The address is malformed.
    #[error("`{0}` is not a listen address: use tcp://HOST:PORT or unix:PATH")]
    BadAddress(String),
    /// The address is taken.
    #[error("{0} is already in use (another brick running?)")]
    InUse(String),
    /// Binding failed otherwise.
    #[error("cannot listen on {addr}: {err}")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        err: io::Error,
    },
    /// Bad size.
    #[error("pool size {0} is too small (at least 1 MiB)")]
    Size(u64),
}

/// How to run a brick.
#[derive(Debug, Clone)]
pub struct BrickConfig {
    /// Listen address.
    pub listen: ListenAddr,
    /// Pool size.
    pub size_bytes: u64,
    /// Key grants are signed with.
    pub key: Vec<u8>,
    /// Shared secret that allows ALLOC (standalone mode); `None` disables ALLOC.
    pub secret: Option<Vec<u8>>,
}

#[derive(Default)]
struct Counters {
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    requests: AtomicU64,
    connections: AtomicU64,
    errors: AtomicU64,
}

struct Shared {
    cfg: BrickConfig,
    store: Store,
    counters: Counters,
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, Conn>>,
    brick_id: u64,
}

enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn shutdown(&self) {
        let _ = match self {
            Conn::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Conn::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

/// A running brick.
pub struct BrickHandle {
    shared: Arc<Shared>,
    addr: String,
    acceptor: Option<JoinHandle<()>>,
    unix_path: Option<PathBuf>,
}

/// Starts bricks.
pub struct Brick;

/// Grace period for a cloned segment to be attached by its new owner.
const CLONE_GRACE: Duration = Duration::from_secs(60);

impl Brick {
    /// Binds, spawns the acceptor and returns.
    pub fn start(cfg: BrickConfig) -> Result<BrickHandle, BrickError> {
        if cfg.size_bytes < CHUNK {
            return Err(BrickError::Size(cfg.size_bytes));
        }
        let mut id = [0u8; 8];
        let _ = getrandom::fill(&mut id);
        let (listener, addr, unix_path) = match &cfg.listen {
            ListenAddr::Tcp(a) => {
                let l = TcpListener::bind(a).map_err(|e| match e.kind() {
                    io::ErrorKind::AddrInUse => BrickError::InUse(format!("tcp://{a}")),
                    _ => BrickError::Bind {
                        addr: format!("tcp://{a}"),
                        err: e,
                    },
                })?;
                let local = l.local_addr().map_err(|e| BrickError::Bind {
                    addr: a.clone(),
                    err: e,
                })?;
                (Listener::Tcp(l), format!("tcp://{local}"), None)
            }
            ListenAddr::Unix(p) => {
                if p.exists() {
                    // A socket file nobody answers on is stale (a brick that was killed).
                    if UnixStream::connect(p).is_ok() {
                        return Err(BrickError::InUse(format!("unix:{}", p.display())));
                    }
                    let _ = std::fs::remove_file(p);
                }
                let l = UnixListener::bind(p).map_err(|e| match e.kind() {
                    io::ErrorKind::AddrInUse => BrickError::InUse(format!("unix:{}", p.display())),
                    _ => BrickError::Bind {
                        addr: format!("unix:{}", p.display()),
                        err: e,
                    },
                })?;
                (Listener::Unix(l), format!("unix:{}", p.display()), Some(p.clone()))
            }
        };
        let shared = Arc::new(Shared {
            store: Store::new(cfg.size_bytes),
            cfg,
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            brick_id: u64::from_le_bytes(id),
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("brick-accept".into())
            .spawn(move || accept_loop(s, listener))
            .map_err(|e| BrickError::Bind {
                addr: addr.clone(),
                err: e,
            })?;
        Ok(BrickHandle {
            shared,
            addr,
            acceptor: Some(acceptor),
            unix_path,
        })
    }
}

impl BrickHandle {
    /// The address clients use (`tcp://127.0.0.1:PORT` or `unix:PATH`).
    pub fn local_addr(&self) -> String {
        self.addr.clone()
    }

    /// Counters now.
    pub fn stats(&self) -> BrickStats {
        self.shared.stats()
    }

    /// Stops accepting, closes every connection, removes the socket file.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        for c in self.shared.conns.lock().unwrap_or_else(|e| e.into_inner()).values() {
            c.shutdown();
        }
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        if let Some(p) = self.unix_path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for BrickHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

fn accept_loop(shared: Arc<Shared>, listener: Listener) {
    let _ = match &listener {
        Listener::Tcp(l) => l.set_nonblocking(true),
        Listener::Unix(l) => l.set_nonblocking(true),
    };
    let mut next_conn = 0u64;
    let mut last_sweep = Instant::now();
    while !shared.stop.load(Relaxed) {
        let accepted = match &listener {
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                let _ = s.set_nonblocking(false);
                (s.try_clone().map(Conn::Tcp), Box::new(s) as Box<dyn Stream>)
            }),
            Listener::Unix(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nonblocking(false);
                (s.try_clone().map(Conn::Unix), Box::new(s) as Box<dyn Stream>)
            }),
        };
        match accepted {
            Ok((Ok(ctl), stream)) => {
                next_conn += 1;
                let id = next_conn;
                shared.conns.lock().unwrap_or_else(|e| e.into_inner()).insert(id, ctl);
                shared.counters.connections.fetch_add(1, Relaxed);
                let s = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("brick-conn-{id}"))
                    .spawn(move || {
                        serve_connection(&s, stream);
                        s.conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                        s.counters.connections.fetch_sub(1, Relaxed);
                    });
                if spawned.is_err() {
                    shared.conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                    shared.counters.connections.fetch_sub(1, Relaxed);
                }
            }
            Ok((Err(_), _)) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
        if last_sweep.elapsed() > Duration::from_secs(1) {
            last_sweep = Instant::now();
            shared.sweep();
        }
    }
}

trait Stream: Read + Write + Send {}
impl Stream for TcpStream {}
impl Stream for UnixStream {}

impl Shared {
    fn stats(&self) -> BrickStats {
        let c = &self.counters;
        let segs = self.store.segs();
        BrickStats {
            bytes_read: c.bytes_read.load(Relaxed),
            bytes_written: c.bytes_written.load(Relaxed),
            requests: c.requests.load(Relaxed),
            connections: c.connections.load(Relaxed),
            errors: c.errors.load(Relaxed),
            resident_bytes: self.store.pool.resident_bytes(),
            segments: segs.live.len() as u64,
            free_bytes: segs.free_bytes(),
        }
    }

    /// Frees clones nobody attached in time.
    fn sweep(&self) {
        let now = Instant::now();
        let expired: Vec<u64> = self
            .store
            .segs()
            .live
            .iter()
            .filter(|(_, s)| s.attached == 0 && s.unattached_deadline.is_some_and(|d| d < now))
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            self.store.free_segment(id);
        }
    }

    fn sign(&self, id: u64, offset: u64, size: u64) -> Grant {
        Grant::sign(&self.cfg.key, id, offset, size, 0, rights::ALL, 0)
    }
}

/// The segment a connection is bound to.
struct Attached {
    id: u64,
    offset: u64,
    size: u64,
    rights: u8,
}

struct Reply {
    status: Status,
    payload: Vec<u8>,
    close: bool,
}

fn ok(payload: Vec<u8>) -> Reply {
    Reply {
        status: Status::Ok,
        payload,
        close: false,
    }
}

fn err(status: Status, msg: impl Into<String>, close: bool) -> Reply {
    let mut m = msg.into().into_bytes();
    m.truncate(MAX_MESSAGE);
    Reply {
        status,
        payload: m,
        close,
    }
}

fn serve_connection(shared: &Shared, stream: Box<dyn Stream>) {
    // One stream used for both directions through a shared cell would need unsafe; instead
    // buffer reads and writes on the same object in turn (requests are processed in order).
    let mut io = BufReader::with_capacity(256 << 10, StreamIo(stream));
    let mut out: BufWriter<Vec<u8>> = BufWriter::new(Vec::new());
    let mut attached: Option<Attached> = None;
    let mut hdr = [0u8; HEADER_LEN];
    let mut payload = Vec::new();
    loop {
        if read_exact_or_eof(&mut io, &mut hdr).is_err() {
            break;
        }
        let h = match Header::decode(&hdr) {
            Ok(h) => h,
            Err(e) => {
                shared.counters.errors.fetch_add(1, Relaxed);
                let _ = send(
                    &mut io,
                    &mut out,
                    Opcode::Ping,
                    0,
                    err(Status::BadRequest, format!("malformed frame: {e}"), true),
                    true,
                );
                break;
            }
        };
        payload.clear();
        payload.resize(h.payload_len as usize, 0);
        if io.read_exact(&mut payload).is_err() {
            // A frame cut short: the peer died or is misbehaving.
            shared.counters.errors.fetch_add(1, Relaxed);
            break;
        }
        shared.counters.requests.fetch_add(1, Relaxed);
        let reply = match Request::decode(&h, &payload) {
            Ok(r) => handle(shared, &mut attached, r),
            Err(e) => err(
                Status::BadRequest,
                format!("malformed {:?} request: {e}", h.opcode),
                true,
            ),
        };
        if reply.status != Status::Ok {
            shared.counters.errors.fetch_add(1, Relaxed);
        }
        let close = reply.close;
        let flush = close || io.buffer().is_empty();
        if send(&mut io, &mut out, h.opcode, h.tag, reply, flush).is_err() || close {
            break;
        }
    }
    if let Some(a) = attached {
        detach(shared, a.id);
    }
}

struct StreamIo(Box<dyn Stream>);
impl Read for StreamIo {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.0.read(b)
    }
}

fn read_exact_or_eof(r: &mut impl Read, b: &mut [u8]) -> io::Result<()> {
    r.read_exact(b)
}

fn send(
    io: &mut BufReader<StreamIo>,
    out: &mut BufWriter<Vec<u8>>,
    op: Opcode,
    tag: u32,
    r: Reply,
    flush: bool,
) -> io::Result<()> {
    out.write_all(&encode_response(op, tag, r.status, &r.payload))?;
    if flush || out.get_ref().len() > 1 << 20 {
        out.flush()?;
        let buf = std::mem::take(out.get_mut());
        io.get_mut().0.write_all(&buf)?;
        io.get_mut().0.flush()?;
    }
    Ok(())
}

fn detach(shared: &Shared, id: u64) {
    let free = {
        let mut segs = shared.store.segs();
        match segs.live.get_mut(&id) {
            Some(s) => {
                s.attached = s.attached.saturating_sub(1);
                s.attached == 0
            }
            None => false,
        }
    };
    if free {
        shared.store.free_segment(id);
    }
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn handle(shared: &Shared, attached: &mut Option<Attached>, req: Request) -> Reply {
    let store = &shared.store;
    match req {
        Request::Hello => ok(BrickInfo {
            pool_bytes: shared.cfg.size_bytes,
            free_bytes: store.segs().free_bytes(),
            page_size: PAGE_SIZE,
            max_payload: MAX_PAYLOAD,
            brick_id: shared.brick_id,
        }
        .encode()),
        Request::Ping => ok(Vec::new()),
        Request::Stats => ok(shared.stats().encode()),
        Request::Alloc { size_bytes, secret } => {
            let allowed = shared.cfg.secret.as_ref().is_some_and(|s| {
                s.len() == secret.len() && s.iter().zip(&secret).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0
            });
            if !allowed {
                return err(
                    Status::Denied,
                    "wrong shared secret (or this brick takes grants from a control plane only)",
                    true,
                );
            }
            if attached.is_some() {
                return err(Status::BadRequest, "connection already attached to a segment", false);
            }
            if size_bytes == 0 || size_bytes > shared.cfg.size_bytes {
                return err(
                    Status::NoSpace,
                    format!(
                        "cannot carve {size_bytes} bytes from a pool of {}",
                        shared.cfg.size_bytes
                    ),
                    false,
                );
            }
            let Some((id, off)) = store.segs().carve(size_bytes, None) else {
                return err(Status::NoSpace, format!("no free extent of {size_bytes} bytes"), false);
            };
            let size = size_bytes.div_ceil(CHUNK) * CHUNK;
            if let Some(s) = store.segs().live.get_mut(&id) {
                s.attached = 1;
            }
            *attached = Some(Attached {
                id,
                offset: off,
                size,
                rights: rights::ALL,
            });
            ok(shared.sign(id, off, size).encode())
        }
        Request::Attach(g) => {
            match g.verify(&shared.cfg.key, now_unix()) {
                Ok(()) => {}
                Err(GrantError::Expired) => return err(Status::GrantExpired, "grant expired", true),
                Err(GrantError::BadSignature) => {
                    return err(Status::GrantInvalid, "grant signature does not verify", true)
                }
            }
            if attached.is_some() {
                return err(Status::BadRequest, "connection already attached to a segment", false);
            }
            {
                let mut segs = store.segs();
                match segs.live.get_mut(&g.segment_id) {
                    Some(s) if s.offset == g.brick_offset && s.size == g.size_bytes => {
                        s.attached += 1;
                        s.unattached_deadline = None;
                    }
                    _ => {
                        return err(
                            Status::NoSegment,
                            format!("segment {} does not exist on this brick", g.segment_id),
                            true,
                        )
                    }
                }
            }
            *attached = Some(Attached {
                id: g.segment_id,
                offset: g.brick_offset,
                size: g.size_bytes,
                rights: g.rights,
            });
            ok(Vec::new())
        }
        Request::Detach => match attached.take() {
            Some(a) => {
                detach(shared, a.id);
                ok(Vec::new())
            }
            None => err(Status::NotAttached, "not attached", false),
        },
        other => {
            let Some(a) = attached.as_ref() else {
                return err(Status::NotAttached, "ATTACH or ALLOC before data requests", true);
            };
            data_op(shared, a, other)
        }
    }
}

fn data_op(shared: &Shared, a: &Attached, req: Request) -> Reply {
    let store = &shared.store;
    let need = |r: u8| a.rights & r == r;
    let out_of_range = |o: u64, l: u64| {
        err(
            Status::OutOfRange,
            format!("{o:#x}+{l:#x} is outside the segment of {:#x} bytes", a.size),
            true,
        )
    };
    match req {
        Request::Read(ext) => {
            if !need(rights::READ) {
                return err(Status::Forbidden, "grant does not allow reads", true);
            }
            let total = extents_bytes(&ext);
            if total > MAX_PAYLOAD as u64 {
                return err(
                    Status::BadRequest,
                    format!("{total} bytes exceed the response limit"),
                    true,
                );
            }
            let mut data = vec![0u8; total as usize];
            let mut at = 0usize;
            for (o, l) in ext {
                if !in_segment(a.size, o, l as u64) {
                    return out_of_range(o, l as u64);
                }
                store.pool.read(a.offset + o, &mut data[at..at + l as usize]);
                at += l as usize;
            }
            shared.counters.bytes_read.fetch_add(total, Relaxed);
            ok(data)
        }
        Request::Write { extents, data } => {
            if !need(rights::WRITE) {
                return err(Status::Forbidden, "grant does not allow writes", true);
            }
            if let Some(&(o, l)) = extents.iter().find(|&&(o, l)| !in_segment(a.size, o, l as u64)) {
                return out_of_range(o, l as u64);
            }
            let mut at = 0usize;
            for (o, l) in extents {
                store.pool.write(a.offset + o, &data[at..at + l as usize]);
                at += l as usize;
            }
            shared.counters.bytes_written.fetch_add(at as u64, Relaxed);
            ok(Vec::new())
        }
        Request::Discard { offset, len } => {
            if !need(rights::WRITE) {
                return err(Status::Forbidden, "grant does not allow writes", true);
            }
            if !in_segment(a.size, offset, len) || len % PAGE_SIZE as u64 != 0 {
                return out_of_range(offset, len);
            }
            store.pool.discard(a.offset + offset, len);
            ok(Vec::new())
        }
        Request::Copy { src, dst, len } => {
            if !need(rights::WRITE) {
                return err(Status::Forbidden, "grant does not allow writes", true);
            }
            if !in_segment(a.size, src, len) || !in_segment(a.size, dst, len) {
                return out_of_range(src.max(dst), len);
            }
            let mut buf = vec![0u8; CHUNK as usize];
            // Copy in chunk-sized steps, in the direction that is safe for overlap.
            let steps: Vec<u64> = (0..len.div_ceil(CHUNK)).map(|i| i * CHUNK).collect();
            let order: Box<dyn Iterator<Item = &u64>> = if dst > src {
                Box::new(steps.iter().rev())
            } else {
                Box::new(steps.iter())
            };
            for &s in order {
                let n = (len - s).min(CHUNK) as usize;
                store.pool.read(a.offset + src + s, &mut buf[..n]);
                store.pool.write(a.offset + dst + s, &buf[..n]);
            }
            ok(Vec::new())
        }
        Request::Clone => {
            if !need(rights::CLONE) {
                return err(Status::Forbidden, "grant does not allow clones", true);
            }
            let Some((id, off)) = store.segs().carve(a.size, Some(Instant::now() + CLONE_GRACE)) else {
                return err(
                    Status::NoSpace,
                    format!("no free extent of {} bytes for the clone", a.size),
                    false,
                );
            };
            store.pool.share(a.offset, off, a.size);
            ok(shared.sign(id, off, a.size).encode())
        }
        _ => err(Status::BadRequest, "unexpected request", true),
    }
}
