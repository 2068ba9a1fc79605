//! Links from a node to memory bricks.
//!
//! A [`Link`] is one connection (TCP with `TCP_NODELAY`, or a Unix stream socket). Requests
//! carry tags and may be pipelined from several threads: a caller writes its frame under the
//! writer lock, then waits for its response under the reader lock, reading frames off the socket
//! itself and parking other callers' responses in a map. A caller alone on a link (the fault
//! handler) therefore reads its own response directly, with no thread hop: on 2-vCPU guests a
//! cross-thread wake-up costs ~30 µs, more than the network round trip.
//!
//! Every wait has a deadline. A closed connection, a timeout or a malformed response marks the
//! link broken: that request and every later one fail with [`LinkError::BrickLost`] naming the
//! brick. Nothing ever returns zeros in place of data.

use rackmem_proto::{BrickInfo, BrickStats, Extent, Grant, Header, Opcode, Request, Status, HEADER_LEN, MAX_PAYLOAD};
use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where a brick is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BrickAddr {
    /// `tcp://HOST:PORT`.
    Tcp(String),
    /// `unix:PATH`.
    Unix(PathBuf),
}

impl std::str::FromStr for BrickAddr {
    type Err = LinkError;
    fn from_str(s: &str) -> Result<Self, LinkError> {
        let bad = || LinkError::BadAddress(s.to_string());
        if let Some(a) = s.strip_prefix("tcp://") {
            match a.rsplit_once(':') {
                Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => Ok(BrickAddr::Tcp(a.to_string())),
                _ => Err(bad()),
            }
        } else if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                Err(bad())
            } else {
                Ok(BrickAddr::Unix(PathBuf::from(p)))
            }
        } else {
            Err(bad())
        }
    }
}

impl fmt::Display for BrickAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrickAddr::Tcp(a) => write!(f, "tcp://{a}"),
            BrickAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Errors of links.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LinkError {
    /// Malformed address.
    #[error("`{0}` is not a brick address: use tcp://HOST:PORT or unix:PATH")]
    BadAddress(String),
    /// Connecting failed.
    #[error("cannot reach brick {addr}: {cause}")]
    Unreachable {
        /// Brick.
        addr: String,
        /// Cause.
        cause: String,
    },
    /// The brick answered with an error status.
    #[error("brick {addr} refused {op:?}: {status:?}: {message}")]
    Refused {
        /// Brick.
        addr: String,
        /// Operation.
        op: Opcode,
        /// Status.
        status: Status,
        /// The brick's message.
        message: String,
    },
    /// The connection is gone (closed, timed out, or spoke garbage).
    #[error("brick {addr} lost: {cause}")]
    BrickLost {
        /// Brick.
        addr: String,
        /// Cause.
        cause: String,
    },
    /// A request too large for one frame.
    #[error("request too large: {0}")]
    TooLarge(String),
}

impl LinkError {
    /// True if the brick refused for lack of space.
    pub fn is_no_space(&self) -> bool {
        matches!(
            self,
            LinkError::Refused {
                status: Status::NoSpace,
                ..
            }
        )
    }
}

enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
        })
    }
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_read_timeout(d),
            Sock::Unix(s) => s.set_read_timeout(d),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Sock::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(b),
            Sock::Unix(s) => s.read(b),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(b),
            Sock::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Response {
    header: Header,
    payload: Vec<u8>,
}

struct ReaderState {
    sock: BufReader<Sock>,
    parked: HashMap<u32, Response>,
}

/// One connection to a brick. `Send + Sync`; see the crate docs for the pipelining scheme.
pub struct Link {
    addr: BrickAddr,
    addr_text: String,
    info: BrickInfo,
    writer: Mutex<Sock>,
    reader: Mutex<ReaderState>,
    broken: Mutex<Option<String>>,
    next_tag: AtomicU32,
    timeout: Duration,
    control: Sock,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link").field("addr", &self.addr_text).finish()
    }
}

impl Link {
    /// Connects and says HELLO.
    pub fn connect(addr: &BrickAddr, timeout: Duration) -> Result<Link, LinkError> {
        let text = addr.to_string();
        let unreachable = |cause: String| LinkError::Unreachable {
            addr: text.clone(),
            cause,
        };
        let sock = match addr {
            BrickAddr::Tcp(a) => {
                let sa = a
                    .to_socket_addrs()
                    .map_err(|e| unreachable(format!("cannot resolve: {e}")))?
                    .next()
                    .ok_or_else(|| unreachable("no address".into()))?;
                let s = TcpStream::connect_timeout(&sa, timeout).map_err(|e| unreachable(e.to_string()))?;
                let _ = s.set_nodelay(true);
                Sock::Tcp(s)
            }
            BrickAddr::Unix(p) => Sock::Unix(UnixStream::connect(p).map_err(|e| unreachable(e.to_string()))?),
        };
        sock.set_read_timeout(Some(timeout))
            .map_err(|e| unreachable(e.to_string()))?;
        let writer = sock.try_clone().map_err(|e| unreachable(e.to_string()))?;
        let control = sock.try_clone().map_err(|e| unreachable(e.to_string()))?;
        let mut link = Link {
            addr: addr.clone(),
            addr_text: text.clone(),
            info: BrickInfo {
                pool_bytes: 0,
                free_bytes: 0,
                page_size: 4096,
                max_payload: MAX_PAYLOAD,
                brick_id: 0,
            },
            writer: Mutex::new(writer),
            reader: Mutex::new(ReaderState {
                sock: BufReader::with_capacity(256 << 10, sock),
                parked: HashMap::new(),
            }),
            broken: Mutex::new(None),
            next_tag: AtomicU32::new(1),
            timeout,
            control,
        };
        let r = link
            .call(&Request::Hello)
            .map_err(|e| unreachable(format!("no HELLO answer: {e}")))?;
        link.info = BrickInfo::decode(&r).map_err(|e| unreachable(format!("bad HELLO answer: {e}")))?;
        Ok(link)
    }

    /// The brick's address.
    pub fn addr(&self) -> &BrickAddr {
        &self.addr
    }

    /// What the brick said at HELLO.
    pub fn info(&self) -> &BrickInfo {
        &self.info
    }

    fn lost(&self, cause: String) -> LinkError {
        let mut b = self.broken.lock().unwrap_or_else(|e| e.into_inner());
        if b.is_none() {
            *b = Some(cause.clone());
            self.control.shutdown();
        }
        LinkError::BrickLost {
            addr: self.addr_text.clone(),
            cause: b.clone().unwrap_or(cause),
        }
    }

    fn check_broken(&self) -> Result<(), LinkError> {
        match &*self.broken.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(c) => Err(LinkError::BrickLost {
                addr: self.addr_text.clone(),
                cause: c.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Sends a request; returns its tag.
    fn submit(&self, req: &Request) -> Result<u32, LinkError> {
        self.check_broken()?;
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let frame = req.encode(tag);
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        w.write_all(&frame)
            .map_err(|e| self.lost(format!("send failed: {e}")))?;
        Ok(tag)
    }

    /// Waits for the response to `tag`; returns its payload or the brick's refusal.
    fn wait(&self, tag: u32, op: Opcode) -> Result<Vec<u8>, LinkError> {
        let deadline = Instant::now() + self.timeout;
        let mut r = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        let resp = loop {
            if let Some(resp) = r.parked.remove(&tag) {
                break resp;
            }
            self.check_broken()?;
            if Instant::now() > deadline {
                return Err(self.lost(format!("no answer within {:?}", self.timeout)));
            }
            let mut hdr = [0u8; HEADER_LEN];
            if let Err(e) = r.sock.read_exact(&mut hdr) {
                let cause = match e.kind() {
                    io::ErrorKind::UnexpectedEof => "connection closed by the brick".to_string(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                        format!("no answer within {:?}", self.timeout)
                    }
                    _ => e.to_string(),
                };
                return Err(self.lost(cause));
            }
            let h = Header::decode(&hdr).map_err(|e| self.lost(format!("malformed response: {e}")))?;
            if !h.is_response() {
                return Err(self.lost("peer sent a request, not a response".into()));
            }
            let mut payload = vec![0u8; h.payload_len as usize];
            r.sock
                .read_exact(&mut payload)
                .map_err(|e| self.lost(format!("truncated response: {e}")))?;
            if h.tag == tag {
                break Response { header: h, payload };
            }
            r.parked.insert(h.tag, Response { header: h, payload });
        };
        drop(r);
        let status = Status::from_u32(resp.header.status);
        if status != Status::Ok {
            let message = String::from_utf8_lossy(&resp.payload).into_owned();
            return Err(LinkError::Refused {
                addr: self.addr_text.clone(),
                op,
                status,
                message,
            });
        }
        Ok(resp.payload)
    }

    fn call(&self, req: &Request) -> Result<Vec<u8>, LinkError> {
        let tag = self.submit(req)?;
        self.wait(tag, req.opcode())
    }

    /// Standalone mode: carves a segment with the brick's shared secret and attaches to it.
    pub fn alloc_segment(&self, secret: &[u8], size_bytes: u64) -> Result<Grant, LinkError> {
        let p = self.call(&Request::Alloc {
            size_bytes,
            secret: secret.to_vec(),
        })?;
        Grant::decode(&p).map_err(|e| self.lost(format!("bad grant in ALLOC answer: {e}")))
    }

    /// Binds this link to a segment.
    pub fn attach(&self, grant: &Grant) -> Result<(), LinkError> {
        self.call(&Request::Attach(grant.clone())).map(|_| ())
    }

    /// Copy-on-write clone of the attached segment; the grant is for the new segment.
    pub fn clone_segment(&self) -> Result<Grant, LinkError> {
        let p = self.call(&Request::Clone)?;
        Grant::decode(&p).map_err(|e| self.lost(format!("bad grant in CLONE answer: {e}")))
    }

    fn batches(extents: &[Extent]) -> Vec<&[Extent]> {
        // Keep each request within the payload and extent limits.
        let mut out = Vec::new();
        let mut start = 0;
        let mut bytes = 0u64;
        for (i, e) in extents.iter().enumerate() {
            if i > start && (bytes + e.1 as u64 > (MAX_PAYLOAD as u64 - 65536) || i - start >= 1024) {
                out.push(&extents[start..i]);
                start = i;
                bytes = 0;
            }
            bytes += e.1 as u64;
        }
        if start < extents.len() {
            out.push(&extents[start..]);
        }
        out
    }

    /// Reads the extents, in order, into `out` (whose length must be their total).
    pub fn read_pages(&self, extents: &[Extent], out: &mut [u8]) -> Result<(), LinkError> {
        let total: u64 = extents.iter().map(|e| e.1 as u64).sum();
        if total != out.len() as u64 {
            return Err(LinkError::TooLarge(format!(
                "buffer of {} bytes for {total} bytes of extents",
                out.len()
            )));
        }
        let batches = Self::batches(extents);
        // Pipeline: send every batch, then collect the answers in order.
        let tags = batches
            .iter()
            .map(|b| self.submit(&Request::Read(b.to_vec())))
            .collect::<Result<Vec<_>, _>>()?;
        let mut at = 0usize;
        for (b, tag) in batches.iter().zip(tags) {
            let p = self.wait(tag, Opcode::Read)?;
            let n: usize = b.iter().map(|e| e.1 as usize).sum();
            if p.len() != n {
                return Err(self.lost(format!("READ answer of {} bytes, expected {n}", p.len())));
            }
            out[at..at + n].copy_from_slice(&p);
            at += n;
        }
        Ok(())
    }

    /// Writes `data` to the extents, in order.
    pub fn write_pages(&self, extents: &[Extent], data: &[u8]) -> Result<(), LinkError> {
        let total: u64 = extents.iter().map(|e| e.1 as u64).sum();
        if total != data.len() as u64 {
            return Err(LinkError::TooLarge(format!(
                "{} bytes of data for {total} bytes of extents",
                data.len()
            )));
        }
        let mut at = 0usize;
        let mut tags = Vec::new();
        for b in Self::batches(extents) {
            let n: usize = b.iter().map(|e| e.1 as usize).sum();
            tags.push(self.submit(&Request::Write {
                extents: b.to_vec(),
                data: data[at..at + n].to_vec(),
            })?);
            at += n;
        }
        for t in tags {
            self.wait(t, Opcode::Write)?;
        }
        Ok(())
    }

    /// Zeroes a range of the segment and releases its memory on the brick.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), LinkError> {
        self.call(&Request::Discard { offset, len }).map(|_| ())
    }

    /// Copies within the segment on the brick.
    pub fn copy_within(&self, src: u64, dst: u64, len: u64) -> Result<(), LinkError> {
        self.call(&Request::Copy { src, dst, len }).map(|_| ())
    }

    /// Round trip time of a PING.
    pub fn ping(&self) -> Result<Duration, LinkError> {
        let t = Instant::now();
        self.call(&Request::Ping)?;
        Ok(t.elapsed())
    }

    /// The brick's counters.
    pub fn stats(&self) -> Result<BrickStats, LinkError> {
        let p = self.call(&Request::Stats)?;
        BrickStats::decode(&p).map_err(|e| self.lost(format!("bad STATS answer: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        for s in ["tcp://127.0.0.1:7070", "unix:/tmp/b.sock", "tcp://host:1"] {
            let a: BrickAddr = s.parse().unwrap();
            assert_eq!(a.to_string(), s);
        }
        for s in ["", "tcp://", "tcp://host", "tcp://:80", "http://x:1", "unix:"] {
            assert!(s.parse::<BrickAddr>().is_err(), "{s}");
        }
    }

    #[test]
    fn batches_respect_limits() {
        let ext: Vec<Extent> = (0..3000).map(|i| (i * 4096, 4096)).collect();
        let b = Link::batches(&ext);
        assert_eq!(b.iter().map(|x| x.len()).sum::<usize>(), 3000);
        assert!(b.iter().all(|x| x.len() <= 1024));
    }
}
