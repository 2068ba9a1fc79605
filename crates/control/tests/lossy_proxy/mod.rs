#![allow(dead_code)] // Each test binary that includes it uses part of it.
//! A TCP proxy in front of a control plane that loses replies: for the first few requests that
//! start with `POST /v1/allocations`, it forwards the request, waits until the control plane
//! answers (so the allocation is committed) and then closes the client's connection without
//! passing the answer on — a control plane that died between its commit and its reply, made
//! deterministic. Every other request goes through untouched. (Shared by the control plane's
//! and the agent's tests.)

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// A running proxy; its threads end with the test process.
pub struct LossyProxy {
    /// `http://127.0.0.1:PORT` of the proxy.
    pub url: String,
    /// Allocation replies still to lose.
    to_lose: Arc<AtomicUsize>,
    /// Allocation replies lost so far.
    lost: Arc<AtomicUsize>,
}

impl LossyProxy {
    /// A proxy to `upstream` (`http://HOST:PORT`) losing the next `replies` allocation replies.
    pub fn start(upstream: &str, replies: usize) -> LossyProxy {
        let upstream = upstream.strip_prefix("http://").expect("an http:// URL").to_string();
        let l = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let url = format!("http://{}", l.local_addr().expect("proxy address"));
        let to_lose = Arc::new(AtomicUsize::new(replies));
        let lost = Arc::new(AtomicUsize::new(0));
        let (t, n) = (to_lose.clone(), lost.clone());
        std::thread::spawn(move || {
            for client in l.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let (t, n) = (t.clone(), n.clone());
                std::thread::spawn(move || relay(client, server, t, n));
            }
        });
        LossyProxy { url, to_lose, lost }
    }

    /// Loses the next `replies` allocation replies (from now on).
    pub fn lose(&self, replies: usize) {
        self.to_lose.store(replies, Ordering::SeqCst);
    }

    /// How many allocation replies were lost so far.
    pub fn lost(&self) -> usize {
        self.lost.load(Ordering::SeqCst)
    }
}

fn relay(client: TcpStream, server: TcpStream, to_lose: Arc<AtomicUsize>, lost: Arc<AtomicUsize>) {
    let doomed = Arc::new(AtomicBool::new(false));
    let (Ok(mut c_in), Ok(mut s_out)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let d = doomed.clone();
    // Requests: client → control plane. The flag is set before the request goes on, so the
    // reply can never overtake it.
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match c_in.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if buf[..n].windows(20).any(|w| w == b"POST /v1/allocations")
                && to_lose
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
                    .is_ok()
            {
                d.store(true, Ordering::SeqCst);
            }
            if s_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = s_out.shutdown(Shutdown::Write);
    });
    // Replies: control plane → client, unless the request in flight is to lose its reply.
    let (mut s_in, mut c_out) = (server, client);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match s_in.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if doomed.load(Ordering::SeqCst) {
            lost.fetch_add(1, Ordering::SeqCst);
            break;
        }
        if c_out.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = c_out.shutdown(Shutdown::Both);
    let _ = s_in.shutdown(Shutdown::Both);
}
