//! Non-blocking transfers (`rackmem_put_nbi`, `rackmem_get_nbi`) and their completion
//! (`rackmem_quiet`): one [`Pending`] list per thread.
//!
//! A non-blocking PUT on a socket is sent before the call returns (the source buffer is free at
//! once) and only its answer is collected later; a non-blocking GET is sent, and its answer is
//! read into the destination at [`Pending::quiet`] (or earlier, when the list is full). On a
//! mapped segment both are memory copies done at once. What is in flight is bounded per thread:
//! [`MAX_PENDING`] requests and [`MAX_PENDING_BYTES`] of answers (and of puts kept to be sent
//! again, below); beyond them the oldest are completed first.
//!
//! On a named segment a transfer whose answer says the segment moved or its link broke is sent
//! again at [`Pending::quiet_with`], through the engine's handle, as a blocking call would be
//! (re-attached, or after waiting out a move; `reattach.rs`): a put keeps a copy of its bytes
//! until its answer comes for that. Puts and gets are idempotent, so one sent twice does no
//! harm; a transfer sent again may land after later transfers of the same thread to the same
//! bytes, which is allowed until the quiet (non-blocking transfers are unordered).

use crate::engine::Engine;
use crate::error::PutGetError;
use crate::plan::{Direction, Path};
use crate::reattach::{recoverable, Retry};
use crate::segment::{Segment, BULK_PIECE_BYTES, INLINE_FRAME_BYTES};
use rackmem_transport::DetachedTicket;
use std::collections::VecDeque;
use std::sync::Arc;

/// Most requests one thread keeps in flight.
pub const MAX_PENDING: usize = 256;
/// Most bytes of GET answers one thread keeps in flight.
pub const MAX_PENDING_BYTES: usize = 64 << 20;

struct Op {
    seg: Arc<Segment>,
    ticket: DetachedTicket,
    offset: u64,
    /// Where a GET's bytes go; the caller promised it stays valid until completion.
    dest: Option<&'static mut [u8]>,
    /// A PUT's bytes, kept on a named segment to be sent again.
    data: Option<Vec<u8>>,
}

/// A transfer on a named segment to send again at the quiet.
enum Redo {
    Put {
        seg: Arc<Segment>,
        offset: u64,
        data: Vec<u8>,
    },
    Get {
        seg: Arc<Segment>,
        offset: u64,
        dest: &'static mut [u8],
    },
}

/// One thread's transfers in flight, and the first error among those completed early.
#[derive(Default)]
pub struct Pending {
    ops: VecDeque<Op>,
    bytes: usize,
    failed: Option<PutGetError>,
    /// Transfers to send again at the quiet, and the first error that put one there (what the
    /// quiet reports when there is no engine to send them with).
    redo: Vec<Redo>,
    redo_error: Option<PutGetError>,
}

impl Pending {
    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Completes the oldest request; a failure is kept for [`Pending::quiet`].
    fn complete_oldest(&mut self) {
        let Some(op) = self.ops.pop_front() else {
            return;
        };
        let Op {
            seg,
            ticket,
            offset,
            dest,
            data,
        } = op;
        let mut dest = dest;
        let r = match dest.as_deref_mut() {
            Some(d) => {
                self.bytes = self.bytes.saturating_sub(d.len());
                seg.link.wait_detached(ticket, d)
            }
            None => seg.link.wait_detached(ticket, &mut []),
        };
        if let Some(d) = &data {
            self.bytes = self.bytes.saturating_sub(d.len());
        }
        let Err(e) = r else {
            return;
        };
        let e = PutGetError::from(e);
        if seg.name.is_none() || !recoverable(&e) || self.redo.len() >= MAX_PENDING {
            self.failed.get_or_insert(e);
            return;
        }
        match (dest, data) {
            (Some(dest), _) => self.redo.push(Redo::Get { seg, offset, dest }),
            (None, Some(data)) => self.redo.push(Redo::Put { seg, offset, data }),
            (None, None) => {
                self.failed.get_or_insert(e);
                return;
            }
        }
        self.redo_error.get_or_insert(e);
    }

    /// Makes room for one more request carrying `bytes` of answer.
    fn room(&mut self, bytes: usize) {
        while !self.ops.is_empty() && (self.ops.len() >= MAX_PENDING || self.bytes + bytes > MAX_PENDING_BYTES) {
            self.complete_oldest();
        }
    }

    fn piece_for(seg: &Segment, dir: Direction, len: usize) -> usize {
        match seg.path_for(dir, len) {
            Path::Inline => INLINE_FRAME_BYTES,
            Path::Bulk => BULK_PIECE_BYTES,
        }
    }

    /// Starts storing `data` at `offset` of `seg`; `data` may be reused when this returns.
    /// Errors in the arguments are returned now; the brick's answer comes at [`Pending::quiet`].
    pub fn put(&mut self, seg: &Arc<Segment>, offset: u64, data: &[u8]) -> Result<(), PutGetError> {
        seg.check(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        if let Some(m) = &seg.mapping {
            m.write(offset as usize, data);
            return Ok(());
        }
        let piece = Self::piece_for(seg, Direction::Put, data.len());
        // Only a named segment can be sent again (re-opened by its name), so only its puts
        // keep their bytes.
        let keep = seg.name.is_some();
        for (i, chunk) in data.chunks(piece).enumerate() {
            let kept = if keep { chunk.len() } else { 0 };
            self.room(kept);
            let at = offset + (i * piece) as u64;
            let t = seg.link.submit_put(at, chunk)?;
            self.bytes += kept;
            self.ops.push_back(Op {
                seg: seg.clone(),
                ticket: t.detach(),
                offset: at,
                dest: None,
                data: keep.then(|| chunk.to_vec()),
            });
        }
        Ok(())
    }

    /// Starts loading `dest.len()` bytes from `offset` of `seg` into `dest`, which holds them
    /// after [`Pending::quiet`] returns.
    pub fn get(&mut self, seg: &Arc<Segment>, offset: u64, dest: &'static mut [u8]) -> Result<(), PutGetError> {
        seg.check(offset, dest.len())?;
        if dest.is_empty() {
            return Ok(());
        }
        if let Some(m) = &seg.mapping {
            m.read(offset as usize, dest);
            return Ok(());
        }
        let piece = Self::piece_for(seg, Direction::Get, dest.len());
        let mut rest = dest;
        let mut at = offset;
        while !rest.is_empty() {
            let n = rest.len().min(piece);
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            self.room(n);
            let t = seg.link.submit_get(at, n)?;
            self.bytes += n;
            self.ops.push_back(Op {
                seg: seg.clone(),
                ticket: t.detach(),
                offset: at,
                dest: Some(head),
                data: None,
            });
            at += n as u64;
        }
        Ok(())
    }

    /// Completes every transfer in flight; returns the first failure among them (and among
    /// those completed early to make room), if any. Nothing is sent again: see
    /// [`Pending::quiet_with`].
    pub fn quiet(&mut self) -> Result<(), PutGetError> {
        while !self.ops.is_empty() {
            self.complete_oldest();
        }
        self.bytes = 0;
        self.redo.clear();
        match (self.failed.take(), self.redo_error.take()) {
            (Some(e), _) | (None, Some(e)) => Err(e),
            (None, None) => Ok(()),
        }
    }

    /// [`Pending::quiet`], sending again through `engine` each transfer on a named segment that
    /// failed because the segment moved or its link broke, as a blocking call would (within the
    /// same bounds); returns the first failure that remains.
    pub fn quiet_with(&mut self, engine: &Engine) -> Result<(), PutGetError> {
        while !self.ops.is_empty() {
            self.complete_oldest();
        }
        self.bytes = 0;
        self.redo_error = None;
        for r in std::mem::take(&mut self.redo) {
            let (seg, done) = match r {
                Redo::Put { seg, offset, data } => {
                    let done = seg
                        .handle
                        .get()
                        .map(|&h| engine.call(h, Retry::Idempotent, |s| s.put(offset, &data)));
                    (seg, done)
                }
                Redo::Get { seg, offset, dest } => {
                    let dest = std::cell::RefCell::new(dest);
                    let done = seg
                        .handle
                        .get()
                        .map(|&h| engine.call(h, Retry::Idempotent, |s| s.get(offset, &mut dest.borrow_mut())));
                    (seg, done)
                }
            };
            match done {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    self.failed.get_or_insert(e);
                }
                None => {
                    self.failed
                        .get_or_insert(PutGetError::Invalid(format!("{seg:?} has no handle to send again by")));
                }
            }
        }
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Completes the transfers in flight on `seg` (before it is freed), keeping others.
    pub fn quiet_segment(&mut self, seg: &Arc<Segment>) {
        // Completing everything up to the last op of `seg` is simplest, and bounded.
        while self.ops.iter().any(|op| Arc::ptr_eq(&op.seg, seg)) {
            self.complete_oldest();
        }
    }
}

impl Drop for Pending {
    /// A thread that exits with transfers in flight completes them, so no answer is left to
    /// land in a buffer that is gone.
    fn drop(&mut self) {
        while !self.ops.is_empty() {
            self.complete_oldest();
        }
    }
}
