//! Responses in: whoever waits for a response reads the socket if nobody else is (there is no
//! reader thread), parks the responses it reads for others and wakes them; a response of the
//! expected size goes straight into its waiter's buffer.

use crate::error::LinkError;
use crate::link::{Frame, Link, RxState};
use crate::sync::lock;
use rackmem_proto::{Header, Opcode, Status, HEADER_LEN};
use std::io::{self, Read};
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Link {
    /// Reads one response frame; called only by the thread that set `RxState::reading`. A
    /// successful response to `dest`'s tag of exactly its length is read straight into it,
    /// sparing a buffer and a copy of every page fetched.
    fn read_frame(&self, dest: Option<(u32, &mut [u8])>, deadline: Instant) -> Result<Frame, LinkError> {
        let mut f = self.read_frame_now(dest, deadline)?;
        if let Some(e) = &self.emulator {
            let bytes = (HEADER_LEN + f.header.payload_len as usize) as u64;
            f.deliver_at = Some(e.deliver_at(f.header.tag, bytes, Instant::now()));
        }
        Ok(f)
    }

    fn read_frame_now(&self, dest: Option<(u32, &mut [u8])>, deadline: Instant) -> Result<Frame, LinkError> {
        let mut sock = lock(&self.rx_sock);
        sock.get_mut().deadline = Some(deadline);
        let mut hdr = [0u8; HEADER_LEN];
        if let Err(e) = sock.read_exact(&mut hdr) {
            let cause = match e.kind() {
                _ if self.is_broken() => return Err(self.lost_error()),
                io::ErrorKind::UnexpectedEof => "connection closed by the brick".to_string(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    format!("no response within {:?}", self.timeout)
                }
                _ => format!("receive failed: {e}"),
            };
            return Err(self.lost(cause));
        }
        let header = Header::decode(&hdr).map_err(|e| self.lost(format!("malformed response: {e}")))?;
        if !header.is_response() {
            return Err(self.lost("the peer sent a request where a response was due".into()));
        }
        if header.tag == 0 && header.status != Status::Ok.code() {
            // Tag 0 is no request of ours: the brick says why it closes the connection (a
            // malformed frame, or one of its limits), and the reason is the link's cause.
            let mut why = vec![0u8; (header.payload_len as usize).min(rackmem_proto::MAX_MESSAGE)];
            let _ = sock.read_exact(&mut why);
            return Err(self.lost(format!(
                "the brick closed the connection: {}: {}",
                Status::from_u32(header.status),
                String::from_utf8_lossy(&why)
            )));
        }
        if let Some((tag, out)) = dest {
            if header.tag == tag && header.status == Status::Ok.code() && header.payload_len as usize == out.len() {
                sock.read_exact(out)
                    .map_err(|e| self.lost(format!("truncated response: {e}")))?;
                return Ok(Frame {
                    header,
                    payload: Vec::new(),
                    delivered: true,
                    deliver_at: None,
                });
            }
        }
        let mut payload = vec![0u8; header.payload_len as usize];
        sock.read_exact(&mut payload)
            .map_err(|e| self.lost(format!("truncated response: {e}")))?;
        Ok(Frame {
            header,
            payload,
            delivered: false,
            deliver_at: None,
        })
    }

    /// Moves responses off the socket until `done` yields, taking the reader's role when nobody
    /// holds it and sleeping otherwise; fails when the link breaks or `deadline` passes.
    pub(crate) fn pump<T>(
        &self,
        deadline: Instant,
        what: impl Fn() -> String,
        mut dest: Option<(u32, &mut [u8])>,
        mut done: impl FnMut(&mut RxState) -> Option<T>,
    ) -> Result<T, LinkError> {
        let mut st = lock(&self.rx);
        loop {
            if let Some(t) = done(&mut st) {
                return Ok(t);
            }
            if self.is_broken() {
                return Err(self.lost_error());
            }
            if !st.reading {
                st.reading = true;
                drop(st);
                let r = self.read_frame(dest.as_mut().map(|(t, b)| (*t, &mut **b)), deadline);
                st = lock(&self.rx);
                st.reading = false;
                match r {
                    Ok(f) => {
                        self.unread.fetch_sub(1, Ordering::AcqRel);
                        if !st.abandoned.remove(&f.header.tag) {
                            st.parked.insert(f.header.tag, f);
                        }
                    }
                    Err(e) => {
                        self.rx_cv.notify_all();
                        return Err(e);
                    }
                }
                if st.sleepers > 0 {
                    // The frame may be theirs, and one of them must take over reading.
                    self.rx_cv.notify_all();
                }
            } else {
                let now = Instant::now();
                if now >= deadline {
                    drop(st);
                    return Err(self.lost(format!("{} within {:?}", what(), self.timeout)));
                }
                st.sleepers += 1;
                st = self
                    .rx_cv
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                st.sleepers -= 1;
            }
        }
    }

    /// After a send failed: if the brick said why it closed the connection (a tag-0 answer, as
    /// it sends for a connection over its limits), breaks the link with that reason, which is
    /// more use to the user than "broken pipe". Takes only what has arrived already.
    pub(crate) fn why_closed(&self) {
        let mut st = lock(&self.rx);
        if st.reading {
            return;
        }
        st.reading = true;
        drop(st);
        // Any other frame is dropped: the link breaks right after this anyway.
        let _ = self.read_frame(None, Instant::now());
        lock(&self.rx).reading = false;
    }

    /// Reads one response off the socket if responses are due and nobody else is reading. A
    /// sender whose socket is full calls this so the brick, which may be blocked sending
    /// responses, can make progress.
    pub(crate) fn drain_some(&self, deadline: Instant) -> Result<(), LinkError> {
        let mut st = lock(&self.rx);
        if st.reading || self.unread.load(Ordering::Acquire) <= 0 {
            return Ok(());
        }
        st.reading = true;
        drop(st);
        let r = self.read_frame(None, deadline);
        let mut st = lock(&self.rx);
        st.reading = false;
        let r = r.map(|f| {
            self.unread.fetch_sub(1, Ordering::AcqRel);
            if !st.abandoned.remove(&f.header.tag) {
                st.parked.insert(f.header.tag, f);
            }
        });
        if st.sleepers > 0 {
            self.rx_cv.notify_all();
        }
        r
    }

    /// Waits for the response to `tag`; returns its payload or the brick's refusal.
    pub(crate) fn wait_for(&self, tag: u32, op: Opcode) -> Result<Vec<u8>, LinkError> {
        let f = self.wait_frame(tag, op, None)?;
        Ok(f.payload)
    }

    /// Waits for the response to `tag` and puts its payload, which must be `out.len()` bytes,
    /// in `out`: straight from the socket when this thread reads it, else from where the thread
    /// that read it parked it.
    pub(crate) fn wait_for_into(&self, tag: u32, op: Opcode, out: &mut [u8]) -> Result<(), LinkError> {
        let want = out.len();
        let f = self.wait_frame(tag, op, Some(&mut *out))?;
        if f.delivered {
            return Ok(());
        }
        if f.payload.len() != want {
            return Err(self.lost(format!("{op:?} answer of {} bytes, expected {want}", f.payload.len())));
        }
        out.copy_from_slice(&f.payload);
        Ok(())
    }

    pub(crate) fn wait_frame(&self, tag: u32, op: Opcode, out: Option<&mut [u8]>) -> Result<Frame, LinkError> {
        let deadline = Instant::now() + self.timeout;
        let f = self.pump(
            deadline,
            || format!("no response to {op:?} (tag {tag})"),
            out.map(|b| (tag, b)),
            |st| st.parked.remove(&tag),
        )?;
        if let Some(t) = f.deliver_at {
            crate::emulate::wait_until(t);
        }
        let status = Status::from_u32(f.header.status);
        if status != Status::Ok {
            return Err(LinkError::Refused {
                addr: self.addr_text.clone(),
                op,
                status,
                message: String::from_utf8_lossy(&f.payload).into_owned(),
            });
        }
        if f.header.opcode != op {
            return Err(self.lost(format!(
                "response to {op:?} (tag {tag}) came back as {:?}",
                f.header.opcode
            )));
        }
        Ok(f)
    }
}
