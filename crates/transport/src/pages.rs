//! Page traffic: batched READ and WRITE within the per-request limits, large transfers cut in
//! batches and pipelined ([`READ_WINDOW`] reads in flight at a time).

use crate::error::LinkError;
use crate::limits::{MAX_BATCH_BYTES, MAX_BATCH_EXTENTS, READ_WINDOW};
use crate::link::Link;
use crate::ticket::Ticket;
use rackmem_proto::{encode_write_head, Extent, Opcode, Request};
use std::collections::VecDeque;

impl Link {
    /// Cuts extents longer than one batch may carry into batch-sized pieces.
    fn pieces(extents: &[Extent]) -> std::borrow::Cow<'_, [Extent]> {
        let piece = MAX_BATCH_BYTES as u32;
        if extents.iter().all(|e| e.1 <= piece) {
            return std::borrow::Cow::Borrowed(extents);
        }
        let mut v = Vec::with_capacity(extents.len() + 8);
        for &(o, l) in extents {
            let mut done = 0u32;
            while done < l {
                let n = (l - done).min(piece);
                v.push((o + done as u64, n));
                done += n;
            }
        }
        std::borrow::Cow::Owned(v)
    }

    /// Splits extents in batches within the per-request limits (after [`Link::pieces`]).
    fn batches(extents: &[Extent]) -> Vec<&[Extent]> {
        let mut out = Vec::new();
        let mut start = 0;
        let mut bytes = 0u64;
        for (i, e) in extents.iter().enumerate() {
            if i > start && (bytes + e.1 as u64 > MAX_BATCH_BYTES || i - start >= MAX_BATCH_EXTENTS) {
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

    /// Checks what the brick would refuse anyway, so the caller gets a clear error and the
    /// connection survives. Returns the extents' total.
    fn check_extents(&self, extents: &[Extent], buf_len: usize) -> Result<usize, LinkError> {
        let page = rackmem_proto::PAGE_SIZE;
        if let Some(&(o, l)) = extents
            .iter()
            .find(|&&(o, l)| l == 0 || l % page != 0 || o % page as u64 != 0)
        {
            return Err(self.invalid(format!("extent {o:#x}+{l:#x} is not a run of whole pages")));
        }
        let total: u64 = extents.iter().map(|e| e.1 as u64).sum();
        if total != buf_len as u64 {
            return Err(self.invalid(format!("{buf_len} byte buffer for {total} bytes of extents")));
        }
        Ok(buf_len)
    }

    /// Sends one batched READ without waiting; the extents must fit one request
    /// ([`MAX_BATCH_EXTENTS`], [`MAX_BATCH_BYTES`]). Collect the pages with [`Ticket::wait`].
    pub fn submit_read(&self, extents: &[Extent]) -> Result<Ticket<'_>, LinkError> {
        let total = extents.iter().map(|e| e.1 as u64).sum::<u64>();
        if extents.is_empty() || extents.len() > MAX_BATCH_EXTENTS || total > MAX_BATCH_BYTES {
            return Err(self.invalid(format!(
                "a batch needs 1 to {MAX_BATCH_EXTENTS} extents and at most {MAX_BATCH_BYTES} bytes \
                 (got {} extents, {total} bytes); read_pages splits larger reads",
                extents.len()
            )));
        }
        let len = self.check_extents(extents, total as usize)?;
        let tag = self.submit(&Request::Read(extents.to_vec()))?;
        Ok(Ticket {
            link: self,
            tag,
            op: Opcode::Read,
            len,
            done: false,
        })
    }

    /// Sends one batched WRITE without waiting (same limits as [`Link::submit_read`]); `data`
    /// holds the extents' bytes in order. Learn the outcome with [`Ticket::wait`] (`&mut []`).
    pub fn submit_write(&self, extents: &[Extent], data: &[u8]) -> Result<Ticket<'_>, LinkError> {
        if extents.is_empty() || extents.len() > MAX_BATCH_EXTENTS || data.len() as u64 > MAX_BATCH_BYTES {
            return Err(self.invalid(format!(
                "a batch needs 1 to {MAX_BATCH_EXTENTS} extents and at most {MAX_BATCH_BYTES} bytes \
                 (got {} extents, {} bytes); write_pages splits larger writes",
                extents.len(),
                data.len()
            )));
        }
        self.check_extents(extents, data.len())?;
        let tag = self.send(Opcode::Write, |tag| encode_write_head(tag, extents, data.len()), data)?;
        Ok(Ticket {
            link: self,
            tag,
            op: Opcode::Write,
            len: 0,
            done: false,
        })
    }

    /// Reads the extents, in order, into `out` (whose length must be their total). Large reads
    /// are split in batches, [`READ_WINDOW`] of them in flight at a time.
    pub fn read_pages(&self, extents: &[Extent], out: &mut [u8]) -> Result<(), LinkError> {
        self.check_extents(extents, out.len())?;
        let mut window: VecDeque<Ticket<'_>> = VecDeque::new();
        let mut rest: &mut [u8] = out;
        let pieces = Self::pieces(extents);
        for b in Self::batches(&pieces) {
            if window.len() >= READ_WINDOW {
                if let Some(t) = window.pop_front() {
                    let (head, tail) = std::mem::take(&mut rest).split_at_mut(t.len());
                    t.wait(head)?;
                    rest = tail;
                }
            }
            window.push_back(self.submit_read(b)?);
        }
        for t in window {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(t.len());
            t.wait(head)?;
            rest = tail;
        }
        Ok(())
    }

    /// Writes `data` to the extents, in order (its length must be their total). Large writes
    /// are split in batches, all pipelined.
    pub fn write_pages(&self, extents: &[Extent], data: &[u8]) -> Result<(), LinkError> {
        self.check_extents(extents, data.len())?;
        let mut at = 0usize;
        let mut tickets = Vec::new();
        let pieces = Self::pieces(extents);
        for b in Self::batches(&pieces) {
            let n: usize = b.iter().map(|e| e.1 as usize).sum();
            tickets.push(self.submit_write(b, &data[at..at + n])?);
            at += n;
        }
        for t in tickets {
            t.wait(&mut [])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_respect_limits() {
        let ext: Vec<Extent> = (0..3000).map(|i| (i * 4096, 4096)).collect();
        let b = Link::batches(&ext);
        assert_eq!(b.iter().map(|x| x.len()).sum::<usize>(), 3000);
        assert!(b.iter().all(|x| x.len() <= MAX_BATCH_EXTENTS));
        let big: Vec<Extent> = (0..10).map(|i| (i << 24, 4 << 20)).collect();
        let huge = [(0u64, 40u32 << 20)];
        let p = Link::pieces(&huge);
        assert_eq!(p.iter().map(|e| e.1 as u64).sum::<u64>(), 40 << 20);
        assert!(p.iter().all(|e| e.1 as u64 <= MAX_BATCH_BYTES && e.0 % 4096 == 0));
        let b = Link::batches(&big);
        assert!(b
            .iter()
            .all(|x| x.iter().map(|e| e.1 as u64).sum::<u64>() <= MAX_BATCH_BYTES));
        assert_eq!(b.iter().map(|x| x.len()).sum::<usize>(), 10);
    }
}
