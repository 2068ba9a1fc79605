//! One-sided requests on the attached segment (issue 24): OPEN of a named segment, PUT and GET
//! of bytes at any offset, and the brick-executed atomics FETCH_ADD and COMPARE_SWAP. One
//! request each; cutting large transfers and keeping several in flight is the transfer
//! engine's job (`rackmem-putget`).

use crate::error::LinkError;
use crate::link::Link;
use crate::ticket::Ticket;
use rackmem_proto::{encode_put_head, Opcode, Request, SegmentGrant, MAX_NAME, MAX_PAYLOAD};

impl Link {
    /// Standalone mode: attaches this link to the segment named `name` on the brick, carving it
    /// with `size_bytes` (rounded up to the brick's chunk) if no live segment has that name;
    /// `size_bytes == 0` opens an existing segment only. Returns the segment's grant and
    /// session key (its size is the grant's). A named segment lives while some link is
    /// attached to it.
    pub fn open_segment(&self, secret: &[u8], name: &[u8], size_bytes: u64) -> Result<SegmentGrant, LinkError> {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(self.invalid(format!("a segment name has 1 to {MAX_NAME} bytes, not {}", name.len())));
        }
        let p = self.call(&Request::Open {
            name: name.to_vec(),
            size_bytes,
            secret: secret.to_vec(),
        })?;
        SegmentGrant::decode(&p).map_err(|e| self.lost(format!("bad grant in OPEN answer: {e}")))
    }

    /// Sends one PUT of `data` (at most [`MAX_PAYLOAD`] bytes) to byte `offset` of the attached
    /// segment without waiting; `data` is written to the socket before this returns, so the
    /// caller may reuse it at once. Learn the outcome with [`Ticket::wait`] (`&mut []`).
    pub fn submit_put(&self, offset: u64, data: &[u8]) -> Result<Ticket<'_>, LinkError> {
        if data.len() > MAX_PAYLOAD as usize {
            return Err(self.invalid(format!("a PUT carries at most {MAX_PAYLOAD} bytes, not {}", data.len())));
        }
        let tag = self.send(Opcode::Put, |tag| encode_put_head(tag, offset, data.len()), data)?;
        Ok(Ticket {
            link: self,
            tag,
            op: Opcode::Put,
            len: 0,
            done: false,
        })
    }

    /// Sends one GET of `len` bytes (at most [`MAX_PAYLOAD`]) at byte `offset` without waiting;
    /// collect the bytes with [`Ticket::wait`] into a buffer of `len` bytes.
    pub fn submit_get(&self, offset: u64, len: usize) -> Result<Ticket<'_>, LinkError> {
        let Ok(len32) = u32::try_from(len) else {
            return Err(self.invalid(format!("a GET of {len} bytes is too large")));
        };
        if len32 > MAX_PAYLOAD {
            return Err(self.invalid(format!("a GET returns at most {MAX_PAYLOAD} bytes, not {len}")));
        }
        let tag = self.submit(&Request::Get { offset, len: len32 })?;
        Ok(Ticket {
            link: self,
            tag,
            op: Opcode::Get,
            len,
            done: false,
        })
    }

    /// Atomically adds `value` to the 8-byte word at `offset` (a multiple of 8) on the brick;
    /// returns the word's previous value.
    pub fn fetch_add(&self, offset: u64, value: u64) -> Result<u64, LinkError> {
        let p = self.call(&Request::FetchAdd { offset, value })?;
        self.word(&p, Opcode::FetchAdd)
    }

    /// Atomically replaces the 8-byte word at `offset` (a multiple of 8) by `desired` if it
    /// holds `expected`, on the brick; returns the word's previous value.
    pub fn compare_swap(&self, offset: u64, expected: u64, desired: u64) -> Result<u64, LinkError> {
        let p = self.call(&Request::CompareSwap {
            offset,
            expected,
            desired,
        })?;
        self.word(&p, Opcode::CompareSwap)
    }

    fn word(&self, p: &[u8], op: Opcode) -> Result<u64, LinkError> {
        <[u8; 8]>::try_from(p)
            .map(u64::from_le_bytes)
            .map_err(|_| self.lost(format!("{op:?} answer of {} bytes, expected 8", p.len())))
    }
}
