//! Non-blocking transfers (`rackmem_put_nbi`, `rackmem_get_nbi`) and their completion
//! (`rackmem_quiet`): one [`Pending`] list per thread.
//!
//! A non-blocking PUT on a socket is sent before the call returns (the source buffer is free at
//! once) and only its answer is collected later; a non-blocking GET is sent, and its answer is
//! read into the destination at [`Pending::quiet`] (or earlier, when the list is full). On a
//! mapped segment both are memory copies done at once. What is in flight is bounded per thread:
//! [`MAX_PENDING`] requests and [`MAX_PENDING_BYTES`] of answers; beyond them the oldest are
//! completed first.

use crate::error::PutGetError;
use crate::plan::{Direction, Path};
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
    /// Where a GET's bytes go; the caller promised it stays valid until completion.
    dest: Option<&'static mut [u8]>,
}

/// One thread's transfers in flight, and the first error among those completed early.
#[derive(Default)]
pub struct Pending {
    ops: VecDeque<Op>,
    bytes: usize,
    failed: Option<PutGetError>,
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
        let r = match op.dest {
            Some(dest) => {
                self.bytes = self.bytes.saturating_sub(dest.len());
                op.seg.link.wait_detached(op.ticket, dest)
            }
            None => op.seg.link.wait_detached(op.ticket, &mut []),
        };
        if let Err(e) = r {
            self.failed.get_or_insert(e.into());
        }
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
        for (i, chunk) in data.chunks(piece).enumerate() {
            self.room(0);
            let t = seg.link.submit_put(offset + (i * piece) as u64, chunk)?;
            self.ops.push_back(Op {
                seg: seg.clone(),
                ticket: t.detach(),
                dest: None,
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
                dest: Some(head),
            });
            at += n as u64;
        }
        Ok(())
    }

    /// Completes every transfer in flight; returns the first failure among them (and among
    /// those completed early to make room), if any.
    pub fn quiet(&mut self) -> Result<(), PutGetError> {
        while !self.ops.is_empty() {
            self.complete_oldest();
        }
        self.bytes = 0;
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
