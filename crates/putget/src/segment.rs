//! One segment used one-sidedly: its own link to its brick (a brick binds a connection to one
//! segment), the mapping of its memory when the brick is on this host, and the two transfer
//! paths the engine chooses between.
//!
//! - **Inline**: one frame per transfer (a PUT carrying the bytes, or a GET whose answer does),
//!   copied through the socket, waited for before the next; transfers larger than a frame
//!   ([`INLINE_FRAME_BYTES`]) go as several such frames, one after another. The fixed cost is
//!   one round trip.
//! - **Bulk**: on a segment mapped from a brick on this host, the processor's own copy into or
//!   out of the mapping, which *is* the segment's memory (no socket, no brick thread, no frame);
//!   on a socket, the transfer cut in [`BULK_PIECE_BYTES`] pieces with up to [`BULK_WINDOW`] in
//!   flight, so the brick copies one piece while the next crosses the socket.
//!
//! Atomics use the processor's atomic instructions on a mapped segment (the brick's atomics for
//! other nodes are the same instructions on the same memory) and FETCH_ADD / COMPARE_SWAP
//! requests otherwise.

use crate::error::PutGetError;
use crate::plan::{Direction, Path, Plan};
use rackmem_proto::{SegmentGrant, MAX_PAYLOAD};
use rackmem_sys::SharedMemory;
use rackmem_transport::{BrickAddr, Link, Ticket};
use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

/// Largest transfer the inline path sends as one frame (the protocol's payload limit).
pub const INLINE_FRAME_BYTES: usize = MAX_PAYLOAD as usize;
/// Piece of the bulk path on a socket.
pub const BULK_PIECE_BYTES: usize = 256 << 10;
/// Pieces of one bulk transfer in flight at once (so at most 2 MiB in flight per transfer).
pub const BULK_WINDOW: usize = 8;

/// A segment of a brick, attached by a link of its own.
pub struct Segment {
    pub(crate) link: Link,
    /// The link's file descriptors, taken when it was made (a forked child closes them without
    /// taking the link's locks, which another thread may have held at the fork).
    pub(crate) fds: Vec<std::os::fd::RawFd>,
    pub(crate) grant: SegmentGrant,
    pub(crate) mapping: Option<SharedMemory>,
    /// Which path serves a transfer of a given size; set once the link is calibrated.
    pub(crate) plan: OnceLock<Arc<Plan>>,
    /// The [`Granter`](crate::Granter)'s id for it, when one granted it (given back at free).
    pub(crate) allocation: Option<u64>,
    /// The name it was opened by from a granter: the name a broken link re-opens it by
    /// ([`Engine::call`](crate::Engine::call)). `None` for a configured brick's segments (a
    /// standalone brick frees a segment with its last connection, so there is nothing to come
    /// back to) and for a granter's unnamed ones (no name to ask a new grant for).
    pub(crate) name: Option<String>,
    /// The brick's identity when the link was made (random per brick start): a re-attach that
    /// finds the same address under another identity found a restarted brick, whose memory
    /// starts empty.
    pub(crate) brick_id: u64,
    /// Set once the segment's contents are known lost (its brick restarted): every later call
    /// fails with `EIO` instead of reading what the new brick has (zeros).
    pub(crate) lost: OnceLock<String>,
    /// The engine's handle for it, once it has one: a non-blocking transfer that fails because
    /// the segment moved or its link broke is sent again through the handle at the quiet
    /// (`nbi.rs`), which by then may hold a re-attached segment.
    pub(crate) handle: OnceLock<u64>,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("brick", &self.link.addr().to_string())
            .field("id", &self.grant.grant.segment_id)
            .field("size", &self.size())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

impl Segment {
    /// Size in bytes (the brick rounds the size asked for up to its chunk).
    pub fn size(&self) -> u64 {
        self.grant.grant.size_bytes
    }

    /// The brick it lives on.
    pub fn brick(&self) -> &BrickAddr {
        self.link.addr()
    }

    /// True when the segment's memory is mapped into this process (a brick on this host).
    pub fn is_mapped(&self) -> bool {
        self.mapping.is_some()
    }

    /// The plan its transfers follow.
    pub fn plan(&self) -> Arc<Plan> {
        self.plan.get().cloned().unwrap_or_else(|| Arc::new(Plan::default()))
    }

    /// The path for a transfer of `len` bytes (no reference count touched: this is on the
    /// path of every 8-byte put).
    pub fn path_for(&self, dir: Direction, len: usize) -> Path {
        match self.plan.get() {
            Some(p) => p.path_for(dir, len),
            None => Plan::default().path_for(dir, len),
        }
    }

    /// Why the segment's contents are lost, once they are (its brick restarted).
    pub fn lost(&self) -> Option<&str> {
        self.lost.get().map(String::as_str)
    }

    /// The grant and session key, with which another link can attach to this segment.
    pub fn grant(&self) -> &SegmentGrant {
        &self.grant
    }

    pub(crate) fn check(&self, offset: u64, len: usize) -> Result<(), PutGetError> {
        let size = self.size();
        match offset.checked_add(len as u64) {
            Some(end) if end <= size => Ok(()),
            _ => Err(PutGetError::OutOfRange {
                offset,
                len: len as u64,
                size,
            }),
        }
    }

    fn check_word(&self, offset: u64) -> Result<(), PutGetError> {
        if offset % 8 != 0 {
            return Err(PutGetError::Misaligned(offset));
        }
        self.check(offset, 8)
    }

    /// Stores `data` at byte `offset`, by the path the plan picks for its size; returns once
    /// the brick holds it (a mapped segment's memory is the brick's: at once).
    pub fn put(&self, offset: u64, data: &[u8]) -> Result<(), PutGetError> {
        self.put_with(self.path_for(Direction::Put, data.len()), offset, data)
    }

    /// Loads `out.len()` bytes from byte `offset` into `out`, by the path the plan picks.
    pub fn get(&self, offset: u64, out: &mut [u8]) -> Result<(), PutGetError> {
        self.get_with(self.path_for(Direction::Get, out.len()), offset, out)
    }

    /// [`Segment::put`] by the given path (for measuring both).
    pub fn put_with(&self, path: Path, offset: u64, data: &[u8]) -> Result<(), PutGetError> {
        self.check(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        match (path, &self.mapping) {
            (Path::Bulk, Some(m)) => {
                m.write(offset as usize, data);
                Ok(())
            }
            (Path::Bulk, None) => {
                let mut window: VecDeque<Ticket<'_>> = VecDeque::new();
                for (i, piece) in data.chunks(BULK_PIECE_BYTES).enumerate() {
                    if window.len() >= BULK_WINDOW {
                        if let Some(t) = window.pop_front() {
                            t.wait(&mut [])?;
                        }
                    }
                    let at = offset + (i * BULK_PIECE_BYTES) as u64;
                    window.push_back(self.link.submit_put(at, piece)?);
                }
                for t in window {
                    t.wait(&mut [])?;
                }
                Ok(())
            }
            (Path::Inline, _) => {
                for (i, frame) in data.chunks(INLINE_FRAME_BYTES).enumerate() {
                    let at = offset + (i * INLINE_FRAME_BYTES) as u64;
                    self.link.submit_put(at, frame)?.wait(&mut [])?;
                }
                Ok(())
            }
        }
    }

    /// [`Segment::get`] by the given path (for measuring both).
    pub fn get_with(&self, path: Path, offset: u64, out: &mut [u8]) -> Result<(), PutGetError> {
        self.check(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        match (path, &self.mapping) {
            (Path::Bulk, Some(m)) => {
                m.read(offset as usize, out);
                Ok(())
            }
            (Path::Bulk, None) => {
                let mut window: VecDeque<(Ticket<'_>, &mut [u8])> = VecDeque::new();
                for (i, piece) in out.chunks_mut(BULK_PIECE_BYTES).enumerate() {
                    if window.len() >= BULK_WINDOW {
                        if let Some((t, dest)) = window.pop_front() {
                            t.wait(dest)?;
                        }
                    }
                    let at = offset + (i * BULK_PIECE_BYTES) as u64;
                    let t = self.link.submit_get(at, piece.len())?;
                    window.push_back((t, piece));
                }
                for (t, dest) in window {
                    t.wait(dest)?;
                }
                Ok(())
            }
            (Path::Inline, _) => {
                for (i, frame) in out.chunks_mut(INLINE_FRAME_BYTES).enumerate() {
                    let at = offset + (i * INLINE_FRAME_BYTES) as u64;
                    self.link.submit_get(at, frame.len())?.wait(frame)?;
                }
                Ok(())
            }
        }
    }

    /// Atomically adds `value` (wrapping) to the 8-byte word at `offset` (a multiple of 8);
    /// returns its previous value.
    pub fn fetch_add(&self, offset: u64, value: u64) -> Result<u64, PutGetError> {
        self.check_word(offset)?;
        match &self.mapping {
            Some(m) => Ok(m.fetch_add_u64(offset as usize, value)),
            None => Ok(self.link.fetch_add(offset, value)?),
        }
    }

    /// Atomically replaces the 8-byte word at `offset` (a multiple of 8) by `desired` if it
    /// holds `expected`; returns its previous value.
    pub fn compare_swap(&self, offset: u64, expected: u64, desired: u64) -> Result<u64, PutGetError> {
        self.check_word(offset)?;
        match &self.mapping {
            Some(m) => Ok(m.compare_swap_u64(offset as usize, expected, desired)),
            None => Ok(self.link.compare_swap(offset, expected, desired)?),
        }
    }
}
