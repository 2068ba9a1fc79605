//! A minimal `GET /metrics` responder for services without a web framework.

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Scrapers held at once; when full, the one that has waited longest is closed.
pub const MAX_SCRAPERS: usize = 64;
/// How long a scraper has to send its request head.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest request head read.
const MAX_HEAD: usize = 2048;

/// One scraper's connection, until its request head is whole.
struct Scrape {
    sock: std::net::TcpStream,
    head: Vec<u8>,
    deadline: Instant,
}

/// Serves `GET /metrics` on `addr` from a thread of its own, named `thread`: a plain HTTP/1.1
/// responder, enough for a scraper, so a service needs no web framework. `text` renders the
/// answer (see [`crate::encode`]) for each scrape. One thread holds every
/// scraper's connection on epoll until its request head is whole (at most [`MAX_SCRAPERS`],
/// each for [`SCRAPE_TIMEOUT`]): a connection that says nothing delays no other scrape (one
/// read at a time with a timeout each did, by that timeout for every idle connection queued).
pub fn serve(
    addr: std::net::SocketAddr,
    thread: &str,
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
        .name(thread.into())
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
                        if let Some((_, t)) = order.pop_first() {
                            if let Some(c) = conns.remove(&t) {
                                let _ = poll.registry().deregister(&mut SourceFd(&c.sock.as_raw_fd()));
                            }
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
    let (status, content_type, body) = if head.starts_with("GET /metrics ") {
        ("200 OK", crate::CONTENT_TYPE, text())
    } else {
        (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "only GET /metrics is served here\n".to_string(),
        )
    };
    // The answer is a few KiB on a fresh socket: it fits the send buffer, and a scraper that
    // does not read is given a second at most.
    let _ = c.sock.set_nonblocking(false);
    let _ = c.sock.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = write!(
        c.sock,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
