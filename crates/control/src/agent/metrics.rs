//! The agent's metrics: its counters in the Prometheus text format, and a minimal `GET
//! /metrics` responder to serve them.

use super::{pending_releases, Agent};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

impl Agent {
    /// The agent's counters in the Prometheus text format.
    pub fn metrics_text(&self) -> String {
        let c = &self.shared.counters;
        let pending = pending_releases(self);
        let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
        format!(
            "# HELP rackmem_agent_processes Processes connected to the agent.\n\
             # TYPE rackmem_agent_processes gauge\n\
             rackmem_agent_processes {}\n\
             # HELP rackmem_agent_allocations Allocations handed to processes and not returned.\n\
             # TYPE rackmem_agent_allocations gauge\n\
             rackmem_agent_allocations {}\n\
             # HELP rackmem_agent_allocated_bytes Bytes in those allocations.\n\
             # TYPE rackmem_agent_allocated_bytes gauge\n\
             rackmem_agent_allocated_bytes {}\n\
             # HELP rackmem_agent_refusals_total Requests refused by the agent or the control plane.\n\
             # TYPE rackmem_agent_refusals_total counter\n\
             rackmem_agent_refusals_total {}\n\
             # HELP rackmem_agent_pending_releases Releases the control plane has not taken yet.\n\
             # TYPE rackmem_agent_pending_releases gauge\n\
             rackmem_agent_pending_releases {pending}\n\
             # HELP rackmem_agent_node Node id of this agent.\n\
             # TYPE rackmem_agent_node gauge\n\
             rackmem_agent_node {}\n\
             # HELP rackmem_agent_connections_refused_total Connections turned away (peer not admitted, or over --max-connections).\n\
             # TYPE rackmem_agent_connections_refused_total counter\n\
             rackmem_agent_connections_refused_total {}\n\
             # HELP rackmem_agent_reclaimed_total Allocations nobody held, released by reconciliation.\n\
             # TYPE rackmem_agent_reclaimed_total counter\n\
             rackmem_agent_reclaimed_total {}\n\
             # HELP rackmem_agent_renewed_total Grant renewals of allocations processes hold.\n\
             # TYPE rackmem_agent_renewed_total counter\n\
             rackmem_agent_renewed_total {}\n",
            g(&c.processes),
            g(&c.allocations),
            g(&c.bytes),
            g(&c.refusals),
            self.node(),
            g(&c.connections_refused),
            g(&c.reclaimed),
            g(&c.renewed),
        )
    }
}

/// Scrapers held at once; when full, the one that has waited longest is closed.
const MAX_SCRAPERS: usize = 64;
/// How long a scraper has to send its request head.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest request head read.
const MAX_HEAD: usize = 2048;

/// One scraper's connection, until its request head is whole.
struct Scrape {
    sock: std::net::TcpStream,
    head: Vec<u8>,
    deadline: Instant,
}

/// Serves `GET /metrics` (Prometheus text) on `addr` from a thread of its own: a plain HTTP/1.1
/// responder, enough for a scraper, so the agent needs no web framework. One thread holds every
/// scraper's connection on epoll until its request head is whole (at most [`MAX_SCRAPERS`],
/// each for [`SCRAPE_TIMEOUT`]): a connection that says nothing delays no other scrape (one
/// read at a time with a timeout each did, by that timeout for every idle connection queued).
pub fn serve_metrics(
    addr: std::net::SocketAddr,
    text: impl Fn() -> String + Send + 'static,
) -> std::io::Result<std::net::SocketAddr> {
    let l = std::net::TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    let bound = l.local_addr()?;
    let poll = Poll::new()?;
    let lfd = l.as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&lfd), Token(0), Interest::READABLE)?;
    std::thread::Builder::new()
        .name("agent-metrics".into())
        .spawn(move || scrapes(&l, poll, &text))?;
    Ok(bound)
}

fn scrapes(l: &std::net::TcpListener, mut poll: Poll, text: &dyn Fn() -> String) {
    let mut events = Events::with_capacity(256);
    let mut conns: HashMap<usize, Scrape> = HashMap::new();
    let mut order: BTreeSet<(Instant, usize)> = BTreeSet::new();
    let mut next = 1usize;
    loop {
        let timeout = order.first().map(|(d, _)| d.saturating_duration_since(Instant::now()));
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                std::thread::sleep(Duration::from_millis(5));
            }
            continue;
        }
        let mut ready = Vec::new();
        for ev in events.iter() {
            if ev.token() == Token(0) {
                while let Ok((sock, _)) = l.accept() {
                    if conns.len() >= MAX_SCRAPERS {
                        if let Some((d, t)) = order.pop_first() {
                            if let Some(c) = conns.remove(&t) {
                                let _ = poll.registry().deregister(&mut SourceFd(&c.sock.as_raw_fd()));
                            }
                            let _ = d;
                        }
                    }
                    if sock.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let t = next;
                    next = next.wrapping_add(1).max(1);
                    let fd = sock.as_raw_fd();
                    if poll
                        .registry()
                        .register(&mut SourceFd(&fd), Token(t), Interest::READABLE)
                        .is_err()
                    {
                        continue;
                    }
                    let deadline = Instant::now() + SCRAPE_TIMEOUT;
                    order.insert((deadline, t));
                    conns.insert(
                        t,
                        Scrape {
                            sock,
                            head: Vec::new(),
                            deadline,
                        },
                    );
                    // Bytes that came before the registration are read now.
                    ready.push(t);
                }
            } else {
                ready.push(ev.token().0);
            }
        }
        for t in ready {
            let Some(c) = conns.get_mut(&t) else { continue };
            let done = read_head(c);
            if done {
                if let Some(mut c) = conns.remove(&t) {
                    let _ = poll.registry().deregister(&mut SourceFd(&c.sock.as_raw_fd()));
                    order.remove(&(c.deadline, t));
                    answer(&mut c, text);
                }
            }
        }
        let now = Instant::now();
        while let Some(&(d, t)) = order.first() {
            if d > now {
                break;
            }
            order.remove(&(d, t));
            if let Some(c) = conns.remove(&t) {
                let _ = poll.registry().deregister(&mut SourceFd(&c.sock.as_raw_fd()));
            }
        }
    }
}

/// Reads what the scraper sent; true once its head is whole (or it stopped sending, or it is
/// too long to be a scrape).
fn read_head(c: &mut Scrape) -> bool {
    let mut b = [0u8; 512];
    loop {
        match c.sock.read(&mut b) {
            Ok(0) => return true,
            Ok(n) => {
                c.head.extend_from_slice(&b[..n]);
                if c.head.len() >= MAX_HEAD || c.head.windows(4).any(|w| w == b"\r\n\r\n") {
                    return true;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
}

fn answer(c: &mut Scrape, text: &dyn Fn() -> String) {
    let head = String::from_utf8_lossy(&c.head);
    let (status, body) = if head.starts_with("GET /metrics ") {
        ("200 OK", text())
    } else {
        ("404 Not Found", "only GET /metrics is served here\n".to_string())
    };
    // The answer is a few KiB on a fresh socket: it fits the send buffer, and a scraper that
    // does not read is given a second at most.
    let _ = c.sock.set_nonblocking(false);
    let _ = c.sock.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = write!(
        c.sock,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
