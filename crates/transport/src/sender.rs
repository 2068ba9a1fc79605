//! Frames out: one whole frame at a time under the send lock (sealed first on a `tls://` link),
//! at most `MAX_IN_FLIGHT` unanswered, and a sender whose socket is full drains responses so
//! the brick, which may be blocked sending them, can go on.

use crate::error::LinkError;
use crate::limits::{MAX_IN_FLIGHT, TLS_SEAL_BYTES};
use crate::link::Link;
use crate::socket::Sock;
use crate::sync::lock;
use crate::tls;
use rackmem_proto::{Opcode, Request};
use std::io::{self, IoSlice, Write};
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Link {
    /// Sends one frame (`head` then `data`) and returns its tag. `head` is built for the tag.
    pub(crate) fn send(&self, op: Opcode, head: impl FnOnce(u32) -> Vec<u8>, data: &[u8]) -> Result<u32, LinkError> {
        if self.is_broken() {
            return Err(self.lost_error());
        }
        let deadline = Instant::now() + self.timeout;
        if self.unread.load(Ordering::Acquire) >= MAX_IN_FLIGHT {
            self.pump(
                deadline,
                || format!("{MAX_IN_FLIGHT} requests in flight, none answered"),
                None,
                |_| (self.unread.load(Ordering::Acquire) < MAX_IN_FLIGHT).then_some(()),
            )?;
        }
        let tag = loop {
            let t = self.next_tag.fetch_add(1, Ordering::Relaxed);
            // Tag 0 is what a brick answers frames it cannot parse with.
            if t != 0 {
                break t;
            }
        };
        let head = head(tag);
        let mut guard = lock(&self.tx);
        if let Some(e) = &self.emulator {
            // Under the send lock, so requests take the emulated wire in the order they take
            // the socket.
            e.sent(tag, (head.len() + data.len()) as u64);
        }
        let tx = &mut *guard;
        match &self.tls {
            None => self.write_out(
                &mut tx.sock,
                &mut [IoSlice::new(&head), IoSlice::new(data)],
                op,
                deadline,
            )?,
            Some(conn) => {
                // Sealed in pieces so that a large WRITE is not copied whole before it leaves.
                let mut pieces = data.chunks(TLS_SEAL_BYTES).peekable();
                let mut first = true;
                loop {
                    let piece = pieces.next().unwrap_or_default();
                    let with_head = [IoSlice::new(&head), IoSlice::new(piece)];
                    let bufs = if first { &with_head[..] } else { &with_head[1..] };
                    first = false;
                    if let Err(e) = tls::seal(&mut lock(conn), bufs, &mut tx.sealed) {
                        return Err(self.lost(format!("TLS: cannot seal {op:?}: {e}")));
                    }
                    let sealed = std::mem::take(&mut tx.sealed);
                    let r = self.write_out(&mut tx.sock, &mut [IoSlice::new(&sealed)], op, deadline);
                    tx.sealed = sealed;
                    r?;
                    if pieces.peek().is_none() {
                        break;
                    }
                }
            }
        }
        drop(guard);
        self.unread.fetch_add(1, Ordering::AcqRel);
        self.last_sent_ms
            .store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
        Ok(tag)
    }

    /// Writes `bufs` whole to the socket by `deadline`, draining responses while the socket is
    /// full (the brick may be blocked sending them).
    fn write_out(
        &self,
        tx: &mut Sock,
        bufs: &mut [IoSlice<'_>],
        op: Opcode,
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let mut bufs = bufs;
        IoSlice::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            match tx.write_vectored(bufs) {
                Ok(0) => return Err(self.lost("connection closed while sending".into())),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if self.is_broken() {
                        return Err(self.lost_error());
                    }
                    if Instant::now() >= deadline {
                        return Err(self.lost(format!("could not send {op:?} within {:?}", self.timeout)));
                    }
                    self.drain_some(deadline)?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if self.is_broken() => {
                    let _ = e;
                    return Err(self.lost_error());
                }
                Err(e) => {
                    self.why_closed();
                    return Err(self.lost(format!("send failed: {e}")));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn submit(&self, req: &Request) -> Result<u32, LinkError> {
        self.send(req.opcode(), |tag| req.encode(tag), &[])
    }
}
